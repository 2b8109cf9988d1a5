package audit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// review3Lines reads the file's lines (each must decode) and returns their
// event ids in file order.
func review3IDs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("%s ends in a partial line", path)
	}
	var ids []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, MaxEventBytes+2), MaxEventBytes+2)
	for sc.Scan() {
		e, err := Unmarshal(sc.Bytes())
		if err != nil {
			t.Fatalf("line %d of %s does not decode: %v", len(ids)+1, path, err)
		}
		ids = append(ids, e.EventID)
	}
	return ids
}

func review3Count(ids []string) map[string]int {
	m := map[string]int{}
	for _, id := range ids {
		m[id]++
	}
	return m
}

// Attack: many concurrent writers (normal and high-priority), some with a
// cancelled context; every nil Write is in the file exactly once as a whole
// line, every failed one is absent, and per-writer order holds.
func TestReview3FileSinkConcurrentExactlyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const writers, each = 16, 25
	type res struct {
		id  string
		err error
	}
	out := make([][]res, writers)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				e := acquireEvent(t0.Add(time.Duration(w*each+i) * time.Millisecond))
				if i%5 == 0 {
					e = revokeEvent(t0.Add(time.Duration(w*each+i) * time.Millisecond))
				}
				ctx, cancel := context.WithCancel(context.Background())
				if i%7 == 0 {
					go cancel() // races the queued write
				}
				err := s.Write(ctx, e)
				cancel()
				out[w] = append(out[w], res{e.EventID, err})
			}
		}()
	}
	wg.Wait()
	got := review3IDs(t, path)
	count := review3Count(got)
	pos := map[string]int{}
	for i, id := range got {
		pos[id] = i
	}
	for w := range out {
		last := -1
		for _, r := range out[w] {
			switch {
			case r.err == nil && count[r.id] != 1:
				t.Fatalf("accepted event %s is in the file %d times", r.id, count[r.id])
			case r.err != nil && count[r.id] != 0:
				t.Fatalf("failed event %s (%v) is in the file", r.id, r.err)
			case r.err == nil:
				if pos[r.id] < last {
					t.Fatalf("writer %d's events out of order in the file", w)
				}
				last = pos[r.id]
			}
		}
	}
}

// Attack: a high-priority event queued behind a normal append, while the
// file is renamed away, shares a batch with normal events: it must still
// land in the file at the path (the batch follows the path).
func TestReview3HighInBatchFollowsPath(t *testing.T) {
	s, gf, path := openGated(t)
	first := make(chan error, 1)
	go func() { first <- s.Write(context.Background(), acquireEvent(t0)) }()
	<-gf.entered
	if err := os.Rename(path, path+".rotated"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	events := []Event{acquireEvent(t0.Add(time.Millisecond)), revokeEvent(t0.Add(2 * time.Millisecond)),
		acquireEvent(t0.Add(3 * time.Millisecond)), denyEvent(t0.Add(4 * time.Millisecond))}
	for i := range events {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Write(context.Background(), events[i]) }()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		q := s.lines.Queued()
		if q == len(events) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writers never queued")
		}
	}
	close(gf.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	at := review3Count(review3IDs(t, path))
	if at[events[1].EventID] != 1 {
		t.Fatalf("the revoke batched with normal events is not in the file at the path: %v", at)
	}
	for _, e := range events {
		if at[e.EventID] != 1 {
			t.Fatalf("event %s of the revoke's batch is not at the path once", e.EventID)
		}
	}
	if s.Reopened() != 1 {
		t.Fatalf("reopened %d times", s.Reopened())
	}
}

// Attack: Close while writers are queued behind an fsync: nobody hangs,
// each queued writer gets nil (and is in the file) or ErrClosed (and is
// not), and later writes get ErrClosed.
func TestReview3CloseWithQueuedWriters(t *testing.T) {
	s, gf, path := openGated(t)
	first := make(chan error, 1)
	go func() { first <- s.Write(context.Background(), acquireEvent(t0)) }()
	<-gf.entered
	const n = 8
	errs := make([]error, n)
	events := make([]Event, n)
	var wg sync.WaitGroup
	for i := range events {
		events[i] = acquireEvent(t0.Add(time.Duration(i+1) * time.Millisecond))
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Write(context.Background(), events[i]) }()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		q := s.lines.Queued()
		if q == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writers never queued")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	time.Sleep(20 * time.Millisecond) // Close waits for the fsync in progress
	close(gf.release)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("queued writers hang after Close")
	}
	if err := <-first; err != nil {
		t.Fatalf("the writer in its fsync: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	at := review3Count(review3IDs(t, path))
	for i, err := range errs {
		switch {
		case err == nil && at[events[i].EventID] != 1:
			t.Fatalf("writer %d answered nil, not in file", i)
		case err != nil && !errors.Is(err, ErrClosed):
			t.Fatalf("writer %d: %v, want ErrClosed", i, err)
		case err != nil && at[events[i].EventID] != 0:
			t.Fatalf("writer %d failed but is in the file", i)
		}
	}
	if err := s.Write(context.Background(), acquireEvent(t0.Add(time.Hour))); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}

// Attack: a spool whose backend is down takes concurrent writes, then the
// backend recovers: the backend gets every accepted event exactly once, in
// the spool file's order, and the spool empties.
func TestReview3SpoolConcurrentForwardOnce(t *testing.T) {
	be := &review3Backend{down: true}
	path := filepath.Join(t.TempDir(), "spool.jsonl")
	sp, err := OpenSpool(path, be, SpoolOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	review3StopLoop(sp)
	const n = 120
	accepted := make([]string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := acquireEvent(t0.Add(time.Duration(i) * time.Millisecond))
			if i == n/2 {
				be.setDown(false) // the backend recovers mid-stream
			}
			if err := sp.Write(context.Background(), e); err == nil {
				accepted[i] = e.EventID
			}
		}()
	}
	wg.Wait()
	order := review3IDs(t, path)
	be.setDown(false)
	if err := sp.Forward(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := be.ids()
	c := review3Count(got)
	for _, id := range accepted {
		if id == "" {
			t.Fatal("a spool write failed")
		}
		if c[id] != 1 {
			t.Fatalf("event %s reached the backend %d times", id, c[id])
		}
	}
	// The spooled ones in spool order.
	idx := map[string]int{}
	for i, id := range got {
		idx[id] = i
	}
	for i := 1; i < len(order); i++ {
		if idx[order[i]] < idx[order[i-1]] {
			t.Fatalf("spooled events forwarded out of spool order")
		}
	}
	if sp.Pending() != 0 {
		t.Fatalf("pending %d", sp.Pending())
	}
}

type review3Backend struct {
	mu   sync.Mutex
	down bool
	got  []string
}

func (b *review3Backend) setDown(d bool) { b.mu.Lock(); b.down = d; b.mu.Unlock() }
func (b *review3Backend) ids() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got...)
}
func (b *review3Backend) Write(ctx context.Context, e Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return errors.New("backend down")
	}
	b.got = append(b.got, e.EventID)
	return nil
}
func (b *review3Backend) Close() error { return nil }

// Attack: Multi writes concurrently: every sink is tried even when others
// fail, every error is reported, and a slow sink is waited for.
func TestReview3MultiReportsAllErrors(t *testing.T) {
	e1, e2 := errors.New("sink one failed"), errors.New("sink three failed")
	var slowDone atomic.Bool
	sinks := []Sink{
		funcSink(func(context.Context, Event) error { return e1 }),
		funcSink(func(context.Context, Event) error {
			time.Sleep(50 * time.Millisecond)
			slowDone.Store(true)
			return nil
		}),
		funcSink(func(context.Context, Event) error { return e2 }),
	}
	err := Multi(sinks...).Write(context.Background(), acquireEvent(t0))
	if !errors.Is(err, e1) || !errors.Is(err, e2) {
		t.Fatalf("Multi error %v, want both", err)
	}
	if !slowDone.Load() {
		t.Fatal("Multi returned before its slow sink finished")
	}
	if err := Multi().Write(context.Background(), acquireEvent(t0)); err != nil {
		t.Fatal(err)
	}
}

// Attack: a sink panics while Multi writes to it. The panic of a sink
// written from Multi's own goroutine would end the process; either sink's
// panic must come back as an error of that write, and the other sinks
// still get the event.
func TestMultiSinkPanicIsAnError(t *testing.T) {
	for _, at := range []int{0, 1, 2} {
		var wrote atomic.Int32
		sinks := make([]Sink, 3)
		for i := range sinks {
			sinks[i] = funcSink(func(context.Context, Event) error {
				if i == at {
					panic("sink bug: secret-ish value")
				}
				wrote.Add(1)
				return nil
			})
		}
		err := Multi(sinks...).Write(context.Background(), acquireEvent(t0))
		if !errors.Is(err, ErrSinkPanicked) {
			t.Fatalf("sink %d panicked: Multi returned %v, want ErrSinkPanicked", at, err)
		}
		if strings.Contains(err.Error(), "secret-ish") {
			t.Fatalf("the error quotes the panic's value: %v", err)
		}
		if wrote.Load() != 2 {
			t.Fatalf("sink %d panicked: %d other sinks wrote, want 2", at, wrote.Load())
		}
	}
}

type funcSink func(context.Context, Event) error

func (f funcSink) Write(ctx context.Context, e Event) error { return f(ctx, e) }
func (f funcSink) Close() error                             { return nil }

// Attack: the spool's truncateTo(0) after forwarding fails half-way (the
// truncate lands, its fsync fails): the spool must still forward the
// events spooled afterwards (its read offset must follow the file).
func TestReview3SpoolTruncateFsyncFailure(t *testing.T) {
	be := &review3Backend{down: true}
	path := filepath.Join(t.TempDir(), "spool.jsonl")
	sp, err := OpenSpool(path, be, SpoolOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	review3StopLoop(sp)
	for i := 0; i < 3; i++ {
		if err := sp.Write(context.Background(), acquireEvent(t0.Add(time.Duration(i)*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
	}
	ff := &faultyFile{File: sp.local.f.(*os.File), failSync: true}
	sp.local.f = ff
	be.setDown(false)
	_ = sp.Forward(context.Background()) // truncateTo(0) fails on its fsync
	ff.failSync = false
	be.setDown(true)
	var late []string
	for i := 0; i < 6; i++ {
		e := acquireEvent(t0.Add(time.Second + time.Duration(i)*time.Millisecond))
		if err := sp.Write(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		late = append(late, e.EventID)
	}
	be.setDown(false)
	ferr := sp.Forward(context.Background())
	c := review3Count(be.ids())
	for _, id := range late {
		if c[id] != 1 {
			fi, _ := os.Stat(path)
			t.Fatalf("event spooled after a failed truncate reached the backend %d times (forward: %v; pending %d, offset %d, file %d bytes, bad lines %d)",
				c[id], ferr, sp.Pending(), sp.offset, fi.Size(), sp.BadLines())
		}
	}
}

// review3StopLoop stops the spool's background forwarder, so the test's
// own Forward calls are the only ones (Close still works).
func review3StopLoop(sp *Spool) {
	close(sp.stop)
	<-sp.done
	sp.stop, sp.done = make(chan struct{}), make(chan struct{})
	close(sp.done)
}
