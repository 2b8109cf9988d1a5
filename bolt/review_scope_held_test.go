package bolt

import (
	"bytes"
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// Held (review scope): evidence, commit evidence and lease-id lookups of
// another identity found under an identity's keys are refused, not used.

// Version 2 acquire evidence of identity B copied under identity A's
// evidence key (same principal, same request id) is rebuilt with A's tuple
// and B's hash tag, which do not hash together: corrupt, on the replay and
// on LookupRequest; B's lease is never answered as A's.
func TestScopeHeldForeignEv2EvidenceIsCorrupt(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	a := scopeAcquire(t, s, "tenant-a", "program-a", "target-a", "prn-x", "req-a")
	b := scopeAcquire(t, s, "tenant-b", "program-b", "target-b", "prn-x", "req-b")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		ident := tx.Bucket(bucketIdent)
		v := ident.Get(idemKey(b.LockKey, lease.IdempotencyScope(lease.OpAcquire, b.LockKey, "prn-x", "req-b")))
		// Version 3 (schema 10) in the version 2 form the store detaches
		// it into.
		v = asVersion2(t, tx, b.LockKey, v)
		if !bytes.HasPrefix(v, []byte(lease.EvidenceV2Prefix)) {
			t.Fatalf("evidence of b is not version 2: %.20q", v)
		}
		return ident.Put(idemKey(a.LockKey, lease.IdempotencyScope(lease.OpAcquire, a.LockKey, "prn-x", "req-b")), bytes.Clone(v))
	}); err != nil {
		t.Fatal(err)
	}
	res, err := s.LookupRequest(ctx, lease.LookupRequest{Op: lease.OpAcquire, Identity: a.Identity(), PrincipalID: "prn-x",
		RequestID: "req-b", DeadlineAt: time.Now().Add(time.Minute)})
	if code(err) != lease.CodeCorrupt {
		t.Fatalf("lookup: %v %+v, want corrupt", err, res.Lease)
	}
	req := acquireReq("req-b", 30*time.Second, time.Now().Add(time.Hour))
	req.Identity = a.Identity()
	req.Caller = callerOfRecord(b)
	if r, err := s.Acquire(ctx, req); code(err) != lease.CodeCorrupt {
		t.Fatalf("replay: %v %+v, want corrupt", err, r.Lease)
	}
}

// Accepted-commit evidence of identity B copied under identity A's commit
// scope (same sink, same commit id) has B's digest (which covers the lock
// key): A's commit with that id is an idempotency conflict, not a replay
// of B's authorization, also ReplayOnly.
func TestScopeHeldForeignCommitEvidenceConflicts(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	a := scopeAcquire(t, s, "tenant-a", "program-a", "target-a", "prn-a", "req-a")
	b := scopeAcquire(t, s, "tenant-b", "program-b", "target-b", "prn-b", "req-b")
	commit := func(l *lease.Record, replayOnly bool) (lease.CommitResult, error) {
		return s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
			ServiceInstanceID: l.ServiceInstanceID, Sink: "couchdb", CommitID: "commit-1", ExecutionID: l.ExecutionID,
			JobID: l.JobID, Target: "doc-1", PayloadSHA256: "", DeadlineAt: time.Now().Add(time.Minute), Caller: callerOfRecord(l),
			ReplayOnly: replayOnly})
	}
	if _, err := commit(b, false); err != nil {
		t.Fatal(err)
	}
	scope := func(l *lease.Record) []byte {
		_, p, err := lease.PrepareCommit(lease.CommitRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
			ServiceInstanceID: l.ServiceInstanceID, Sink: "couchdb", CommitID: "commit-1", ExecutionID: l.ExecutionID, JobID: l.JobID,
			Target: "doc-1", DeadlineAt: time.Now().Add(time.Minute), Caller: callerOfRecord(l)}, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		return []byte(p.Scope)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketCommits)
		return c.Put(scope(a), bytes.Clone(c.Get(scope(b))))
	}); err != nil {
		t.Fatal(err)
	}
	for _, replayOnly := range []bool{true, false} {
		if r, err := commit(a, replayOnly); code(err) != lease.CodeIdempotencyConflict {
			t.Fatalf("commit of a (replay only %v): %v %+v, want idempotency conflict", replayOnly, err, r.Commit)
		}
	}
}

// A lease-id lookup that names another identity (damage) finds nothing:
// that identity's active record and history hold no lease of that id.
func TestScopeHeldLookupNamingAnotherIdentity(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	a := scopeCycle(t, s, "tenant-a", "target-a", "prn-a", "req-a")
	b := scopeAcquire(t, s, "tenant-b", "program-a", "target-b", "prn-b", "req-b")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		return direct(tx, func(tx *layered.View) error { return putLeaseState(tx, a.LeaseID, b.LockKey, lease.StateReleased, 1) })
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: a.LeaseID, DeadlineAt: time.Now().Add(time.Minute)}); code(err) != lease.CodeNotFound {
		t.Fatalf("inspect by id: %v %+v, want not found", err, r.Lease)
	}
}
