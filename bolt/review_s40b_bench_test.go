package bolt

import (
	"bytes"

	bbolt "go.etcd.io/bbolt"

	"context"
	"fmt"
	"github.com/starintel/starlease/internal/layered"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

func s40bCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkS40bCycleAtCap: acquire+release pairs on 32 identities whose
// history is at its cap (every release trims one entry, whose lease's
// acquisition evidence is still within retention), reporting process CPU
// per pair. The same file runs on the parent commit for comparison.
func BenchmarkS40bCycleAtCap(b *testing.B) {
	for _, hcap := range []int{4, 64} {
		b.Run(fmt.Sprintf("cap=%d", hcap), func(b *testing.B) {
			so := leasetest.StoreOptions()
			so.HistoryPerIdentity = hcap
			s := openTemp(b, Options{StoreOptions: so, ReapInterval: -1})
			ctx := context.Background()
			const G = 32
			// Warm every identity past its cap.
			pair := func(g int, i int64) error {
				id := testIdentity
				id.TargetID = fmt.Sprintf("cap-%d", g)
				deadline := time.Now().Add(time.Minute)
				req := acquireReq(fmt.Sprintf("acq-%d", i), time.Minute, deadline)
				req.Identity = id
				got, err := s.Acquire(ctx, req)
				if err != nil {
					return err
				}
				_, err = s.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: got.Lease.LeaseID,
					FencingToken: got.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%d", i), DeadlineAt: deadline, Caller: req.Caller}})
				return err
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < G; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for k := 0; k < hcap+2; k++ {
						if err := pair(g, -next.Add(1)); err != nil {
							b.Error(err)
							return
						}
					}
				}(g)
			}
			wg.Wait()
			next.Store(0)
			b.ResetTimer()
			cpu0, t0 := s40bCPU(), time.Now()
			for g := 0; g < G; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						if err := pair(g, i); err != nil {
							b.Error(err)
							return
						}
					}
				}(g)
			}
			wg.Wait()
			b.ReportMetric(float64((s40bCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/pair")
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "pairs/s")
		})
	}
}

// BenchmarkS40bDetach isolates what detachEvidence adds to each history
// drop: "hit" rewrites live version 3 evidence (the ev3 value is put back
// each time; "put" is that Put alone), "miss" is a drop whose evidence is
// gone (the scope hash and a Get), "decode" the history decode every drop
// already does, for scale.
func BenchmarkS40bDetach(b *testing.B) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(b, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1, FlushInterval: -1})
	s.schema10Writes = true // version 3 evidence and a version 2 entry, whose detach this measures
	ctx := context.Background()
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	req := acquireReq("acq-bench", time.Minute, far)
	req.Metadata = lease.Metadata{"a": "b", "n": 3}
	a, err := s.Acquire(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	r := a.Lease
	if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel-bench", DeadlineAt: far, Caller: callerOfRecord(r)}}); err != nil {
		b.Fatal(err)
	}
	p, _ := lease.PrepareLookup(lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID, RequestID: req.RequestID, DeadlineAt: far}, s.opts)
	k := idemKey(p.LockKey, p.Scope)
	var ev3, hv []byte
	_ = s.db.View(func(tx *bbolt.Tx) error {
		ev3 = bytes.Clone(tx.Bucket(bucketIdent).Get(k))
		c := tx.Bucket(bucketIdent).Cursor()
		_, v := c.Seek(historyPrefix(p.LockKey))
		hv = bytes.Clone(v)
		return nil
	})
	h, err := lease.DecodeStoredHistoryAt(hv, p.LockKey)
	if err != nil || !bytes.HasPrefix(ev3, []byte(lease.EvidenceRefPrefix)) {
		b.Fatalf("setup: %v %q", err, ev3)
	}
	run := func(name string, fn func(tx *layered.View) error) {
		b.Run(name, func(b *testing.B) {
			tx, err := s.db.Begin(true)
			if err != nil {
				b.Fatal(err)
			}
			defer tx.Rollback()
			b.ResetTimer()
			_ = direct(tx, func(v *layered.View) error {
				for i := 0; i < b.N; i++ {
					if err := fn(v); err != nil {
						b.Fatal(err)
					}
				}
				return nil
			})
		})
	}
	run("put", func(v *layered.View) error { return v.Bucket(bucketIdent).Put(k, ev3) })
	run("hit", func(v *layered.View) error {
		if err := v.Bucket(bucketIdent).Put(k, ev3); err != nil {
			return err
		}
		return detachEvidence(v, p.LockKey, h, hv)
	})
	other := *h
	other.Record = h.Record.Clone()
	other.Record.RequestID = "no-evidence"
	other.RequestID = "no-evidence"
	run("miss", func(v *layered.View) error { return detachEvidence(v, p.LockKey, &other, hv) })
	run("decode", func(v *layered.View) error { _, err := lease.DecodeStoredHistoryAt(hv, p.LockKey); return err })
}
