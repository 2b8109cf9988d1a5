package race

import (
	"os"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/starintel/starlease/lease"
)

// These tests check the checker: hand-made histories that are linearizable
// must pass, and histories that break the contract must be rejected by
// porcupine and, where the break is a safety invariant, by the invariants.

// b is the backend time origin of the hand-made histories (Unix ms).
const b = int64(1_700_000_000_000)

const maxLife = 1000

// lz builds the requests and answers of one lease, tracking its renewals.
type lz struct {
	id, owner, inst        string
	tok                    uint64
	acquired, renewed, exp int64
	ttl                    int64
}

func newLease(id string, tok uint64, owner string, at, ttl int64) *lz {
	return &lz{id: id, owner: owner, inst: "inst_" + owner, tok: tok, acquired: b + at, renewed: b + at,
		exp: b + at + min(ttl, maxLife), ttl: ttl}
}

func (l *lz) view(state lease.State) *LeaseView {
	return &LeaseView{LeaseID: l.id, Owner: l.owner, Instance: l.inst, Token: l.tok, AcquiredMs: l.acquired,
		RenewedMs: l.renewed, ExpiresMs: l.exp, TTLMs: l.ttl, MaxLifetimeMs: maxLife, State: state}
}

func (l *lz) acquireIn() Input {
	return Input{Kind: KindAcquire, Owner: l.owner, Instance: l.inst, TTLMs: l.ttl, MaxLifetimeMs: maxLife}
}

func (l *lz) granted() Output {
	return Output{Code: lease.CodeAcquired, BackendMs: l.acquired, Lease: l.view(lease.StateActive)}
}

func (l *lz) in(k Kind) Input {
	return Input{Kind: k, Owner: l.owner, Instance: l.inst, LeaseID: l.id, Token: l.tok}
}

// renewed renews at ms (relative to b) with the lease's TTL.
func (l *lz) renewAt(at int64) Output {
	l.renewed = b + at
	l.exp = min(b+at+l.ttl, l.acquired+maxLife)
	return Output{Code: lease.CodeRenewed, BackendMs: b + at, Lease: l.view(lease.StateActive)}
}

func (l *lz) ended(code lease.Code, state lease.State, at int64) Output {
	return Output{Code: code, BackendMs: b + at, Lease: l.view(state)}
}

func (l *lz) commitIn(sink string) Input {
	in := l.in(KindCommit)
	in.Sink = sink
	return in
}

func (l *lz) committed(sink string, at int64) Output {
	return Output{Code: lease.CodeCommitAuthorized, BackendMs: b + at,
		Commit: &CommitView{Sink: sink, LeaseID: l.id, Token: l.tok, AcceptedMs: b + at}}
}

func (l *lz) inspected(at int64, state lease.State) Output {
	return Output{Code: lease.CodeInspected, BackendMs: b + at, Lease: l.view(state)}
}

func answer(code lease.Code, at int64) Output { return Output{Code: code, BackendMs: b + at} }

// hist builds a history on identity 0. By default each operation follows
// the previous one in real time; conc adds one overlapping the previous.
type hist struct {
	h   *History
	now int64
}

func newHist() *hist { return &hist{h: NewHistory(1)} }

// seq records an operation that starts after every earlier one returned.
func (x *hist) seq(in Input, out Output) *hist {
	x.now += 10
	x.h.Add(0, in, x.now, out, x.now+5)
	x.now += 5
	return x
}

// at records an operation with explicit call and return times (ns).
func (x *hist) at(client int, call, ret int64, in Input, out Output) *hist {
	x.h.Add(client, in, call, out, ret)
	if ret > x.now {
		x.now = ret
	}
	return x
}

type verdict struct {
	result     porcupine.CheckResult
	invariants []string
}

func check(t *testing.T, x *hist) verdict {
	t.Helper()
	ops := x.h.Operations()
	res := porcupine.CheckOperationsTimeout(Model(b), ops, 0)
	inv, _ := checkInvariants(ops)
	return verdict{res, inv}
}

func wantOK(t *testing.T, x *hist) {
	t.Helper()
	v := check(t, x)
	if v.result != porcupine.Ok || len(v.invariants) > 0 {
		rep := Check(x.h, Options{ReportDir: t.TempDir()})
		t.Fatalf("a linearizable history was rejected: %s, invariants %q\n%s", v.result, v.invariants,
			strings.Join(rep.Problems, "\n"))
	}
}

// wantIllegal asserts porcupine rejects x and, if invariant is not empty,
// that an invariant violation mentions it.
func wantIllegal(t *testing.T, x *hist, invariant string) {
	t.Helper()
	v := check(t, x)
	if v.result != porcupine.Illegal {
		t.Errorf("porcupine: %s, want Illegal", v.result)
	}
	if invariant == "" {
		return
	}
	for _, s := range v.invariants {
		if strings.Contains(s, invariant) {
			return
		}
	}
	t.Errorf("no invariant violation mentions %q; got %q", invariant, v.invariants)
}

func TestLinearizableHistories(t *testing.T) {
	t.Run("sequential_lifecycle", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200)
		bl := newLease("lease_B", 2, "prn_b", 200, 200)
		c := newLease("lease_C", 3, "prn_a", 460, 200)
		x := newHist().
			seq(Input{Kind: KindInspect}, answer(lease.CodeNotFound, 90)).
			seq(a.acquireIn(), a.granted()).
			seq(bl.acquireIn(), answer(lease.CodeConflict, 120)).
			seq(a.in(KindRenew), a.renewAt(150)).
			seq(a.commitIn("couchdb"), a.committed("couchdb", 160)).
			seq(Input{Kind: KindInspect}, a.inspected(170, lease.StateActive)).
			seq(a.in(KindRelease), a.ended(lease.CodeReleased, lease.StateReleased, 180)).
			seq(Input{Kind: KindInspect}, answer(lease.CodeNotFound, 190)).
			seq(bl.acquireIn(), bl.granted()).
			seq(a.in(KindRenew), answer(lease.CodeLost, 210)).
			seq(a.commitIn("couchdb"), answer(lease.CodeLost, 220)).
			seq(bl.commitIn("couchdb"), bl.committed("couchdb", 230)).
			seq(Input{Kind: KindInspect}, bl.inspected(450, lease.StateExpired)).
			seq(bl.in(KindRenew), answer(lease.CodeLost, 455)).
			seq(c.acquireIn(), c.granted()).
			seq(a.in(KindInspectID), a.inspected(470, lease.StateReleased)).
			seq(bl.in(KindInspectID), bl.inspected(475, lease.StateExpired)).
			seq(c.in(KindRevoke), c.ended(lease.CodeRevoked, lease.StateRevoked, 480)).
			seq(c.in(KindInspectID), answer(lease.CodeNotFound, 490)) // history retention
		wantOK(t, x)
	})
	t.Run("concurrent_acquires_one_winner", func(t *testing.T) {
		// The loser returns first in real time but decided later in
		// backend time: the model orders by backend time within overlap.
		w := newLease("lease_W", 1, "prn_w", 100, 200)
		l := newLease("lease_L", 0, "prn_l", 0, 200)
		x := newHist().
			at(0, 10, 90, l.acquireIn(), answer(lease.CodeConflict, 101)).
			at(1, 20, 80, w.acquireIn(), w.granted())
		wantOK(t, x)
	})
	t.Run("renew_at_the_last_millisecond", func(t *testing.T) {
		a := newLease("lease_A", 7, "prn_a", 100, 100)
		x := newHist().
			seq(a.acquireIn(), a.granted()).
			seq(a.in(KindRenew), a.renewAt(199)). // expires 299
			seq(a.in(KindRenew), answer(lease.CodeLost, 299))
		wantOK(t, x)
	})
	t.Run("renewal_capped_by_maximum_lifetime", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 0, 300)
		x := newHist().seq(a.acquireIn(), a.granted())
		for at := int64(250); at < 1000; at += 250 {
			x.seq(a.in(KindRenew), a.renewAt(at))
		}
		if a.exp != b+maxLife {
			t.Fatalf("test builder: expires %d, want the lifetime cap", a.exp-b)
		}
		x.seq(a.in(KindRenew), answer(lease.CodeLost, maxLife))
		wantOK(t, x)
	})
	t.Run("token_gaps_allowed", func(t *testing.T) {
		a := newLease("lease_A", 3, "prn_a", 100, 100)
		c := newLease("lease_C", 9, "prn_c", 300, 100)
		wantOK(t, newHist().seq(a.acquireIn(), a.granted()).seq(c.acquireIn(), c.granted()))
	})
	t.Run("replayed_after_outcome_unknown", func(t *testing.T) {
		// The acquire's first answer was lost; the retry replays it with
		// the original decision time, inside the operation's interval.
		a := newLease("lease_A", 1, "prn_a", 100, 200)
		out := a.granted()
		out.Replayed, out.BackendMs, out.Attempts = true, b+100, 2
		x := newHist().
			at(0, 10, 500, a.acquireIn(), out).
			at(1, 20, 30, Input{Kind: KindInspect}, answer(lease.CodeNotFound, 90))
		wantOK(t, x)
	})
	t.Run("no_decision_answers", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200)
		x := newHist().
			seq(a.acquireIn(), Output{Code: lease.CodeBackendUnavailable}).
			seq(a.acquireIn(), answer(lease.CodeDeadlineExceeded, 50)).
			seq(a.acquireIn(), a.granted())
		wantOK(t, x)
	})
}

func TestNonLinearizableHistories(t *testing.T) {
	t.Run("two_overlapping_acquire_successes", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200)
		c := newLease("lease_C", 2, "prn_c", 150, 200)
		wantIllegal(t, newHist().seq(a.acquireIn(), a.granted()).seq(c.acquireIn(), c.granted()),
			"while lease lease_A (token 1) holds until")
	})
	t.Run("two_concurrent_acquire_successes", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200)
		c := newLease("lease_C", 2, "prn_c", 100, 200)
		wantIllegal(t, newHist().at(0, 10, 50, a.acquireIn(), a.granted()).at(1, 10, 50, c.acquireIn(), c.granted()),
			"acquired at")
	})
	t.Run("token_going_backwards", func(t *testing.T) {
		a := newLease("lease_A", 2, "prn_a", 100, 200)
		c := newLease("lease_C", 1, "prn_c", 120, 200)
		x := newHist().
			seq(a.acquireIn(), a.granted()).
			seq(a.in(KindRelease), a.ended(lease.CodeReleased, lease.StateReleased, 110)).
			seq(c.acquireIn(), c.granted())
		wantIllegal(t, x, "is not above token 2")
	})
	t.Run("token_handed_out_twice", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200)
		c := newLease("lease_C", 1, "prn_c", 400, 200)
		wantIllegal(t, newHist().seq(a.acquireIn(), a.granted()).seq(c.acquireIn(), c.granted()),
			"token 1 handed out twice")
	})
	t.Run("renewal_after_expiry_succeeds", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200) // expires 300
		x := newHist().seq(a.acquireIn(), a.granted()).seq(a.in(KindRenew), a.renewAt(350))
		wantIllegal(t, x, "renewed at")
	})
	t.Run("renewal_at_expires_at_succeeds", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 200) // expires 300: not live at 300
		x := newHist().seq(a.acquireIn(), a.granted()).seq(a.in(KindRenew), a.renewAt(300))
		wantIllegal(t, x, "renewed at")
	})
	t.Run("commit_below_the_mark", func(t *testing.T) {
		a := newLease("lease_A", 2, "prn_a", 100, 500)
		c := newLease("lease_C", 3, "prn_c", 120, 500)
		x := newHist().
			seq(a.acquireIn(), a.granted()).
			seq(a.commitIn("couchdb"), a.committed("couchdb", 105)).
			seq(a.in(KindRevoke), a.ended(lease.CodeRevoked, lease.StateRevoked, 110)).
			seq(c.acquireIn(), c.granted()).
			seq(c.commitIn("couchdb"), c.committed("couchdb", 125)).
			seq(a.commitIn("couchdb"), a.committed("couchdb", 130))
		wantIllegal(t, x, "accepted commit")
	})
	t.Run("commit_after_expiry", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 100)
		x := newHist().seq(a.acquireIn(), a.granted()).seq(a.commitIn("couchdb"), a.committed("couchdb", 250))
		wantIllegal(t, x, "commit of lease lease_A succeeded at")
	})
	t.Run("stale_release_ends_successor", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 500)
		x := newHist().
			seq(a.acquireIn(), a.granted()).
			seq(a.in(KindRelease), a.ended(lease.CodeReleased, lease.StateReleased, 110)).
			seq(a.in(KindRelease), a.ended(lease.CodeReleased, lease.StateReleased, 130))
		wantIllegal(t, x, "ended 2 times")
	})
	t.Run("backend_time_going_backwards", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 500)
		x := newHist().seq(a.acquireIn(), a.granted()).seq(Input{Kind: KindInspect}, a.inspected(90, lease.StateActive))
		wantIllegal(t, x, "")
	})
	t.Run("read_sees_expired_then_renewal_revives", func(t *testing.T) {
		// A read decides at a later backend time on a snapshot that misses
		// a concurrent renewal decided earlier: the client sees the lease
		// expired, then active again.
		a := newLease("lease_A", 1, "prn_a", 100, 100) // expires 200
		x := newHist().seq(a.acquireIn(), a.granted())
		x.at(1, x.now+10, x.now+30, Input{Kind: KindInspect}, a.inspected(200, lease.StateExpired))
		x.at(0, x.now-25, x.now+10, a.in(KindRenew), a.renewAt(199))
		x.seq(Input{Kind: KindInspect}, a.inspected(210, lease.StateActive))
		wantIllegal(t, x, "")
	})
	t.Run("lost_while_held", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 500)
		wantIllegal(t, newHist().seq(a.acquireIn(), a.granted()).seq(a.in(KindRenew), answer(lease.CodeLost, 150)), "")
	})
	t.Run("conflict_while_free", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 100)
		wantIllegal(t, newHist().seq(a.acquireIn(), a.granted()).seq(a.acquireIn(), answer(lease.CodeConflict, 200)), "")
	})
	t.Run("renewal_past_maximum_lifetime", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 0, 600)
		x := newHist().seq(a.acquireIn(), a.granted())
		out := a.renewAt(500)
		out.Lease.ExpiresMs = b + 1100 // 500+600, ignoring the 1000 ms lifetime
		wantIllegal(t, x.seq(a.in(KindRenew), out), "")
	})
	t.Run("renewal_by_wrong_instance", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 500)
		in := a.in(KindRenew)
		in.Instance = "inst_other"
		wantIllegal(t, newHist().seq(a.acquireIn(), a.granted()).seq(in, a.renewAt(150)), "")
	})
	t.Run("decision_without_backend_time", func(t *testing.T) {
		a := newLease("lease_A", 1, "prn_a", 100, 500)
		wantIllegal(t, newHist().seq(a.acquireIn(), a.granted()).seq(a.acquireIn(), Output{Code: lease.CodeConflict}), "")
	})
}

// TestStepMarkRule checks the high-water rule on a state no correct
// history reaches: a live lease whose token is below the sink's mark.
func TestStepMarkRule(t *testing.T) {
	s := State{Active: &Held{LeaseID: "lease_A", Owner: "prn_a", Instance: "inst_prn_a", Token: 3,
		AcquiredMs: b, RenewedMs: b, ExpiresMs: b + 500, TTLMs: 500, MaxLifetimeMs: maxLife},
		Latest: "lease_A", Counter: 3, Marks: []Mark{{"couchdb", 5}}, Last: b}
	in := Input{Kind: KindCommit, Owner: "prn_a", Instance: "inst_prn_a", LeaseID: "lease_A", Token: 3, Sink: "couchdb"}
	ok := Output{Code: lease.CodeCommitAuthorized, BackendMs: b + 1,
		Commit: &CommitView{Sink: "couchdb", LeaseID: "lease_A", Token: 3, AcceptedMs: b + 1}}
	if _, err := Step(s, in, ok); err == nil || !strings.Contains(err.Error(), "below the couchdb mark 5") {
		t.Errorf("commit below the mark accepted: %v", err)
	}
	if _, err := Step(s, in, answer(lease.CodeLost, 1)); err == nil {
		t.Errorf("lease_lost accepted for the exact live lease")
	}
	if _, err := Step(s, in, answer(lease.CodeCommitRejected, 1)); err != nil {
		t.Errorf("commit_rejected below the mark refused: %v", err)
	}
	in.Sink = "rabbitmq"
	next, err := Step(s, in, Output{Code: lease.CodeCommitAuthorized, BackendMs: b + 1,
		Commit: &CommitView{Sink: "rabbitmq", LeaseID: "lease_A", Token: 3, AcceptedMs: b + 1}})
	if err != nil || next.mark("rabbitmq") != 3 || next.mark("couchdb") != 5 || s.mark("rabbitmq") != 0 {
		t.Errorf("commit on a fresh sink: err %v, marks %v (was %v)", err, next.Marks, s.Marks)
	}
}

// TestReport checks that a failed check names a visualization that exists
// and that a passing one writes nothing.
func TestReport(t *testing.T) {
	a := newLease("lease_A", 1, "prn_a", 100, 200)
	c := newLease("lease_C", 2, "prn_c", 150, 200)
	bad := newHist().seq(a.acquireIn(), a.granted()).seq(c.acquireIn(), c.granted())
	dir := t.TempDir()
	rep := Check(bad.h, Options{ReportDir: dir})
	if rep.Result != porcupine.Illegal || len(rep.Problems) == 0 {
		t.Fatalf("bad history passed: %s %q", rep.Result, rep.Problems)
	}
	if rep.Visualization == "" || !strings.Contains(rep.Problems[0], rep.Visualization) {
		t.Fatalf("problem does not name the visualization %q: %q", rep.Visualization, rep.Problems[0])
	}
	if !strings.Contains(rep.Problems[0], "acquired while lease …ease_A") {
		t.Errorf("problem does not explain the failure: %q", rep.Problems[0])
	}
	for _, f := range []string{rep.Visualization, dir + "/history.json"} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("report file %s: %v", f, err)
		}
	}
	html, _ := os.ReadFile(rep.Visualization)
	if !strings.Contains(string(html), "acquire") {
		t.Errorf("visualization does not describe the operations")
	}

	good := newHist().seq(a.acquireIn(), a.granted())
	dir2 := t.TempDir()
	if rep := Check(good.h, Options{ReportDir: dir2}); rep.Result != porcupine.Ok || len(rep.Problems) > 0 || rep.Visualization != "" {
		t.Fatalf("good history: %s %q %q", rep.Result, rep.Problems, rep.Visualization)
	}
	if entries, _ := os.ReadDir(dir2); len(entries) > 0 {
		t.Errorf("a passing check wrote %d files", len(entries))
	}

	tainted := newHist().seq(a.acquireIn(), a.granted())
	tainted.h.Taint(0, "outcome_unknown not resolved")
	if rep := Check(tainted.h, Options{ReportDir: t.TempDir()}); len(rep.Problems) != 1 ||
		!strings.Contains(rep.Problems[0], "identity 0 not checked: outcome_unknown not resolved") {
		t.Errorf("tainted identity: %q", rep.Problems)
	}
}

// A renewal in the acquisition's own millisecond that shortens the lease is
// in force from then on: the real-time order decides between the two, so
// a successor after the shortened expiry is legal, and one before it is not.
func TestShortenedRenewalInOneMillisecond(t *testing.T) {
	for _, successorAt := range []int64{160, 150} {
		a := newLease("lease_a", 1, "prn_a", 0, 176)
		x := newHist().seq(a.acquireIn(), a.granted())
		a.ttl = 158
		renew := a.in(KindRenew)
		renew.TTLMs = 158
		x.seq(renew, a.renewAt(0))
		c := newLease("lease_c", 2, "prn_c", successorAt, 100)
		x.seq(c.acquireIn(), c.granted())
		if successorAt > 158 {
			wantOK(t, x)
		} else {
			wantIllegal(t, x, "while lease lease_a")
		}
	}
}
