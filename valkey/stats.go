package valkey

import (
	"context"
	"time"

	"github.com/starintel/starlease/lease"
)

// ActiveLeases counts active lease records with one ZCARD of the expiry
// schedule (ns:expiry), O(1) whatever the number of leases. The schedule
// holds exactly one entry per active record: acquire adds it, renew moves
// its score, and every ending (release, force-release, revoke, expiry by
// an operation or by the reaper) removes it in the same function.
//
// The count is of records, not of live leases: a lease whose expires_at
// has passed is included until an operation on its identity or the reaper
// (Options.ReapInterval) archives it, and a record the key's TTL removed
// because no reaper ran for Options.ReclaimGrace stays counted until the
// reaper drops its entry. It is meant for metrics, never for decisions.
func (s *Store) ActiveLeases(ctx context.Context) (int64, error) {
	if err := lease.CheckStart(ctx, s.closed.Load()); err != nil {
		return 0, err
	}
	ctx, cancel := bounded(ctx, 5*time.Second)
	defer cancel()
	n, err := s.client.Do(ctx, s.client.B().Zcard().Key(s.keys.expiry()).Build()).AsInt64()
	if err != nil {
		return 0, lease.Errorf(lease.CodeBackendUnavailable, "cannot count active leases: %s", classify(err))
	}
	return n, nil
}
