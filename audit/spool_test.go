package audit

import (
	"bytes"
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

// TestSpoolMovesUnreadableLineAsideAndKeepsForwarding guarantees that a
// spooled line the forwarder cannot read (bit rot, a bad sector) does not
// stall forwarding while Check says all is well: the line is moved to the
// spool's .bad file and the events behind it (and new ones) reach the
// backend; if any stay pending, Check reports it.
func TestSpoolMovesUnreadableLineAsideAndKeepsForwarding(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit-spool.jsonl")
	b := &backendSink{}
	b.set(true, false)
	sp, err := OpenSpool(path, b, SpoolOptions{RetryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	for i, n := range []string{"e1", "e2", "e3"} {
		e := acquireEvent(t0.Add(time.Duration(i) * time.Millisecond))
		e.RequestID = n
		if err := sp.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the outage to be reported", func() bool { return sp.Check(ctx) != nil })
	// Damage line 2 in place (same length): bit rot, a bad sector.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first := bytes.IndexByte(data, '\n')
	data[first+5] = '#'
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b.set(false, false)
	waitFor(t, "e1 forwarded", func() bool { return len(b.ids()) >= 1 })
	time.Sleep(100 * time.Millisecond)
	e := acquireEvent(t0.Add(time.Second))
	e.RequestID = "e4"
	if err := sp.Write(ctx, e); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if sp.Pending() > 0 && sp.Check(ctx) == nil {
		t.Fatalf("forwarding is stuck (%d events pending, backend holds %v) but Check reports healthy", sp.Pending(), b.ids())
	}
}

// TestOpenSpoolStartsPastDamagedMiddleLine guarantees that a damaged line in
// the middle of a spool left by an earlier run does not stop startup: the
// events around it are forwarded, the damaged line is kept in path+".bad".
func TestOpenSpoolStartsPastDamagedMiddleLine(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit-spool.jsonl")
	b := &backendSink{}
	b.set(true, false)
	sp, err := OpenSpool(path, b, SpoolOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []string{"e1", "e2", "e3"} {
		e := acquireEvent(t0.Add(time.Duration(i) * time.Millisecond))
		e.RequestID = n
		if err := sp.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	sp.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	damaged := strings.Replace(lines[1], "{", "#", 1)
	data = []byte(lines[0] + damaged + lines[2])
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b.set(false, false)
	sp, err = OpenSpool(path, b, SpoolOptions{RetryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("a damaged middle line stops startup: %v", err)
	}
	defer sp.Close()
	waitFor(t, "the readable events forwarded", func() bool { return sp.Pending() == 0 })
	if got := strings.Join(b.ids(), ","); got != "e1,e3" {
		t.Fatalf("backend holds %s, want e1,e3", got)
	}
	if sp.BadLines() != 1 {
		t.Fatalf("BadLines = %d, want 1", sp.BadLines())
	}
	bad, err := os.ReadFile(path + ".bad")
	if err != nil || string(bad) != damaged {
		t.Fatalf(".bad holds %q (%v), want the damaged line", bad, err)
	}
	if err := sp.Check(ctx); err != nil {
		t.Fatalf("Check after forwarding: %v", err)
	}
}

// TestSpoolReportsLineItCannotMoveAside guarantees that when the forwarder
// can neither read the head line nor move it aside, the failure is recorded:
// Check (and so /readyz) reports the events waiting behind it.
func TestSpoolReportsLineItCannotMoveAside(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit-spool.jsonl")
	if err := os.Mkdir(path+".bad", 0o700); err != nil { // cannot be appended to
		t.Fatal(err)
	}
	b := &backendSink{}
	b.set(true, false)
	sp, err := OpenSpool(path, b, SpoolOptions{RetryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	for i, n := range []string{"e1", "e2"} {
		e := acquireEvent(t0.Add(time.Duration(i) * time.Millisecond))
		e.RequestID = n
		if err := sp.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Damage both lines: the forwarder may have read e1 before the damage.
	data[1] = '#'
	data[bytes.IndexByte(data, '\n')+2] = '#'
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b.set(false, false)
	if err := sp.Forward(ctx); err == nil {
		t.Fatal("Forward reports no failure at a head it can neither read nor move aside")
	}
	if sp.Pending() == 0 || sp.Check(ctx) == nil {
		t.Fatalf("pending %d, Check %v: a stalled spool must be reported", sp.Pending(), sp.Check(ctx))
	}
}
