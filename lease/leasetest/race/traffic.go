package race

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/starintel/starlease/lease"
)

// This file is the operation mix (etcd's tests/robustness/traffic): workers
// that each pick an identity and an operation at random, over and over, and
// record every call.
//
// Outcome unknown. A worker that gets outcome_unknown resolves it the
// contract's way before doing anything else: it sends the same request (same
// request id, or same commit id) again, which either replays the committed
// result or performs the operation now, exactly once. The recorded operation
// spans from the first call to the resolving return and carries the resolved
// answer, so the model sees one operation that took effect once somewhere in
// that interval. With Options.ResolveByLookup a mutation's outcome_unknown
// is resolved by LookupRequest first, and its request sent again only when
// the lookup finds no stored result. If the retries do not resolve it, the
// identity is tainted:
// the run fails with the reason and that identity's history is not checked,
// since the model cannot know whether or when the operation took effect.

// resolveAttempts bounds the retries that resolve an outcome_unknown.
const resolveAttempts = 8

// uid returns prefix followed by 16 random hex digits.
func uid(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// Sinks are the commit sinks the traffic authorizes commits on.
var Sinks = []string{"couchdb", "rabbitmq"}

// held is a lease a worker got back from the store (or saw by inspecting).
type held struct {
	leaseID   string
	token     uint64
	owner     lease.Caller
	instance  string
	execution string
	job       string
	trace     string
}

// world is what the workers share.
type world struct {
	// stores share one backend; each operation picks one.
	stores []lease.Store
	opts   Options
	ids    []lease.Identity
	admin  lease.Caller
	hist   *History
	until  time.Time

	// writes are the guarded sink writes the traffic makes after its
	// authorizations (guarded.go).
	writes *guardedWrites

	mu sync.Mutex
	// seen are leases anyone saw, per identity, newest last: the targets of
	// administrative operations and of requests by a wrong owner.
	seen [][]held
}

func (w *world) saw(ident int, h held) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.seen[ident]
	for _, x := range s {
		if x.leaseID == h.leaseID {
			return
		}
	}
	if len(s) >= 32 {
		s = s[1:]
	}
	w.seen[ident] = append(s, h)
}

// pickSeen returns the newest lease seen (mostly) or an older one.
func (w *world) pickSeen(rng *mrand.Rand, ident int) (held, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return pick(rng, w.seen[ident])
}

func pick(rng *mrand.Rand, s []held) (held, bool) {
	if len(s) == 0 {
		return held{}, false
	}
	if rng.IntN(10) < 7 {
		return s[len(s)-1], true
	}
	return s[rng.IntN(len(s))], true
}

type worker struct {
	w        *world
	idx      int
	caller   lease.Caller
	instance string
	rng      *mrand.Rand
	// mine are the leases this worker acquired, per identity, newest last.
	mine [][]held
	// holding are the identities whose newest lease this worker believes
	// it still holds (it acquired or renewed it and has not lost it).
	holding map[int]bool
	// found is the result the last resolving LookupRequest returned.
	found *lease.Result
}

func newCaller(class string) lease.Caller {
	return lease.Caller{PrincipalID: uid("prn_" + class + "_"), PrincipalClass: class,
		ClientID: uid("client_"), CredentialID: uid("key_"), CorrelationID: uid("corr_")}
}

// newIdentity is a canonical identity no other run uses.
func newIdentity() lease.Identity {
	return lease.Identity{TenantID: uid("tenant-"), ProgramID: uid("program-"), TargetNamespace: "starintel-target",
		TargetID: uid("target_"), ActorName: "racer", WorkflowName: "default", OperationClass: "default"}
}

// traffic runs the workers until each has done OpsPerWorker operations,
// Duration has passed or Stop is closed.
func traffic(ctx context.Context, stores []lease.Store, o Options, hist *History) {
	w := &world{stores: stores, opts: o, admin: newCaller("admin"), hist: hist,
		until: time.Now().Add(o.Duration), seen: make([][]held, o.Identities)}
	for range o.Identities {
		w.ids = append(w.ids, newIdentity())
	}
	w.writes = newGuardedWrites(w.ids)
	hist.Writes = w.writes
	var wg sync.WaitGroup
	for i := range o.Workers {
		wk := &worker{w: w, idx: i, caller: newCaller("actor"), instance: uid("instance_"),
			rng: mrand.New(mrand.NewPCG(uint64(o.Seed), uint64(i))), mine: make([][]held, o.Identities),
			holding: map[int]bool{}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < o.OpsPerWorker && time.Now().Before(w.until) && ctx.Err() == nil && !w.stopped(); n++ {
				wk.step(ctx)
			}
		}()
	}
	wg.Wait()
}

// stopped reports whether Options.Stop was closed.
func (w *world) stopped() bool {
	select {
	case <-w.opts.Stop:
		return true
	default:
		return false
	}
}

func (k *worker) deadline() time.Time { return time.Now().Add(k.w.opts.CallTimeout) }

func (k *worker) mutation(c lease.Caller) lease.Mutation {
	return lease.Mutation{RequestID: uid("req_"), DeadlineAt: k.deadline(), Caller: c}
}

// ttl is the configured TTL give or take a quarter, in whole milliseconds.
func (k *worker) ttl() time.Duration {
	base := k.w.opts.TTL.Milliseconds()
	return time.Duration(base*3/4+k.rng.Int64N(base/2+1)) * time.Millisecond
}

// step does one operation: mostly, if the worker holds a lease, what a
// holder does (renew, commit, release); otherwise a random operation.
func (k *worker) step(ctx context.Context) {
	if ident, ok := k.held(); ok && k.rng.IntN(100) < 60 {
		h := k.mine[ident][len(k.mine[ident])-1]
		switch r := k.rng.IntN(100); {
		case r < 36:
			k.renew(ctx, ident, h, k.caller, h.instance)
		case r < 78:
			k.commit(ctx, ident, h, k.caller, h.instance)
		case r < 88:
			k.release(ctx, ident, h, k.caller, h.instance)
		case r < 90:
			// The right owner from a wrong service instance: lost, even
			// though the lease is live.
			k.renew(ctx, ident, h, k.caller, uid("instance_"))
		case r < 92:
			k.commit(ctx, ident, h, k.caller, uid("instance_"))
		case r < 94:
			k.release(ctx, ident, h, k.caller, uid("instance_"))
		default:
			// A holder that stops renewing: the lease expires, and the
			// worker's stale requests on it must be lost.
			k.holding[ident] = false
		}
		return
	}
	ident := k.rng.IntN(len(k.w.ids))
	r := k.rng.IntN(100)
	switch {
	case r < 24:
		k.acquire(ctx, ident)
	case r < 50 || (r >= 54 && r < 76):
		// Requests on leases this worker holds or held, or other workers'.
		h, c, inst, ok := k.target(ident)
		switch {
		case !ok:
			k.acquire(ctx, ident)
		case r < 42:
			k.renew(ctx, ident, h, c, inst)
		case r < 50:
			k.release(ctx, ident, h, c, inst)
		default:
			k.commit(ctx, ident, h, c, inst)
		}
	case r < 54:
		k.admin(ctx, ident, []lease.Op{lease.OpForceRelease, lease.OpRevoke}[r%2])
	case r < 86:
		k.inspect(ctx, ident)
	case r < 92:
		k.inspectID(ctx, ident)
	default:
		// A stalled worker: the leases it holds may expire meanwhile.
		ttl := k.w.opts.TTL
		time.Sleep(ttl/4 + time.Duration(k.rng.Int64N(int64(ttl))))
	}
}

// held returns an identity whose newest lease the worker believes it holds.
func (k *worker) held() (int, bool) {
	for ident := range k.w.ids {
		if k.holding[ident] {
			return ident, true
		}
	}
	return 0, false
}

// note updates what the worker believes it holds after an answer on its
// newest lease of ident.
func (k *worker) note(ident int, h held, out Output) {
	mine := k.mine[ident]
	if len(mine) == 0 || mine[len(mine)-1].leaseID != h.leaseID {
		return
	}
	switch out.Code {
	case lease.CodeRenewed, lease.CodeCommitAuthorized:
	default:
		k.holding[ident] = false
	}
}

// target picks a lease this worker holds or held (mostly the newest, on
// purpose sometimes a stale one); sometimes one somebody else holds or held,
// or a wrong service instance, which must be lost. It asks the caller and
// instance to use.
func (k *worker) target(ident int) (held, lease.Caller, string, bool) {
	h, ok := pick(k.rng, k.mine[ident])
	switch r := k.rng.IntN(100); {
	case !ok || r < 8:
		if h, ok = k.w.pickSeen(k.rng, ident); !ok {
			return held{}, lease.Caller{}, "", false
		}
		return h, k.caller, k.instance, true
	case r < 12:
		return h, k.caller, uid("instance_"), true
	}
	return h, k.caller, h.instance, true
}

// store picks the store of an operation's first call: one at random
// when there are several (the rng is not drawn from with one store, so a
// seed replays the same operation mix).
func (k *worker) store() int {
	if n := len(k.w.stores); n > 1 {
		return k.rng.IntN(n)
	}
	return 0
}

// call records one operation. do is called again with the same request
// while the answer is outcome_unknown, each time on the next store. With
// Options.ResolveByLookup and lookup set (a mutation), a LookupRequest by
// its request id comes first: its stored result is the answer, and the
// request is sent again only when it finds none.
func (k *worker) call(ident int, in Input, lookup *lease.LookupRequest, do func(lease.Store) Output) Output {
	hist := k.w.hist
	start := hist.now()
	first := k.store()
	var out Output
	lookups := 0
	for attempt := 1; ; attempt++ {
		st := k.w.stores[(first+attempt-1)%len(k.w.stores)]
		out = do(st)
		out.Attempts, out.Lookups = attempt, lookups
		if out.Code != lease.CodeOutcomeUnknown {
			break
		}
		if lookup != nil && k.w.opts.ResolveByLookup {
			found, ok, n := k.lookup(first+attempt, lookup)
			lookups += n
			if ok {
				out = resultOutput(found, nil)
				out.Attempts, out.Lookups, out.ByLookup = attempt+1, lookups, true
				k.found = &found
				break
			}
		}
		if attempt == resolveAttempts {
			hist.Taint(ident, "outcome_unknown of "+string(in.Kind)+" "+in.RequestID+
				" not resolved by "+strconv.Itoa(resolveAttempts)+" calls with the same request id")
			return out
		}
		time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
	}
	hist.Add(k.idx, in, start, out, hist.now())
	return out
}

// lookup asks the stores, from store number from on, for the stored
// result of the mutation lookup names, until one answers: ok with the
// result, or not ok when there is none (or no store could tell; the
// request is then sent again, which resolves it just as well). n counts
// the calls.
func (k *worker) lookup(from int, lookup *lease.LookupRequest) (res lease.Result, ok bool, n int) {
	for i := range k.w.stores {
		req := *lookup
		req.DeadlineAt = k.deadline()
		res, err := k.w.stores[(from+i)%len(k.w.stores)].LookupRequest(context.Background(), req)
		n++
		switch {
		case err == nil:
			return res, true, n
		case lease.CodeOf(err) == lease.CodeNotFound:
			return lease.Result{}, false, n
		}
		time.Sleep(20 * time.Millisecond)
	}
	return lease.Result{}, false, n
}

func (k *worker) acquire(ctx context.Context, ident int) {
	ttl := k.ttl()
	req := lease.AcquireRequest{Identity: k.w.ids[ident], ServiceInstanceID: k.instance, TTL: ttl,
		MaximumLifetime: k.w.opts.MaxLifetime, ExecutionID: uid("execution_"), JobID: uid("job_"),
		TraceID: uid("trace_"), Mutation: k.mutation(k.caller)}
	in := Input{Kind: KindAcquire, Ident: ident, Owner: k.caller.PrincipalID, Instance: k.instance,
		TTLMs: ttl.Milliseconds(), MaxLifetimeMs: k.w.opts.MaxLifetime.Milliseconds(), RequestID: req.RequestID}
	var rec *lease.Record
	lookup := &lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: k.caller.PrincipalID, RequestID: req.RequestID}
	out := k.call(ident, in, lookup, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		res, err := st.Acquire(ctx, req)
		if err == nil {
			rec = res.Lease
		}
		return resultOutput(res, err)
	})
	if out.ByLookup && out.Code == lease.CodeAcquired {
		rec = k.found.Lease
	}
	if rec != nil {
		k.w.hist.ack(Ack{Ident: ident, Acquire: &req, Lease: rec})
		h := held{leaseID: rec.LeaseID, token: rec.FencingToken, owner: k.caller, instance: k.instance,
			execution: req.ExecutionID, job: req.JobID, trace: req.TraceID}
		if len(k.mine[ident]) >= 16 {
			k.mine[ident] = k.mine[ident][1:]
		}
		k.mine[ident] = append(k.mine[ident], h)
		k.holding[ident] = true
		k.w.saw(ident, h)
	}
}

func (k *worker) renew(ctx context.Context, ident int, h held, c lease.Caller, inst string) {
	var ttl time.Duration
	if k.rng.IntN(2) == 0 {
		ttl = k.ttl()
	}
	req := lease.RenewRequest{Identity: k.w.ids[ident], LeaseID: h.leaseID, FencingToken: h.token,
		ServiceInstanceID: inst, TTL: ttl, Mutation: k.mutation(c)}
	in := Input{Kind: KindRenew, Ident: ident, Owner: c.PrincipalID, Instance: inst, LeaseID: h.leaseID,
		Token: h.token, TTLMs: ttl.Milliseconds(), RequestID: req.RequestID}
	lookup := &lease.LookupRequest{Op: lease.OpRenew, Identity: req.Identity, PrincipalID: c.PrincipalID, RequestID: req.RequestID}
	out := k.call(ident, in, lookup, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		return resultOutput(st.Renew(ctx, req))
	})
	if c == k.caller && inst == h.instance {
		k.note(ident, h, out)
	}
}

func (k *worker) release(ctx context.Context, ident int, h held, c lease.Caller, inst string) {
	req := lease.ReleaseRequest{Identity: k.w.ids[ident], LeaseID: h.leaseID, FencingToken: h.token,
		ServiceInstanceID: inst, Mutation: k.mutation(c)}
	in := Input{Kind: KindRelease, Ident: ident, Owner: c.PrincipalID, Instance: inst, LeaseID: h.leaseID,
		Token: h.token, RequestID: req.RequestID}
	lookup := &lease.LookupRequest{Op: lease.OpRelease, Identity: req.Identity, PrincipalID: c.PrincipalID, RequestID: req.RequestID}
	out := k.call(ident, in, lookup, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		return resultOutput(st.Release(ctx, req))
	})
	if c == k.caller && inst == h.instance {
		k.note(ident, h, out)
	}
}

func (k *worker) admin(ctx context.Context, ident int, op lease.Op) {
	h, ok := k.w.pickSeen(k.rng, ident)
	if !ok {
		k.inspect(ctx, ident)
		return
	}
	req := lease.AdminRequest{Identity: k.w.ids[ident], LeaseID: h.leaseID, FencingToken: h.token,
		Reason: "race suite: operator action", Mutation: k.mutation(k.w.admin)}
	kind := KindForceRelease
	if op == lease.OpRevoke {
		kind = KindRevoke
	}
	in := Input{Kind: kind, Ident: ident, Owner: k.w.admin.PrincipalID, LeaseID: h.leaseID, Token: h.token,
		RequestID: req.RequestID}
	lookup := &lease.LookupRequest{Op: op, Identity: req.Identity, PrincipalID: k.w.admin.PrincipalID, RequestID: req.RequestID}
	k.call(ident, in, lookup, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		if op == lease.OpRevoke {
			return resultOutput(st.Revoke(ctx, req))
		}
		return resultOutput(st.ForceRelease(ctx, req))
	})
}

func (k *worker) commit(ctx context.Context, ident int, h held, c lease.Caller, inst string) {
	sink := Sinks[k.rng.IntN(len(Sinks))]
	doc := k.w.writes.doc(k.rng, ident)
	req := lease.CommitRequest{Identity: k.w.ids[ident], LeaseID: h.leaseID, FencingToken: h.token,
		ServiceInstanceID: inst, Sink: sink, CommitID: uid("commit_"), ExecutionID: h.execution, JobID: h.job,
		TraceID: h.trace, Target: doc.ID, PayloadSHA256: bodyDigest(doc.Body), Caller: c}
	in := Input{Kind: KindCommit, Ident: ident, Owner: c.PrincipalID, Instance: inst, LeaseID: h.leaseID,
		Token: h.token, Sink: sink, RequestID: req.CommitID}
	var res lease.CommitResult
	out := k.call(ident, in, nil, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		var err error
		res, err = st.AuthorizeCommit(ctx, req)
		return commitOutput(res, err)
	})
	if c == k.caller && inst == h.instance {
		k.note(ident, h, out)
	}
	if out.Code == lease.CodeCommitAuthorized {
		accepted := res.Commit
		k.w.hist.ack(Ack{Ident: ident, Commit: &req, Accepted: &accepted})
		k.w.writes.authorized(ctx, k.rng, ident, res.Commit, doc)
	}
}

func (k *worker) inspect(ctx context.Context, ident int) {
	req := lease.InspectRequest{Identity: k.w.ids[ident], Caller: k.caller}
	in := Input{Kind: KindInspect, Ident: ident, RequestID: uid("corr_")}
	var rec *lease.Record
	k.call(ident, in, nil, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		res, err := st.Inspect(ctx, req)
		if err == nil {
			rec = res.Lease
		}
		return resultOutput(res, err)
	})
	if rec != nil && rec.State == lease.StateActive {
		k.w.saw(ident, held{leaseID: rec.LeaseID, token: rec.FencingToken, instance: rec.ServiceInstanceID,
			execution: rec.ExecutionID, job: rec.JobID, trace: rec.TraceID})
	}
}

func (k *worker) inspectID(ctx context.Context, ident int) {
	h, ok := pick(k.rng, k.mine[ident])
	if !ok || k.rng.IntN(2) == 0 {
		if h, ok = k.w.pickSeen(k.rng, ident); !ok {
			k.inspect(ctx, ident)
			return
		}
	}
	req := lease.InspectRequest{LeaseID: h.leaseID, Caller: k.caller}
	in := Input{Kind: KindInspectID, Ident: ident, LeaseID: h.leaseID, Token: h.token, RequestID: uid("corr_")}
	k.call(ident, in, nil, func(st lease.Store) Output {
		req.DeadlineAt = k.deadline()
		return resultOutput(st.Inspect(ctx, req))
	})
}
