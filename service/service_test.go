package service

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
)

var target = lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "web",
	TargetID: "example.com", ActorName: "crawler"}

func principal(t *testing.T, id string, class auth.Class, scope string, caps ...auth.Capability) auth.Principal {
	t.Helper()
	sc, err := auth.ParseScope(scope)
	if err != nil {
		t.Fatal(err)
	}
	return auth.Principal{ID: id, Class: class, ClientID: id, CredentialID: "01M8VRFBG0000000000000000" + id[len(id)-1:], Capabilities: caps, Scope: sc}
}

func newService(t *testing.T, sink audit.Sink, cfg Config) (*Service, lease.Store) {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	s, err := New(store, sink, Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return s, store
}

func code(err error) lease.Code { return lease.CodeOf(err) }

var n atomic.Int64

func call(p auth.Principal) Call {
	return Call{Principal: p, CorrelationID: "corr-1", RequestID: "req-" + time.Now().Format("150405.000000") + "-" + string(rune('a'+n.Add(1)%26))}
}

func acquireInput(id lease.Identity) AcquireInput {
	return AcquireInput{Identity: id, TTL: 5 * time.Second, ServiceInstanceID: "inst-1", ExecutionID: "exec-1", JobID: "job-1"}
}

// sinkFailingAfter accepts n writes, then fails every write.
type sinkFailingAfter struct {
	audittest.Recorder
	ok atomic.Int64
}

func (s *sinkFailingAfter) Write(ctx context.Context, e audit.Event) error {
	if s.ok.Add(-1) < 0 {
		return errors.New("sink down")
	}
	return s.Recorder.Write(ctx, e)
}

// If the durable audit of an administrative attempt cannot be written,
// nothing happens to the lease and the request fails.
func TestRevokeRefusedWithoutDurableAudit(t *testing.T) {
	ctx := context.Background()
	sink := &sinkFailingAfter{}
	sink.ok.Store(1) // the holder's acquire is audited; nothing after
	s, store := newService(t, sink, Config{})
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	admin := principal(t, "prn-admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease, auth.CapRead)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Revoke(ctx, call(admin), AdminInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, Reason: "compromised worker"})
	if code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("revoke without audit: %v", err)
	}
	now, err := store.Inspect(ctx, lease.InspectRequest{Identity: target, DeadlineAt: time.Now().Add(time.Second)})
	if err != nil || now.Lease.LeaseID != got.Lease.LeaseID || now.Lease.State != lease.StateActive {
		t.Fatalf("the lease must be untouched: %v %+v", err, now.Lease)
	}
}

// If the attempt was audited but the result's audit fails, the lease is
// revoked (the safe direction), the request reports outcome_unknown, and a
// retry with the same request id replays the result and audits it.
func TestRevokeResultAuditFailureIsOutcomeUnknown(t *testing.T) {
	ctx := context.Background()
	sink := &sinkFailingAfter{}
	sink.ok.Store(2) // the acquire and the revoke attempt
	s, store := newService(t, sink, Config{})
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	admin := principal(t, "prn-admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	c := call(admin)
	in := AdminInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, IncidentID: "inc-7"}
	if _, err := s.Revoke(ctx, c, in); code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("revoke with a failing result audit: %v", err)
	}
	if _, err := store.Inspect(ctx, lease.InspectRequest{Identity: target, DeadlineAt: time.Now().Add(time.Second)}); code(err) != lease.CodeNotFound {
		t.Fatalf("the lease must be revoked: %v", err)
	}
	attempts := sink.OfType(audit.EventRevoke)
	if len(attempts) != 1 || attempts[0].ResultCode != lease.CodeOutcomeUnknown || attempts[0].Priority != audit.PriorityHigh ||
		attempts[0].IncidentID != "inc-7" || attempts[0].LeaseID != got.Lease.LeaseID {
		t.Fatalf("the attempt must be audited durably first: %+v", attempts)
	}
	sink.ok.Store(10)
	res, err := s.Revoke(ctx, c, in)
	if err != nil || !res.Replayed || res.Lease.State != lease.StateRevoked {
		t.Fatalf("retry with the same request id: %v %+v", err, res)
	}
	if last := sink.OfType(audit.EventRevoke); last[len(last)-1].ResultCode != lease.CodeRevoked {
		t.Fatalf("the retry must audit the result: %+v", last[len(last)-1])
	}
}

func TestPolicy(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	s, _ := newService(t, rec, Config{MinTTL: time.Second, MaxTTL: time.Minute, MaxActivePerPrincipal: 1,
		PrincipalRate: 1000, PrincipalBurst: 1000, TargetRate: 1000, TargetBurst: 1000})
	p := principal(t, "prn-one1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	for _, ttl := range []time.Duration{time.Second, time.Minute + time.Millisecond, 0} {
		in := acquireInput(target)
		in.TTL = ttl
		_, err := s.Acquire(ctx, call(p), in)
		if le := lease.AsError(err); le == nil || le.Code != lease.CodeInvalidRequest || le.Field != "ttl_ms" {
			t.Errorf("ttl %s: %v", ttl, err)
		}
	}
	in := acquireInput(target)
	in.MaximumLifetime = 2 * time.Hour
	if le := lease.AsError(func() error { _, err := s.Acquire(ctx, call(p), in); return err }()); le == nil || le.Field != "maximum_lifetime_ms" {
		t.Errorf("lifetime above the configured maximum: %v", le)
	}
	if _, err := s.Acquire(ctx, call(p), acquireInput(target)); err != nil {
		t.Fatal(err)
	}
	other := target
	other.TargetID = "example.org"
	_, err := s.Acquire(ctx, call(p), acquireInput(other))
	if le := lease.AsError(err); le == nil || le.Code != lease.CodeRateLimited || le.RetryAfter <= 0 {
		t.Fatalf("quota of one active lease: %v", err)
	}
	// One audit event per request, whatever the result.
	if got := len(rec.OfType(audit.EventAcquire)); got != 6 {
		t.Fatalf("want 6 acquire events, got %d", got)
	}
}

func TestRateLimits(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{PrincipalRate: 0.5, PrincipalBurst: 1})
	p := principal(t, "prn-fast1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	if _, err := s.Acquire(ctx, call(p), acquireInput(target)); err != nil {
		t.Fatal(err)
	}
	other := target
	other.TargetID = "example.org"
	_, err := s.Acquire(ctx, call(p), acquireInput(other))
	if le := lease.AsError(err); le == nil || le.Code != lease.CodeRateLimited || le.RetryAfter < time.Second {
		t.Fatalf("second acquire within the bucket: %v", err)
	}
}

// A bounded wait retries a conflict until the holder's lease expires, and
// never past the deadline.
func TestBoundedWait(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{MinTTL: 100 * time.Millisecond})
	a := principal(t, "prn-a1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	b := principal(t, "prn-b2", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	first := acquireInput(target)
	first.TTL = 300 * time.Millisecond
	if _, err := s.Acquire(ctx, call(a), first); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, call(b), acquireInput(target)); code(err) != lease.CodeConflict {
		t.Fatalf("without wait: %v", err)
	}
	waiting := acquireInput(target)
	waiting.Wait = 3 * time.Second
	got, err := s.Acquire(ctx, call(b), waiting)
	if err != nil || got.Lease.OwnerPrincipalID != "prn-b2" || got.Lease.FencingToken != 2 {
		t.Fatalf("with a bounded wait: %v %+v", err, got.Lease)
	}
	c := call(a)
	c.DeadlineAt = time.Now().Add(200 * time.Millisecond)
	start := time.Now()
	if _, err := s.Acquire(ctx, c, waiting); code(err) != lease.CodeConflict {
		t.Fatalf("wait bounded by the deadline: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("the wait outlived its deadline")
	}
}

// Ordinary callers never see leases outside their scope or owned by others
// without targets:read; mutations of another's lease are lease_lost.
func TestScopeAndOwnership(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{})
	owner := principal(t, "prn-own1", auth.ClassAPIClient, "tenant:tenant-main,program:program-a", auth.CapLease)
	peer := principal(t, "prn-peer2", auth.ClassAPIClient, "tenant:tenant-main,program:program-a", auth.CapLease)
	outsider := principal(t, "prn-out3", auth.ClassAPIClient, "tenant:tenant-other,program:*", auth.CapLease, auth.CapRead)
	reader := principal(t, "prn-read4", auth.ClassAPIClient, "tenant:tenant-main,program:*", auth.CapRead)
	got, err := s.Acquire(ctx, call(owner), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, call(outsider), acquireInput(target)); code(err) != lease.CodeAccessDenied {
		t.Fatalf("out of scope acquire: %v", err)
	}
	held := HeldInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, ServiceInstanceID: "inst-1"}
	if _, err := s.Release(ctx, call(peer), held); code(err) != lease.CodeLost {
		t.Fatalf("release by another principal: %v", err)
	}
	if _, err := s.Inspect(ctx, call(peer), InspectInput{LeaseID: got.Lease.LeaseID}); code(err) != lease.CodeNotFound {
		t.Fatalf("inspect of another's lease without targets:read: %v", err)
	}
	if _, err := s.Inspect(ctx, call(outsider), InspectInput{LeaseID: got.Lease.LeaseID}); code(err) != lease.CodeNotFound {
		t.Fatalf("inspect by id outside scope: %v", err)
	}
	if r, err := s.Inspect(ctx, call(reader), InspectInput{Identity: target}); err != nil || r.Lease.LeaseID != got.Lease.LeaseID {
		t.Fatalf("targets:read in scope: %v", err)
	}
	page, err := s.List(ctx, call(outsider), lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-own1"})
	if err != nil || len(page.Leases) != 0 {
		t.Fatalf("list across scope must show nothing: %v %d", err, len(page.Leases))
	}
	if _, err := s.List(ctx, call(peer), lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-own1"}); code(err) != lease.CodeAccessDenied {
		t.Fatalf("listing another owner without targets:read: %v", err)
	}
	if _, err := s.Revoke(ctx, call(reader), AdminInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: 1, Reason: "x"}); code(err) != lease.CodeAccessDenied {
		t.Fatalf("revoke without administrator: %v", err)
	}
	if r, err := s.Release(ctx, call(owner), held); err != nil || r.Lease.State != lease.StateReleased {
		t.Fatalf("owner release: %v", err)
	}
}

// lateRetryStore answers every acquire after the first as a deadline that
// elapsed before the operation started, as a retry woken after its
// deadline is answered.
type lateRetryStore struct {
	lease.Store
	calls atomic.Int64
}

func (l *lateRetryStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	if l.calls.Add(1) > 1 {
		return lease.Result{}, lease.Errorf(lease.CodeDeadlineExceeded, "deadline elapsed before the operation started")
	}
	return l.Store.Acquire(ctx, req)
}

// A bounded wait whose retry starts after the deadline (a late timer on a
// busy machine) still answers with the conflict it waited on.
func TestBoundedWaitLateRetryIsTheConflict(t *testing.T) {
	ctx := context.Background()
	s, store := newService(t, &audittest.Recorder{}, Config{MinTTL: 100 * time.Millisecond})
	a := principal(t, "prn-a1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	b := principal(t, "prn-b2", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	if _, err := s.Acquire(ctx, call(a), acquireInput(target)); err != nil {
		t.Fatal(err)
	}
	late := &lateRetryStore{Store: store}
	s.store = late
	waiting := acquireInput(target)
	waiting.Wait = 3 * time.Second
	c := call(b)
	c.DeadlineAt = time.Now().Add(time.Second)
	if _, err := s.Acquire(ctx, c, waiting); code(err) != lease.CodeConflict {
		t.Fatalf("a late retry: %v, want the conflict", err)
	}
	if late.calls.Load() != 2 {
		t.Fatalf("%d store calls, want the first and one late retry", late.calls.Load())
	}
}

// Renewals are charged to the caller's own bucket for the target, never to
// the per-target bucket every principal's acquires share: another
// principal's conflicting acquires and its renewals of leases it does not
// hold (lease_lost) leave the holder's renewals admitted.
func TestRenewalsNotStarvedByOtherPrincipals(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{TargetRate: 1e-3, TargetBurst: 2})
	holder := principal(t, "prn-holder2", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	other := principal(t, "prn-other2", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	held := HeldInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, ServiceInstanceID: "inst-1"}
	if _, err := s.Acquire(ctx, call(other), acquireInput(target)); code(err) != lease.CodeConflict {
		t.Fatalf("conflicting acquire: %v", err)
	}
	if _, err := s.Acquire(ctx, call(other), acquireInput(target)); code(err) != lease.CodeRateLimited {
		t.Fatalf("the shared target bucket (burst 2) is empty now: %v", err)
	}
	for range 3 {
		if _, err := s.Renew(ctx, call(other), held); code(err) != lease.CodeLost && code(err) != lease.CodeRateLimited {
			t.Fatalf("another principal's renewal of the holder's lease: %v", err)
		}
	}
	for i := range 2 {
		if _, err := s.Renew(ctx, call(holder), held); err != nil {
			t.Fatalf("holder's renewal %d: %v", i, err)
		}
	}
	// The holder's own bucket for the target (burst 2) bounds its renewals.
	if _, err := s.Renew(ctx, call(holder), held); code(err) != lease.CodeRateLimited {
		t.Fatalf("third renewal within the holder's bucket: %v", err)
	}
}

// The renewal buckets are keyed by targets callers name, so their set is
// bounded; once every bucket is busy a new key is admitted (renewals) or
// refused (the others), never grown.
func TestLimitersBoundedWhenFull(t *testing.T) {
	now := time.Now()
	for _, admit := range []bool{false, true} {
		l := newLimiters(1e-6, 1, admit)
		for i := range maxBuckets {
			if ok, _ := l.allow(fmt.Sprint("k", i), now); !ok {
				t.Fatalf("key %d refused before the set was full", i)
			}
		}
		if ok, _ := l.allow("new", now); ok != admit {
			t.Fatalf("admitWhenFull %v: a new key with every bucket busy allowed=%v", admit, ok)
		}
		if len(l.buckets) != maxBuckets {
			t.Fatalf("the set grew to %d", len(l.buckets))
		}
		if ok, _ := l.allow("k0", now); ok {
			t.Fatal("a busy key's empty bucket admitted")
		}
	}
}
