package valkey

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Review: attack on stored format 8 (Options.CheckedEvidence): evidence
// written whole in version 6 (lease/evidence_v6.go) by the library's
// encode_whole (remember, write_out, detach), read by evidenceBytes with
// lease.ExpandEvidenceFor, and the library's WRITE_LEVEL table. The
// contract: a replay (and LookupRequest) answers exactly the first
// answer, or fails closed as corrupt; never a wrong result.

// ev6aStore opens a store in format 8 on r keeping hist entries per
// identity, detaching eagerly if eager.
func ev6aStore(t *testing.T, r *testenv.Redis, hist int, eager bool, o Options) *Store {
	t.Helper()
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = hist
	so.HistoryRetention = o.StoreOptions.HistoryRetention
	so.IdempotencyRetention = o.StoreOptions.IdempotencyRetention
	o.StoreOptions = so
	o.CheckedEvidence, o.EagerDetach = true, eager
	s := open(t, r, o)
	if !s.writes(checkedEvidence) || !strings.HasPrefix(s.writeFormat(), "checked_evidence") {
		t.Fatalf("the namespace is not in format 8: %q", s.writeFormat())
	}
	return s
}

// ev6aReq is one request of an attack, as first answered: its evidence
// key, digest and first answer, how to retry it and how to look it up.
type ev6aReq struct {
	name   string
	op     lease.Op
	key    string
	digest string
	first  lease.Result
	err    error // the first answer's error, if it was refused
	send   func(s *Store) (lease.Result, error)
	lookup lease.LookupRequest
}

// firstOutcome is the first answer as outcome spells a replay's.
func (q ev6aReq) firstOutcome(t *testing.T) string {
	t.Helper()
	if q.err != nil {
		return "error " + string(lease.CodeOf(q.err))
	}
	return answerOf(t, q.first)
}

func (q ev6aReq) retryOutcome(t *testing.T, s *Store) string {
	t.Helper()
	r, err := q.send(s)
	if q.err != nil && err != nil {
		return "error " + string(lease.CodeOf(err))
	}
	return outcome(t, r, err)
}

func (q ev6aReq) lookupOutcome(t *testing.T, s *Store) string {
	t.Helper()
	l := q.lookup
	l.DeadlineAt = far()
	r, err := s.LookupRequest(bg, l)
	if err != nil {
		return "error " + string(lease.CodeOf(err))
	}
	return answerOf(t, r)
}

// evidence is the evidence the Go side expects of q's first answer.
func (q ev6aReq) evidence() *lease.IdempotencyRecord {
	return &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: q.op, Digest: q.digest, Code: q.first.Code,
		Lease: q.first.Lease, BackendTime: q.first.BackendTime}
}

// mustFirst checks q's retry and lookup answer exactly its first answer
// (a retry of a refused request: refused alike; its lookup: not found).
func (q ev6aReq) mustFirst(t *testing.T, s *Store, where string) {
	t.Helper()
	if got, want := q.retryOutcome(t, s), q.firstOutcome(t); got != want {
		t.Fatalf("%s: %s retry\n got  %s\n want %s", where, q.name, got, want)
	}
	want := q.firstOutcome(t)
	if q.err != nil {
		want = "error " + string(lease.CodeNotFound)
	}
	if got := q.lookupOutcome(t, s); got != want {
		t.Fatalf("%s: %s lookup\n got  %s\n want %s", where, q.name, got, want)
	}
}

// mustV6 checks q's evidence is stored exactly as Go's WholeEvidence
// writes its first answer under q's key.
func (q ev6aReq) mustV6(t *testing.T, s *Store, where string) {
	t.Helper()
	mustStored(t, s, q.key, v6Of(t, q.evidence(), q.key), where+": "+q.name+" evidence")
}

func ev6aAcquire(t *testing.T, s *Store, req lease.AcquireRequest) ev6aReq {
	t.Helper()
	_, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	q := ev6aReq{name: "acquire", op: lease.OpAcquire, key: s.keys.idem(tagOf(p.LockKey), p.Scope), digest: p.Digest,
		send: func(s *Store) (lease.Result, error) { r := req; r.DeadlineAt = far(); return s.Acquire(bg, r) },
		lookup: lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
			RequestID: req.RequestID}}
	if q.first, err = s.Acquire(bg, req); err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return q
}

func ev6aRenew(t *testing.T, s *Store, rec *lease.Record, caller lease.Caller, requestID string, ttl time.Duration) ev6aReq {
	t.Helper()
	req := lease.RenewRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: rec.ServiceInstanceID, TTL: ttl, Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: far(), Caller: caller}}
	_, p, err := lease.PrepareRenew(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	q := ev6aReq{name: "renew", op: lease.OpRenew, key: s.keys.idem(tagOf(p.LockKey), p.Scope), digest: p.Digest,
		send:   func(s *Store) (lease.Result, error) { r := req; r.DeadlineAt = far(); return s.Renew(bg, r) },
		lookup: lease.LookupRequest{Op: lease.OpRenew, Identity: req.Identity, PrincipalID: caller.PrincipalID, RequestID: requestID}}
	q.first, q.err = s.Renew(bg, req)
	return q
}

func ev6aRelease(t *testing.T, s *Store, rec *lease.Record, caller lease.Caller, requestID string) ev6aReq {
	t.Helper()
	req := lease.ReleaseRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: rec.ServiceInstanceID, Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: far(), Caller: caller}}
	_, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	q := ev6aReq{name: "release", op: lease.OpRelease, key: s.keys.idem(tagOf(p.LockKey), p.Scope), digest: p.Digest,
		send:   func(s *Store) (lease.Result, error) { r := req; r.DeadlineAt = far(); return s.Release(bg, r) },
		lookup: lease.LookupRequest{Op: lease.OpRelease, Identity: req.Identity, PrincipalID: caller.PrincipalID, RequestID: requestID}}
	q.first, q.err = s.Release(bg, req)
	return q
}

func ev6aAdmin(t *testing.T, s *Store, op lease.Op, rec *lease.Record) ev6aReq {
	t.Helper()
	req := adminReq(rec)
	req.Reason = "incident: \"ev6\\n\" ünïcödé " + strings.Repeat("r", 300)
	_, p, err := lease.PrepareAdmin(op, req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	do := func(s *Store, r lease.AdminRequest) (lease.Result, error) {
		if op == lease.OpForceRelease {
			return s.ForceRelease(bg, r)
		}
		return s.Revoke(bg, r)
	}
	q := ev6aReq{name: string(op), op: op, key: s.keys.idem(tagOf(p.LockKey), p.Scope), digest: p.Digest,
		send:   func(s *Store) (lease.Result, error) { r := req; r.DeadlineAt = far(); return do(s, r) },
		lookup: lease.LookupRequest{Op: op, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID, RequestID: req.RequestID}}
	if q.first, err = do(s, req); err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return q
}

// ev6aLife is one lease: its acquisition, renewals and ending.
type ev6aLife struct {
	acq    ev6aReq
	renews []ev6aReq
	end    ev6aReq
}

func (l ev6aLife) all() []ev6aReq { return append(append([]ev6aReq{l.acq}, l.renews...), l.end) }

// ev6aLive acquires req and renews it to 45s, then to a TTL the maximum
// lifetime caps.
func ev6aLive(t *testing.T, s *Store, req lease.AcquireRequest, long string) ev6aLife {
	t.Helper()
	l := ev6aLife{acq: ev6aAcquire(t, s, req)}
	cur := l.acq.first.Lease
	for _, ttl := range []time.Duration{45 * time.Second, 24 * time.Hour} {
		time.Sleep(2 * time.Millisecond)
		q := ev6aRenew(t, s, cur, req.Caller, uid("req_")+long, ttl)
		if q.err != nil {
			t.Fatalf("renew: %v", q.err)
		}
		l.renews = append(l.renews, q)
		cur = q.first.Lease
	}
	if cur.ExpiresAt != cur.AcquiredAt.Add(time.Duration(cur.MaximumLifetimeMs)*time.Millisecond) {
		t.Fatalf("the last renewal is not capped by the maximum lifetime: %+v", cur)
	}
	return l
}

// ev6aEnd ends l's lease: 0 released, 1 revoked, 2 force-released.
func ev6aEnd(t *testing.T, s *Store, l *ev6aLife, how int, caller lease.Caller, long string) {
	t.Helper()
	cur := l.acq.first.Lease
	if n := len(l.renews); n > 0 {
		cur = l.renews[n-1].first.Lease
	}
	switch how {
	case 0:
		l.end = ev6aRelease(t, s, cur, caller, uid("req_")+long)
		if l.end.err != nil {
			t.Fatalf("release: %v", l.end.err)
		}
	case 1:
		l.end = ev6aAdmin(t, s, lease.OpRevoke, cur)
	default:
		l.end = ev6aAdmin(t, s, lease.OpForceRelease, cur)
	}
}

// ev6aShape is an acquisition request of one shape of lease.
type ev6aShape struct {
	name string
	long string // appended to each later request id
	req  func() lease.AcquireRequest
}

func ev6aShapes(t *testing.T) []ev6aShape {
	t.Helper()
	max := func(p string) string { return p + strings.Repeat("Z", lease.MaxIdentifierBytes-len(p)) }
	big := lease.Metadata{}
	for i := 0; i < 16; i++ {
		big["key_"+strconv.Itoa(i)] = strings.Repeat("é漢", 38)
	}
	longID := func() lease.Identity {
		id := newIdentity()
		id.TenantID, id.ProgramID, id.TargetID = max(id.TenantID), max(id.ProgramID), max(id.TargetID)
		id.ActorName, id.WorkflowName = max("actor"), max("workflow")
		return id
	}
	return []ev6aShape{
		{name: "plain", req: func() lease.AcquireRequest { return acquireReq(newIdentity()) }},
		{name: "ids at 256 bytes", long: strings.Repeat("L", 256-len("req_")-16), req: func() lease.AcquireRequest {
			r := acquireReq(newIdentity())
			r.Caller = lease.Caller{PrincipalID: max("prn_"), ClientID: max("client_"), CredentialID: max("key_")}
			r.ServiceInstanceID, r.ExecutionID, r.JobID, r.TraceID = max("instance_"), max("execution_"), max("job_"), max("trace_")
			r.RequestID = max(uid("req_"))
			return r
		}},
		{name: "identity at 256 bytes", req: func() lease.AcquireRequest { return acquireReq(longID()) }},
		{name: "no metadata, no trace", req: func() lease.AcquireRequest {
			r := acquireReq(newIdentity())
			r.Metadata, r.TraceID = nil, ""
			return r
		}},
		{name: "line-like metadata", req: func() lease.AcquireRequest {
			r := acquireReq(newIdentity())
			r.Metadata = lease.Metadata{"a": "x\nev6\n0123456789abcdef\nacquire\n", "b": "\r\t\u2028\u2029 \\n", "c": `"}` + "\n{\"",
				"d": "ünïcödé 漢字 🙂", "e": -1.5e-7, "f": nil, "g": true, "h": 9007199254740993.0}
			return r
		}},
		{name: "metadata near its limit", req: func() lease.AcquireRequest {
			r := acquireReq(newIdentity())
			r.Metadata = big
			return r
		}},
	}
}

// Held: for every shape of lease (every id at 256 bytes, identity
// components at 256 bytes, no metadata and no trace id, metadata that
// spells lines, newlines and "ev6" once escaped, non-ASCII metadata near
// its byte limit) and every way it ends (release, revoke, force-release,
// after renewals to another TTL and to one the maximum lifetime caps),
// the library writes version 6 byte for byte as Go's WholeEvidence
// writes the first answers: the renewals' and the administrative
// endings' at once, the acquisition's and the release's at once when
// the ending trims live evidence (eager) or when detach rewrites them;
// and every retry and lookup answers exactly the first answer, the
// acquisition's with its state now found through the entry the
// library's evidence_lease_id names in version 6.
func TestAttackEV6LibraryAgreesWithGo(t *testing.T) {
	for _, eager := range []bool{false, true} {
		t.Run(map[bool]string{false: "detach", true: "eager"}[eager], func(t *testing.T) {
			s := ev6aStore(t, sharedServer(t), 1, eager, Options{})
			for i, sh := range ev6aShapes(t) {
				base := sh.req()
				var lives []ev6aLife
				for j := 0; j < 3; j++ {
					req := base
					req.RequestID = uid("req_") + sh.long
					l := ev6aLive(t, s, req, sh.long)
					ev6aEnd(t, s, &l, (i+j)%3, req.Caller, sh.long)
					lives = append(lives, l)
				}
				// Lives 0 and 1 were trimmed (cap 1) and their evidence
				// rewritten; life 2's entry is the list's.
				for j, l := range lives {
					where := sh.name + " life " + strconv.Itoa(j)
					for _, q := range l.all() {
						// Everything is whole but life 2's acquisition and
						// release without eager detach (by reference until
						// trimmed).
						if !(j == 2 && !eager && (q.op == lease.OpAcquire || q.op == lease.OpRelease)) {
							q.mustV6(t, s, where)
						}
						q.mustFirst(t, s, where)
					}
				}
				// Life 2's acquisition replays with its state now, which
				// the library finds through the lease id version 6 (or 5)
				// names: its history entry is still the list's.
				r, err := lives[2].acq.send(s)
				if err != nil || r.Current == nil || r.Current.State != lives[2].end.first.Lease.State {
					t.Fatalf("%s: the last life's acquisition replay: %+v %v, want its state now %s", sh.name, r.Current, err,
						lives[2].end.first.Lease.State)
				}
			}
		})
	}
}

// ev6aCopy sets key to v, keeping its TTL (or an hour for a new key).
func ev6aCopy(t *testing.T, s *Store, key, v string) {
	t.Helper()
	if _, ok := get(t, s, key); !ok {
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Px(time.Hour).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// ev6aHotLives gives id two lives on s (cap 1, eager): the second's
// acquisition, renewal and ending evidence is version 6 at once.
func ev6aHotLives(t *testing.T, s *Store, id lease.Identity, how int) ev6aLife {
	t.Helper()
	for i := 0; i < 2; i++ {
		req := acquireReq(id)
		l := ev6aLive(t, s, req, "")
		ev6aEnd(t, s, &l, how, req.Caller, "")
		if i == 1 {
			for _, q := range l.all() {
				q.mustV6(t, s, "hot life")
			}
			return l
		}
	}
	return ev6aLife{}
}

// Held: version 6 values of one identity copied under the matching keys
// of another identity (acquisition, renewal, release, revocation, with
// their TTL) answer corrupt on retry and lookup: the check binds the
// scope, and so the lock key, of the request that reads them. The first
// identity's own still answer first.
func TestAttackEV6MovedAcrossIdentities(t *testing.T) {
	s := ev6aStore(t, sharedServer(t), 1, true, Options{})
	for _, how := range []int{0, 1} {
		a := ev6aHotLives(t, s, newIdentity(), how)
		b := ev6aHotLives(t, s, newIdentity(), how)
		qa, qb := a.all(), b.all()
		for i := range qa {
			ev6aCopy(t, s, qb[i].key, mustGet(t, s, qa[i].key))
			if got := qb[i].retryOutcome(t, s); got != "error "+string(lease.CodeCorrupt) {
				t.Fatalf("%s evidence of another identity answered the retry: %s", qb[i].name, got)
			}
			if got := qb[i].lookupOutcome(t, s); got != "error "+string(lease.CodeCorrupt) {
				t.Fatalf("%s evidence of another identity answered the lookup: %s", qb[i].name, got)
			}
			qa[i].mustFirst(t, s, "the original")
		}
	}
}

// ev6aBrief is an answer in a line: the code and backend time, and the
// lease's id, token, request id, renewal, expiry and state; or the error.
func ev6aBrief(r lease.Result, err error) string {
	if err != nil {
		return "error " + string(lease.CodeOf(err))
	}
	if r.Lease == nil {
		return string(r.Code) + " (no lease)"
	}
	return string(r.Code) + "@" + strconv.FormatInt(r.BackendTime.UnixMilli(), 10) + " " + r.Lease.LeaseID + " token " +
		strconv.FormatUint(r.Lease.FencingToken, 10) + " request " + r.Lease.RequestID + " renewed " + r.Lease.RenewedAt.String() +
		" expires " + r.Lease.ExpiresAt.String() + " " + string(r.Lease.State)
}

// Held (a finding on c5c1ede, where version 6's check bound only the
// identity, the lock key's tag; fixed by checking the scope of the key
// it is stored under: operation, lock key, principal, request id):
// the digest does not cover the request id, so a genuine value copied
// (damage, a misplaced restore or migration, an operator's mistake)
// under the key of another request of the same identity, with the same
// body, would answer that request with a result it never had, as version
// 2 does; the contract wants its first answer or corrupt, and since the
// value is not that request's, corrupt is the only answer. Format 5's
// own test (TestReferringEvidenceCorrupt, "release evidence under another
// request's key") and format 7's (TestAttackEV5MovedEvidence) hold
// evidence by reference to that bar; version 6 is what format 8 writes
// for every renewal, every administrative ending, and every acquisition
// and release once detached or written eagerly. Each copy below answers
// corrupt, retry and lookup:
//
//   - renew: two renewals of one lease with the same body (the same TTL:
//     what a renewal loop sends) and their own request ids: the first's
//     value under the second's key (on c5c1ede it answered the second
//     with the first's renewed_at, expires_at and backend time).
//   - acquire: two acquisitions of one identity with the same body and
//     their own request ids (the first released before the second): the
//     first's value under the second's key (on c5c1ede: the first lease,
//     another lease id, fencing token and request id).
//   - release: a second release of a lease with the same body and its own
//     request id, refused lease_lost (no evidence kept): the first
//     release's value under its key (on c5c1ede: released).
//   - acquire lookup, another body: LookupRequest compares no digest, so
//     for lookups the body does not matter: an ended lease's acquisition
//     value under the key of the identity's live lease's acquisition
//     (same principal) (on c5c1ede: the ended lease).
//   - revoke lookup: an administrator's revocation under the key of
//     another administrator's revocation request id (never sent) (on
//     c5c1ede: that the second administrator revoked the lease; Lookup
//     checks no principal for administrative operations, and version 6
//     records none, but the key's scope names one).
func TestAttackEV6CopyUnderAnotherRequestOfTheSameBody(t *testing.T) {
	s := ev6aStore(t, sharedServer(t), 1, true, Options{})
	mustNotAnswer := func(t *testing.T, victim ev6aReq, donor ev6aReq, lookupOnly bool) {
		t.Helper()
		ev6aCopy(t, s, victim.key, mustGet(t, s, donor.key))
		first := ev6aBrief(victim.first, victim.err)
		if !lookupOnly {
			r, err := victim.send(s)
			if lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("the retry of %s %s with the copied %s's value answered:\n  got   %s\n  first %s\n  want corrupt",
					victim.name, victim.lookup.RequestID, donor.name, ev6aBrief(r, err), first)
			}
		}
		l := victim.lookup
		l.DeadlineAt = far()
		r, err := s.LookupRequest(bg, l)
		if lease.CodeOf(err) != lease.CodeCorrupt {
			t.Errorf("the lookup of %s %s (principal %s) with the copied %s's value answered:\n  got   %s\n  first %s\n  want corrupt",
				victim.name, l.RequestID, l.PrincipalID, donor.name, ev6aBrief(r, err), first)
		}
	}
	t.Run("renew", func(t *testing.T) {
		id := newIdentity()
		ev6aHotLives(t, s, id, 0)
		req := acquireReq(id)
		a := ev6aAcquire(t, s, req)
		r1 := ev6aRenew(t, s, a.first.Lease, req.Caller, uid("req_"), 45*time.Second)
		time.Sleep(5 * time.Millisecond)
		r2 := ev6aRenew(t, s, r1.first.Lease, req.Caller, uid("req_"), 45*time.Second)
		if r1.err != nil || r2.err != nil || r1.digest != r2.digest {
			t.Fatalf("setup: %v %v, digests %s %s", r1.err, r2.err, r1.digest, r2.digest)
		}
		r1.mustV6(t, s, "renewal 1")
		r2.mustV6(t, s, "renewal 2")
		mustNotAnswer(t, r2, r1, false)
	})
	t.Run("acquire", func(t *testing.T) {
		id := newIdentity()
		ev6aHotLives(t, s, id, 0)
		req := acquireReq(id)
		a1 := ev6aAcquire(t, s, req)
		rel := ev6aRelease(t, s, a1.first.Lease, req.Caller, uid("req_"))
		again := req
		again.RequestID = uid("req_")
		a2 := ev6aAcquire(t, s, again)
		ev6aRelease(t, s, a2.first.Lease, req.Caller, uid("req_"))
		if rel.err != nil || a1.digest != a2.digest || a1.first.Lease.LeaseID == a2.first.Lease.LeaseID {
			t.Fatalf("setup: %v", rel.err)
		}
		a1.mustV6(t, s, "acquisition 1")
		a2.mustV6(t, s, "acquisition 2")
		mustNotAnswer(t, a2, a1, false)
	})
	t.Run("release", func(t *testing.T) {
		id := newIdentity()
		ev6aHotLives(t, s, id, 0)
		req := acquireReq(id)
		a := ev6aAcquire(t, s, req)
		rel := ev6aRelease(t, s, a.first.Lease, req.Caller, uid("req_"))
		late := ev6aRelease(t, s, a.first.Lease, req.Caller, uid("req_"))
		if rel.err != nil || lease.CodeOf(late.err) != lease.CodeLost || rel.digest != late.digest {
			t.Fatalf("setup: %v %v", rel.err, late.err)
		}
		rel.mustV6(t, s, "release")
		mustNotAnswer(t, late, rel, false)
	})
	t.Run("acquire lookup, another body", func(t *testing.T) {
		id := newIdentity()
		l := ev6aHotLives(t, s, id, 0)
		a := ev6aAcquire(t, s, acquireReq(id))
		if a.digest == l.acq.digest {
			t.Fatal("setup: the same body")
		}
		mustNotAnswer(t, a, l.acq, true)
	})
	t.Run("revoke lookup by another administrator", func(t *testing.T) {
		l := ev6aHotLives(t, s, newIdentity(), 1)
		rec := l.end.first.Lease
		other := l.end
		other.lookup.PrincipalID = "prn_admin_2"
		other.key = s.keys.idem(tagOf(rec.LockKey), lease.IdempotencyScope(lease.OpRevoke, rec.LockKey, "prn_admin_2", l.end.lookup.RequestID))
		other.err = lease.Errorf(lease.CodeNotFound, "never sent")
		other.first = lease.Result{}
		mustNotAnswer(t, other, l.end, true)
	})
}

// Held (a finding on c5c1ede, where the check bound the identity only:
// the same in version 2, while format 7's evidence by reference answers
// these corrupt): a genuine version 6 value copied under the key of
// another operation of the same identity (an acquisition's under a
// renewal's key, a release's under the acquisition's, a renewal's under
// the release's), or under another principal's key of the same request
// id, fails the check of that key's scope and answers corrupt, retry and
// lookup; on c5c1ede the retry reached Prepared.Replay, which answered
// idempotency_conflict: a definite answer ("this request id was used with
// another body") that is neither the first answer nor corrupt.
func TestAttackEV6CopyUnderAnotherKeyIsCorrupt(t *testing.T) {
	s := ev6aStore(t, sharedServer(t), 1, true, Options{})
	id := newIdentity()
	l := ev6aHotLives(t, s, id, 0)
	req := acquireReq(id)
	a := ev6aAcquire(t, s, req)
	rn := ev6aRenew(t, s, a.first.Lease, req.Caller, uid("req_"), 45*time.Second)
	corrupt := "error " + string(lease.CodeCorrupt)
	// Another principal's acquisition key for l's acquisition request id.
	foreign := l.acq
	foreign.name = "acquire by another principal"
	foreign.send = func(s *Store) (lease.Result, error) {
		r := acquireReq(id)
		r.RequestID = l.acq.lookup.RequestID
		r.Caller = lease.Caller{PrincipalID: "prn_second_1", ClientID: "client_9", CredentialID: "key_9"}
		return s.Acquire(bg, r)
	}
	foreign.lookup.PrincipalID = "prn_second_1"
	foreign.key = s.keys.idem(tagOf(l.acq.first.Lease.LockKey), lease.IdempotencyScope(lease.OpAcquire, l.acq.first.Lease.LockKey,
		"prn_second_1", l.acq.lookup.RequestID))
	foreign.err = lease.Errorf(lease.CodeNotFound, "never sent")
	for _, m := range []struct {
		what          string
		donor, victim ev6aReq
	}{
		{"an acquisition's evidence under a renewal's key", l.acq, rn},
		{"a release's evidence under its acquisition's key", l.end, l.acq},
		{"a renewal's evidence under the release's key", l.renews[0], l.end},
		{"an acquisition's evidence under another principal's key of its request id", l.acq, foreign},
	} {
		saved, had := get(t, s, m.victim.key)
		ev6aCopy(t, s, m.victim.key, mustGet(t, s, m.donor.key))
		if got := m.victim.lookupOutcome(t, s); got != corrupt {
			t.Fatalf("%s: lookup answered %s, want corrupt", m.what, got)
		}
		if got := m.victim.retryOutcome(t, s); got != corrupt {
			t.Errorf("%s: the retry answered %s, want corrupt", m.what, got)
		}
		if had {
			ev6aCopy(t, s, m.victim.key, saved)
		}
	}
}

// Held: every single-byte change of stored version 6 evidence (a
// renewal's, and an ended lease's acquisition's whose state now comes
// from its history entry), each byte's low bit flipped or replaced by a
// newline, answers corrupt or exactly the first answer on retry and
// lookup, never another result.
func TestAttackEV6DamageEveryByteInTheStore(t *testing.T) {
	s := ev6aStore(t, sharedServer(t), 1, true, Options{})
	l := ev6aHotLives(t, s, newIdentity(), 1)
	corrupt := "error " + string(lease.CodeCorrupt)
	for _, q := range []ev6aReq{l.renews[0], l.acq, l.end} {
		good := mustGet(t, s, q.key)
		for p := 0; p < len(good); p++ {
			for _, b := range []byte{good[p] ^ 1, '\n'} {
				if b == good[p] {
					continue
				}
				ev6aCopy(t, s, q.key, good[:p]+string(b)+good[p+1:])
				for what, got := range map[string]string{"retry": q.retryOutcome(t, s), "lookup": q.lookupOutcome(t, s)} {
					if got != corrupt && got != q.firstOutcome(t) {
						t.Fatalf("%s evidence damaged at byte %d (%q): the %s answered %s", q.name, p, b, what, got)
					}
				}
			}
		}
		ev6aCopy(t, s, q.key, good)
		q.mustFirst(t, s, "restored")
	}
}

// Held: with a history retention shorter than the idempotency retention
// (so that nothing is written by reference), the reaper's expiry writes
// the expired lease's acquisition evidence out of its record in version
// 6, byte for byte Go's, with the record's expiry (acquired_at + the
// retention); a release writes its own at once in version 6; each
// replays exactly the first answer, the acquisition's with its state now.
func TestAttackEV6ReaperAndShortHistoryWriteV6(t *testing.T) {
	s := ev6aStore(t, sharedServer(t), 8, false, Options{StoreOptions: lease.StoreOptions{HistoryRetention: time.Hour}})
	id := newIdentity()
	req := acquireReq(id)
	req.TTL = 300 * time.Millisecond
	a := ev6aAcquire(t, s, req)
	rn := ev6aRenew(t, s, a.first.Lease, req.Caller, uid("req_"), 200*time.Millisecond)
	if rn.err != nil {
		t.Fatal(rn.err)
	}
	time.Sleep(time.Until(rn.first.Lease.ExpiresAt.Time()) + 100*time.Millisecond)
	if err := s.reap(bg); err != nil {
		t.Fatal(err)
	}
	a.mustV6(t, s, "after the reaper's expiry")
	if at, want := pexpireTime(t, s, a.key), a.first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
		t.Fatalf("acquisition evidence PXAT %d, want %d", at, want)
	}
	rn.mustV6(t, s, "renewal")
	a.mustFirst(t, s, "expired")
	rn.mustFirst(t, s, "expired")
	r, err := a.send(s)
	if err != nil || r.Current == nil || r.Current.State != lease.StateExpired {
		t.Fatalf("acquisition replay after expiry: %+v %v", r.Current, err)
	}
	b := ev6aAcquire(t, s, acquireReq(id))
	rel := ev6aRelease(t, s, b.first.Lease, owner, uid("req_"))
	b.mustV6(t, s, "released, short history")
	rel.mustV6(t, s, "release, short history")
	b.mustFirst(t, s, "released")
	rel.mustFirst(t, s, "released")
	if r, err := b.send(s); err != nil || r.Current == nil || r.Current.State != lease.StateReleased {
		t.Fatalf("acquisition replay after release: %+v %v", r.Current, err)
	}
}

// Held: a backup of a format 8 namespace holding version 6 evidence
// (renewals, an eager ending's, a detached one's, a revocation's)
// restored under another key prefix and recovered answers every retry
// and lookup exactly as first answered (the check binds the scope, of
// which the key prefix is no part); the recovery's own revocation of a restored live
// lease then leaves the live lease's acquisition and renewal answering
// first too.
func TestAttackEV6BackupRestoredUnderAnotherPrefix(t *testing.T) {
	r := sharedServer(t)
	src := ev6aStore(t, r, 1, true, Options{})
	var reqs []ev6aReq
	for _, how := range []int{0, 1, 2} {
		reqs = append(reqs, ev6aHotLives(t, src, newIdentity(), how).all()...)
	}
	live := ev6aLive(t, src, acquireReq(newIdentity()), "")
	reqs = append(reqs, live.acq, live.renews[0], live.renews[1])
	var backup bytes.Buffer
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: src.opts}
	dst := open(t, r, o)
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	c, _ := closedState(t, o)
	if res, err := c.Finish(bg, lease.RecoveryPlan{Reason: "restored"}); err != nil || len(res.Revoked) != 1 {
		t.Fatalf("finish: %+v %v", res, err)
	}
	for _, q := range reqs {
		q.key = strings.Replace(q.key, src.keys.ns+":", dst.keys.ns+":", 1)
		if v, ok := get(t, dst, q.key); q.op != lease.OpAcquire && (!ok || !strings.HasPrefix(v, lease.EvidenceWholePrefix)) {
			t.Fatalf("restored %s evidence %.8q", q.name, v)
		}
		q.mustFirst(t, dst, "restored under another prefix")
	}
}

// wlSource is the library's WRITE_LEVEL table and context function, as
// loaded.
func wlSource(t *testing.T, src string) string {
	t.Helper()
	start := strings.Index(src, "local WRITE_LEVEL")
	fn := strings.Index(src, "local function context(keys, args)")
	if start < 0 || fn < start {
		t.Fatal("the library has no WRITE_LEVEL before context")
	}
	end := strings.Index(src[fn:], "\nend\n")
	if end < 0 {
		t.Fatal("no end of context")
	}
	return src[start : fn+end+len("\nend\n")]
}

// Held: the library's context (its WRITE_LEVEL table, run as loaded)
// gives every format name exactly the flags the or-chains it replaced
// gave (copied here from the library before the change): the six names
// of formats 2 to 7 with and without "+eager", and every other string
// (”, 'v1', a later build's name, case and space variants, '+eager'
// alone, a doubled '+eager', names of Lua's metatable keys, digits) the
// flags of version 1. 'checked_evidence' sets them all, ev6 included,
// and no other name sets ev6.
func TestAttackEV6WriteLevelMatchesOrChains(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	for _, d := range writeLevelDiffs(t, s, librarySource) {
		t.Errorf("WRITE_LEVEL changed a flag: %s", d)
	}
}

// writeLevelDiffs runs src's WRITE_LEVEL and context on s's server for
// every name, and lists where their flags differ from the or-chains'.
func writeLevelDiffs(t *testing.T, s *Store, src string) []string {
	t.Helper()
	script := wlSource(t, src) + `
local function old(format)
  local eager = false
  if string.find(format, '+eager', 1, true) then format, eager = string.sub(format, 1, -7), true end
  return {
    compact = format == 'compact' or format == 'compact_records' or format == 'embedded_evidence'
      or format == 'referring_evidence' or format == 'lean_records' or format == 'lean_evidence',
    rv2 = format == 'compact_records' or format == 'embedded_evidence' or format == 'referring_evidence'
      or format == 'lean_records' or format == 'lean_evidence',
    rv3 = format == 'embedded_evidence' or format == 'referring_evidence' or format == 'lean_records'
      or format == 'lean_evidence',
    refs = format == 'referring_evidence' or format == 'lean_records' or format == 'lean_evidence',
    rv4 = format == 'lean_records' or format == 'lean_evidence',
    ev5 = format == 'lean_evidence',
    ev6 = false,
    eager = eager,
  }
end
local out = {}
for _, f in ipairs(ARGV) do
  local c, o = context({}, {f}), old(f)
  if f == 'checked_evidence' or f == 'checked_evidence+eager' then
    o = { compact = true, rv2 = true, rv3 = true, refs = true, rv4 = true, ev5 = true, ev6 = true, eager = o.eager }
  end
  for _, k in ipairs({'compact', 'rv2', 'rv3', 'refs', 'rv4', 'ev5', 'ev6', 'eager'}) do
    if c[k] ~= o[k] then out[#out + 1] = string.format('%q %s: %s, was %s', f, k, tostring(c[k]), tostring(o[k])) end
  end
end
return out
`
	names := []string{"", "v1", "compact", "compact_records", "embedded_evidence", "referring_evidence", "lean_records",
		"lean_evidence", "checked_evidence", "compact+eager", "compact_records+eager", "embedded_evidence+eager",
		"referring_evidence+eager", "lean_records+eager", "lean_evidence+eager", "checked_evidence+eager", "v1+eager",
		"lean_evidence+eager+eager", "+eager", "eager", "LEAN_EVIDENCE", " compact", "compact ", "lean_evidence\x00",
		"__index", "__newindex", "__eq", "2", "7", "8", "9", "checked_evidence2", "verified_evidence", "checked-evidence",
		"lean_evidence+eagerx", "x+eager", "compact+EAGER"}
	got, err := s.client.Do(bg, s.client.B().Eval().Script(script).Numkeys(0).Arg(names...).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Held: a format 7 instance of this build (opened before the switch, so
// still writing version 2 whole, 5 by reference) and a format 8 one share
// a namespace (cap 1, both eager), taking turns at each step of each
// lease: each answers every request of either exactly as first
// answered, each request's evidence is what its writer's format writes
// (version 2 from the format 7 instance, 6 from the format 8 one), and
// the detach of either rewrites whole the other's evidence by reference.
func TestAttackEV6SharedWithAFormat7Instance(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	prefix := randomPrefix()
	s7 := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, LeanEvidence: true, EagerDetach: true})
	s8 := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, CheckedEvidence: true, EagerDetach: true})
	if s7.writeFormat() != "lean_evidence+eager" || s8.writeFormat() != "checked_evidence+eager" {
		t.Fatalf("formats %q %q", s7.writeFormat(), s8.writeFormat())
	}
	stores := []*Store{s7, s8}
	var all []ev6aReq
	id := newIdentity()
	for i := 0; i < 6; i++ {
		a, b := stores[i%2], stores[(i+1)%2]
		req := acquireReq(id)
		acq := ev6aAcquire(t, a, req)
		rn := ev6aRenew(t, b, acq.first.Lease, req.Caller, uid("req_"), 40*time.Second)
		if rn.err != nil {
			t.Fatal(rn.err)
		}
		want := map[*Store]string{s7: lease.EvidenceV2Prefix, s8: lease.EvidenceWholePrefix}[b]
		if v := mustGet(t, b, rn.key); !strings.HasPrefix(v, want) {
			t.Fatalf("renewal by %q stored %.4q", b.writeFormat(), v)
		}
		var end ev6aReq
		if i%3 == 2 {
			end = ev6aAdmin(t, a, lease.OpRevoke, rn.first.Lease)
		} else {
			end = ev6aRelease(t, a, rn.first.Lease, req.Caller, uid("req_"))
		}
		all = append(all, acq, rn, end)
	}
	for _, s := range stores {
		for _, q := range all {
			v := mustGet(t, s, q.key)
			if !strings.HasPrefix(v, lease.EvidenceV2Prefix) && !strings.HasPrefix(v, lease.EvidenceWholePrefix) &&
				!strings.HasPrefix(v, lease.EvidenceLeanIDPrefix) {
				t.Fatalf("%s evidence %.4q", q.name, v)
			}
			q.mustFirst(t, s, "shared, on "+s.writeFormat())
		}
	}
}

// fcallStats is the server's FCALL count and total microseconds.
func fcallStats(t *testing.T, s *Store) (calls, usec int64) {
	t.Helper()
	info, err := s.client.Do(bg, s.client.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_fcall:") {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_fcall:")), ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls = n
			case "usec":
				usec = n
			}
		}
	}
	return calls, usec
}

// Held (a measurement): the server time of a renewal (FCALL, INFO
// commandstats) in format 8, which hashes its whole evidence with
// redis.sha1hex, against format 7's version 2: each format on its own
// server, renewals interleaved one by one so that both see the same load,
// with metadata of 200 and 3,900 bytes; the bytes of each renewal's
// evidence; and redis.sha1hex alone on values of those sizes (EVAL,
// TIME around 20,000 calls). Logged; bounded only against a gross cost
// (format 8 within three times format 7's time, sha1hex under 50 µs),
// since the machine's load makes the totals noisy.
func TestAttackEV6RenewCost(t *testing.T) {
	s7 := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), LeanEvidence: true})
	s8 := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CheckedEvidence: true})
	for _, meta := range []int{200, 3900} {
		ev6aRenewCost(t, s7, s8, meta)
	}
	for _, n := range []int{540, 4240} {
		script := `local v = string.rep('x', tonumber(ARGV[1]))
local t0 = redis.call('TIME')
local h
for i = 1, 20000 do h = redis.sha1hex(v) end
local t1 = redis.call('TIME')
return (tonumber(t1[1]) - tonumber(t0[1])) * 1000000 + tonumber(t1[2]) - tonumber(t0[2])`
		us, err := s8.client.Do(bg, s8.client.B().Eval().Script(script).Numkeys(0).Arg(strconv.Itoa(n)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		per := float64(us) / 20000
		t.Logf("redis.sha1hex of %d bytes: %.2f µs", n, per)
		if per > 50 {
			t.Fatalf("redis.sha1hex of %d bytes takes %.2f µs", n, per)
		}
	}
}

func ev6aRenewCost(t *testing.T, s7, s8 *Store, meta int) {
	t.Helper()
	const per = 1500
	stores := []*Store{s7, s8}
	var held [2]*lease.Record
	var caller lease.Caller
	for i, s := range stores {
		req := acquireReq(newIdentity())
		req.Metadata = lease.Metadata{"purpose": strings.Repeat("m", meta)}
		caller = req.Caller
		a, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		held[i] = a.Lease
		if err := s.client.Do(bg, s.client.B().ConfigResetstat().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	var last [2]ev6aReq
	for j := 0; j < per; j++ {
		for i, s := range stores {
			if last[i] = ev6aRenew(t, s, held[i], caller, uid("req_"), 30*time.Second); last[i].err != nil {
				t.Fatal(last[i].err)
			}
		}
	}
	var perCall [2]float64
	var size [2]int
	for i, s := range stores {
		c, u := fcallStats(t, s)
		perCall[i] = float64(u) / float64(c)
		size[i] = len(mustGet(t, s, last[i].key))
	}
	t.Logf("metadata %d bytes: renew FCALL format 7 %.2f µs, format 8 %.2f µs (%+.1f%%); evidence %d bytes, %d",
		meta, perCall[0], perCall[1], 100*(perCall[1]-perCall[0])/perCall[0], size[0], size[1])
	if perCall[1] > 3*perCall[0] {
		t.Fatalf("a format 8 renewal costs %.2f µs, format 7's %.2f", perCall[1], perCall[0])
	}
}

// Held (a finding on c5c1ede, documentation): format 8 is documented
// where the code sends operators. EnableCheckedEvidence's comment says
// "Rolling back: README, \"--valkey-checked-evidence\"", and format 8's
// switch is one way for older builds (they answer a replay of version 6
// evidence, and a version 5 history entry, as corrupt until it expires:
// 8 days by default for evidence, 30 for history). The README names the
// flag, and how to roll back past format 8 (as for every format up to 7),
// waiting for both; the package's key layout (doc.go,
// ns:{tag}:idem:<scope>) names format 8. An operator rolling back as for
// format 7 (SET <prefix>:format 7, start an older build) would get
// corrupt answers for every retry of a renewal or administrative ending
// made in format 8.
func TestAttackEV6Format8IsDocumented(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	// The README's lines are wrapped: compare its words.
	readme = []byte(strings.Join(strings.Fields(string(readme)), " "))
	_, rollback, _ := bytes.Cut(readme, []byte("Rolling back past format 8"))
	rollback, _, _ = bytes.Cut(rollback, []byte("before an older build starts"))
	for _, c := range []struct{ where, text, what string }{
		{"README.md", "--valkey-checked-evidence", "the flag (EnableCheckedEvidence's comment points here to roll back)"},
		{"README.md", "`SET <prefix>:format 8`", "the switch's value"},
		{"README.md", "Rolling back past format 8", "how to roll back past format 8"},
		{"rollback", "`ev6`", "that rolling back waits until no evidence key holds version 6"},
		{"rollback", "`hv5`", "that rolling back waits until no history list holds version 5"},
		{"doc.go", `format "8"`, "the evidence key's version 6 in the key layout"},
	} {
		b := map[string][]byte{"README.md": readme, "rollback": rollback, "doc.go": doc}[c.where]
		if !bytes.Contains(b, []byte(c.text)) {
			t.Errorf("%s does not document %s: no %q", c.where, c.what, c.text)
		}
	}
}
