package executor

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
)

// The tests run inside testing/synctest bubbles: the bolt store's backend
// time and the executor's clock are the bubble's fake clock, which advances
// only when every goroutine is blocked, so schedules, deadlines and expiry
// are exact and the tests take milliseconds.

const ttl = 3 * time.Second

var identity = lease.Identity{TenantID: "tenant-main", ProgramID: "program-a",
	TargetNamespace: "starintel-target", TargetID: "target-1", ActorName: "usernamegen"}

var (
	actor = lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}
	admin = lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}
)

func openStore(t *testing.T, o bolt.Options) *bolt.Store {
	t.Helper()
	o.ReapInterval = -1
	s, err := bolt.Open(filepath.Join(t.TempDir(), "lease.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// specFor is a deterministic spec (no jitter) of instance.
func specFor(t *testing.T, instance string) Spec {
	return Spec{Identity: identity, ServiceInstanceID: instance, ExecutionID: "exec-" + instance,
		JobID: "job-1", TraceID: "trace-" + instance, Caller: actor, TTL: ttl, RenewJitter: -1,
		Logger: testLogger(t)}
}

func code(err error) lease.Code { return lease.CodeOf(err) }

// spy wraps a store: it records requests and lets a test replace Renew.
type spy struct {
	LeaseAPI
	mu       sync.Mutex
	acquires []lease.AcquireRequest
	renews   []lease.RenewRequest
	releases []lease.ReleaseRequest
	inspects int
	renew    func(ctx context.Context, req lease.RenewRequest, n int) (lease.Result, error)
	acquire  func(ctx context.Context, req lease.AcquireRequest, n int) (lease.Result, error)
}

func (s *spy) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	s.mu.Lock()
	s.acquires = append(s.acquires, req)
	n, f := len(s.acquires), s.acquire
	s.mu.Unlock()
	if f != nil {
		return f(ctx, req, n)
	}
	return s.LeaseAPI.Acquire(ctx, req)
}

func (s *spy) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	s.mu.Lock()
	s.renews = append(s.renews, req)
	n, f := len(s.renews), s.renew
	s.mu.Unlock()
	if f != nil {
		return f(ctx, req, n)
	}
	return s.LeaseAPI.Renew(ctx, req)
}

func (s *spy) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	s.mu.Lock()
	s.releases = append(s.releases, req)
	s.mu.Unlock()
	return s.LeaseAPI.Release(ctx, req)
}

func (s *spy) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	s.mu.Lock()
	s.inspects++
	s.mu.Unlock()
	return s.LeaseAPI.Inspect(ctx, req)
}

func (s *spy) counts() (renews, releases, inspects int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.renews), len(s.releases), s.inspects
}

func adminRequest(rec *lease.Record) lease.AdminRequest {
	return lease.AdminRequest{Identity: identity, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		Reason: "incident drill", Mutation: lease.Mutation{RequestID: NewRequestID(),
			DeadlineAt: time.Now().Add(time.Minute), Caller: admin}}
}

func inspectByID(t *testing.T, s lease.Store, leaseID string) *lease.Record {
	t.Helper()
	res, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: leaseID, DeadlineAt: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatalf("inspect %s: %v", leaseID, err)
	}
	return res.Lease
}

// causeOfCtx waits for ctx to end and returns its cause and when it ended.
func causeOfCtx(ctx context.Context) (time.Time, error) {
	<-ctx.Done()
	return time.Now(), context.Cause(ctx)
}
