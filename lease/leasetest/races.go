package leasetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// outcome is one call's result, recorded by a goroutine and checked later
// on the test goroutine.
type outcome struct {
	res lease.Result
	err error
}

// concurrently runs fns at once (released together by a barrier) and
// returns their outcomes in order.
func concurrently(fns ...func() (lease.Result, error)) []outcome {
	out := make([]outcome, len(fns))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i].res, out[i].err = fn()
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// winner asserts exactly one success among outs, every other outcome being
// loserCode, and returns the winner's index.
func winner(t *testing.T, outs []outcome, loserCode lease.Code) int {
	t.Helper()
	win := -1
	for i, o := range outs {
		if o.err == nil {
			if win >= 0 {
				t.Fatalf("two winners: #%d and #%d", win, i)
			}
			win = i
			continue
		}
		le, ok := checkCode(t, fmt.Sprintf("attempt #%d", i), o.err, loserCode)
		if !ok {
			t.FailNow()
		}
		if loserCode == lease.CodeConflict && le.RetryAfter <= 0 {
			t.Fatalf("attempt #%d: conflict without retry_after", i)
		}
	}
	if win < 0 {
		t.Fatalf("no winner among %d attempts", len(outs))
	}
	return win
}

// contend starts n acquires of id by n different owners at once and asserts
// one winner; it returns the winner's request and record.
func (e *env) contend(id lease.Identity, n int) (lease.AcquireRequest, *lease.Record) {
	e.t.Helper()
	reqs := make([]lease.AcquireRequest, n)
	fns := make([]func() (lease.Result, error), n)
	for i := range reqs {
		reqs[i] = e.acquireReqFor(id, newCaller("actor"))
		fns[i] = func() (lease.Result, error) { return e.st.Acquire(bg, reqs[i]) }
	}
	outs := concurrently(fns...)
	w := winner(e.t, outs, lease.CodeConflict)
	rec := e.success("acquire", outs[w].res, nil, lease.CodeAcquired)
	e.checkNewLease(rec, reqs[w])
	for i, r := range reqs {
		if i == w {
			continue
		}
		if _, err := e.lookup(lease.OpAcquire, id, r.Caller.PrincipalID, r.RequestID); lease.CodeOf(err) != lease.CodeNotFound {
			e.t.Fatalf("conflicted acquire #%d left stored evidence: %v", i, err)
		}
	}
	return reqs[w], rec
}

// two_concurrent_acquires: exactly one active lease; losers get conflict;
// one token allocated for the winner.
func (s *suite) concurrentAcquires(t *testing.T) {
	s.leaf(t, "exactly_one_winner_of_64", func(e *env) {
		_, rec := e.contend(e.id, 64)
		if rec.FencingToken != 1 {
			e.t.Fatalf("winner token %d, want 1", rec.FencingToken)
		}
		e.wantCounter(e.key, 1)
		sameRecord(e.t, "active lease", e.active(e.id), rec)
		if h := e.history(e.id); len(h) != 0 {
			e.t.Fatalf("history after a contended acquire: %d entries", len(h))
		}
	})
	s.leaf(t, "contended_rounds_allocate_one_token_each", func(e *env) {
		const rounds = 4
		var want []string
		for round := uint64(1); round <= rounds; round++ {
			_, rec := e.contend(e.id, 16)
			if rec.FencingToken != round {
				e.t.Fatalf("round %d: token %d", round, rec.FencingToken)
			}
			e.wantCounter(e.key, round)
			e.mustRelease(e.releaseReq(rec))
			want = append([]string{rec.LeaseID + ":released"}, want...)
		}
		wantStrings(e.t, "history", e.historyStates(e.id), want)
	})
}

// ender ends a lease one way.
type ender struct {
	name  string
	state lease.State
	code  lease.Code
	run   func(e *env, rec *lease.Record) (lease.Result, error)
}

var (
	endRelease = ender{"release", lease.StateReleased, lease.CodeReleased,
		func(e *env, rec *lease.Record) (lease.Result, error) { return e.st.Release(bg, e.releaseReq(rec)) }}
	endForceRelease = ender{"force_release", lease.StateReleased, lease.CodeForceReleased,
		func(e *env, rec *lease.Record) (lease.Result, error) { return e.st.ForceRelease(bg, e.adminReq(rec)) }}
	endRevoke = ender{"revoke", lease.StateRevoked, lease.CodeRevoked,
		func(e *env, rec *lease.Record) (lease.Result, error) { return e.st.Revoke(bg, e.adminReq(rec)) }}
)

// end ends rec and asserts the terminal record returned.
func (e *env) end(how ender, rec *lease.Record) *lease.Record {
	e.t.Helper()
	res, err := how.run(e, rec)
	got := e.success(how.name, res, err, how.code)
	if got.LeaseID != rec.LeaseID || got.FencingToken != rec.FencingToken || got.State != how.state {
		e.t.Fatalf("%s returned %s", how.name, js(got))
	}
	return got
}

// tokens_strictly_increase: every new acquisition receives a strictly
// greater fencing token, however the previous lease ended.
func (s *suite) tokensIncrease(t *testing.T) {
	for _, how := range []ender{endRelease, endForceRelease, endRevoke} {
		s.leaf(t, "after_"+how.name, func(e *env) {
			first := e.grab()
			e.end(how, first)
			e.wantNextToken(first, how.state)
		})
	}
	s.leaf(t, "after_expiry", func(e *env) {
		first := e.grabShort()
		e.waitExpired(first)
		e.wantNextToken(first, lease.StateExpired)
	})
	s.leaf(t, "across_many_acquisitions", func(e *env) {
		seen := map[string]bool{}
		var last uint64
		for i := 0; i < 10; i++ {
			rec := e.grab()
			if rec.FencingToken <= last || seen[rec.LeaseID] {
				e.t.Fatalf("acquisition %d: token %d after %d, lease id reused=%v", i, rec.FencingToken, last, seen[rec.LeaseID])
			}
			last, seen[rec.LeaseID] = rec.FencingToken, true
			e.mustRelease(e.releaseReq(rec))
		}
		e.wantCounter(e.key, last)
	})
	s.leaf(t, "token_follows_durable_counter", func(e *env) {
		e.setCounter(e.key, 1000)
		rec := e.grab()
		if rec.FencingToken != 1001 {
			e.t.Fatalf("token %d after counter 1000, want 1001", rec.FencingToken)
		}
		e.mustRelease(e.releaseReq(rec))
		e.wantCounter(e.key, 1001)
	})
}

// wantNextToken acquires again after first ended in state and asserts a new
// lease with the next token, the old one terminal.
func (e *env) wantNextToken(first *lease.Record, state lease.State) {
	e.t.Helper()
	next := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
	if next.FencingToken != first.FencingToken+1 || next.LeaseID == first.LeaseID {
		e.t.Fatalf("next lease %s token %d after %s token %d", next.LeaseID, next.FencingToken, first.LeaseID, first.FencingToken)
	}
	e.wantCounter(e.key, next.FencingToken)
	e.stateOf(first.LeaseID, state)
	sameRecord(e.t, "active lease", e.active(e.id), next)
}

// renew_races_expiry: backend linearization decides; an expired renewal
// cannot revive the lease.
func (s *suite) renewRacesExpiry(t *testing.T) {
	s.leaf(t, "expired_renewal_cannot_revive", func(e *env) {
		rec := e.grabShort()
		e.waitExpired(rec)
		_, err := e.st.Renew(bg, e.renewReq(rec))
		mustCode(e.t, err, lease.CodeLost)
		_, err = e.st.Release(bg, e.releaseReq(rec))
		mustCode(e.t, err, lease.CodeLost)
		got := e.stateOf(rec.LeaseID, lease.StateExpired)
		if got.ExpiresAt != rec.ExpiresAt || got.RenewedAt != rec.RenewedAt {
			e.t.Fatalf("expired lease was touched: %s", js(got))
		}
		e.noActive(e.id)
		e.wantCounter(e.key, 1)
		e.wantNextToken(rec, lease.StateExpired)
	})
	s.leaf(t, "backend_linearization_decides", func(e *env) {
		// maximum_lifetime = TTL, so no renewal can move expires_at: every
		// renewal races one fixed backend expiry.
		r := e.acquireReq()
		r.TTL, r.MaximumLifetime = Short, Short
		rec := e.mustAcquire(r)
		const workers = 4
		seqs := make([][]outcome, workers)
		var wg sync.WaitGroup
		for w := range seqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stop := time.Now().Add(Short + 3*time.Second)
				for time.Now().Before(stop) {
					res, err := e.st.Renew(bg, e.renewReq(rec))
					seqs[w] = append(seqs[w], outcome{res, err})
					if err != nil {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		renewed := 0
		for w, seq := range seqs {
			for i, o := range seq {
				if o.err != nil {
					mustCode(e.t, o.err, lease.CodeLost)
					if i != len(seq)-1 {
						e.t.Fatalf("worker %d continued after lease-lost", w)
					}
					continue
				}
				got := o.res.Lease
				if o.res.Code != lease.CodeRenewed || got == nil || got.FencingToken != rec.FencingToken ||
					!got.RenewedAt.Before(rec.ExpiresAt) || got.ExpiresAt != rec.ExpiresAt {
					e.t.Fatalf("renewal %s past or beyond the fixed expiry %v", js(got), rec.ExpiresAt)
				}
				renewed++
			}
			if len(seq) == 0 || seq[len(seq)-1].err == nil {
				e.t.Fatalf("worker %d never saw lease-lost", w)
			}
		}
		e.t.Logf("%d renewals linearized before expiry", renewed)
		got := e.stateOf(rec.LeaseID, lease.StateExpired)
		if got.ExpiresAt != rec.ExpiresAt {
			e.t.Fatalf("expires_at moved to %v", got.ExpiresAt)
		}
		e.noActive(e.id)
		_, err := e.st.Renew(bg, e.renewReq(rec))
		mustCode(e.t, err, lease.CodeLost)
	})
}

// raceLeases acquires n fresh identities of e's tenant for e.owner.
func (e *env) raceLeases(n int) []*lease.Record {
	e.t.Helper()
	recs := make([]*lease.Record, n)
	for i := range recs {
		recs[i] = e.mustAcquire(e.acquireReqFor(e.otherTarget(), e.owner))
	}
	return recs
}

const (
	raceRounds   = 24
	raceRenewTTL = Long + time.Second
)

// renew_races_<end>: one terminal or renew result wins atomically; the
// loser gets lease-lost; what is read back is consistent with the winner.
func (s *suite) renewRacesEnd(how ender) func(*testing.T) {
	return func(t *testing.T) {
		s.leaf(t, "terminal_or_renewal_wins_atomically", func(e *env) {
			recs := e.raceLeases(raceRounds)
			var fns []func() (lease.Result, error)
			for _, rec := range recs {
				renew := e.renewReq(rec)
				renew.TTL = raceRenewTTL
				fns = append(fns,
					func() (lease.Result, error) { return e.st.Renew(bg, renew) },
					func() (lease.Result, error) { return how.run(e, rec) })
			}
			outs := concurrently(fns...)
			renewedFirst := 0
			for i, rec := range recs {
				rn, end := outs[2*i], outs[2*i+1]
				// Renewal keeps lease id and token, so the end always matches.
				ended := e.success(how.name, end.res, end.err, how.code)
				var want *lease.Record // the record the end must have acted on
				if rn.err == nil {
					renewedFirst++
					want = e.success("renew", rn.res, nil, lease.CodeRenewed)
					if want.TTLMs != raceRenewTTL.Milliseconds() || want.ExpiresAt != want.RenewedAt.Add(raceRenewTTL) {
						e.t.Fatalf("renewal result %s, want ttl %v from renewed_at", js(want), raceRenewTTL)
					}
				} else {
					mustCode(e.t, rn.err, lease.CodeLost)
					want = rec
				}
				want = want.Clone()
				want.State = how.state
				sameRecord(e.t, "terminal record", ended, want)
				sameRecord(e.t, "inspected terminal record", e.byID(rec.LeaseID), want)
				h := e.history(rec.Identity())
				if len(h) != 1 {
					e.t.Fatalf("history has %d entries, want 1", len(h))
				}
				sameRecord(e.t, "history record", h[0].Record, want)
				e.noActive(rec.Identity())
				e.wantCounter(rec.LockKey, 1)
			}
			e.t.Logf("renew linearized first in %d of %d races", renewedFirst, raceRounds)
		})
	}
}

// release_races_revoke: two terminal transitions; exactly one wins.
func (s *suite) releaseRacesRevoke(t *testing.T) {
	s.leaf(t, "exactly_one_terminal_state", func(e *env) {
		e.raceTwoEnds(endRelease, endRevoke)
	})
}

// release_races_release: two releases of one lease with different request
// ids; exactly one compare-and-delete succeeds.
func (s *suite) releaseRacesRelease(t *testing.T) {
	s.leaf(t, "exactly_one_success", func(e *env) {
		e.raceTwoEnds(endRelease, endRelease)
	})
}

func (e *env) raceTwoEnds(a, b ender) {
	e.t.Helper()
	recs := e.raceLeases(raceRounds)
	var fns []func() (lease.Result, error)
	for _, rec := range recs {
		fns = append(fns,
			func() (lease.Result, error) { return a.run(e, rec) },
			func() (lease.Result, error) { return b.run(e, rec) })
	}
	outs := concurrently(fns...)
	for i, rec := range recs {
		pair := outs[2*i : 2*i+2]
		w := winner(e.t, pair, lease.CodeLost)
		how := []ender{a, b}[w]
		ended := e.success(how.name, pair[w].res, nil, how.code)
		want := rec.Clone()
		want.State = how.state
		sameRecord(e.t, "terminal record", ended, want)
		sameRecord(e.t, "inspected record", e.byID(rec.LeaseID), want)
		wantStrings(e.t, "history", e.historyStates(rec.Identity()), []string{rec.LeaseID + ":" + string(how.state)})
		e.noActive(rec.Identity())
		e.wantCounter(rec.LockKey, 1)
	}
}
