package etcd

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// A history entry of another identity found among an identity's entries
// (damage, or a copy under the wrong key) is not listed in its history.
func TestHistorySkipsAnotherIdentitysEntry(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	ended := func(target string) *lease.Record {
		t.Helper()
		a, err := s.Acquire(ctx, recAcquire(target, "req-"+target, 3*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(ctx, recRelease(a.Lease, "rel-"+target)); err != nil {
			t.Fatal(err)
		}
		return a.Lease
	}
	own, foreign := ended("target-own"), ended("target-foreign")
	h, err := s.cli.Get(ctx, s.keys.historyPrefix(foreign.LockKey), clientv3.WithPrefix())
	if err != nil || len(h.Kvs) != 1 {
		t.Fatalf("history of the foreign lease: %v, %v", h, err)
	}
	if _, err := s.cli.Put(ctx, s.keys.history(own.LockKey, 1<<40), string(h.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckHistoryHoldsOnlyItsIdentity(t, s, own.Identity(), recCaller, own, foreign)
}
