package audit

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// gatedFile counts fsyncs; the first one waits until release is closed, so
// writers queue behind it. failSyncs makes every fsync after the first fail.
type gatedFile struct {
	*os.File
	syncs     atomic.Int64
	entered   chan struct{}
	release   chan struct{}
	failSyncs atomic.Bool
}

func (f *gatedFile) Sync() error {
	if f.syncs.Add(1) == 1 {
		close(f.entered)
		<-f.release
		return f.File.Sync()
	}
	if f.failSyncs.Load() {
		return syscall.EIO
	}
	return f.File.Sync()
}

// queueBehindFirst writes one event, and n more once the first is inside
// its fsync; it waits until all n are queued, lets the first finish and
// returns every writer's error (the first's last).
func queueBehindFirst(t *testing.T, s *FileSink, gf *gatedFile, n int) []error {
	t.Helper()
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[n] = s.Write(context.Background(), acquireEvent(t0)) }()
	<-gf.entered
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = s.Write(context.Background(), acquireEvent(t0.Add(time.Duration(i+1)*time.Millisecond)))
		}(i)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		queued := s.lines.Queued()
		if queued == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d writers queued", queued, n)
		}
	}
	close(gf.release)
	wg.Wait()
	return errs
}

func openGated(t *testing.T) (*FileSink, *gatedFile, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gf := &gatedFile{File: s.f.(*os.File), entered: make(chan struct{}), release: make(chan struct{})}
	s.f = gf
	return s, gf, path
}

// Writers that arrive during an append share the next one: 1+20 events,
// two fsyncs, every event in the file once, as whole lines.
func TestFileSinkGroupCommitSharesFsync(t *testing.T) {
	s, gf, path := openGated(t)
	for i, err := range queueBehindFirst(t, s, gf, 20) {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if got := gf.syncs.Load(); got != 2 {
		t.Fatalf("21 events took %d fsyncs, want 2", got)
	}
	assertWhole(t, path, 21)
}

// A batch whose fsync fails fails as a whole: every writer of it gets the
// error, none of its lines stays, and the sink writes again afterwards.
func TestFileSinkGroupCommitFailsAWholeBatch(t *testing.T) {
	s, gf, path := openGated(t)
	gf.failSyncs.Store(true)
	errs := queueBehindFirst(t, s, gf, 5)
	if errs[5] != nil {
		t.Fatalf("the first writer, alone in its batch: %v", errs[5])
	}
	for i, err := range errs[:5] {
		if err == nil {
			t.Fatalf("writer %d of the failed batch reported success", i)
		}
	}
	assertWhole(t, path, 1)
	gf.failSyncs.Store(false)
	if err := s.Write(context.Background(), acquireEvent(t0.Add(time.Minute))); err != nil {
		t.Fatalf("write after the fault cleared: %v", err)
	}
	assertWhole(t, path, 2)
}

// seqGatedFile blocks its i-th fsync until gates[i] is closed.
type seqGatedFile struct {
	*os.File
	n     atomic.Int64
	gates []chan struct{}
	in    []chan struct{}
}

func (f *seqGatedFile) Sync() error {
	i := int(f.n.Add(1)) - 1
	if i < len(f.gates) {
		close(f.in[i])
		<-f.gates[i]
	}
	return f.File.Sync()
}

// The writer that appended a batch is answered once its batch is durable,
// even while later batches keep the sink busy: the queue is handed on.
func TestFileSinkAppenderAnsweredAfterItsOwnBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f := &seqGatedFile{File: s.f.(*os.File), gates: []chan struct{}{make(chan struct{}), make(chan struct{})},
		in: []chan struct{}{make(chan struct{}), make(chan struct{})}}
	s.f = f
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- s.Write(context.Background(), acquireEvent(t0)) }()
	<-f.in[0]
	go func() { second <- s.Write(context.Background(), acquireEvent(t0.Add(time.Millisecond))) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		queued := s.lines.Queued()
		if queued == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second writer never queued")
		}
	}
	close(f.gates[0])
	<-f.in[1] // the second batch is in its fsync, held
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(f.gates[1]) // let the sink finish, so Close does not wait forever
		t.Fatal("the first writer is not answered while a later batch is in progress")
	}
	close(f.gates[1])
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	assertWhole(t, path, 2)
}
