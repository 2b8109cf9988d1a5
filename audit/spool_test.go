package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// backendSink is a backend audit store that can be down, or take an event
// and lose the reply; WriteOnce skips an event it holds.
type backendSink struct {
	mu       sync.Mutex
	down     bool
	lostAck  bool // store the event, then fail as if the reply were lost
	events   []Event
	onceCall int
}

var errDown = errors.New("backend down")

func (b *backendSink) Write(ctx context.Context, e Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return errDown
	}
	b.events = append(b.events, e)
	if b.lostAck {
		return errors.New("reply lost")
	}
	return nil
}

func (b *backendSink) WriteOnce(ctx context.Context, e Event) error {
	b.mu.Lock()
	b.onceCall++
	for _, have := range b.events {
		if have.EventID == e.EventID {
			b.mu.Unlock()
			return nil
		}
	}
	b.mu.Unlock()
	return b.Write(ctx, e)
}

func (b *backendSink) Close() error { return nil }

func (b *backendSink) set(down, lostAck bool) {
	b.mu.Lock()
	b.down, b.lostAck = down, lostAck
	b.mu.Unlock()
}

func (b *backendSink) ids() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, e := range b.events {
		out = append(out, e.RequestID)
	}
	return out
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for limit := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Issue 11 §5: events the backend cannot take are spooled durably and
// forwarded when it is back, in order and once each; events written while
// others wait do not overtake them; a spool survives a restart.
func TestSpoolForwardsInOrderOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit-spool.jsonl")
	b := &backendSink{}
	sp, err := OpenSpool(path, b, SpoolOptions{RetryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	at := t0
	ev := func(name string) Event {
		at = at.Add(time.Millisecond)
		e := acquireEvent(at)
		e.RequestID = name
		return e
	}
	write := func(names ...string) {
		t.Helper()
		for _, n := range names {
			if err := sp.Write(ctx, ev(n)); err != nil {
				t.Fatalf("write %s: %v", n, err)
			}
		}
	}
	write("e1")
	if sp.Pending() != 0 || strings.Join(b.ids(), ",") != "e1" {
		t.Fatalf("backend up: pending %d, backend %v", sp.Pending(), b.ids())
	}

	b.set(true, false)
	write("e2", "e3")
	if sp.Pending() != 2 {
		t.Fatalf("backend down: pending %d, want 2", sp.Pending())
	}
	if evs, err := ReadFile(path); err != nil || len(evs) != 2 {
		t.Fatalf("spool file: %d events, %v", len(evs), err)
	}
	waitFor(t, "Check to report the waiting events", func() bool { return sp.Check(ctx) != nil })
	b.set(false, false)
	write("e4") // events wait: it joins them, behind
	waitFor(t, "the spool to drain", func() bool { return sp.Pending() == 0 })
	if got := strings.Join(b.ids(), ","); got != "e1,e2,e3,e4" {
		t.Fatalf("backend holds %s, want e1,e2,e3,e4", got)
	}
	if err := sp.Check(ctx); err != nil {
		t.Fatalf("Check after draining: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("drained spool holds %d bytes", fi.Size())
	}

	// The backend took e5 but the reply was lost: spooled, then forwarded
	// through WriteOnce, which finds it there.
	b.set(false, true)
	write("e5")
	b.set(false, false)
	waitFor(t, "the spool to drain", func() bool { return sp.Pending() == 0 })
	if got := strings.Join(b.ids(), ","); got != "e1,e2,e3,e4,e5" {
		t.Fatalf("backend holds %s, want e5 once", got)
	}

	// Events still spooled at Close are forwarded by the next OpenSpool.
	b.set(true, false)
	write("e6", "e7")
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	b.set(false, false)
	sp2, err := OpenSpool(path, b, SpoolOptions{RetryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sp2.Close()
	waitFor(t, "the reopened spool to drain", func() bool { return sp2.Pending() == 0 })
	if got := strings.Join(b.ids(), ","); got != "e1,e2,e3,e4,e5,e6,e7" {
		t.Fatalf("backend holds %s after a restart", got)
	}
}

// With the spool file unwritable too, Write fails: the event was taken by
// neither.
func TestSpoolFailsOnlyWhenBothFail(t *testing.T) {
	dir := t.TempDir()
	b := &backendSink{down: true}
	sp, err := OpenSpool(filepath.Join(dir, "spool.jsonl"), b, SpoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	sp.local.f = &faultyFile{File: sp.local.f.(*os.File), tornWrite: true}
	if err := sp.Write(context.Background(), acquireEvent(t0)); err == nil {
		t.Fatal("Write succeeded with neither the backend nor the spool taking the event")
	}
	if sp.Pending() != 0 {
		t.Fatalf("pending %d after a failed spool write", sp.Pending())
	}
}
