package bolt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// acquireMany acquires n leases on distinct targets, TTL ttl, and returns
// their records.
func acquireMany(t *testing.T, s *Store, n int, ttl time.Duration, far time.Time) []*lease.Record {
	t.Helper()
	out := make([]*lease.Record, n)
	for i := range n {
		req := acquireReq(fmt.Sprintf("req-%d", i), ttl, far)
		req.Identity.TargetID = fmt.Sprintf("target-%d", i)
		r, err := s.Acquire(context.Background(), req)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		out[i] = r.Lease
	}
	return out
}

// bucketLen counts a bucket's keys.
func bucketLen(t *testing.T, s *Store, b []byte) int {
	t.Helper()
	var n int
	if err := s.db.View(func(tx *bbolt.Tx) error { n = tx.Bucket(b).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// kindLen counts the ident entries of one kind.
func kindLen(t *testing.T, s *Store, kind byte) int {
	t.Helper()
	var n int
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return eachOfKind(readView(tx), kind, func(string, []byte, []byte) error { n++; return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// One pass works off a backlog far larger than one slice: every expired
// lease reaches history, and later every piece of evidence and history
// past retention goes, each through its time index, leaving the indexes
// empty. Counters stay.
func TestReapWorksOffBacklogInOnePass(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	const n = 3*reapSlice + 17
	recs := acquireMany(t, s, n, time.Second, far)
	c.Add(2 * time.Second)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := kindLen(t, s, kindActive); got != 0 {
		t.Fatalf("active records after one pass: %d", got)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		r, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: recs[i].LeaseID, DeadlineAt: far})
		if err != nil || r.Lease.State != lease.StateExpired {
			t.Fatalf("lease %d after the pass: %v %+v", i, err, r.Lease)
		}
	}
	if got := kindLen(t, s, kindHistory); got != n {
		t.Fatalf("history entries: %d, want %d", got, n)
	}
	if got := bucketLen(t, s, bucketActiveExp); got != 0 {
		t.Fatalf("active_exp entries left: %d", got)
	}
	c.Add(lease.DefaultHistoryRetention + time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{bucketHistoryExp, bucketLeases, bucketIdemExp} {
		if got := bucketLen(t, s, b); got != 0 {
			t.Fatalf("bucket %s after retention: %d entries", b, got)
		}
	}
	for _, k := range []byte{kindHistory, kindIdem} {
		if got := kindLen(t, s, k); got != 0 {
			t.Fatalf("ident entries of kind %c after retention: %d", k, got)
		}
	}
	if got := kindLen(t, s, kindCounter); got != n {
		t.Fatalf("counters: %d, want %d (never reclaimed)", got, n)
	}
}

// A renewal moves the lease's index entry: the reaper neither archives the
// renewed lease at its old expiry nor misses it at its new one.
func TestReapFollowsRenewal(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	r, err := s.Acquire(ctx, acquireReq("a", 2*time.Second, far))
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	rn, err := s.Renew(ctx, lease.RenewRequest{Identity: testIdentity, LeaseID: r.Lease.LeaseID, FencingToken: r.Lease.FencingToken,
		ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: "r", DeadlineAt: far, Caller: callerOfRecord(r.Lease)}})
	if err != nil {
		t.Fatal(err)
	}
	c.Add(1500 * time.Millisecond) // past the first expiry, before the renewed one
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far})
	if err != nil || got.Lease.State != lease.StateActive || got.Lease.ExpiresAt != rn.Lease.ExpiresAt {
		t.Fatalf("renewed lease after its old expiry: %v %+v", err, got.Lease)
	}
	c.Add(time.Second)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far}); code(err) != lease.CodeNotFound {
		t.Fatalf("renewed lease past its new expiry must be reaped, got %v", err)
	}
}

func callerOfRecord(r *lease.Record) lease.Caller {
	return lease.Caller{PrincipalID: r.OwnerPrincipalID, ClientID: r.OwnerClientID, CredentialID: r.OwnerCredentialID}
}

// A file of schema 1 (no time indexes) is migrated when opened: its
// expired leases and old history are then reaped like new ones, and the
// file says schema 2.
func TestSchemaV1Migrates(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "leases.db")
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour)
	recs := acquireMany(t, s, 40, time.Second, far)
	// Release half, so there is history to retire.
	for _, rec := range recs[:20] {
		id := rec.Identity()
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
			ServiceInstanceID: rec.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel-" + rec.LeaseID, DeadlineAt: far, Caller: callerOfRecord(rec)}}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	// Make it a schema 1 file: the schema 2 layout, no time indexes.
	downgradeToV2(t, path)
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketActiveExp, bucketHistoryExp} {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV1))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	c.Add(2 * time.Second)
	s, err = Open(path, o)
	if err != nil {
		t.Fatalf("open schema 1: %v", err)
	}
	defer s.Close()
	if v := storedSchema(t, s.db); v != schemaVersion {
		t.Fatalf("schema after open: %q", v)
	}
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := kindLen(t, s, kindActive); got != 0 {
		t.Fatalf("expired leases of the migrated file not reaped: %d active", got)
	}
	if got := kindLen(t, s, kindHistory); got != 40 {
		t.Fatalf("history entries: %d, want 40", got)
	}
	c.Add(lease.DefaultHistoryRetention + time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := kindLen(t, s, kindHistory); got != 0 {
		t.Fatalf("history of the migrated file past retention: %d left", got)
	}
}

// futureSchema is the schema version after this build's.
func futureSchema(t *testing.T) string {
	v, err := strconv.Atoi(schemaVersion)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(v + 1)
}

// storedSchema is the schema version db's file records.
func storedSchema(t *testing.T, db *bbolt.DB) string {
	t.Helper()
	var v string
	if err := db.View(func(tx *bbolt.Tx) error { v = string(tx.Bucket(bucketMeta).Get(keySchema)); return nil }); err != nil {
		t.Fatal(err)
	}
	return v
}

// A store of an unknown future schema is refused, not opened.
func TestUnknownSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(keySchema, []byte(futureSchema(t)))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(path, Options{}); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("future schema: %v, want corrupt", err)
	}
}

// expiredStore is a store with flush interval interval and no reaper,
// holding n leases that have just expired. hook, if not nil, is its flush
// hook, set before the first write: the flusher may read it from then on.
func expiredStore(t *testing.T, n int, interval time.Duration, hook func() error) *Store {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1, FlushInterval: interval})
	s.group.engine.flushHook = hook
	acquireMany(t, s, n, time.Second, time.Now().Add(time.Hour))
	c.Add(2 * time.Second)
	return s
}

// expiredUnflushed is a store whose flush interval is an hour, holding
// 2*reapFreezeEvery*reapSlice + 1 leases that have just expired: 9 expiry
// slices' worth. (Its tests set their flush hooks later: nothing flushes
// before a pass asks.)
func expiredUnflushed(t *testing.T) *Store {
	return expiredStore(t, 2*reapFreezeEvery*reapSlice+1, time.Hour, nil)
}

// A pass asks for a flush every reapFreezeEvery slices that consumed
// entries, so the tree takes its archives in small commits instead of one
// per flush interval: with an interval of an hour, a pass of 9 expiry
// slices still makes the flusher commit (the asks after the 4th and 8th
// are served by the next slice's batch).
func TestReapFlushesAsItGoes(t *testing.T) {
	ctx := context.Background()
	s := expiredUnflushed(t)
	var flushes atomic.Int64
	s.group.engine.flushHook = func() error { flushes.Add(1); return nil }
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ActiveLeases(ctx); err != nil || got != 0 {
		t.Fatalf("active records after one pass: %d, %v", got, err)
	}
	// The flusher runs on its own goroutine: give it time to take the
	// layers the pass froze (an hour's interval would never flush).
	for deadline := time.Now().Add(10 * time.Second); flushes.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if flushes.Load() == 0 {
		t.Fatal("a pass of 9 expiry slices flushed nothing before the flush interval")
	}
}

// While flushes fail, a pass asks for none: the flusher retries at its own
// pace, and each frozen layer would only add to what reads walk and each
// retry applies again.
func TestReapAsksNoFlushWhileFlushesFail(t *testing.T) {
	ctx := context.Background()
	s := expiredUnflushed(t)
	e := s.group.engine
	e.flushHook = func() error { return errors.New("disk says no") }
	if err := s.sync(); err == nil { // freezes the preload's layer; its flush fails
		t.Fatal("the failing flush succeeded")
	}
	frozen := func() int { e.mu.Lock(); defer e.mu.Unlock(); return len(e.frozen) }
	before := frozen()
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ActiveLeases(ctx); err != nil || got != 0 {
		t.Fatalf("active records after one pass: %d, %v", got, err)
	}
	if after := frozen(); after != before || e.wantFreeze.Load() {
		t.Fatalf("frozen layers %d before the pass, %d after (a flush asked: %v); want none added while flushes fail", before, after, e.wantFreeze.Load())
	}
}

// Each flush during a pass commits only what the pass archived since the
// flush before: the pass waits for a flush before it asks for the next,
// so a slow tree commit never gathers a backlog of frozen layers, which
// flush would take in one commit. Here every flush takes 20 ms, about
// four slices' time.
func TestReapWaitsForEachFlush(t *testing.T) {
	ctx := context.Background()
	s := expiredStore(t, 4*reapFreezeEvery*reapSlice+1, time.Hour, nil)
	e := s.group.engine
	var flushes, mostFrozen atomic.Int64
	e.flushHook = func() error {
		time.Sleep(20 * time.Millisecond)
		e.mu.Lock()
		n := int64(len(e.frozen)) // the layers this flush takes, and any frozen since
		e.mu.Unlock()
		flushes.Add(1)
		if n > mostFrozen.Load() {
			mostFrozen.Store(n)
		}
		return nil
	}
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ActiveLeases(ctx); err != nil || got != 0 {
		t.Fatalf("active records after one pass: %d, %v", got, err)
	}
	e.mu.Lock()
	lastAsk := 0
	if len(e.frozen) > 0 {
		lastAsk = e.frozen[0].batch
	}
	e.mu.Unlock()
	e.awaitFlushed(ctx, lastAsk) // the last ask's flush may still run
	if flushes.Load() < 4 {
		t.Fatalf("%d flushes for a pass of 17 expiry slices; want one per %d slices", flushes.Load(), reapFreezeEvery)
	}
	if mostFrozen.Load() != 1 {
		t.Fatalf("a flush found %d frozen layers; want 1: the pass asked again before the tree took its last ask", mostFrozen.Load())
	}
}

// A pass that ends (its budget, or Close) while it waits for a flush ends
// without an error, and does not wait for the flush.
func TestReapEndsWhileWaitingForAFlush(t *testing.T) {
	s := expiredUnflushed(t)
	e := s.group.engine
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.flushHook = func() error {
		once.Do(func() { close(entered) })
		<-release
		return nil
	}
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.reap(ctx) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the pass asked for no flush")
	}
	select {
	case err := <-done:
		t.Fatalf("the pass ended (%v) while the flush of its first ask was held", err)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a pass ended while waiting for a flush failed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pass kept waiting for the flush after its context ended")
	}
}

// writePairs runs acquire+release pairs on a target of its own until stop
// is closed or a call fails (failing the test unless quiet).
func writePairs(t *testing.T, s *Store, target string, quiet bool, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		id := testIdentity
		id.TargetID = target
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			deadline := time.Now().Add(time.Hour)
			req := acquireReq(fmt.Sprintf("%s-acq-%d", target, i), time.Hour, deadline)
			req.Identity = id
			got, err := s.Acquire(ctx, req)
			if err == nil {
				_, err = s.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: got.Lease.LeaseID,
					FencingToken: got.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("%s-rel-%d", target, i), DeadlineAt: deadline, Caller: req.Caller}})
			}
			if err != nil {
				if !quiet {
					t.Errorf("writer: %v", err)
				}
				return
			}
		}
	}()
}

// reapBesideWriter runs one pass over n expired leases while a writer
// runs pairs, with a flush interval of interval and every flush taking
// flushTakes, and returns how many of the n the pass archived.
func reapBesideWriter(t *testing.T, n int, interval, flushTakes time.Duration) int64 {
	var slow atomic.Bool
	s := expiredStore(t, n, interval, func() error {
		if slow.Load() {
			time.Sleep(flushTakes)
		}
		return nil
	})
	slow.Store(true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	writePairs(t, s, "reap-writer", false, stop, &wg)
	time.Sleep(3 * interval) // the writer's own freezes under way
	ctx, cancel := context.WithTimeout(context.Background(), reapPassBudget)
	defer cancel()
	err := s.reap(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	left, err := s.ActiveLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int64(n) - left // the writer holds none once stopped
}

// Review s42: a pass waits for the flush of its own ask, not for a tree
// without frozen layers, which a writer refills whenever flushes take
// longer than the flush interval: waiting for that starved the pass
// until its budget ended, having archived two asks' worth.
func TestReapBesideAWriterWhileFlushesLag(t *testing.T) {
	const n = 1000
	if got := reapBesideWriter(t, n, 20*time.Millisecond, 30*time.Millisecond); got != n {
		t.Fatalf("one pass archived %d of %d expired leases beside a writer, flushes of 30 ms at a 20 ms interval; want all", got, n)
	}
}

// The same at the default interval, with flushes of 120 ms (a slow disk).
func TestReapBesideAWriterOnASlowDisk(t *testing.T) {
	const n = 500
	if got := reapBesideWriter(t, n, DefaultFlushInterval, 120*time.Millisecond); got != n {
		t.Fatalf("one pass archived %d of %d expired leases beside a writer, flushes of 120 ms at the default interval; want all", got, n)
	}
}

// Review s42: Close while a pass waits for a slow flush, beside a writer,
// returns (it ends the pass, then the engine).
func TestReapCloseWhileAPassWaits(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s, err := Open(t.TempDir()+"/s.db", Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: 10 * time.Millisecond, FlushInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var slow atomic.Bool
	var flushes atomic.Int64
	s.group.engine.flushHook = func() error {
		if slow.Load() {
			flushes.Add(1)
			time.Sleep(30 * time.Millisecond)
		}
		return nil
	}
	acquireMany(t, s, 1000, time.Hour, time.Now().Add(time.Hour))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	writePairs(t, s, "close-writer", true, stop, &wg) // Close refuses it
	slow.Store(true)
	c.Add(2 * time.Hour) // every lease due: the reaper's next tick starts a pass
	for deadline := time.Now().Add(10 * time.Second); flushes.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if flushes.Load() < 3 {
		t.Fatal("no slow flushes while the pass ran")
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung behind a reaper pass waiting for a flush")
	}
	close(stop)
	wg.Wait()
}

// Review s42: with a flush per batch (FlushInterval -1) and flushes
// failing for a while, then recovering, a pass neither hangs nor fails,
// and archives everything.
func TestReapInlineFlushesFailingThenRecovering(t *testing.T) {
	var fail atomic.Int64
	s := expiredStore(t, 6*reapFreezeEvery*reapSlice+3, -1, func() error {
		if fail.Add(-1) >= 0 {
			return errors.New("disk says no")
		}
		return nil
	})
	fail.Store(20)
	ctx, cancel := context.WithTimeout(context.Background(), reapPassBudget)
	defer cancel()
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := s.ActiveLeases(context.Background()); err != nil || left != 0 {
		t.Fatalf("active records after one pass: %d, %v", left, err)
	}
}

// confirmNothing is a batch that writes nothing: the relay confirming a
// message the outbox no longer holds.
func confirmNothing(t *testing.T, s *Store) {
	if err := s.OutboxDone(context.Background(), "no-such-message"); err != nil && !s.closed.Load() {
		t.Errorf("OutboxDone: %v", err)
	}
}

// Review s42b: a pass waits for its own last write's batch. A batch that
// wrote nothing after a timed freeze (here a refused confirmation during
// every flush, each longer than the interval) is in no layer the tree
// takes, and a pass that waited for the last batch number given stalled
// until its budget ended.
func TestReapBesideBatchesThatWriteNothing(t *testing.T) {
	const interval = 20 * time.Millisecond
	const n = 12 * reapFreezeEvery * reapSlice
	var on atomic.Bool
	var s *Store // read by the hook only once on is set, after s is
	s = expiredStore(t, n, interval, func() error {
		if on.Load() {
			time.Sleep(interval + 10*time.Millisecond)
			confirmNothing(t, s)
		}
		return nil
	})
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	on.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), reapPassBudget)
	defer cancel()
	err := s.reap(ctx)
	on.Store(false)
	if err != nil {
		t.Fatal(err)
	}
	if left, err := s.ActiveLeases(context.Background()); err != nil || left != 0 {
		t.Fatalf("active records after one pass over %d: %d, %v", n, left, err)
	}
}

// A pass whose awaited flush fails stops waiting (the flusher retries at
// its own pace) and asks for no more, and archives everything.
func TestReapWhenTheAwaitedFlushFails(t *testing.T) {
	s := expiredUnflushed(t)
	var fail atomic.Bool
	var attempts atomic.Int64
	s.group.engine.flushHook = func() error {
		attempts.Add(1)
		if fail.Load() {
			return errors.New("disk says no")
		}
		return nil
	}
	fail.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), reapPassBudget)
	defer cancel()
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := s.ActiveLeases(context.Background()); err != nil || left != 0 {
		t.Fatalf("active records after one pass: %d, %v (flush attempts %d)", left, err, attempts.Load())
	}
	if attempts.Load() == 0 {
		t.Fatal("the pass asked for no flush")
	}
	fail.Store(false) // Close flushes
}
