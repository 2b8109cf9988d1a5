package valkey

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Review: attack on stored format 7 (Options.LeanEvidence): evidence by
// reference in version 5 (lease/evidence_v5.go), written by the library
// (write_out, remember), read back by evidenceBytes, rewritten by the
// library's detach (referring_fields) before its history entry goes.
// The contract: a replay answers exactly the first answer, another digest
// conflicts, damage fails closed, never a wrong result.

// ev5Store opens a store in format 7 on r, keeping at most hist entries
// per identity.
func ev5Store(t *testing.T, r *testenv.Redis, hist int, o Options) *Store {
	t.Helper()
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = hist
	if o.StoreOptions.HistoryRetention != 0 {
		so.HistoryRetention = o.StoreOptions.HistoryRetention
	}
	o.StoreOptions = so
	o.LeanEvidence = true
	s := open(t, r, o)
	if !s.writes(leanEvidence) || !strings.HasPrefix(s.writeFormat(), "lean_evidence") {
		t.Fatalf("the namespace is not in format 7: %q", s.writeFormat())
	}
	return s
}

// ev5Life is one lease of an attack: its acquisition and first answer,
// and if it was released the release and its first answer.
type ev5Life struct {
	acq   lease.AcquireRequest
	first lease.Result
	rel   lease.ReleaseRequest
	ended lease.Result
}

// answerOf is a result as the contract compares replays: the lease's
// encoding, the code and the backend time (ms).
func answerOf(t *testing.T, r lease.Result) string {
	t.Helper()
	return string(r.Code) + "@" + strconv.FormatInt(r.BackendTime.UnixMilli(), 10) + " " + encoded(t, r.Lease)
}

// outcome is what a replay answered: its answer, or the error's code.
func outcome(t *testing.T, r lease.Result, err error) string {
	t.Helper()
	if err != nil {
		return "error " + string(lease.CodeOf(err))
	}
	if !r.Replayed {
		return "not a replay: " + answerOf(t, r)
	}
	return answerOf(t, r)
}

func (l ev5Life) acquireOutcome(t *testing.T, s *Store) string {
	t.Helper()
	r, err := s.Acquire(bg, l.acq)
	return outcome(t, r, err)
}

func (l ev5Life) releaseOutcome(t *testing.T, s *Store) string {
	t.Helper()
	r, err := s.Release(bg, l.rel)
	return outcome(t, r, err)
}

// mustFirst checks that the life's acquisition and release (if any)
// replay and look up exactly their first answers on s.
func (l ev5Life) mustFirst(t *testing.T, s *Store, where string) {
	t.Helper()
	if got, want := l.acquireOutcome(t, s), answerOf(t, l.first); got != want {
		t.Fatalf("%s: acquire replay\n got  %s\n want %s", where, got, want)
	}
	lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: l.acq.Identity,
		PrincipalID: l.acq.Caller.PrincipalID, RequestID: l.acq.RequestID, DeadlineAt: far()})
	if err != nil || encoded(t, lr.Lease) != encoded(t, l.first.Lease) || lr.BackendTime.UnixMilli() != l.first.BackendTime.UnixMilli() {
		t.Fatalf("%s: acquire lookup %+v %v", where, lr, err)
	}
	other := l.acq
	other.TTL -= time.Millisecond
	_, err = s.Acquire(bg, other)
	mustCode(t, err, lease.CodeIdempotencyConflict)
	if l.rel.RequestID == "" {
		return
	}
	if got, want := l.releaseOutcome(t, s), answerOf(t, l.ended); got != want {
		t.Fatalf("%s: release replay\n got  %s\n want %s", where, got, want)
	}
	lr, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRelease, Identity: l.rel.Identity,
		PrincipalID: l.rel.Caller.PrincipalID, RequestID: l.rel.RequestID, DeadlineAt: far()})
	if err != nil || encoded(t, lr.Lease) != encoded(t, l.ended.Lease) || lr.BackendTime.UnixMilli() != l.ended.BackendTime.UnixMilli() {
		t.Fatalf("%s: release lookup %+v %v", where, lr, err)
	}
	rel := l.rel
	rel.FencingToken++
	_, err = s.Release(bg, rel)
	mustCode(t, err, lease.CodeIdempotencyConflict)
}

// ev5Want is the version 5 evidence Go's own encoder gives for an
// answer of op referring to entry, the lease's history entry as stored:
// what the library must have stored.
func ev5Want(t *testing.T, s *Store, op lease.Op, digest string, res lease.Result, entry string) string {
	t.Helper()
	code := lease.CodeAcquired
	if op == lease.OpRelease {
		code = lease.CodeReleased
	}
	if entry == "" {
		t.Fatalf("no history entry of %s", res.Lease.LeaseID)
	}
	b, ok := lease.LeanIDEvidence(&lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: op, Digest: digest,
		Code: code, Lease: res.Lease, BackendTime: res.BackendTime}, entry)
	if !ok {
		t.Fatalf("LeanIDEvidence refuses the first answer of %s: %+v", op, res)
	}
	return string(b)
}

func acquireDigest(t *testing.T, s *Store, req lease.AcquireRequest) string {
	t.Helper()
	_, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return p.Digest
}

func releaseDigest(t *testing.T, s *Store, req lease.ReleaseRequest) string {
	t.Helper()
	_, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return p.Digest
}

// mustEV5Stored checks that the life's evidence is exactly version 5 as
// Go encodes its first answers, referring to the lease's history entry
// as stored.
func (l ev5Life) mustEV5Stored(t *testing.T, s *Store) {
	t.Helper()
	entry := entryOf(t, s, l.first.Lease)
	if v, _ := get(t, s, evidenceKey(t, s, l.acq)); v != ev5Want(t, s, lease.OpAcquire, acquireDigest(t, s, l.acq), l.first, entry) {
		t.Fatalf("acquisition evidence %q, want %q", v, ev5Want(t, s, lease.OpAcquire, acquireDigest(t, s, l.acq), l.first, entry))
	}
	if l.rel.RequestID == "" {
		return
	}
	if v, _ := get(t, s, releaseEvidenceKey(t, s, l.rel)); v != ev5Want(t, s, lease.OpRelease, releaseDigest(t, s, l.rel), l.ended, entry) {
		t.Fatalf("release evidence %q, want %q", v, ev5Want(t, s, lease.OpRelease, releaseDigest(t, s, l.rel), l.ended, entry))
	}
}

// ev5End acquires on id and ends the lease: released if release, else
// revoked.
func ev5End(t *testing.T, s *Store, id lease.Identity, release bool) ev5Life {
	t.Helper()
	l := ev5Life{acq: acquireReq(id)}
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
	}
	return l
}

// trimAway ends leases on lockKey's identity until its history holds no
// entry of leaseID (the library's detach has then run on it).
func trimAway(t *testing.T, s *Store, id lease.Identity, leaseID string) {
	t.Helper()
	for i := 0; i < 10; i++ {
		found := false
		for _, e := range historyEntries(t, s, lockKey(t, id)) {
			if strings.Contains(e, "\n"+leaseID+"\n") {
				found = true
			}
		}
		if !found {
			return
		}
		ev5End(t, s, id, false)
	}
	t.Fatal("the entry was never trimmed")
}

// Every way a lease ends in format 7 stores exactly the version 5 bytes Go
// encodes for the first answers (the library's writer agrees with
// lease.LeanIDEvidence, renewals, a TTL change and the maximum lifetime's
// cap included), every replay and lookup answers those first answers
// before and after the entry is trimmed (detach's version 2), and the
// evidence keeps its expiry through the rewrite.
func TestAttackEV5EveryEndingAnswersFirst(t *testing.T) {
	r := sharedServer(t)
	type ending struct {
		name  string
		short bool
		// end ends l's lease (a release sets l.rel and l.ended); it
		// returns a successor lease to revoke, if any.
		end func(t *testing.T, s *Store, l *ev5Life) *lease.Record
	}
	endings := []ending{
		{"release_after_renewals_capped", false, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			rn := renewReq(l.first.Lease)
			rn.TTL = 800 * time.Millisecond
			if _, err := s.Renew(bg, rn); err != nil {
				t.Fatal(err)
			}
			time.Sleep(450 * time.Millisecond)
			rn = renewReq(l.first.Lease)
			rn.TTL = time.Second
			renewed, err := s.Renew(bg, rn)
			if err != nil {
				t.Fatal(err)
			}
			if got := renewed.Lease.ExpiresAt.UnixMilli() - renewed.Lease.AcquiredAt.UnixMilli(); got != 1200 {
				t.Fatalf("renewal's expiry %d ms after acquisition, want the lifetime's cap 1200", got)
			}
			l.rel = releaseReq(renewed.Lease)
			if l.ended, err = s.Release(bg, l.rel); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"release_at_once", false, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			var err error
			l.rel = releaseReq(l.first.Lease)
			if l.ended, err = s.Release(bg, l.rel); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"force_release", false, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			if _, err := s.ForceRelease(bg, adminReq(l.first.Lease)); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"revoke", false, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			if _, err := s.Revoke(bg, adminReq(l.first.Lease)); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"reaper", true, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			waitExpired(t, s, l.first.Lease)
			if err := s.reap(bg); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"acquire_over_expired", true, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			waitExpired(t, s, l.first.Lease)
			next, err := s.Acquire(bg, acquireReq(l.first.Lease.Identity()))
			if err != nil {
				t.Fatal(err)
			}
			return next.Lease
		}},
		{"renew_after_expiry", true, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			waitExpired(t, s, l.first.Lease)
			_, err := s.Renew(bg, renewReq(l.first.Lease))
			mustCode(t, err, lease.CodeLost)
			return nil
		}},
		{"commit_after_expiry", true, func(t *testing.T, s *Store, l *ev5Life) *lease.Record {
			waitExpired(t, s, l.first.Lease)
			_, err := s.AuthorizeCommit(bg, commitReq(l.first.Lease))
			mustCode(t, err, lease.CodeLost)
			return nil
		}},
	}
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			s := ev5Store(t, r, 2, Options{})
			l := ev5Life{acq: acquireReq(newIdentity())}
			if e.short {
				l.acq = shortReq(l.acq.Identity)
			} else {
				l.acq.TTL, l.acq.MaximumLifetime = time.Second, 1200*time.Millisecond
			}
			var err error
			if l.first, err = s.Acquire(bg, l.acq); err != nil {
				t.Fatal(err)
			}
			if next := e.end(t, s, &l); next != nil {
				if _, err := s.Revoke(bg, adminReq(next)); err != nil {
					t.Fatal(err)
				}
			}
			l.mustEV5Stored(t, s)
			at := pexpireTime(t, s, evidenceKey(t, s, l.acq))
			if want := l.first.Lease.AcquiredAt.UnixMilli() + s.opts.IdempotencyRetention.Milliseconds(); at != want {
				t.Fatalf("acquisition evidence PXAT %d, want %d", at, want)
			}
			l.mustFirst(t, s, "by reference")
			trimAway(t, s, l.acq.Identity, l.first.Lease.LeaseID)
			if v, _ := get(t, s, evidenceKey(t, s, l.acq)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
				t.Fatalf("acquisition evidence after the trim: %.12q, want version 2", v)
			}
			if got := pexpireTime(t, s, evidenceKey(t, s, l.acq)); got != at {
				t.Fatalf("the rewrite moved the expiry: %d, want %d", got, at)
			}
			l.mustFirst(t, s, "detached")
		})
	}
}

// Two instances on one namespace, one of which has not yet read the
// switch to format 7 (it writes version 3), end leases of one identity in
// turn: each reads the other's evidence, and the trims rewrite both
// versions, so every answer is the first one from either instance.
func TestAttackEV5MixedWithFormat6Instance(t *testing.T) {
	r := sharedServer(t)
	prefix := randomPrefix()
	s7 := ev5Store(t, r, 2, Options{KeyPrefix: prefix})
	s6 := ev5Store(t, r, 2, Options{KeyPrefix: prefix})
	s6.setFormat(leanRecords) // lagging: it last read format 6
	if s6.writeFormat() != "lean_records" {
		t.Fatal("the lagging instance does not write format 6")
	}
	id := newIdentity()
	var lives []ev5Life
	for i := 0; i < 6; i++ {
		w := s7
		prefixWant := lease.EvidenceLeanIDPrefix
		if i%2 == 1 {
			w, prefixWant = s6, lease.EvidenceRefPrefix
		}
		l := ev5End(t, w, id, true)
		if v, _ := get(t, w, evidenceKey(t, w, l.acq)); !strings.HasPrefix(v, prefixWant) {
			t.Fatalf("life %d: evidence %.6q, want %q", i, v, prefixWant)
		}
		lives = append(lives, l)
		for j, old := range lives {
			old.mustFirst(t, s7, "format 7 reader, life "+strconv.Itoa(j))
			old.mustFirst(t, s6, "lagging reader, life "+strconv.Itoa(j))
		}
	}
}

// An instance that detaches eagerly in format 7 (a hot identity) and one
// whose history retention is below the idempotency retention write whole
// evidence where they must; every answer is the first one.
func TestAttackEV5EagerAndShortHistory(t *testing.T) {
	r := sharedServer(t)
	t.Run("eager", func(t *testing.T) {
		s := ev5Store(t, r, 2, Options{EagerDetach: true})
		if s.writeFormat() != "lean_evidence+eager" {
			t.Fatalf("write format %q", s.writeFormat())
		}
		id := newIdentity()
		var lives []ev5Life
		for i := 0; i < 5; i++ {
			lives = append(lives, ev5End(t, s, id, i%2 == 0))
			for _, l := range lives {
				l.mustFirst(t, s, "eager")
			}
		}
		if v, _ := get(t, s, evidenceKey(t, s, lives[4].acq)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("a hot identity's ending wrote %.6q, want version 2", v)
		}
	})
	t.Run("short_history", func(t *testing.T) {
		s := ev5Store(t, r, 2, Options{StoreOptions: lease.StoreOptions{HistoryRetention: time.Hour}})
		l := ev5End(t, s, newIdentity(), true)
		for _, k := range []string{evidenceKey(t, s, l.acq), releaseEvidenceKey(t, s, l.rel)} {
			if v, _ := get(t, s, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
				t.Fatalf("evidence %.6q with a history retention below the idempotency retention, want version 2", v)
			}
		}
		l.mustFirst(t, s, "short history")
	})
}

// damageCase replaces version 5 evidence v by what it returns. Each case
// is tried as it is, the check (if any) no longer that of the lines, and,
// unless checkLine, rechecked: its check recomputed for its lines and the
// lease's entry (a forged value, or damage the check misses), so that
// what refuses it, if anything, is the rest of the reader. As it is,
// every case answers corrupt and detach leaves it; undetectable and
// conflict are what the rechecked value answers.
type damageCase struct {
	name string
	edit func(v string, l ev5Life) string
	// undetectable: rechecked, the damage changes a fact only the evidence
	// holds (inherent to every version whose check a forger can compute):
	// the reader and the rewrite must still agree. Before version 5's check
	// this was the damage itself.
	undetectable bool
	// conflict: rechecked, the damage is a digest, which answers a
	// conflict.
	conflict bool
	// checkLine: the damage is to the check line itself (rechecked, it is
	// the value as stored).
	checkLine bool
}

func ev5Lines(v string) []string { return strings.Split(v, "\n") }

func withLine(v string, i int, s string) string {
	f := ev5Lines(v)
	f[i] = s
	return strings.Join(f, "\n")
}

// ev5Body is v without its last line (version 5's check), and ev5Last its
// last line.
func ev5Body(v string) string { return v[:strings.LastIndexByte(v, '\n')] }
func ev5Last(v string) string { return v[strings.LastIndexByte(v, '\n')+1:] }

// Damaged version 5 evidence: the Go reader and the library's detach
// (referring_fields) agree on every value. Evidence the reader refuses is
// never rewritten into evidence that reads (left as it is); evidence it
// reads is rewritten into the same answer. And damage the reader can
// detect fails closed, never answering a result: with version 5's check,
// every damage as it is, the TTL one millisecond off or above the
// lifetime included (before the check, undetectable as in versions 2 and
// 3), and another digest (before, a conflict); rechecked, every damage
// but those.
func TestAttackEV5DamagedEvidenceReaderAndDetachAgree(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 1, Options{})
	common := []damageCase{
		{name: "token_plus_one", edit: func(v string, l ev5Life) string {
			return withLine(v, 4, strconv.FormatUint(l.first.Lease.FencingToken+1, 10))
		}},
		{name: "token_leading_zero", edit: func(v string, l ev5Life) string { return withLine(v, 4, "0"+ev5Lines(v)[4]) }},
		{name: "token_17_digits", edit: func(v string, l ev5Life) string {
			return withLine(v, 4, "0000000000000000"+ev5Lines(v)[4])
		}},
		{name: "lease_id_other", edit: func(v string, l ev5Life) string { return withLine(v, 3, "lease_"+uid("x")) }},
		{name: "lease_id_empty", edit: func(v string, l ev5Life) string { return withLine(v, 3, "") }},
		{name: "lease_id_with_space", edit: func(v string, l ev5Life) string { return withLine(v, 3, ev5Lines(v)[3]+" ") }},
		{name: "digest_stray_bits", edit: func(v string, l ev5Life) string {
			d := ev5Lines(v)[2]
			last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", d[42])
			return withLine(v, 2, d[:42]+string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last|1]))
		}},
		{name: "digest_short", edit: func(v string, l ev5Life) string { return withLine(v, 2, ev5Lines(v)[2][:42]) }},
		{name: "digest_padded", edit: func(v string, l ev5Life) string { return withLine(v, 2, ev5Lines(v)[2]+"=") }},
		{name: "digest_other", conflict: true, edit: func(v string, l ev5Life) string {
			return withLine(v, 2, strings.Repeat("A", 43))
		}},
		{name: "extra_line", edit: func(v string, l ev5Life) string { return v + "\n1" }},
		{name: "extra_line_before_check", edit: func(v string, l ev5Life) string { return ev5Body(v) + "\n1\n" + ev5Last(v) }},
		{name: "trailing_newline", edit: func(v string, l ev5Life) string { return v + "\n" }},
		{name: "version_ev4", edit: func(v string, l ev5Life) string { return "ev4" + v[3:] }},
		{name: "crlf", edit: func(v string, l ev5Life) string { return strings.ReplaceAll(v, "\n", "\r\n") }},
		// The check line.
		{name: "check_digit_changed", checkLine: true, edit: func(v string, l ev5Life) string {
			c := ev5Last(v)
			return ev5Body(v) + "\n" + c[:15] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", c[15])+1)%16])
		}},
		{name: "check_upper_case", checkLine: true, edit: func(v string, l ev5Life) string {
			return ev5Body(v) + "\n" + upperCheck(ev5Last(v))
		}},
		{name: "check_15_digits", checkLine: true, edit: func(v string, l ev5Life) string { return v[:len(v)-1] }},
		{name: "check_17_digits", checkLine: true, edit: func(v string, l ev5Life) string { return v + "0" }},
		{name: "check_not_hex", checkLine: true, edit: func(v string, l ev5Life) string { return v[:len(v)-1] + "g" }},
		{name: "check_trailing_space", checkLine: true, edit: func(v string, l ev5Life) string { return v + " " }},
		{name: "check_missing", edit: func(v string, l ev5Life) string { return ev5Body(v) }},
		{name: "check_of_no_entry", checkLine: true, edit: func(v string, l ev5Life) string { return ev5Rechecked(v, "") }},
	}
	acquisition := append([]damageCase{
		{name: "op_release", edit: func(v string, l ev5Life) string {
			return strings.Join(append([]string{"ev5", "r"}, ev5Lines(v)[2:5]...), "\n") + "\n" + ev5Last(v)
		}},
		{name: "ttl_zero", edit: func(v string, l ev5Life) string { return withLine(v, 5, "0") }},
		{name: "ttl_leading_zero", edit: func(v string, l ev5Life) string { return withLine(v, 5, "0"+ev5Lines(v)[5]) }},
		{name: "ttl_above_max", edit: func(v string, l ev5Life) string { return withLine(v, 5, "86400001") }},
		// No acquisition grants more than its maximum lifetime (Prepare
		// refuses it), but the record's validation allows it (a renewal's
		// may): rechecked, undetectable as for versions 2 and 3.
		{name: "ttl_above_lifetime", undetectable: true, edit: func(v string, l ev5Life) string { return withLine(v, 5, "300001") }},
		{name: "ttl_2pow53_plus_1", edit: func(v string, l ev5Life) string { return withLine(v, 5, "9007199254740993") }},
		{name: "ttl_duration_overflow", edit: func(v string, l ev5Life) string { return withLine(v, 5, "9223372036855") }},
		{name: "ttl_missing", edit: func(v string, l ev5Life) string {
			return strings.Join(ev5Lines(v)[:5], "\n") + "\n" + ev5Last(v)
		}},
		{name: "ttl_minus_one_ms", undetectable: true, edit: func(v string, l ev5Life) string {
			n, _ := strconv.Atoi(ev5Lines(v)[5])
			return withLine(v, 5, strconv.Itoa(n-1))
		}},
		{name: "ttl_plus_one_ms", undetectable: true, edit: func(v string, l ev5Life) string {
			n, _ := strconv.Atoi(ev5Lines(v)[5])
			return withLine(v, 5, strconv.Itoa(n+1))
		}},
	}, common...)
	release := append([]damageCase{
		{name: "op_acquire", edit: func(v string, l ev5Life) string {
			return strings.Join(append([]string{"ev5", "a"}, ev5Lines(v)[2:5]...), "\n") + "\n30000\n" + ev5Last(v)
		}},
		{name: "ttl_line_added", edit: func(v string, l ev5Life) string { return ev5Body(v) + "\n30000\n" + ev5Last(v) }},
	}, common...)

	for _, side := range []struct {
		name  string
		cases []damageCase
		key   func(l ev5Life) string
		out   func(t *testing.T, l ev5Life) string
		first func(l ev5Life) lease.Result
	}{
		{"acquisition", acquisition, func(l ev5Life) string { return evidenceKey(t, s, l.acq) },
			func(t *testing.T, l ev5Life) string { return l.acquireOutcome(t, s) }, func(l ev5Life) lease.Result { return l.first }},
		{"release", release, func(l ev5Life) string { return releaseEvidenceKey(t, s, l.rel) },
			func(t *testing.T, l ev5Life) string { return l.releaseOutcome(t, s) }, func(l ev5Life) lease.Result { return l.ended }},
	} {
		for _, c := range side.cases {
			for _, recheck := range []bool{false, true} {
				if recheck && c.checkLine {
					continue
				}
				name := side.name + "/" + c.name
				if recheck {
					name += "/rechecked"
				}
				t.Run(name, func(t *testing.T) {
					id := newIdentity()
					l := ev5End(t, s, id, true)
					key := side.key(l)
					v := mustGet(t, s, key)
					if !strings.HasPrefix(v, lease.EvidenceLeanIDPrefix) {
						t.Fatalf("evidence %.6q, want version 5", v)
					}
					entry := entryOf(t, s, l.first.Lease)
					if ev5Rechecked(v, entry) != v {
						t.Fatalf("setup: the evidence %q is not checked against its entry", v)
					}
					damaged := c.edit(v, l)
					if recheck {
						was := damaged
						if damaged = ev5Rechecked(was, entry); damaged == was {
							t.Fatal("setup: rechecking changes nothing")
						}
					}
					if damaged == v {
						t.Fatal("the case changes nothing")
					}
					if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(damaged).Keepttl().Build()).Error(); err != nil {
						t.Fatal(err)
					}
					before := side.out(t, l)
					trimAway(t, s, id, l.first.Lease.LeaseID)
					after := side.out(t, l)
					stored, _ := get(t, s, key)
					if before != after {
						t.Fatalf("the reader and the rewrite disagree on %q:\n by reference %s\n rewritten    %s (stored %.12q)",
							damaged, before, after, stored)
					}
					// Damage as it is, which the reader refuses, is left as
					// it is. (Rechecked, a TTL the reader refuses, 0 or
					// above the maximum, may be rewritten into version 2
					// evidence the reader refuses as well, as before the
					// check: before == after above.)
					if !recheck && before == "error "+string(lease.CodeCorrupt) && stored != damaged {
						t.Fatalf("detach rewrote evidence the reader refuses, %q, into %q", damaged, stored)
					}
					switch {
					case recheck && c.conflict:
						if before != "error "+string(lease.CodeIdempotencyConflict) {
							t.Fatalf("another digest answered %s, want a conflict", before)
						}
					case recheck && c.undetectable:
						if before == answerOf(t, side.first(l)) {
							t.Fatalf("the damage changed nothing the answer holds")
						}
						t.Logf("undetectable with a check recomputed (as damage in versions 2 and 3): %s", before)
					default:
						if before != "error "+string(lease.CodeCorrupt) {
							t.Fatalf("damaged evidence %q answered %s, want corrupt", damaged, before)
						}
					}
				})
			}
		}
	}
}

// hv4 line numbers of a history entry (see archive in library.lua).
const (
	hv4Ended    = 3
	hv4EndedBy  = 4
	hv4Reason   = 6
	hv4Expires  = 23
	hv4TTL      = 24
	hv4Lifetime = 25
)

// editEntry rewrites, in place, the history entry of leaseID on id's
// identity with edit.
func editEntry(t *testing.T, s *Store, id lease.Identity, leaseID string, edit func(f []string)) {
	t.Helper()
	for i, e := range historyEntries(t, s, lockKey(t, id)) {
		if !strings.Contains(e, "\n"+leaseID+"\n") {
			continue
		}
		if !strings.HasPrefix(e, lease.HistoryScopedPrefix) {
			t.Fatalf("entry %.12q, want version 4", e)
		}
		f := strings.Split(e, "\n")
		if f[15] != leaseID {
			t.Fatalf("entry's line 15 is %q, not the lease id", f[15])
		}
		edit(f)
		cmd := s.client.B().Lset().Key(s.keys.history(tagOf(lockKey(t, id)))).Index(int64(i)).Element(strings.Join(f, "\n")).Build()
		if err := s.client.Do(bg, cmd).Error(); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("no entry of the lease")
}

func addMs(t *testing.T, v string, d int64) string {
	t.Helper()
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.FormatInt(n+d, 10)
}

// Was a FINDING, fixed by version 5's check. Version 5 takes from the
// lease's history entry facts version 3 (format 6) held itself or checked
// against the entry: a release's backend time (the entry's ended_at;
// version 3 held it) and its expires_at and ttl_ms (version 3 refused an
// entry whose were not the answer's), and an acquisition's expires_at
// (derived from the entry's maximum_lifetime_ms; version 3 held it, and
// an entry whose lifetime no longer allows it failed validation). Before
// the check, an entry damaged in one of those facts, to a value every
// reader accepts, made the replay answer a result that is not the first
// answer, where format 6 answers the first answer (ended_at) or fails
// closed. Version 5 now checks the entry's bytes (any damage to them
// fails the check), so each such damage answers corrupt in format 7. The
// contract: damage fails closed, never a wrong result.
func TestAttackEV5AnswerFromUncheckedEntryFacts(t *testing.T) {
	r := sharedServer(t)
	for _, format := range []string{leanRecords, leanEvidence} {
		for _, c := range []struct {
			name    string
			release bool
			edit    func(f []string)
		}{
			{"release/ended_at_plus_1ms", true, func(f []string) { f[hv4Ended] = addMs(t, f[hv4Ended], 1) }},
			{"release/expires_at_minus_1ms", true, func(f []string) { f[hv4Expires] = addMs(t, f[hv4Expires], -1) }},
			{"release/ttl_ms_plus_1", true, func(f []string) { f[hv4TTL] = addMs(t, f[hv4TTL], 1) }},
			// The lease was renewed to a 1 s TTL before it ended, so the
			// entry's record stays valid with a 2 s lifetime.
			{"acquisition/maximum_lifetime_below_its_ttl", false, func(f []string) { f[hv4Lifetime] = "2000" }},
		} {
			t.Run("format"+format+"/"+c.name, func(t *testing.T) {
				s := ev5Store(t, r, 8, Options{})
				s.setFormat(format)
				id := newIdentity()
				l := ev5Life{acq: acquireReq(id)}
				var err error
				if l.first, err = s.Acquire(bg, l.acq); err != nil {
					t.Fatal(err)
				}
				rn := renewReq(l.first.Lease)
				rn.TTL = time.Second
				renewed, err := s.Renew(bg, rn)
				if err != nil {
					t.Fatal(err)
				}
				l.rel = releaseReq(renewed.Lease)
				if l.ended, err = s.Release(bg, l.rel); err != nil {
					t.Fatal(err)
				}
				wantPrefix := map[string]string{leanRecords: lease.EvidenceRefPrefix, leanEvidence: lease.EvidenceLeanIDPrefix}[format]
				for _, k := range []string{evidenceKey(t, s, l.acq), releaseEvidenceKey(t, s, l.rel)} {
					if v, _ := get(t, s, k); !strings.HasPrefix(v, wantPrefix) {
						t.Fatalf("evidence %.6q, want %q", v, wantPrefix)
					}
				}
				l.mustFirst(t, s, "undamaged")
				editEntry(t, s, id, l.first.Lease.LeaseID, c.edit)
				got, want := l.acquireOutcome(t, s), answerOf(t, l.first)
				if c.release {
					got, want = l.releaseOutcome(t, s), answerOf(t, l.ended)
				}
				if got != want && got != "error "+string(lease.CodeCorrupt) {
					t.Errorf("format %s: a replay over a damaged history entry answered a wrong result:\n got  %s\n want %s (or corrupt)",
						format, got, want)
				}
			})
		}
	}
}

// A history entry damaged where the library's detach does not decode it
// (its ending lines: ended_by, reason) fails the Go reader's strict
// decoding, so the replay answers corrupt while the entry is there.
// Before version 5's check, the detach still rewrote its evidence (it
// decodes only the record's lines), after which the replay answered the
// first answer again (as in format 5). Now the evidence's check is of the
// entry's bytes as written, which the damage changed, so the detach
// leaves the evidence as it is (one whose scope line is damaged it never
// finds) and the replays still answer corrupt: never another answer.
func TestAttackEV5DetachOfAnEntryTheReaderRefuses(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 1, Options{})
	for _, c := range []struct {
		name string
		edit func(f []string)
	}{
		{"ended_by_not_an_id", func(f []string) { f[hv4EndedBy] = "not an id" }},
		{"reason_not_json", func(f []string) { f[hv4Reason] = "{" }},
		{"acquisition_scope_of_nothing", func(f []string) { f[1] = strings.Repeat("A", 43) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := newIdentity()
			l := ev5End(t, s, id, true)
			keys := []string{evidenceKey(t, s, l.acq), releaseEvidenceKey(t, s, l.rel)}
			stored := []string{mustGet(t, s, keys[0]), mustGet(t, s, keys[1])}
			editEntry(t, s, id, l.first.Lease.LeaseID, c.edit)
			before := []string{l.acquireOutcome(t, s), l.releaseOutcome(t, s)}
			trimAway(t, s, id, l.first.Lease.LeaseID)
			after := []string{l.acquireOutcome(t, s), l.releaseOutcome(t, s)}
			for i, want := range []string{answerOf(t, l.first), answerOf(t, l.ended)} {
				for _, got := range []string{before[i], after[i]} {
					if got != want && got != "error "+string(lease.CodeCorrupt) {
						t.Fatalf("answered %s, want the first answer %s or corrupt", got, want)
					}
				}
				t.Logf("%d: by reference %.24s…, rewritten %.24s…", i, before[i], after[i])
				// The check of the entry as written fails: left as it is.
				if got := mustGet(t, s, keys[i]); got != stored[i] || after[i] != "error "+string(lease.CodeCorrupt) {
					t.Fatalf("%d: detach rewrote evidence of a damaged entry into %.24q…, which answers %s", i, got, after[i])
				}
			}
		})
	}
}

// Evidence moved: version 5 copied under another request's key (same
// identity, another identity, the other operation's key of the same
// lease) or naming another lease of the identity never answers another
// request's result, before or after the trims.
func TestAttackEV5MovedEvidence(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 2, Options{})
	id, other := newIdentity(), newIdentity()
	l1 := ev5End(t, s, id, true)
	l2 := ev5End(t, s, id, true)
	lo := ev5End(t, s, other, true)
	v1 := mustGet(t, s, evidenceKey(t, s, l1.acq))
	r1 := mustGet(t, s, releaseEvidenceKey(t, s, l1.rel))
	set := func(key, v string) {
		t.Helper()
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Keepttl().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	// l1's acquisition and release evidence under l2's keys, and under
	// the other identity's keys (its own hash tag).
	set(evidenceKey(t, s, l2.acq), v1)
	set(releaseEvidenceKey(t, s, l2.rel), r1)
	set(evidenceKey(t, s, lo.acq), v1)
	set(releaseEvidenceKey(t, s, lo.rel), r1)
	check := func(where string) {
		t.Helper()
		for _, c := range []struct {
			name string
			got  string
		}{
			{"l2 acquisition", l2.acquireOutcome(t, s)},
			{"l2 release", l2.releaseOutcome(t, s)},
			{"other identity's acquisition", lo.acquireOutcome(t, s)},
			{"other identity's release", lo.releaseOutcome(t, s)},
		} {
			if c.got != "error "+string(lease.CodeCorrupt) {
				t.Fatalf("%s: %s with moved evidence answered %s, want corrupt", where, c.name, c.got)
			}
		}
		l1.mustFirst(t, s, where+": l1")
	}
	check("by reference")
	// The release evidence of l1 under its own acquisition key: corrupt.
	k := evidenceKey(t, s, l1.acq)
	set(k, r1)
	if got := l1.acquireOutcome(t, s); got != "error "+string(lease.CodeCorrupt) {
		t.Fatalf("release evidence under the acquisition's key answered %s", got)
	}
	set(k, v1)
	// Every entry trimmed: l1's own evidence is rewritten, the copies are
	// not (they do not name the entries whose keys hold them).
	trimAway(t, s, id, l1.first.Lease.LeaseID)
	trimAway(t, s, id, l2.first.Lease.LeaseID)
	trimAway(t, s, other, lo.first.Lease.LeaseID)
	check("after the trims")
	for _, k := range []string{evidenceKey(t, s, l2.acq), releaseEvidenceKey(t, s, l2.rel)} {
		if v, _ := get(t, s, k); !strings.HasPrefix(v, lease.EvidenceLeanIDPrefix) {
			t.Fatalf("a moved copy was rewritten: %.12q", v)
		}
	}
}

// Evidence naming another lease of the same identity (its lease id and
// token, as damage or a crafted value could) answers corrupt: as damage,
// its check is not of its lines; crafted, its check that of the other
// lease's entry, that entry names another request's scope.
func TestAttackEV5NamingAnotherLease(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 8, Options{})
	id := newIdentity()
	l1 := ev5End(t, s, id, true)
	l2 := ev5End(t, s, id, true)
	entry2 := entryOf(t, s, l2.first.Lease)
	for _, crafted := range []bool{false, true} {
		for _, c := range []struct {
			key string
			out func() string
		}{
			{evidenceKey(t, s, l1.acq), func() string { return l1.acquireOutcome(t, s) }},
			{releaseEvidenceKey(t, s, l1.rel), func() string { return l1.releaseOutcome(t, s) }},
		} {
			v := mustGet(t, s, c.key)
			f := ev5Lines(v)
			f[3], f[4] = l2.first.Lease.LeaseID, strconv.FormatUint(l2.first.Lease.FencingToken, 10)
			named := strings.Join(f, "\n")
			if crafted {
				named = ev5Rechecked(named, entry2)
			}
			if err := s.client.Do(bg, s.client.B().Set().Key(c.key).Value(named).Keepttl().Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if got := c.out(); got != "error "+string(lease.CodeCorrupt) {
				t.Fatalf("evidence naming the next lease (crafted %v) answered %s", crafted, got)
			}
		}
	}
	l2.mustFirst(t, s, "the named lease's own")
}

// The largest tokens (16 digits, up to 2^53 - 1, the library's doubles'
// exact range) and a lease id of the adapter's own spelling survive the
// library's concatenation, Go's strict lines and the rewrite: the last
// token an identity can be given replays exactly, by reference and
// rewritten.
func TestAttackEV5LargestTokens(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 1, Options{})
	for _, counter := range []uint64{999999999999998, 9007199254740989} {
		id := newIdentity()
		if err := (faults{s}).SetCounter(bg, lockKey(t, id), counter); err != nil {
			t.Fatal(err)
		}
		l := ev5End(t, s, id, true)
		if l.first.Lease.FencingToken != counter+1 {
			t.Fatalf("token %d, want %d", l.first.Lease.FencingToken, counter+1)
		}
		l.mustEV5Stored(t, s)
		l.mustFirst(t, s, "by reference")
		next := ev5End(t, s, id, false) // trims l's entry; takes 2^53 - 1 in the second round
		if v, _ := get(t, s, evidenceKey(t, s, l.acq)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("evidence after the trim %.12q", v)
		}
		l.mustFirst(t, s, "detached")
		if counter > 1e15 && next.first.Lease.FencingToken != lease.MaxFencingToken {
			t.Fatalf("the last token is %d", next.first.Lease.FencingToken)
		}
		next.mustFirst(t, s, "the last token")
	}
}

// Lease ids of every spelling a record allows (without the lease_ prefix,
// whose records stay version 3; with '.', ':' and '-'), no trace id and
// empty metadata: the library's version 5 is Go's, and every answer is
// the first one, by reference and rewritten.
func TestAttackEV5OddLeaseIDs(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 1, Options{})
	for _, leaseID := range []string{"L.1:a-b_c" + uid(""), "lease_" + uid("") + ":x", "lease_" + uid("")} {
		s.leaseIDs = func(lease.Timestamp) string { return leaseID }
		id := newIdentity()
		l := ev5Life{acq: acquireReq(id)}
		l.acq.TraceID, l.acq.Metadata = "", nil
		var err error
		if l.first, err = s.Acquire(bg, l.acq); err != nil {
			t.Fatal(err)
		}
		s.leaseIDs = nil
		if l.first.Lease.LeaseID != leaseID {
			t.Fatalf("lease id %q", l.first.Lease.LeaseID)
		}
		l.rel = releaseReq(l.first.Lease)
		if l.ended, err = s.Release(bg, l.rel); err != nil {
			t.Fatal(err)
		}
		l.mustEV5Stored(t, s)
		l.mustFirst(t, s, leaseID+" by reference")
		trimAway(t, s, id, leaseID)
		l.mustFirst(t, s, leaseID+" detached")
	}
}

// An acquisition whose TTL is its whole maximum lifetime (the cap and the
// TTL give the same expiry: Lua's math.min and Go's LeaseExpiry agree at
// the boundary), renewed at once to the cap and released: the first
// answers, by reference and rewritten.
func TestAttackEV5TTLIsTheLifetime(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 1, Options{})
	id := newIdentity()
	l := ev5Life{acq: acquireReq(id)}
	l.acq.TTL, l.acq.MaximumLifetime = 90*time.Second, 90*time.Second
	var err error
	if l.first, err = s.Acquire(bg, l.acq); err != nil {
		t.Fatal(err)
	}
	rn := renewReq(l.first.Lease)
	rn.TTL = 24 * time.Hour
	renewed, err := s.Renew(bg, rn)
	if err != nil || renewed.Lease.ExpiresAt.UnixMilli() != l.first.Lease.ExpiresAt.UnixMilli() || renewed.Lease.TTLMs != 86400000 {
		t.Fatalf("renewal to the cap: %+v %v", renewed.Lease, err)
	}
	l.rel = releaseReq(renewed.Lease)
	if l.ended, err = s.Release(bg, l.rel); err != nil {
		t.Fatal(err)
	}
	l.mustEV5Stored(t, s)
	l.mustFirst(t, s, "by reference")
	trimAway(t, s, id, l.first.Lease.LeaseID)
	l.mustFirst(t, s, "detached")
}

// An instance whose history retention is shorter (below its idempotency
// retention) ends a lease on an identity whose list holds entries that
// version 5 evidence of another instance refers to: it shortens the
// list's expiry only after rewriting that evidence, so the answers
// outlive the list.
func TestAttackEV5ShorterRetentionInstanceRewritesFirst(t *testing.T) {
	r := sharedServer(t)
	prefix := randomPrefix()
	long := ev5Store(t, r, 8, Options{KeyPrefix: prefix})
	short := ev5Store(t, r, 8, Options{KeyPrefix: prefix, StoreOptions: lease.StoreOptions{HistoryRetention: time.Hour}})
	id := newIdentity()
	l := ev5End(t, long, id, true)
	l.mustEV5Stored(t, long)
	ev5End(t, short, id, true)
	for _, k := range []string{evidenceKey(t, long, l.acq), releaseEvidenceKey(t, long, l.rel)} {
		if v, _ := get(t, long, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("evidence %.8q after a shorter list expiry, want version 2", v)
		}
	}
	if ttl := pexpireTime(t, long, long.keys.history(tagOf(lockKey(t, id)))) - time.Now().UnixMilli(); ttl > time.Hour.Milliseconds() {
		t.Fatalf("the list's expiry is %d ms away, want the short retention", ttl)
	}
	l.mustFirst(t, long, "rewritten before the list's expiry was shortened")
	l.mustFirst(t, short, "read by the shorter instance")
}

// Under the documented ACL, format 7's whole path runs: the endings'
// version 5, its replays and lookups (FCALL_RO), and the detach's
// rewrite of keys named from stored scopes.
func TestAttackEV5UnderTheDocumentedACL(t *testing.T) {
	r, pw := aclServer(t)
	s := ev5Store(t, r, 1, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix()})
	id := newIdentity()
	l := ev5End(t, s, id, true)
	l.mustEV5Stored(t, s)
	l.mustFirst(t, s, "by reference")
	trimAway(t, s, id, l.first.Lease.LeaseID)
	if v, _ := get(t, s, releaseEvidenceKey(t, s, l.rel)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
		t.Fatalf("release evidence after the trim %.8q", v)
	}
	l.mustFirst(t, s, "detached")
}
