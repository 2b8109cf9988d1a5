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
