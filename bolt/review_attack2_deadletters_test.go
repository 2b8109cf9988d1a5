package bolt

import (
	"context"
	"encoding/json"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// A damaged dead letter of ANOTHER message id (its bytes start with that
// id, lease.DeadLetterID reads it, the listing names it so) whose client-
// chosen headers hold "message_id": X is taken by findDeadLetter as X's:
// the needle `"message_id":"X"` is matched in the header map (a header
// named message_id is a valid header), the value does not decode, and it
// is returned as X's, its MessageID overwritten with X. So X's intact
// dead letter cannot be requeued ("damaged; discard it"), and a discard of
// X removes the other id's dead letter and reports it as X's.
func TestAttack2DamagedLetterOfAnotherIDTakenByItsHeader(t *testing.T) {
	ctx := context.Background()
	s, entry := deadLetterStore(t)
	if err := s.OutboxDeadLetter(ctx, entry.MessageID, "poison"); err != nil {
		t.Fatal(err)
	}
	other := entry
	other.MessageID = "msg_other"
	other.Message.Headers = map[string]string{"message_id": entry.MessageID}
	b, err := json.Marshal(lease.DeadLetter{Entry: other, Reason: "other's", DeadAt: other.AcceptedAt})
	if err != nil {
		t.Fatal(err)
	}
	torn := b[:len(b)-1] // its last byte lost: damaged, still naming msg_other
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketOutboxDead).Put(u64(0), torn) // older than X's
	}); err != nil {
		t.Fatal(err)
	}
	listed, err := s.OutboxDeadLetters(ctx, 0)
	if err != nil || len(listed) != 2 || listed[0].Entry.MessageID != "msg_other" || listed[0].Damaged == "" {
		t.Fatalf("listed %+v, %v", listed, err)
	}
	if _, err := s.OutboxRequeueDeadLetter(ctx, entry.MessageID); err != nil {
		t.Errorf("requeue of %s (its dead letter intact) refused because msg_other's damaged one names it in a header: %v", entry.MessageID, err)
		d, err := s.OutboxDiscardDeadLetter(ctx, entry.MessageID)
		listed, _ := s.OutboxDeadLetters(ctx, 0)
		if err == nil && len(listed) == 1 && listed[0].Entry.MessageID == entry.MessageID {
			t.Errorf("discard of %s removed msg_other's dead letter (answered %+v) and left %s's", entry.MessageID, d, entry.MessageID)
		}
	}
}

// A damaged dead letter that names no message id (its first bytes are
// lost) is listed with message_id "" and can never be discarded: discard
// needs an opaque id, and findDeadLetter matches none. It holds a place
// below lease.MaxOutboxDeadLetters for good, which is what the damaged
// listing was to end.
func TestAttack2DamagedLetterNamingNoIDCannotBeDiscarded(t *testing.T) {
	ctx := context.Background()
	s, _ := deadLetterStore(t)
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketOutboxDead).Put(u64(7), []byte(`\x00ntry":{"message_id":`))
	}); err != nil {
		t.Fatal(err)
	}
	listed, err := s.OutboxDeadLetters(ctx, 0)
	if err != nil || len(listed) != 1 {
		t.Fatalf("listed %+v %v", listed, err)
	}
	if _, err := s.OutboxDiscardDeadLetter(ctx, listed[0].Entry.MessageID); err != nil {
		n, _ := s.OutboxDeadLen(ctx)
		t.Errorf("listed damaged dead letter %+v cannot be discarded by what the listing names (%v); %d dead letters stay counted", listed[0], err, n)
	}
}
