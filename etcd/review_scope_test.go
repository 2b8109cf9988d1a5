package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// An index entry under one lease's List filters (owner, target, program)
// that names a live lease of another tenant, program, target and owner
// (damage, or an entry copied under the wrong filter) lists nothing under
// those filters: List checks that the active record is the entry's lease,
// not that the lease is one the filter selects.
func TestReviewScopeListHoldsOnlyItsFilter(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	a, err := s.Acquire(ctx, recAcquire("target-own", "req-own", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	other := recAcquire("target-foreign", "req-foreign", 3*time.Minute)
	other.Identity.TenantID, other.Identity.ProgramID = "tenant-foreign", "program-foreign"
	other.Caller = lease.Caller{PrincipalID: "prn-foreign", ClientID: "client-foreign", CredentialID: "key-foreign"}
	b, err := s.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	own, foreign := a.Lease, b.Lease
	for _, f := range leasetest.ListFiltersOf(own) {
		if _, err := s.cli.Put(ctx, s.keys.index(f, foreign.LeaseID), foreign.LockKey); err != nil {
			t.Fatal(err)
		}
	}
	leasetest.CheckListHoldsOnlyItsFilter(t, s, own, foreign)
}
