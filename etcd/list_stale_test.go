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
