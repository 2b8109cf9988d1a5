package bolt

import (
	"context"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

var _ lease.Outbox = (*Store)(nil)

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
