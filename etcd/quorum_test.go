package etcd

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// mutationCase is one mutation tried while the cluster has no quorum: the
// same request (same request id or commit id) every time it is sent, so a
// resend after the outage resolves an outcome_unknown.
type mutationCase struct {
	name string
	// lookup names the mutation for LookupRequest (nil for a commit, which
	// is resolved by sending its commit id again).
	lookup *lease.LookupRequest
	// send sends the request with a fresh deadline d away and returns the
	// code (CodeOf the error, or the success code), for an acquisition the
	// lease, and the error.
	send func(s *Store, d time.Duration) (lease.Code, *lease.Record, error)
}

// typed fails the test if err is not a *lease.Error: the Store interface
// never lets a raw backend error (whose text may name endpoints) through.
func typed(t *testing.T, what string, err error) {
	t.Helper()
	var le *lease.Error
	if err != nil && !errors.As(err, &le) {
		t.Errorf("%s: the error is a raw %T, not a *lease.Error: %q", what, err, err.Error())
	}
}

// inFlight is one acquisition of the background load and its answer.
type inFlight struct {
	server int
	req    lease.AcquireRequest
	code   lease.Code
}

// quorumCases are the mutations of the outage: an acquisition of a free
// identity, and a renewal, commit, release, force-release and revocation
// of the lease held. Each may be sent by several goroutines at once.
func quorumCases(owner, admin actor, free lease.Identity, held *lease.Record) []mutationCase {
	timed := func(d time.Duration) (context.Context, context.CancelFunc, time.Time) {
		ctx, cancel := context.WithTimeout(bgCtx, d)
		return ctx, cancel, time.Now().Add(d)
	}
	result := func(res lease.Result, err error) (lease.Code, *lease.Record, error) {
		if err != nil {
			return lease.CodeOf(err), nil, err
		}
		return res.Code, res.Lease, nil
	}
	acq := owner.acquire(free, time.Minute)
	renew := owner.renew(held)
	release := owner.release(held)
	force, revoke := admin.revoke(held), admin.revoke(held)
	force.Reason = "quorum test: force-release"
	commit := owner.commit(held, "couchdb")
	look := func(op lease.Op, id lease.Identity, c lease.Caller, rid string) *lease.LookupRequest {
		return &lease.LookupRequest{Op: op, Identity: id, PrincipalID: c.PrincipalID, RequestID: rid}
	}
	return []mutationCase{
		{"acquire", look(lease.OpAcquire, free, owner.caller, acq.RequestID), func(s *Store, d time.Duration) (lease.Code, *lease.Record, error) {
			ctx, cancel, at := timed(d)
			defer cancel()
			r := acq
			r.DeadlineAt = at
			return result(s.Acquire(ctx, r))
		}},
		{"renew", look(lease.OpRenew, held.Identity(), owner.caller, renew.RequestID), func(s *Store, d time.Duration) (lease.Code, *lease.Record, error) {
			ctx, cancel, at := timed(d)
			defer cancel()
			r := renew
			r.DeadlineAt = at
			return result(s.Renew(ctx, r))
		}},
		{"commit", nil, func(s *Store, d time.Duration) (lease.Code, *lease.Record, error) {
			ctx, cancel, at := timed(d)
			defer cancel()
			r := commit
			r.DeadlineAt = at
			res, err := s.AuthorizeCommit(ctx, r)
			if err != nil {
				return lease.CodeOf(err), nil, err
			}
			return res.Code, nil, nil
		}},
		{"release", look(lease.OpRelease, held.Identity(), owner.caller, release.RequestID), func(s *Store, d time.Duration) (lease.Code, *lease.Record, error) {
			ctx, cancel, at := timed(d)
			defer cancel()
			r := release
			r.DeadlineAt = at
			return result(s.Release(ctx, r))
		}},
		{"force_release", look(lease.OpForceRelease, held.Identity(), admin.caller, force.RequestID), func(s *Store, d time.Duration) (lease.Code, *lease.Record, error) {
			ctx, cancel, at := timed(d)
			defer cancel()
			r := force
			r.DeadlineAt = at
			return result(s.ForceRelease(ctx, r))
		}},
		{"revoke", look(lease.OpRevoke, held.Identity(), admin.caller, revoke.RequestID), func(s *Store, d time.Duration) (lease.Code, *lease.Record, error) {
			ctx, cancel, at := timed(d)
			defer cancel()
			r := revoke
			r.DeadlineAt = at
			return result(s.Revoke(ctx, r))
		}},
	}
}

// TestQuorumLost stops two of three members (SIGTERM) under two servers,
// while a background load acquires fresh identities through both, so that
// some requests are in flight when quorum goes. Every mutation tried
// without quorum, through either server, answers backend_unavailable or
// outcome_unknown within its deadline, never a success; reads refuse too
// and Health reports unavailable. With the two members restarted, the same
// servers resume with no operator step: every outcome_unknown is resolved
// by request id (LookupRequest, then the same request sent again if it
// found nothing; a commit by its commit id), and a new acquisition gets a
// token above every token granted before.
func TestQuorumLost(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	// A call to etcd may take 10 s; the requests' own deadlines must end
	// them much sooner.
	stores := failoverStores(t, c, 2, 10*time.Second)
	owner, admin := newActor("actor"), newActor("admin")

	// Tokens before the outage: a few leases of the free identity, and a
	// lease held through the outage.
	free, heldID := freshIdentity(), freshIdentity()
	var before uint64
	for i := 0; i < 3; i++ {
		res, err := stores[i%2].Acquire(bgCtx, owner.acquire(free, time.Minute))
		rec := must(t, "acquire before the outage", res, err, lease.CodeAcquired)
		before = max(before, rec.FencingToken)
		res, err = stores[(i+1)%2].Release(bgCtx, owner.release(rec))
		must(t, "release before the outage", res, err, lease.CodeReleased)
	}
	res, err := stores[0].Acquire(bgCtx, owner.acquire(heldID, 10*time.Minute))
	held := must(t, "acquire the lease held through the outage", res, err, lease.CodeAcquired)
	cases := quorumCases(owner, admin, free, held)

	// The background load: acquisitions of fresh identities, one after
	// another through each server, until the outage is over.
	stopLoad := make(chan struct{})
	loadDone := make(chan []inFlight, 2)
	for si, s := range stores {
		go func() {
			var out []inFlight
			for {
				select {
				case <-stopLoad:
					loadDone <- out
					return
				default:
				}
				req := owner.acquire(freshIdentity(), time.Minute)
				ctx, cancel := context.WithTimeout(bgCtx, time.Second)
				req.DeadlineAt = time.Now().Add(time.Second)
				_, err := s.Acquire(ctx, req)
				cancel()
				out = append(out, inFlight{server: si, req: req, code: lease.CodeOf(err)})
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)

	li, _ := c.WaitLeader(20 * time.Second)
	var stopped []int
	for i := 0; i < c.Size(); i++ {
		if i != li {
			c.Member(i).Stop()
			stopped = append(stopped, i)
		}
	}
	t.Logf("quorum: stopped %s and %s; %s, the leader, is alone", c.Member(stopped[0]).Name(), c.Member(stopped[1]).Name(), c.Member(li).Name())

	const deadline = time.Second
	const slack = 2 * time.Second // scheduling on a loaded machine, -race
	var mu sync.Mutex
	var slowest time.Duration
	inDoubt := map[string]bool{}
	answers := map[lease.Code]int{}
	// Two rounds through each server, every request of a round at once:
	// just after the stop (the leader may not know yet) and once it surely
	// stepped down.
	for round := 0; round < 2; round++ {
		if round == 1 {
			time.Sleep(3 * testenv.EtcdElectionTimeout)
		}
		var wg sync.WaitGroup
		for si, s := range stores {
			for _, mc := range cases {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					code, _, err := mc.send(s, deadline)
					took := time.Since(start)
					typed(t, mc.name+" without quorum", err)
					mu.Lock()
					defer mu.Unlock()
					slowest = max(slowest, took)
					answers[code]++
					switch code {
					case lease.CodeBackendUnavailable:
					case lease.CodeOutcomeUnknown:
						inDoubt[mc.name] = true
					default:
						t.Errorf("quorum: %s through server %c without quorum answered %s, want backend_unavailable or outcome_unknown", mc.name, 'a'+si, code)
					}
					if took > deadline+slack {
						t.Errorf("quorum: %s through server %c answered after %v, past its %v deadline", mc.name, 'a'+si, took.Round(time.Millisecond), deadline)
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(bgCtx, deadline)
				_, err := s.Inspect(ctx, owner.inspect(heldID))
				cancel()
				typed(t, "inspect without quorum", err)
				if lease.CodeOf(err) != lease.CodeBackendUnavailable {
					t.Errorf("quorum: inspect through server %c without quorum: %v, want backend_unavailable", 'a'+si, err)
				}
				lookup := *cases[0].lookup
				lookup.DeadlineAt = time.Now().Add(deadline)
				ctx, cancel = context.WithTimeout(bgCtx, deadline)
				_, err = s.LookupRequest(ctx, lookup)
				cancel()
				typed(t, "lookup without quorum", err)
				if lease.CodeOf(err) != lease.CodeBackendUnavailable {
					t.Errorf("quorum: lookup through server %c without quorum: %v, want backend_unavailable", 'a'+si, err)
				}
				ctx, cancel = context.WithTimeout(bgCtx, deadline)
				h := s.Health(ctx)
				cancel()
				if h.Status != lease.HealthUnavailable {
					t.Errorf("quorum: health of server %c without quorum is %s (%s), want unavailable", 'a'+si, h.Status, h.Reason)
				}
			}()
		}
		wg.Wait()
	}
	t.Logf("quorum: without quorum %d mutations answered backend_unavailable=%d outcome_unknown=%d (in doubt: %v); deadline %v, slowest answer %dms",
		2*2*len(cases), answers[lease.CodeBackendUnavailable], answers[lease.CodeOutcomeUnknown],
		slices.Sorted(maps.Keys(inDoubt)), deadline, slowest.Milliseconds())

	restarted := time.Now()
	for _, i := range stopped {
		c.Member(i).Restart()
	}
	c.WaitLeader(30 * time.Second)
	// No operator step: the same servers answer again.
	var resumed time.Duration
	for {
		ctx, cancel := context.WithTimeout(bgCtx, deadline)
		h := stores[0].Health(ctx)
		cancel()
		if h.Status == lease.HealthOK {
			resumed = time.Since(restarted)
			break
		}
		if time.Since(restarted) > 30*time.Second {
			t.Fatalf("quorum: health still %s (%s) 30 s after the restart", h.Status, h.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("quorum: members restarted; health ok after %dms", resumed.Milliseconds())

	// Resolve every mutation by request id, in doubt or not: what it did
	// is now known. The outage's acquisition of the free identity may
	// have committed (once quorum returned); its token then counts too.
	resolved := map[string]string{}
	var lateAcquire *lease.Record
	for i, mc := range cases {
		s := stores[i%2]
		how := ""
		if mc.lookup != nil {
			req := *mc.lookup
			req.DeadlineAt = time.Now().Add(5 * time.Second)
			res, err := s.LookupRequest(bgCtx, req)
			switch {
			case err == nil:
				how = "lookup found " + string(res.Code)
				if mc.name == "acquire" {
					lateAcquire = res.Lease
				}
			case lease.CodeOf(err) != lease.CodeNotFound:
				t.Errorf("quorum: lookup of %s after the restart: %v", mc.name, err)
			}
		}
		if how == "" {
			var code lease.Code
			var rec *lease.Record
			for try := 0; try < 5; try++ {
				if code, rec, _ = mc.send(s, 5*time.Second); code != lease.CodeOutcomeUnknown && code != lease.CodeBackendUnavailable {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if code == lease.CodeOutcomeUnknown || code == lease.CodeBackendUnavailable {
				t.Errorf("quorum: %s sent again after the restart still answers %s", mc.name, code)
			}
			how = "sent again: " + string(code)
			if mc.name == "acquire" && rec != nil {
				lateAcquire = rec
			}
		}
		resolved[mc.name] = how
		if inDoubt[mc.name] {
			t.Logf("quorum: outcome_unknown of %s resolved by request id: %s", mc.name, how)
		}
	}
	t.Logf("quorum: every mutation resolved by request id: %v", resolved)

	// The background load's outcome_unknown acquisitions, each of a fresh
	// identity: a lookup finds the lease, or the request sent again
	// acquires it (or replays it), always with token 1.
	close(stopLoad)
	load := append(<-loadDone, <-loadDone...)
	var loadDoubt, foundLate int
	for i, f := range load {
		if f.code != lease.CodeOutcomeUnknown {
			continue
		}
		loadDoubt++
		s := stores[i%2]
		res, err := s.LookupRequest(bgCtx, lease.LookupRequest{Op: lease.OpAcquire, Identity: f.req.Identity,
			PrincipalID: owner.caller.PrincipalID, RequestID: f.req.RequestID, DeadlineAt: time.Now().Add(5 * time.Second)})
		switch {
		case err == nil:
			foundLate++
		case lease.CodeOf(err) == lease.CodeNotFound:
			req := f.req
			req.DeadlineAt = time.Now().Add(5 * time.Second)
			res, err = s.Acquire(bgCtx, req)
			if err != nil {
				t.Errorf("quorum: in-doubt acquisition sent again after the restart: %v", err)
				continue
			}
		default:
			t.Errorf("quorum: lookup of an in-doubt acquisition after the restart: %v", err)
			continue
		}
		if res.Code != lease.CodeAcquired || res.Lease == nil || res.Lease.FencingToken != 1 {
			t.Errorf("quorum: in-doubt acquisition of a fresh identity resolved as %s %+v, want lease_acquired with token 1", res.Code, res.Lease)
		}
	}
	t.Logf("quorum: background load made %d acquisitions; %d answered outcome_unknown, resolved by request id (%d found by lookup)",
		len(load), loadDoubt, foundLate)

	// A new acquisition gets a token above every token before.
	if lateAcquire != nil {
		before = max(before, lateAcquire.FencingToken)
		if lateAcquire.State == lease.StateActive {
			if _, err := stores[1].Release(bgCtx, owner.release(lateAcquire)); err != nil && lease.CodeOf(err) != lease.CodeLost {
				t.Fatalf("quorum: release the outage's acquisition: %v", err)
			}
		}
	}
	res, err = stores[1].Acquire(bgCtx, owner.acquire(free, time.Minute))
	rec := must(t, "acquire after the restart", res, err, lease.CodeAcquired)
	if rec.FencingToken <= before {
		t.Errorf("quorum: token %d after the outage is not above %d, the highest before", rec.FencingToken, before)
	}
	t.Logf("quorum: acquisition after the restart got token %d (highest before %d)", rec.FencingToken, before)

	// The lease held through the outage is in a definite state: every
	// mutation on it was resolved, so it ended, with its token.
	ctx, cancel := context.WithTimeout(bgCtx, 5*time.Second)
	defer cancel()
	res, err = stores[0].Inspect(ctx, lease.InspectRequest{LeaseID: held.LeaseID, DeadlineAt: time.Now().Add(5 * time.Second), Caller: owner.caller})
	if err != nil {
		t.Fatalf("quorum: inspect the held lease after the restart: %v", err)
	}
	if res.Lease.LeaseID != held.LeaseID || res.Lease.FencingToken != held.FencingToken || !res.Lease.State.Terminal() {
		t.Errorf("quorum: the lease held through the outage reads back as %s#%d %s, want %s#%d ended",
			res.Lease.LeaseID, res.Lease.FencingToken, res.Lease.State, held.LeaseID, held.FencingToken)
	}
	t.Logf("quorum: the lease held through the outage is %s", res.Lease.State)
}
