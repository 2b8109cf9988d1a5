package valkey

import (
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Data stored in the wrong place (left by damage, or copied under
// another identity's keys) is never shown as the place's own.

// A stale List index member (one damage left behind: its lease ended, its
// identity now holds another owner's lease) lists nothing: only List's
// check that the identity's active record is the member's lease keeps the
// successor — another owner's lease — out of the first owner's page.
func TestListSkipsStaleIndexMemberOfAnotherOwnersSuccessor(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id := newIdentity()
	first, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	members, err := s.client.Do(bg, s.client.B().Zrange().Key(s.keys.index()).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for _, m := range members {
		if strings.Contains(m, first.Lease.LeaseID) {
			stale = append(stale, m)
		}
	}
	if len(stale) != 3 {
		t.Fatalf("index members of the first lease: %q", stale)
	}
	if _, err := s.Release(bg, releaseReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	other := acquireReq(id)
	other.Caller = lease.Caller{PrincipalID: "prn_other_1", ClientID: "client_2", CredentialID: "key_2"}
	second, err := s.Acquire(bg, other)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range stale {
		if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, m).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	leasetest.CheckStaleIndexListsNothing(t, s, id, owner.PrincipalID, second.Lease)
}

// A history entry of another identity found among an identity's entries
// (damage, or a copy under the wrong key) is not listed in its history.
func TestHistorySkipsAnotherIdentitysEntry(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	ended := func() *lease.Record {
		t.Helper()
		a, err := s.Acquire(bg, acquireReq(newIdentity()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(bg, releaseReq(a.Lease)); err != nil {
			t.Fatal(err)
		}
		return a.Lease
	}
	own, foreign := ended(), ended()
	entry, err := s.client.Do(bg, s.client.B().Lindex().Key(s.keys.history(tagOf(foreign.LockKey))).Index(0).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Lpush().Key(s.keys.history(tagOf(own.LockKey))).Element(entry).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckHistoryHoldsOnlyItsIdentity(t, s, own.Identity(), owner, own, foreign)
}
