package fence_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

var _ fence.Authorizer = lease.Store(nil)

// clock is a settable backend clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var identity = lease.Identity{TenantID: "tenant-main", ProgramID: "program-a",
	TargetNamespace: "starintel-target", TargetID: "target-1", ActorName: "usernamegen"}

var (
	actor = lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}
	admin = lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}
)

const ttl = 10 * time.Second

type env struct {
	t     *testing.T
	store *bolt.Store
	clock *clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	c := &clock{t: time.Now().Truncate(time.Millisecond)}
	s, err := bolt.Open(filepath.Join(t.TempDir(), "lease.db"), bolt.Options{Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &env{t: t, store: s, clock: c}
}

// far is a deadline the tests never reach: the backend clock is settable, so
// deadlines are relative to it.
func (e *env) far() time.Time { return e.clock.Now().Add(time.Hour) }

func (e *env) acquire(instance, requestID string) *lease.Record {
	e.t.Helper()
	res, err := e.store.Acquire(context.Background(), lease.AcquireRequest{Identity: identity,
		ServiceInstanceID: instance, TTL: ttl, MaximumLifetime: time.Hour,
		ExecutionID: "exec-" + instance, JobID: "job-1", TraceID: "trace-" + instance,
		Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: e.far(), Caller: actor}})
	if err != nil {
		e.t.Fatalf("acquire: %v", err)
	}
	return res.Lease
}

func (e *env) committer(rec *lease.Record, opts ...fence.Option) *fence.Committer {
	opts = append([]fence.Option{fence.WithClock(e.clock.Now)}, opts...)
	return fence.NewCommitter(e.store, fence.EnvelopeOf(rec), actor, opts...)
}

func code(err error) lease.Code { return lease.CodeOf(err) }

func TestWriteCarriesTheGuard(t *testing.T) {
	e := newEnv(t)
	rec := e.acquire("instance-a", "req-a")
	c := e.committer(rec)
	sink := fencetest.NewMemorySink("results")
	g, err := fence.Write(context.Background(), c, sink, "commit-1", fencetest.Doc{ID: "result-1", Body: "open ports: 80"})
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	want := fence.Guard{LockKey: rec.LockKey, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ExecutionID: rec.ExecutionID, JobID: rec.JobID, TraceID: rec.TraceID, Sink: "results", CommitID: "commit-1",
		Target: "result-1", PayloadSHA256: "e7a5dcaad5eed263e52941a57b7a93aebad107f3fda0d2d3929839ac989a0db3", // SHA-256 of the body
		CommitSeq: 1, AcceptedAt: g.AcceptedAt}
	if g != want || g.AcceptedAt.IsZero() {
		t.Fatalf("guard %+v, want %+v", g, want)
	}
	got, ok := sink.Get("result-1")
	if !ok || got.Guard != g || got.Body != "open ports: 80" || got.Rev != 1 {
		t.Fatalf("stored %+v", got)
	}
	if env := c.Envelope(); env.LockKey != rec.LockKey || env.ExpiresAt != rec.ExpiresAt || env.Validate() != nil {
		t.Fatalf("envelope %+v", env)
	}
}

// An expired holder's commit is lease_lost and never reaches the sink; the
// successor's commit is accepted; the holder's earlier guard is refused by
// the sink because its token is lower. The sink holds only accepted writes.
func TestExpiredHolderIsFencedOut(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sink := fencetest.NewMemorySink("target-state")
	first := e.acquire("instance-a", "req-a")
	var lossA fencetest.LossRecorder
	a := e.committer(first, fence.WithLossHandler(lossA.Handler))
	gA, err := fence.Write(ctx, a, sink, "a-1", fencetest.Doc{ID: "target", Body: "state from a"})
	if err != nil {
		t.Fatal(err)
	}

	e.clock.Add(ttl + time.Millisecond) // a's lease expires at backend time
	if _, err := fence.Write(ctx, a, sink, "a-2", fencetest.Doc{ID: "target", Body: "late state from a"}); code(err) != lease.CodeLost {
		t.Fatalf("expired holder's write: %v, want lease_lost", err)
	}
	if got := lossA.Seen(); !reflect.DeepEqual(got, []lease.Code{lease.CodeLost}) {
		t.Fatalf("loss handler saw %v", got)
	}

	second := e.acquire("instance-b", "req-b")
	if second.FencingToken <= first.FencingToken {
		t.Fatalf("successor token %d not above %d", second.FencingToken, first.FencingToken)
	}
	b := e.committer(second)
	gB, err := fence.Write(ctx, b, sink, "b-1", fencetest.Doc{ID: "target", Body: "state from b"})
	if err != nil {
		t.Fatalf("successor write: %v", err)
	}
	// a commits again after the successor acquired: lease_lost.
	if _, err := fence.Write(ctx, a, sink, "a-3", fencetest.Doc{ID: "target", Body: "stale"}); code(err) != lease.CodeLost {
		t.Fatalf("stale holder after successor: %v", err)
	}
	// a replays its old, once valid guard straight into the sink: lower token.
	if err := sink.Commit(ctx, gA, fencetest.Doc{ID: "target", Body: "replayed by a"}); code(err) != lease.CodeCommitRejected {
		t.Fatalf("lower-token write: %v, want commit_rejected", err)
	}

	want := []fencetest.Stored{{ID: "target", Body: "state from b", Guard: gB, Rev: 2}}
	if got := sink.Docs(); !reflect.DeepEqual(got, want) {
		t.Fatalf("sink holds %+v, want %+v", got, want)
	}
	accepted := sink.Accepted()
	if len(accepted) != 2 || accepted[0].Guard != gA || accepted[1].Guard != gB {
		t.Fatalf("accepted writes %+v", accepted)
	}
	if n := len(sink.Rejected()); n != 1 {
		t.Fatalf("%d rejected writes reached the sink, want 1", n)
	}
}

// A check followed by an unconditional write is not fencing: a holder that
// was authorized while valid, then paused past its expiry while a successor
// wrote, is stopped only by the sink's conditional write.
func TestAuthorizedThenPausedHolderIsStoppedByTheSink(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sink := fencetest.NewMemorySink("target-state")
	first := e.acquire("instance-a", "req-a")
	var lossA fencetest.LossRecorder
	a := e.committer(first, fence.WithLossHandler(lossA.Handler))
	commit, err := a.Authorize(ctx, sink.Name(), "a-1", mustBind(t, sink, fencetest.Doc{ID: "target", Body: "from a"}))
	if err != nil {
		t.Fatal(err)
	}
	gA := a.Guard(commit)

	e.clock.Add(ttl + time.Second) // a pauses past its expiry
	second := e.acquire("instance-b", "req-b")
	gB, err := fence.Write(ctx, e.committer(second), sink, "b-1", fencetest.Doc{ID: "target", Body: "from b"})
	if err != nil {
		t.Fatal(err)
	}
	// a resumes and writes with the guard it got before the pause.
	if err := sink.Commit(ctx, gA, fencetest.Doc{ID: "target", Body: "from a"}); code(err) != lease.CodeCommitRejected {
		t.Fatalf("paused holder's write: %v, want commit_rejected", err)
	}
	if got, _ := sink.Get("target"); got.Body != "from b" || got.Guard != gB {
		t.Fatalf("sink holds %+v", got)
	}
}

func TestAdministrativeInvalidationIsRejected(t *testing.T) {
	for _, op := range []lease.Op{lease.OpRevoke, lease.OpForceRelease} {
		t.Run(string(op), func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			rec := e.acquire("instance-a", "req-a")
			sink := fencetest.NewMemorySink("jobs")
			c := e.committer(rec)
			if _, err := fence.Write(ctx, c, sink, "c-1", fencetest.Doc{ID: "job", Body: "checkpoint 1"}); err != nil {
				t.Fatal(err)
			}
			req := lease.AdminRequest{Identity: identity, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
				Reason: "incident drill", Mutation: lease.Mutation{RequestID: "req-admin", DeadlineAt: e.far(), Caller: admin}}
			var err error
			if op == lease.OpRevoke {
				_, err = e.store.Revoke(ctx, req)
			} else {
				_, err = e.store.ForceRelease(ctx, req)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fence.Write(ctx, c, sink, "c-2", fencetest.Doc{ID: "job", Body: "checkpoint 2"}); code(err) != lease.CodeLost {
				t.Fatalf("write after %s: %v, want lease_lost", op, err)
			}
			if got, _ := sink.Get("job"); got.Body != "checkpoint 1" || got.Rev != 1 {
				t.Fatalf("sink holds %+v", got)
			}
		})
	}
}

// flaky forwards to the store, then (for the first n calls) drops the answer
// and reports outcome_unknown, as a timeout after submission would.
type flaky struct {
	fence.Authorizer
	mu      sync.Mutex
	n       int
	ids     []string
	results []lease.CommitResult
}

func (f *flaky) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	res, err := f.Authorizer.AuthorizeCommit(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids = append(f.ids, req.CommitID)
	f.results = append(f.results, res)
	if len(f.ids) <= f.n {
		return lease.CommitResult{}, &lease.Error{Code: lease.CodeOutcomeUnknown, Reason: "timeout after submission"}
	}
	return res, err
}

func TestOutcomeUnknownIsRetriedWithTheSameCommitID(t *testing.T) {
	e := newEnv(t)
	rec := e.acquire("instance-a", "req-a")
	f := &flaky{Authorizer: e.store, n: 2}
	c := fence.NewCommitter(f, fence.EnvelopeOf(rec), actor, fence.WithBackoff(time.Millisecond))
	commit, err := c.Authorize(context.Background(), "results", "commit-7", fence.Binding{Target: "doc-7"})
	if err != nil {
		t.Fatalf("authorize: %v", err)
	}
	if !reflect.DeepEqual(f.ids, []string{"commit-7", "commit-7", "commit-7"}) {
		t.Fatalf("commit ids sent: %v", f.ids)
	}
	// The first attempt committed; the retries replayed it.
	if f.results[0].Replayed || !f.results[1].Replayed || !f.results[2].Replayed || commit != f.results[0].Commit {
		t.Fatalf("results %+v, commit %+v", f.results, commit)
	}

	// Never resolved: outcome_unknown after the bounded attempts.
	g := &flaky{Authorizer: e.store, n: 100}
	c = fence.NewCommitter(g, fence.EnvelopeOf(rec), actor, fence.WithBackoff(time.Millisecond), fence.WithAttempts(3))
	if _, err := c.Authorize(context.Background(), "results", "commit-8", fence.Binding{Target: "doc-8"}); code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("unresolved: %v", err)
	}
	if len(g.ids) != 3 {
		t.Fatalf("%d attempts, want 3", len(g.ids))
	}
}

// fixed answers every call with one result or error.
type fixed struct {
	mu    sync.Mutex
	calls int
	res   lease.CommitResult
	err   error
}

func (f *fixed) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.res, f.err
}

func TestTypedErrorsPassThrough(t *testing.T) {
	env := fence.Envelope{LockKey: fencetest.LockKey("x"), Identity: identity, LeaseID: "lease-1", FencingToken: 3,
		ExecutionID: "exec-1", ServiceInstanceID: "instance-a", OwnerPrincipalID: "prn-actor"}
	for _, tc := range []struct {
		err   error
		calls int
		loss  bool
	}{
		{&lease.Error{Code: lease.CodeLost}, 1, true},
		{&lease.Error{Code: lease.CodeCommitRejected}, 1, true},
		{&lease.Error{Code: lease.CodeIdempotencyConflict}, 1, false},
		{lease.Invalid("sink", "bad"), 1, false},
		{&lease.Error{Code: lease.CodeBackendUnavailable}, 2, false},
		{errors.New("raw transport error"), 2, false}, // foreign errors are backend_unavailable
	} {
		f := &fixed{err: tc.err}
		var loss fencetest.LossRecorder
		c := fence.NewCommitter(f, env, lease.Caller{}, fence.WithAttempts(2), fence.WithBackoff(time.Millisecond),
			fence.WithLossHandler(loss.Handler))
		_, err := c.Authorize(context.Background(), "results", "c-1", fence.Binding{Target: "doc-1"})
		if code(err) != lease.CodeOf(tc.err) || f.calls != tc.calls || (len(loss.Seen()) == 1) != tc.loss {
			t.Errorf("%v: got %v after %d calls, loss %v", tc.err, err, f.calls, loss.Seen())
		}
	}
	// An authorization for another lease fails closed.
	f := &fixed{res: lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: lease.Commit{LeaseID: "lease-2",
		FencingToken: 3, CommitID: "c-1", AcceptedAt: lease.At(time.Now())}}}
	if _, err := fence.NewCommitter(f, env, lease.Caller{}).Authorize(context.Background(), "results", "c-1", fence.Binding{Target: "doc-1"}); code(err) != lease.CodeCorrupt {
		t.Fatalf("mismatched authorization: %v", err)
	}
}

// flakySink fails its first write as a store outage would.
type flakySink struct {
	*fencetest.MemorySink
	failed bool
}

func (s *flakySink) Commit(ctx context.Context, g fence.Guard, d fencetest.Doc) error {
	if !s.failed {
		s.failed = true
		return errors.New("connection reset")
	}
	return s.MemorySink.Commit(ctx, g, d)
}

// A write retried with the same commit id after a store failure reuses the
// original authorization.
func TestWriteRetrySameCommitID(t *testing.T) {
	e := newEnv(t)
	rec := e.acquire("instance-a", "req-a")
	c := e.committer(rec)
	sink := &flakySink{MemorySink: fencetest.NewMemorySink("results")}
	g1, err := fence.Write(context.Background(), c, sink, "commit-1", fencetest.Doc{ID: "r", Body: "v"})
	if err == nil {
		t.Fatal("first write must fail")
	}
	g2, err := fence.Write(context.Background(), c, sink, "commit-1", fencetest.Doc{ID: "r", Body: "v"})
	if err != nil || g1 != g2 {
		t.Fatalf("retry: %v, guards %+v %+v", err, g1, g2)
	}
}

func TestAdmit(t *testing.T) {
	at := lease.At(time.Now())
	g := func(key string, token uint64, leaseID string) fence.Guard {
		return fence.Guard{LockKey: key, LeaseID: leaseID, FencingToken: token, ExecutionID: "e", JobID: "j", Sink: "s",
			CommitID: "c", Target: "doc", CommitSeq: 10, AcceptedAt: at}
	}
	seq := func(g fence.Guard, n uint64) fence.Guard { g.CommitSeq = n; return g }
	k1, k2 := fencetest.LockKey("one"), fencetest.LockKey("two")
	unbound := g(k1, 7, "lease-7")
	unbound.Target, unbound.CommitSeq = "", 0
	noJob := g(k1, 7, "lease-7")
	noJob.JobID = ""
	badDigest := g(k1, 7, "lease-7")
	badDigest.PayloadSHA256 = "ABC"
	stored := g(k1, 5, "lease-5")
	for _, tc := range []struct {
		name   string
		stored *fence.Guard
		next   fence.Guard
		ok     bool
	}{
		{"first write", nil, g(k1, 1, "lease-1"), true},
		{"same lease, a later commit", &stored, seq(g(k1, 5, "lease-5"), 11), true},
		{"same lease, the same commit again", &stored, g(k1, 5, "lease-5"), false},
		{"same lease, an earlier commit", &stored, seq(g(k1, 5, "lease-5"), 9), false},
		{"higher token, lower commit seq", &stored, seq(g(k1, 6, "lease-6"), 1), true},
		{"no commit seq", nil, seq(g(k1, 1, "lease-1"), 0), false},
		{"higher token", &stored, g(k1, 6, "lease-6"), true},
		{"lower token", &stored, g(k1, 4, "lease-4"), false},
		{"equal token, other lease", &stored, g(k1, 5, "lease-x"), false},
		{"other lock key", &stored, g(k2, 9, "lease-9"), false},
		{"missing fence", &stored, fence.Guard{}, false},
		{"missing fence, new object", nil, fence.Guard{}, false},
		{"no accepted_at", nil, fence.Guard{LockKey: k1, LeaseID: "l", FencingToken: 1, ExecutionID: "e", JobID: "j", Sink: "s", CommitID: "c", Target: "doc"}, false},
		// A guard issued before writes were bound orders tokens as a stored
		// guard but admits no new write.
		{"unbound guard", &stored, unbound, false},
		{"guard without job", nil, noJob, false},
		{"malformed payload digest", nil, badDigest, false},
		{"after an unbound stored guard", &unbound, seq(g(k1, 7, "lease-7"), 11), true},
	} {
		err := fence.Admit(tc.stored, tc.next)
		// An earlier (or the same) commit of the stored guard's lease is a
		// conflict, not a loss; every other refusal is commit_rejected.
		want := lease.CodeCommitRejected
		if strings.HasPrefix(tc.name, "same lease,") {
			want = lease.CodeConflict
		}
		if (err == nil) != tc.ok || (err != nil && code(err) != want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestMemorySinkRejectsUnfencedWrites(t *testing.T) {
	sink := fencetest.NewMemorySink("results")
	if err := sink.Commit(context.Background(), fence.Guard{}, fencetest.Doc{ID: "x", Body: "y"}); code(err) != lease.CodeCommitRejected {
		t.Fatalf("unfenced write: %v", err)
	}
	if len(sink.Docs()) != 0 || len(sink.Rejected()) != 1 {
		t.Fatalf("sink %+v", sink.Docs())
	}
}

// mustBind is the binding of the write of payload to sink.
func mustBind[P any](t *testing.T, sink fence.Sink[P], payload P) fence.Binding {
	t.Helper()
	w, err := sink.Bind(payload)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// The stale-holder property at the reference sink.
func TestStaleHolderAtTheMemorySink(t *testing.T) {
	e := newEnv(t)
	sink := fencetest.NewMemorySink("documents")
	docID := func(rec *lease.Record, obj int) string { return rec.TargetID + "/doc-" + string(rune('0'+obj)) }
	fencetest.StaleHolder[fencetest.Doc]{Store: e.store, Now: e.clock.Now, Expire: func() { e.clock.Add(ttl + time.Second) },
		TTL: ttl, Identity: identity, Holder: actor,
		Successor: lease.Caller{PrincipalID: "prn-successor", ClientID: "client-2", CredentialID: "key-2"}, Admin: admin,
		Sink: sink, Objects: 2,
		Payload: func(rec *lease.Record, obj int, label string) fencetest.Doc {
			return fencetest.Doc{ID: docID(rec, obj), Body: label}
		},
		Read: func(_ context.Context, rec *lease.Record, obj int) (string, *fence.Guard, error) {
			d, ok := sink.Get(docID(rec, obj))
			if !ok {
				return "", nil, nil
			}
			return d.Body, &d.Guard, nil
		}}.Run(t)
}
