package valkey

// Review of the history version 2 change: the Valkey adapter's History
// and findHistory now read through lease.DecodeStoredHistory. Behaviour
// must be unchanged: a malformed hv2 entry, a non-terminal one and one of
// a foreign lock key are skipped by the listing; inspect by lease id and
// a replay's current state find the real entry.

import (
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

func TestReviewHistCorruptAndForeignEntriesSkipped(t *testing.T) {
	s := openCompact(t)
	id1, id2 := newIdentity(), newIdentity()
	acq1 := acquireReq(id1)
	acq1.Metadata = review4Metadata()
	a, err := s.Acquire(bg, acq1)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := s.Release(bg, releaseReq(a.Lease))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(bg, acquireReq(id2))
	if err != nil {
		t.Fatal(err)
	}
	adm := adminReq(b.Lease)
	adm.Reason = `"},"ended_by":"prn_forged","state":"active"} hv2 \ é`
	if _, err := s.Revoke(bg, adm); err != nil {
		t.Fatal(err)
	}
	tag1, tag2 := tagOf(a.Lease.LockKey), tagOf(b.Lease.LockKey)
	h1, h2 := review4History(t, s, tag1), review4History(t, s, tag2)
	if len(h1) != 1 || len(h2) != 1 || !strings.HasPrefix(h1[0], lease.HistoryV2Prefix) || !strings.HasPrefix(h2[0], lease.HistoryV2Prefix) {
		t.Fatalf("history: %q %q", h1, h2)
	}
	f := strings.Split(h1[0], "\n")
	active := append([]string(nil), f...)
	active[lease.Hv2Record+15] = "active"
	spaced := append([]string(nil), f...)
	spaced[lease.Hv2Reason] = `"r" `
	bad := []string{
		h2[0], // a foreign lock key
		strings.Join(active, "\n"),
		strings.Join(spaced, "\n"),
		strings.Join(f[:len(f)-1], "\n"),
		"hv2\n",
	}
	for _, e := range bad {
		if err := s.client.Do(bg, s.client.B().Lpush().Key(s.keys.history(tag1)).Element(e).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.History(bg, lease.HistoryRequest{Identity: id1, DeadlineAt: far(), Caller: owner})
	if err != nil || len(hist.Entries) != 1 {
		t.Fatalf("history: %+v, %v; want only the real entry", hist.Entries, err)
	}
	e := hist.Entries[0]
	if e.Record.LeaseID != a.Lease.LeaseID || e.Record.State != lease.StateReleased || e.EndedBy != owner.PrincipalID {
		t.Fatalf("history entry %+v", e)
	}
	in, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far(), Caller: owner})
	if err != nil || in.Lease == nil || in.Lease.State != lease.StateReleased || in.Lease.FencingToken != rel.Lease.FencingToken {
		t.Fatalf("inspect by lease id: %+v, %v", in.Lease, err)
	}
	rep, err := s.Acquire(bg, acq1)
	if err != nil || !rep.Replayed || rep.Current == nil || rep.Current.State != lease.StateReleased || rep.Current.LeaseID != a.Lease.LeaseID {
		t.Fatalf("acquire replay: %+v, %v", rep, err)
	}
}
