package valkey

import (
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// A review of EagerDetach by someone who did not write it: every ending
// path, mixed instances, formats below 5, a short history retention, and
// recovery's endings. Throughout, an ended lease's evidence and its entry
// agree: version 3 evidence named by a version 4 entry, or version 2
// evidence with an entry that names none; and every answer is the first.

// revFormsAgree checks the ended lease's history entry (if still listed)
// and its evidence are either hv4 naming ev3 evidence, or hv2 with ev2
// evidence; it returns the entry's version prefix ("" if trimmed).
func revFormsAgree(t *testing.T, s *Store, l eagerLife, where string) string {
	t.Helper()
	var entry string
	for _, e := range historyEntries(t, s, l.first.Lease.LockKey) {
		if strings.Contains(e, "\n"+l.first.Lease.LeaseID+"\n") {
			entry = e
			break
		}
	}
	keys := map[string]string{"acquire": evidenceKey(t, s, l.acq)}
	if l.rel.RequestID != "" {
		keys["release"] = releaseEvidenceKey(t, s, l.rel)
	}
	for op, k := range keys {
		ev, ok := get(t, s, k)
		if !ok {
			continue
		}
		scope := k[strings.LastIndex(k, ":idem:")+len(":idem:"):]
		switch {
		case strings.HasPrefix(ev, lease.EvidenceRefPrefix):
			if !strings.HasPrefix(entry, lease.HistoryScopedPrefix) || !strings.Contains(entry, "\n"+scope+"\n") {
				t.Fatalf("%s: %s evidence ev3 but entry %.60q does not name it", where, op, entry)
			}
		case strings.HasPrefix(ev, lease.EvidenceV2Prefix):
			if strings.Contains(entry, scope) {
				t.Fatalf("%s: %s evidence ev2 but entry names its scope", where, op)
			}
		default:
			t.Fatalf("%s: %s evidence %.8q", where, op, ev)
		}
	}
	return entry[:min(3, len(entry))]
}

// revAnswers checks every life answers as first, with the state it ended
// in if its entry is still listed, else expired (lease.CurrentOf).
func revAnswers(t *testing.T, s *Store, lives []eagerLife) {
	t.Helper()
	for _, l := range lives {
		want := lease.StateExpired
		for _, e := range historyEntries(t, s, l.first.Lease.LockKey) {
			if strings.Contains(e, "\n"+l.first.Lease.LeaseID+"\n") {
				want = l.state
			}
		}
		l.mustAnswer(t, s, want)
	}
}

// Every way a lease ends, on a hot identity of an eager store (cap 2):
// each way that ends a lease once the list is full writes version 2 at
// once.
func TestReviewEagerEveryEndingPath(t *testing.T) {
	for _, lean := range []bool{false, true} {
		so := leasetest.StoreOptions()
		so.HistoryPerIdentity = 2
		s := open(t, sharedServer(t), Options{StoreOptions: so, EagerDetach: true, ReferringEvidence: !lean, LeanRecords: lean})
		id := newIdentity()
		var lives []eagerLife
		seen := map[string]bool{}
		var pending *eagerLife // expired, to be archived by the next acquire
		paths := []string{"release", "revoke", "force", "reap", "renew", "commit", "acquire", "release", "reap", "release",
			"acquire", "renew", "release", "release", "commit", "release", "force", "acquire", "release"}
		for i, p := range paths {
			l := eagerLife{acq: acquireReq(id)}
			if p == "reap" || p == "renew" || p == "commit" || p == "acquire" {
				l.acq.TTL = 100 * time.Millisecond
			}
			var err error
			if l.first, err = s.Acquire(bg, l.acq); err != nil {
				t.Fatal(err)
			}
			if pending != nil {
				seen["acquire "+revFormsAgree(t, s, *pending, "acquire-archived")] = true
				lives = append(lives, *pending)
				pending = nil
			}
			switch p {
			case "release":
				l.rel = releaseReq(l.first.Lease)
				l.ended, err = s.Release(bg, l.rel)
				l.state = lease.StateReleased
			case "revoke":
				_, err = s.Revoke(bg, adminReq(l.first.Lease))
				l.state = lease.StateRevoked
			case "force":
				_, err = s.ForceRelease(bg, adminReq(l.first.Lease))
				l.state = lease.StateReleased
			case "reap":
				waitExpired(t, s, l.first.Lease)
				err = s.reap(bg)
				l.state = lease.StateExpired
			case "renew", "commit":
				// Each finds the lease expired and archives it.
				waitExpired(t, s, l.first.Lease)
				if p == "renew" {
					_, err = s.Renew(bg, renewReq(l.first.Lease))
				} else {
					_, err = s.AuthorizeCommit(bg, commitReq(l.first.Lease))
				}
				mustCode(t, err, lease.CodeLost)
				err = nil
				l.state = lease.StateExpired
			case "acquire":
				waitExpired(t, s, l.first.Lease)
				l.state = lease.StateExpired
				pending = &l
				continue
			}
			if err != nil {
				t.Fatalf("%d %s: %v", i, p, err)
			}
			seen[p+" "+revFormsAgree(t, s, l, p)] = true
			lives = append(lives, l)
		}
		for _, p := range []string{"release", "force", "reap", "renew", "commit", "acquire"} {
			if !seen[p+" hv2"] {
				t.Fatalf("no %s ending wrote version 2 at once (%v)", p, seen)
			}
		}
		revAnswers(t, s, lives)
		for _, l := range lives {
			revFormsAgree(t, s, l, "end")
		}
	}
}

// Two instances, one eager in format 6 and one not in format 5, with
// differing caps, on one namespace and identity.
func TestReviewEagerMixedInstances(t *testing.T) {
	for _, caps := range [][2]int{{2, 2}, {2, 5}, {5, 2}, {1, 3}, {3, 1}} {
		prefix := randomPrefix()
		r := sharedServer(t)
		soA, soB := leasetest.StoreOptions(), leasetest.StoreOptions()
		soA.HistoryPerIdentity, soB.HistoryPerIdentity = caps[0], caps[1]
		a := open(t, r, Options{KeyPrefix: prefix, StoreOptions: soA, EagerDetach: true, LeanRecords: true})
		b := open(t, r, Options{KeyPrefix: prefix, StoreOptions: soB, ReferringEvidence: true})
		b.loadFormat(bg)
		id := newIdentity()
		var lives []eagerLife
		for i := 0; i < 14; i++ {
			lives = append(lives, endLife(t, []*Store{a, b}[(i*7/3)%2], id, true))
			for _, x := range lives {
				revFormsAgree(t, a, x, "mixed")
			}
		}
		revAnswers(t, a, lives)
		revAnswers(t, b, lives)
	}
}

// EagerDetach set below format 5 writes nothing eager, then detaches once
// the namespace is raised and read.
func TestReviewEagerBelowFormat5(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	prefix := randomPrefix()
	r := sharedServer(t)
	s := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, EagerDetach: true, EmbeddedEvidence: true})
	if got := s.writeFormat(); got != "embedded_evidence" {
		t.Fatalf("format %q", got)
	}
	open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, LeanRecords: true})
	s.loadFormat(bg)
	if got := s.writeFormat(); got != "lean_records+eager" {
		t.Fatalf("format %q", got)
	}
	id := newIdentity()
	var lives []eagerLife
	for i := 0; i < 4; i++ {
		l := endLife(t, s, id, true)
		revFormsAgree(t, s, l, "cap1")
		lives = append(lives, l)
	}
	revAnswers(t, s, lives)
}

// A history retention shorter than the idempotency retention never
// refers, eager or not.
func TestReviewEagerShortHistoryRetention(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	so.HistoryRetention = time.Hour
	s := open(t, sharedServer(t), Options{StoreOptions: so, EagerDetach: true, LeanRecords: true})
	id := newIdentity()
	var lives []eagerLife
	for i := 0; i < 4; i++ {
		l := endLife(t, s, id, true)
		if v, _ := get(t, s, evidenceKey(t, s, l.acq)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("evidence %.5q", v)
		}
		lives = append(lives, l)
	}
	revAnswers(t, s, lives)
}

// Recovery's endings (recover_end) on a hot identity of an eager store.
func TestReviewEagerRecovery(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: so, EagerDetach: true, LeanRecords: true}
	s := open(t, r, o)
	id, id2 := newIdentity(), newIdentity()
	var lives []eagerLife
	for _, x := range []lease.Identity{id, id, id2, id2} {
		lives = append(lives, endLife(t, s, x, true))
	}
	live := eagerLife{acq: acquireReq(id), state: lease.StateRevoked}
	gone := eagerLife{acq: shortReq(id2), state: lease.StateExpired}
	for _, l := range []*eagerLife{&live, &gone} {
		var err error
		if l.first, err = s.Acquire(bg, l.acq); err != nil {
			t.Fatal(err)
		}
	}
	waitExpired(t, s, gone.first.Lease)
	if _, err := s.Seal(bg); err != nil {
		t.Fatal(err)
	}
	c, _ := closedState(t, o)
	if _, err := c.Finish(bg, lease.RecoveryPlan{Reason: "drill"}); err != nil {
		t.Fatal(err)
	}
	lives = append(lives, live, gone)
	for _, l := range lives {
		revFormsAgree(t, s, l, "recovery")
	}
	revAnswers(t, s, lives)
}
