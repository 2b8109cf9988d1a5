package bolt

import (
	"bytes"
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Data stored in the wrong place (left by damage, or copied under
// another identity's keys) is never shown as the place's own.

// A stale List index entry (one a crash or damage left behind: its lease
// ended, its identity now holds another owner's lease) lists nothing. The
// entry's lease-id lookup still names the identity, so only List's check
// that the identity's active record is that lease keeps the successor —
// another owner's lease — out of the first owner's page.
func TestListSkipsStaleIndexEntryOfAnotherOwnersSuccessor(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	first, err := s.Acquire(ctx, acquireReq("req-a", 30*time.Second, far))
	if err != nil {
		t.Fatal(err)
	}
	// The first owner's three index entries, as they were while it held
	// the lease.
	var stale [][]byte
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIndex).ForEach(func(k, _ []byte) error {
			if bytes.HasSuffix(k, []byte(first.Lease.LeaseID)) {
				stale = append(stale, bytes.Clone(k))
			}
			return nil
		})
	}); err != nil || len(stale) != 3 {
		t.Fatalf("index entries of the first lease: %d, %v", len(stale), err)
	}
	rel := lease.ReleaseRequest{Identity: testIdentity, LeaseID: first.Lease.LeaseID, FencingToken: first.Lease.FencingToken,
		ServiceInstanceID: first.Lease.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "req-r", DeadlineAt: far,
			Caller: callerOfRecord(first.Lease)}}
	if _, err := s.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	other := acquireReq("req-b", 30*time.Second, far)
	other.Caller = lease.Caller{PrincipalID: "prn-other", ClientID: "client-2", CredentialID: "key-2"}
	second, err := s.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		for _, k := range stale {
			if err := tx.Bucket(bucketIndex).Put(k, nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if lk, ok := leaseLockKeyOf(t, s, first.Lease.LeaseID); !ok || lk != first.Lease.LockKey {
		t.Fatalf("the first lease's lookup: %q %v, want it to name the identity", lk, ok)
	}
	leasetest.CheckStaleIndexListsNothing(t, s, testIdentity, "prn-actor", second.Lease)
}

// leaseLockKeyOf is the lock key the lease-id lookup names.
func leaseLockKeyOf(t *testing.T, s *Store, leaseID string) (lockKey string, ok bool) {
	t.Helper()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		lockKey, ok = leaseLockKey(readView(tx).Bucket(bucketLeases), leaseID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return lockKey, ok
}

// A history entry of another identity found among an identity's entries
// (damage, or a copy under the wrong key) is not listed in its history.
func TestHistorySkipsAnotherIdentitysEntry(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	ended := func(target, rid string) *lease.Record {
		t.Helper()
		req := acquireReq(rid, 30*time.Second, far)
		req.Identity.TargetID = target
		a, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: req.Identity, LeaseID: a.Lease.LeaseID,
			FencingToken: a.Lease.FencingToken, ServiceInstanceID: a.Lease.ServiceInstanceID,
			Mutation: lease.Mutation{RequestID: rid + "-r", DeadlineAt: far, Caller: req.Caller}}); err != nil {
			t.Fatal(err)
		}
		return a.Lease
	}
	own, foreign := ended("target-own", "req-own"), ended("target-foreign", "req-foreign")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketIdent).Cursor()
		prefix := historyPrefix(foreign.LockKey)
		k, v := c.Seek(prefix)
		if k == nil || !bytes.HasPrefix(k, prefix) {
			t.Fatal("no history entry of the foreign lease")
		}
		return tx.Bucket(bucketIdent).Put(historyKey(own.LockKey, 1<<40), bytes.Clone(v))
	}); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckHistoryHoldsOnlyItsIdentity(t, s, own.Identity(), callerOfRecord(own), own, foreign)
}
