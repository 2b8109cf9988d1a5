package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"strconv"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// Acquire grants a lease if no unexpired active lease holds the identity.
func (s *Store) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	due := deadline(ctx, req.DeadlineAt)
	var res lease.Result
	var opErr error
	err = s.mutate(ctx, func(tx *bbolt.Tx) error {
		res, opErr = lease.Result{}, nil
		now, done, err := s.start(tx, p, due, &res, &opErr)
		if done || err != nil {
			return err
		}
		cur, err := s.loadActive(tx, p.LockKey)
		if err != nil {
			opErr = err
			return nil
		}
		if cur != nil && cur.LiveAt(now) {
			opErr = &lease.Error{Code: lease.CodeConflict, Reason: "another unexpired lease holds the identity",
				RetryAfter: cur.ExpiresAt.Time().Sub(now.Time()), BackendTime: now.Time()}
			return nil
		}
		// Every check that can refuse runs before the first write.
		counters := tx.Bucket(bucketCounters)
		counter, ok := counterAt(counters, []byte(p.LockKey))
		if !ok {
			opErr = s.quarantine(tx, p.LockKey, p.Identity, "fencing counter is malformed")
			return nil
		}
		// After a recovery epoch every identity, even one the backup did
		// not know, continues above the epoch's floor.
		floor, ok := counterFloor(tx)
		if !ok {
			opErr = s.quarantine(tx, p.LockKey, p.Identity, "counter floor is malformed")
			return nil
		}
		counter = max(counter, floor)
		if counter >= lease.MaxFencingToken {
			s.log.Error("ALERT fencing counter exhausted; acquisition refused", identityAttrs(p.Identity)...)
			opErr = &lease.Error{Code: lease.CodeCounterExhausted, Reason: "the fencing counter reached 2^53-1", BackendTime: now.Time()}
			return nil
		}
		if cur != nil {
			if err := s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
				return err
			}
		}
		rec := &lease.Record{
			RecordVersion: lease.RecordVersion, LockKey: p.LockKey,
			LeaseID:          lease.NewLeaseID(now),
			OwnerPrincipalID: req.Caller.PrincipalID, OwnerClientID: req.Caller.ClientID,
			OwnerCredentialID: req.Caller.CredentialID, ServiceInstanceID: req.ServiceInstanceID,
			FencingToken: counter + 1,
			AcquiredAt:   now, RenewedAt: now,
			ExpiresAt:         expiry(now, req.TTL, now, req.MaximumLifetime),
			TTLMs:             req.TTL.Milliseconds(),
			MaximumLifetimeMs: req.MaximumLifetime.Milliseconds(),
			ExecutionID:       req.ExecutionID, JobID: req.JobID, TraceID: req.TraceID,
			RequestID: req.RequestID, Metadata: req.Metadata, State: lease.StateActive,
		}
		rec.SetIdentity(p.Identity)
		if err := counters.Put([]byte(p.LockKey), u64(rec.FencingToken)); err != nil {
			return err
		}
		if err := s.putActive(tx, rec); err != nil {
			return err
		}
		for _, k := range indexKeys(rec) {
			if err := tx.Bucket(bucketIndex).Put(k, []byte(p.LockKey)); err != nil {
				return err
			}
		}
		if err := putLeaseState(tx, rec.LeaseID, p.LockKey, lease.StateActive, 0); err != nil {
			return err
		}
		res = lease.Result{Code: lease.CodeAcquired, Lease: rec, BackendTime: now}
		return s.remember(tx, p, res)
	})
	return finish(res, opErr, err)
}

// expiry is min(now+ttl, acquired+maximum lifetime).
func expiry(now lease.Timestamp, ttl time.Duration, acquired lease.Timestamp, lifetime time.Duration) lease.Timestamp {
	e, limit := now.Add(ttl), acquired.Add(lifetime)
	if limit.Before(e) {
		return limit
	}
	return e
}

// Renew extends the exact matching active lease.
func (s *Store) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRenew(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	due := deadline(ctx, req.DeadlineAt)
	var res lease.Result
	var opErr error
	err = s.mutate(ctx, func(tx *bbolt.Tx) error {
		res, opErr = lease.Result{}, nil
		now, done, err := s.start(tx, p, due, &res, &opErr)
		if done || err != nil {
			return err
		}
		cur, err := s.held(tx, p, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID, &opErr)
		if cur == nil || err != nil {
			return err
		}
		ttl := req.TTL
		if ttl == 0 {
			ttl = time.Duration(cur.TTLMs) * time.Millisecond
		}
		next := cur.Clone()
		next.RenewedAt = now
		next.ExpiresAt = expiry(now, ttl, cur.AcquiredAt, time.Duration(cur.MaximumLifetimeMs)*time.Millisecond)
		next.TTLMs = ttl.Milliseconds()
		if err := s.putActive(tx, next); err != nil {
			return err
		}
		res = lease.Result{Code: lease.CodeRenewed, Lease: next, BackendTime: now}
		return s.remember(tx, p, res)
	})
	return finish(res, opErr, err)
}

// Release ends the exact matching active lease (compare-and-delete).
func (s *Store) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return s.end(ctx, p, req.DeadlineAt, lease.CodeReleased, lease.StateReleased, func(tx *bbolt.Tx, now lease.Timestamp, opErr *error) (*lease.Record, error) {
		return s.held(tx, p, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID, opErr)
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
	return s.end(ctx, p, req.DeadlineAt, code, state, func(tx *bbolt.Tx, now lease.Timestamp, opErr *error) (*lease.Record, error) {
		cur, err := s.loadActive(tx, p.LockKey)
		if err != nil {
			*opErr = err
			return nil, nil
		}
		// Compare against the observed lease so an unseen successor survives.
		if cur == nil || cur.LeaseID != req.LeaseID || cur.FencingToken != req.FencingToken {
			*opErr = lost(now)
			return nil, nil
		}
		if !cur.LiveAt(now) {
			*opErr = lost(now)
			return nil, s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{})
		}
		return cur, nil
	}, ended{by: req.Caller.PrincipalID, requestID: req.RequestID, reason: req.Reason, incident: req.IncidentID})
}

// end runs a terminal transition: match finds the lease to end (or sets
// opErr), then the lease is archived in state and the result remembered.
func (s *Store) end(ctx context.Context, p lease.Prepared, at time.Time, code lease.Code, state lease.State,
	match func(*bbolt.Tx, lease.Timestamp, *error) (*lease.Record, error), why ended) (lease.Result, error) {
	due := deadline(ctx, at)
	var res lease.Result
	var opErr error
	err := s.mutate(ctx, func(tx *bbolt.Tx) error {
		res, opErr = lease.Result{}, nil
		now, done, err := s.start(tx, p, due, &res, &opErr)
		if done || err != nil {
			return err
		}
		cur, err := match(tx, now, &opErr)
		if cur == nil || err != nil {
			return err
		}
		final := cur.Clone()
		final.State = state
		if err := s.archive(tx, cur, state, now, why); err != nil {
			return err
		}
		res = lease.Result{Code: code, Lease: final, BackendTime: now}
		return s.remember(tx, p, res)
	})
	return finish(res, opErr, err)
}

// finish turns a transaction's outputs into the typed result.
func finish(res lease.Result, opErr, err error) (lease.Result, error) {
	if err != nil {
		return lease.Result{}, err
	}
	if opErr != nil {
		return lease.Result{}, opErr
	}
	return res, nil
}

// pastDeadline is deadline_exceeded if due has passed at backend time now.
// It returns error, not *lease.Error, so a nil result is a nil interface.
func pastDeadline(now, due lease.Timestamp) error {
	if now.Before(due) {
		return nil
	}
	return &lease.Error{Code: lease.CodeDeadlineExceeded, Reason: "deadline elapsed before the operation started", BackendTime: now.Time()}
}

func lost(now lease.Timestamp) *lease.Error {
	return &lease.Error{Code: lease.CodeLost, Reason: "the lease is not held", BackendTime: now.Time()}
}

// start opens a mutation at backend time: the deadline check, then the
// idempotency lookup before any other read, so a replay is answered from
// evidence only. done reports that the result (replay or error) is final.
func (s *Store) start(tx *bbolt.Tx, p lease.Prepared, due lease.Timestamp, res *lease.Result, opErr *error) (lease.Timestamp, bool, error) {
	now := s.clock(tx)
	if *opErr = pastDeadline(now, due); *opErr != nil {
		return now, true, nil
	}
	v := tx.Bucket(bucketIdem).Get([]byte(p.Scope))
	if v == nil {
		return now, false, nil
	}
	ev, err := lease.DecodeIdempotencyRecord(v)
	if err != nil {
		*opErr = s.quarantine(tx, p.LockKey, p.Identity, "idempotency evidence is corrupt")
		return now, true, nil
	}
	if ev.Op != p.Op || ev.Digest != p.Digest || ev.Lease.LockKey != p.LockKey {
		*opErr = &lease.Error{Code: lease.CodeIdempotencyConflict, Reason: "request id was reused with different inputs", BackendTime: now.Time()}
		return now, true, nil
	}
	r := ev.Result()
	if p.Op == lease.OpAcquire {
		cur, err := s.currentOf(tx, ev.Lease, now)
		if err != nil {
			*opErr = err
			return now, true, nil
		}
		if cur.State != ev.Lease.State {
			r.Current = cur
		}
	}
	*res = r
	return now, true, nil
}

// currentOf finds the state now of a lease: active, or its terminal record.
func (s *Store) currentOf(tx *bbolt.Tx, orig *lease.Record, now lease.Timestamp) (*lease.Record, error) {
	cur, err := s.loadActive(tx, orig.LockKey)
	if err != nil {
		return nil, err
	}
	if cur != nil && cur.LeaseID == orig.LeaseID {
		return cur.ObservedAt(now), nil
	}
	if h := findHistory(tx, orig.LockKey, orig.LeaseID); h != nil {
		return h.Record, nil
	}
	// Evidence of the end is gone (history retention); the lease is not
	// active, and the only terminal state that needs no evidence is expiry.
	gone := orig.Clone()
	gone.State = lease.StateExpired
	return gone, nil
}

// held returns the active lease matching every ownership field and
// unexpired at now; otherwise it sets opErr to lease_lost (or corrupt) and
// returns nil, archiving an expired match so it is never seen as active.
func (s *Store) held(tx *bbolt.Tx, p lease.Prepared, now lease.Timestamp, leaseID string, token uint64, owner, instance string, opErr *error) (*lease.Record, error) {
	cur, err := s.loadActive(tx, p.LockKey)
	if err != nil {
		*opErr = err
		return nil, nil
	}
	if cur == nil || cur.LeaseID != leaseID || cur.FencingToken != token ||
		cur.OwnerPrincipalID != owner || cur.ServiceInstanceID != instance {
		*opErr = lost(now)
		return nil, nil
	}
	if !cur.LiveAt(now) {
		*opErr = lost(now)
		return nil, s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{})
	}
	return cur, nil
}

// remember stores the typed result as idempotency evidence in the same
// transaction as the mutation.
func (s *Store) remember(tx *bbolt.Tx, p lease.Prepared, res lease.Result) error {
	ev := &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: p.Op, Digest: p.Digest,
		Code: res.Code, Lease: res.Lease, BackendTime: res.BackendTime}
	b, err := ev.Encode()
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketIdem).Put([]byte(p.Scope), b); err != nil {
		return err
	}
	exp := res.BackendTime.Add(s.opts.IdempotencyRetention).UnixMilli()
	return tx.Bucket(bucketIdemExp).Put(append(u64(uint64(exp)), p.Scope...), nil)
}

// loadActive strictly decodes the active record of lockKey; nil if none. A
// record that fails decoding is quarantined and reported corrupt.
func (s *Store) loadActive(tx *bbolt.Tx, lockKey string) (*lease.Record, error) {
	v := tx.Bucket(bucketActive).Get([]byte(lockKey))
	if v == nil {
		return nil, nil
	}
	rec, err := lease.DecodeRecord(v)
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
func (s *Store) quarantine(tx *bbolt.Tx, lockKey string, id lease.Identity, reason string) *lease.Error {
	if tx.Writable() {
		_ = tx.Bucket(bucketQuarantine).Put([]byte(lockKey), []byte(reason))
	}
	attrs := append([]any{"reason", reason}, identityAttrs(id)...)
	s.log.Error("ALERT corrupt lease state; failing closed", attrs...)
	return &lease.Error{Code: lease.CodeCorrupt, Reason: "stored lease state is corrupt; failing closed"}
}

// identityAttrs are the log attributes of an identity: its canonical scope,
// never the raw lock key.
func identityAttrs(id lease.Identity) []any {
	if id == (lease.Identity{}) {
		return nil
	}
	return []any{"tenant_id", id.TenantID, "program_id", id.ProgramID, "target_namespace", id.TargetNamespace,
		"target_id", id.TargetID, "actor_name", id.ActorName, "workflow_name", id.WorkflowName, "operation_class", id.OperationClass}
}

func (s *Store) putActive(tx *bbolt.Tx, rec *lease.Record) error {
	b, err := rec.Encode()
	if err != nil {
		return err
	}
	return tx.Bucket(bucketActive).Put([]byte(rec.LockKey), b)
}

// ended says who ended a lease and why.
type ended struct{ by, requestID, reason, incident string }

// archive moves the active record cur to history in state, at endedAt. The
// caller has matched cur's lease id and token in this transaction, so the
// removal is conditional on them.
func (s *Store) archive(tx *bbolt.Tx, cur *lease.Record, state lease.State, endedAt lease.Timestamp, why ended) error {
	final := cur.Clone()
	final.State = state
	h := &lease.HistoryEntry{HistoryVersion: lease.HistoryVersion, Record: final, EndedAt: endedAt,
		EndedBy: why.by, RequestID: why.requestID, Reason: why.reason, IncidentID: why.incident}
	b, err := h.Encode()
	if err != nil {
		return err
	}
	hist := tx.Bucket(bucketHistory)
	seq, err := hist.NextSequence()
	if err != nil {
		return err
	}
	if err := hist.Put(append(join(cur.LockKey, ""), u64(seq)...), b); err != nil {
		return err
	}
	if err := tx.Bucket(bucketActive).Delete([]byte(cur.LockKey)); err != nil {
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
	return s.trimHistory(tx, cur.LockKey)
}

// trimHistory keeps the newest HistoryPerIdentity entries of lockKey.
func (s *Store) trimHistory(tx *bbolt.Tx, lockKey string) error {
	prefix := join(lockKey, "")
	c := tx.Bucket(bucketHistory).Cursor()
	var drop [][]byte
	n := 0
	for k, _ := seekLast(c, prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Prev() {
		n++
		if n > s.opts.HistoryPerIdentity {
			drop = append(drop, bytes.Clone(k))
		}
	}
	for _, k := range drop {
		if err := forgetHistory(tx, k); err != nil {
			return err
		}
	}
	return nil
}

// forgetHistory deletes one history entry and the lease-id lookup it backs.
func forgetHistory(tx *bbolt.Tx, k []byte) error {
	hist := tx.Bucket(bucketHistory)
	if h, err := lease.DecodeHistoryEntry(hist.Get(k)); err == nil {
		if err := tx.Bucket(bucketLeases).Delete([]byte(h.Record.LeaseID)); err != nil {
			return err
		}
	}
	return hist.Delete(k)
}

// seekLast positions c at the last key with prefix, which ends in the 0
// separator: every such key sorts before the prefix with that byte made 1.
func seekLast(c *bbolt.Cursor, prefix []byte) ([]byte, []byte) {
	end := bytes.Clone(prefix)
	end[len(end)-1] = 1
	k, _ := c.Seek(end)
	if k == nil {
		return c.Last()
	}
	return c.Prev()
}

// findHistory finds the terminal evidence of leaseID under lockKey.
func findHistory(tx *bbolt.Tx, lockKey, leaseID string) *lease.HistoryEntry {
	prefix := join(lockKey, "")
	c := tx.Bucket(bucketHistory).Cursor()
	for k, v := seekLast(c, prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
		if h, err := lease.DecodeHistoryEntry(v); err == nil && h.Record.LeaseID == leaseID {
			return h
		}
	}
	return nil
}

// putLeaseState records where a lease id lives and its state.
func putLeaseState(tx *bbolt.Tx, leaseID, lockKey string, state lease.State, endedMs int64) error {
	return tx.Bucket(bucketLeases).Put([]byte(leaseID), join(lockKey, string(state), strconv.FormatInt(endedMs, 10)))
}

// indexKeys are the List index entries of an active record.
func indexKeys(r *lease.Record) [][]byte {
	id := r.Identity()
	return [][]byte{
		indexKey(lease.ListFilter{By: lease.ListByOwner, Value: lease.OwnerIndexValue(r.OwnerPrincipalID)}, r.LeaseID),
		indexKey(lease.ListFilter{By: lease.ListByTarget, Value: lease.TargetIndexValue(id)}, r.LeaseID),
		indexKey(lease.ListFilter{By: lease.ListByProgram, Value: lease.ProgramIndexValue(id)}, r.LeaseID),
	}
}

func indexKey(f lease.ListFilter, leaseID string) []byte {
	return join(string(f.By), f.Value, leaseID)
}

// counterAt reads an 8-byte big-endian counter, mark or sequence: 0 when
// absent; ok is false for a malformed value.
func counterAt(b *bbolt.Bucket, key []byte) (uint64, bool) {
	v := b.Get(key)
	switch {
	case v == nil:
		return 0, true
	case len(v) != 8:
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}
