package etcd

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
	"github.com/starintel/starlease/lease/leasetest/race"
)

// TestRace runs the race suite with its linearizability check on one real
// three-member cluster, every part on a prefix of its own:
//
//   - one_store: the suite as every backend runs it, the reaper running
//     as a concurrent actor;
//   - lost_answers: two stores that lose answers (raceLostAnswers);
//   - backend_time_follows_linearization (backendTimeFollowsLinearization);
//   - skewed_clocks and skewed_clocks_expired_stays_expired: two stores
//     3 s ahead and 3 s behind (skewedClocksRace,
//     skewedClocksExpiredStaysExpired).
//
// Faults that take members down have clusters of their own
// (TestFailoverUnderLoad, TestQuorumLost).
func TestRace(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	t.Run("one_store", func(t *testing.T) {
		// The TTL is longer than the suite's default: every answer is a
		// raft write (see "Backend time" in the package doc), and a
		// holder must be able to renew and commit before its lease ends.
		s := open(t, c, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: 250 * time.Millisecond})
		race.Run(t, s, race.Options{TTL: 500 * time.Millisecond, Duration: 4 * time.Second})
	})
	t.Run("lost_answers", func(t *testing.T) { raceLostAnswers(t, c) })
	t.Run("backend_time_follows_linearization", func(t *testing.T) { backendTimeFollowsLinearization(t, c) })
	t.Run("skewed_clocks", func(t *testing.T) { skewedClocksRace(t, c) })
	t.Run("skewed_clocks_expired_stays_expired", func(t *testing.T) { skewedClocksExpiredStaysExpired(t, c) })
}

// raceLostAnswers runs the traffic through two stores on cluster c that
// now and then lose the answer of a mutation they performed: the
// caller gets outcome_unknown although the backend committed, as when a
// response is lost or a server crashes after the backend's commit. Each is
// resolved by LookupRequest with its request id (a commit by sending its
// commit id again), which must return the original result; the history
// must stay linearizable, and every acknowledged success read back.
func raceLostAnswers(t *testing.T, c *testenv.EtcdCluster) {
	var stores []lease.Store
	var lossy []*lossyStore
	for i, s := range failoverStores(t, c, 2, 5*time.Second) {
		l := &lossyStore{Store: s, rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)))}
		lossy = append(lossy, l)
		stores = append(stores, l)
	}
	opts := race.Options{Workers: 8, Identities: 3, TTL: 400 * time.Millisecond, Duration: 4 * time.Second,
		ResolveByLookup: true, Seed: seed()}
	h := race.RecordStores(bgCtx, stores, opts)
	rep := checkRun(t, "lost-answers", h, opts)
	lost := lossy[0].lost.Load() + lossy[1].lost.Load()
	t.Logf("lost-answers: answers lost=%d found_by_lookup=%d lookups=%d", lost, rep.Stats.ResolvedByLookup, rep.Stats.Lookups)
	if lost == 0 || rep.Stats.ResolvedByLookup == 0 {
		t.Errorf("lost-answers: %d answers lost, %d found by lookup: the run did not exercise the resolution", lost, rep.Stats.ResolvedByLookup)
	}
	readBack(t, "lost-answers", []*Store{lossy[0].Store, lossy[1].Store}, h)
}

// lossyStore performs every operation but loses the answer of about one
// successful mutation in eight, answering outcome_unknown instead.
type lossyStore struct {
	*Store
	mu   sync.Mutex
	rng  *mrand.Rand
	lost atomic.Int64
}

func (l *lossyStore) lose(err error) error {
	if err != nil {
		return err
	}
	l.mu.Lock()
	drop := l.rng.IntN(8) == 0
	l.mu.Unlock()
	if !drop {
		return nil
	}
	l.lost.Add(1)
	return lease.Errorf(lease.CodeOutcomeUnknown, "the answer was lost (test)")
}

func (l *lossyStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	res, err := l.Store.Acquire(ctx, req)
	if err = l.lose(err); err != nil {
		return lease.Result{}, err
	}
	return res, nil
}

func (l *lossyStore) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	res, err := l.Store.Renew(ctx, req)
	if err = l.lose(err); err != nil {
		return lease.Result{}, err
	}
	return res, nil
}

func (l *lossyStore) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	res, err := l.Store.Release(ctx, req)
	if err = l.lose(err); err != nil {
		return lease.Result{}, err
	}
	return res, nil
}

func (l *lossyStore) ForceRelease(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	res, err := l.Store.ForceRelease(ctx, req)
	if err = l.lose(err); err != nil {
		return lease.Result{}, err
	}
	return res, nil
}

func (l *lossyStore) Revoke(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	res, err := l.Store.Revoke(ctx, req)
	if err = l.lose(err); err != nil {
		return lease.Result{}, err
	}
	return res, nil
}

func (l *lossyStore) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	res, err := l.Store.AuthorizeCommit(ctx, req)
	if err = l.lose(err); err != nil {
		return lease.CommitResult{}, err
	}
	return res, nil
}

// seed is a random seed for a run's operation mix; the summary logs it.
func seed() uint64 { return uint64(time.Now().UnixNano()) }

// The helpers below build the requests of the multi-server tests
// (race, failover, quorum and skew): an actor is one owner on one service
// instance.

func uidOf(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// freshIdentity is an identity no other test uses.
func freshIdentity() lease.Identity {
	return lease.Identity{TenantID: uidOf("tenant-"), ProgramID: uidOf("program-"), TargetNamespace: "starintel-target",
		TargetID: uidOf("target_"), ActorName: "etcdtest", WorkflowName: "default", OperationClass: "default"}
}

type actor struct {
	caller   lease.Caller
	instance string
}

func newActor(class string) actor {
	return actor{caller: lease.Caller{PrincipalID: uidOf("prn_" + class + "_"), PrincipalClass: class,
		ClientID: uidOf("client_"), CredentialID: uidOf("key_"), CorrelationID: uidOf("corr_")},
		instance: uidOf("instance_")}
}

func (a actor) mutation(d time.Duration) lease.Mutation {
	return lease.Mutation{RequestID: uidOf("req_"), DeadlineAt: time.Now().Add(d), Caller: a.caller}
}

func (a actor) acquire(id lease.Identity, ttl time.Duration) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: id, ServiceInstanceID: a.instance, TTL: ttl, MaximumLifetime: 10 * time.Minute,
		ExecutionID: uidOf("execution_"), JobID: uidOf("job_"), TraceID: uidOf("trace_"), Mutation: a.mutation(10 * time.Second)}
}

func (a actor) renew(rec *lease.Record) lease.RenewRequest {
	return lease.RenewRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: a.instance, Mutation: a.mutation(10 * time.Second)}
}

func (a actor) release(rec *lease.Record) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: a.instance, Mutation: a.mutation(10 * time.Second)}
}

func (a actor) revoke(rec *lease.Record) lease.AdminRequest {
	return lease.AdminRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		Reason: "etcd test: revoke", Mutation: a.mutation(10 * time.Second)}
}

func (a actor) commit(rec *lease.Record, sink string) lease.CommitRequest {
	return lease.CommitRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: a.instance, Sink: sink, CommitID: uidOf("commit_"), ExecutionID: rec.ExecutionID,
		JobID: rec.JobID, TraceID: rec.TraceID, Target: uidOf("doc-"), PayloadSHA256: hex.EncodeToString(make([]byte, 32)),
		DeadlineAt: time.Now().Add(10 * time.Second), Caller: a.caller}
}

func (a actor) inspect(id lease.Identity) lease.InspectRequest {
	return lease.InspectRequest{Identity: id, DeadlineAt: time.Now().Add(10 * time.Second), Caller: a.caller}
}

// must fails the test unless err is nil and res has code want.
func must(t *testing.T, what string, res lease.Result, err error, want lease.Code) *lease.Record {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if res.Code != want || res.Lease == nil {
		t.Fatalf("%s: %s (lease %v), want %s", what, res.Code, res.Lease != nil, want)
	}
	return res.Lease
}

// refused fails the test unless err is a *lease.Error with code want; it
// returns the error.
func refused(t *testing.T, what string, err error, want lease.Code) *lease.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded, want %s", what, want)
	}
	le := lease.AsError(err)
	if le.Code != want {
		t.Fatalf("%s: %v, want %s", what, err, want)
	}
	return le
}

var bgCtx = context.Background()

// checkRun checks a recorded run with the linearizability check and the
// invariants, logs its summary and the figures the notes quote (history
// size, anomalies), and fails the test on any problem.
func checkRun(t *testing.T, name string, h *race.History, opts race.Options) race.Report {
	t.Helper()
	rep := race.Check(h, opts)
	t.Logf("race: %s", rep.Summary(h, opts))
	t.Logf("%s: history operations=%d porcupine=%s anomalies=%d outcome_unknown_resolved=%d lookups=%d found_by_lookup=%d",
		name, rep.Stats.Ops, rep.Result, len(rep.Problems), rep.Stats.Resolved, rep.Stats.Lookups, rep.Stats.ResolvedByLookup)
	for _, p := range rep.Problems {
		t.Errorf("%s: %s", name, p)
	}
	if rep.Result != porcupine.Ok {
		t.Errorf("%s: porcupine says %s", name, rep.Result)
	}
	for _, key := range []string{"acquire " + string(lease.CodeAcquired), "acquire " + string(lease.CodeConflict)} {
		if rep.Stats.Codes[key] == 0 {
			t.Errorf("%s: the traffic never got %s: it proves nothing about it", name, key)
		}
	}
	return rep
}

// patiently calls f until it answers something other than
// backend_unavailable or outcome_unknown (a read-back after faults, on a
// loaded machine, may time out: that says nothing about what is stored),
// at most 10 times.
func patiently(f func() error) error {
	var err error
	for try := 0; try < 10; try++ {
		if err = f(); lease.CodeOf(err) != lease.CodeBackendUnavailable && lease.CodeOf(err) != lease.CodeOutcomeUnknown {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

// readBack checks, after a run, that the backend kept every success it
// acknowledged: each acknowledged acquisition is found by LookupRequest
// with its lease id and token, and its token is at most the identity's
// durable counter; each acknowledged commit, sent again, replays the same
// accepted commit. Tokens of one identity are unique and increase with
// acquired_at. The stores are asked in turn.
func readBack(t *testing.T, name string, stores []*Store, h *race.History) {
	t.Helper()
	acks := h.Acks()
	type tok struct {
		token    uint64
		acquired time.Time
		lease    string
	}
	byKey := map[string][]tok{}
	var mu sync.Mutex
	var acquires, commits int
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				a := acks[i]
				s := stores[i%len(stores)]
				if a.Acquire != nil {
					_, lockKey, err := lease.CanonicalLockKey(a.Acquire.Identity, leasetest.StoreOptions().WithDefaults().OperationClasses)
					if err != nil {
						t.Errorf("%s: lock key: %v", name, err)
						continue
					}
					var res lease.Result
					err = patiently(func() (err error) {
						res, err = s.LookupRequest(bgCtx, lease.LookupRequest{Op: lease.OpAcquire, Identity: a.Acquire.Identity,
							PrincipalID: a.Acquire.Caller.PrincipalID, RequestID: a.Acquire.RequestID, DeadlineAt: time.Now().Add(10 * time.Second)})
						return err
					})
					switch {
					case err != nil:
						t.Errorf("%s: acknowledged acquisition %s (token %d) lost: lookup says %v", name, a.Lease.LeaseID, a.Lease.FencingToken, err)
					case res.Lease == nil || res.Lease.LeaseID != a.Lease.LeaseID || res.Lease.FencingToken != a.Lease.FencingToken:
						t.Errorf("%s: acknowledged acquisition %s (token %d) reads back as %+v", name, a.Lease.LeaseID, a.Lease.FencingToken, res.Lease)
					}
					var counter uint64
					err = patiently(func() (err error) { counter, err = faults{s}.Counter(bgCtx, lockKey); return err })
					if err != nil {
						t.Errorf("%s: read counter: %v", name, err)
					} else if counter < a.Lease.FencingToken {
						t.Errorf("%s: counter %d is below the acknowledged token %d of lease %s", name, counter, a.Lease.FencingToken, a.Lease.LeaseID)
					}
					mu.Lock()
					acquires++
					byKey[lockKey] = append(byKey[lockKey], tok{a.Lease.FencingToken, a.Lease.AcquiredAt.Time(), a.Lease.LeaseID})
					mu.Unlock()
				}
				if a.Commit != nil {
					req := *a.Commit
					var res lease.CommitResult
					err := patiently(func() (err error) {
						req.DeadlineAt = time.Now().Add(10 * time.Second)
						res, err = s.AuthorizeCommit(bgCtx, req)
						return err
					})
					switch {
					case err != nil:
						t.Errorf("%s: acknowledged commit %s (token %d) does not replay: %v", name, a.Accepted.CommitID, a.Accepted.FencingToken, err)
					case !res.Replayed || res.Commit.Seq != a.Accepted.Seq || res.Commit.FencingToken != a.Accepted.FencingToken ||
						res.Commit.LeaseID != a.Accepted.LeaseID || res.Commit.AcceptedAt != a.Accepted.AcceptedAt:
						t.Errorf("%s: acknowledged commit %s replays as %+v (replayed %v), was %+v", name, a.Accepted.CommitID, res.Commit, res.Replayed, *a.Accepted)
					}
					mu.Lock()
					commits++
					mu.Unlock()
				}
			}
		}()
	}
	for i := range acks {
		work <- i
	}
	close(work)
	wg.Wait()
	regressions := 0
	for _, toks := range byKey {
		slices.SortFunc(toks, func(a, b tok) int { return cmp.Or(a.acquired.Compare(b.acquired), cmp.Compare(a.token, b.token)) })
		for i := 1; i < len(toks); i++ {
			if toks[i].token <= toks[i-1].token {
				regressions++
				t.Errorf("%s: token %d of lease %s (acquired %s) is not above token %d of lease %s (acquired %s)", name,
					toks[i].token, toks[i].lease, toks[i].acquired.Format(time.RFC3339Nano),
					toks[i-1].token, toks[i-1].lease, toks[i-1].acquired.Format(time.RFC3339Nano))
			}
		}
	}
	t.Logf("%s: read back acquisitions=%d commits=%d identities=%d token_regressions=%d", name, acquires, commits, len(byKey), regressions)
}
