package etcd

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Data stored in the wrong place (left by damage, or copied under
// another identity's keys) is never shown as the place's own.

// A stale List index entry (one damage left behind: its lease ended, its
// identity now holds another owner's lease) lists nothing.
func TestListSkipsStaleIndexEntryOfAnotherOwnersSuccessor(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	first, err := s.Acquire(ctx, recAcquire("target-stale", "req-a", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := s.cli.Get(ctx, s.keys.p+"x/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var stale [][2]string
	for _, kv := range idx.Kvs {
		if strings.HasSuffix(string(kv.Key), first.Lease.LeaseID) {
			stale = append(stale, [2]string{string(kv.Key), string(kv.Value)})
		}
	}
	if len(stale) != 3 {
		t.Fatalf("index entries of the first lease: %q", stale)
	}
	if _, err := s.Release(ctx, recRelease(first.Lease, "req-r")); err != nil {
		t.Fatal(err)
	}
	other := recAcquire("target-stale", "req-b", 3*time.Minute)
	other.Caller = lease.Caller{PrincipalID: "prn-other", ClientID: "client-other", CredentialID: "key-other"}
	second, err := s.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range stale {
		if _, err := s.cli.Put(ctx, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	leasetest.CheckStaleIndexListsNothing(t, s, recIdentity("target-stale"), recCaller.PrincipalID, second.Lease)
}

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

// History retention removes a lease's lease-id entry with its history
// entry (only one that locates that entry: see
// TestReviewScopeHistoryRetentionKeepsAnotherLeasesLookup), so lookups do
// not outlive retention.
func TestHistoryRetentionDropsItsLeaseIDEntry(t *testing.T) {
	ctx := context.Background()
	o := leasetest.StoreOptions()
	o.HistoryRetention = time.Second
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: o})
	a, err := s.Acquire(ctx, recAcquire("target-retained", "req-retained", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, recRelease(a.Lease, "rel-retained")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.getOne(ctx, s.keys.leaseID(a.Lease.LeaseID)); err != nil || v == nil {
		t.Fatalf("lease-id entry of the ended lease: %q, %v", v, err)
	}
	time.Sleep(2500 * time.Millisecond)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := s.getOne(ctx, s.keys.leaseID(a.Lease.LeaseID)); err != nil || v != nil {
		t.Fatalf("lease-id entry after history retention: %q, %v", v, err)
	}
}
