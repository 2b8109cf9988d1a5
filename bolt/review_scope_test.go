package bolt

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// scopeAcquire acquires a lease of testIdentity with the given tenant,
// program and target, for principal.
func scopeAcquire(t *testing.T, s *Store, tenant, program, target, principal, rid string) *lease.Record {
	t.Helper()
	req := acquireReq(rid, 30*time.Second, time.Now().Add(time.Hour))
	req.Identity.TenantID, req.Identity.ProgramID, req.Identity.TargetID = tenant, program, target
	req.Caller = lease.Caller{PrincipalID: principal, ClientID: "client-" + principal, CredentialID: "key-" + principal}
	a, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return a.Lease
}

// An index entry under one lease's List filters (owner, target, program)
// that names a live lease of another tenant, program, target and owner
// (damage, or an entry copied under the wrong filter) lists nothing under
// those filters: List checks that the active record is the entry's lease,
// not that the lease is one the filter selects.
func TestReviewScopeListHoldsOnlyItsFilter(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1})
	own := scopeAcquire(t, s, "tenant-own", "program-own", "target-own", "prn-own", "req-own")
	foreign := scopeAcquire(t, s, "tenant-foreign", "program-foreign", "target-foreign", "prn-foreign", "req-foreign")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		for _, f := range lease.FiltersOf(own) {
			if err := tx.Bucket(bucketIndex).Put(indexKey(f, foreign.LeaseID), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckListHoldsOnlyItsFilter(t, s, own, foreign)
}

// scopeCycle acquires and releases a lease of the given target for
// principal, returning the released lease as acquired.
func scopeCycle(t *testing.T, s *Store, tenant, target, principal, rid string) *lease.Record {
	t.Helper()
	a := scopeAcquire(t, s, tenant, "program-a", target, principal, rid)
	if _, err := s.Release(context.Background(), lease.ReleaseRequest{Identity: a.Identity(), LeaseID: a.LeaseID,
		FencingToken: a.FencingToken, ServiceInstanceID: a.ServiceInstanceID,
		Mutation: lease.Mutation{RequestID: rid + "-r", DeadlineAt: time.Now().Add(time.Hour), Caller: callerOfRecord(a)}}); err != nil {
		t.Fatal(err)
	}
	return a
}

// A history entry of another identity found among an identity's entries
// (damage, or a copy under the wrong key: the case c19a7b0 keeps out of
// History) must not decide anything about that other identity. When the
// identity's history is trimmed (HistoryPerIdentity) — or its retention
// ends (retireHistorySlice, the same forgetHistory) — the entry goes, and
// with it the lease-id lookup of the lease it names: the OTHER identity's
// lookup. Its lease is then not found by id (Inspect, the service's
// History) though its own history still holds it; were the named lease
// active, List, which reads the lookup, would drop it too.
func TestReviewScopeTrimKeepsAnotherIdentitysLookup(t *testing.T) {
	ctx := context.Background()
	o := Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1}
	o.HistoryPerIdentity = 2
	s := openTemp(t, o)
	for _, active := range []bool{false, true} {
		name := map[bool]string{false: "ended", true: "active"}[active]
		t.Run(name, func(t *testing.T) {
			tenant := "tenant-" + name
			var foreign *lease.Record
			var entry []byte
			if active {
				foreign = scopeAcquire(t, s, "tenant-foreign-"+name, "program-a", "target-foreign", "prn-foreign", "req-foreign-"+name)
				ended := foreign.Clone()
				ended.State = lease.StateReleased
				b, err := (&lease.HistoryEntry{HistoryVersion: lease.HistoryVersion, Record: ended, EndedAt: foreign.AcquiredAt}).Encode()
				if err != nil {
					t.Fatal(err)
				}
				entry = b
			} else {
				foreign = scopeCycle(t, s, "tenant-foreign-"+name, "target-foreign", "prn-foreign", "req-foreign-"+name)
				if err := s.db.View(func(tx *bbolt.Tx) error {
					c := tx.Bucket(bucketIdent).Cursor()
					k, v := c.Seek(historyPrefix(foreign.LockKey))
					if k == nil {
						t.Fatal("no history entry of the foreign lease")
					}
					entry = append([]byte(nil), v...)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			own := scopeCycle(t, s, tenant, "target-own", "prn-own", "req-own-1-"+name)
			// The copy is the identity's oldest entry: the first the trim drops.
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket(bucketIdent).Put(historyKey(own.LockKey, 0), entry)
			}); err != nil {
				t.Fatal(err)
			}
			before, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: foreign.LeaseID, DeadlineAt: time.Now().Add(time.Minute)})
			if err != nil {
				t.Fatalf("the foreign lease by id before the trim: %v", err)
			}
			for i := 2; i <= 3; i++ {
				scopeCycle(t, s, tenant, "target-own", "prn-own", "req-own-"+string(rune('0'+i))+"-"+name)
			}
			got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: foreign.LeaseID, DeadlineAt: time.Now().Add(time.Minute)})
			if err != nil {
				t.Errorf("the foreign lease (%s, tenant %s) by id after another identity's history was trimmed: %v, want %s as before",
					foreign.LeaseID, foreign.TenantID, err, before.Lease.State)
			} else if got.Lease.LeaseID != foreign.LeaseID {
				t.Errorf("inspect by id: %s, want %s", got.Lease.LeaseID, foreign.LeaseID)
			}
			if active {
				res, err := s.List(ctx, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-foreign",
					DeadlineAt: time.Now().Add(time.Minute), PageSize: 50})
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Leases) != 1 || res.Leases[0].LeaseID != foreign.LeaseID {
					t.Errorf("list by the foreign owner: %d leases, want its live lease %s", len(res.Leases), foreign.LeaseID)
				}
			}
		})
	}
}

// The reaper's time indexes (idempotency evidence's, history's) name the
// key they drop. An entry that names a key of another kind of another
// identity — its fencing counter — must not drop it: the counter is never
// deleted (contract: "Expiring or deleting the active lease MUST NOT
// delete, reset, wrap, or reuse that counter"). The reaper deletes
// whatever key the entry names, so the identity's next lease gets a token
// it has already issued.
func TestReviewScopeReaperDropsOnlyItsKind(t *testing.T) {
	ctx := context.Background()
	for _, index := range [][]byte{bucketIdemExp, bucketHistoryExp} {
		t.Run(string(index), func(t *testing.T) {
			s := openTemp(t, Options{ReapInterval: -1})
			first := scopeCycle(t, s, "tenant-victim", "target-victim", "prn-victim", "req-victim-1")
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket(index).Put(timeIndexKey(lease.UnixMilli(1), counterKey(first.LockKey)), nil)
			}); err != nil {
				t.Fatal(err)
			}
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
			next := scopeAcquire(t, s, "tenant-victim", "program-a", "target-victim", "prn-victim", "req-victim-2")
			if next.FencingToken <= first.FencingToken {
				t.Fatalf("token after a reaper pass: %d, want above the %d already issued (the counter was deleted)",
					next.FencingToken, first.FencingToken)
			}
		})
	}
}

// scopePublish publishes one outbox message under a fresh lease of the
// tenant's identity, returning its message id.
func scopePublish(t *testing.T, s *Store, tenant string) string {
	t.Helper()
	a := scopeAcquire(t, s, tenant, "program-a", "target-"+tenant, "prn-"+tenant, "req-pub-"+tenant)
	m := lease.OutboxMessage{RoutingKey: "q", Body: []byte("result of " + tenant)}
	res, err := s.AuthorizeCommit(context.Background(), lease.CommitRequest{Identity: a.Identity(), LeaseID: a.LeaseID,
		FencingToken: a.FencingToken, ServiceInstanceID: a.ServiceInstanceID, Sink: "rabbitmq", CommitID: "commit-" + tenant,
		ExecutionID: a.ExecutionID, JobID: a.JobID, Outbox: &m, DeadlineAt: time.Now().Add(time.Minute), Caller: callerOfRecord(a)})
	if err != nil {
		t.Fatal(err)
	}
	return res.Commit.Target // a publication's target is its message id
}

// pendingIDs are the message ids of the pending outbox, oldest first.
func pendingIDs(t *testing.T, s interface {
	OutboxPending(context.Context, int) ([]lease.OutboxEntry, error)
}) []string {
	t.Helper()
	es, err := s.OutboxPending(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range es {
		ids = append(ids, e.MessageID)
	}
	return ids
}

// The outbox's id lookup (message id → entry) names, after damage, the
// entry of another commit — another tenant's publication. The relay's
// OutboxDone of the first message (it was published and confirmed) must
// not remove that other, unpublished entry: it removes whatever entry the
// lookup names, without checking the entry's message id, so the other
// tenant's fenced publication is lost (and the first one stays pending).
// OutboxDeadLetter does the same.
func TestReviewScopeOutboxDoneRemovesOnlyItsEntry(t *testing.T) {
	for _, op := range []string{"done", "dead-letter"} {
		t.Run(op, func(t *testing.T) {
			ctx := context.Background()
			s := openTemp(t, Options{ReapInterval: -1})
			first, other := scopePublish(t, s, "tenant-first"), scopePublish(t, s, "tenant-other")
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				ids := tx.Bucket(bucketOutboxIDs)
				return ids.Put([]byte(first), bytes.Clone(ids.Get([]byte(other))))
			}); err != nil {
				t.Fatal(err)
			}
			var err error
			if op == "done" {
				err = s.OutboxDone(ctx, first)
			} else {
				err = s.OutboxDeadLetter(ctx, first, "broker refused it")
			}
			if err != nil && lease.CodeOf(err) != lease.CodeCorrupt {
				t.Fatal(err)
			}
			if got := pendingIDs(t, s); !slices.Contains(got, other) {
				t.Fatalf("pending after the %s of %s: %q; the other tenant's unpublished %s was removed", op, first, got, other)
			}
		})
	}
}

// Acquire evidence of one principal copied under another principal's
// evidence key of the same identity and request id (version 2 evidence,
// rebuilt with the request's identity) is answered by LookupRequest as the
// second principal's result: Lookup checks the operation and lock key,
// never that the evidence's lease is the requesting principal's.
func TestReviewScopeLookupHoldsOnlyItsPrincipal(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1})
	orig := scopeAcquire(t, s, "tenant-a", "program-a", "target-a", "prn-first", "req-shared")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		ident := tx.Bucket(bucketIdent)
		v := ident.Get(idemKey(orig.LockKey, lease.IdempotencyScope(lease.OpAcquire, orig.LockKey, "prn-first", "req-shared")))
		if v == nil {
			t.Fatal("no evidence of the first principal's acquire")
		}
		return ident.Put(idemKey(orig.LockKey, lease.IdempotencyScope(lease.OpAcquire, orig.LockKey, "prn-second", "req-shared")), bytes.Clone(v))
	}); err != nil {
		t.Fatal(err)
	}
	leasetest.CheckLookupHoldsOnlyItsPrincipal(t, s, orig, "prn-second", "req-shared")
}
