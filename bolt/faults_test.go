package bolt

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
	bbolt "go.etcd.io/bbolt"
)

// faults reaches into the file to create states no client request can.
type faults struct{ s *Store }

func (f faults) Counter(ctx context.Context, lockKey string) (uint64, error) {
	var n uint64
	err := f.s.view(ctx, func(tx *layered.View) error {
		if v := tx.Bucket(bucketIdent).Get(counterKey(lockKey)); len(v) == 8 {
			n = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return n, err
}

func (f faults) SetCounter(ctx context.Context, lockKey string, value uint64) error {
	return f.s.mutate(ctx, func(tx *layered.View) error {
		return tx.Bucket(bucketIdent).Put(counterKey(lockKey), u64(value))
	})
}

func (f faults) PutRawActive(ctx context.Context, lockKey string, raw []byte) error {
	return f.s.mutate(ctx, func(tx *layered.View) error {
		return tx.Bucket(bucketIdent).Put(activeKey(lockKey), raw)
	})
}

func (f faults) ExpireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	return f.s.expireIfCurrent(ctx, lockKey, leaseID, token)
}

func openTemp(t testing.TB, o Options) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "starlease.db"), o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A malformed commit seq fails the commit closed as corrupt before it
// writes anything: no high-water mark raised, no evidence kept.
func TestMalformedCommitSeqFailsClosed(t *testing.T) {
	s := openTemp(t, Options{})
	ctx := context.Background()
	id := lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "web", TargetID: "seq.example",
		ActorName: "crawler"}
	res, err := s.Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: "i", TTL: time.Minute,
		MaximumLifetime: time.Hour, ExecutionID: "e", JobID: "j",
		Mutation: lease.Mutation{RequestID: "r", DeadlineAt: time.Now().Add(time.Minute), Caller: lease.Caller{
			PrincipalID: "p", ClientID: "c", CredentialID: "k"}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Lease
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketCommitSeq).Put([]byte(rec.LockKey), []byte("short"))
	}); err != nil {
		t.Fatal(err)
	}
	_, err = s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: id, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: "i", Sink: "couchdb", CommitID: "c-1", ExecutionID: "e", JobID: "j", Target: "doc-1",
		DeadlineAt: time.Now().Add(time.Minute), Caller: lease.Caller{PrincipalID: "p"}})
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("commit under a malformed commit seq: %v, want lease_corrupt", err)
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if k, _ := tx.Bucket(bucketHighWater).Cursor().First(); k != nil {
			t.Errorf("a high-water mark was raised: %q", k)
		}
		if k, _ := tx.Bucket(bucketCommits).Cursor().First(); k != nil {
			t.Errorf("commit evidence was kept: %q", k)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// SetOutboxBounds sets a fresh store's outbox bounds (leasetest.OutboxBounder).
func (f faults) SetOutboxBounds(maxPending, maxBytes int64) {
	f.s.opts.OutboxMaxPending, f.s.opts.OutboxMaxBytes = maxPending, maxBytes
}
