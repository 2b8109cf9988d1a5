package valkey

import (
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

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
