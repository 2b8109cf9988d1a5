package valkey

import (
	"bytes"
	"testing"

	"github.com/starintel/starlease/lease"
)

// TestOutboxBackupRestoreKeepsSequenceAndDeadLetters: a backup carries the
// outbox's sequence counter (ns:outbox_seq), its byte counter
// (ns:outbox:bytes) and its dead letters (ns:outbox_dead,
// ns:outbox_dead:<id>, ns:outbox_dead_entry:<id>), and a restore accepts
// them: the restored outbox
// holds the same pending entries in the same order, the same dead letter
// with its reason, the same sequence, so later publications sort after
// the restored ones, and the same usage.
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
		req.Outbox = &lease.OutboxMessage{RoutingKey: "q", Body: []byte{byte('a' + i)}, Headers: map[string]string{"x-i": "é"}}
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
		dead[0].DeadAt.IsZero() || dead[0].Damaged != "" || string(dead[0].Entry.Message.Body) != "a" {
		t.Fatalf("restored dead letters %+v %v", dead, err)
	}
	if n, err := dst.OutboxDeadLen(bg); err != nil || n != 1 {
		t.Fatalf("restored dead letter count %d %v", n, err)
	}
	want := lease.OutboxUsage{Pending: 2, Bytes: 2 * (1 + 3 + 2), MaxPending: src.opts.OutboxMaxPending, MaxBytes: src.opts.OutboxMaxBytes}
	for name, s := range map[string]*Store{"backed up": src, "restored": dst} {
		if u, err := s.OutboxUsage(bg); err != nil || u != want {
			t.Fatalf("%s outbox usage %+v %v, want %+v", name, u, err, want)
		}
	}
	if _, ok := get(t, dst, dst.keys.outboxBytes()); !ok {
		t.Fatal("the restore did not carry the byte counter")
	}
}

// TestOutboxBytesRecountedForOlderNamespace: a namespace whose pending
// outbox was written before the byte counter existed (here: the counter
// deleted) gets it counted when a store opens on it, from the entries
// themselves; an existing counter is left alone.
func TestOutboxBytesRecountedForOlderNamespace(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{})
	held, err := src.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for i, m := range []lease.OutboxMessage{
		{RoutingKey: "q", Body: []byte("x")},
		{RoutingKey: "q", Body: []byte("yz"), Headers: map[string]string{"x-a": "a\tb \"é\" <&> \u2028"}},
		{RoutingKey: "q"},
		{RoutingKey: "q", Body: bytes.Repeat([]byte{0xff}, lease.MaxOutboxBody)},
	} {
		req := commitReq(held.Lease)
		req.Target, req.Outbox = "", &m
		if _, err := src.AuthorizeCommit(bg, req); err != nil {
			t.Fatalf("publication %d: %v", i, err)
		}
		want += m.Size()
	}
	if err := src.client.Do(bg, src.client.B().Del().Key(src.keys.outboxBytes()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if u, err := src.OutboxUsage(bg); err != nil || u.Pending != 4 || u.Bytes != 0 {
		t.Fatalf("usage without the counter %+v %v", u, err)
	}
	again := open(t, r, Options{KeyPrefix: src.keys.ns})
	if u, err := again.OutboxUsage(bg); err != nil || u.Pending != 4 || u.Bytes != want {
		t.Fatalf("usage after reopening %+v %v, want 4 entries of %d bytes", u, err, want)
	}
	// An existing counter is the truth kept by every append and removal:
	// opening again does not count.
	if err := again.client.Do(bg, again.client.B().Set().Key(again.keys.outboxBytes()).Value("7").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	third := open(t, r, Options{KeyPrefix: src.keys.ns})
	if u, err := third.OutboxUsage(bg); err != nil || u.Bytes != 7 {
		t.Fatalf("usage after opening with a counter %+v %v", u, err)
	}
}
