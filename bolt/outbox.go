package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

var (
	_ lease.Outbox                = (*Store)(nil)
	_ lease.OutboxDeadLetterAdmin = (*Store)(nil)
	_ lease.OutboxMeter           = (*Store)(nil)
)

// The pending outbox's usage is kept in the meta bucket, updated in the
// same transaction as every entry that enters or leaves it, so the commit
// checks its bounds without walking the bucket.
var (
	keyOutboxPending = []byte("outbox_pending") // uint64: pending entries
	keyOutboxBytes   = []byte("outbox_bytes")   // uint64: their OutboxMessage.Size in all
)

// outboxUsage reads the pending outbox's counters.
func outboxUsage(tx *layered.View) (pending, bytes int64) {
	meta := tx.Bucket(bucketMeta)
	return metaCount(meta.Get(keyOutboxPending)), metaCount(meta.Get(keyOutboxBytes))
}

func metaCount(v []byte) int64 {
	if len(v) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

// addOutboxUsage moves the counters by dPending entries and dBytes bytes,
// never below zero.
func addOutboxUsage(tx *layered.View, dPending, dBytes int64) error {
	pending, bytes := outboxUsage(tx)
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keyOutboxPending, u64(uint64(max(pending+dPending, 0)))); err != nil {
		return err
	}
	return meta.Put(keyOutboxBytes, u64(uint64(max(bytes+dBytes, 0))))
}

// initOutboxUsage counts the pending outbox once, for a store file written
// before the counters existed (or with a malformed one); otherwise the
// counters are left as they are.
func initOutboxUsage(tx *layered.View) error {
	meta := tx.Bucket(bucketMeta)
	if len(meta.Get(keyOutboxPending)) == 8 && len(meta.Get(keyOutboxBytes)) == 8 {
		return nil
	}
	var pending, bytes int64
	c := tx.Bucket(bucketOutbox).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		pending++
		bytes += lease.OutboxEntrySize(v)
	}
	if err := meta.Put(keyOutboxPending, u64(uint64(pending))); err != nil {
		return err
	}
	return meta.Put(keyOutboxBytes, u64(uint64(bytes)))
}

// putOutbox appends an accepted publication to the fenced outbox, in the
// commit's transaction, after the commit checked its room (OutboxRoom).
func putOutbox(tx *layered.View, e lease.OutboxEntry) error {
	b, err := lease.EncodeOutboxEntry(e)
	if err != nil {
		return err
	}
	box, ids := tx.Bucket(bucketOutbox), tx.Bucket(bucketOutboxIDs)
	dPending, dBytes := int64(1), e.Message.Size()
	// A message id is pending already only if its commit's evidence
	// expired while the entry waited and the same commit id was accepted
	// again: the new entry replaces the old one, which would otherwise
	// stay in the outbox with no id pointing at it, never removed.
	if old := ids.Get([]byte(e.MessageID)); old != nil {
		if raw := box.Get(old); raw != nil && !lease.OutboxEntryOfAnother(raw, e.MessageID) {
			dPending, dBytes = 0, dBytes-lease.OutboxEntrySize(raw)
			if err := box.Delete(old); err != nil {
				return err
			}
		}
	}
	seq, err := box.NextSequence()
	if err != nil {
		return err
	}
	if err := box.Put(u64(seq), b); err != nil {
		return err
	}
	if err := ids.Put([]byte(e.MessageID), u64(seq)); err != nil {
		return err
	}
	return addOutboxUsage(tx, dPending, dBytes)
}

// OutboxPending returns up to limit entries, oldest accepted first. A
// corrupt entry fails the call closed rather than being skipped.
func (s *Store) OutboxPending(ctx context.Context, limit int) ([]lease.OutboxEntry, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	var out []lease.OutboxEntry
	err := s.view(ctx, func(tx *layered.View) error {
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
	return s.mutate(ctx, func(tx *layered.View) error {
		ids := tx.Bucket(bucketOutboxIDs)
		seq := ids.Get([]byte(messageID))
		if seq == nil {
			return nil
		}
		box := tx.Bucket(bucketOutbox)
		if raw := box.Get(seq); raw != nil && !lease.OutboxEntryOfAnother(raw, messageID) {
			if err := addOutboxUsage(tx, -1, -lease.OutboxEntrySize(raw)); err != nil {
				return err
			}
			if err := box.Delete(seq); err != nil {
				return err
			}
		}
		return ids.Delete([]byte(messageID))
	})
}

// OutboxLen counts the pending entries (for the relay's backlog metric).
func (s *Store) OutboxLen(ctx context.Context) (int64, error) {
	u, err := s.OutboxUsage(ctx)
	return u.Pending, err
}

// OutboxUsage reads the pending outbox's counters and bounds.
func (s *Store) OutboxUsage(ctx context.Context) (lease.OutboxUsage, error) {
	u := lease.OutboxUsage{MaxPending: s.opts.OutboxMaxPending, MaxBytes: s.opts.OutboxMaxBytes}
	err := s.view(ctx, func(tx *layered.View) error {
		u.Pending, u.Bytes = outboxUsage(tx)
		return nil
	})
	return u, err
}

// OutboxDeadLetter moves a pending entry to the dead letters (bucket
// outbox_dead, in the order they were set aside), with its reason, in one
// transaction. Nothing is dropped: with MaxOutboxDeadLetters held it
// refuses and the entry stays pending.
func (s *Store) OutboxDeadLetter(ctx context.Context, messageID, reason string) error {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return err
	}
	// A full dead-letter bucket is a typed refusal (backend_unavailable),
	// not a failed write: change commits the (empty) transaction and
	// returns it.
	_, err := change(s, ctx, func(tx *layered.View) (struct{}, error) {
		return struct{}{}, s.deadLetter(tx, messageID, reason)
	})
	return err
}

// deadLetter is OutboxDeadLetter's transaction.
func (s *Store) deadLetter(tx *layered.View, messageID, reason string) error {
	ids := tx.Bucket(bucketOutboxIDs)
	seq := ids.Get([]byte(messageID))
	if seq == nil {
		return nil
	}
	box, dead := tx.Bucket(bucketOutbox), tx.Bucket(bucketOutboxDead)
	raw := box.Get(seq)
	if raw == nil || lease.OutboxEntryOfAnother(raw, messageID) {
		return ids.Delete([]byte(messageID))
	}
	if keyN(dead) >= lease.MaxOutboxDeadLetters {
		return refuse(lease.DeadLettersFull())
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
	if err := addOutboxUsage(tx, -1, -e.Message.Size()); err != nil {
		return err
	}
	return ids.Delete([]byte(messageID))
}

// OutboxRequeueDeadLetter moves dead letter messageID back into the
// pending outbox, after every pending entry, in one transaction.
func (s *Store) OutboxRequeueDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	return s.takeDeadLetter(ctx, messageID, true)
}

// OutboxDiscardDeadLetter removes dead letter messageID, in one
// transaction.
func (s *Store) OutboxDiscardDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	return s.takeDeadLetter(ctx, messageID, false)
}

// takeDeadLetter removes dead letter messageID, and with requeue appends
// its entry to the pending outbox as a commit does (putOutbox), after the
// same room check. Every refusal comes before the first write.
func (s *Store) takeDeadLetter(ctx context.Context, messageID string, requeue bool) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	return change(s, ctx, func(tx *layered.View) (lease.DeadLetter, error) {
		dead := tx.Bucket(bucketOutboxDead)
		key, d := findDeadLetter(dead, messageID)
		if key == nil {
			return lease.DeadLetter{}, refuse(lease.NoDeadLetter())
		}
		if requeue {
			if err := lease.CheckRequeue(d); err != nil {
				return lease.DeadLetter{}, refuse(err)
			}
			if seq := tx.Bucket(bucketOutboxIDs).Get([]byte(messageID)); seq != nil {
				if raw := tx.Bucket(bucketOutbox).Get(seq); raw != nil && !lease.OutboxEntryOfAnother(raw, messageID) {
					return lease.DeadLetter{}, refuse(lease.DeadLetterPending())
				}
			}
			pending, used := outboxUsage(tx)
			if full := s.opts.OutboxRoom(pending, used, d.Entry.Message.Size()); full != nil {
				full.BackendTime = s.now()
				return lease.DeadLetter{}, refuse(full)
			}
			if err := putOutbox(tx, d.Entry); err != nil {
				return lease.DeadLetter{}, err
			}
		}
		return d, dead.Delete(key)
	})
}

// findDeadLetter is the oldest dead letter of messageID and its key (nil
// if there is none). It walks the dead letters, at most
// lease.MaxOutboxDeadLetters, decoding only those whose bytes hold the id;
// one that does not decode is messageID's only if it names messageID at
// its start (a header may spell "message_id" too), and is returned
// Damaged. A damaged one that names no id is found by the name the
// listing gives it (lease.DamagedDeadLetterID of its key).
func findDeadLetter(dead *layered.Bucket, messageID string) ([]byte, lease.DeadLetter) {
	if token, ok := lease.DamagedDeadLetterToken(messageID); ok {
		key, err := hex.DecodeString(token)
		if err != nil {
			return nil, lease.DeadLetter{}
		}
		if v := dead.Get(key); v != nil {
			if d := decodeDeadLetter(key, v); d.Entry.MessageID == messageID {
				return key, d
			}
		}
		return nil, lease.DeadLetter{}
	}
	// Opaque ids need no JSON escaping, and a quote inside a JSON string
	// is escaped: a value that lacks this cannot be messageID's.
	needle := []byte(`"message_id":"` + messageID + `"`)
	c := dead.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if !bytes.Contains(v, needle) {
			continue
		}
		if d := decodeDeadLetter(k, v); d.Entry.MessageID == messageID {
			return k, d
		}
	}
	return nil, lease.DeadLetter{}
}

// decodeDeadLetter is the dead letter stored at key (lease.DecodeDeadLetter:
// one that is damaged is named by the id at its start, else by its key).
func decodeDeadLetter(key, v []byte) lease.DeadLetter {
	return lease.DecodeDeadLetter(v, hex.EncodeToString(key))
}

// OutboxDeadLetters returns up to limit dead letters, oldest first.
func (s *Store) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	var out []lease.DeadLetter
	err := s.view(ctx, func(tx *layered.View) error {
		out = out[:0]
		c := tx.Bucket(bucketOutboxDead).Cursor()
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			// A damaged one is listed as such rather than failing the
			// listing: the operator must see it to discard it.
			out = append(out, decodeDeadLetter(k, v))
		}
		return nil
	})
	return out, err
}

// OutboxDeadLen counts the dead letters.
func (s *Store) OutboxDeadLen(ctx context.Context) (int64, error) {
	var n int64
	err := s.view(ctx, func(tx *layered.View) error {
		n = int64(keyN(tx.Bucket(bucketOutboxDead)))
		return nil
	})
	return n, err
}

// keyN counts a bucket's keys by walking them, as bbolt's Stats does by
// pages; the dead letters it counts are at most
// lease.MaxOutboxDeadLetters.
func keyN(b *layered.Bucket) int {
	n := 0
	_ = b.ForEach(func(k, v []byte) error { n++; return nil })
	return n
}
