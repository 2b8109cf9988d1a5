package bolt

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
	"github.com/starintel/starlease/lease/leasetest/race"
)

// TestRace runs the race suite with a linearizability check against bolt,
// once without and once with the reaper, a concurrent actor that archives
// expired records behind the workers' backs.
func TestRace(t *testing.T) {
	for _, c := range []struct {
		name string
		reap time.Duration
	}{
		{"no_reaper", -1},
		{"reaper_50ms", 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: c.reap, FlushInterval: DefaultFlushInterval})
			race.Run(t, s, race.Options{})
		})
	}
}

// TestRaceCatchesRevivingStore checks the suite end to end: a store that
// answers every lost renewal with a success (an expired or ended lease
// revived) must fail the check.
func TestRaceCatchesRevivingStore(t *testing.T) {
	s := &revivingStore{Store: openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1, FlushInterval: DefaultFlushInterval}),
		leases: map[string]*lease.Record{}}
	opts := race.Options{Duration: 1500 * time.Millisecond, ReportDir: t.TempDir()}
	h := race.Record(context.Background(), s, opts)
	rep := race.Check(h, opts)
	for _, p := range rep.Problems {
		if strings.Contains(p, "invariant: ") && strings.Contains(p, "renewed at") {
			return
		}
	}
	t.Fatalf("a store that revives lost leases passed the race suite (%s): %q", rep.Result, rep.Problems)
}

// revivingStore is a broken store: a renewal the backend refuses as
// lease_lost is reported renewed.
type revivingStore struct {
	*Store
	mu     sync.Mutex
	leases map[string]*lease.Record
}

func (r *revivingStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	res, err := r.Store.Acquire(ctx, req)
	if err == nil {
		r.mu.Lock()
		r.leases[res.Lease.LeaseID] = res.Lease.Clone()
		r.mu.Unlock()
	}
	return res, err
}

func (r *revivingStore) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	res, err := r.Store.Renew(ctx, req)
	le := lease.AsError(err)
	if err == nil || le.Code != lease.CodeLost {
		return res, err
	}
	r.mu.Lock()
	rec := r.leases[req.LeaseID].Clone()
	r.mu.Unlock()
	if rec == nil || rec.OwnerPrincipalID != req.Caller.PrincipalID || rec.ServiceInstanceID != req.ServiceInstanceID {
		return res, err
	}
	now := lease.At(le.BackendTime)
	ttl := req.TTL
	if ttl == 0 {
		ttl = time.Duration(rec.TTLMs) * time.Millisecond
	}
	rec.RenewedAt, rec.ExpiresAt, rec.TTLMs = now, now.Add(ttl), ttl.Milliseconds()
	if limit := rec.AcquiredAt.Add(time.Duration(rec.MaximumLifetimeMs) * time.Millisecond); limit.Before(rec.ExpiresAt) {
		rec.ExpiresAt = limit
	}
	return lease.Result{Code: lease.CodeRenewed, Lease: rec, BackendTime: now}, nil
}
