package bolt

// Review attacks on the group commit (group.go) and the store's
// backend-time logic around it (store.go clock/readTx). Each test fails if
// the guarantee it names breaks.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/groupcommit"
	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
	"github.com/starintel/starlease/lease/leasetest/race"
)

// waitQueued waits until at least n calls wait in g's queue.
func waitQueued(t *testing.T, g *groupCommit, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Microsecond) {
		q := g.queue.Queued()
		if q >= n {
			return
		}
	}
	t.Fatalf("%d calls never queued", n)
}

// gate starts a call whose function blocks inside its transaction until
// release is closed; it returns once the function runs (the committer role
// is taken) and the call's result channel.
func gate(t *testing.T, g *groupCommit, release <-chan struct{}) <-chan error {
	t.Helper()
	entered := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		var once sync.Once
		defer func() {
			if p := recover(); p != nil { // as net/http recovers a handler
				res <- fmt.Errorf("panic: %v", p)
			}
		}()
		res <- g.update(func(tx *layered.View) error {
			once.Do(func() { close(entered) })
			<-release
			return nil
		})
	}()
	<-entered
	return res
}

// ---------------------------------------------------------------------------
// Attack: the caller that took the committer role is answered only when the
// queue is empty. Under continuous arrival its own (committed) call is never
// answered: its latency is unbounded although its transaction committed in
// the first batch.
func TestReviewCommitterAnsweredWhileLoadContinues(t *testing.T) {
	g := openGroup(t, 256)
	loadFor := 3 * time.Second
	stopAt := time.Now().Add(loadFor)
	var chained atomic.Int64
	var wg sync.WaitGroup
	// chain keeps one call queued behind every transaction until stopAt:
	// a steady arrival of writes, made deterministic.
	var chain func(tx *layered.View) error
	chain = func(tx *layered.View) error {
		if time.Now().Before(stopAt) {
			before := g.queue.Queued()
			wg.Add(1)
			go func() { defer wg.Done(); chained.Add(1); _ = g.update(chain) }()
			waitQueued(t, g, before+1)
		}
		return put(fmt.Sprint("c", time.Now().UnixNano()))(tx)
	}
	start := time.Now()
	if err := g.update(chain); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	wg.Wait()
	t.Logf("the committer's own call was answered after %s (%d calls chained behind it)", took, chained.Load())
	if took > loadFor/3 {
		t.Fatalf("the committer's call committed in its first transaction but was answered only after %s, "+
			"when the load stopped: a committer's latency is unbounded under steady load", took)
	}
}

// ---------------------------------------------------------------------------
// Attack: a panic during the commit itself (outside the functions, which
// safely() covers: bbolt asserts and panics on a corrupt page while
// spilling or freeing; a commit handler here stands in for it) must not
// wedge the group: the other calls of the batch must be answered, and
// later calls must commit.
func TestReviewPanicDuringCommitDoesNotWedgeTheGroup(t *testing.T) {
	g := openGroup(t, 256)
	release := make(chan struct{})
	first := gate(t, g, release)
	var armed atomic.Bool
	g.commitHook = func(tx *bbolt.Tx) {
		if armed.CompareAndSwap(true, false) {
			tx.OnCommit(func() { panic("bbolt: assertion failed (stand-in)") })
		}
	}
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }() // as net/http recovers a handler
		_ = g.update(func(tx *layered.View) error {
			armed.Store(true)
			return put("p")(tx)
		})
	}()
	waitQueued(t, g, 1)
	other := make(chan error, 1)
	go func() { other <- g.update(put("other")) }()
	waitQueued(t, g, 2)
	close(release)
	// The gate's own caller is the committer: it carries the panic.
	select {
	case <-first:
	case <-time.After(5 * time.Second):
	}
	select {
	case <-panicked:
	case <-time.After(5 * time.Second):
	}
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("a call that shared the panicking commit was never answered")
	}
	after := make(chan error, 1)
	go func() { after <- g.update(put("after")) }()
	select {
	case err := <-after:
		if err != nil {
			t.Fatalf("a later call: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("after a panic during a commit every later write hangs: the group is wedged (running stays true)")
	}
}

// ---------------------------------------------------------------------------
// Attack: a write transaction that registered its time (clock) and then
// rolled back leaves pendingTx at an id that never commits; every later read
// is then capped at that old time until some write commits, so reads report
// an expired lease as active at a backend time frozen in the past.
func TestReviewReadTimeNotFrozenByRolledBackWrite(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	if _, err := s.Acquire(ctx, acquireReq("req-1", 30*time.Second, far)); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	// A mutation that fails after reading backend time (a storage error
	// inside the transaction; a failed commit does the same).
	err := s.mutate(ctx, func(tx *layered.View) error {
		_ = s.clock(tx)
		return errors.New("i/o error (injected)")
	})
	if code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("failed write: %v, want outcome_unknown", err)
	}
	c.Add(time.Minute) // the lease expired long ago
	res, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far})
	if err != nil {
		t.Fatal(err)
	}
	want := lease.At(c.Now())
	if res.BackendTime.Before(want) || res.Lease.State != lease.StateExpired {
		t.Fatalf("inspect a minute after a rolled-back write: backend time %s (clock %s), lease %s: "+
			"reads stay frozen at the rolled-back transaction's time", res.BackendTime, want, res.Lease.State)
	}
}

// ---------------------------------------------------------------------------
// Attack: a refusal that writes (a renewal of an expired lease archives it
// and answers lease_lost) shares a batch with a failing function: the
// refusal's writes must stand, exactly once, and each caller gets its own
// answer.
func TestReviewRefusalWritesSurviveABatchFailureOnce(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	acq, err := s.Acquire(ctx, acquireReq("req-1", 2*time.Second, far))
	if err != nil {
		t.Fatal(err)
	}
	rec := acq.Lease
	c.Add(5 * time.Second)
	release := make(chan struct{})
	first := gate(t, &s.group, release)
	renewErr := make(chan error, 1)
	go func() {
		_, err := s.Renew(ctx, lease.RenewRequest{Identity: testIdentity, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
			ServiceInstanceID: rec.ServiceInstanceID, TTL: 2 * time.Second,
			Mutation: lease.Mutation{RequestID: "renew-1", DeadlineAt: far, Caller: lease.Caller{PrincipalID: rec.OwnerPrincipalID,
				ClientID: rec.OwnerClientID, CredentialID: rec.OwnerCredentialID}}})
		renewErr <- err
	}()
	waitQueued(t, &s.group, 1)
	failErr := make(chan error, 1)
	go func() {
		failErr <- s.mutate(ctx, func(tx *layered.View) error {
			_ = tx.Bucket(bucketMeta).Put([]byte("review-poison"), []byte("x"))
			panic("bad function")
		})
	}()
	waitQueued(t, &s.group, 2)
	other := make(chan error, 1)
	go func() {
		other <- s.mutate(ctx, func(tx *layered.View) error { return tx.Bucket(bucketMeta).Put([]byte("review-other"), []byte("y")) })
	}()
	waitQueued(t, &s.group, 3)
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-renewErr; code(err) != lease.CodeLost {
		t.Fatalf("renewal of an expired lease: %v, want lease_lost", err)
	}
	if err := <-failErr; code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("panicking write: %v, want outcome_unknown", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("an innocent write of the same batch: %v", err)
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketMeta).Get([]byte("review-poison")) != nil {
			t.Error("the panicking function's write was committed")
		}
		if tx.Bucket(bucketMeta).Get([]byte("review-other")) == nil {
			t.Error("the innocent write is missing")
		}
		if tx.Bucket(bucketIdent).Get(activeKey(rec.LockKey)) != nil {
			t.Error("the expired lease is still active: the refusal's archive was rolled back")
		}
		n := 0
		prefix := historyPrefix(rec.LockKey)
		cur := tx.Bucket(bucketIdent).Cursor()
		for k, _ := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = cur.Next() {
			n++
		}
		if n != 1 {
			t.Errorf("history holds %d entries for the lease, want exactly 1", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The inspected lease is the archived one, expired at its expiry.
	res, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: rec.LeaseID, DeadlineAt: far})
	if err != nil || res.Lease.State != lease.StateExpired {
		t.Fatalf("inspect: %v %+v", err, res.Lease)
	}
}

// ---------------------------------------------------------------------------
// Attack: many acquisitions of one identity, and repeats of one request id,
// in a single transaction: exactly one is granted, the repeats replay it,
// and the counter moves once.
func TestReviewOneBatchManyContenders(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	release := make(chan struct{})
	first := gate(t, &s.group, release)
	const n = 40
	type out struct {
		res lease.Result
		err error
	}
	outs := make([]out, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprint("req-", i%4) // ten of each request id
			outs[i].res, outs[i].err = s.Acquire(ctx, acquireReq(id, time.Minute, far))
		}(i)
	}
	waitQueued(t, &s.group, n)
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	granted := map[string]string{}
	for i, o := range outs {
		switch {
		case o.err == nil:
			granted[fmt.Sprint("req-", i%4)] = o.res.Lease.LeaseID
			if o.res.Lease.FencingToken != 1 {
				t.Errorf("call %d: token %d, want 1", i, o.res.Lease.FencingToken)
			}
		case code(o.err) != lease.CodeConflict:
			t.Errorf("call %d: %v", i, o.err)
		}
	}
	if len(granted) != 1 {
		t.Fatalf("%d request ids were granted the one identity, want 1: %v", len(granted), granted)
	}
	for i, o := range outs {
		if want := granted[fmt.Sprint("req-", i%4)]; want != "" && (o.err != nil || o.res.Lease.LeaseID != want) {
			t.Errorf("call %d, a repeat of the granted request: %v %v, want its replay", i, o.err, o.res.Lease)
		}
	}
	for _, o := range outs {
		if o.err == nil {
			if got, err := (faults{s}).Counter(ctx, o.res.Lease.LockKey); err != nil || got != 1 {
				t.Fatalf("fencing counter %d (%v), want 1", got, err)
			}
			break
		}
	}
}

// ---------------------------------------------------------------------------
// Attack: Close while calls are queued behind a commit in progress: nothing
// deadlocks, every caller is answered, and each answer matches the file: a
// success is stored, backend_unavailable is not. A closed store answers
// backend_unavailable.
func TestReviewCloseWithQueuedCommits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour)
	release := make(chan struct{})
	first := gate(t, &s.group, release)
	const n = 30
	errs := make([]error, n)
	res := make([]lease.Result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			req := acquireReq(fmt.Sprint("req-", i), time.Minute, far)
			req.Identity.TargetID = fmt.Sprint("target-", i)
			res[i], errs[i] = s.Acquire(ctx, req)
		}(i)
	}
	waitQueued(t, &s.group, n)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	for !s.closed.Load() {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // Close waits on bbolt's writer lock
	close(release)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("queued callers were never answered after Close")
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close deadlocked")
	}
	<-first
	if _, err := s.Acquire(ctx, acquireReq("late", time.Minute, far)); code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire on a closed store: %v, want backend_unavailable", err)
	}
	if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far}); code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("inspect on a closed store: %v, want backend_unavailable", err)
	}
	s2, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ok := 0
	for i := 0; i < n; i++ {
		id := testIdentity
		id.TargetID = fmt.Sprint("target-", i)
		got, gerr := s2.Inspect(ctx, lease.InspectRequest{Identity: id, DeadlineAt: far})
		switch {
		case errs[i] == nil:
			ok++
			if gerr != nil || got.Lease.LeaseID != res[i].Lease.LeaseID {
				t.Errorf("call %d answered acquired but the file holds: %v %v", i, gerr, got.Lease)
			}
		case code(errs[i]) == lease.CodeBackendUnavailable:
			if gerr == nil {
				t.Errorf("call %d answered backend_unavailable but its lease is stored", i)
			}
		default:
			t.Errorf("call %d: %v (want acquired or backend_unavailable)", i, errs[i])
		}
	}
	t.Logf("%d of %d queued acquisitions committed before the close", ok, n)
}

// ---------------------------------------------------------------------------
// Attack: the commit itself fails (the file cannot grow: bbolt's MaxSize
// stands in for a full disk). Every caller of the batch must get an error
// (outcome_unknown at the store), none of its writes may be there, and
// the store keeps working once the disk has room.
func TestReviewCommitFailureFailsTheWholeBatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "group.db")
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("k")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, MaxSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	g := &groupCommit{db: db, queue: groupcommit.Queue[*groupCall]{Max: 256}}
	release := make(chan struct{})
	first := gate(t, g, release)
	const n = 10
	errs := make([]error, n)
	var wg sync.WaitGroup
	big := bytes.Repeat([]byte("x"), 16<<10)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = g.update(func(tx *layered.View) error { return tx.Bucket([]byte("k")).Put([]byte(fmt.Sprint("k", i)), big) })
		}(i)
	}
	waitQueued(t, g, n)
	close(release)
	wg.Wait()
	<-first
	for i, err := range errs {
		if err == nil {
			t.Errorf("call %d: nil error although its batch's commit could not grow the file", i)
		}
		if stored(t, db, fmt.Sprint("k", i)) {
			t.Errorf("call %d's write is stored although its commit failed", i)
		}
	}
	if err := g.update(put("small")); err != nil || !stored(t, db, "small") {
		t.Fatalf("a small write after the failed commit: %v", err)
	}
	checkConsistent(t, db, "after a failed commit")
}

// ---------------------------------------------------------------------------
// Attack: linearizability under heavier load than TestRace: more workers
// and identities (larger batches), a fast reaper sharing the batches, and
// several seeds.
func TestReviewRaceHeavy(t *testing.T) {
	if testing.Short() {
		t.Skip("heavy")
	}
	for i, c := range []struct {
		workers, identities int
		reap, dur           time.Duration
	}{
		{48, 4, 10 * time.Millisecond, 6 * time.Second},
		{32, 3, -1, 3 * time.Second}, // 64 workers on 2 identities is past porcupine's reach
		{32, 8, 5 * time.Millisecond, 6 * time.Second},
	} {
		t.Run(fmt.Sprintf("w%d_i%d", c.workers, c.identities), func(t *testing.T) {
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: c.reap, FlushInterval: DefaultFlushInterval})
			race.Run(t, s, race.Options{Workers: c.workers, Identities: c.identities, OpsPerWorker: 400,
				Duration: c.dur, Seed: uint64(1000 + i), CheckTimeout: 120 * time.Second})
		})
	}
}
