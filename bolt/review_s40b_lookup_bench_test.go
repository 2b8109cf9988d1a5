package bolt

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// BenchmarkS40bLookupOldestOfFullHistory: LookupRequest and a replay
// (Acquire, in the write path) of the acquisition of the oldest of an
// identity's 64 history entries. The same file runs on the parent commit.
func BenchmarkS40bLookupOldestOfFullHistory(b *testing.B) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 64
	s := openTemp(b, Options{StoreOptions: so, Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var first lease.AcquireRequest
	for i := 0; i < 64; i++ {
		req := acquireReq(fmt.Sprintf("acq-%d", i), time.Minute, far)
		a, err := s.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			first = req
		}
		c.Add(time.Second)
		r := a.Lease
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
			ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%d", i), DeadlineAt: far,
				Caller: callerOfRecord(r)}}); err != nil {
			b.Fatal(err)
		}
	}
	lk := lease.LookupRequest{Op: lease.OpAcquire, Identity: first.Identity, PrincipalID: first.Caller.PrincipalID, RequestID: first.RequestID, DeadlineAt: far}
	b.Run("lookup", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := s.LookupRequest(ctx, lk); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if r, err := s.Acquire(ctx, first); err != nil || !r.Replayed {
				b.Fatal(err)
			}
		}
	})
}
