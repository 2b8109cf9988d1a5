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
		lockKey, ok = leaseLockKey(tx.Bucket(bucketLeases), leaseID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return lockKey, ok
}
