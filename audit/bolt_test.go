package audit

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }
func newClock(t time.Time) *fakeClock    { return &fakeClock{t: t} }
func ids(es []Event) (out []string) {
	for _, e := range es {
		out = append(out, e.EventID)
	}
	return
}
func eq(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestBoltRoundTripAndFilter(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), BoltFileName)
	clock := newClock(t0.Add(time.Hour))
	s, err := OpenBolt(path, BoltOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var all []Event
	for i := range 30 {
		var e Event
		at := t0.Add(time.Duration(i) * time.Second)
		switch i % 3 {
		case 0:
			e = acquireEvent(at)
		case 1:
			e = denyEvent(at)
			e.ProgramID = "program-b"
		case 2:
			e = revokeEvent(at)
			e.LeaseID = "lease_other"
			e.TenantID = "tenant-two"
		}
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
	}
	if err := s.Write(ctx, all[0]); !errors.Is(err, ErrDuplicateEvent) {
		t.Fatalf("duplicate id: %v", err)
	}
	bad := acquireEvent(t0)
	bad.TenantID = "Bad Tenant"
	if err := s.Write(ctx, bad); err == nil {
		t.Fatal("invalid event stored")
	}

	got, err := s.Read(ctx, Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !eq(ids(got), ids(all)) {
		t.Fatal("read all: wrong events or order")
	}
	for i := range got {
		a, _ := Marshal(got[i])
		b, _ := Marshal(all[i])
		if string(a) != string(b) {
			t.Fatalf("event %d changed:\n%s\n%s", i, a, b)
		}
	}
	pick := func(f func(i int, e Event) bool) (out []Event) {
		for i, e := range all {
			if f(i, e) {
				out = append(out, e)
			}
		}
		return out
	}
	cases := []struct {
		name  string
		f     Filter
		limit int
		want  []Event
	}{
		{"type", Filter{EventType: EventRevoke}, 0, pick(func(i int, e Event) bool { return i%3 == 2 })},
		{"tenant", Filter{TenantID: "tenant-main"}, 0, pick(func(i int, e Event) bool { return i%3 != 2 })},
		{"program", Filter{ProgramID: "program-b"}, 0, pick(func(i int, e Event) bool { return i%3 == 1 })},
		{"lease", Filter{LeaseID: "lease_01"}, 0, pick(func(i int, e Event) bool { return i%3 == 0 })},
		{"since", Filter{Since: t0.Add(20 * time.Second)}, 0, all[20:]},
		{"since and type", Filter{Since: t0.Add(20 * time.Second), EventType: EventAcquire},
			0, pick(func(i int, e Event) bool { return i >= 20 && i%3 != 2 })},
		{"limit", Filter{}, 5, all[:5]},
		{"after", Filter{After: all[9].EventID}, 5, all[10:15]},
		{"after and since", Filter{After: all[25].EventID, Since: t0.Add(20 * time.Second)}, 0, all[26:]},
		{"nothing", Filter{TenantID: "nobody"}, 0, nil},
	}
	for _, c := range cases {
		got, err := s.Read(ctx, c.f, c.limit)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !eq(ids(got), ids(c.want)) {
			t.Fatalf("%s: got %d events, want %d", c.name, len(got), len(c.want))
		}
	}
	// Durable across reopen.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, acquireEvent(t0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	s, err = OpenBolt(path, BoltOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, err := s.Count(ctx); err != nil || n != 30 {
		t.Fatalf("count after reopen %d, %v", n, err)
	}
}

func TestBoltRetention(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)
	path := filepath.Join(t.TempDir(), BoltFileName)
	s, err := OpenBolt(path, BoltOptions{MaxEvents: 10, MaxAge: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var all []Event
	for range 25 {
		e := acquireEvent(clock.Now())
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
		clock.Add(time.Minute)
	}
	got, _ := s.Read(ctx, Filter{}, 0)
	if !eq(ids(got), ids(all[15:])) {
		t.Fatalf("count retention kept %d events, want the newest 10", len(got))
	}
	if n, _ := s.Count(ctx); n != 10 {
		t.Fatalf("count %d", n)
	}

	// Age: events i were written at t0+i min; the newest 10 (15..24) remain.
	// At t0+80m the cutoff is t0+20m, so 15..19 expire on the next write.
	clock.Add(80*time.Minute - 25*time.Minute)
	e := acquireEvent(clock.Now())
	if err := s.Write(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Read(ctx, Filter{}, 0)
	want := append(append([]Event(nil), all[20:]...), e)
	if !eq(ids(got), ids(want)) {
		t.Fatalf("age retention kept %d events, want %d", len(got), len(want))
	}

	// Prune without writes; then a reopen with a smaller bound.
	clock.Add(time.Hour + time.Second)
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Count(ctx); n != 0 {
		t.Fatalf("count after age prune %d", n)
	}
	for range 20 {
		if err := s.Write(ctx, acquireEvent(clock.Now())); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err = OpenBolt(path, BoltOptions{MaxEvents: 3, MaxAge: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Count(ctx); n != 3 {
		t.Fatalf("count after shrinking bound %d", n)
	}
}

func TestBoltConcurrent(t *testing.T) {
	ctx := context.Background()
	s, err := OpenBolt(filepath.Join(t.TempDir(), BoltFileName), BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if err := s.Write(ctx, denyEvent(time.Now())); err != nil {
					t.Error(err)
				}
				if _, err := s.Read(ctx, Filter{EventType: EventAcquire}, 10); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n, _ := s.Count(ctx); n != 80 {
		t.Fatalf("count %d, want 80", n)
	}
}

// TestBoltRetentionKeepsHighPriorityAgainstCount guarantees that a flood of
// allowed normal-priority events (never rate limited) cannot prune a
// high-priority revoke event from the bolt audit store: count retention
// (MaxEvents) applies to normal-priority events only.
func TestBoltRetentionKeepsHighPriorityAgainstCount(t *testing.T) {
	ctx := context.Background()
	s, err := OpenBolt(filepath.Join(t.TempDir(), "audit.db"), BoltOptions{MaxEvents: 50, Now: func() time.Time { return t0.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, revokeEvent(t0)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 60; i++ { // an authenticated reader's allowed list/inspect flood
		if err := s.Write(ctx, acquireEvent(t0.Add(time.Duration(i)*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Read(ctx, Filter{EventType: EventRevoke}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("a high-priority revoke event was pruned by a flood of allowed normal-priority events")
	}
}

// TestBoltRetentionPrunesHighPriorityByAgeOnly guarantees that high-priority
// events are kept against the count bound, which still holds for the
// normal-priority ones (the oldest go), and are pruned once older than
// MaxAge; the count of stored events stays right throughout.
func TestBoltRetentionPrunesHighPriorityByAgeOnly(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)
	s, err := OpenBolt(filepath.Join(t.TempDir(), "audit.db"), BoltOptions{MaxEvents: 5, MaxAge: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := t0
	write := func(e Event) {
		t.Helper()
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		at = at.Add(time.Millisecond)
		write(revokeEvent(at))
		at = at.Add(time.Millisecond)
		write(acquireEvent(at))
	}
	for i := 0; i < 10; i++ {
		at = at.Add(time.Millisecond)
		write(acquireEvent(at))
	}
	n, err := s.Count(ctx)
	if err != nil || n != 8 {
		t.Fatalf("Count = %d (%v), want 5 normal + 3 high", n, err)
	}
	all, err := s.Read(ctx, Filter{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var high, normal []Event
	for _, e := range all {
		if e.Priority == PriorityHigh {
			high = append(high, e)
		} else {
			normal = append(normal, e)
		}
	}
	if len(high) != 3 || len(normal) != 5 || !normal[0].Timestamp.Time().Equal(at.Add(-4*time.Millisecond)) {
		t.Fatalf("kept %d high and %d normal events (oldest normal %v), want 3 and the newest 5", len(high), len(normal), normal[0].Timestamp)
	}
	// Past MaxAge, high-priority events go too.
	clock.Add(2 * time.Hour)
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Count(ctx); err != nil || n != 0 {
		t.Fatalf("Count after MaxAge = %d (%v), want 0", n, err)
	}
	write(revokeEvent(clock.Now()))
	if got, _ := s.Read(ctx, Filter{EventType: EventRevoke}, 10); len(got) != 1 {
		t.Fatalf("%d revoke events after a fresh write, want 1", len(got))
	}
}
