package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// deadLetterStore is a store holding one pending publication, whose entry
// it returns.
func deadLetterStore(t *testing.T) (*Store, lease.OutboxEntry) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "starlease.db"), Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
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
	pending, err := s.OutboxPending(ctx, 10)
	if err != nil || len(pending) != 1 {
		t.Fatalf("pending %v, %v", pending, err)
	}
	return s, pending[0]
}

// TestDeadLetterBoundClearedByDiscard: with lease.MaxOutboxDeadLetters
// held a poison entry stays pending; discarding one dead letter (the
// newest, the last the walk finds) lets the relay set it aside, and the
// operator can requeue it.
func TestDeadLetterBoundClearedByDiscard(t *testing.T) {
	ctx := context.Background()
	s, entry := deadLetterStore(t)
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		dead := tx.Bucket(bucketOutboxDead)
		for i := range lease.MaxOutboxDeadLetters {
			other := entry
			other.MessageID = fmt.Sprintf("msg_old_%05d", i)
			b, err := json.Marshal(lease.DeadLetter{Entry: other, Reason: "old", DeadAt: lease.At(time.Now())})
			if err != nil {
				return err
			}
			if err := dead.Put(u64(uint64(i+1)), b); err != nil {
				return err
			}
		}
		return dead.SetSequence(lease.MaxOutboxDeadLetters) // as NextSequence would have left it
	}); err != nil {
		t.Fatal(err)
	}
	if le := lease.AsError(s.OutboxDeadLetter(ctx, entry.MessageID, "poison")); le.Code != lease.CodeBackendUnavailable {
		t.Fatalf("dead-lettering past the bound: %+v", le)
	}
	last := fmt.Sprintf("msg_old_%05d", lease.MaxOutboxDeadLetters-1)
	d, err := s.OutboxDiscardDeadLetter(ctx, last)
	if err != nil || d.Entry.MessageID != last || d.Reason != "old" {
		t.Fatalf("discard: %+v, %v", d, err)
	}
	if err := s.OutboxDeadLetter(ctx, entry.MessageID, "poison"); err != nil {
		t.Fatalf("dead-lettering with room: %v", err)
	}
	if n, err := s.OutboxDeadLen(ctx); err != nil || n != lease.MaxOutboxDeadLetters {
		t.Fatalf("dead letters %d, %v", n, err)
	}
	back, err := s.OutboxRequeueDeadLetter(ctx, entry.MessageID)
	if err != nil || back.Entry.MessageID != entry.MessageID || back.Reason != "poison" {
		t.Fatalf("requeue: %+v, %v", back, err)
	}
	if p, err := s.OutboxPending(ctx, 10); err != nil || len(p) != 1 || p[0].MessageID != entry.MessageID || p[0].AcceptedAt != entry.AcceptedAt {
		t.Fatalf("pending after requeue %+v, %v", p, err)
	}
	if u, err := s.OutboxUsage(ctx); err != nil || u.Pending != 1 || u.Bytes != entry.Message.Size() {
		t.Fatalf("usage after requeue %+v, %v", u, err)
	}
}

// TestRequeueRefusedWhileTheSameIDIsPending: the same publication
// accepted again (its commit evidence expired while it lay dead) is
// pending under the dead letter's id; a requeue would publish it twice and
// a removal of one would remove both, so it is refused and nothing
// changes. Discarding the dead letter leaves the pending entry alone.
func TestRequeueRefusedWhileTheSameIDIsPending(t *testing.T) {
	ctx := context.Background()
	s, entry := deadLetterStore(t)
	if err := s.OutboxDeadLetter(ctx, entry.MessageID, "poison"); err != nil {
		t.Fatal(err)
	}
	again := entry
	again.AcceptedAt = lease.At(time.Now().Add(time.Second))
	if _, err := change(s, ctx, func(tx *layered.View) (struct{}, error) { return struct{}{}, putOutbox(tx, again) }); err != nil {
		t.Fatal(err)
	}
	_, err := s.OutboxRequeueDeadLetter(ctx, entry.MessageID)
	if le := lease.AsError(err); le.Code != lease.CodeInvalidRequest || le.Reason != lease.DeadLetterPending().Reason {
		t.Fatalf("requeue over a pending entry of the same id: %v", err)
	}
	p, err := s.OutboxPending(ctx, 10)
	if err != nil || len(p) != 1 || p[0].AcceptedAt != again.AcceptedAt {
		t.Fatalf("pending %+v, %v", p, err)
	}
	if n, err := s.OutboxDeadLen(ctx); err != nil || n != 1 {
		t.Fatalf("dead letters %d, %v", n, err)
	}
	if _, err := s.OutboxDiscardDeadLetter(ctx, entry.MessageID); err != nil {
		t.Fatal(err)
	}
	if p, err := s.OutboxPending(ctx, 10); err != nil || len(p) != 1 || p[0].AcceptedAt != again.AcceptedAt {
		t.Fatalf("pending after the discard %+v, %v", p, err)
	}
	if u, err := s.OutboxUsage(ctx); err != nil || u.Pending != 1 || u.Bytes != entry.Message.Size() {
		t.Fatalf("usage %+v, %v", u, err)
	}
}

// TestDamagedDeadLetterIsListedAndDiscarded: a damaged dead letter whose
// bytes still name its id is listed as damaged rather than failing the
// listing, is never requeued (nothing of it can be trusted), and can be
// discarded, freeing its place below the bound.
func TestDamagedDeadLetterIsListedAndDiscarded(t *testing.T) {
	ctx := context.Background()
	s, entry := deadLetterStore(t)
	if err := s.OutboxDeadLetter(ctx, entry.MessageID, "poison"); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		dead := tx.Bucket(bucketOutboxDead)
		if err := dead.Put(u64(1), []byte(`{"entry":{"message_id":"`+entry.MessageID+`",`)); err != nil {
			return err
		}
		// Garbage naming nothing, newer: listed by its key's name, never
		// taken for another's.
		if err := dead.Put(u64(2), []byte("\x00garbage")); err != nil {
			return err
		}
		return dead.SetSequence(2)
	}); err != nil {
		t.Fatal(err)
	}
	listed, err := s.OutboxDeadLetters(ctx, 0)
	if err != nil || len(listed) != 2 || listed[0].Damaged != lease.DeadLetterCorrupt || listed[0].Entry.MessageID != entry.MessageID ||
		listed[1].Damaged != lease.DeadLetterCorrupt || listed[1].Entry.MessageID != lease.DamagedDeadLetterID("0000000000000002") {
		t.Fatalf("listed %+v, %v", listed, err)
	}
	_, err = s.OutboxRequeueDeadLetter(ctx, entry.MessageID)
	if le := lease.AsError(err); le.Code != lease.CodeCorrupt {
		t.Fatalf("requeue of a damaged dead letter: %v", err)
	}
	if p, err := s.OutboxPending(ctx, 10); err != nil || len(p) != 0 {
		t.Fatalf("pending %+v, %v", p, err)
	}
	d, err := s.OutboxDiscardDeadLetter(ctx, entry.MessageID)
	if err != nil || d.Damaged != lease.DeadLetterCorrupt || d.Entry.MessageID != entry.MessageID {
		t.Fatalf("discard of a damaged dead letter: %+v, %v", d, err)
	}
	if n, err := s.OutboxDeadLen(ctx); err != nil || n != 1 {
		t.Fatalf("dead letters %d, %v", n, err)
	}
	if _, err := s.OutboxDiscardDeadLetter(ctx, entry.MessageID); lease.AsError(err).Code != lease.CodeNotFound {
		t.Fatalf("a second discard: %v", err)
	}
	// The one naming nothing, by the name the listing gave it.
	garbage := listed[1].Entry.MessageID
	if _, err := s.OutboxRequeueDeadLetter(ctx, garbage); lease.AsError(err).Code != lease.CodeCorrupt {
		t.Fatalf("requeue of garbage: %v", err)
	}
	if d, err := s.OutboxDiscardDeadLetter(ctx, garbage); err != nil || d.Entry.MessageID != garbage || d.Damaged == "" {
		t.Fatalf("discard of garbage: %+v, %v", d, err)
	}
	if n, err := s.OutboxDeadLen(ctx); err != nil || n != 0 {
		t.Fatalf("dead letters %d, %v", n, err)
	}
	// A name of a key that holds nothing, or an intact dead letter, is
	// not found: the name reaches only what stays damaged.
	for _, name := range []string{lease.DamagedDeadLetterID("0000000000000002"), lease.DamagedDeadLetterID("zz")} {
		if _, err := s.OutboxDiscardDeadLetter(ctx, name); lease.AsError(err).Code != lease.CodeNotFound {
			t.Fatalf("discard of %s: %v", name, err)
		}
	}
}

// TestRequeueRefusesAnEntryTheRelayWouldRefuse: a dead letter that decodes
// but whose entry the relay's strict read of the pending outbox would
// refuse (here its lock key no longer the identity's) is not requeued:
// made pending, it would fail the relay's reads closed.
func TestRequeueRefusesAnEntryTheRelayWouldRefuse(t *testing.T) {
	ctx := context.Background()
	s, entry := deadLetterStore(t)
	if err := s.OutboxDeadLetter(ctx, entry.MessageID, "poison"); err != nil {
		t.Fatal(err)
	}
	bad := entry
	bad.LockKey = "not the identity's"
	b, err := json.Marshal(lease.DeadLetter{Entry: bad, Reason: "poison", DeadAt: entry.AcceptedAt})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketOutboxDead).Put(u64(1), b) }); err != nil {
		t.Fatal(err)
	}
	_, err = s.OutboxRequeueDeadLetter(ctx, entry.MessageID)
	if le := lease.AsError(err); le.Code != lease.CodeCorrupt {
		t.Fatalf("requeue of an entry the relay would refuse: %v", err)
	}
	if p, err := s.OutboxPending(ctx, 10); err != nil || len(p) != 0 {
		t.Fatalf("pending %+v, %v", p, err)
	}
	if d, err := s.OutboxDiscardDeadLetter(ctx, entry.MessageID); err != nil || d.Entry.LockKey != bad.LockKey {
		t.Fatalf("discard: %+v, %v", d, err)
	}
}

// TestDeadLetterNamingTwoIDsIsDamaged: a value whose start names one
// message id but which decodes to another (a second message_id member) is
// damaged, named by the first; it is never requeued as the other's.
func TestDeadLetterNamingTwoIDsIsDamaged(t *testing.T) {
	ctx := context.Background()
	s, entry := deadLetterStore(t)
	if err := s.OutboxDeadLetter(ctx, entry.MessageID, "poison"); err != nil {
		t.Fatal(err)
	}
	other := entry
	other.MessageID = "msg_other"
	b, err := json.Marshal(lease.DeadLetter{Entry: other, Reason: "poison", DeadAt: entry.AcceptedAt})
	if err != nil {
		t.Fatal(err)
	}
	raw := bytes.Replace(b, []byte(`{"entry":{"message_id":"msg_other"`), []byte(`{"entry":{"message_id":"`+entry.MessageID+`","message_id":"msg_other"`), 1)
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketOutboxDead).Put(u64(1), raw) }); err != nil {
		t.Fatal(err)
	}
	listed, err := s.OutboxDeadLetters(ctx, 0)
	if err != nil || len(listed) != 1 || listed[0].Entry.MessageID != entry.MessageID || listed[0].Damaged != lease.DeadLetterCorrupt {
		t.Fatalf("listed %+v, %v", listed, err)
	}
	if _, err := s.OutboxRequeueDeadLetter(ctx, "msg_other"); lease.AsError(err).Code != lease.CodeNotFound {
		t.Fatalf("requeue by the decoded id: %v", err)
	}
	if _, err := s.OutboxRequeueDeadLetter(ctx, entry.MessageID); lease.AsError(err).Code != lease.CodeCorrupt {
		t.Fatalf("requeue by the id at its start: %v", err)
	}
	if p, err := s.OutboxPending(ctx, 10); err != nil || len(p) != 0 {
		t.Fatalf("pending %+v, %v", p, err)
	}
}
