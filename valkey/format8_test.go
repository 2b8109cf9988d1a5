package valkey

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Tests of stored format 8 (format.go): format 7, and evidence written
// whole (not by reference, and what detach rewrites) in evidence version
// 6 (lease.WholeEvidence), a history entry no evidence refers to in
// history version 5 (lease.HistoryUntaggedPrefix).

func open8(t *testing.T, o Options) *Store {
	t.Helper()
	o.CheckedEvidence = true
	return openSwitched(t, o, checkedEvidence, "checked_evidence")
}

// v6Of is e in evidence version 6 stored under key, an evidence key, as
// Go writes it (what detach, an eager ending and every whole evidence
// store in format 8).
func v6Of(t *testing.T, e *lease.IdempotencyRecord, key string) string {
	t.Helper()
	// The last ":idem:": a key prefix may hold one too.
	i := strings.LastIndex(key, ":idem:")
	if i < 0 {
		t.Fatalf("%q is no evidence key", key)
	}
	scope := key[i+len(":idem:"):]
	b, ok := lease.WholeEvidence(e, e.Lease.Identity(), scope)
	if !ok {
		t.Fatalf("the expected %s evidence has no version 6: %+v", e.Op, e)
	}
	return string(b)
}

// As TestFormat7DetachedOnTrim, in format 8: evidence by reference is
// version 5 until its entry is trimmed, then version 6, byte for byte
// what Go writes; an eager ending writes version 6 at once, and its
// history entry, which names no evidence, in version 5. Every answer is
// the first one, and every entry reads back as its lease ended.
func TestFormat8DetachedOnTrim(t *testing.T) {
	for _, eager := range []bool{false, true} {
		t.Run(map[bool]string{false: "refer", true: "eager"}[eager], func(t *testing.T) {
			so := leasetest.StoreOptions()
			so.HistoryPerIdentity = 2
			s := open8(t, Options{StoreOptions: so, EagerDetach: eager})
			id := newIdentity()
			var lives []v7Life
			for i := 0; i < 6; i++ {
				l := endRenewed7(t, s, id, i%2 == 0 || i == 5, time.Duration(i%3)*25*time.Second)
				entry := historyEntries(t, s, l.first.Lease.LockKey)[0]
				if i < 2 || !eager {
					l.mustForms(t, s, "ev5", "life "+strconv.Itoa(i)+" just ended")
					if !strings.HasPrefix(entry, lease.HistoryScopedPrefix) {
						t.Fatalf("life %d: entry %.10q, want version 4", i, entry)
					}
				} else {
					l.mustForms(t, s, "ev6", "life "+strconv.Itoa(i)+" just ended eagerly")
					// It names no evidence: version 5, without the tag line.
					if !strings.HasPrefix(entry, lease.HistoryUntaggedPrefix) || strings.Contains(entry, tagOf(l.first.Lease.LockKey)) {
						t.Fatalf("life %d: entry %.10q, want version 5 without the tag", i, entry)
					}
				}
				if h, err := lease.DecodeScopedHistory([]byte(entry), l.first.Lease.LockKey); err != nil ||
					h.Record.LeaseID != l.first.Lease.LeaseID || h.Record.State != l.state {
					t.Fatalf("life %d: entry decodes to %+v, %v", i, h, err)
				}
				lives = append(lives, l)
			}
			for i, l := range lives {
				trimmed := i < 4
				form := "ev5"
				if trimmed || eager {
					form = "ev6"
				}
				l.mustForms(t, s, form, "life "+strconv.Itoa(i))
				state := l.state
				if trimmed {
					state = lease.StateExpired
				}
				l.mustAnswer(t, s, state)
				l.mustForms(t, s, form, "life "+strconv.Itoa(i)+" after its replays")
			}
		})
	}
}

// A renewal's evidence is whole: version 6, byte for byte as Go writes
// it, and its replay answers the first answer.
func TestFormat8RenewEvidence(t *testing.T) {
	s := open8(t, Options{})
	id := newIdentity()
	first, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	rn := renewReq(first.Lease)
	renewed, err := s.Renew(bg, rn)
	if err != nil {
		t.Fatal(err)
	}
	_, p, err := lease.PrepareRenew(rn, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: lease.OpRenew, Digest: p.Digest, Code: renewed.Code,
		Lease: renewed.Lease, BackendTime: renewed.BackendTime}
	key := s.keys.idem(tagOf(first.Lease.LockKey), p.Scope)
	raw := mustGet(t, s, key)
	if !strings.HasPrefix(raw, lease.EvidenceWholePrefix) {
		t.Fatalf("renew evidence %.10q, want version 6", raw)
	}
	mustStored(t, s, key, v6Of(t, e, key), "renew evidence")
	again, err := s.Renew(bg, rn)
	if err != nil || !again.Replayed || again.Lease.FencingToken != renewed.Lease.FencingToken ||
		again.Lease.ExpiresAt != renewed.Lease.ExpiresAt {
		t.Fatalf("renew replay: %+v %v", again, err)
	}
}

// Version 6's check binds the value to the scope its key is named by:
// one renewal's evidence copied under the key of another renewal of the
// same lease with the same body (a renewal loop's, differing only in the
// request id) answers that renewal's replay and lookup as corrupt, not
// with the other renewal's expiry; the original still answers.
func TestFormat8EvidenceUnderAnotherRequestsKey(t *testing.T) {
	s := open8(t, Options{})
	first, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	rn1, rn2 := renewReq(first.Lease), renewReq(first.Lease)
	if rn1.RequestID == rn2.RequestID {
		t.Fatal("setup: one request id for both renewals")
	}
	r1, err := s.Renew(bg, rn1)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Renew(bg, rn2)
	if err != nil {
		t.Fatal(err)
	}
	keyOf := func(rn lease.RenewRequest) string {
		_, p, err := lease.PrepareRenew(rn, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		return s.keys.idem(tagOf(first.Lease.LockKey), p.Scope)
	}
	k1, k2 := keyOf(rn1), keyOf(rn2)
	v1 := mustGet(t, s, k1)
	if !strings.HasPrefix(v1, lease.EvidenceWholePrefix) {
		t.Fatalf("renew evidence %.10q, want version 6", v1)
	}
	if err := s.client.Do(bg, s.client.B().Set().Key(k2).Value(v1).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Renew(bg, rn2)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("renewal 2's replay of renewal 1's evidence: %+v %v, want corrupt (its own answer expired at %v)", res.Lease, err, r2.Lease.ExpiresAt)
	}
	_, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRenew, Identity: first.Lease.Identity(), PrincipalID: owner.PrincipalID,
		RequestID: rn2.RequestID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	again, err := s.Renew(bg, rn1)
	if err != nil || !again.Replayed || again.Lease.ExpiresAt != r1.Lease.ExpiresAt {
		t.Fatalf("renewal 1's replay: %+v %v", again, err)
	}
}
