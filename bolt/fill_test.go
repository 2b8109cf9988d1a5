package bolt

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/lease"
)

// leafFill is the share of bucket's leaf pages its entries use.
func leafFill(t *testing.T, db *bbolt.DB, bucket []byte) float64 {
	t.Helper()
	var st bbolt.BucketStats
	if err := db.View(func(tx *bbolt.Tx) error { st = tx.Bucket(bucket).Stats(); return nil }); err != nil {
		t.Fatal(err)
	}
	if st.LeafPageN < 4 {
		t.Fatalf("%s has %d leaf pages: too few to show how splits fill them", bucket, st.LeafPageN)
	}
	return float64(st.LeafInuse) / float64(st.LeafAlloc)
}

// wantFills checks each bucket's leaf fill is at least its fill.
func wantFills(t *testing.T, db *bbolt.DB, when string, want ...bucketFill) {
	t.Helper()
	for _, w := range want {
		f := leafFill(t, db, w.bucket)
		t.Logf("%s: leaf fill %.3f %s", w.bucket, f, when)
		if f < w.fill {
			t.Errorf("%s: leaf fill %.2f %s, want at least %.2f", w.bucket, f, when, w.fill)
		}
	}
}

// The buckets whose keys arrive in increasing order are split full (bbolt
// splits at half by default, and a node split by appending stays half
// empty): measured through many group commits of concurrent callers.
func TestAppendOrderedBucketsSplitFull(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	const n = 4000
	held := make([]*lease.Record, n)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				req := acquireReq(fmt.Sprintf("acq-%d", i), time.Minute, time.Now().Add(time.Minute))
				req.Identity.TargetID = fmt.Sprintf("fill-%d", i)
				res, err := s.Acquire(ctx, req)
				if err != nil {
					t.Error(err)
					continue
				}
				held[i] = res.Lease
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		return
	}
	wantFills(t, s.db, "after the acquisitions", bucketFill{bucketIdemExp, 0.9}, bucketFill{bucketActiveExp, 0.8},
		bucketFill{bucketIndex, 0.75}, bucketFill{bucketLeases, 0.7})
	for i, l := range held {
		if _, err := s.Release(ctx, releaseOf(l, fmt.Sprintf("rel-%d", i), time.Now().Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	wantFills(t, s.db, "after the releases", bucketFill{bucketIdemExp, 0.9}, bucketFill{bucketHistoryExp, 0.7},
		bucketFill{bucketLeases, 0.8})
}

// So are audit events (ids increase in the order they are made), on pages
// large enough to hold many (at 4 KiB each leaf held two).
func TestAuditEventsSplitFull(t *testing.T) {
	ctx := context.Background()
	s, err := OpenAudit(filepath.Join(t.TempDir(), AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 3000 {
		if err := s.Write(ctx, audittest.DenyEvent(time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	wantFills(t, s.db, "after 3000 events", bucketFill{auditBucketEvents, 0.7})
}

// Keys behind the head: the reaper archives an expired lease at its
// expiry time, up to a reap interval back, so history_exp entries land
// behind the newest ones. Split full, the leaves those inserts split stay
// small (0.33 fill in review); the bucket must stay at least as full as
// bbolt's default leaves it (0.73).
func TestHistoryExpBehindTheHeadStaysFull(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	var prev *lease.Record
	for i := range 3000 {
		// Every 100 ms one lease is released (history at now) and one is
		// left to expire with a 2 s TTL (history at its expiry, written
		// by the reaper every 30 s, its default interval).
		c.Add(100 * time.Millisecond)
		req := acquireReq(fmt.Sprintf("held-%d", i), time.Minute, far)
		req.Identity.TargetID = fmt.Sprintf("held-%d", i)
		res, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if prev != nil {
			if _, err := s.Release(ctx, releaseOf(prev, fmt.Sprintf("rel-%d", i), far)); err != nil {
				t.Fatal(err)
			}
		}
		prev = res.Lease
		req = acquireReq(fmt.Sprintf("left-%d", i), 2*time.Second, far)
		req.Identity.TargetID = fmt.Sprintf("left-%d", i)
		if _, err := s.Acquire(ctx, req); err != nil {
			t.Fatal(err)
		}
		if i%300 == 299 {
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantFills(t, s.db, "with the reaper's entries behind the head", bucketFill{bucketHistoryExp, 0.65})
}

// Audit events arrive out of id order: the service makes an event's id
// when its operation starts and writes the event when it ends. Here each
// event is written after a delay of up to 64 events' time; split full,
// the bucket measured 0.45 fill in review (bbolt's default 0.66).
func TestAuditEventsOutOfOrderStayFull(t *testing.T) {
	ctx := context.Background()
	s, err := OpenAudit(filepath.Join(t.TempDir(), AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n, window = 3000, 64
	rng := rand.New(rand.NewPCG(3, 4))
	at := time.Now()
	events := make([]audit.Event, n)
	writeAt := make([]float64, n)
	for i := range events {
		events[i] = audittest.DenyEvent(at.Add(time.Duration(i) * time.Millisecond))
		writeAt[i] = float64(i) + rng.Float64()*window
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return writeAt[order[a]] < writeAt[order[b]] })
	for _, i := range order {
		if err := s.Write(ctx, events[i]); err != nil {
			t.Fatal(err)
		}
	}
	wantFills(t, s.db, "with events written out of id order", bucketFill{auditBucketEvents, 0.6})
}
