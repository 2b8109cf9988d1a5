package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// A damaged history-retention index entry of an identity with sequence 0
// (no history entry ever has it: sequences start at 1) whose value names
// that identity's live lease must not delete the live lease's lease-id
// entry: a live lease's entry is lockKey ‖ 0 ‖ hex16(0), which equals the
// value dropDue's nested compare expects for "lockKey/0000000000000000",
// so the compare (776407b) passes and the live lease is no longer found by
// id.
func TestReviewFixesHistoryRetentionKeepsOwnLiveLeasesLookup(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	a, err := s.Acquire(ctx, recAcquire("target-live", "req-live", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	live := a.Lease
	if _, err := s.cli.Put(ctx, s.keys.expiry(historyExpiry, 1, live.LockKey+"/"+hex16(0)), live.LeaseID); err != nil {
		t.Fatal(err)
	}
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: live.LeaseID, DeadlineAt: recFar()})
	if err != nil || got.Lease == nil || got.Lease.LeaseID != live.LeaseID {
		t.Fatalf("the live lease %s by id after a reaper pass: %v, want it active", live.LeaseID, err)
	}
}
