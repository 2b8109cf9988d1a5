package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// Adopted from a review that attacked the outbox command (each failed
// before its fix, except the redaction test, which held).

// One damaged dead letter on bolt (a torn value that still names its
// message id) leaves the operator no way out through the command the
// refusal names: `dead-letters` fails closed as a whole, and `discard
// --message-id` of that very id fails closed too, so the slot below the
// 10,000 bound is never freed and every other dead letter is unlistable.
// (Valkey's discard clears a corrupt dead letter: "that is how an
// operator clears it".)
func TestAttackCorruptBoltDeadLetterCannotBeCleared(t *testing.T) {
	dir := t.TempDir()
	ids := deadLettered(t, dir, 2)
	db, err := bbolt.Open(filepath.Join(dir, storeFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("outbox_dead"))
		k, v := b.Cursor().First()
		if !strings.Contains(string(v), ids[0]) {
			t.Fatalf("first dead letter %q", v)
		}
		return b.Put(k, v[:len(v)/2]) // torn
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	var listed printedDeadLetters
	runCLI(t, "outbox", "dead-letters", "--data-dir", dir).ok(t, &listed)
	if listed.Count != 2 || len(listed.DeadLetters) != 2 || listed.DeadLetters[0].MessageID != ids[0] ||
		listed.DeadLetters[0].Damaged != lease.DeadLetterCorrupt || listed.DeadLetters[1].Damaged != "" {
		t.Fatalf("listed %+v", listed)
	}
	if r := runCLI(t, "outbox", "requeue", "--data-dir", dir, "--message-id", ids[0], "--reason", "retry it"); r.envelope(t).Code != lease.CodeCorrupt {
		t.Fatalf("requeue of the damaged dead letter: exit %d: %s", r.code, r.stderr)
	}
	var discarded struct {
		DeadLetter deadLetterView `json:"dead_letter"`
	}
	runCLI(t, "outbox", "discard", "--data-dir", dir, "--message-id", ids[0], "--reason", "clear the damaged one").ok(t, &discarded)
	if discarded.DeadLetter.Damaged != lease.DeadLetterCorrupt || discarded.DeadLetter.MessageID != ids[0] {
		t.Fatalf("discarded %+v", discarded)
	}
	runCLI(t, "outbox", "dead-letters", "--data-dir", dir).ok(t, &listed)
	if listed.Count != 1 || listed.DeadLetters[0].MessageID != ids[1] {
		t.Fatalf("left %+v", listed)
	}
	events := outboxEvents(t, dir)
	if last := events[len(events)-1]; last.Decision != audit.DecisionAllow ||
		last.Reason != "dead letter "+ids[0]+" (corrupt) discarded: clear the damaged one" || last.LeaseID != "" {
		t.Fatalf("the discard's event %+v", last)
	}
}

// A reason holding credential-shaped text reaches the audit store
// redacted, never as written.
func TestAttackSecretShapedReasonIsRedacted(t *testing.T) {
	dir := t.TempDir()
	ids := deadLettered(t, dir, 1)
	secret := "star_sk_live_0123456789abcdefghij"
	hex := strings.Repeat("deadbeef", 8)
	r := runCLI(t, "outbox", "discard", "--data-dir", dir, "--message-id", ids[0], "--reason", "pasted "+secret+" and "+hex)
	if r.code != 0 {
		t.Fatalf("discard: %d %s", r.code, r.stderr)
	}
	for _, e := range outboxEvents(t, dir) {
		if strings.Contains(e.Reason, "0123456789abcdefghij") || strings.Contains(e.Reason, hex) {
			t.Fatalf("audit reason holds the secret: %q", e.Reason)
		}
	}
	if strings.Contains(r.stdout+r.stderr, "0123456789abcdefghij") {
		t.Fatalf("printed the secret: %s %s", r.stdout, r.stderr)
	}
}

// runOutbox writes the event of a refused or undecided requeue/discard
// "either way, so an outcome the command cannot tell still leaves a
// trace" -- but with the command's own context. The typical undecided
// outcome is the --timeout expiring mid-call (see the etcd starvation
// test), and then the event write on Valkey/etcd fails at once with the
// same expired context: no trace at all.
func TestAttackUndecidedOutcomeLeavesNoAuditTrace(t *testing.T) {
	r := testenv.StartRedis(t)
	bg := context.Background()
	vs, err := valkey.Open(bg, valkey.Options{Addr: r.Addr(), KeyPrefix: "attack", ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	sink := vs.AuditSink(valkey.AuditOptions{})
	ctx, cancel := context.WithTimeout(bg, time.Millisecond)
	defer cancel()
	<-ctx.Done() // the command's --timeout ran out during the requeue
	undecided := lease.AsError(lease.Errorf(lease.CodeOutcomeUnknown, "timed out"))
	// As runOutbox writes it: on a context of its own.
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer acancel()
	if err := writeOutboxEvent(actx, sink, audit.EventOutboxRequeue, lease.DeadLetter{}, "msg_x", "cured", undecided); err != nil {
		t.Fatalf("the undecided requeue's audit event was not written: %v", err)
	}
	stream, err := sink.Read(bg, audit.Filter{}, audit.MaxReadLimit)
	if err != nil || len(stream) != 1 || stream[0].Decision != audit.DecisionDeny ||
		stream[0].Reason != "dead letter msg_x maybe requeued (lease_outcome_unknown: the outcome is unknown; list the dead letters): cured" {
		t.Fatalf("stream %+v, %v", stream, err)
	}
}
