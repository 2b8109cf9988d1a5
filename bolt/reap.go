package bolt

import (
	"bytes"
	"context"
	"encoding/binary"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// reapBatch bounds the work of one reaper transaction so it never holds the
// writer long.
const reapBatch = 512

// reap is storage reclamation, never a source of truth: every operation
// already treats an expired record as expired. It archives expired active
// records (each conditional on its lease id and token), and drops
// idempotency evidence, accepted-commit records and history past retention.
// Counters and high-water marks are never dropped.
func (s *Store) reap(ctx context.Context) error {
	type stale struct {
		key, leaseID string
		token        uint64
	}
	var expired []stale
	if err := s.view(ctx, func(tx *bbolt.Tx) error {
		now := s.clock(tx)
		expired = expired[:0]
		return tx.Bucket(bucketActive).ForEach(func(k, v []byte) error {
			if len(expired) == reapBatch {
				return nil
			}
			if rec, err := lease.DecodeRecord(v); err == nil && !rec.LiveAt(now) {
				expired = append(expired, stale{string(k), rec.LeaseID, rec.FencingToken})
			}
			return nil
		})
	}); err != nil {
		return err
	}
	for _, e := range expired {
		if err := s.expireIfCurrent(ctx, e.key, e.leaseID, e.token); err != nil {
			return err
		}
	}
	return s.mutate(ctx, func(tx *bbolt.Tx) error {
		now := s.clock(tx).UnixMilli()
		if err := dropExpired(tx, bucketIdemExp, bucketIdem, now); err != nil {
			return err
		}
		if err := dropExpired(tx, bucketCommitExp, bucketCommits, now); err != nil {
			return err
		}
		cutoff := now - s.opts.HistoryRetention.Milliseconds()
		var old [][]byte
		c := tx.Bucket(bucketHistory).Cursor()
		for k, v := c.First(); k != nil && len(old) < reapBatch; k, v = c.Next() {
			if h, err := lease.DecodeHistoryEntry(v); err == nil && h.EndedAt.UnixMilli() < cutoff {
				old = append(old, bytes.Clone(k))
			}
		}
		for _, k := range old {
			if err := forgetHistory(tx, k); err != nil {
				return err
			}
		}
		return nil
	})
}

// dropExpired deletes, oldest first, entries of data whose expiry index
// entry (expiry ms ‖ key) is due.
func dropExpired(tx *bbolt.Tx, index, data []byte, now int64) error {
	var due [][]byte
	c := tx.Bucket(index).Cursor()
	for k, _ := c.First(); k != nil && len(due) < reapBatch; k, _ = c.Next() {
		if int64(binary.BigEndian.Uint64(k[:8])) > now {
			break
		}
		due = append(due, bytes.Clone(k))
	}
	for _, k := range due {
		if err := tx.Bucket(data).Delete(k[8:]); err != nil {
			return err
		}
		if err := tx.Bucket(index).Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// expireIfCurrent is the delayed expiry cleanup of one lease: it archives
// the active record only if it still has this lease id and token and is
// expired at backend time, so a late cleanup never touches a successor.
func (s *Store) expireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	return s.mutate(ctx, func(tx *bbolt.Tx) error {
		now := s.clock(tx)
		cur, err := s.loadActive(tx, lockKey)
		if err != nil || cur == nil || cur.LeaseID != leaseID || cur.FencingToken != token || cur.LiveAt(now) {
			return nil
		}
		return s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{})
	})
}
