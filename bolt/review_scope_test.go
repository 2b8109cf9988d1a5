package bolt

import (
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// scopeAcquire acquires a lease of testIdentity with the given tenant,
// program and target, for principal.
func scopeAcquire(t *testing.T, s *Store, tenant, program, target, principal, rid string) *lease.Record {
	t.Helper()
	req := acquireReq(rid, 30*time.Second, time.Now().Add(time.Hour))
	req.Identity.TenantID, req.Identity.ProgramID, req.Identity.TargetID = tenant, program, target
	req.Caller = lease.Caller{PrincipalID: principal, ClientID: "client-" + principal, CredentialID: "key-" + principal}
	a, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return a.Lease
}

// An index entry under one lease's List filters (owner, target, program)
// that names a live lease of another tenant, program, target and owner
// (damage, or an entry copied under the wrong filter) lists nothing under
// those filters: List checks that the active record is the entry's lease,
// not that the lease is one the filter selects.
func TestReviewScopeListHoldsOnlyItsFilter(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1})
	own := scopeAcquire(t, s, "tenant-own", "program-own", "target-own", "prn-own", "req-own")
	foreign := scopeAcquire(t, s, "tenant-foreign", "program-foreign", "target-foreign", "prn-foreign", "req-foreign")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		for _, f := range leasetest.ListFiltersOf(own) {
			if err := tx.Bucket(bucketIndex).Put(indexKey(f, foreign.LeaseID), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckListHoldsOnlyItsFilter(t, s, own, foreign)
}
