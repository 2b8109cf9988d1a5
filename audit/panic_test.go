package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A sink that ends Multi's goroutine without returning (runtime.Goexit)
// did not write: Multi must not report success.
func TestMultiSinkGoexitIsAnError(t *testing.T) {
	var wrote atomic.Int32
	ok := funcSink(func(context.Context, Event) error { wrote.Add(1); return nil })
	gone := funcSink(func(context.Context, Event) error { runtime.Goexit(); return nil })
	err := Multi(ok, gone, ok).Write(context.Background(), acquireEvent(t0))
	if !errors.Is(err, ErrSinkPanicked) {
		t.Fatalf("a sink that never returned: Multi returned %v, want ErrSinkPanicked", err)
	}
	if wrote.Load() != 2 {
		t.Fatalf("%d other sinks wrote, want 2", wrote.Load())
	}
}

// panickyBackend panics on every write while panics is set, and otherwise
// records the events it gets.
type panickyBackend struct {
	panics atomic.Bool
	mu     sync.Mutex
	got    []string
}

func (b *panickyBackend) Write(_ context.Context, e Event) error {
	if b.panics.Load() {
		panic("backend bug")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, e.EventID)
	return nil
}

func (b *panickyBackend) Close() error { return nil }

func (b *panickyBackend) events() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got...)
}

// A backend that panics is a backend that failed: the spool keeps the
// event (no lock is left held, so later writes and Close do not hang), the
// forwarder goroutine survives its own calls panicking, and once the
// backend is sound every event reaches it, in order.
func TestSpoolBackendPanicSpoolsTheEvent(t *testing.T) {
	be := &panickyBackend{}
	be.panics.Store(true)
	sp, err := OpenSpool(filepath.Join(t.TempDir(), "spool.jsonl"), be, SpoolOptions{RetryInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e1, e2 := acquireEvent(t0), acquireEvent(t0.Add(time.Millisecond))
	done := make(chan error, 2)
	go func() {
		done <- sp.Write(ctx, e1)
		done <- sp.Write(ctx, e2)
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a write the spool kept: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a spool write hangs after its backend panicked")
		}
	}
	// The forwarder retries every 5 ms, each call panicking.
	time.Sleep(100 * time.Millisecond)
	if n := sp.Pending(); n != 2 {
		t.Fatalf("pending %d, want both events spooled", n)
	}
	if err := sp.Check(ctx); err == nil || !strings.Contains(err.Error(), "2 events spooled") {
		t.Fatalf("Check while the backend panics: %v, want the 2 spooled events reported", err)
	}
	be.panics.Store(false)
	for deadline := time.Now().Add(10 * time.Second); sp.Pending() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pending %d: the forwarder did not deliver once the backend was sound", sp.Pending())
		}
	}
	if got := be.events(); len(got) != 2 || got[0] != e1.EventID || got[1] != e2.EventID {
		t.Fatalf("backend got %v, want [%s %s]", got, e1.EventID, e2.EventID)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
}

// panickyFile writes half of what it is given, then panics.
type panickyFile struct {
	*os.File
	panics bool
}

func (f *panickyFile) Write(b []byte) (int, error) {
	if f.panics {
		f.File.Write(b[:len(b)/2])
		panic("file bug")
	}
	return f.File.Write(b)
}

// A panic while the file sink appends fails that batch's writers (it does
// not leave the sink's lock held or its queue stuck), and the half line it
// left is cut off before the next line lands.
func TestFileSinkPanicFailsTheBatchOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pf := &panickyFile{File: s.f.(*os.File)}
	s.f = pf
	ctx := context.Background()
	if err := s.Write(ctx, acquireEvent(t0)); err != nil {
		t.Fatal(err)
	}
	pf.panics = true
	if err := s.Write(ctx, acquireEvent(t0.Add(time.Millisecond))); !errors.Is(err, ErrSinkPanicked) {
		t.Fatalf("write whose append panicked: %v, want ErrSinkPanicked", err)
	}
	if s.failed == nil {
		t.Fatal("a panicked append is not recorded for Check")
	}
	pf.panics = false
	done := make(chan error, 1)
	go func() { done <- s.Write(ctx, acquireEvent(t0.Add(2*time.Millisecond))) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write after the panic: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the file sink hangs after a panicked append")
	}
	assertWhole(t, path, 2)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after a successful write: %v", err)
	}
}
