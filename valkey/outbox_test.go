package valkey

import (
	"bytes"
	"testing"

	"github.com/starintel/starlease/lease"
)

// TestOutboxBackupRestoreKeepsSequenceAndDeadLetters: a backup carries the
// outbox's sequence counter (ns:outbox_seq) and its dead letters
// (ns:outbox_dead, ns:outbox_dead:<id>), and a restore accepts them:
// the restored outbox holds the same pending entries in the same order, the
// same dead letter with its reason, and the same sequence, so later
// publications sort after the restored ones.
func TestOutboxBackupRestoreKeepsSequenceAndDeadLetters(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{})
	held, err := src.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 3; i++ {
		req := commitReq(held.Lease)
		req.Target = ""
		req.Outbox = &lease.OutboxMessage{RoutingKey: "q", Body: []byte{byte('a' + i)}}
		res, err := src.AuthorizeCommit(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Commit.Target)
	}
	if err := src.OutboxDeadLetter(bg, ids[0], "broker closed the channel on its publish: 404 NOT_FOUND"); err != nil {
		t.Fatal(err)
	}
	seq, _ := get(t, src, src.keys.outboxSeq())
	var backup bytes.Buffer
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	dst := open(t, r, Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: src.opts})
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	if got, _ := get(t, dst, dst.keys.outboxSeq()); got != seq || seq == "" {
		t.Fatalf("restored outbox sequence %q, want %q", got, seq)
	}
	pending, err := dst.OutboxPending(bg, 0)
	if err != nil || len(pending) != 2 || pending[0].MessageID != ids[1] || pending[1].MessageID != ids[2] {
		t.Fatalf("restored pending %+v %v, want %v", pending, err, ids[1:])
	}
	dead, err := dst.OutboxDeadLetters(bg, 0)
	if err != nil || len(dead) != 1 || dead[0].Entry.MessageID != ids[0] || dead[0].Reason != "broker closed the channel on its publish: 404 NOT_FOUND" ||
		dead[0].DeadAt.IsZero() {
		t.Fatalf("restored dead letters %+v %v", dead, err)
	}
	if n, err := dst.OutboxDeadLen(bg); err != nil || n != 1 {
		t.Fatalf("restored dead letter count %d %v", n, err)
	}
}
