package valkey

import (
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// An index member under one lease's List filters (owner, target, program)
// that names a live lease of another tenant, program, target and owner
// (damage, or a member copied under the wrong filter) lists nothing under
// those filters: List checks that the active record is the member's lease,
// not that the lease is one the filter selects.
func TestReviewScopeListHoldsOnlyItsFilter(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	a, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	other := acquireReq(newIdentity())
	other.Caller = lease.Caller{PrincipalID: "prn_foreign_1", ClientID: "client_9", CredentialID: "key_9"}
	b, err := s.Acquire(bg, other)
	if err != nil {
		t.Fatal(err)
	}
	own, foreign := a.Lease, b.Lease
	for _, f := range lease.FiltersOf(own) {
		m := string(f.By) + "\x00" + f.Value + foreign.LeaseID + "\x00" + tagOf(foreign.LockKey)
		if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, m).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	leasetest.CheckListHoldsOnlyItsFilter(t, s, own, foreign)
}

// Acquire evidence of one principal copied under another principal's
// evidence key of the same identity and request id is answered by
// LookupRequest as the second principal's result (see the bolt twin).
func TestReviewScopeLookupHoldsOnlyItsPrincipal(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	req := acquireReq(newIdentity())
	a, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	orig := a.Lease
	tag := tagOf(orig.LockKey)
	ev, err := s.client.Do(bg, s.client.B().Get().Key(s.keys.idem(tag, lease.IdempotencyScope(lease.OpAcquire, orig.LockKey,
		owner.PrincipalID, req.RequestID))).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.idem(tag, lease.IdempotencyScope(lease.OpAcquire, orig.LockKey,
		"prn_second_1", req.RequestID))).Value(ev).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckLookupHoldsOnlyItsPrincipal(t, s, orig, "prn_second_1", req.RequestID)
}
