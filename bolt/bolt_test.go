package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var testIdentity = lease.Identity{TenantID: "tenant-main", ProgramID: "program-a",
	TargetNamespace: "starintel-target", TargetID: "target-1", ActorName: "usernamegen"}

func acquireReq(id string, ttl time.Duration, deadline time.Time) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: testIdentity, ServiceInstanceID: "instance-1", TTL: ttl,
		MaximumLifetime: 10 * ttl, ExecutionID: "execution-1", JobID: "job-1",
		Mutation: lease.Mutation{RequestID: id, DeadlineAt: deadline,
			Caller: lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}}}
}

func code(err error) lease.Code { return lease.CodeOf(err) }

// A clock stepped back must not revive an expired lease: backend time is
// floored at the last time a transaction used, persisted across reopen.
func TestBackendTimeNeverMovesBackwards(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s, err := Open(path, Options{Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour)
	first, err := s.Acquire(ctx, acquireReq("req-1", 30*time.Second, far))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	c.Add(31 * time.Second) // expired
	if _, err := s.Acquire(ctx, acquireReq("req-2", 30*time.Second, far)); err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	s.Close()

	c.Add(-10 * time.Minute) // the machine's clock steps back
	s, err = Open(path, Options{Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far})
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	if want := first.Lease.AcquiredAt.Add(31 * time.Second); res.BackendTime != want {
		t.Fatalf("backend time %s went back below %s", res.BackendTime, want)
	}
	if res.Lease.FencingToken != 2 || res.Lease.State != lease.StateActive {
		t.Fatalf("got token %d state %s, want 2 active", res.Lease.FencingToken, res.Lease.State)
	}
	// The first lease stays terminal whatever the clock says.
	old, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: first.Lease.LeaseID, DeadlineAt: far})
	if err != nil || old.Lease.State != lease.StateExpired {
		t.Fatalf("first lease: %v %+v", err, old.Lease)
	}
}

// The counter and idempotency evidence are durable: a reopened file
// continues the sequence and replays the original result.
func TestCounterAndEvidenceSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	far := time.Now().Add(time.Hour)
	s, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Acquire(ctx, acquireReq("req-1", time.Minute, far))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: testIdentity, LeaseID: first.Lease.LeaseID,
		FencingToken: 1, ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: "req-rel",
			DeadlineAt: far, Caller: lease.Caller{PrincipalID: "prn-actor"}}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	replay, err := s.Acquire(ctx, acquireReq("req-1", time.Minute, far))
	if err != nil {
		t.Fatal(err)
	}
	if !replay.Replayed || replay.Lease.LeaseID != first.Lease.LeaseID || replay.Lease.FencingToken != 1 {
		t.Fatalf("replay after reopen: %+v", replay)
	}
	if replay.Current == nil || replay.Current.State != lease.StateReleased {
		t.Fatalf("replay must carry the current terminal state, got %+v", replay.Current)
	}
	next, err := s.Acquire(ctx, acquireReq("req-2", time.Minute, far))
	if err != nil || next.Lease.FencingToken != 2 {
		t.Fatalf("next acquire: %v %+v", err, next.Lease)
	}
}

// A second process cannot open a file in use: bbolt's file lock.
func TestFileInUseIsUnavailable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(path, Options{ReapInterval: -1})
	var le *lease.Error
	if !errors.As(err, &le) || le.Code != lease.CodeBackendUnavailable {
		t.Fatalf("second open: %v", err)
	}
}

// The reaper archives expired leases conditionally and drops idempotency
// evidence only past retention; the counter stays.
func TestReaper(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	first, err := s.Acquire(ctx, acquireReq("req-1", time.Second, far))
	if err != nil {
		t.Fatal(err)
	}
	c.Add(2 * time.Second)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far}); code(err) != lease.CodeNotFound {
		t.Fatalf("after reap the identity must have no active record, got %v", err)
	}
	h, err := s.History(ctx, lease.HistoryRequest{Identity: testIdentity, DeadlineAt: far})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.State != lease.StateExpired ||
		h.Entries[0].Record.LeaseID != first.Lease.LeaseID || h.Entries[0].EndedAt != first.Lease.ExpiresAt {
		t.Fatalf("history: %v %+v", err, h.Entries)
	}
	// Evidence is kept until retention passes, then reclaimed.
	c.Add(lease.DefaultIdempotencyRetention - time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	lookup := lease.LookupRequest{Op: lease.OpAcquire, Identity: testIdentity, PrincipalID: "prn-actor", RequestID: "req-1", DeadlineAt: far}
	if r, err := s.LookupRequest(ctx, lookup); err != nil || r.Lease.LeaseID != first.Lease.LeaseID {
		t.Fatalf("evidence reclaimed too early: %v", err)
	}
	c.Add(2 * time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupRequest(ctx, lookup); code(err) != lease.CodeNotFound {
		t.Fatalf("evidence past retention must be reclaimed, got %v", err)
	}
	next, err := s.Acquire(ctx, acquireReq("req-3", time.Second, far))
	if err != nil || next.Lease.FencingToken != 2 {
		t.Fatalf("counter must survive reclamation: %v %+v", err, next.Lease)
	}
}
