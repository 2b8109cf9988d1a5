package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
)

// review3Actual counts the stored events and the high-priority ones by
// walking the bucket, and returns the meta counts too.
func review3Actual(t *testing.T, s *AuditSink) (n, high, metaN, metaHigh uint64) {
	t.Helper()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(auditBucketEvents).ForEach(func(k, v []byte) error {
			n++
			if auditHighPriority(v) {
				high++
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	s.db.View(func(tx *bbolt.Tx) error {
		metaN, metaHigh = auditCount(readView(tx), auditKeyCount), auditCount(readView(tx), auditKeyHigh)
		return nil
	})
	return
}

// Attack: pairs of writers race the same NEW event id inside shared
// transactions, mixed with normal and high-priority writers, with count
// pruning on: exactly one of each pair succeeds, the other gets
// ErrDuplicateAuditEvent, no other writer fails, and the stored counts
// equal the bucket's content.
func TestReview3AuditDuplicatesAndCountsUnderGroupCommit(t *testing.T) {
	ctx := context.Background()
	s, err := OpenAudit(filepath.Join(t.TempDir(), AuditFileName), AuditOptions{MaxEvents: 40, MaxAge: 24 * time.Hour,
		Now: func() time.Time { return auditT0.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const pairs = 60
	type out struct{ a, b error }
	res := make([]out, pairs)
	others := make([]error, 2*pairs)
	var wg sync.WaitGroup
	for i := 0; i < pairs; i++ {
		// High priority: count pruning cannot remove the first copy
		// before the second arrives (that would be a legitimate re-add).
		e := audittest.RevokeEvent(auditT0.Add(time.Duration(i) * time.Millisecond))
		wg.Add(4)
		go func() { defer wg.Done(); res[i].a = s.Write(ctx, e) }()
		go func() { defer wg.Done(); res[i].b = s.Write(ctx, e) }()
		go func() {
			defer wg.Done()
			others[2*i] = s.Write(ctx, audittest.DenyEvent(auditT0.Add(time.Duration(i)*time.Millisecond+time.Microsecond)))
		}()
		go func() {
			defer wg.Done()
			others[2*i+1] = s.Write(ctx, audittest.RevokeEvent(auditT0.Add(time.Duration(i)*time.Millisecond+2*time.Microsecond)))
		}()
	}
	wg.Wait()
	for i, r := range res {
		okA, okB := r.a == nil, r.b == nil
		dupA, dupB := errors.Is(r.a, ErrDuplicateAuditEvent), errors.Is(r.b, ErrDuplicateAuditEvent)
		if !(okA && dupB || okB && dupA) {
			t.Fatalf("pair %d: %v / %v, want one success and one duplicate", i, r.a, r.b)
		}
	}
	for i, err := range others {
		if err != nil {
			t.Fatalf("independent writer %d failed: %v", i, err)
		}
	}
	n, high, mn, mh := review3Actual(t, s)
	if n != mn || high != mh {
		t.Fatalf("stored %d events (%d high), meta says %d (%d high)", n, high, mn, mh)
	}
	if n-high > 40 {
		t.Fatalf("%d normal events kept, MaxEvents 40", n-high)
	}
	if c, _ := s.Count(ctx); uint64(c) != n {
		t.Fatalf("Count %d, stored %d", c, n)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after duplicates: %v", err)
	}
}

// Attack: Close while writers queue behind a shared transaction: nobody
// hangs, an answered-nil event is stored, later writes get ErrClosed.
func TestReview3AuditCloseWithQueuedWriters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), AuditFileName)
	s, err := OpenAudit(path, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	errs := make([]error, n)
	evs := make([]audit.Event, n)
	var wg sync.WaitGroup
	for i := range evs {
		evs[i] = audittest.DenyEvent(time.Now().Add(time.Duration(i) * time.Millisecond))
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Write(ctx, evs[i]) }()
	}
	time.Sleep(time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writers hang across Close")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, audittest.DenyEvent(time.Now())); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
	r, err := OpenAudit(path, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.Read(ctx, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, e := range got {
		have[e.EventID] = true
	}
	for i, err := range errs {
		if err == nil && !have[evs[i].EventID] {
			t.Fatalf("writer %d answered nil, event not stored", i)
		}
		if err != nil && !errors.Is(err, audit.ErrClosed) {
			t.Fatalf("writer %d: %v", i, err)
		}
		if err != nil && have[evs[i].EventID] {
			t.Fatalf("writer %d failed, event stored", i)
		}
	}
}
