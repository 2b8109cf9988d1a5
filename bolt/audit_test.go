package bolt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

var auditT0 = time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)

func auditIDs(es []audit.Event) (out []string) {
	for _, e := range es {
		out = append(out, e.EventID)
	}
	return
}
func auditEq(a, b []string) bool {
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

func TestAuditRoundTripAndFilter(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), AuditFileName)
	clock := &clock{t: auditT0.Add(time.Hour)}
	s, err := OpenAudit(path, AuditOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var all []audit.Event
	for i := range 30 {
		var e audit.Event
		at := auditT0.Add(time.Duration(i) * time.Second)
		switch i % 3 {
		case 0:
			e = audittest.AcquireEvent(at)
		case 1:
			e = audittest.DenyEvent(at)
			e.ProgramID = "program-b"
		case 2:
			e = audittest.RevokeEvent(at)
			e.LeaseID = "lease_other"
			e.TenantID = "tenant-two"
		}
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
	}
	if err := s.Write(ctx, all[0]); !errors.Is(err, ErrDuplicateAuditEvent) {
		t.Fatalf("duplicate id: %v", err)
	}
	bad := audittest.AcquireEvent(auditT0)
	bad.TenantID = "Bad Tenant"
	if err := s.Write(ctx, bad); err == nil {
		t.Fatal("invalid event stored")
	}

	got, err := s.Read(ctx, audit.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !auditEq(auditIDs(got), auditIDs(all)) {
		t.Fatal("read all: wrong events or order")
	}
	for i := range got {
		a, _ := audit.Marshal(got[i])
		b, _ := audit.Marshal(all[i])
		if string(a) != string(b) {
			t.Fatalf("event %d changed:\n%s\n%s", i, a, b)
		}
	}
	pick := func(f func(i int, e audit.Event) bool) (out []audit.Event) {
		for i, e := range all {
			if f(i, e) {
				out = append(out, e)
			}
		}
		return out
	}
	cases := []struct {
		name  string
		f     audit.Filter
		limit int
		want  []audit.Event
	}{
		{"type", audit.Filter{EventType: audit.EventRevoke}, 0, pick(func(i int, e audit.Event) bool { return i%3 == 2 })},
		{"tenant", audit.Filter{TenantID: "tenant-main"}, 0, pick(func(i int, e audit.Event) bool { return i%3 != 2 })},
		{"program", audit.Filter{ProgramID: "program-b"}, 0, pick(func(i int, e audit.Event) bool { return i%3 == 1 })},
		{"lease", audit.Filter{LeaseID: "lease_01"}, 0, pick(func(i int, e audit.Event) bool { return i%3 == 0 })},
		{"since", audit.Filter{Since: auditT0.Add(20 * time.Second)}, 0, all[20:]},
		{"since and type", audit.Filter{Since: auditT0.Add(20 * time.Second), EventType: audit.EventAcquire},
			0, pick(func(i int, e audit.Event) bool { return i >= 20 && i%3 != 2 })},
		{"limit", audit.Filter{}, 5, all[:5]},
		{"after", audit.Filter{After: all[9].EventID}, 5, all[10:15]},
		{"after and since", audit.Filter{After: all[25].EventID, Since: auditT0.Add(20 * time.Second)}, 0, all[26:]},
		{"nothing", audit.Filter{TenantID: "nobody"}, 0, nil},
	}
	for _, c := range cases {
		got, err := s.Read(ctx, c.f, c.limit)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !auditEq(auditIDs(got), auditIDs(c.want)) {
			t.Fatalf("%s: got %d events, want %d", c.name, len(got), len(c.want))
		}
	}
	// Durable across reopen.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, audittest.AcquireEvent(auditT0)); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	s, err = OpenAudit(path, AuditOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, err := s.Count(ctx); err != nil || n != 30 {
		t.Fatalf("count after reopen %d, %v", n, err)
	}
}

func TestAuditRetention(t *testing.T) {
	ctx := context.Background()
	clock := &clock{t: auditT0}
	path := filepath.Join(t.TempDir(), AuditFileName)
	s, err := OpenAudit(path, AuditOptions{MaxEvents: 10, MaxAge: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var all []audit.Event
	for range 25 {
		e := audittest.AcquireEvent(clock.Now())
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
		clock.Add(time.Minute)
	}
	got, _ := s.Read(ctx, audit.Filter{}, 0)
	if !auditEq(auditIDs(got), auditIDs(all[15:])) {
		t.Fatalf("count retention kept %d events, want the newest 10", len(got))
	}
	if n, _ := s.Count(ctx); n != 10 {
		t.Fatalf("count %d", n)
	}

	// Age: events i were written at auditT0+i min; the newest 10 (15..24) remain.
	// At auditT0+80m the cutoff is auditT0+20m, so 15..19 expire on the next write.
	clock.Add(80*time.Minute - 25*time.Minute)
	e := audittest.AcquireEvent(clock.Now())
	if err := s.Write(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Read(ctx, audit.Filter{}, 0)
	want := append(append([]audit.Event(nil), all[20:]...), e)
	if !auditEq(auditIDs(got), auditIDs(want)) {
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
		if err := s.Write(ctx, audittest.AcquireEvent(clock.Now())); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err = OpenAudit(path, AuditOptions{MaxEvents: 3, MaxAge: time.Hour, Now: clock.Now})
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

func TestAuditConcurrent(t *testing.T) {
	ctx := context.Background()
	s, err := OpenAudit(filepath.Join(t.TempDir(), AuditFileName), AuditOptions{})
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
				if err := s.Write(ctx, audittest.DenyEvent(time.Now())); err != nil {
					t.Error(err)
				}
				if _, err := s.Read(ctx, audit.Filter{EventType: audit.EventAcquire}, 10); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n, _ := s.Count(ctx); n != 80 {
		t.Fatalf("count %d, want 80", n)
	}
	// Concurrent writers share transactions: a duplicate among them fails
	// alone and the others are stored.
	dup := audittest.DenyEvent(time.Now())
	if err := s.Write(ctx, dup); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			e := audittest.DenyEvent(time.Now())
			if i%4 == 0 {
				e = dup
			}
			errs[i] = s.Write(ctx, e)
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if want := i%4 == 0; errors.Is(err, ErrDuplicateAuditEvent) != want || !want && err != nil {
			t.Fatalf("writer %d: %v (duplicate: %v)", i, err, want)
		}
	}
	if n, _ := s.Count(ctx); n != 93 {
		t.Fatalf("count %d, want 93", n)
	}
}

// TestAuditRetentionKeepsHighPriorityAgainstCount guarantees that a flood of
// allowed normal-priority events (never rate limited) cannot prune a
// high-priority revoke event from the bolt audit store: count retention
// (MaxEvents) applies to normal-priority events only.
func TestAuditRetentionKeepsHighPriorityAgainstCount(t *testing.T) {
	ctx := context.Background()
	s, err := OpenAudit(filepath.Join(t.TempDir(), "audit.db"), AuditOptions{MaxEvents: 50, Now: func() time.Time { return auditT0.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, audittest.RevokeEvent(auditT0)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 60; i++ { // an authenticated reader's allowed list/inspect flood
		if err := s.Write(ctx, audittest.AcquireEvent(auditT0.Add(time.Duration(i)*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Read(ctx, audit.Filter{EventType: audit.EventRevoke}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("a high-priority revoke event was pruned by a flood of allowed normal-priority events")
	}
}

// TestAuditRetentionPrunesHighPriorityByAgeOnly guarantees that high-priority
// events are kept against the count bound, which still holds for the
// normal-priority ones (the oldest go), and are pruned once older than
// MaxAge; the count of stored events stays right throughout.
func TestAuditRetentionPrunesHighPriorityByAgeOnly(t *testing.T) {
	ctx := context.Background()
	clock := &clock{t: auditT0}
	s, err := OpenAudit(filepath.Join(t.TempDir(), "audit.db"), AuditOptions{MaxEvents: 5, MaxAge: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := auditT0
	write := func(e audit.Event) {
		t.Helper()
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		at = at.Add(time.Millisecond)
		write(audittest.RevokeEvent(at))
		at = at.Add(time.Millisecond)
		write(audittest.AcquireEvent(at))
	}
	for i := 0; i < 10; i++ {
		at = at.Add(time.Millisecond)
		write(audittest.AcquireEvent(at))
	}
	n, err := s.Count(ctx)
	if err != nil || n != 8 {
		t.Fatalf("Count = %d (%v), want 5 normal + 3 high", n, err)
	}
	all, err := s.Read(ctx, audit.Filter{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var high, normal []audit.Event
	for _, e := range all {
		if e.Priority == audit.PriorityHigh {
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
	write(audittest.RevokeEvent(clock.Now()))
	if got, _ := s.Read(ctx, audit.Filter{EventType: audit.EventRevoke}, 10); len(got) != 1 {
		t.Fatalf("%d revoke events after a fresh write, want 1", len(got))
	}
}

// The bbolt sink on a full disk: writes fail (bbolt rolls them back), Check
// says so while the disk stays full, and both recover once it is freed.
func TestAuditSinkDiskFullRecovers(t *testing.T) {
	dir := testenv.Tmpfs(t, 1<<20)
	s, err := OpenAudit(filepath.Join(dir, AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	at := time.Now() // inside the retention window
	next := func() audit.Event { at = at.Add(time.Millisecond); return audittest.RevokeEvent(at) }
	filler := filepath.Join(dir, "filler")
	testenv.FillDisk(t, filler)
	written, failed := 0, 0
	for range 300 { // enough to outgrow the free pages bbolt already has
		if err := s.Write(ctx, next()); err != nil {
			failed++
		} else {
			written++
		}
	}
	if failed == 0 {
		t.Fatal("no write failed on a full disk")
	}
	if err := s.Check(ctx); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Check on a full disk: %v, want ENOSPC", err)
	}
	os.Remove(filler)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after space was freed: %v", err)
	}
	for range 5 {
		if err := s.Write(ctx, next()); err != nil {
			t.Fatalf("after space was freed: %v", err)
		}
		written++
	}
	if n, err := s.Count(ctx); err != nil || n != written {
		t.Fatalf("count %d, %v; want %d", n, err, written)
	}
}

func TestAuditMultiFileAndBolt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f, err := audit.OpenFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenAudit(filepath.Join(dir, AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := audit.Multi(f, b)
	e := audittest.Event(audit.EventForceRelease, lease.CodeForceReleased, time.Now())
	if err := m.Write(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, err := b.Read(ctx, audit.Filter{EventType: audit.EventForceRelease}, 10)
	if err != nil || len(got) != 1 || got[0].EventID != e.EventID {
		t.Fatalf("bolt: %v %v", got, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	fromFile, err := audit.ReadFile(f.Path())
	if err != nil || len(fromFile) != 1 || fromFile[0].EventID != e.EventID || fromFile[0].Priority != audit.PriorityHigh {
		t.Fatalf("file: %v %v", fromFile, err)
	}
}
