package bolt

import (
	"context"
	"encoding/json"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

var (
	_ lease.Outbox            = (*Store)(nil)
	_ lease.OutboxDeadLetters = (*Store)(nil)
)

// putOutbox appends an accepted publication to the fenced outbox, in the
// commit's transaction.
func putOutbox(tx *bbolt.Tx, e lease.OutboxEntry) error {
	b, err := lease.EncodeOutboxEntry(e)
	if err != nil {
		return err
	}
	box := tx.Bucket(bucketOutbox)
	seq, err := box.NextSequence()
	if err != nil {
		return err
	}
	if err := box.Put(u64(seq), b); err != nil {
		return err
	}
	return tx.Bucket(bucketOutboxIDs).Put([]byte(e.MessageID), u64(seq))
}

// OutboxPending returns up to limit entries, oldest accepted first. A
// corrupt entry fails the call closed rather than being skipped.
func (s *Store) OutboxPending(ctx context.Context, limit int) ([]lease.OutboxEntry, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	var out []lease.OutboxEntry
	err := s.view(ctx, func(tx *bbolt.Tx) error {
		out = out[:0]
		c := tx.Bucket(bucketOutbox).Cursor()
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			e, err := lease.DecodeOutboxEntry(v)
			if err != nil {
				return s.quarantine(tx, "", lease.Identity{}, "outbox entry is corrupt")
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// OutboxDone removes an entry once the broker confirmed it.
func (s *Store) OutboxDone(ctx context.Context, messageID string) error {
	return s.mutate(ctx, func(tx *bbolt.Tx) error {
		ids := tx.Bucket(bucketOutboxIDs)
		seq := ids.Get([]byte(messageID))
		if seq == nil {
			return nil
		}
		if err := tx.Bucket(bucketOutbox).Delete(seq); err != nil {
			return err
		}
		return ids.Delete([]byte(messageID))
	})
}

// OutboxLen counts the pending entries (for the relay's backlog metric).
func (s *Store) OutboxLen(ctx context.Context) (int64, error) {
	var n int64
	err := s.view(ctx, func(tx *bbolt.Tx) error {
		n = int64(tx.Bucket(bucketOutbox).Stats().KeyN)
		return nil
	})
	return n, err
}

// OutboxDeadLetter moves a pending entry to the dead letters (bucket
// outbox_dead, in the order they were set aside), with its reason, in one
// transaction. Nothing is dropped: with MaxOutboxDeadLetters held it
// refuses and the entry stays pending.
func (s *Store) OutboxDeadLetter(ctx context.Context, messageID, reason string) error {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return err
	}
	return s.mutate(ctx, func(tx *bbolt.Tx) error {
		ids := tx.Bucket(bucketOutboxIDs)
		seq := ids.Get([]byte(messageID))
		if seq == nil {
			return nil
		}
		box, dead := tx.Bucket(bucketOutbox), tx.Bucket(bucketOutboxDead)
		raw := box.Get(seq)
		if raw == nil {
			return ids.Delete([]byte(messageID))
		}
		if dead.Stats().KeyN >= lease.MaxOutboxDeadLetters {
			return lease.Errorf(lease.CodeBackendUnavailable, "the outbox holds %d dead letters (the bound); an operator must clear them", lease.MaxOutboxDeadLetters)
		}
		e, err := lease.DecodeOutboxEntry(raw)
		if err != nil {
			return s.quarantine(tx, "", lease.Identity{}, "outbox entry is corrupt")
		}
		b, err := json.Marshal(lease.DeadLetter{Entry: e, Reason: lease.CutDeadLetterReason(reason), DeadAt: lease.At(s.now())})
		if err != nil {
			return err
		}
		dseq, err := dead.NextSequence()
		if err != nil {
			return err
		}
		if err := dead.Put(u64(dseq), b); err != nil {
			return err
		}
		if err := box.Delete(seq); err != nil {
			return err
		}
		return ids.Delete([]byte(messageID))
	})
}

// OutboxDeadLetters returns up to limit dead letters, oldest first.
func (s *Store) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	var out []lease.DeadLetter
	err := s.view(ctx, func(tx *bbolt.Tx) error {
		out = out[:0]
		c := tx.Bucket(bucketOutboxDead).Cursor()
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			var d lease.DeadLetter
			if err := json.Unmarshal(v, &d); err != nil {
				return &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox dead letter is corrupt; failing closed"}
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// OutboxDeadLen counts the dead letters.
func (s *Store) OutboxDeadLen(ctx context.Context) (int64, error) {
	var n int64
	err := s.view(ctx, func(tx *bbolt.Tx) error {
		n = int64(tx.Bucket(bucketOutboxDead).Stats().KeyN)
		return nil
	})
	return n, err
}
