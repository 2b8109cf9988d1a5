package service

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// lookupCounter counts LookupRequest calls.
type lookupCounter struct {
	lease.Store
	lookups atomic.Int64
}

func (l *lookupCounter) LookupRequest(ctx context.Context, req lease.LookupRequest) (lease.Result, error) {
	l.lookups.Add(1)
	return l.Store.LookupRequest(ctx, req)
}

// A limit's refusal is checked against stored evidence only when a limit
// refused: admitted requests never pay for the lookup, and a refused one
// without evidence stays refused.
func TestReplayLookupOnlyWhenRefused(t *testing.T) {
	ctx := context.Background()
	s, store := newService(t, &audittest.Recorder{}, Config{PrincipalRate: 1e-3, PrincipalBurst: 2})
	counted := &lookupCounter{Store: store}
	s.store = counted
	p := principal(t, "prn-replay1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	first := call(p)
	got, err := s.Acquire(ctx, first, acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	held := HeldInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, ServiceInstanceID: "inst-1"}
	renew := call(p)
	if _, err := s.Renew(ctx, renew, held); err != nil {
		t.Fatal(err)
	}
	if n := counted.lookups.Load(); n != 0 {
		t.Fatalf("%d lookups for requests the limits admitted", n)
	}
	// The bucket is empty now (burst 2, one token per 1000 s).
	other := acquireInput(target)
	other.Identity.TargetID = "example.org"
	if _, err := s.Acquire(ctx, call(p), other); code(err) != lease.CodeRateLimited {
		t.Fatalf("new work with an empty bucket: %v", err)
	}
	if n := counted.lookups.Load(); n != 1 {
		t.Fatalf("%d lookups for one refused request", n)
	}
	res, err := s.Acquire(ctx, first, acquireInput(target))
	if err != nil || !res.Replayed || res.Lease.LeaseID != got.Lease.LeaseID {
		t.Fatalf("acquire replay with an empty bucket: %v %+v", err, res)
	}
	changed := acquireInput(target)
	changed.TTL = 6 * time.Second
	if _, err := s.Acquire(ctx, first, changed); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("acquire replay with a changed input: %v", err)
	}
	if res, err := s.Renew(ctx, renew, held); err != nil || !res.Replayed {
		t.Fatalf("renew replay with an empty bucket: %v %+v", err, res)
	}
	if n := counted.lookups.Load(); n != 4 {
		t.Fatalf("%d lookups, want 4 (one per refused request)", n)
	}
}
