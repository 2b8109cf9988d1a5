package bolt

import (
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// A damaged history entry under an identity that names the identity's own
// live lease (its record copied with a terminal state) must not delete the
// live lease's lease-id lookup when retention retires it: forgetHistory
// (84e8858) checks only that the entry and the lookup name the key's
// identity, not that the lookup is of an ended lease (or the entry the
// lease's own), so the live lease is no longer found by id.
func TestReviewFixesHistoryRetentionKeepsOwnLiveLeasesLookup(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	a, err := s.Acquire(ctx, acquireReq("req-live", 3*time.Minute, far))
	if err != nil {
		t.Fatal(err)
	}
	live := a.Lease
	forged := live.Clone()
	forged.State = lease.StateReleased
	h := &lease.HistoryEntry{HistoryVersion: lease.HistoryVersion, Record: forged, EndedAt: lease.UnixMilli(1)}
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	hk := historyKey(live.LockKey, 1<<40)
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketIdent).Put(hk, b); err != nil {
			return err
		}
		return tx.Bucket(bucketHistoryExp).Put(timeIndexKey(h.EndedAt, hk), nil)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: live.LeaseID, DeadlineAt: far})
	if err != nil || got.Lease == nil || got.Lease.LeaseID != live.LeaseID || got.Lease.State != lease.StateActive {
		t.Fatalf("the live lease %s by id after a reaper pass: %v, want it active", live.LeaseID, err)
	}
}
