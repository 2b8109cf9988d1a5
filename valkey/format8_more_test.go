package valkey

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// More tests of stored format 8 (format.go): every whole evidence the
// library writes is stored byte for byte as lease.WholeEvidence writes
// it, keeps its expiry and replays the first answer; damage answers
// corrupt; an older build and a format 7 instance share a namespace with
// it.

// life8 is one lease of an identity in these tests: v7Life (its
// acquisition, its release if it was released) with the renewal it had
// and, if an administrator ended it, that ending, and the evidence the Go
// side expects of each.
type life8 struct {
	v7Life
	rn      lease.RenewRequest
	renewed lease.Result
	rnEv    *lease.IdempotencyRecord
	rnPX    int64 // the renewal evidence's PEXPIRETIME as written
	admOp   lease.Op
	adm     lease.AdminRequest
	admRes  lease.Result
	admEv   *lease.IdempotencyRecord
	admPX   int64
	whole   string // the form its writer wrote whole evidence in: "ev6" or "ev2"
}

// renewKey and adminKey are the evidence keys of a renewal and of an
// administrative ending op.
func renewKey(t *testing.T, s *Store, req lease.RenewRequest) string {
	t.Helper()
	_, p, err := lease.PrepareRenew(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return s.keys.idem(tagOf(p.LockKey), p.Scope)
}

func adminKey(t *testing.T, s *Store, op lease.Op, req lease.AdminRequest) string {
	t.Helper()
	_, p, err := lease.PrepareAdmin(op, req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return s.keys.idem(tagOf(p.LockKey), p.Scope)
}

// mustPXFromWrite checks key expires the idempotency retention after
// written, the backend time of the call that wrote it, and returns when.
func mustPXFromWrite(t *testing.T, s *Store, key string, written lease.Timestamp, what string) int64 {
	t.Helper()
	at := pexpireTime(t, s, key)
	if min := written.UnixMilli() + s.opts.IdempotencyRetention.Milliseconds(); at < min || at > min+1000 {
		t.Fatalf("%s expires at %d, want the retention after its write %d", what, at, min)
	}
	return at
}

// endLife8 acquires on id, renews to ttl and ends the lease by end
// (lease.OpRelease, OpRevoke or OpForceRelease), through s.
func endLife8(t *testing.T, s *Store, id lease.Identity, end lease.Op, ttl time.Duration) life8 {
	t.Helper()
	l := life8{whole: map[bool]string{true: "ev6", false: "ev2"}[s.writes(checkedEvidence)]}
	l.acq = acquireReq(id)
	var err error
	if l.first, err = s.Acquire(bg, l.acq); err != nil {
		t.Fatal(err)
	}
	l.rn = renewReq(l.first.Lease)
	l.rn.TTL = ttl
	if l.renewed, err = s.Renew(bg, l.rn); err != nil || l.renewed.Lease.TTLMs != ttl.Milliseconds() {
		t.Fatalf("renew: %+v %v", l.renewed.Lease, err)
	}
	_, p, _ := lease.PrepareRenew(l.rn, s.opts)
	l.rnEv = &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: lease.OpRenew, Digest: p.Digest, Code: l.renewed.Code,
		Lease: l.renewed.Lease, BackendTime: l.renewed.BackendTime}
	l.rnPX = mustPXFromWrite(t, s, renewKey(t, s, l.rn), l.renewed.BackendTime, "renewal evidence")
	switch end {
	case lease.OpRelease:
		l.state = lease.StateReleased
		l.rel = releaseReq(l.renewed.Lease)
		if l.ended, err = s.Release(bg, l.rel); err != nil {
			t.Fatal(err)
		}
	case lease.OpRevoke, lease.OpForceRelease:
		l.admOp, l.adm = end, adminReq(l.renewed.Lease)
		_, l.state = lease.AdminOutcome(end)
		if end == lease.OpRevoke {
			l.admRes, err = s.Revoke(bg, l.adm)
		} else {
			l.admRes, err = s.ForceRelease(bg, l.adm)
		}
		if err != nil || l.admRes.Lease.State != l.state {
			t.Fatalf("%s: %+v %v", end, l.admRes, err)
		}
		_, ap, _ := lease.PrepareAdmin(end, l.adm, s.opts)
		l.admEv = &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: end, Digest: ap.Digest, Code: l.admRes.Code,
			Lease: l.admRes.Lease, BackendTime: l.admRes.BackendTime}
		l.admPX = mustPXFromWrite(t, s, adminKey(t, s, end, l.adm), l.admRes.BackendTime, string(end)+" evidence")
	default:
		t.Fatalf("setup: ending %q", end)
	}
	l.acqEv = acqEvidence(t, s, l.acq, l.first)
	if l.entry = entryOf(t, s, l.first.Lease); l.entry == "" {
		t.Fatal("the ending wrote no history entry of the lease")
	}
	if l.rel.RequestID != "" {
		l.relEv = relEvidence(t, s, l.rel, l.ended)
		l.relPX = mustPXFromWrite(t, s, releaseEvidenceKey(t, s, l.rel), l.ended.BackendTime, "release evidence")
	}
	return l
}

// wholeOf is e as form ("ev6" or "ev2") writes it under key, an evidence
// key (version 6's check is of its scope).
func wholeOf(t *testing.T, form string, e *lease.IdempotencyRecord, key string) string {
	t.Helper()
	if form == "ev6" {
		return v6Of(t, e, key)
	}
	return v2Of(t, e)
}

// mustWhole checks the life's renewal evidence, and its administrative
// ending's, are stored exactly as its writer's form writes them, with the
// expiry they were written with.
func (l life8) mustWhole(t *testing.T, s *Store, where string) {
	t.Helper()
	k := renewKey(t, s, l.rn)
	mustStored(t, s, k, wholeOf(t, l.whole, l.rnEv, k), where+": renewal evidence in "+l.whole)
	if at := pexpireTime(t, s, k); at != l.rnPX {
		t.Fatalf("%s: renewal evidence PXAT %d, want %d as written", where, at, l.rnPX)
	}
	if l.admEv != nil {
		k := adminKey(t, s, l.admOp, l.adm)
		mustStored(t, s, k, wholeOf(t, l.whole, l.admEv, k), where+": "+string(l.admOp)+" evidence in "+l.whole)
		if at := pexpireTime(t, s, k); at != l.admPX {
			t.Fatalf("%s: %s evidence PXAT %d, want %d as written", where, l.admOp, at, l.admPX)
		}
	}
}

// answers8 checks every request of the life replays, and is looked up
// as, its first answer byte for byte (the acquisition's and renewal's with
// the lease's state now, want), and that another digest under a request
// id conflicts.
func (l life8) answers8(t *testing.T, s *Store, want lease.State) {
	t.Helper()
	l.mustAnswer(t, s, want) // the acquisition, and the release if any
	got, err := s.Renew(bg, l.rn)
	if err != nil || !got.Replayed || got.Code != lease.CodeRenewed || encoded(t, got.Lease) != encoded(t, l.renewed.Lease) ||
		got.BackendTime.UnixMilli() != l.renewed.BackendTime.UnixMilli() {
		t.Fatalf("renewal replay: %+v %v\nwant %+v", got, err, l.renewed)
	}
	if got.Current == nil || got.Current.State != want || got.Current.LeaseID != l.first.Lease.LeaseID {
		t.Fatalf("renewal replay's current state: %+v, want %s", got.Current, want)
	}
	lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRenew, Identity: l.rn.Identity, PrincipalID: l.rn.Caller.PrincipalID,
		RequestID: l.rn.RequestID, DeadlineAt: far()})
	if err != nil || lr.Code != lease.CodeRenewed || encoded(t, lr.Lease) != encoded(t, l.renewed.Lease) ||
		lr.Current == nil || lr.Current.State != want {
		t.Fatalf("renewal lookup: %+v %v", lr, err)
	}
	other := l.rn
	other.TTL += time.Second
	_, err = s.Renew(bg, other)
	mustCode(t, err, lease.CodeIdempotencyConflict)
	if l.admEv == nil {
		return
	}
	if l.admOp == lease.OpRevoke {
		got, err = s.Revoke(bg, l.adm)
	} else {
		got, err = s.ForceRelease(bg, l.adm)
	}
	if err != nil || !got.Replayed || got.Code != l.admRes.Code || encoded(t, got.Lease) != encoded(t, l.admRes.Lease) ||
		got.BackendTime.UnixMilli() != l.admRes.BackendTime.UnixMilli() {
		t.Fatalf("%s replay: %+v %v\nwant %+v", l.admOp, got, err, l.admRes)
	}
	lr, err = s.LookupRequest(bg, lease.LookupRequest{Op: l.admOp, Identity: l.adm.Identity, PrincipalID: l.adm.Caller.PrincipalID,
		RequestID: l.adm.RequestID, DeadlineAt: far()})
	if err != nil || lr.Code != l.admRes.Code || encoded(t, lr.Lease) != encoded(t, l.admRes.Lease) {
		t.Fatalf("%s lookup: %+v %v", l.admOp, lr, err)
	}
}

// Every whole evidence of format 8 is version 6, byte for byte as
// lease.WholeEvidence writes it, expiring as written: a renewal's, a
// revocation's and a force-release's at once; an acquisition's and a
// release's once detach rewrites them at the trim of their entry (kept
// PXAT), or at once when an eager ending trims a live entry. Replays and
// lookups of each answer exactly the first answer, before and after the
// trim, with the lease's state now (expired once its entry is gone).
func TestFormat8WholeEvidenceWriters(t *testing.T) {
	ends := []lease.Op{lease.OpRelease, lease.OpRevoke, lease.OpForceRelease, lease.OpRelease, lease.OpRevoke,
		lease.OpForceRelease, lease.OpRelease}
	for _, eager := range []bool{false, true} {
		t.Run(map[bool]string{false: "refer", true: "eager"}[eager], func(t *testing.T) {
			so := leasetest.StoreOptions()
			so.HistoryPerIdentity = 2
			s := open8(t, Options{StoreOptions: so, EagerDetach: eager})
			id := newIdentity()
			var lives []life8
			for i, end := range ends {
				l := endLife8(t, s, id, end, time.Duration(i%3+1)*25*time.Second)
				where := "life " + strconv.Itoa(i) + " (" + string(end) + ") just ended"
				l.mustWhole(t, s, where)
				form := "ev5"
				if eager && i >= 2 {
					form = "ev6" // its push dropped a live entry
				}
				l.mustForms(t, s, form, where)
				l.answers8(t, s, l.state)
				lives = append(lives, l)
			}
			for i, l := range lives {
				trimmed := i < len(lives)-2
				form, state := "ev5", l.state
				if trimmed || (eager && i >= 2) {
					form = "ev6"
				}
				if trimmed {
					state = lease.StateExpired
					if entryOf(t, s, l.first.Lease) != "" {
						t.Fatalf("life %d's entry is still listed", i)
					}
				}
				where := "life " + strconv.Itoa(i)
				l.mustForms(t, s, form, where)
				l.mustWhole(t, s, where)
				l.answers8(t, s, state)
				l.mustForms(t, s, form, where+" after its replays")
				l.mustWhole(t, s, where+" after its replays")
			}
		})
	}
}

// With a history retention shorter than the idempotency retention nothing
// refers to an entry: every ending writes the acquisition's evidence out
// in version 6 as lease.WholeEvidence writes it, expiring at acquired_at
// + the retention, a release its own in version 6 too, next to a history
// entry of version 5 (it names no evidence: version 2 without the tag
// line), which reads back as the lease ended; replays and lookups answer
// the first answers with the state now, which the library finds from the
// lease id version 6 names.
func TestFormat8WrittenOutWhole(t *testing.T) {
	endings := []struct {
		name  string
		short bool // a lease that expires
		want  lease.State
		end   func(t *testing.T, s *Store, l *life8)
	}{
		{"release", false, lease.StateReleased, nil},
		{"revoke", false, lease.StateRevoked, nil},
		{"force_release", false, lease.StateReleased, nil},
		{"reaper", true, lease.StateExpired, func(t *testing.T, s *Store, l *life8) {
			if err := s.reap(bg); err != nil {
				t.Fatal(err)
			}
		}},
		{"acquire_over_expired", true, lease.StateExpired, func(t *testing.T, s *Store, l *life8) {
			if _, err := s.Acquire(bg, acquireReq(l.acq.Identity)); err != nil {
				t.Fatal(err)
			}
		}},
		{"renew_over_expired", true, lease.StateExpired, func(t *testing.T, s *Store, l *life8) {
			_, err := s.Renew(bg, renewReq(l.first.Lease))
			mustCode(t, err, lease.CodeLost)
		}},
		{"release_over_expired", true, lease.StateExpired, func(t *testing.T, s *Store, l *life8) {
			_, err := s.Release(bg, releaseReq(l.first.Lease))
			mustCode(t, err, lease.CodeLost)
		}},
		{"commit_over_expired", true, lease.StateExpired, func(t *testing.T, s *Store, l *life8) {
			_, err := s.AuthorizeCommit(bg, commitReq(l.first.Lease))
			mustCode(t, err, lease.CodeLost)
		}},
	}
	so := leasetest.StoreOptions()
	so.HistoryRetention = time.Hour
	s := open8(t, Options{StoreOptions: so})
	if s.opts.HistoryRetention >= s.opts.IdempotencyRetention {
		t.Fatalf("setup: history retention %v, idempotency %v", s.opts.HistoryRetention, s.opts.IdempotencyRetention)
	}
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			id := newIdentity()
			var l life8
			if e.short {
				l.whole, l.state = "ev6", e.want
				l.acq = shortReq(id)
				var err error
				if l.first, err = s.Acquire(bg, l.acq); err != nil {
					t.Fatal(err)
				}
				waitExpired(t, s, l.first.Lease)
				e.end(t, s, &l)
				l.acqEv = acqEvidence(t, s, l.acq, l.first)
			} else {
				l = endLife8(t, s, id, map[string]lease.Op{"release": lease.OpRelease, "revoke": lease.OpRevoke,
					"force_release": lease.OpForceRelease}[e.name], 45*time.Second)
				l.mustWhole(t, s, "ended")
			}
			l.mustForms(t, s, "ev6", "ended")
			entry := entryOf(t, s, l.first.Lease)
			if !strings.HasPrefix(entry, lease.HistoryUntaggedPrefix) || strings.Contains(entry, tagOf(l.first.Lease.LockKey)) {
				t.Fatalf("entry %.10q, want version 5 without the tag", entry)
			}
			if h, err := lease.DecodeScopedHistory([]byte(entry), l.first.Lease.LockKey); err != nil ||
				h.Record.LeaseID != l.first.Lease.LeaseID || h.Record.State != e.want {
				t.Fatalf("entry decodes to %+v, %v", h, err)
			}
			if e.short {
				mustReplay(t, s, l.acq, l.first, e.want)
			} else {
				l.answers8(t, s, e.want)
				l.mustWhole(t, s, "after the replays")
			}
			l.mustForms(t, s, "ev6", "after the replays")
		})
	}
}

// v6With is v, version 6 evidence, with line i replaced by line.
func v6With(v string, i int, line string) string {
	f := strings.Split(v, "\n")
	f[i] = line
	return strings.Join(f, "\n")
}

// v6Without is v with line i removed; v6Insert v with line as line i.
func v6Without(v string, i int) string {
	f := strings.Split(v, "\n")
	return strings.Join(append(f[:i:i], f[i+1:]...), "\n")
}

func v6Insert(v string, i int, line string) string {
	f := strings.Split(v, "\n")
	return strings.Join(append(f[:i:i], append([]string{line}, f[i:]...)...), "\n")
}

// v6Rechecked is v with its check recomputed for scope (an idempotency
// scope, the name of the key it is stored under) over its lines after the
// check, as the format says (computed here): the first 16 lower-case hex
// digits of the SHA-1 of scope, a newline and those lines.
func v6Rechecked(v, scope string) string {
	f := strings.SplitN(v, "\n", 3)
	sum := sha1.Sum([]byte(scope + "\n" + f[2]))
	return f[0] + "\n" + hex.EncodeToString(sum[:])[:16] + "\n" + f[2]
}

// v6Target is the whole evidence of a life that a damage test damages:
// its key, the request that reads it (replay, lookup) and what the Go
// side expects.
type v6Target struct {
	key    string
	ev     *lease.IdempotencyRecord
	replay func() error
	lookup lease.LookupRequest
}

// target is the life's evidence of op (acquire, renew, release, revoke).
func (l life8) target(t *testing.T, s *Store, op lease.Op) v6Target {
	t.Helper()
	lookup := func(req lease.Mutation, id lease.Identity) lease.LookupRequest {
		return lease.LookupRequest{Op: op, Identity: id, PrincipalID: req.Caller.PrincipalID, RequestID: req.RequestID, DeadlineAt: far()}
	}
	switch op {
	case lease.OpAcquire:
		return v6Target{evidenceKey(t, s, l.acq), l.acqEv, func() error { _, err := s.Acquire(bg, l.acq); return err },
			lookup(l.acq.Mutation, l.acq.Identity)}
	case lease.OpRenew:
		return v6Target{renewKey(t, s, l.rn), l.rnEv, func() error { _, err := s.Renew(bg, l.rn); return err },
			lookup(l.rn.Mutation, l.rn.Identity)}
	case lease.OpRelease:
		return v6Target{releaseEvidenceKey(t, s, l.rel), l.relEv, func() error { _, err := s.Release(bg, l.rel); return err },
			lookup(l.rel.Mutation, l.rel.Identity)}
	}
	return v6Target{adminKey(t, s, l.admOp, l.adm), l.admEv, func() error { _, err := s.Revoke(bg, l.adm); return err },
		lookup(l.adm.Mutation, l.adm.Identity)}
}

// mustCorrupt checks the target's replay and lookup answer corrupt.
func (x v6Target) mustCorrupt(t *testing.T, s *Store, when string) {
	t.Helper()
	if err := x.replay(); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("%s: the %s replay answered %v, want corrupt", when, x.ev.Op, err)
	}
	lr, err := s.LookupRequest(bg, x.lookup)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("%s: the %s lookup answered %+v %v, want corrupt", when, x.ev.Op, lr, err)
	}
}

// v6Damaged is what a damage of a's version 6 evidence is made of: the
// scope its key is named by (what its check is of), a's hash tag (what
// format 8's check was first of) and lock key, the scope of b's key of
// the same operation (another identity's) and b's evidence stored there,
// and the scope of a's request of the same operation with another request
// id (another request's key of a's identity).
type v6Damaged struct{ scope, tag, lockKey, scopeB, otherV, scopeOther string }

// Damaged version 6 evidence answers corrupt, never a result, for its
// replay and its lookup, and changes nothing: each of an acquisition's
// (written out), a renewal's, a release's and a revocation's, with one
// character changed on any one line; any line after the check changed
// and the check recomputed for it with a wrong scope (another identity's
// key's, a's hash tag as format 8 first had it, the whole lock key, none);
// the lines as written, checked for another scope (another identity's
// key's, another request's key's of a's identity, the tag's, the lock
// key's, none); the digest's last character with stray bits (as it is,
// and checked for the right scope); the check upper-case, shorter,
// longer; a line removed or added; a trailing newline; CRLF; another
// identity's evidence of the same operation in its key. The lease's
// undamaged evidence still answers, and a later ending that trims the
// lease's entry leaves the damaged value as it is.
func TestFormat8DamageFailsClosed(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryRetention = time.Hour // every evidence whole
	so.HistoryPerIdentity = 1
	s := open8(t, Options{StoreOptions: so})
	// shape is a life like each case's: its version 6 lines.
	shape := endLife8(t, s, newIdentity(), lease.OpRelease, 45*time.Second)
	n := len(strings.Split(v6Of(t, shape.rnEv, renewKey(t, s, shape.rn)), "\n"))
	if n != 23 {
		t.Fatalf("setup: version 6 of %d lines", n)
	}
	type damage func(v string, d v6Damaged) string
	damages := map[string]damage{
		"lines checked for b's scope":             func(v string, d v6Damaged) string { return v6Rechecked(v, d.scopeB) },
		"lines checked for another request's key": func(v string, d v6Damaged) string { return v6Rechecked(v, d.scopeOther) },
		"lines checked for the tag":               func(v string, d v6Damaged) string { return v6Rechecked(v, d.tag) },
		"lines checked for the lock key":          func(v string, d v6Damaged) string { return v6Rechecked(v, d.lockKey) },
		"lines checked for no scope":              func(v string, d v6Damaged) string { return v6Rechecked(v, "") },
		"check upper-case":                        func(v string, d v6Damaged) string { return v6With(v, 1, upperCheck(strings.Split(v, "\n")[1])) },
		"check of 15 digits":                      func(v string, d v6Damaged) string { return v6With(v, 1, strings.Split(v, "\n")[1][:15]) },
		"check of 17 digits":                      func(v string, d v6Damaged) string { return v6With(v, 1, strings.Split(v, "\n")[1]+"0") },
		"a trailing newline":                      func(v string, d v6Damaged) string { return v + "\n" },
		"a trailing space":                        func(v string, d v6Damaged) string { return v + " " },
		"CRLF":                                    func(v string, d v6Damaged) string { return strings.ReplaceAll(v, "\n", "\r\n") },
		"a line added before the check":           func(v string, d v6Damaged) string { return v6Insert(v, 1, "0") },
		"a line added after the check":            func(v string, d v6Damaged) string { return v6Insert(v, 2, "0") },
		"b's evidence of this operation":          func(v string, d v6Damaged) string { return d.otherV },
		"digest with stray bits":                  func(v string, d v6Damaged) string { return v6Stray(v) },
		"digest with stray bits, checked":         func(v string, d v6Damaged) string { return v6Rechecked(v6Stray(v), d.scope) },
	}
	for i := 0; i < n; i++ {
		damages["line "+strconv.Itoa(i)+" one off"] = func(v string, d v6Damaged) string {
			return v6With(v, i, oneOff(strings.Split(v, "\n")[i]))
		}
		damages["line "+strconv.Itoa(i)+" removed"] = func(v string, d v6Damaged) string { return v6Without(v, i) }
		if i >= 2 {
			for wrong, scope := range map[string]func(d v6Damaged) string{
				"b's scope":    func(d v6Damaged) string { return d.scopeB },
				"the tag":      func(d v6Damaged) string { return d.tag },
				"the lock key": func(d v6Damaged) string { return d.lockKey },
				"no scope":     func(d v6Damaged) string { return "" },
			} {
				damages["line "+strconv.Itoa(i)+" one off, checked for "+wrong] = func(v string, d v6Damaged) string {
					return v6Rechecked(v6With(v, i, oneOff(strings.Split(v, "\n")[i])), scope(d))
				}
			}
		}
	}
	for _, op := range []lease.Op{lease.OpAcquire, lease.OpRenew, lease.OpRelease, lease.OpRevoke} {
		for name, d := range damages {
			t.Run(string(op)+"/"+name, func(t *testing.T) {
				end := lease.OpRelease
				if op == lease.OpRevoke {
					end = lease.OpRevoke
				}
				idA, idB := newIdentity(), newIdentity()
				a := endLife8(t, s, idA, end, 45*time.Second)
				b := endLife8(t, s, idB, end, 45*time.Second)
				x, xb := a.target(t, s, op), b.target(t, s, op)
				v := v6Of(t, x.ev, x.key)
				mustStored(t, s, x.key, v, "the evidence as written")
				lk := a.first.Lease.LockKey
				bad := d(v, v6Damaged{scope: scopeOf(t, x.key), tag: tagOf(lk), lockKey: lk, scopeB: scopeOf(t, xb.key),
					otherV: mustGet(t, s, xb.key), scopeOther: lease.IdempotencyScope(op, lk, x.lookup.PrincipalID, x.lookup.RequestID+"-other")})
				if bad == v {
					t.Fatalf("setup: not damaged: %q", bad)
				}
				ttl := pexpireTime(t, s, x.key)
				if err := s.client.Do(bg, s.client.B().Set().Key(x.key).Value(bad).Keepttl().Build()).Error(); err != nil {
					t.Fatal(err)
				}
				keys := []string{evidenceKey(t, s, a.acq), renewKey(t, s, a.rn), x.key, evidenceKey(t, s, b.acq), renewKey(t, s, b.rn)}
				before := keysSnapshot(t, s, keys, a.first.Lease.LockKey)
				x.mustCorrupt(t, s, "damaged")
				if after := keysSnapshot(t, s, keys, a.first.Lease.LockKey); after != before {
					t.Fatalf("a refused replay changed the store:\n%q\nwas\n%q", after, before)
				}
				// The lease's other evidence, and b's, still answer.
				if op != lease.OpAcquire {
					mustReplay(t, s, a.acq, a.first, a.state)
				}
				if op != lease.OpRenew {
					if got, err := s.Renew(bg, a.rn); err != nil || encoded(t, got.Lease) != encoded(t, a.renewed.Lease) {
						t.Fatalf("a's renewal replay: %+v %v", got, err)
					}
				}
				b.answers8(t, s, b.state)
				// A later ending trims a's entry; the damage stays as it is.
				endLife8(t, s, idA, lease.OpRelease, 30*time.Second)
				if entryOf(t, s, a.first.Lease) != "" {
					t.Fatal("a's entry is still listed")
				}
				mustStored(t, s, x.key, bad, "the damaged evidence after a trim")
				if at := pexpireTime(t, s, x.key); at != ttl {
					t.Fatalf("the damaged evidence's PXAT %d, was %d", at, ttl)
				}
				x.mustCorrupt(t, s, "trimmed")
			})
		}
	}
}

// scopeOf is the idempotency scope key, an evidence key, is named by.
func scopeOf(t *testing.T, key string) string {
	t.Helper()
	_, scope, ok := strings.Cut(key, ":idem:")
	if !ok || len(scope) != 43 {
		t.Fatalf("%q is no evidence key", key)
	}
	return scope
}

// v6Stray is v with the digest's last character's two low bits set (a
// spelling base64url decoders may accept; the writer never uses it).
func v6Stray(v string) string {
	f := strings.Split(v, "\n")
	c := strings.IndexByte(b64URL, f[3][42])
	f[3] = f[3][:42] + string(b64URL[c|1])
	return strings.Join(f, "\n")
}

// Version 6 read under another identity's lock key is corrupt: a's
// evidence of each operation copied into b's key of the same operation
// (b's request with a's request id, principal and parameters, so that
// the key differs from a's only by the identity's tag and its scope)
// answers b's replay and lookup corrupt, changes nothing, and a's copy
// still answers a.
func TestFormat8CopiedToAnotherIdentity(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryRetention = time.Hour
	s := open8(t, Options{StoreOptions: so})
	for _, op := range []lease.Op{lease.OpAcquire, lease.OpRenew, lease.OpRelease, lease.OpRevoke} {
		t.Run(string(op), func(t *testing.T) {
			end := lease.OpRelease
			if op == lease.OpRevoke {
				end = lease.OpRevoke
			}
			a := endLife8(t, s, newIdentity(), end, 45*time.Second)
			b := endLife8(t, s, newIdentity(), end, 45*time.Second)
			xa, xb := a.target(t, s, op), b.target(t, s, op)
			va := v6Of(t, xa.ev, xa.key)
			mustStored(t, s, xa.key, va, "a's evidence")
			mustStored(t, s, xb.key, v6Of(t, xb.ev, xb.key), "b's evidence")
			if err := s.client.Do(bg, s.client.B().Set().Key(xb.key).Value(va).Keepttl().Build()).Error(); err != nil {
				t.Fatal(err)
			}
			keys := []string{xa.key, xb.key, evidenceKey(t, s, b.acq), renewKey(t, s, b.rn)}
			before := keysSnapshot(t, s, keys, b.first.Lease.LockKey)
			xb.mustCorrupt(t, s, "a's evidence in b's key")
			if after := keysSnapshot(t, s, keys, b.first.Lease.LockKey); after != before {
				t.Fatalf("a refused replay changed the store:\n%q\nwas\n%q", after, before)
			}
			mustStored(t, s, xa.key, va, "a's evidence after b's refusals")
			a.answers8(t, s, a.state)
		})
	}
}

// A build from before format 8 (its library without level 8 and without
// naming the lease of version 6: simulated, as the older build's library
// would be; its Go side read only through lease.ExpandEvidence, which this
// test applies itself, since the simulated store runs this build's Go)
// refuses to lower the switch; its library answers a replay of version 6
// with the evidence and no history entry of its lease, and its Go reader
// takes that for version 1, which never decodes: corrupt, never a result.
// Its trims leave version 6 as it is and detach version 5 into version 2,
// which this build answers. This build refuses a switch it does not know
// ("9") and leaves it.
func TestFormat8OlderBuildAndGate(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: so, LeanEvidence: true}
	s := open(t, r, o)
	if err := s.EnableCheckedEvidence(bg); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, s, s.keys.format()); v != checkedEvidence || s.writeFormat() != "checked_evidence" {
		t.Fatalf("after EnableCheckedEvidence: switch %q, writing %q", v, s.writeFormat())
	}
	// An earlier format's switch never takes it back.
	for _, lower := range []func(context.Context) error{s.EnableLeanEvidence, s.EnableLeanRecords, s.EnableCompactFormat} {
		if err := lower(bg); err != nil {
			t.Fatal(err)
		}
	}
	if v := mustGet(t, s, s.keys.format()); v != checkedEvidence || !s.writes(checkedEvidence) {
		t.Fatalf("an earlier format's switch lowered it to %q", v)
	}
	id := newIdentity()
	l := endLife8(t, s, id, lease.OpRevoke, 45*time.Second)
	l.mustWhole(t, s, "ended")
	l.mustForms(t, s, "ev5", "ended")

	old := olderBuild(t, r, o.KeyPrefix, ", ['8'] = 8", " or string.sub(ev, 1, 4) == 'ev6\\n'", ", checked_evidence = 8")
	old.setFormat("") // a switch it does not know: it writes version 1
	old.opts.HistoryPerIdentity = 1
	for _, f := range []string{leanEvidence, leanRecords} {
		mustCode(t, old.raiseFormat(bg, f), lease.CodeCorrupt)
	}
	if v := mustGet(t, old, old.keys.format()); v != checkedEvidence {
		t.Fatalf("an older build changed the switch to %q", v)
	}
	// Each whole evidence read by the older build: its library's reply and
	// its Go reader's answer; this build's library names the lease.
	tag := tagOf(l.first.Lease.LockKey)
	for _, x := range []v6Target{l.target(t, s, lease.OpRenew), l.target(t, s, lease.OpRevoke)} {
		v := v6Of(t, x.ev, x.key)
		oldRep, err := old.read(bg, lease.At(far()), "lookup", []string{x.key, old.keys.active(tag), old.keys.history(tag)}, "", l.first.Lease.LockKey)
		if err != nil || oldRep.status != "evidence" || oldRep.at(0) != v || len(oldRep.f) != 3 {
			t.Fatalf("the older library's %s reply: %q %q %v, want the evidence and no history entry", x.ev.Op, oldRep.status, oldRep.f, err)
		}
		newRep, err := s.read(bg, lease.At(far()), "lookup", []string{x.key, s.keys.active(tag), s.keys.history(tag)}, "", l.first.Lease.LockKey)
		if err != nil || newRep.status != "evidence" || newRep.at(0) != v || len(newRep.f) != 4 || newRep.f[3] != l.entry {
			t.Fatalf("this library's %s reply: %q %q %v, want the evidence and its lease's entry", x.ev.Op, newRep.status, newRep.f, err)
		}
		// The older Go reader (evidenceBytes before ExpandEvidenceFor).
		if raw, ok := lease.ExpandEvidence(oldRep.at(0), id); ok {
			if ev, err := lease.DecodeIdempotencyRecord([]byte(raw)); lease.CodeOf(err) != lease.CodeCorrupt {
				t.Fatalf("the older reader decoded version 6 %s evidence: %+v %v", x.ev.Op, ev, err)
			}
		}
		if _, ok := lease.ReferredLeaseID(v); ok {
			t.Fatalf("%q read as version 3", v)
		}
		if _, _, ok := lease.LeanIDLeaseID(v); ok {
			t.Fatalf("%q read as version 5", v)
		}
	}
	l.mustWhole(t, s, "after the older build's reads")
	l.answers8(t, s, lease.StateRevoked)

	// The older build's ending trims the entry: its detach rewrites the
	// acquisition's version 5 in version 2 and leaves version 6 as it is.
	next, err := old.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Release(bg, releaseReq(next.Lease)); err != nil {
		t.Fatal(err)
	}
	if entryOf(t, s, l.first.Lease) != "" {
		t.Fatal("the entry is still listed")
	}
	l.mustForms(t, s, "ev2", "after an older build's trim")
	l.mustWhole(t, s, "after an older build's trim")
	l.answers8(t, s, lease.StateExpired)

	// A later format's switch: refused, and left as it is.
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.format()).Value("9").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, s.EnableCheckedEvidence(bg), lease.CodeCorrupt)
	if v := mustGet(t, s, s.keys.format()); v != "9" {
		t.Fatalf("the unknown switch became %q", v)
	}
	if !s.writes(checkedEvidence) {
		t.Fatal("a refused raise changed the store's own format")
	}
	s.loadFormat(bg)
	if s.writes(compactFormat) || s.writeFormat() != "v1" {
		t.Fatalf("an unknown switch is written as %q, want version 1", s.writeFormat())
	}
}

// Instances of one namespace in format 8 where one has not yet read the
// switch (it still writes format 7: whole evidence in version 2): each
// reads what the other wrote; the renewals and administrative endings of
// each are stored as its own form writes them; endings of either trim
// entries whose evidence either wrote by reference (version 5), and the
// trimming writer's detach rewrites it in its own form. Once the format 7
// instance reads the switch it writes version 6 too. Every answer, from
// either instance, is the first one.
func TestFormat8MixedWriters(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	prefix := randomPrefix()
	a := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, CheckedEvidence: true})
	b := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, LeanEvidence: true})
	if v := mustGet(t, a, a.keys.format()); v != checkedEvidence || !b.writes(checkedEvidence) {
		t.Fatalf("switch %q", v)
	}
	b.setFormat(leanEvidence) // has not yet read the switch
	if a.writeFormat() != "checked_evidence" || b.writeFormat() != "lean_evidence" {
		t.Fatalf("write formats %q and %q", a.writeFormat(), b.writeFormat())
	}
	name := map[*Store]string{a: "a", b: "b"}
	id := newIdentity()
	ends := []lease.Op{lease.OpRelease, lease.OpRevoke, lease.OpForceRelease}
	var lives []life8
	var trimForm []string // the form each life's by-reference evidence was detached in, if it was
	// live ends life i through w, which writes whole evidence in form.
	live := func(i int, w *Store, form string) {
		t.Helper()
		l := endLife8(t, w, id, ends[i%3], time.Duration(i%2+1)*30*time.Second)
		where := "life " + strconv.Itoa(i) + " by " + name[w]
		l.whole = form
		l.mustWhole(t, w, where)
		l.mustForms(t, w, "ev5", where)
		for _, rd := range []*Store{a, b} {
			l.answers8(t, rd, l.state)
		}
		lives = append(lives, l)
		trimForm = append(trimForm, "")
		// This ending trimmed the entry two back, whoever wrote it.
		if i >= 2 {
			trimForm[i-2] = form
			old := lives[i-2]
			if entryOf(t, a, old.first.Lease) != "" {
				t.Fatalf("life %d's entry is still listed", i-2)
			}
			old.mustForms(t, a, form, "life "+strconv.Itoa(i-2)+", trimmed by "+name[w])
			old.mustWhole(t, b, "life "+strconv.Itoa(i-2)+", trimmed by "+name[w])
		}
	}
	writers := []*Store{a, b, b, a, a, b, b}
	for i, w := range writers {
		live(i, w, map[*Store]string{a: "ev6", b: "ev2"}[w])
	}
	// b reads the switch at its next load, and writes version 6 from then.
	b.loadFormat(bg)
	if b.writeFormat() != "checked_evidence" {
		t.Fatalf("b after loading the switch writes %q", b.writeFormat())
	}
	for i := len(writers); i < len(writers)+3; i++ {
		live(i, b, "ev6")
	}
	for i, l := range lives {
		state := l.state
		if trimForm[i] != "" {
			state = lease.StateExpired
			l.mustForms(t, b, trimForm[i], "life "+strconv.Itoa(i)+" at the end")
		} else {
			l.mustForms(t, b, "ev5", "life "+strconv.Itoa(i)+" at the end")
		}
		l.mustWhole(t, a, "life "+strconv.Itoa(i)+" at the end")
		for _, rd := range []*Store{a, b} {
			l.answers8(t, rd, state)
		}
	}
}

// EnableCheckedEvidence (format.go) sends operators to the README,
// "--valkey-checked-evidence", for rolling back, and the flag's help says
// "only once every instance sharing it runs this build". The README
// documents format 8 (a finding on c5c1ede, which had no word of it): the
// flag, the switch's value, and that a rollback sets the switch back to 7
// and waits until no evidence key holds version 6 and no history list an
// entry of version 5 (older builds answer both corrupt, as they do version
// 5's evidence, for which the README gives that wait). An operator rolling
// back from format 8 by the format 7 paragraph would start an older build
// while version 6 evidence is live.
func TestFormat8READMERollback(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	for _, says := range []string{
		"`--valkey-checked-evidence`",
		"`SET <prefix>:format 8`",
		"Rolling back past format 8",
	} {
		if !strings.Contains(readme, says) {
			t.Errorf("the README does not say %q", says)
		}
	}
	_, rollback, _ := strings.Cut(readme, "Rolling back past format 8")
	rollback, _, _ = strings.Cut(rollback, "before an older build starts")
	for _, says := range []string{"`SET <prefix>:format 7`", "`ev6`", "`hv5`"} {
		if !strings.Contains(rollback, says) {
			t.Errorf("the README's rollback past format 8 does not say %q: %q", says, rollback)
		}
	}
}
