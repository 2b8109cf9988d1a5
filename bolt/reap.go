package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"time"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// reapSlice bounds the work of one reaper transaction, which writers may
// share (group commit), so none waits long behind it. A writer's pair can
// wait behind two slices, and a slice's pages are now 16 KiB: at 32 the
// longest pair while 10,000 leases expired was 20–41 ms with two of 13
// runs at 77–79 ms (a slow disk moment behind two slices); at 16 it was
// 14–41 ms in 8 runs, at the same 7–50k expiries/s. (With 4 KiB pages,
// 32 measured no pair over 25 ms and 128 pairs of up to 70 ms.) A pass
// runs slices until nothing is due.
const reapSlice = 16

// reapFreezeEvery is how many slices that consumed entries a pass runs
// between asks for a flush (engine.askFlush): otherwise the tree takes
// everything a pass archived in one flush interval (100 ms, hundreds of
// archives) in one commit, whose writes slow the redo-log fsyncs of the
// writes beside it. While 10,000 leases expired, a writer's longest pair
// was 36–61 ms without (5 runs) and 19–35 ms at 4 slices (27–39 ms at
// 12). Before each ask the pass waits until the tree holds what it wrote
// before its last one (engine.awaitFlushed): flush takes every frozen
// layer at once, so a tree slower than the reaper would otherwise get
// the same large commits. Timing the writer from the first expiry, its
// longest pair was 20–53 ms (4 of 14 runs over 40) without the wait and
// 15–40 ms (9 runs) with it. The cost: a pass archives at most 64
// entries per flush, so it reaps only as fast as the tree commits (here
// 4,300–10,800 expiries/s beside one writer; with 20 ms added to every
// flush, about 2,400/s against 9,400/s without the wait). (With
// FlushInterval <= 0 every batch is flushed anyway.)
const reapFreezeEvery = 4

// reapPassBudget bounds one pass, so a huge backlog is worked off over
// several passes rather than in one that never ends.
const reapPassBudget = 20 * time.Second

// reap is storage reclamation, never a source of truth: every operation
// already treats an expired record as expired. It consumes the time
// indexes from their oldest end, in bounded slices: it archives expired
// active records (each conditional on the record its index entry names
// still being there and expired), and drops idempotency evidence,
// accepted-commit records and history past retention. Counters and
// high-water marks are never dropped.
func (s *Store) reap(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, reapPassBudget)
	defer cancel()
	// asked: the pass's last batch before its last ask, which wrote; the
	// slices since then served the ask.
	slices, asked := 0, 0
	for _, step := range []func(*layered.View) (int, error){s.expireSlice, s.dropSlice(bucketIdemExp, bucketIdent, isIdemKey), s.dropSlice(bucketCommitExp, bucketCommits, nil), s.retireHistorySlice} {
		for ctx.Err() == nil {
			var n, batch int
			if err := s.mutate(ctx, func(tx *layered.View) error {
				batch = tx.ID()
				var err error
				n, err = step(tx)
				return err
			}); err != nil {
				return err
			}
			if n > 0 {
				if slices++; slices%reapFreezeEvery == 0 {
					s.group.engine.awaitFlushed(ctx, asked)
					asked = 0
					if s.group.engine.askFlush() {
						asked = batch
					}
				}
			}
			if n < reapSlice {
				break
			}
		}
	}
	return nil
}

// expireSlice archives up to reapSlice active records whose expires_at
// passed, oldest first, and returns how many index entries it consumed.
func (s *Store) expireSlice(tx *layered.View) (int, error) {
	now := s.clock(tx).UnixMilli()
	due := dueKeys(tx.Bucket(bucketActiveExp), now)
	for _, k := range due {
		// The entry goes whatever the record says: a live or corrupt
		// record (or none) under it is not this entry's lease any more.
		if err := tx.Bucket(bucketActiveExp).Delete(k); err != nil {
			return 0, err
		}
		if len(k) != 8+packedLen {
			continue
		}
		lockKey := unpackLockKey(k[8:])
		v := tx.Bucket(bucketIdent).Get(activeKey(lockKey))
		if v == nil {
			continue
		}
		cur, err := lease.DecodeStoredRecord(v)
		if err != nil || cur.LockKey != lockKey || cur.LiveAt(lease.UnixMilli(now)) {
			continue
		}
		if !bytes.Equal(activeExpKey(cur), k) {
			continue // the record's own entry is another one
		}
		if err := s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
			return 0, err
		}
	}
	return len(due), nil
}

// dropSlice deletes, oldest first, up to reapSlice entries of data whose
// expiry index entry (expiry ms ‖ key) is due. In a bucket of several
// kinds, only a key ofKind accepts is deleted: a damaged index entry
// naming a fencing counter or an active record deletes only itself.
func (s *Store) dropSlice(index, data []byte, ofKind func([]byte) bool) func(*layered.View) (int, error) {
	return func(tx *layered.View) (int, error) {
		due := dueKeys(tx.Bucket(index), s.clock(tx).UnixMilli())
		for _, k := range due {
			if ofKind != nil && !ofKind(k[8:]) {
				lease.CorruptState(s.log, lease.Identity{}, "an expiry index entry names a key of another kind")
			} else if err := tx.Bucket(data).Delete(k[8:]); err != nil {
				return 0, err
			}
			if err := tx.Bucket(index).Delete(k); err != nil {
				return 0, err
			}
		}
		return len(due), nil
	}
}

// retireHistorySlice drops up to reapSlice history entries that ended
// before the retention cutoff, oldest first.
func (s *Store) retireHistorySlice(tx *layered.View) (int, error) {
	cutoff := s.clock(tx).UnixMilli() - s.opts.HistoryRetention.Milliseconds() - 1
	due := dueKeys(tx.Bucket(bucketHistoryExp), cutoff)
	for _, k := range due {
		if !isHistoryKey(k[8:]) {
			lease.CorruptState(s.log, lease.Identity{}, "a history retention entry names a key of another kind")
		} else if err := forgetHistory(tx, k[8:]); err != nil {
			return 0, err
		}
		// An entry that does not decode leaves its index entry to us.
		if err := tx.Bucket(bucketHistoryExp).Delete(k); err != nil {
			return 0, err
		}
	}
	return len(due), nil
}

// dueKeys returns up to reapSlice keys of a time index (ms ‖ …) due at
// atMs, oldest first.
func dueKeys(index *layered.Bucket, atMs int64) [][]byte {
	var due [][]byte
	c := index.Cursor()
	for k, _ := c.First(); k != nil && len(due) < reapSlice; k, _ = c.Next() {
		if len(k) < 8 || int64(binary.BigEndian.Uint64(k[:8])) > atMs {
			break
		}
		due = append(due, bytes.Clone(k))
	}
	return due
}

// expireIfCurrent is the delayed expiry cleanup of one lease: it archives
// the active record only if it still has this lease id and token and is
// expired at backend time, so a late cleanup never touches a successor.
func (s *Store) expireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	return s.mutate(ctx, func(tx *layered.View) error {
		now := s.clock(tx)
		cur, err := s.loadActive(tx, lockKey)
		if err != nil || cur == nil || cur.LeaseID != leaseID || cur.FencingToken != token || cur.LiveAt(now) {
			return nil
		}
		return s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{})
	})
}
