package valkey

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Tests of Options.EagerDetach (library.lua's refers_at): in formats 5
// and 6, an ending whose push trims an entry that ended within the
// idempotency retention writes its evidence and its history entry in
// version 2 at once; every answer stays the first one, byte for byte.

// openEager opens a store that detaches eagerly, in format 6 if lean,
// else 5, with a history cap of histCap.
func openEager(t *testing.T, histCap int, lean bool) *Store {
	t.Helper()
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = histCap
	o := Options{StoreOptions: so, EagerDetach: true, ReferringEvidence: !lean, LeanRecords: lean}
	s := open(t, sharedServer(t), o)
	want := "referring_evidence+eager"
	if lean {
		want = "lean_records+eager"
	}
	if got := s.writeFormat(); got != want {
		t.Fatalf("write format %q, want %q", got, want)
	}
	return s
}

// eagerLife is one lease of an identity: its acquisition, the first
// answer, its release (none if it did not end by one) and the state it
// ended in.
type eagerLife struct {
	acq   lease.AcquireRequest
	first lease.Result
	rel   lease.ReleaseRequest
	ended lease.Result
	state lease.State
}

// endLife acquires on id and ends the lease: released if release, else
// revoked.
func endLife(t *testing.T, s *Store, id lease.Identity, release bool) eagerLife {
	t.Helper()
	l := eagerLife{acq: acquireReq(id), state: lease.StateReleased}
	var err error
	if l.first, err = s.Acquire(bg, l.acq); err != nil {
		t.Fatal(err)
	}
	if release {
		l.rel = releaseReq(l.first.Lease)
		if l.ended, err = s.Release(bg, l.rel); err != nil {
			t.Fatal(err)
		}
	} else if _, err := s.Revoke(bg, adminReq(l.first.Lease)); err != nil {
		t.Fatal(err)
	} else {
		l.state = lease.StateRevoked
	}
	return l
}

// mustEvidence checks the life's acquisition evidence, and its release's
// if it was released, start with prefix.
func (l eagerLife) mustEvidence(t *testing.T, s *Store, prefix string) {
	t.Helper()
	keys := []string{evidenceKey(t, s, l.acq)}
	if l.rel.RequestID != "" {
		keys = append(keys, releaseEvidenceKey(t, s, l.rel))
	}
	for _, k := range keys {
		if v, _ := get(t, s, k); !strings.HasPrefix(v, prefix) {
			t.Fatalf("evidence %.12q, want %q", v, prefix)
		}
	}
}

// mustAnswer checks the life's acquisition and release replay their first
// answers, the acquisition with the lease's state now, want.
func (l eagerLife) mustAnswer(t *testing.T, s *Store, want lease.State) {
	t.Helper()
	mustReplay(t, s, l.acq, l.first, want)
	if l.rel.RequestID != "" {
		mustReleaseReplays(t, s, l.rel, l.ended)
	}
}

// A hot identity (cap 2, every lease ended at once): the first two
// endings fill the list by reference, and are rewritten when trimmed;
// every later ending trims an entry that ended just before, so it writes
// version 2 evidence and a version 2 entry at once, which its trim then
// leaves alone. Every answer is the first one.
func TestEagerDetachHotIdentity(t *testing.T) {
	for _, lean := range []bool{false, true} {
		t.Run("format "+map[bool]string{false: "5", true: "6"}[lean], func(t *testing.T) {
			s := openEager(t, 2, lean)
			id := newIdentity()
			var lives []eagerLife
			for i := 0; i < 6; i++ {
				l := endLife(t, s, id, i%2 == 0)
				entry := historyEntries(t, s, l.first.Lease.LockKey)[0]
				if i < 2 {
					// Below the cap: nothing is trimmed, so by reference.
					l.mustEvidence(t, s, lease.EvidenceRefPrefix)
					if !strings.HasPrefix(entry, lease.HistoryScopedPrefix) {
						t.Fatalf("life %d: entry %.10q, want version 4", i, entry)
					}
				} else {
					l.mustEvidence(t, s, lease.EvidenceV2Prefix)
					if !strings.HasPrefix(entry, lease.HistoryV2Prefix) {
						t.Fatalf("life %d: entry %.10q, want version 2", i, entry)
					}
				}
				lives = append(lives, l)
			}
			if n := len(historyEntries(t, s, lives[0].first.Lease.LockKey)); n != 2 {
				t.Fatalf("%d history entries, want the cap 2", n)
			}
			for i, l := range lives {
				// The first two were rewritten when trimmed.
				l.mustEvidence(t, s, lease.EvidenceV2Prefix)
				if at, want := pexpireTime(t, s, evidenceKey(t, s, l.acq)), l.first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
					t.Fatalf("life %d: acquisition evidence PXAT %d, want %d", i, at, want)
				}
				state := l.state
				if i < 4 {
					state = lease.StateExpired // its entry was trimmed (lease.CurrentOf)
				}
				l.mustAnswer(t, s, state)
			}
		})
	}
}

// endedLine is a version 2 or 4 history entry's ended_at line.
var endedLine = regexp.MustCompile(`^(hv2\n|hv4\n[\w-]*\n[\w-]*\n)(\d+)\n`)

// backdate rewrites the identity's entry at index i to have ended by ms
// earlier.
func backdate(t *testing.T, s *Store, lockKey string, i int, by int64) {
	t.Helper()
	entry := historyEntries(t, s, lockKey)[i]
	m := endedLine.FindStringSubmatch(entry)
	if m == nil {
		t.Fatalf("entry %.20q has no ended line", entry)
	}
	at, _ := strconv.ParseInt(m[2], 10, 64)
	aged := m[1] + strconv.FormatInt(at-by, 10) + "\n" + entry[len(m[0]):]
	if err := s.client.Do(bg, s.client.B().Lset().Key(s.keys.history(tagOf(lockKey))).Index(int64(i)).Element(aged).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// An identity whose cap of endings took longer than the idempotency
// retention trims entries whose evidence is gone: its endings keep
// referring (version 3 evidence, a version 4 entry). The entry's end it
// judges by is the one at the cap, the newest the push drops.
func TestEagerDetachSlowIdentityRefers(t *testing.T) {
	s := openEager(t, 2, true)
	id := newIdentity()
	a := endLife(t, s, id, true)
	b := endLife(t, s, id, true)
	lockKey := a.first.Lease.LockKey
	retention := s.opts.IdempotencyRetention.Milliseconds()
	backdate(t, s, lockKey, 1, retention+1000) // a's entry, at the cap
	c := endLife(t, s, id, true)
	c.mustEvidence(t, s, lease.EvidenceRefPrefix)
	if e := historyEntries(t, s, lockKey)[0]; !strings.HasPrefix(e, lease.HistoryScopedPrefix) {
		t.Fatalf("entry %.10q, want version 4", e)
	}
	// a's entry was trimmed by c's push: its evidence, still there, was
	// rewritten from it as before.
	a.mustEvidence(t, s, lease.EvidenceV2Prefix)
	a.mustAnswer(t, s, lease.StateExpired)
	b.mustAnswer(t, s, lease.StateReleased)
	c.mustAnswer(t, s, lease.StateReleased)

	// A second inside the retention is hot again.
	backdate(t, s, lockKey, 1, retention-1000) // b's entry, now at the cap
	d := endLife(t, s, id, true)
	d.mustEvidence(t, s, lease.EvidenceV2Prefix)
	d.mustAnswer(t, s, lease.StateReleased)
}

// An entry at the cap that does not read as version 2 or 4 says nothing:
// the ending refers as without EagerDetach, and nothing fails.
func TestEagerDetachUnreadableEntryRefers(t *testing.T) {
	s := openEager(t, 2, true)
	id := newIdentity()
	endLife(t, s, id, true)
	b := endLife(t, s, id, true)
	lockKey := b.first.Lease.LockKey
	for _, junk := range []string{"garbage", "hv2\n", "hv2\nnot a number\n", "hv4\nx\ny\n" + strings.Repeat("9", 17) + "\n"} {
		if err := s.client.Do(bg, s.client.B().Lset().Key(s.keys.history(tagOf(lockKey))).Index(1).Element(junk).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		l := endLife(t, s, id, true)
		l.mustEvidence(t, s, lease.EvidenceRefPrefix)
		l.mustAnswer(t, s, lease.StateReleased)
	}
}

// Without EagerDetach a hot identity refers, as format 5 and 6 always
// did (TestReferringEvidenceDetachedOnTrim checks the rest).
func TestEagerDetachIsOptIn(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	s := open(t, sharedServer(t), Options{StoreOptions: so, LeanRecords: true})
	if got := s.writeFormat(); got != "lean_records" {
		t.Fatalf("write format %q", got)
	}
	id := newIdentity()
	for i := 0; i < 4; i++ {
		endLife(t, s, id, true).mustEvidence(t, s, lease.EvidenceRefPrefix)
	}
}
