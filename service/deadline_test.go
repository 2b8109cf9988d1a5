package service

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// A deadline given as the zero time is long past, not absent: every
// operation answers deadline_exceeded and changes nothing; without
// HasDeadline the zero time is the server default.
func TestGivenZeroDeadlineIsPast(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{})
	p := principal(t, "prn-zero1", auth.ClassAdministrator, "tenant:*,program:*", auth.CapLease, auth.CapRead, auth.CapForceRelease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	zero := func() Call { c := call(p); c.HasDeadline = true; return c }
	other := acquireInput(target)
	other.Identity.TargetID = "example.org"
	if _, err := s.Acquire(ctx, zero(), other); code(err) != lease.CodeDeadlineExceeded {
		t.Fatalf("acquire: %v", err)
	}
	held := HeldInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, ServiceInstanceID: "inst-1"}
	if _, err := s.Renew(ctx, zero(), held); code(err) != lease.CodeDeadlineExceeded {
		t.Fatalf("renew: %v", err)
	}
	if _, err := s.Release(ctx, zero(), held); code(err) != lease.CodeDeadlineExceeded {
		t.Fatalf("release: %v", err)
	}
	admin := AdminInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, Reason: "cleanup"}
	if _, err := s.Revoke(ctx, zero(), admin); code(err) != lease.CodeDeadlineExceeded {
		t.Fatalf("revoke: %v", err)
	}
	if _, err := s.Inspect(ctx, zero(), InspectInput{LeaseID: got.Lease.LeaseID}); code(err) != lease.CodeDeadlineExceeded {
		t.Fatalf("inspect: %v", err)
	}
	now, err := s.Inspect(ctx, call(p), InspectInput{LeaseID: got.Lease.LeaseID})
	if err != nil || now.Lease.State != lease.StateActive || now.Lease.ExpiresAt != got.Lease.ExpiresAt {
		t.Fatalf("after past deadlines: %v %+v", err, now.Lease)
	}
	if _, err := s.Acquire(ctx, call(p), other); err != nil {
		t.Fatalf("without a deadline (the default): %v", err)
	}
	if d, class := s.cfg.deadline(time.Now(), Call{}); class != DeadlineDefault || time.Until(d) <= 0 {
		t.Fatalf("no deadline given: %v %s", d, class)
	}
}
