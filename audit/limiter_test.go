package audit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// TestLimiterOnePrincipalCannotHideAnothersDenials guarantees that each
// authenticated principal has its own drop budget: one principal's flood of
// denials is aggregated, while another principal's denial (a zombie
// worker's commit_rejected) is still written with its principal.
func TestLimiterOnePrincipalCannotHideAnothersDenials(t *testing.T) {
	ctx := context.Background()
	rec := &memSink{}
	now := t0
	l := NewLimiter(rec, LimiterOptions{Rate: 1, Burst: 10, FlushInterval: -1, Now: func() time.Time { return now }})
	defer l.Close()
	for i := 0; i < 1000; i++ { // the attacker's flood, within one second
		e := denyEvent(now)
		e.PrincipalID = "prn_attacker"
		e.SetResult(lease.CodeRateLimited)
		if err := l.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	victim := NewEvent(EventCommitRejected, now)
	victim.CorrelationID, victim.RequestID = "corr_victim", "req_victim"
	victim.SetCaller(lease.Caller{PrincipalID: "prn_zombie_worker", PrincipalClass: PrincipalActorComponent, CredentialID: "key_zombie"})
	victim.SetResult(lease.CodeCommitRejected)
	victim.BackendHealth = lease.HealthOK
	victim.DeadlineClass = DeadlineDefault
	if err := l.Write(ctx, victim); err != nil {
		t.Fatal(err)
	}
	for _, e := range rec.all() {
		if e.RequestID == "req_victim" {
			return
		}
	}
	t.Fatalf("another principal's flood aggregated prn_zombie_worker's commit_rejected into audit_dropped (%d dropped)", l.Dropped())
}

// TestLimiterAggregateNamesPrincipalAndBoundsBudgets guarantees that each
// principal's dropped events are written as an audit_dropped event naming
// the principal; that beyond MaxPrincipals principals share the fallback
// budget (an aggregate without a principal), so the aggregates per flush are
// bounded; that the global cap bounds what all principals write; and that
// budgets of principals gone quiet are forgotten.
func TestLimiterAggregateNamesPrincipalAndBoundsBudgets(t *testing.T) {
	ctx := context.Background()
	rec := &memSink{}
	now := t0
	l := NewLimiter(rec, LimiterOptions{Rate: 1, Burst: 2, MaxPrincipals: 2, GlobalRate: 1, GlobalBurst: 5,
		FlushInterval: -1, Now: func() time.Time { return now }})
	defer l.Close()
	deny := func(p string, n int) {
		for range n {
			e := denyEvent(now)
			e.PrincipalID = p
			if err := l.Write(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	deny("prn-a", 5) // own budget: 2 written, 3 dropped
	deny("prn-b", 4) // own budget: 2 written, 2 dropped
	deny("prn-c", 3) // map full: the shared fallback; 1 written, then the global cap (5) is spent
	deny("prn-d", 1) // shared fallback too: dropped
	if got := len(rec.all()); got != 5 {
		t.Fatalf("%d events written individually, want 5 (the global cap)", got)
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var agg []Event
	for _, e := range rec.all() {
		if e.EventType == EventDropped {
			agg = append(agg, e)
		}
	}
	want := []struct {
		principal string
		n         int64
	}{{"prn-a", 3}, {"prn-b", 2}, {"", 3}}
	if len(agg) != len(want) {
		t.Fatalf("aggregates %+v, want %v", agg, want)
	}
	for i, w := range want {
		if agg[i].PrincipalID != w.principal || agg[i].DroppedCount != w.n || agg[i].Reason != DroppedAuthenticated {
			t.Fatalf("aggregate %d: %+v, want principal %q count %d", i, agg[i], w.principal, w.n)
		}
		if _, err := Unmarshal(mustMarshal(t, agg[i])); err != nil {
			t.Fatalf("aggregate %d does not round-trip: %v", i, err)
		}
	}
	// Quiet for a while: the principals' budgets are full again and are
	// forgotten at the next flush, so new principals get budgets of their own.
	now = now.Add(time.Minute)
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	n := len(l.principals)
	l.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d idle principal budgets kept, want 0", n)
	}
}

func mustMarshal(t *testing.T, e Event) []byte {
	t.Helper()
	b, err := Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// memSink records events (audit's internal tests cannot import audittest).
type memSink struct {
	mu     sync.Mutex
	events []Event
}

func (m *memSink) Write(ctx context.Context, e Event) error {
	if err := e.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, e)
	return nil
}
func (m *memSink) Close() error { return nil }
func (m *memSink) all() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Event(nil), m.events...)
}
