package audit

// Review of the audit path's panic handling (Recovered, ErrSinkPanicked):
// a panic, or runtime.Goexit, in a file operation or a spool's backend
// fails only the write it happened in, leaves no line of a write reported
// failed, and leaves no lock held or writer waiting.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Fault points of rpFile.
const (
	rpWritePart   = 1 << iota // Write stores part of b, then panics
	rpWriteAll                // Write stores all of b, then panics
	rpSync                    // Sync panics (before syncing)
	rpTruncate                // Truncate panics (before truncating)
	rpStat                    // Stat panics
	rpClose                   // Close panics (before closing)
	rpReadAt                  // ReadAt panics
	rpWriteGoexit             // Write calls runtime.Goexit
	rpWriteEIO                // Write stores part of b, then fails with EIO
)

// rpFile is a FileSink file whose operations panic while their bit is set.
type rpFile struct {
	*os.File
	faults atomic.Int32
	// every, if set, makes Write panic (after writing a part) on every
	// every-th call only.
	every, calls atomic.Int32
}

func (f *rpFile) on(bit int32) bool { return f.faults.Load()&bit != 0 }

func (f *rpFile) Write(b []byte) (int, error) {
	if e := f.every.Load(); e > 0 && f.calls.Add(1)%e == 0 {
		f.File.Write(b[:len(b)-3])
		panic("periodic file bug")
	}
	switch {
	case f.on(rpWritePart):
		f.File.Write(b[:len(b)-3]) // every line but the last whole
		panic("file bug")
	case f.on(rpWriteAll):
		f.File.Write(b)
		panic("file bug")
	case f.on(rpWriteGoexit):
		runtime.Goexit()
	case f.on(rpWriteEIO):
		n, _ := f.File.Write(b[:len(b)/2])
		return n, errors.New("EIO")
	}
	return f.File.Write(b)
}

func (f *rpFile) Sync() error {
	if f.on(rpSync) {
		panic("sync bug")
	}
	return f.File.Sync()
}

func (f *rpFile) Truncate(n int64) error {
	if f.on(rpTruncate) {
		panic("truncate bug")
	}
	return f.File.Truncate(n)
}

func (f *rpFile) Stat() (os.FileInfo, error) {
	if f.on(rpStat) {
		panic("stat bug")
	}
	return f.File.Stat()
}

func (f *rpFile) Close() error {
	if f.on(rpClose) {
		panic("close bug")
	}
	return f.File.Close()
}

func (f *rpFile) ReadAt(b []byte, off int64) (int, error) {
	if f.on(rpReadAt) {
		panic("readat bug")
	}
	return f.File.ReadAt(b, off)
}

func rpOpen(t *testing.T) (*FileSink, *rpFile, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &rpFile{File: s.f.(*os.File)}
	s.f = f
	return s, f, path
}

// rpWrite writes e with a deadline: a hang fails the test instead of the run.
func rpWrite(t *testing.T, s Sink, e Event) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Write(context.Background(), e) }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("write of %s hangs", e.EventID)
		return nil
	}
}

func rpIDs(t *testing.T, path string) []string {
	t.Helper()
	evs, err := ReadFile(path)
	if err != nil {
		raw, _ := os.ReadFile(path)
		t.Fatalf("file does not read strictly: %v (tail %q)", err, raw[max(len(raw)-60, 0):])
	}
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.EventID)
	}
	return ids
}

// At every fault point of appendLocked a panic fails the write with
// ErrSinkPanicked, is recorded for Check, hangs no one, and once the
// fault clears the next write lands on a line boundary with exactly the
// events that were reported written (checked after that next write, which
// cuts what the panic left).
func TestReviewPanic2FileSinkEachStepRecovers(t *testing.T) {
	type step struct {
		name  string
		fault int32
		high  bool
		prep  func(t *testing.T, s *FileSink, f *rpFile, path string)
	}
	steps := []step{
		{name: "write part", fault: rpWritePart},
		{name: "write all", fault: rpWriteAll},
		{name: "sync", fault: rpSync},
		{name: "stat (shrinkToFile)", fault: rpStat},
		{name: "stat (followPath, high)", fault: rpStat, high: true},
		{name: "truncate after EIO", fault: rpWriteEIO | rpTruncate},
		{name: "readAt after copytruncate", fault: rpReadAt, prep: func(t *testing.T, s *FileSink, f *rpFile, path string) {
			// cut from outside to a non-line boundary: shrinkToFile reads.
			if err := os.Truncate(path, 10); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "old close in followPath (renamed away, high)", fault: rpClose, high: true, prep: func(t *testing.T, s *FileSink, f *rpFile, path string) {
			if err := os.Rename(path, path+".1"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			s, f, path := rpOpen(t)
			defer s.Close()
			at := t0
			next := func(high bool) Event {
				at = at.Add(time.Millisecond)
				if high {
					return revokeEvent(at)
				}
				return acquireEvent(at)
			}
			var want []string
			for range 2 {
				e := next(false)
				if err := rpWrite(t, s, e); err != nil {
					t.Fatal(err)
				}
				want = append(want, e.EventID)
			}
			if st.prep != nil {
				st.prep(t, s, f, path)
				want = nil
			}
			f.faults.Store(st.fault)
			bad := next(st.high)
			err := rpWrite(t, s, bad)
			if err == nil {
				t.Fatal("write succeeded through the fault")
			}
			if st.fault&(rpWriteEIO) == 0 && !errors.Is(err, ErrSinkPanicked) {
				t.Fatalf("err %v, want ErrSinkPanicked", err)
			}
			s.mu.Lock()
			failed := s.failed
			s.mu.Unlock()
			if failed == nil {
				t.Fatal("the panic is not recorded for Check")
			}
			f.faults.Store(0)
			good := next(st.high)
			if err := rpWrite(t, s, good); err != nil {
				t.Fatalf("write after the fault cleared: %v", err)
			}
			want = append(want, good.EventID)
			if err := s.Check(context.Background()); err != nil {
				t.Fatalf("Check after recovery: %v", err)
			}
			if got := rpIDs(t, path); !slices.Equal(got, want) {
				t.Fatalf("file holds %v, want %v", got, want)
			}
		})
	}
}

// A panic in Sync after the bytes were written (or in Write after all of
// them were) reports the event as not written, so its line must go at
// once, as on the error path: a Close (shutdown) or crash before the next
// write would otherwise keep it for good (OpenFile keeps a whole line).
func TestReviewPanic2SyncPanicLeavesNoFailedEvent(t *testing.T) {
	for _, fault := range []int32{rpSync, rpWriteAll} {
		s, f, path := rpOpen(t)
		ok := acquireEvent(t0)
		if err := rpWrite(t, s, ok); err != nil {
			t.Fatal(err)
		}
		f.faults.Store(fault)
		bad := acquireEvent(t0.Add(time.Millisecond))
		if err := rpWrite(t, s, bad); !errors.Is(err, ErrSinkPanicked) {
			t.Fatalf("err %v, want ErrSinkPanicked", err)
		}
		f.faults.Store(0)
		if got := rpIDs(t, path); slices.Contains(got, bad.EventID) {
			t.Errorf("fault %d: right after the failed write the file holds the failed event %s: %v", fault, bad.EventID, got)
		}
		s.Close()
		s2, err := OpenFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s2.Close()
		if got := rpIDs(t, path); slices.Contains(got, bad.EventID) {
			t.Errorf("fault %d: after Close and reopen the file keeps for good the event whose write failed: %v", fault, got)
		}
	}
}

// The same in batch form: a batch of two lines whose Write panics after
// the first whole line fails both writers, and a reopen (after Close or a
// crash) must find neither line.
func TestReviewPanic2BatchPanicKeepsNoLine(t *testing.T) {
	s, f, path := rpOpen(t)
	// Hold a batch in flight so the next two writers share one batch.
	block := make(chan struct{})
	inWrite := make(chan struct{})
	var once sync.Once
	s.f = &blockingFile{rpFile: f, block: block, entered: func() { once.Do(func() { close(inWrite) }) }}
	first := acquireEvent(t0)
	go func() { _ = s.Write(context.Background(), first) }()
	<-inWrite
	a, b := acquireEvent(t0.Add(time.Millisecond)), acquireEvent(t0.Add(2*time.Millisecond))
	errs := make(chan error, 2)
	go func() { errs <- s.Write(context.Background(), a) }()
	go func() { errs <- s.Write(context.Background(), b) }()
	for s.lines.Queued() < 2 {
		time.Sleep(time.Millisecond)
	}
	f.faults.Store(rpWritePart) // the next Write call is the batch of a and b
	close(block)
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrSinkPanicked) {
			t.Fatalf("a batched writer got %v, want ErrSinkPanicked", err)
		}
	}
	f.faults.Store(0)
	s.Close()
	s2, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	got := rpIDs(t, path)
	if slices.Contains(got, a.EventID) || slices.Contains(got, b.EventID) {
		t.Fatalf("after reopen the file holds an event whose write failed: %v (failed %s, %s)", got, a.EventID, b.EventID)
	}
}

// blockingFile passes its first Write through only once block is closed;
// later calls go to rpFile.
type blockingFile struct {
	*rpFile
	block   chan struct{}
	entered func()
	n       int
}

func (f *blockingFile) Write(b []byte) (int, error) {
	f.n++ // under the sink's mu
	if f.n > 1 {
		return f.rpFile.Write(b)
	}
	f.entered()
	<-f.block
	return f.File.Write(b)
}

// Concurrent writers while every third append panics: every writer is
// answered exactly once, the queue keeps running, and the file holds
// exactly the events reported written (after a final clean write).
func TestReviewPanic2FileSinkConcurrentPanics(t *testing.T) {
	s, f, path := rpOpen(t)
	defer s.Close()
	f.every.Store(3)
	var mu sync.Mutex
	var okIDs, badIDs []string
	var wg sync.WaitGroup
	var seq atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				e := acquireEvent(t0.Add(time.Duration(seq.Add(1)) * time.Microsecond))
				e.RequestID = "w" + string(rune('a'+w))
				err := s.Write(context.Background(), e)
				mu.Lock()
				if err == nil {
					okIDs = append(okIDs, e.EventID)
				} else {
					if !errors.Is(err, ErrSinkPanicked) {
						t.Errorf("unexpected error %v", err)
					}
					badIDs = append(badIDs, e.EventID)
				}
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("writers hang while appends panic")
	}
	if len(okIDs)+len(badIDs) != 320 || len(badIDs) == 0 {
		t.Fatalf("%d ok + %d failed, want 320 with some failed", len(okIDs), len(badIDs))
	}
	f.every.Store(0)
	last := acquireEvent(t0.Add(time.Hour))
	if err := rpWrite(t, s, last); err != nil {
		t.Fatal(err)
	}
	got := rpIDs(t, path)
	want := append(slices.Clone(okIDs), last.EventID)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("file holds %d events, %d reported written", len(got), len(want))
	}
}

// A file op that ends the goroutine (runtime.Goexit, which Recovered
// cannot stop) must still answer its batch and hand the group-commit queue
// on: otherwise the queue stays "running" with nobody running it, and
// every later Write of the sink hangs.
func TestReviewPanic2FileSinkGoexitDoesNotStallQueue(t *testing.T) {
	s, f, _ := rpOpen(t)
	f.faults.Store(rpWriteGoexit)
	go func() { _ = s.Write(context.Background(), acquireEvent(t0)) }()
	time.Sleep(50 * time.Millisecond)
	f.faults.Store(0)
	done := make(chan error, 1)
	go func() { done <- s.Write(context.Background(), acquireEvent(t0.Add(time.Millisecond))) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write after Goexit: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("every write hangs after one append's goroutine ended (runtime.Goexit) inside the file sink")
	}
	s.Close()
}

// A backend that ends the writer's goroutine (runtime.Goexit) in
// Spool.Write must not leave the spool's read lock held: every later write
// that has to spool, and Close, would hang (as they did for a panic before
// the Spool recovered its backend's).
func TestReviewPanic2SpoolBackendGoexitReleasesLock(t *testing.T) {
	var gone atomic.Bool
	gone.Store(true)
	be := funcSink(func(context.Context, Event) error {
		if gone.Load() {
			runtime.Goexit()
		}
		return errors.New("down")
	})
	sp, err := OpenSpool(filepath.Join(t.TempDir(), "spool.jsonl"), be, SpoolOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = sp.Write(context.Background(), acquireEvent(t0)) }()
	time.Sleep(50 * time.Millisecond)
	gone.Store(false)
	done := make(chan error, 1)
	go func() { done <- sp.Write(context.Background(), acquireEvent(t0.Add(time.Millisecond))) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a spool write hangs after its backend ended a writer's goroutine (runtime.Goexit): the read lock is still held")
	}
	sp.Close()
}

// onceBackend, in Write and WriteOnce alike, panics before storing on
// one call in three, stores then panics on the next, and stores on the
// third. WriteOnce stores an event once by id.
type onceBackend struct {
	mu    sync.Mutex
	calls int
	got   []string
	seen  map[string]bool
	dead  atomic.Bool
}

func (b *onceBackend) write(e Event, once bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.calls
	b.calls++
	if b.dead.Load() || c%3 == 0 {
		panic("before storing")
	}
	if !once || !b.seen[e.EventID] {
		b.got = append(b.got, e.EventID)
		b.seen[e.EventID] = true
	}
	if c%3 == 1 {
		panic("after storing")
	}
	return nil
}

func (b *onceBackend) Write(_ context.Context, e Event) error     { return b.write(e, false) }
func (b *onceBackend) WriteOnce(_ context.Context, e Event) error { return b.write(e, true) }
func (b *onceBackend) Close() error                               { return nil }

// Spool with a backend panicking before and after storing, in Write and
// WriteOnce: every Write succeeds (spooled), no writer hangs, every event
// reaches the backend at least once, the spooled ones exactly once, in
// order relative to each other; Close while the backend panics keeps what
// waits, and the next OpenSpool forwards it.
func TestReviewPanic2SpoolPanickyOnceBackend(t *testing.T) {
	be := &onceBackend{seen: map[string]bool{}}
	path := filepath.Join(t.TempDir(), "spool.jsonl")
	sp, err := OpenSpool(path, be, SpoolOptions{RetryInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 30 {
		e := acquireEvent(t0.Add(time.Duration(i) * time.Millisecond))
		ids = append(ids, e.EventID)
		if err := rpWrite(t, sp, e); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); sp.Pending() > 0; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pending %d never drains", sp.Pending())
		}
	}
	if err := sp.Check(context.Background()); err != nil {
		t.Fatalf("Check once drained: %v", err)
	}
	be.mu.Lock()
	got := slices.Clone(be.got)
	be.mu.Unlock()
	for _, id := range ids {
		if !slices.Contains(got, id) {
			t.Fatalf("event %s never reached the backend", id)
		}
	}
	// Events reach the backend in write order (first arrival).
	var first []string
	for _, id := range got {
		if !slices.Contains(first, id) {
			first = append(first, id)
		}
	}
	if !slices.Equal(first, ids) {
		t.Fatalf("arrival order %v, want %v", first, ids)
	}

	// Close while the backend panics on everything: the spooled event stays.
	be.dead.Store(true)
	late := acquireEvent(t0.Add(time.Hour))
	if err := rpWrite(t, sp, late); err != nil {
		t.Fatal(err)
	}
	if sp.Pending() != 1 {
		t.Fatalf("pending %d, want 1", sp.Pending())
	}
	// A forwarding attempt, panicking, must have run before Check reports
	// it: under load the first may take longer than a few retry intervals.
	var checkErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if checkErr = sp.Check(context.Background()); checkErr != nil {
			break
		}
	}
	if checkErr == nil || !strings.Contains(checkErr.Error(), "1 events spooled") {
		t.Fatalf("Check while the backend panics: %v", checkErr)
	}
	closed := make(chan error, 1)
	go func() { closed <- sp.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs while the backend panics")
	}
	be.dead.Store(false)
	sp2, err := OpenSpool(path, be, SpoolOptions{RetryInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sp2.Close()
	for deadline := time.Now().Add(10 * time.Second); sp2.Pending() > 0; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("reopened spool: pending %d never drains", sp2.Pending())
		}
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if !slices.Contains(be.got, late.EventID) {
		t.Fatal("the event spooled at Close was not forwarded after reopen")
	}
}

// End to end: the spool's own file sink panics in Sync while the backend
// is down, so Spool.Write fails (the caller is told the event was not
// recorded); the line must not stay in the spool file, to be counted and
// forwarded after Close and OpenSpool.
func TestReviewPanic2SpoolForwardsNoFailedEvent(t *testing.T) {
	var up atomic.Bool
	var mu sync.Mutex
	var got []string
	be := funcSink(func(_ context.Context, e Event) error {
		if !up.Load() {
			return errors.New("down")
		}
		mu.Lock()
		got = append(got, e.EventID)
		mu.Unlock()
		return nil
	})
	path := filepath.Join(t.TempDir(), "spool.jsonl")
	sp, err := OpenSpool(path, be, SpoolOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := &rpFile{File: sp.local.f.(*os.File)}
	sp.local.f = f
	f.faults.Store(rpSync)
	bad := acquireEvent(t0)
	if err := rpWrite(t, sp, bad); err == nil {
		t.Fatal("spool write succeeded though neither backend nor spool file took it")
	}
	f.faults.Store(0)
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	up.Store(true)
	sp2, err := OpenSpool(path, be, SpoolOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sp2.Close()
	_ = sp2.Forward(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(got, bad.EventID) {
		t.Fatalf("the backend got %s, whose Spool.Write failed (pending after reopen was %d)", bad.EventID, len(got))
	}
}
