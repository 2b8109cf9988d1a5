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
	for _, c := range []struct {
		bucket []byte
		min    float64
	}{{bucketIdemExp, 0.9}, {bucketActiveExp, 0.8}, {bucketIndex, 0.75}} {
		if f := leafFill(t, s.db, c.bucket); f < c.min {
			t.Errorf("%s: leaf fill %.2f after %d acquisitions, want at least %.2f", c.bucket, f, n, c.min)
		}
	}
	for i, l := range held {
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
			ServiceInstanceID: l.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%d", i),
				DeadlineAt: time.Now().Add(time.Minute), Caller: lease.Caller{PrincipalID: l.OwnerPrincipalID}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range [][]byte{bucketIdemExp, bucketHistoryExp} {
		if f := leafFill(t, s.db, b); f < 0.9 {
			t.Errorf("%s: leaf fill %.2f after %d releases, want at least 0.90", b, f, n)
		}
	}
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
	if f := leafFill(t, s.db, auditBucketEvents); f < 0.8 {
		t.Errorf("audit events: leaf fill %.2f, want at least 0.80", f)
	}
}
