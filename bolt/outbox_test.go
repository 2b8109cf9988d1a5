package bolt

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// TestOutboxUsageCountedForOlderFile: a store file whose pending outbox
// was written before the usage counters existed (here: the counters
// deleted) gets them counted from the entries when it opens; a file with
// counters keeps them.
func TestOutboxUsageCountedForOlderFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Minute)
	a, err := s.Acquire(ctx, acquireReq("req-1", 30*time.Second, far))
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for i, m := range []lease.OutboxMessage{
		{RoutingKey: "q", Body: []byte("x")},
		{RoutingKey: "q", Body: []byte("yz"), Headers: map[string]string{"x-a": "a\tb é"}},
		{RoutingKey: "q"},
		{RoutingKey: "q", Body: bytes.Repeat([]byte{0xff}, lease.MaxOutboxBody)},
	} {
		_, err := s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: testIdentity, LeaseID: a.Lease.LeaseID,
			FencingToken: a.Lease.FencingToken, ServiceInstanceID: "instance-1", Sink: "rabbitmq",
			CommitID: "commit-" + string(rune('a'+i)), ExecutionID: "execution-1", JobID: "job-1", Outbox: &m,
			DeadlineAt: far, Caller: lease.Caller{PrincipalID: "prn-actor"}})
		if err != nil {
			t.Fatalf("publication %d: %v", i, err)
		}
		want += m.Size()
	}
	usage := func(s *Store) lease.OutboxUsage {
		t.Helper()
		u, err := s.OutboxUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	if u := usage(s); u.Pending != 4 || u.Bytes != want {
		t.Fatalf("usage %+v, want 4 entries of %d bytes", u, want)
	}
	edit := func(fn func(meta *bbolt.Bucket) error) {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bbolt.Tx) error { return fn(tx.Bucket(bucketMeta)) }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		if s, err = Open(path, Options{ReapInterval: -1}); err != nil {
			t.Fatal(err)
		}
	}
	edit(func(meta *bbolt.Bucket) error {
		if err := meta.Delete(keyOutboxPending); err != nil {
			return err
		}
		return meta.Delete(keyOutboxBytes)
	})
	if u := usage(s); u.Pending != 4 || u.Bytes != want {
		t.Fatalf("usage counted at open %+v, want 4 entries of %d bytes", u, want)
	}
	// Existing counters are kept by every append and removal: opening
	// does not count again.
	edit(func(meta *bbolt.Bucket) error { return meta.Put(keyOutboxBytes, u64(7)) })
	if u := usage(s); u.Pending != 4 || u.Bytes != 7 {
		t.Fatalf("usage after opening with counters %+v", u)
	}
	s.Close()
}

// With lease.MaxOutboxDeadLetters held, OutboxDeadLetter refuses with
// backend_unavailable (the documented answer, retryable by the operator
// clearing them), not outcome_unknown, and the entry stays pending.
func TestOutboxDeadLettersFullRefuses(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "starlease.db"), Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	far := time.Now().Add(time.Minute)
	a, err := s.Acquire(ctx, acquireReq("req-1", 30*time.Second, far))
	if err != nil {
		t.Fatal(err)
	}
	m := lease.OutboxMessage{RoutingKey: "q", Body: []byte("x")}
	if _, err := s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: testIdentity, LeaseID: a.Lease.LeaseID,
		FencingToken: a.Lease.FencingToken, ServiceInstanceID: "instance-1", Sink: "rabbitmq", CommitID: "commit-a",
		ExecutionID: "execution-1", JobID: "job-1", Outbox: &m, DeadlineAt: far, Caller: lease.Caller{PrincipalID: "prn-actor"}}); err != nil {
		t.Fatal(err)
	}
	// The dead letters at their bound, written directly (one transaction
	// rather than ten thousand).
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		dead := tx.Bucket(bucketOutboxDead)
		for i := range lease.MaxOutboxDeadLetters {
			if err := dead.Put(u64(uint64(i+1)), []byte("{}")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pending, err := s.OutboxPending(ctx, 10)
	if err != nil || len(pending) != 1 {
		t.Fatalf("pending %v, %v", pending, err)
	}
	err = s.OutboxDeadLetter(ctx, pending[0].MessageID, "poison")
	if le := lease.AsError(err); le.Code != lease.CodeBackendUnavailable || !strings.Contains(le.Reason, "dead letters") {
		t.Fatalf("dead-lettering past the bound: %v, want backend_unavailable", err)
	}
	if after, err := s.OutboxPending(ctx, 10); err != nil || len(after) != 1 || after[0].MessageID != pending[0].MessageID {
		t.Fatalf("the entry did not stay pending: %v, %v", after, err)
	}
	if n, err := s.OutboxDeadLen(ctx); err != nil || n != lease.MaxOutboxDeadLetters {
		t.Fatalf("dead letters %d, %v", n, err)
	}
}
