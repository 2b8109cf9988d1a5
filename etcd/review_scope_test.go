package etcd

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// An index entry under one lease's List filters (owner, target, program)
// that names a live lease of another tenant, program, target and owner
// (damage, or an entry copied under the wrong filter) lists nothing under
// those filters: List checks that the active record is the entry's lease,
// not that the lease is one the filter selects.
func TestReviewScopeListHoldsOnlyItsFilter(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	a, err := s.Acquire(ctx, recAcquire("target-own", "req-own", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	other := recAcquire("target-foreign", "req-foreign", 3*time.Minute)
	other.Identity.TenantID, other.Identity.ProgramID = "tenant-foreign", "program-foreign"
	other.Caller = lease.Caller{PrincipalID: "prn-foreign", ClientID: "client-foreign", CredentialID: "key-foreign"}
	b, err := s.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	own, foreign := a.Lease, b.Lease
	for _, f := range lease.FiltersOf(own) {
		if _, err := s.cli.Put(ctx, s.keys.index(f, foreign.LeaseID), foreign.LockKey); err != nil {
			t.Fatal(err)
		}
	}
	leasetest.CheckListHoldsOnlyItsFilter(t, s, own, foreign)
}

// scopePublish publishes one outbox message under a fresh lease of the
// target's identity in tenant, returning its message id.
func scopePublish(t *testing.T, s *Store, tenant string) string {
	t.Helper()
	ctx := context.Background()
	req := recAcquire("target-"+tenant, "req-pub-"+tenant, 3*time.Minute)
	req.Identity.TenantID = tenant
	a, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	l := a.Lease
	m := lease.OutboxMessage{RoutingKey: "q", Body: []byte("result of " + tenant)}
	res, err := s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: l.Identity(), LeaseID: l.LeaseID,
		FencingToken: l.FencingToken, ServiceInstanceID: l.ServiceInstanceID, Sink: "rabbitmq", CommitID: "commit-" + tenant,
		ExecutionID: l.ExecutionID, JobID: l.JobID, Outbox: &m, DeadlineAt: recFar(), Caller: recCaller})
	if err != nil {
		t.Fatal(err)
	}
	return res.Commit.Target // a publication's target is its message id
}

// The outbox's id entry (message id → entry) names, after damage, the
// entry of another commit — another tenant's publication. The relay's
// OutboxDone of the first message must not remove that other, unpublished
// entry: it removes whatever entry the id names, without checking the
// entry's message id, so the other tenant's fenced publication is lost.
// OutboxDeadLetter does the same.
func TestReviewScopeOutboxDoneRemovesOnlyItsEntry(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 1)
	for _, op := range []string{"done", "dead-letter"} {
		t.Run(op, func(t *testing.T) {
			ctx := context.Background()
			s := open(t, c, Options{StoreOptions: leasetest.StoreOptions()})
			first, other := scopePublish(t, s, "tenant-first"), scopePublish(t, s, "tenant-other")
			r, err := s.cli.Get(ctx, s.keys.outboxID(other))
			if err != nil || len(r.Kvs) != 1 {
				t.Fatalf("id entry of the other message: %v", err)
			}
			if _, err := s.cli.Put(ctx, s.keys.outboxID(first), string(r.Kvs[0].Value)); err != nil {
				t.Fatal(err)
			}
			if op == "done" {
				err = s.OutboxDone(ctx, first)
			} else {
				err = s.OutboxDeadLetter(ctx, first, "broker refused it")
			}
			if err != nil && lease.CodeOf(err) != lease.CodeCorrupt {
				t.Fatal(err)
			}
			es, err := s.OutboxPending(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range es {
				got = append(got, e.MessageID)
			}
			if !slices.Contains(got, other) {
				t.Fatalf("pending after the %s of %s: %q; the other tenant's unpublished %s was removed", op, first, got, other)
			}
		})
	}
}

// Acquire evidence of one principal copied under another principal's
// evidence key of the same identity and request id is answered by
// LookupRequest as the second principal's result (see the bolt twin).
func TestReviewScopeLookupHoldsOnlyItsPrincipal(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	a, err := s.Acquire(ctx, recAcquire("target-lookup", "req-shared", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	orig := a.Lease
	r, err := s.cli.Get(ctx, s.keys.idem(lease.IdempotencyScope(lease.OpAcquire, orig.LockKey, recCaller.PrincipalID, "req-shared")))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("evidence of the first principal's acquire: %v", err)
	}
	if _, err := s.cli.Put(ctx, s.keys.idem(lease.IdempotencyScope(lease.OpAcquire, orig.LockKey, "prn-second", "req-shared")),
		string(r.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckLookupHoldsOnlyItsPrincipal(t, s, orig, "prn-second", "req-shared")
}

// A history retention index entry of one identity (he/<ms>/<lock key>/<seq>)
// whose value names a lease of another identity — a live one — (damage,
// or an entry copied from another identity's) must not delete that
// lease's lease-id entry when the reaper drops it: dropDue deletes the
// lease-id entry its value names without checking that the entry locates
// a lease of this identity, so the live lease is no longer found by id
// (Inspect, the service's History).
func TestReviewScopeHistoryRetentionKeepsAnotherLeasesLookup(t *testing.T) {
	ctx := context.Background()
	s := open(t, testenv.StartEtcdCluster(t, 1), Options{StoreOptions: leasetest.StoreOptions()})
	own, err := s.Acquire(ctx, recAcquire("target-own", "req-own", 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, recRelease(own.Lease, "rel-own")); err != nil {
		t.Fatal(err)
	}
	other := recAcquire("target-foreign", "req-foreign", 3*time.Minute)
	other.Identity.TenantID = "tenant-foreign"
	b, err := s.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	foreign := b.Lease
	if _, err := s.cli.Put(ctx, s.keys.expiry(historyExpiry, 1, own.Lease.LockKey+"/"+hex16(1<<40)), foreign.LeaseID); err != nil {
		t.Fatal(err)
	}
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: foreign.LeaseID, DeadlineAt: recFar()})
	if err != nil || got.Lease.LeaseID != foreign.LeaseID {
		t.Fatalf("the live foreign lease %s (tenant %s) by id after a reaper pass: %v, want it active", foreign.LeaseID, foreign.TenantID, err)
	}
}
