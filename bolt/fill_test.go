package bolt

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

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
		if f := leafFill(t, db, w.bucket); f < w.fill {
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
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
			ServiceInstanceID: l.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%d", i),
				DeadlineAt: time.Now().Add(time.Minute), Caller: lease.Caller{PrincipalID: l.OwnerPrincipalID}}}); err != nil {
			t.Fatal(err)
		}
	}
	wantFills(t, s.db, "after the releases", bucketFill{bucketIdemExp, 0.9}, bucketFill{bucketHistoryExp, 0.9},
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
	wantFills(t, s.db, "after 3000 events", bucketFill{auditBucketEvents, 0.8})
}
