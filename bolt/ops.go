package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// Acquire grants a lease if no unexpired active lease holds the identity.
func (s *Store) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	var written []byte
	res, err := s.mutation(ctx, p, req.DeadlineAt, func(tx *layered.View, now lease.Timestamp) (lease.Result, error) {
		written = nil
		cur, err := s.loadActive(tx, p.LockKey)
		if err != nil {
			return lease.Result{}, refuse(err)
		}
		if cur != nil && cur.LiveAt(now) {
			return lease.Result{}, refuse(lease.Conflict(now, cur.ExpiresAt))
		}
		// Every check that can refuse runs before the first write.
		ident := tx.Bucket(bucketIdent)
		counter, ok := counterAt(ident, counterKey(p.LockKey))
		if !ok {
			return lease.Result{}, refuse(s.quarantine(tx, p.LockKey, p.Identity, "fencing counter is malformed"))
		}
		// After a recovery epoch every identity, even one the backup did
		// not know, continues above the epoch's floor.
		floor, ok := counterFloor(tx)
		if !ok {
			return lease.Result{}, refuse(s.quarantine(tx, p.LockKey, p.Identity, "counter floor is malformed"))
		}
		counter = max(counter, floor)
		if counter >= lease.MaxFencingToken {
			return lease.Result{}, refuse(lease.CounterExhausted(s.log, p.Identity, now))
		}
		if cur != nil {
			if err := s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
				return lease.Result{}, err
			}
		}
		rec := lease.NewLease(req, p, now, counter+1)
		if err := ident.Put(counterKey(p.LockKey), u64(rec.FencingToken)); err != nil {
			return lease.Result{}, err
		}
		if written, err = s.putActive(tx, rec, nil); err != nil {
			return lease.Result{}, err
		}
		for _, k := range indexKeys(rec) {
			if err := tx.Bucket(bucketIndex).Put(k, nil); err != nil {
				return lease.Result{}, err
			}
		}
		if err := putLeaseState(tx, rec.LeaseID, p.LockKey, lease.StateActive, 0); err != nil {
			return lease.Result{}, err
		}
		return lease.Result{Code: lease.CodeAcquired, Lease: rec, BackendTime: now}, nil
	})
	s.warm(written, res, err)
	return res, err
}

// Renew extends the exact matching active lease.
func (s *Store) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRenew(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	var written []byte
	res, err := s.mutation(ctx, p, req.DeadlineAt, func(tx *layered.View, now lease.Timestamp) (lease.Result, error) {
		written = nil
		cur, err := s.held(tx, p.LockKey, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID)
		if err != nil {
			return lease.Result{}, err
		}
		next := lease.Renewed(cur, req.TTL, now)
		if written, err = s.putActive(tx, next, cur); err != nil {
			return lease.Result{}, err
		}
		return lease.Result{Code: lease.CodeRenewed, Lease: next, BackendTime: now}, nil
	})
	s.warm(written, res, err)
	return res, err
}

// Release ends the exact matching active lease (compare-and-delete).
func (s *Store) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return s.end(ctx, p, req.DeadlineAt, lease.CodeReleased, lease.StateReleased, func(tx *layered.View, now lease.Timestamp) (*lease.Record, error) {
		return s.held(tx, p.LockKey, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID)
	}, ended{by: req.Caller.PrincipalID, requestID: req.RequestID})
}

// ForceRelease ends the observed active lease with the operational terminal
// state, recording the administrator's reason.
func (s *Store) ForceRelease(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return s.admin(ctx, lease.OpForceRelease, req)
}

// Revoke ends the observed active lease with the security terminal state.
func (s *Store) Revoke(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return s.admin(ctx, lease.OpRevoke, req)
}

func (s *Store) admin(ctx context.Context, op lease.Op, req lease.AdminRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAdmin(op, req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	code, state := lease.AdminOutcome(op)
	return s.end(ctx, p, req.DeadlineAt, code, state, func(tx *layered.View, now lease.Timestamp) (*lease.Record, error) {
		cur, err := s.loadActive(tx, p.LockKey)
		if err != nil {
			return nil, refuse(err)
		}
		// Compare against the observed lease so an unseen successor survives.
		if cur == nil || cur.LeaseID != req.LeaseID || cur.FencingToken != req.FencingToken {
			return nil, refuse(lease.Lost(now))
		}
		if !cur.LiveAt(now) {
			return nil, s.lostExpired(tx, cur, now)
		}
		return cur, nil
	}, ended{by: req.Caller.PrincipalID, requestID: req.RequestID, reason: req.Reason, incident: req.IncidentID})
}

// end runs a terminal transition: match finds the lease to end (or
// refuses), then the lease is archived in state.
func (s *Store) end(ctx context.Context, p lease.Prepared, at time.Time, code lease.Code, state lease.State,
	match func(*layered.View, lease.Timestamp) (*lease.Record, error), why ended) (lease.Result, error) {
	return s.mutation(ctx, p, at, func(tx *layered.View, now lease.Timestamp) (lease.Result, error) {
		cur, err := match(tx, now)
		if err != nil {
			return lease.Result{}, err
		}
		final := cur.Clone()
		final.State = state
		if err := s.archive(tx, cur, state, now, why); err != nil {
			return lease.Result{}, err
		}
		return lease.Result{Code: code, Lease: final, BackendTime: now}, nil
	})
}

// mutation runs lease mutation p as one write transaction: it opens at
// backend time (start), so a request past its deadline or answered by
// its evidence goes no further; then op decides, and its result is
// remembered as evidence in the same transaction.
func (s *Store) mutation(ctx context.Context, p lease.Prepared, at time.Time,
	op func(*layered.View, lease.Timestamp) (lease.Result, error)) (lease.Result, error) {
	due := lease.Deadline(ctx, at)
	return change(s, ctx, func(tx *layered.View) (lease.Result, error) {
		now, replay, err := s.start(tx, p, due)
		switch {
		case err != nil:
			return lease.Result{}, refuse(err)
		case replay != nil:
			return *replay, nil
		}
		res, err := op(tx, now)
		if err != nil {
			return lease.Result{}, err
		}
		return res, s.remember(tx, p, res)
	})
}

// refusal is a typed answer decided inside a write transaction. Unlike a
// storage error it does not roll the transaction back: what it wrote
// stands (an expired lease archived, a quarantine mark).
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

// refuse marks err, a typed answer, as a refusal; nil stays nil.
func refuse(err error) error {
	if err == nil {
		return nil
	}
	return refusal{err}
}

// change runs fn as one write transaction (mutate; fn may run more than
// once) and returns its result, or the typed answer of its refusal. Any
// other error of fn rolls the transaction back.
func change[T any](s *Store, ctx context.Context, fn func(*layered.View) (T, error)) (T, error) {
	var res T
	var refused error
	err := s.mutate(ctx, func(tx *layered.View) error {
		var err error
		res, err = fn(tx)
		var r refusal
		if refused = nil; errors.As(err, &r) {
			refused = r.err
			return nil
		}
		return err
	})
	var zero T
	switch {
	case err != nil:
		return zero, err
	case refused != nil:
		return zero, refused
	}
	return res, nil
}

// start opens a mutation at backend time: the deadline check, then the
// idempotency lookup before any other read, so a replay is answered from
// evidence only. It returns the time and, where the answer is already
// final, the replayed result or a typed refusal.
func (s *Store) start(tx *layered.View, p lease.Prepared, due lease.Timestamp) (lease.Timestamp, *lease.Result, error) {
	now := s.clock(tx)
	if err := lease.PastDeadline(now, due); err != nil {
		return now, nil, err
	}
	v, ended, ok := s.storedEvidence(tx, p)
	if v == nil && ok {
		return now, nil, nil
	}
	ev, err := p.DecodeEvidence(v)
	if !ok || err != nil {
		return now, nil, s.quarantine(tx, p.LockKey, p.Identity, "idempotency evidence is corrupt")
	}
	r, err := p.Replay(ev, now, func(orig *lease.Record) (*lease.Record, error) { return s.currentOf(tx, orig, now, ended) })
	if err != nil {
		return now, nil, err
	}
	return now, &r, nil
}

// currentOf finds the state now of a lease: active, or its terminal record
// (known, when the caller found the lease's history entry already).
func (s *Store) currentOf(tx *layered.View, orig *lease.Record, now lease.Timestamp, known *lease.HistoryEntry) (*lease.Record, error) {
	cur, err := s.loadActive(tx, orig.LockKey)
	if err != nil {
		return nil, err
	}
	return lease.CurrentOf(orig, cur, now, func() *lease.HistoryEntry {
		if known != nil && known.Record.LeaseID == orig.LeaseID && known.Record.LockKey == orig.LockKey {
			return known
		}
		return findHistory(tx, orig.LockKey, orig.LeaseID)
	}), nil
}

// held returns the active lease matching every ownership field and
// unexpired at now; otherwise it refuses with lease_lost (or corrupt),
// archiving an expired match so it is never seen as active.
func (s *Store) held(tx *layered.View, lockKey string, now lease.Timestamp, leaseID string, token uint64, owner, instance string) (*lease.Record, error) {
	cur, err := s.loadActive(tx, lockKey)
	if err != nil {
		return nil, refuse(err)
	}
	if cur == nil || !cur.HeldBy(leaseID, token, owner, instance) {
		return nil, refuse(lease.Lost(now))
	}
	if !cur.LiveAt(now) {
		return nil, s.lostExpired(tx, cur, now)
	}
	return cur, nil
}

// lostExpired archives cur, a match that expired, and refuses with
// lease_lost.
func (s *Store) lostExpired(tx *layered.View, cur *lease.Record, now lease.Timestamp) error {
	if err := s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
		return err
	}
	return refuse(lease.Lost(now))
}

// remember stores the typed result as idempotency evidence in the same
// transaction as the mutation: an acquisition's and a release's by
// reference to the lease's record, which this store keeps as long as the
// evidence (the active record, then its history entry, whose removal
// rewrites the evidence, see dropHistory): in version 4 where that
// rebuilds exactly (lease.LeanEvidence; schema 11), else in version 3
// (lease.ReferringEvidence; schema 10); every other in version 2
// (lease.CompactEvidence: the facts without a second copy of the record's
// JSON; schema 4).
func (s *Store) remember(tx *layered.View, p lease.Prepared, res lease.Result) error {
	ev := &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: p.Op, Digest: p.Digest,
		Code: res.Code, Lease: res.Lease, BackendTime: res.BackendTime}
	var b []byte
	ok := false
	if !s.schema10Writes {
		b, ok = lease.LeanEvidence(ev)
	}
	if !ok {
		b, ok = lease.ReferringEvidence(ev)
	}
	if !ok {
		var err error
		if b, err = lease.CompactEvidence(ev, p.Identity); err != nil {
			return err
		}
	}
	k := idemKey(p.LockKey, p.Scope)
	if err := tx.Bucket(bucketIdent).Put(k, b); err != nil {
		return err
	}
	exp := res.BackendTime.Add(s.opts.IdempotencyRetention).UnixMilli()
	return tx.Bucket(bucketIdemExp).Put(append(u64(uint64(exp)), k...), nil)
}

// storedEvidence reads p's idempotency evidence as version 1 bytes, nil if
// there is none; ok is false for version 2, 3 or 4 evidence that cannot be
// rebuilt (corrupt: for versions 3 and 4 also when no record of the lease
// it names is found under p's lock key). ended is the history entry
// version 3 or 4 was rebuilt from, if it was (the replay's currentOf takes
// it instead of looking for it again). Valid only in tx.
func (s *Store) storedEvidence(tx *layered.View, p lease.Prepared) (v []byte, ended *lease.HistoryEntry, ok bool) {
	raw := tx.Bucket(bucketIdent).Get(idemKey(p.LockKey, p.Scope))
	var v1 string
	switch {
	case bytes.HasPrefix(raw, []byte(lease.EvidenceV2Prefix)):
		v1, ok = lease.ExpandEvidence(string(raw), p.Identity)
	case bytes.HasPrefix(raw, []byte(lease.EvidenceRefPrefix)):
		var rec *lease.Record
		rec, ended = s.referredRecord(tx, p.LockKey, string(raw))
		v1, ok = lease.ExpandReferringEvidence(string(raw), rec)
	case bytes.HasPrefix(raw, []byte(lease.EvidenceLeanPrefix)):
		var rec *lease.Record
		var endedAt lease.Timestamp
		rec, ended = s.tokenRecord(tx, p, string(raw))
		if ended != nil {
			endedAt = ended.EndedAt
		}
		v1, ok = lease.ExpandLeanEvidence(string(raw), rec, endedAt)
	default:
		return raw, nil, true
	}
	return []byte(v1), ended, ok
}

// referredRecord is a record of the lease version 3 evidence raw names,
// under lockKey: its active record, or else its history entry's (then
// also the entry); nil if neither is found (or the active record does not
// decode).
func (s *Store) referredRecord(tx *layered.View, lockKey, raw string) (*lease.Record, *lease.HistoryEntry) {
	id, ok := lease.ReferredLeaseID(raw)
	if !ok {
		return nil, nil
	}
	if cur, err := s.loadActive(tx, lockKey); err == nil && cur != nil && cur.LeaseID == id {
		return cur, nil
	}
	if h := findHistory(tx, lockKey, id); h != nil {
		return h.Record, h
	}
	return nil, nil
}

// tokenRecord is a record of the lease version 4 evidence raw (read for
// p) names by its token, under p's lock key: for an acquisition its
// active record, or else its history entry's (then also the entry); for
// a release only the history entry's (the release ended it). The record
// must also be the one p's request made: its own acquisition's scope (or
// its entry's release's) is p's. That stands in for the lease id version
// 3 named: evidence copied under another key, or a record that is not
// its request's, is never answered. nil if none is found (or the active
// record does not decode).
func (s *Store) tokenRecord(tx *layered.View, p lease.Prepared, raw string) (*lease.Record, *lease.HistoryEntry) {
	op, token, ok := lease.LeanEvidenceToken(raw)
	if !ok || op != p.Op {
		return nil, nil
	}
	if op == lease.OpAcquire {
		if cur, err := s.loadActive(tx, p.LockKey); err == nil && cur != nil && cur.FencingToken == token {
			if cur.AcquisitionScope() != p.Scope {
				return nil, nil
			}
			return cur, nil
		}
	}
	h := findHistoryBy(tx, p.LockKey, func(r *lease.Record) bool { return r.FencingToken == token })
	if h == nil {
		return nil, nil
	}
	if h.EvidenceScope(op) != p.Scope {
		return nil, nil
	}
	return h.Record, h
}

// detachEvidence rewrites in version 2 the version 3 evidence of h's
// lease (its history entry, stored under lockKey as raw, which the caller
// decoded strictly into h: the splice relies on it) before the entry
// goes, so it still answers for its retention: its acquisition's, and the
// release's that ended it. Evidence it cannot rebuild is left as it is:
// it was unreadable anyway.
func detachEvidence(tx *layered.View, lockKey string, h *lease.HistoryEntry, raw []byte) error {
	r := h.Record
	if err := detachEvidenceOf(tx, lockKey, h, raw, lease.OpAcquire); err != nil {
		return err
	}
	if r.State != lease.StateReleased || h.EndedBy == "" || h.RequestID == "" {
		return nil
	}
	return detachEvidenceOf(tx, lockKey, h, raw, lease.OpRelease)
}

// detachEvidenceOf rewrites the evidence of op for h's lease (under
// h.EvidenceScope(op)) in version 2 if it is version 3 or 4 of h's lease:
// spliced from the entry's own lines (lease.DetachedEvidence,
// lease.DetachedLeanEvidence), or, for an entry in version 1, rebuilt
// and encoded. Version 4 evidence of another
// operation than op (misplaced: its reader answers corrupt) is left as
// it is, so that detaching does not turn it into evidence that answers.
func detachEvidenceOf(tx *layered.View, lockKey string, h *lease.HistoryEntry, raw []byte, op lease.Op) error {
	ident := tx.Bucket(bucketIdent)
	k := idemKey(lockKey, h.EvidenceScope(op))
	ev := ident.Get(k)
	var e *lease.IdempotencyRecord
	var ok bool
	switch {
	case bytes.HasPrefix(ev, []byte(lease.EvidenceLeanPrefix)):
		if named, _, ok := lease.LeanEvidenceToken(string(ev)); !ok || named != op {
			return nil
		}
		if b, ok := lease.DetachedLeanEvidence(string(ev), string(raw), lockKey, h.Record.Identity()); ok {
			return ident.Put(k, b)
		}
		e, ok = lease.LeanReferredEvidence(string(ev), h.Record, h.EndedAt)
	case bytes.HasPrefix(ev, []byte(lease.EvidenceRefPrefix)):
		if b, ok := lease.DetachedEvidence(string(ev), string(raw)); ok {
			return ident.Put(k, b)
		}
		e, ok = lease.ReferredEvidence(string(ev), h.Record)
	}
	if !ok {
		return nil
	}
	b, err := lease.CompactEvidence(e, h.Record.Identity())
	if err != nil {
		return nil
	}
	return ident.Put(k, b)
}

// loadActive strictly decodes the active record of lockKey; nil if none. A
// record that fails decoding is quarantined and reported corrupt. Reads
// go through the memo (a record is read again and again between writes).
// A write transaction, which runs in the one committing goroutine, only
// looks its bytes up: they were mostly written by the lease's last
// mutation, whose caller put them in the memo after its commit (warm), so
// their decoding ran outside the commit; a miss is decoded and not kept.
func (s *Store) loadActive(tx *layered.View, lockKey string) (*lease.Record, error) {
	return s.loadActiveFrom(tx, tx.Bucket(bucketIdent), lockKey)
}

// loadActiveFrom is loadActive with tx's ident bucket at hand: a read
// transaction looks a bucket up anew (and allocates) on each tx.Bucket.
func (s *Store) loadActiveFrom(tx *layered.View, ident *layered.Bucket, lockKey string) (*lease.Record, error) {
	v := ident.Get(activeKey(lockKey))
	if v == nil {
		return nil, nil
	}
	var rec *lease.Record
	var err error
	if !tx.Writable() {
		rec, err = s.records.Decode(v)
	} else if known, ok := s.records.Known(v); ok {
		rec = known
	} else {
		rec, err = lease.DecodeStoredRecord(v)
	}
	if err == nil && rec.LockKey != lockKey {
		err = lease.Errorf(lease.CodeCorrupt, "record: stored under a foreign lock key")
	}
	if err != nil {
		return nil, s.quarantine(tx, lockKey, lease.Identity{}, lease.AsError(err).Reason)
	}
	return rec, nil
}

// quarantine records a corrupt identity for operators (in write
// transactions) and alerts; the value itself is never overwritten.
func (s *Store) quarantine(tx *layered.View, lockKey string, id lease.Identity, reason string) *lease.Error {
	if tx.Writable() {
		_ = tx.Bucket(bucketQuarantine).Put([]byte(lockKey), []byte(reason))
	}
	return lease.CorruptState(s.log, id, reason)
}

// putActive writes rec as the active record (in version 2,
// lease.CompactRecord: schema 6) and its expiry index entry, replacing
// prev's (nil for a new lease). It returns the record's bytes, for warm.
func (s *Store) putActive(tx *layered.View, rec, prev *lease.Record) ([]byte, error) {
	b, err := lease.CompactRecord(rec)
	if err != nil {
		return nil, err
	}
	exp := tx.Bucket(bucketActiveExp)
	if prev != nil {
		if err := exp.Delete(activeExpKey(prev)); err != nil {
			return nil, err
		}
	}
	if err := exp.Put(activeExpKey(rec), nil); err != nil {
		return nil, err
	}
	return b, tx.Bucket(bucketIdent).Put(activeKey(rec.LockKey), b)
}

// warm decodes the bytes of an active record a committed mutation wrote
// into the memo, in the caller's goroutine: the lease's next mutation
// then finds it decoded (loadActive) instead of decoding it in the
// commit every writer waits for. The memo keeps only what the strict
// decoder gives for those exact bytes, so warming with bytes that were
// never stored, or were replaced since, changes no answer. A replay
// wrote nothing.
func (s *Store) warm(written []byte, res lease.Result, err error) {
	if err == nil && !res.Replayed && written != nil {
		_, _ = s.records.Decode(written)
	}
}

// activeExpKey is the reaper's index entry of an active record, ordered by
// expires_at.
func activeExpKey(rec *lease.Record) []byte {
	return timeIndexKey(rec.ExpiresAt, packLockKey(rec.LockKey))
}

// timeIndexKey is k's entry in a time index ordered by at: the active
// records' by expires_at, the history entries' by ended_at.
func timeIndexKey(at lease.Timestamp, k []byte) []byte {
	return append(u64(uint64(max(at.UnixMilli(), 0))), k...)
}

// ended says who ended a lease and why.
type ended struct{ by, requestID, reason, incident string }

// archive moves the active record cur to history in state, at endedAt (the
// entry in version 3, lease.CompactHistoryAt: schema 11; else version 2,
// lease.CompactHistory: schema 4). The
// caller has matched cur's lease id and token in this transaction, so the
// removal is conditional on them.
func (s *Store) archive(tx *layered.View, cur *lease.Record, state lease.State, endedAt lease.Timestamp, why ended) error {
	final := cur.Clone()
	final.State = state
	h := &lease.HistoryEntry{HistoryVersion: lease.HistoryVersion, Record: final, EndedAt: endedAt,
		EndedBy: why.by, RequestID: why.requestID, Reason: why.reason, IncidentID: why.incident}
	compact := lease.CompactHistoryAt // its key holds the lock key
	if s.schema10Writes {
		compact = lease.CompactHistory
	}
	b, err := compact(h)
	if err != nil {
		return err
	}
	ident := tx.Bucket(bucketIdent)
	seq, err := ident.NextSequence()
	if err != nil {
		return err
	}
	hk := historyKey(cur.LockKey, seq)
	if err := ident.Put(hk, b); err != nil {
		return err
	}
	if err := tx.Bucket(bucketHistoryExp).Put(timeIndexKey(endedAt, hk), nil); err != nil {
		return err
	}
	if err := ident.Delete(activeKey(cur.LockKey)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketActiveExp).Delete(activeExpKey(cur)); err != nil {
		return err
	}
	for _, k := range indexKeys(cur) {
		if err := tx.Bucket(bucketIndex).Delete(k); err != nil {
			return err
		}
	}
	if err := putLeaseState(tx, cur.LeaseID, cur.LockKey, state, endedAt.UnixMilli()); err != nil {
		return err
	}
	return s.trimHistory(tx, cur.LockKey, hk)
}

// trimHistory keeps the newest HistoryPerIdentity entries of lockKey,
// whose newest entry (added) archive just wrote: the oldest go, found by
// one seek each, and the identity's history count (kindHistoryCount) is
// rewritten. The entry just added never goes: a count found higher than
// the entries (damage) stops there and is corrected.
func (s *Store) trimHistory(tx *layered.View, lockKey string, added []byte) error {
	ident := tx.Bucket(bucketIdent)
	n := historyCount(ident, lockKey)
	prefix := historyPrefix(lockKey)
	c := ident.Cursor()
	for ; n > uint64(s.opts.HistoryPerIdentity); n-- {
		k, v := c.Seek(prefix)
		if bytes.Equal(k, added) {
			n = 1
			break
		}
		if err := dropHistory(tx, bytes.Clone(k), v); err != nil {
			return err
		}
	}
	return ident.Put(historyCountKey(lockKey), u64(n))
}

// historyCount is the number of lockKey's history entries: its count
// entry plus the one archive just added, or (no count yet: a file of
// schema 8, or a malformed count, such as one that would wrap) the
// entries counted one by one.
func historyCount(ident *layered.Bucket, lockKey string) uint64 {
	if v := ident.Get(historyCountKey(lockKey)); len(v) == 8 && binary.BigEndian.Uint64(v) < math.MaxUint64 {
		return binary.BigEndian.Uint64(v) + 1
	}
	prefix := historyPrefix(lockKey)
	c := ident.Cursor()
	var n uint64
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n
}

// forgetHistory deletes one history entry (k, a history key; see
// dropHistory) and counts it out of its identity's history count.
func forgetHistory(tx *layered.View, k []byte) error {
	ident := tx.Bucket(bucketIdent)
	v := ident.Get(k)
	if v == nil {
		return nil
	}
	if err := dropHistory(tx, k, v); err != nil {
		return err
	}
	// The last entry's count goes with it (an identity without history
	// keeps no count), as does a malformed one: the next archive counts.
	ck := historyCountKeyOf(k)
	if v := ident.Get(ck); len(v) == 8 && binary.BigEndian.Uint64(v) > 1 {
		return ident.Put(ck, u64(binary.BigEndian.Uint64(v)-1))
	} else if v != nil {
		return ident.Delete(ck)
	}
	return nil
}

// dropHistory deletes one history entry (k, a history key, whose value
// the caller read: v) and the lease-id lookup it backs: only the lookup
// archiving this entry wrote (this identity, the entry's terminal state
// and end), so an entry found under k that is another identity's, or
// names a live lease or another ended one (damage, a misplaced copy),
// never deletes that lease's lookup. An entry of this identity first
// detaches the evidence that may refer to it (detachEvidence). The
// caller keeps the identity's history count.
func dropHistory(tx *layered.View, k, v []byte) error {
	hist := tx.Bucket(bucketIdent)
	if len(k) < packedLen {
		return hist.Delete(k)
	}
	lockKey := unpackLockKey(k[:packedLen])
	if h, err := lease.DecodeStoredHistoryAt(v, lockKey); err == nil {
		if h.Record.LockKey == lockKey {
			if err := detachEvidence(tx, lockKey, h, v); err != nil {
				return err
			}
		}
		leases := tx.Bucket(bucketLeases)
		own := leaseStateValue(lockKey, h.Record.State, h.EndedAt.UnixMilli())
		if h.Record.LockKey == lockKey && bytes.Equal(leases.Get([]byte(h.Record.LeaseID)), own) {
			if err := leases.Delete([]byte(h.Record.LeaseID)); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketHistoryExp).Delete(timeIndexKey(h.EndedAt, k)); err != nil {
			return err
		}
	}
	return hist.Delete(k)
}

// seekLast positions c at the last key with prefix, whose last byte is
// below 0xff: every such key sorts before the prefix with that byte
// incremented.
func seekLast(c *layered.Cursor, prefix []byte) ([]byte, []byte) {
	end := bytes.Clone(prefix)
	end[len(end)-1]++
	k, _ := c.Seek(end)
	if k == nil {
		return c.Last()
	}
	return c.Prev()
}

// findHistory finds the terminal evidence of leaseID under lockKey.
func findHistory(tx *layered.View, lockKey, leaseID string) *lease.HistoryEntry {
	return findHistoryBy(tx, lockKey, func(r *lease.Record) bool { return r.LeaseID == leaseID })
}

// findHistoryBy finds the newest history entry under lockKey that decodes,
// is lockKey's and whose record is (newest first: an identity's entries
// are in sequence order).
func findHistoryBy(tx *layered.View, lockKey string, is func(*lease.Record) bool) *lease.HistoryEntry {
	prefix := historyPrefix(lockKey)
	c := tx.Bucket(bucketIdent).Cursor()
	for k, v := seekLast(c, prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
		if h, err := lease.DecodeStoredHistoryAt(v, lockKey); err == nil && is(h.Record) && h.Record.LockKey == lockKey {
			return h
		}
	}
	return nil
}

// putLeaseState records where a lease id lives and its state: packed lock
// key ‖ state ‖ 0 ‖ ended ms.
func putLeaseState(tx *layered.View, leaseID, lockKey string, state lease.State, endedMs int64) error {
	return tx.Bucket(bucketLeases).Put([]byte(leaseID), leaseStateValue(lockKey, state, endedMs))
}

func leaseStateValue(lockKey string, state lease.State, endedMs int64) []byte {
	return append(packLockKey(lockKey), join(string(state), strconv.FormatInt(endedMs, 10))...)
}

// leaseLockKey is the lock key of leaseID's identity, from the leases
// bucket; ok is false if it has no lookup for it, or only a malformed one.
func leaseLockKey(leases *layered.Bucket, leaseID string) (lockKey string, ok bool) {
	v := leases.Get([]byte(leaseID))
	if len(v) <= packedLen {
		return "", false
	}
	return unpackLockKey(v[:packedLen]), true
}

// indexKeys are the List index entries of an active record.
func indexKeys(r *lease.Record) [][]byte {
	var keys [][]byte
	for _, f := range lease.FiltersOf(r) {
		keys = append(keys, indexKey(f, r.LeaseID))
	}
	return keys
}

func indexKey(f lease.ListFilter, leaseID string) []byte {
	return join(string(f.By), f.Value, leaseID)
}

// counterAt reads an 8-byte big-endian counter, mark or sequence: 0 when
// absent; ok is false for a malformed value.
func counterAt(b *layered.Bucket, key []byte) (uint64, bool) {
	v := b.Get(key)
	switch {
	case v == nil:
		return 0, true
	case len(v) != 8:
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}
