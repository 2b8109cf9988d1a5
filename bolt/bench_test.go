package bolt

import (
	bbolt "go.etcd.io/bbolt"

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
// without group commit to show what the group commit buys. Every operation is a
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

// BenchmarkReapBacklog measures one reaper pass over 10,000 leases that
// expired together (expiries/s), and the longest any acquire of a
// concurrent writer waited while it ran (max_writer_wait_ms).
func BenchmarkReapBacklog(b *testing.B) {
	const n = 10000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c := &clock{t: time.Now()}
		s := openTemp(b, Options{Now: c.Now, ReapInterval: -1})
		far := time.Now().Add(time.Hour)
		var wg sync.WaitGroup
		var next atomic.Int64
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := next.Add(1); j <= n; j = next.Add(1) {
					req := acquireReq(fmt.Sprintf("pre-%d", j), time.Second, far)
					req.Identity.TargetID = fmt.Sprintf("t-%d", j)
					if _, err := s.Acquire(context.Background(), req); err != nil {
						b.Errorf("preload: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		c.Add(2 * time.Second)
		stop := make(chan struct{})
		var maxWait atomic.Int64
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				req := acquireReq(fmt.Sprintf("w-%d", j), time.Minute, far)
				req.Identity.TargetID = fmt.Sprintf("w-%d", j)
				t0 := time.Now()
				if _, err := s.Acquire(context.Background(), req); err != nil {
					b.Errorf("writer: %v", err)
					return
				}
				if d := time.Since(t0).Milliseconds(); d > maxWait.Load() {
					maxWait.Store(d)
				}
			}
		}()
		b.StartTimer()
		t0 := time.Now()
		if err := s.reap(context.Background()); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t0)
		b.StopTimer()
		close(stop)
		wg.Wait()
		var left int
		_ = s.db.View(func(tx *bbolt.Tx) error {
			return eachOfKind(readView(tx), kindActive, func(_ string, _, v []byte) error {
				if r, err := lease.DecodeStoredRecord(v); err == nil && !r.LiveAt(lease.At(s.now())) {
					left++
				}
				return nil
			})
		})
		if left != 0 {
			b.Fatalf("%d expired leases left after the pass", left)
		}
		b.ReportMetric(float64(n)/took.Seconds(), "expiries/s")
		b.ReportMetric(float64(maxWait.Load()), "max_writer_wait_ms")
		b.StartTimer()
	}
}

// BenchmarkInspectManyFrozenLayers measures an Inspect of the oldest of
// the leases written while flushes failed, over the frozen layers that
// piled up meanwhile (one per batch), beside the same read over a few:
// what TestS35EngineManyFrozenLayersReadCost requires in allocations,
// here in time.
func BenchmarkInspectManyFrozenLayers(b *testing.B) {
	for _, n := range []int{5, 1500} {
		b.Run(fmt.Sprintf("layers=%d", n), func(b *testing.B) {
			s := openTemp(b, Options{ReapInterval: -1, FlushInterval: time.Nanosecond})
			failing := failFlushes(s.group.engine)
			defer failing.Store(false)
			first := engineAcquire(b, s, "layers", n)[0].res.Lease
			req := lease.InspectRequest{LeaseID: first.LeaseID, DeadlineAt: time.Now().Add(time.Hour)}
			for b.Loop() {
				if in, err := s.Inspect(context.Background(), req); err != nil || in.Lease == nil {
					b.Fatalf("inspect: %+v, %v", in.Lease, err)
				}
			}
		})
	}
}
