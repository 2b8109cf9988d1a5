package valkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// The fault suite drives a Store through a fault-injecting proxy
// (toxiproxy, embedded; see testenv.Proxy) and checks two things for each
// fault: the typed result the caller gets, and the truth read back
// directly from the server, not through the proxy.
//
// The adapter's rules, which these tests pin down:
//   - a mutation whose command was handed to a connection and got no
//     complete reply by deadline_at + ReplyGrace (a reply delayed, cut or
//     reset, a black hole) is outcome_unknown, whatever the truth is; a
//     black hole met while a new connection is being set up is also
//     outcome_unknown (the adapter cannot tell that nothing was sent);
//   - a read in the same situation is backend_unavailable;
//   - a request that reaches the server after its deadline_at is refused
//     there (nothing written); if that refusal arrives in time, it is
//     deadline_exceeded;
//   - a connection that cannot be made (proxy cut: refused) is
//     backend_unavailable;
//   - LookupRequest, or a retry with the same request id (commit id for
//     AuthorizeCommit), resolves outcome_unknown to the truth and never
//     applies a committed mutation twice.

// faultEnv is one server namespace seen two ways: through a proxy, and
// directly (the truth).
type faultEnv struct {
	px     *testenv.Proxy
	r      *testenv.Redis
	ns     string
	direct *Store
}

func newFaultEnv(t *testing.T, r *testenv.Redis) *faultEnv {
	t.Helper()
	e := &faultEnv{px: testenv.StartProxy(t, r.Addr()), r: r, ns: randomPrefix()}
	e.direct = open(t, r, Options{KeyPrefix: e.ns, StoreOptions: leasetest.StoreOptions()})
	return e
}

// proxied opens a store through the proxy with a short reply grace, and
// connects every pooled connection, so a fault added next meets
// established connections.
func (e *faultEnv) proxied(t *testing.T, grace time.Duration) *Store {
	t.Helper()
	s := open(t, e.r, Options{Addr: e.px.Addr(), KeyPrefix: e.ns, StoreOptions: leasetest.StoreOptions(), ReplyGrace: grace})
	warm(t, s)
	return s
}

// warm answers reads on enough random identities (so hash slots) to have
// used every multiplexed connection; it waits out connections a previous
// fault broke.
func warm(t *testing.T, s *Store) {
	t.Helper()
	for i, ok := 0, 0; ok < 32; i++ {
		if i == 400 {
			t.Fatal("store through the proxy does not answer")
		}
		_, err := s.Inspect(bg, lease.InspectRequest{Identity: newIdentity(), DeadlineAt: far()})
		if lease.CodeOf(err) == lease.CodeNotFound {
			ok++
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// settle retries op (a retry with the same request id, which is always
// safe) while the transport still fails, as a client resolving an unknown
// outcome would.
func settle[R any](t *testing.T, op func() (R, error)) (R, error) {
	t.Helper()
	limit := time.Now().Add(5 * time.Second)
	for {
		r, err := op()
		switch lease.CodeOf(err) {
		case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable:
			if time.Now().Before(limit) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
		}
		return r, err
	}
}

// within fails t if a call that started at start with deadline d took
// longer than the adapter allows: d + grace, plus scheduling slack.
func within(t *testing.T, start, d time.Time, grace time.Duration) {
	t.Helper()
	if took, limit := time.Since(start), d.Sub(start)+grace+400*time.Millisecond; took > limit {
		t.Fatalf("call took %v, longer than deadline + grace (%v)", took, limit)
	}
}

func lookupOf(s *Store, op lease.Op, id lease.Identity, requestID string) (lease.Result, error) {
	return s.LookupRequest(bg, lease.LookupRequest{Op: op, Identity: id, PrincipalID: owner.PrincipalID,
		RequestID: requestID, DeadlineAt: far()})
}

func sameRecord(t *testing.T, what string, got, want *lease.Record) {
	t.Helper()
	if got == nil || want == nil {
		t.Fatalf("%s: record %v, want %v", what, got, want)
	}
	g, err1 := got.Encode()
	w, err2 := want.Encode()
	if err1 != nil || err2 != nil || !bytes.Equal(g, w) {
		t.Fatalf("%s: records differ\n got  %s\n want %s", what, g, w)
	}
}

// acquireTruth resolves an acquire that ended outcome_unknown, directly on
// the server, and checks that every view agrees: the lookup, the counter,
// the active record, and a retry of the same request through s. It
// reports whether the acquire had committed.
func (e *faultEnv) acquireTruth(t *testing.T, s *Store, req lease.AcquireRequest) (committed bool) {
	t.Helper()
	key := lockKey(t, req.Identity)
	counter, err := (faults{e.direct}).Counter(bg, key)
	if err != nil {
		t.Fatal(err)
	}
	lr, lerr := lookupOf(e.direct, lease.OpAcquire, req.Identity, req.RequestID)
	retry := req
	retry.DeadlineAt = far()
	switch lease.CodeOf(lerr) {
	case lease.CodeNotFound:
		// Not committed: nothing of it on the server, and the retry runs it
		// once, now.
		if counter != 0 {
			t.Fatalf("lookup says not committed, but the counter is %d", counter)
		}
		_, err := e.direct.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far()})
		mustCode(t, err, lease.CodeNotFound)
		res, err := settle(t, func() (lease.Result, error) { return s.Acquire(bg, retry) })
		if err != nil || res.Replayed || res.Lease.FencingToken != 1 {
			t.Fatalf("retry of an uncommitted acquire: %v %+v", err, res)
		}
		return false
	case "":
		if lr.Code != lease.CodeAcquired || !lr.Replayed || lr.Op != lease.OpAcquire || lr.Lease.RequestID != req.RequestID {
			t.Fatalf("lookup: %+v", lr)
		}
		if lr.Lease.FencingToken != counter {
			t.Fatalf("lookup token %d, counter read directly %d", lr.Lease.FencingToken, counter)
		}
		cur, err := e.direct.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far()})
		if err != nil {
			t.Fatalf("inspect directly: %v", err)
		}
		sameRecord(t, "active record vs lookup", cur.Lease, lr.Lease)
		res, err := settle(t, func() (lease.Result, error) { return s.Acquire(bg, retry) })
		if err != nil || !res.Replayed {
			t.Fatalf("retry of a committed acquire: %v %+v", err, res)
		}
		sameRecord(t, "retry vs lookup", res.Lease, lr.Lease)
		if after, _ := (faults{e.direct}).Counter(bg, key); after != counter {
			t.Fatalf("retry moved the counter from %d to %d", counter, after)
		}
		return true
	default:
		t.Fatalf("lookup directly: %v", lerr)
	}
	return false
}

// TestProxyFaults runs the fault cases against one server, each through
// its own proxy and namespace.
func TestProxyFaults(t *testing.T) {
	r := testenv.StartRedis(t)
	t.Run("latency_past_deadline", func(t *testing.T) { latencyPastDeadline(t, r) })
	t.Run("reset_after_write", func(t *testing.T) { resetAfterWrite(t, r) })
	t.Run("black_hole", func(t *testing.T) { blackHole(t, r) })
	t.Run("commit_reset_after_write", func(t *testing.T) { commitResetAfterWrite(t, r) })
	t.Run("link_cut_under_load", func(t *testing.T) { linkCutUnderLoad(t, r) })
}

// (a) Latency past the deadline.
func latencyPastDeadline(t *testing.T, r *testenv.Redis) {
	e := newFaultEnv(t, r)
	const grace = 100 * time.Millisecond
	s := e.proxied(t, grace)

	// Replies delayed: the acquire commits at once, its reply comes after
	// the caller stopped waiting.
	t.Run("reply_delayed", func(t *testing.T) {
		req := acquireReq(newIdentity())
		e.px.AddToxic("lag", "latency", testenv.Downstream, map[string]any{"latency": 1200})
		start := time.Now()
		req.DeadlineAt = start.Add(250 * time.Millisecond)
		_, err := s.Acquire(bg, req)
		within(t, start, req.DeadlineAt, grace)
		e.px.RemoveToxic("lag")
		mustCode(t, err, lease.CodeOutcomeUnknown)
		if !e.acquireTruth(t, s, req) {
			t.Fatal("the acquire reached the server in time and should have committed")
		}
	})

	// Requests delayed past the deadline, the refusal back in time: the
	// function ran after deadline_at and refused; the caller learns it.
	t.Run("request_delayed_refusal_seen", func(t *testing.T) {
		patient := open(t, r, Options{Addr: e.px.Addr(), KeyPrefix: e.ns, StoreOptions: leasetest.StoreOptions(), ReplyGrace: 2 * time.Second})
		warm(t, patient)
		req := acquireReq(newIdentity())
		e.px.AddToxic("lag", "latency", testenv.Upstream, map[string]any{"latency": 500})
		start := time.Now()
		req.DeadlineAt = start.Add(150 * time.Millisecond)
		_, err := patient.Acquire(bg, req)
		took := time.Since(start)
		e.px.RemoveToxic("lag")
		mustCode(t, err, lease.CodeDeadlineExceeded)
		if le := lease.AsError(err); le.BackendTime.IsZero() || !le.BackendTime.After(req.DeadlineAt) {
			t.Fatalf("refusal should carry the backend time past the deadline: %+v", le)
		}
		if took < 450*time.Millisecond {
			t.Fatalf("answered after %v: the request was not delayed", took)
		}
		if e.acquireTruth(t, patient, req) {
			t.Fatal("a refused acquire committed")
		}
	})

	// Requests delayed past the deadline, the caller gives up first:
	// outcome_unknown, and the truth is "not committed".
	t.Run("request_delayed_unknown", func(t *testing.T) {
		req := acquireReq(newIdentity())
		e.px.AddToxic("lag", "latency", testenv.Upstream, map[string]any{"latency": 600})
		start := time.Now()
		req.DeadlineAt = start.Add(150 * time.Millisecond)
		_, err := s.Acquire(bg, req)
		within(t, start, req.DeadlineAt, grace)
		mustCode(t, err, lease.CodeOutcomeUnknown)
		// Let the delayed request reach the server before reading the truth.
		time.Sleep(time.Until(start.Add(800 * time.Millisecond)))
		e.px.RemoveToxic("lag")
		if e.acquireTruth(t, s, req) {
			t.Fatal("an acquire that reached the server after its deadline committed")
		}
	})
}

// faultOp is one mutation under a fault, and how to check its truth.
type faultOp struct {
	name string
	// setup prepares a fresh identity and returns the faulted call and the
	// truth check (which returns whether the call committed).
	setup func(t *testing.T, e *faultEnv, s *Store) (call func() error, truth func(t *testing.T) bool)
}

func mutationOps() []faultOp {
	held := func(t *testing.T, s *Store) *lease.Record {
		t.Helper()
		a, err := settle(t, func() (lease.Result, error) { return s.Acquire(bg, acquireReq(newIdentity())) })
		if err != nil {
			t.Fatal(err)
		}
		return a.Lease
	}
	return []faultOp{
		{"acquire", func(t *testing.T, e *faultEnv, s *Store) (func() error, func(*testing.T) bool) {
			req := acquireReq(newIdentity())
			return func() error { _, err := s.Acquire(bg, req); return err },
				func(t *testing.T) bool { return e.acquireTruth(t, s, req) }
		}},
		{"renew", func(t *testing.T, e *faultEnv, s *Store) (func() error, func(*testing.T) bool) {
			l := held(t, s)
			req := renewReq(l)
			req.TTL = 40 * time.Second // differs from the acquire's, so a renewal shows
			return func() error { _, err := s.Renew(bg, req); return err },
				func(t *testing.T) bool {
					cur, err := e.direct.Inspect(bg, lease.InspectRequest{Identity: l.Identity(), DeadlineAt: far()})
					if err != nil {
						t.Fatal(err)
					}
					lr, err := lookupOf(e.direct, lease.OpRenew, l.Identity(), req.RequestID)
					if lease.CodeOf(err) == lease.CodeNotFound {
						sameRecord(t, "unrenewed lease", cur.Lease, l)
						return false
					}
					if err != nil || lr.Code != lease.CodeRenewed {
						t.Fatalf("lookup: %v %+v", err, lr)
					}
					sameRecord(t, "active record vs renew evidence", cur.Lease, lr.Lease)
					if lr.Lease.TTLMs != 40000 || lr.Lease.FencingToken != l.FencingToken {
						t.Fatalf("renew evidence: %+v", lr.Lease)
					}
					retry := req
					retry.DeadlineAt = far()
					res, err := settle(t, func() (lease.Result, error) { return s.Renew(bg, retry) })
					if err != nil || !res.Replayed {
						t.Fatalf("retry of a committed renew: %v %+v", err, res)
					}
					sameRecord(t, "retry vs evidence", res.Lease, lr.Lease)
					again, _ := e.direct.Inspect(bg, lease.InspectRequest{Identity: l.Identity(), DeadlineAt: far()})
					sameRecord(t, "active record after the retry", again.Lease, cur.Lease)
					return true
				}
		}},
		{"release", func(t *testing.T, e *faultEnv, s *Store) (func() error, func(*testing.T) bool) {
			l := held(t, s)
			req := releaseReq(l)
			return func() error { _, err := s.Release(bg, req); return err },
				func(t *testing.T) bool {
					cur, ierr := e.direct.Inspect(bg, lease.InspectRequest{Identity: l.Identity(), DeadlineAt: far()})
					lr, err := lookupOf(e.direct, lease.OpRelease, l.Identity(), req.RequestID)
					if lease.CodeOf(err) == lease.CodeNotFound {
						if ierr != nil {
							t.Fatalf("not released, but no active lease: %v", ierr)
						}
						sameRecord(t, "unreleased lease", cur.Lease, l)
						return false
					}
					if err != nil || lr.Code != lease.CodeReleased || lr.Lease.State != lease.StateReleased {
						t.Fatalf("lookup: %v %+v", err, lr)
					}
					mustCode(t, ierr, lease.CodeNotFound)
					h, err := e.direct.History(bg, lease.HistoryRequest{Identity: l.Identity(), DeadlineAt: far()})
					if err != nil || len(h.Entries) != 1 {
						t.Fatalf("history: %v %+v", err, h)
					}
					sameRecord(t, "history vs evidence", h.Entries[0].Record, lr.Lease)
					retry := req
					retry.DeadlineAt = far()
					res, err := settle(t, func() (lease.Result, error) { return s.Release(bg, retry) })
					if err != nil || !res.Replayed {
						t.Fatalf("retry of a committed release: %v %+v", err, res)
					}
					if h, _ := e.direct.History(bg, lease.HistoryRequest{Identity: l.Identity(), DeadlineAt: far()}); len(h.Entries) != 1 {
						t.Fatalf("the retry added history: %+v", h.Entries)
					}
					return true
				}
		}},
	}
}

// (b) A reset after the request was written: the reply is reset as it
// arrives, or cut short and then reset. A background PING's reply can
// trip the fault before the command's own reply does (then the command
// may not have been sent: outcome_unknown and "not committed" is also
// right), so each case repeats until it has seen a committed write.
func resetAfterWrite(t *testing.T, r *testenv.Redis) {
	e := newFaultEnv(t, r)
	const grace = 200 * time.Millisecond
	s := e.proxied(t, grace)
	for _, fault := range []struct {
		name, kind string
		attrs      map[string]any
	}{
		{"reset_peer", "reset_peer", map[string]any{"timeout": 0}},
		// Replies carry the record (hundreds of bytes); 64 bytes passes
		// PING replies and cuts the command's.
		{"reply_cut", "limit_data", map[string]any{"bytes": 64}},
	} {
		for _, op := range mutationOps() {
			t.Run(fault.name+"/"+op.name, func(t *testing.T) {
				for attempt := 1; ; attempt++ {
					call, truth := op.setup(t, e, s)
					warm(t, s)
					e.px.AddToxic("fault", fault.kind, testenv.Downstream, fault.attrs)
					start := time.Now()
					err := call()
					if took := time.Since(start); took > 2*time.Second {
						t.Fatalf("a reset call took %v", took)
					}
					e.px.RemoveToxic("fault")
					mustCode(t, err, lease.CodeOutcomeUnknown)
					if truth(t) {
						return
					}
					t.Logf("attempt %d: the fault hit before the command was sent", attempt)
					if attempt == 5 {
						t.Fatal("no committed write observed in 5 attempts")
					}
				}
			})
		}
	}
}

// (c) A black hole: a toxic that passes no data and closes nothing. A
// mutation is outcome_unknown, a read backend_unavailable, each within
// deadline + grace; removing the toxic resets the connections it held,
// the store reconnects and the truth is resolved by request id.
func blackHole(t *testing.T, r *testenv.Redis) {
	e := newFaultEnv(t, r)
	const grace = 200 * time.Millisecond
	s := e.proxied(t, grace)
	for _, c := range []struct {
		dir       testenv.Stream
		committed bool
	}{{testenv.Upstream, false}, {testenv.Downstream, true}} {
		t.Run(string(c.dir), func(t *testing.T) {
			warm(t, s)
			req := acquireReq(newIdentity())
			e.px.AddToxic("hole", "timeout", c.dir, map[string]any{"timeout": 0})
			start := time.Now()
			req.DeadlineAt = start.Add(300 * time.Millisecond)
			_, err := s.Acquire(bg, req)
			within(t, start, req.DeadlineAt, grace)
			mustCode(t, err, lease.CodeOutcomeUnknown)

			start = time.Now()
			d := start.Add(200 * time.Millisecond)
			_, err = s.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: d})
			within(t, start, d, grace)
			mustCode(t, err, lease.CodeBackendUnavailable)
			start = time.Now()
			hctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
			h := s.Health(hctx)
			cancel()
			within(t, start, start.Add(200*time.Millisecond), 0)
			if h.Status != lease.HealthUnavailable {
				t.Fatalf("health in a black hole: %+v", h)
			}

			// The truth, read directly while the proxy still swallows data.
			_, lerr := lookupOf(e.direct, lease.OpAcquire, req.Identity, req.RequestID)
			if got := lerr == nil; got != c.committed {
				t.Fatalf("committed=%v (%v), want %v", got, lerr, c.committed)
			}

			e.px.RemoveToxic("hole")
			healthy := time.Now().Add(5 * time.Second)
			for s.Health(bg).Status != lease.HealthOK {
				if time.Now().After(healthy) {
					t.Fatal("store did not recover after the black hole was removed")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got := e.acquireTruth(t, s, req); got != c.committed {
				t.Fatalf("resolved committed=%v, want %v", got, c.committed)
			}
		})
	}
}

// (d) AuthorizeCommit under a reset after write: outcome_unknown; the
// same commit id then returns the original accepted commit (replayed),
// and neither the evidence nor the sink's high-water mark changes again.
func commitResetAfterWrite(t *testing.T, r *testenv.Redis) {
	e := newFaultEnv(t, r)
	const grace = 200 * time.Millisecond
	s := e.proxied(t, grace)
	raw := e.direct.client
	for attempt := 1; ; attempt++ {
		id := newIdentity()
		tag := tagOf(lockKey(t, id))
		// An earlier lease leaves a lower mark on the sink, so the faulted
		// commit's raising of it is visible.
		first, err := settle(t, func() (lease.Result, error) { return s.Acquire(bg, acquireReq(id)) })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := settle(t, func() (lease.CommitResult, error) { return s.AuthorizeCommit(bg, commitReq(first.Lease)) }); err != nil {
			t.Fatal(err)
		}
		if _, err := settle(t, func() (lease.Result, error) { return s.Release(bg, releaseReq(first.Lease)) }); err != nil {
			t.Fatal(err)
		}
		a, err := settle(t, func() (lease.Result, error) { return s.Acquire(bg, acquireReq(id)) })
		if err != nil {
			t.Fatal(err)
		}
		creq := commitReq(a.Lease)
		_, pc, err := lease.PrepareCommit(creq, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		markOf := func() string {
			v, err := raw.Do(bg, raw.B().Hget().Key(e.direct.keys.marks(tag)).Field(creq.Sink).Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		if m := markOf(); m != utoa(first.Lease.FencingToken) {
			t.Fatalf("mark before %s, want %d", m, first.Lease.FencingToken)
		}

		warm(t, s)
		e.px.AddToxic("fault", "reset_peer", testenv.Downstream, map[string]any{"timeout": 0})
		_, err = s.AuthorizeCommit(bg, creq)
		e.px.RemoveToxic("fault")
		mustCode(t, err, lease.CodeOutcomeUnknown)

		evidence, committed := get(t, e.direct, e.direct.keys.commit(tag, pc.Scope))
		mark := markOf()
		if !committed {
			if mark != utoa(first.Lease.FencingToken) {
				t.Fatalf("no commit evidence, but the mark moved to %s", mark)
			}
			t.Logf("attempt %d: the fault hit before the command was sent", attempt)
			if attempt == 5 {
				t.Fatal("no committed write observed in 5 attempts")
			}
			continue
		}
		if mark != utoa(a.Lease.FencingToken) {
			t.Fatalf("commit evidence stored, mark %s, want %d", mark, a.Lease.FencingToken)
		}
		stored, err := lease.DecodeCommit([]byte(evidence))
		if err != nil {
			t.Fatal(err)
		}
		creq.DeadlineAt = far()
		rep, err := settle(t, func() (lease.CommitResult, error) { return s.AuthorizeCommit(bg, creq) })
		if err != nil || !rep.Replayed || rep.Code != lease.CodeCommitAuthorized {
			t.Fatalf("retry with the same commit id: %v %+v", err, rep)
		}
		if rep.Commit != stored {
			t.Fatalf("replay differs from the stored commit:\n got  %+v\n want %+v", rep.Commit, stored)
		}
		if again, _ := get(t, e.direct, e.direct.keys.commit(tag, pc.Scope)); again != evidence {
			t.Fatalf("the retry rewrote the evidence:\n got  %s\n want %s", again, evidence)
		}
		if m := markOf(); m != mark {
			t.Fatalf("the retry moved the mark from %s to %s", mark, m)
		}
		// The old lease's token stays below the mark: fenced off.
		stale := commitReq(first.Lease)
		_, err = s.AuthorizeCommit(bg, stale)
		if c := lease.CodeOf(err); c != lease.CodeLost && c != lease.CodeCommitRejected {
			t.Fatalf("stale commit: %v", err)
		}
		return
	}
}

// observation is one call a worker made and what it got.
type observation struct {
	op        lease.Op
	id        lease.Identity
	requestID string
	res       lease.Result
	err       error
	took      time.Duration
	budget    time.Duration // deadline − start + grace
}

// (e) The link is cut, reset, black-holed, delayed and refused while
// workers acquire, renew and release. Every result is typed, every call
// ends within its deadline + grace, and every success a client saw is
// what the server holds: its idempotency evidence, read directly.
func linkCutUnderLoad(t *testing.T, r *testenv.Redis) {
	e := newFaultEnv(t, r)
	const grace = 150 * time.Millisecond
	s := e.proxied(t, grace)
	ids := []lease.Identity{newIdentity(), newIdentity(), newIdentity(), newIdentity()}
	const workers = 8
	stop := time.Now().Add(2500 * time.Millisecond)

	var mu sync.Mutex
	var seen []observation
	record := func(o observation) { mu.Lock(); seen = append(seen, o); mu.Unlock() }

	// call runs one attempt with a fresh deadline and records it.
	call := func(op lease.Op, id lease.Identity, requestID string, f func(deadline time.Time) (lease.Result, error)) (lease.Result, error) {
		start := time.Now()
		d := start.Add(250 * time.Millisecond)
		res, err := f(d)
		record(observation{op: op, id: id, requestID: requestID, res: res, err: err, took: time.Since(start), budget: d.Sub(start) + grace})
		return res, err
	}
	// resolve retries an unknown or unavailable outcome with the same
	// request id, a bounded number of times.
	resolve := func(op lease.Op, id lease.Identity, requestID string, f func(deadline time.Time) (lease.Result, error)) (lease.Result, error) {
		var res lease.Result
		var err error
		for i := 0; i < 6; i++ {
			res, err = call(op, id, requestID, f)
			switch lease.CodeOf(err) {
			case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded:
				time.Sleep(20 * time.Millisecond)
				continue
			}
			break
		}
		return res, err
	}

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(id lease.Identity) {
			defer wg.Done()
			for time.Now().Before(stop) {
				areq := acquireReq(id)
				areq.TTL = time.Second
				a, err := resolve(lease.OpAcquire, id, areq.RequestID, func(d time.Time) (lease.Result, error) {
					areq.DeadlineAt = d
					return s.Acquire(bg, areq)
				})
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				l := a.Lease
				for k := 0; k < 3 && err == nil; k++ {
					rreq := renewReq(l)
					rreq.TTL = time.Second
					var rn lease.Result
					rn, err = resolve(lease.OpRenew, id, rreq.RequestID, func(d time.Time) (lease.Result, error) {
						rreq.DeadlineAt = d
						return s.Renew(bg, rreq)
					})
					if err == nil {
						l = rn.Lease
					}
				}
				if err != nil {
					continue
				}
				xreq := releaseReq(l)
				_, _ = resolve(lease.OpRelease, id, xreq.RequestID, func(d time.Time) (lease.Result, error) {
					xreq.DeadlineAt = d
					return s.Release(bg, xreq)
				})
			}
		}(ids[w%len(ids)])
	}

	// The chaos: one fault at a time, then a healthy pause.
	var faultsRun []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		type fault struct {
			name string
			on   func()
			off  func()
		}
		toxic := func(name, kind string, dir testenv.Stream, attrs map[string]any) fault {
			return fault{name, func() { e.px.AddToxic(name, kind, dir, attrs) }, func() { e.px.RemoveToxic(name) }}
		}
		all := []fault{
			toxic("reset_replies", "reset_peer", testenv.Downstream, map[string]any{"timeout": 0}),
			toxic("reset_requests", "reset_peer", testenv.Upstream, map[string]any{"timeout": 0}),
			toxic("cut_replies", "limit_data", testenv.Downstream, map[string]any{"bytes": 200}),
			toxic("black_hole_requests", "timeout", testenv.Upstream, map[string]any{"timeout": 0}),
			toxic("black_hole_replies", "timeout", testenv.Downstream, map[string]any{"timeout": 0}),
			toxic("slow_replies", "latency", testenv.Downstream, map[string]any{"latency": 500}),
			{"refused", e.px.Cut, e.px.Restore},
		}
		for i := 0; time.Now().Before(stop); i++ {
			f := all[i%len(all)]
			faultsRun = append(faultsRun, f.name)
			f.on()
			time.Sleep(150 * time.Millisecond)
			f.off()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	wg.Wait()
	e.px.Clear()
	t.Logf("faults injected in turn: %v", faultsRun)

	allowed := map[lease.Code]bool{lease.CodeConflict: true, lease.CodeLost: true, lease.CodeOutcomeUnknown: true,
		lease.CodeBackendUnavailable: true, lease.CodeDeadlineExceeded: true}
	counts := map[string]int{}
	tokens := map[string]map[uint64]string{} // lock key → token → lease id
	maxToken := map[string]uint64{}
	for _, o := range seen {
		if o.took > o.budget+400*time.Millisecond {
			t.Errorf("%s took %v, budget %v", o.op, o.took, o.budget)
		}
		if o.err != nil {
			var le *lease.Error
			if !errors.As(o.err, &le) {
				t.Fatalf("%s: untyped error %T %v", o.op, o.err, o.err)
			}
			if !allowed[le.Code] {
				t.Fatalf("%s: unexpected code %v", o.op, o.err)
			}
			counts[fmt.Sprintf("%s:%s", o.op, le.Code)]++
			continue
		}
		counts[fmt.Sprintf("%s:ok", o.op)]++
		// The server holds exactly what the client saw.
		lr, err := lookupOf(e.direct, o.op, o.id, o.requestID)
		if err != nil {
			t.Fatalf("%s %s succeeded for the client, but the server has no evidence: %v", o.op, o.requestID, err)
		}
		sameRecord(t, fmt.Sprintf("%s %s: server evidence vs client result", o.op, o.requestID), lr.Lease, o.res.Lease)
		if lr.Code != o.res.Code {
			t.Fatalf("%s: code %s, evidence %s", o.op, o.res.Code, lr.Code)
		}
		if o.op == lease.OpAcquire {
			key := o.res.Lease.LockKey
			if tokens[key] == nil {
				tokens[key] = map[uint64]string{}
			}
			if prev, ok := tokens[key][o.res.Lease.FencingToken]; ok && prev != o.res.Lease.LeaseID {
				t.Fatalf("token %d granted to two leases: %s and %s", o.res.Lease.FencingToken, prev, o.res.Lease.LeaseID)
			}
			tokens[key][o.res.Lease.FencingToken] = o.res.Lease.LeaseID
			maxToken[key] = max(maxToken[key], o.res.Lease.FencingToken)
		}
	}
	for _, id := range ids {
		key := lockKey(t, id)
		c, err := (faults{e.direct}).Counter(bg, key)
		if err != nil || c < maxToken[key] {
			t.Fatalf("counter %d (%v) below the highest token a client saw, %d", c, err, maxToken[key])
		}
	}
	t.Logf("%d calls: %v", len(seen), counts)
	if counts["acquire:ok"] == 0 || counts["acquire:lease_outcome_unknown"]+counts["renew:lease_outcome_unknown"]+counts["release:lease_outcome_unknown"] == 0 {
		t.Fatalf("the run exercised too little: %v", counts)
	}
	// The store works again once the faults are gone.
	warm(t, s)
	lifecycle(t, s)
}
