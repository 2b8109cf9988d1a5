package valkey

import (
	"crypto/sha1"
	"encoding/hex"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// Review: attack on the scope evidence version 6's check binds (2e6264c,
// 92a826a): the check is the first 16 hex digits of SHA-1(<scope of the
// key it is stored under> "\n" <the lines after the check>), written by
// the library's encode_whole (remember with ev_scope, the suffix of KEYS
// 5; write_out with the record's idem_scope; detach with the history
// entry's scopes) and read by lease.ExpandEvidenceFor with the scope of
// the request it answers. Helpers are review_attack_ev6_test.go's.

// ev6sCheck is version 6's check of v as stored under scope, computed
// here from the format's description (not with the package's code).
func ev6sCheck(v, scope string) (stored, want string, ok bool) {
	rest, found := strings.CutPrefix(v, lease.EvidenceWholePrefix)
	if !found {
		return "", "", false
	}
	stored, rest, found = strings.Cut(rest, "\n")
	if !found {
		return "", "", false
	}
	sum := sha1.Sum([]byte(scope + "\n" + rest))
	return stored, hex.EncodeToString(sum[:])[:16], true
}

// ev6sKeys lists every key of s's namespace whose name, after the hash
// tag, starts with "idem:".
func ev6sKeys(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	cursor := uint64(0)
	for {
		e, err := s.client.Do(bg, s.client.B().Scan().Cursor(cursor).Match(s.keys.ns+":{*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range e.Elements {
			if _, rel, ok := strings.Cut(k[len(s.keys.ns)+1:], "}:"); ok && strings.HasPrefix(rel, "idem:") {
				out = append(out, k)
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	sort.Strings(out)
	return out
}

// ev6sAudit checks every evidence key of s: it is the key of one of reqs
// (no value was written under a key that no request is named by), and
// every version 6 value's check is that of the scope its key is named
// by (the 43 characters after the hash tag's "}:idem:", whatever the
// key prefix holds). It returns how many values were version 6.
func ev6sAudit(t *testing.T, s *Store, reqs []ev6aReq, where string) int {
	t.Helper()
	known := map[string]ev6aReq{}
	for _, q := range reqs {
		known[q.key] = q
	}
	n := 0
	for _, k := range ev6sKeys(t, s) {
		q, ok := known[k]
		if !ok {
			t.Fatalf("%s: evidence under %q, the key of no request sent", where, k)
		}
		_, rel, _ := strings.Cut(k[len(s.keys.ns)+1:], "}:")
		scope := strings.TrimPrefix(rel, "idem:")
		if !lease.ValidScope(scope) {
			t.Fatalf("%s: evidence key %q is not named by a scope", where, k)
		}
		v, ok := get(t, s, k)
		if !ok || !strings.HasPrefix(v, lease.EvidenceWholePrefix) {
			continue
		}
		n++
		stored, want, ok := ev6sCheck(v, scope)
		if !ok || stored != want {
			t.Fatalf("%s: %s evidence under %q: check %q, want %q (the scope of the key it is stored under)", where,
				q.name, k, stored, want)
		}
		// Byte for byte Go's, for the request's first answer under the
		// key's scope (the helper v6Of takes the scope after the key's
		// first ":idem:", which these prefixes hold).
		b, ok := lease.WholeEvidence(q.evidence(), q.first.Lease.Identity(), scope)
		if !ok || string(b) != v {
			t.Fatalf("%s: %s evidence under %q:\n got  %q\n want %q", where, q.name, k, v, b)
		}
	}
	return n
}

// ev6sPrefixes are key prefixes Options accepts (letters, digits and
// "_:.-", at most 64 bytes) that try the library's ev_scope, which reads
// the scope as the characters after the key's last ":idem:": one that
// holds ":idem:" and a 43-character scope-like part, one that ends in
// ":idem", one of dots and dashes.
func ev6sPrefixes() []string {
	r := randomPrefix()
	return []string{
		r + ":idem:" + strings.Repeat("A", 43),
		r + ".-:idem",
		r + "-._:idem:-_.x",
	}
}

// Held: in three key prefixes that try ev_scope (one holding ":idem:"
// and a scope-like part, one ending in ":idem", one of dots and dashes),
// and in the three ways format 8 writes whole evidence (eager endings
// on a hot identity, detach at the trim of an entry, a history retention
// below the idempotency retention, with the reaper's expiry too), every
// evidence key of the namespace is the key of a request sent, every
// version 6 value's check is that of the scope its own key is named by
// (recomputed here from the key's name), and every retry and lookup
// answers exactly the first answer: no writer (remember's KEYS 5,
// write_out's record scope, detach's entry scopes) hashed a scope other
// than that of the key it SET, and no reader checked against another.
func TestAttackEV6ScopeOfEveryKeyTheLibraryWrites(t *testing.T) {
	r := sharedServer(t)
	for _, prefix := range ev6sPrefixes() {
		var reqs []ev6aReq
		// Eager: two lives per ending on a hot identity (cap 1).
		eager := ev6aStore(t, r, 1, true, Options{KeyPrefix: prefix + "e"})
		for how := 0; how < 3; how++ {
			id := newIdentity()
			for i := 0; i < 2; i++ {
				req := acquireReq(id)
				l := ev6aLive(t, eager, req, "")
				ev6aEnd(t, eager, &l, how, req.Caller, "")
				reqs = append(reqs, l.all()...)
			}
		}
		// Detach: three lives on one identity (cap 1), the first two
		// trimmed and rewritten.
		detach := ev6aStore(t, r, 1, false, Options{KeyPrefix: prefix + "d"})
		var dreqs []ev6aReq
		id := newIdentity()
		for how := 0; how < 3; how++ {
			req := acquireReq(id)
			l := ev6aLive(t, detach, req, "")
			ev6aEnd(t, detach, &l, how, req.Caller, "")
			dreqs = append(dreqs, l.all()...)
		}
		// Short history: nothing by reference; an expiry by the reaper.
		short := ev6aStore(t, r, 8, false, Options{KeyPrefix: prefix + "s",
			StoreOptions: lease.StoreOptions{HistoryRetention: time.Hour}})
		var sreqs []ev6aReq
		for how := 0; how < 3; how++ {
			req := acquireReq(newIdentity())
			l := ev6aLive(t, short, req, "")
			ev6aEnd(t, short, &l, how, req.Caller, "")
			sreqs = append(sreqs, l.all()...)
		}
		exp := acquireReq(newIdentity())
		exp.TTL = 150 * time.Millisecond
		ea := ev6aAcquire(t, short, exp)
		sreqs = append(sreqs, ea)
		time.Sleep(time.Until(ea.first.Lease.ExpiresAt.Time()) + 50*time.Millisecond)
		if err := short.reap(bg); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			s    *Store
			reqs []ev6aReq
			min  int
		}{{"eager", eager, reqs, 3 * 2 * 4}, {"detach", detach, dreqs, 3*4 - 1}, {"short history", short, sreqs, 3*4 + 1}} {
			where := "prefix " + c.s.keys.ns + ", " + c.name
			if n := ev6sAudit(t, c.s, c.reqs, where); n < c.min {
				t.Fatalf("%s: %d values of version 6, want at least %d", where, n, c.min)
			}
			for _, q := range c.reqs {
				q.mustFirst(t, c.s, where)
			}
		}
	}
}

// Held: the scope of an administrative operation names its caller: a
// revocation's and a force-release's evidence (version 6 at once)
// answers its administrator's retry and lookup exactly as first
// answered, and a lookup under any other scope (the lease owner's
// principal, another administrator's, the other administrative
// operation's, a release's) is not found, never corrupt: no lookup path
// computes an administrative operation's scope from another principal
// and then reads the administrator's value with it. The same for a
// release's evidence looked up by an administrator.
func TestAttackEV6ScopeAdministrativeLookups(t *testing.T) {
	s := ev6aStore(t, sharedServer(t), 1, true, Options{})
	for _, op := range []lease.Op{lease.OpRevoke, lease.OpForceRelease} {
		a := ev6aAcquire(t, s, acquireReq(newIdentity()))
		q := ev6aAdmin(t, s, op, a.first.Lease)
		if v := mustGet(t, s, q.key); !strings.HasPrefix(v, lease.EvidenceWholePrefix) {
			t.Fatalf("%s evidence %.8q, want version 6", op, v)
		}
		q.mustFirst(t, s, string(op))
		other := map[lease.Op]lease.Op{lease.OpRevoke: lease.OpForceRelease, lease.OpForceRelease: lease.OpRevoke}[op]
		for name, l := range map[string]lease.LookupRequest{
			"the owner's principal":          {Op: op, PrincipalID: owner.PrincipalID},
			"another administrator":          {Op: op, PrincipalID: "prn_admin_2"},
			"the other administrative op":    {Op: other, PrincipalID: q.lookup.PrincipalID},
			"a release's by the same caller": {Op: lease.OpRelease, PrincipalID: q.lookup.PrincipalID},
		} {
			l.Identity, l.RequestID, l.DeadlineAt = q.lookup.Identity, q.lookup.RequestID, far()
			if res, err := s.LookupRequest(bg, l); lease.CodeOf(err) != lease.CodeNotFound {
				t.Fatalf("%s looked up by %s: %s, want not found", op, name, ev6aBrief(res, err))
			}
		}
	}
	a := ev6aAcquire(t, s, acquireReq(newIdentity()))
	rel := ev6aRelease(t, s, a.first.Lease, owner, uid("req_"))
	if rel.err != nil {
		t.Fatal(rel.err)
	}
	rel.mustFirst(t, s, "release")
	l := rel.lookup
	l.PrincipalID, l.DeadlineAt = "prn_admin_1", far()
	if res, err := s.LookupRequest(bg, l); lease.CodeOf(err) != lease.CodeNotFound {
		t.Fatalf("a release looked up by an administrator: %s, want not found", ev6aBrief(res, err))
	}
}

// ev6sRescope replaces the acquisition scope the active record of lock
// key lockKey carries (record version 4, format 6 on) from one to to,
// keeping its TTL.
func ev6sRescope(t *testing.T, s *Store, lockKey, from, to string) {
	t.Helper()
	k := s.keys.active(tagOf(lockKey))
	v := mustGet(t, s, k)
	if !strings.HasPrefix(v, lease.RecordV4Prefix) || strings.Count(v, "\n"+from+"\n") != 1 {
		t.Fatalf("active record %.60q: not version 4 holding scope %s once", v, from)
	}
	ev6aCopy(t, s, k, strings.Replace(v, "\n"+from+"\n", "\n"+to+"\n", 1))
}

// askR2 is what the retry and the lookup of acquisition req on id
// answer, briefly.
func askR2(s *Store, req lease.AcquireRequest, id lease.Identity) (retry, lookup string) {
	req.DeadlineAt = far()
	res, err := s.Acquire(bg, req)
	retry = ev6aBrief(res, err)
	res, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: id, PrincipalID: req.Caller.PrincipalID,
		RequestID: req.RequestID, DeadlineAt: far()})
	return retry, ev6aBrief(res, err)
}

// Found by this review, HELD since Prepared.DecodeEvidence (low: it needs the
// scope line of an active record changed to the scope of another real
// request). Version 6's check binds a value to the scope its writer was
// given, and the writers of an acquisition's evidence take it from stored
// data, the scope line the active record carries (write_out:
// r.idem_scope; detach: the history entry's, itself copied from the
// record), which the library cannot check (it has no SHA-256). So the Go
// reader also requires an acquisition it answers to be the request's own
// (its lease's AcquisitionScope() is p.Scope).
//
// Here: lease L1 is acquired by request R1; R2, the same body under
// another request id of the same principal, is refused lease_conflict
// (nothing stored). The record's scope line is then R1's scope replaced
// by R2's. While L1 is active (the embedded path), after the ending wrote
// L1's acquisition in version 6 under R2's key ("short history": nothing
// by reference), and after detach rewrote it so at the trim ("detach"),
// R2's retry and lookup answer corrupt, never L1's acquisition. Before
// the fix they answered L1 (lease id, token and request id R1): a result
// R2 never had.
func TestAttackEV6ScopeRecordScopeLaundered(t *testing.T) {
	r := sharedServer(t)
	for _, c := range []struct {
		name  string
		hist  int
		o     Options
		trims bool
	}{
		{"short history", 8, Options{StoreOptions: lease.StoreOptions{HistoryRetention: time.Hour}}, false},
		{"detach", 1, Options{}, true},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			s := ev6aStore(t, r, c.hist, false, c.o)
			id := newIdentity()
			req1 := acquireReq(id)
			a1 := ev6aAcquire(t, s, req1)
			req2 := req1
			req2.RequestID = uid("req_")
			_, p2, err := lease.PrepareAcquire(req2, s.opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Acquire(bg, req2); lease.CodeOf(err) != lease.CodeConflict {
				t.Fatalf("R2 while L1 is live: %v, want lease_conflict", err)
			}
			_, p1, _ := lease.PrepareAcquire(req1, s.opts)
			ev6sRescope(t, s, a1.first.Lease.LockKey, p1.Scope, p2.Scope)
			l1 := a1.first.Lease
			var bad []string
			// While L1 is active the embedded path reads the same scope
			// line (format 4 on).
			{
				retry, look := askR2(s, req2, id)
				for what, got := range map[string]string{"retry": retry, "lookup": look} {
					if got != "error "+string(lease.CodeCorrupt) {
						bad = append(bad, "while L1 is active (embedded), R2's "+what+" answered "+got)
					}
				}
			}
			rel := ev6aRelease(t, s, a1.first.Lease, owner, uid("req_"))
			if rel.err != nil {
				t.Fatal(rel.err)
			}
			k2 := s.keys.idem(tagOf(p2.LockKey), p2.Scope)
			ask := func() (string, string) { return askR2(s, req2, id) }
			if c.trims {
				retry, look := ask()
				if want := "error " + string(lease.CodeCorrupt); retry != want || look != want {
					t.Fatalf("before the trim, R2's retry %s and lookup %s, want corrupt (the entry's scope is not its record's)",
						retry, look)
				}
				// A second life trims L1's entry (cap 1): detach rewrites.
				b := ev6aAcquire(t, s, acquireReq(id))
				if x := ev6aRelease(t, s, b.first.Lease, owner, uid("req_")); x.err != nil {
					t.Fatal(x.err)
				}
			}
			v, ok := get(t, s, k2)
			if !ok || !strings.HasPrefix(v, lease.EvidenceWholePrefix) {
				t.Fatalf("under R2's key: %.8q, want L1's acquisition in version 6", v)
			}
			retry, look := ask()
			for what, got := range map[string]string{"retry": retry, "lookup": look} {
				if got != "error "+string(lease.CodeCorrupt) {
					bad = append(bad, "R2's "+what+" answered "+got)
				}
			}
			sort.Strings(bad)
			if len(bad) > 0 {
				t.Fatalf("%s: request R2 (%s), first answered lease_conflict, is answered with lease L1's acquisition "+
					"(lease %s, token %d, request %s) from version 6 the library wrote under R2's key with R2's scope, taken "+
					"from the record's scope line, or not as corrupt; want corrupt:\n  %s", c.name, req2.RequestID, l1.LeaseID, l1.FencingToken,
					l1.RequestID, strings.Join(bad, "\n  "))
			}
		})
	}
}
