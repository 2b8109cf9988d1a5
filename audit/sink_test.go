package audit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/lease"
)

var t0 = time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)

func TestMulti(t *testing.T) {
	ctx := context.Background()
	a, b := &audittest.Recorder{}, &audittest.Recorder{}
	ok := audit.Multi(a, b)
	if err := ok.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeAcquired, t0)); err != nil {
		t.Fatal(err)
	}
	if a.Len() != 1 || b.Len() != 1 {
		t.Fatal("Multi did not write to every sink")
	}

	fail := &audittest.FailingSink{}
	c := &audittest.Recorder{}
	m := audit.Multi(a, fail, c)
	err := m.Write(ctx, audittest.Event(audit.EventRevoke, lease.CodeRevoked, t0))
	if !errors.Is(err, audittest.ErrSinkFailed) {
		t.Fatalf("Multi with a failing sink: %v", err)
	}
	if fail.Calls() != 1 || a.Len() != 2 || c.Len() != 1 {
		t.Fatalf("Multi must still try every sink: calls %d, a %d, c %d", fail.Calls(), a.Len(), c.Len())
	}
	custom := errors.New("disk full")
	if err := audit.Multi(a, &audittest.FailingSink{Err: custom}).Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeAcquired, t0)); !errors.Is(err, custom) {
		t.Fatalf("custom error: %v", err)
	}
	if err := m.Close(); err != nil || !fail.Closed() {
		t.Fatalf("Close: %v, failing sink closed %v", err, fail.Closed())
	}
	if err := c.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeAcquired, t0)); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("recorder after close: %v", err)
	}
}

func TestRecorderValidates(t *testing.T) {
	r := &audittest.Recorder{}
	e := audittest.Event(audit.EventAcquire, lease.CodeAcquired, t0)
	e.Reason = "not allowed on acquire"
	if err := r.Write(context.Background(), e); err == nil || r.Len() != 0 {
		t.Fatal("Recorder accepted an invalid event")
	}
	e.Reason = ""
	e.SetFencingToken(7)
	r.Write(context.Background(), e)
	*e.FencingToken = 8
	if got := r.OfType(audit.EventAcquire); len(got) != 1 || *got[0].FencingToken != 7 {
		t.Fatal("Recorder must keep its own copy")
	}
	r.Reset()
	if r.Len() != 0 {
		t.Fatal("Reset")
	}
}

func newLimiter(next audit.Sink, clock *time.Time, mu *sync.Mutex) *audit.Limiter {
	return audit.NewLimiter(next, audit.LimiterOptions{Rate: 10, Burst: 5, FlushInterval: -1,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return *clock }})
}

func TestLimiterNeverDropsHighPriorityOrAllowed(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	var mu sync.Mutex
	clock := t0
	l := newLimiter(rec, &clock, &mu)
	// Exhaust the bucket with a flood of denials first.
	for range 100 {
		if err := l.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeConflict, t0)); err != nil {
			t.Fatal(err)
		}
	}
	before := rec.Len()
	const n = 500
	for i := range n {
		typ, code := audit.EventRevoke, lease.CodeRevoked
		switch i % 4 {
		case 1:
			typ, code = audit.EventForceRelease, lease.CodeForceReleased
		case 2:
			code = lease.CodeInvalidRequest // a denied revoke is still high priority
			typ = audit.EventRevoke
		case 3:
			typ, code = audit.EventRenew, lease.CodeRenewed // allowed success
		}
		if err := l.Write(ctx, audittest.Event(typ, code, t0)); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.Len() - before; got != n {
		t.Fatalf("%d of %d high-priority/allowed events written", got, n)
	}
	// A failing next sink surfaces its error for a high-priority event.
	fail := &audittest.FailingSink{}
	lf := newLimiter(fail, &clock, &mu)
	if err := lf.Write(ctx, audittest.Event(audit.EventRevoke, lease.CodeRevoked, t0)); err == nil || fail.Calls() != 1 {
		t.Fatalf("high-priority write through a failing sink: %v (calls %d)", err, fail.Calls())
	}
}

func TestLimiterAggregatesDenyFlood(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	var mu sync.Mutex
	clock := t0
	l := newLimiter(rec, &clock, &mu)

	// 1000 concurrent denials at one instant: only the burst gets through.
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				e := audittest.Event(audit.EventAuthFailed, lease.CodeInvalidCredential, t0)
				e.PrincipalClass, e.PrincipalID, e.CredentialID = "", "", ""
				e.RequestID = fmt.Sprintf("r%d_%d", w, i)
				if err := l.Write(ctx, e); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if rec.Len() != 5 || l.Dropped() != 995 {
		t.Fatalf("written %d, dropped %d; want burst 5 and 995 dropped", rec.Len(), l.Dropped())
	}

	// Error results with decision allow are droppable too; successes are not.
	e := audittest.Event(audit.EventInspect, lease.CodeNotFound, t0)
	e.Decision = audit.DecisionAllow
	if !audit.Droppable(&e) {
		t.Fatal("an allowed request with an error result must be droppable")
	}
	ok := audittest.Event(audit.EventInspect, lease.CodeInspected, t0)
	if audit.Droppable(&ok) {
		t.Fatal("an allowed success must not be droppable")
	}

	// The flood spent only the unauthenticated budget: an authenticated
	// principal's denials at the same instant still get the full burst.
	for range 7 {
		l.Write(ctx, audittest.Event(audit.EventRenew, lease.CodeLost, t0))
	}
	if rec.Len() != 10 || l.Dropped() != 997 {
		t.Fatalf("authenticated denials after the flood: written %d, dropped %d; want 10 and 997", rec.Len(), l.Dropped())
	}

	// One second refills Rate tokens, capped at Burst: 5 more of each
	// budget get through.
	mu.Lock()
	clock = clock.Add(time.Second)
	mu.Unlock()
	for range 20 {
		l.Write(ctx, audittest.Event(audit.EventRenew, lease.CodeLost, t0))
	}
	if rec.Len() != 15 || l.Dropped() != 1012 {
		t.Fatalf("after refill: written %d, dropped %d; want 15 and 1012", rec.Len(), l.Dropped())
	}

	// Flush writes one aggregate per budget, naming it; a failed flush
	// keeps the count.
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	agg := rec.OfType(audit.EventDropped)
	if len(agg) != 2 || l.Dropped() != 0 ||
		agg[0].Reason != audit.DroppedAuthenticated || agg[0].DroppedCount != 17 ||
		agg[1].Reason != audit.DroppedUnauthenticated || agg[1].DroppedCount != 995 {
		t.Fatalf("aggregates %+v, pending %d", agg, l.Dropped())
	}
	if err := l.Flush(ctx); err != nil || len(rec.OfType(audit.EventDropped)) != 2 {
		t.Fatal("an empty flush must write nothing")
	}

	fail := &audittest.FailingSink{}
	lf := newLimiter(fail, &clock, &mu)
	for range 10 {
		lf.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeConflict, t0))
	}
	if err := lf.Flush(ctx); err == nil || lf.Dropped() != 5 {
		t.Fatalf("failed flush: %v, pending %d; want the 5 kept", err, lf.Dropped())
	}

	// Invalid events are errors, never silent drops.
	bad := audittest.Event(audit.EventAcquire, lease.CodeConflict, t0)
	bad.TraceID = "a/b"
	if err := l.Write(ctx, bad); err == nil {
		t.Fatal("invalid droppable event accepted")
	}

	// Close flushes the pending count and closes the next sink.
	for range 3 {
		l.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeConflict, t0))
	}
	pending := l.Dropped()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	agg = rec.OfType(audit.EventDropped)
	if pending == 0 || len(agg) != 3 || agg[2].DroppedCount != pending {
		t.Fatalf("Close flush: pending %d, aggregates %+v", pending, agg)
	}
	if err := l.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeConflict, t0)); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

func TestLimiterBackgroundFlush(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	l := audit.NewLimiter(rec, audit.LimiterOptions{Rate: 1, Burst: 1, FlushInterval: 10 * time.Millisecond})
	defer l.Close()
	for range 5 {
		l.Write(ctx, audittest.Event(audit.EventAcquire, lease.CodeConflict, time.Now()))
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(rec.OfType(audit.EventDropped)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no background flush")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var n int64
	for _, e := range rec.OfType(audit.EventDropped) {
		n += e.DroppedCount
	}
	if n < 3 { // 5 writes, burst 1, rate 1/s: at least 3 dropped
		t.Fatalf("dropped %d", n)
	}
}

// Example shows the service's order for a force-release or revoke: the
// audit event is written, durably, before success is reported.
func Example() {
	dir, _ := os.MkdirTemp("", "audit-example")
	defer os.RemoveAll(dir)
	sink, err := audit.OpenFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		panic(err)
	}

	e := audit.NewEvent(audit.EventRevoke, time.Now())
	e.CorrelationID, e.RequestID = "corr_01", "request_01"
	e.SetCaller(lease.Caller{PrincipalID: "prn_admin", PrincipalClass: audit.PrincipalAdministrator, CredentialID: "key_admin"})
	e.PreviousState, e.ResultingState = lease.StateActive, lease.StateRevoked
	e.SetResult(lease.CodeRevoked)
	e.IncidentID = "inc-42"
	if err := sink.Write(context.Background(), e); err != nil {
		fmt.Println("revoke fails: audit not durable")
		return
	}
	sink.Close()

	events, _ := audit.ReadFile(sink.Path())
	fmt.Println(len(events), events[0].EventType, events[0].Priority, events[0].Decision)
	// Output: 1 target_lease_revoke high allow
}
