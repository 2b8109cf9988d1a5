package bolt

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// BenchmarkAcquireRelease measures acquire+release pairs per second, each
// pair on its own identity, with 1 and 32 concurrent goroutines, and at 32
// without group commit to show what DB.Batch buys. Every operation is a
// durable (fsync'd) transaction.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, c := range []struct {
		name        string
		goroutines  int
		soloCommits bool
	}{
		{"goroutines=1", 1, false},
		{"goroutines=32", 32, false},
		{"goroutines=32/no-group-commit", 32, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := openTemp(b, Options{ReapInterval: -1})
			s.soloCommits = c.soloCommits
			benchPairs(b, s, c.goroutines)
		})
	}
}

func benchPairs(b *testing.B, s lease.Store, goroutines int) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			id := testIdentity
			id.TargetID = fmt.Sprintf("bench-%d", g)
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				deadline := time.Now().Add(time.Minute)
				req := acquireReq(fmt.Sprintf("acq-%d", i), time.Minute, deadline)
				req.Identity = id
				got, err := s.Acquire(ctx, req)
				if err != nil {
					b.Errorf("acquire: %v", err)
					return
				}
				if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: got.Lease.LeaseID,
					FencingToken: got.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%d", i), DeadlineAt: deadline, Caller: req.Caller}}); err != nil {
					b.Errorf("release: %v", err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}
