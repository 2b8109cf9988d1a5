package audit

// Second review of audit.Indexed (after b57936b): attack tests. Tests named
// ...Defect... demonstrate a defect and fail on the reviewed code; ...Held...
// show a claim that held. Reuses memIndex and helpers of
// review_indexed_test.go.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func review2Event() Event {
	return acquireEvent(t0.Add(time.Duration(reviewClock.Add(1)) * time.Millisecond))
}

// DEFECT (claim 2): the only documented gap after rotation is "rotated
// away before a crash". Without any crash, events that overflowed while
// audit.db was failing are never indexed once audit.jsonl is renamed away
// (logrotate's default create mode; /readyz's Check follows the path):
// catching up reads the new file only. Nothing reports the gap afterwards:
// Waiting is 0, Check is nil and OnBehind is not called.
func TestReview2IndexedDefectRotationDuringOverflowLosesEventsWithoutCrash(t *testing.T) {
	review2Rotate(t, func(path string) error { return os.Rename(path, path+".1") })
}

// DEFECT (claim 2): the same with logrotate copytruncate: the file is cut
// to 0 while lines overflowed; the next append finds it shorter
// (shrinkToFileLocked) and catching up reads only the new lines.
func TestReview2IndexedDefectCopytruncateDuringOverflowLosesEventsWithoutCrash(t *testing.T) {
	review2Rotate(t, func(path string) error { return os.Truncate(path, 0) })
}

func review2Rotate(t *testing.T, rotate func(string) error) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	idx := newMemIndex()
	idx.failing.Store(true)
	var behind atomic.Int64
	_, s := reviewOpen(t, path, idx, IndexedOptions{MaxBehind: 4, RetryInterval: time.Hour, Gather: -1,
		OnBehind: func(n int) { behind.Add(int64(n)) }})
	defer s.Close()
	var ids []string
	for range 12 {
		e := review2Event()
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.EventID)
	}
	if err := rotate(path); err != nil {
		t.Fatal(err)
	}
	// The readiness probe notices the rotation and opens a new audit.jsonl.
	_ = s.Check(ctx)
	for range 3 {
		e := review2Event()
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.EventID)
	}
	idx.failing.Store(false)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := idx.snapshot()
	var missing []int
	for i, id := range ids {
		if got[id] == 0 {
			missing = append(missing, i)
		}
	}
	// Fixed: the 4 lines waiting in memory and the 3 written after the
	// rotation reach the index; the 8 overflow lines, left in the rotated
	// file before they were read back, are reported (OnBehind), not lost
	// silently.
	if want := []int{4, 5, 6, 7, 8, 9, 10, 11}; !slices.Equal(missing, want) || behind.Load() != int64(len(want)) {
		t.Fatalf("audit.db lacks events %v of %d written, OnBehind reported %d lines: want %v, reported",
			missing, len(ids), behind.Load(), want)
	}
}

// writeFailIndex is memIndex whose reads work while its writes fail (a
// bbolt file that cannot grow: Holds is a read transaction and succeeds).
type writeFailIndex struct {
	*memIndex
	failAdds   atomic.Bool
	holdsCalls atomic.Int64
	holdsLines atomic.Int64
}

func (w *writeFailIndex) AddMissing(ctx context.Context, lines [][]byte, taken bool) (int, int, error) {
	if w.failAdds.Load() {
		return 0, 0, fmt.Errorf("audit: write: %w", syscall.ENOSPC)
	}
	return w.memIndex.AddMissing(ctx, lines, taken)
}

func (w *writeFailIndex) Holds(ctx context.Context, lines [][]byte) (bool, error) {
	w.holdsCalls.Add(1)
	w.holdsLines.Add(int64(len(lines)))
	return w.memIndex.Holds(ctx, lines)
}

// DEFECT (retry amplification, time blowup): while audit.db cannot take
// writes but can be read, every retry (each RetryInterval, default 1 s)
// of an overflow re-reads and decodes the whole unindexed tail backwards
// (up to MaxRuns×2×MaxBehind = 2M lines, ~1 GB) only to fail the first
// AddMissing again. Work per retry grows with the outage instead of being
// bounded; the scan's frontier is not remembered.
func TestReview2IndexedDefectFailedRetryRescansWholeOverflow(t *testing.T) {
	ctx := context.Background()
	idx := &writeFailIndex{memIndex: newMemIndex()}
	idx.failAdds.Store(true)
	_, s := reviewOpen(t, filepath.Join(t.TempDir(), "audit.jsonl"), idx,
		IndexedOptions{MaxBehind: 4, RetryInterval: time.Hour, Gather: -1})
	defer s.Close()
	const n = 2000
	for range n {
		if err := s.Write(ctx, review2Event()); err != nil {
			t.Fatal(err)
		}
	}
	const retries = 5
	idx.holdsLines.Store(0)
	for range retries {
		if err := s.Flush(ctx); err == nil {
			t.Fatal("Flush succeeded with a failing index")
		}
	}
	per := idx.holdsLines.Load() / retries
	t.Logf("lines read back and decoded per failed retry: %d (of %d waiting)", per, s.Waiting())
	if per > 2*2*4 {
		t.Fatalf("each failed retry re-reads %d lines of the file (whole overflow), not a bounded amount", per)
	}
}

// Measurement with defaults: one failed retry with a large overflow, and a
// Write's latency meanwhile (linesBefore holds the file's mutex).
func TestReview2IndexedHeldMeasureFailedRetryWithDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	ctx := context.Background()
	idx := &writeFailIndex{memIndex: newMemIndex()}
	idx.failAdds.Store(true)
	f, s := reviewOpen(t, filepath.Join(t.TempDir(), "audit.jsonl"), idx, IndexedOptions{RetryInterval: time.Hour, Gather: -1})
	defer s.Close()
	n := 100_000
	if os.Getenv("REVIEW2_BIG") != "" {
		n = 1_000_000
	}
	// Fill the file fast: the file's own writes, batched.
	done := make(chan struct{})
	var i atomic.Int64
	for range 64 {
		go func() {
			for i.Add(1) <= int64(n) {
				if err := s.Write(ctx, review2Event()); err != nil {
					panic(err)
				}
			}
			done <- struct{}{}
		}()
	}
	for range 64 {
		<-done
	}
	_ = f
	stop := make(chan struct{})
	var worst atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				close(done)
				return
			default:
			}
			t1 := time.Now()
			_ = s.Write(ctx, review2Event())
			if d := int64(time.Since(t1)); d > worst.Load() {
				worst.Store(d)
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	worst.Store(0)
	t1 := time.Now()
	err := s.Flush(ctx)
	took := time.Since(t1)
	close(stop)
	<-done
	if err == nil {
		t.Fatal("Flush succeeded with a failing index")
	}
	t.Logf("overflow %d lines: one failed retry took %v, read back %d lines in %d Holds; worst concurrent Write %v",
		n, took, idx.holdsLines.Load(), idx.holdsCalls.Load(), time.Duration(worst.Load()))
}

// Held (claim 2): the start-up catch-up failing (index down) sets the
// overflow sentinel; Writes meanwhile wait; once the index recovers, the
// index holds exactly the file's events, once each, in file order.
func TestReview2IndexedHeldStartupFailureSentinelThenExact(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	idx := newMemIndex()
	// A first life whose index never got the last 9 events (crash).
	{
		f, err := OpenFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for range 9 {
			if err := f.Write(ctx, review2Event()); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
	}
	idx.failing.Store(true)
	_, s := reviewOpen(t, path, idx, IndexedOptions{MaxBehind: 2, RetryInterval: time.Hour, Gather: -1})
	defer s.Close()
	if err := s.Check(ctx); !errors.Is(err, ErrIndexBehind) {
		t.Fatalf("Check = %v, want ErrIndexBehind", err)
	}
	for range 5 {
		if err := s.Write(ctx, review2Event()); err != nil {
			t.Fatal(err)
		}
	}
	idx.failing.Store(false)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ids := reviewFileIDs(t, path)
	idx.mu.Lock()
	order := append([]string(nil), idx.order...)
	idx.mu.Unlock()
	if len(order) != len(ids) {
		t.Fatalf("index holds %d events, file %d", len(order), len(ids))
	}
	for i := range ids {
		if order[i] != ids[i] {
			t.Fatalf("index order differs from file order at %d", i)
		}
	}
	if s.Waiting() != 0 || s.Check(ctx) != nil {
		t.Fatalf("Waiting=%d Check=%v", s.Waiting(), s.Check(ctx))
	}
}

// Measurement (claim 1): how long one run's read back (linesBefore of
// 2×DefaultMaxBehind lines) holds the file's mutex, during which every
// Write waits; catching up does it twice per run.
func TestReview2IndexedHeldMeasureLinesBeforeHoldsFileMutex(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	{
		w, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 * 2 * DefaultMaxBehind {
			b, err := Marshal(review2Event())
			if err != nil {
				t.Fatal(err)
			}
			w.Write(append(b, '\n'))
		}
		w.Close()
	}
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var worst time.Duration
	for range 5 {
		t1 := time.Now()
		lines, _, _, err := f.linesBefore(-1, 2*DefaultMaxBehind)
		if err != nil || len(lines) != 2*DefaultMaxBehind {
			t.Fatal(err, len(lines))
		}
		worst = max(worst, time.Since(t1))
	}
	t1 := time.Now()
	_ = f.Write(ctx, review2Event())
	t.Logf("linesBefore(%d lines) holds the file mutex up to %v (a lone Write with fsync: %v)", 2*DefaultMaxBehind, worst, time.Since(t1))
}

// DEFECT (low, claim 2's OnBehind): OnBehind ("events before those lines
// may stay missing") fires whenever exactly MaxRuns runs were read, even
// when the last of them began at the file's start or the run before them
// is held: nothing stays missing, yet the log warns of a gap.
func TestReview2IndexedDefectOnBehindWarnsWithNothingMissing(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 { // exactly MaxRuns runs of 2×MaxBehind lines
		if err := f.Write(ctx, review2Event()); err != nil {
			t.Fatal(err)
		}
	}
	idx := newMemIndex()
	var behind atomic.Int64
	s, _, err := OpenIndexed(ctx, f, idx, IndexedOptions{MaxBehind: 1, MaxRuns: 2, OnBehind: func(n int) { behind.Store(int64(n)) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := len(idx.snapshot()), len(reviewFileIDs(t, path)); got != want {
		t.Fatalf("index holds %d of %d", got, want)
	}
	if behind.Load() != 0 {
		t.Fatalf("OnBehind(%d) although audit.db now holds every event of the file", behind.Load())
	}
}

// DEFECT (claim 4, time): Close "adds what waits (one last try)"; with
// audit.db failing its writes (readable: Holds works) and a large
// unindexed tail, that last try re-reads and decodes the whole tail (up
// to 2M lines) before it fails, so a SIGTERM'd server takes seconds to
// minutes to stop (systemd then kill -9s it). Here 100,000 lines.
func TestReview2IndexedDefectCloseSlowWithFailingIndexAndLargeTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	{
		w, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		for range 100_000 {
			b, err := Marshal(review2Event())
			if err != nil {
				t.Fatal(err)
			}
			w.Write(append(b, '\n'))
		}
		w.Close()
	}
	idx := &writeFailIndex{memIndex: newMemIndex()}
	idx.failAdds.Store(true)
	t1 := time.Now()
	_, s := reviewOpen(t, path, idx, IndexedOptions{RetryInterval: time.Hour, Gather: -1})
	opened := time.Since(t1)
	t1 = time.Now()
	_ = s.Close()
	closed := time.Since(t1)
	t.Logf("OpenIndexed %v, Close %v", opened, closed)
	if closed > 3*time.Second {
		t.Fatalf("Close took %v with the index failing", closed)
	}
}
