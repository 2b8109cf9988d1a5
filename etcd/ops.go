package etcd

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// Acquire grants a lease if no unexpired active lease holds the identity.
func (s *Store) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return s.mutation(ctx, p, req.DeadlineAt, func(t *txn, now lease.Timestamp) (lease.Result, error) {
		cur, err := s.loadActive(t, p.LockKey)
		if err != nil {
			return lease.Result{}, err
		}
		if cur != nil && cur.LiveAt(now) {
			return lease.Result{}, refuse(lease.Conflict(now, cur.ExpiresAt))
		}
		// Every check that can refuse runs before the first write.
		counter, ok, err := t.getU64(s.keys.counter(p.LockKey))
		if err != nil {
			return lease.Result{}, err
		}
		if !ok {
			return lease.Result{}, s.quarantine(t, p.LockKey, p.Identity, "fencing counter is malformed")
		}
		// After a recovery epoch every identity, even one the backup did
		// not know, continues above the epoch's floor.
		floor, ok, err := t.getU64(s.keys.floor())
		if err != nil {
			return lease.Result{}, err
		}
		if !ok {
			return lease.Result{}, s.quarantine(t, p.LockKey, p.Identity, "counter floor is malformed")
		}
		counter = max(counter, floor)
		if counter >= lease.MaxFencingToken {
			return lease.Result{}, refuse(lease.CounterExhausted(s.log, p.Identity, now))
		}
		if cur != nil {
			if err := s.archive(t, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
				return lease.Result{}, err
			}
		}
		rec := lease.NewLease(req, p, now, counter+1)
		t.put(s.keys.counter(p.LockKey), u64(rec.FencingToken))
		if err := s.putActive(t, rec, nil); err != nil {
			return lease.Result{}, err
		}
		for _, k := range s.indexKeys(rec) {
			t.put(k, []byte(p.LockKey))
		}
		t.put(s.keys.leaseID(rec.LeaseID), leaseLocation(p.LockKey, 0))
		return lease.Result{Code: lease.CodeAcquired, Lease: rec, BackendTime: now}, nil
	})
}

// Renew extends the exact matching active lease.
func (s *Store) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRenew(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return s.mutation(ctx, p, req.DeadlineAt, func(t *txn, now lease.Timestamp) (lease.Result, error) {
		cur, err := s.held(t, p.LockKey, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID)
		if err != nil {
			return lease.Result{}, err
		}
		next := lease.Renewed(cur, req.TTL, now)
		if err := s.putActive(t, next, cur); err != nil {
			return lease.Result{}, err
		}
		return lease.Result{Code: lease.CodeRenewed, Lease: next, BackendTime: now}, nil
	})
}

// Release ends the exact matching active lease (compare-and-delete).
func (s *Store) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return s.end(ctx, p, req.DeadlineAt, lease.CodeReleased, lease.StateReleased, func(t *txn, now lease.Timestamp) (*lease.Record, error) {
		return s.held(t, p.LockKey, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID)
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
	return s.end(ctx, p, req.DeadlineAt, code, state, func(t *txn, now lease.Timestamp) (*lease.Record, error) {
		cur, err := s.loadActive(t, p.LockKey)
		if err != nil {
			return nil, err
		}
		// Compare against the observed lease so an unseen successor survives.
		if cur == nil || cur.LeaseID != req.LeaseID || cur.FencingToken != req.FencingToken {
			return nil, refuse(lease.Lost(now))
		}
		if !cur.LiveAt(now) {
			return nil, s.lostExpired(t, cur, now)
		}
		return cur, nil
	}, ended{by: req.Caller.PrincipalID, requestID: req.RequestID, reason: req.Reason, incident: req.IncidentID})
}

// end runs a terminal transition: match finds the lease to end (or
// refuses), then the lease is archived in state.
func (s *Store) end(ctx context.Context, p lease.Prepared, at time.Time, code lease.Code, state lease.State,
	match func(*txn, lease.Timestamp) (*lease.Record, error), why ended) (lease.Result, error) {
	return s.mutation(ctx, p, at, func(t *txn, now lease.Timestamp) (lease.Result, error) {
		cur, err := match(t, now)
		if err != nil {
			return lease.Result{}, err
		}
		final := cur.Clone()
		final.State = state
		if err := s.archive(t, cur, state, now, why); err != nil {
			return lease.Result{}, err
		}
		return lease.Result{Code: code, Lease: final, BackendTime: now}, nil
	})
}

// identityKeys are what an operation on one identity may read, fetched in
// its first round trip.
func (s *Store) identityKeys(lockKey string, more ...string) []string {
	return append([]string{s.keys.gate(), s.keys.time(lockKey), s.keys.active(lockKey), s.keys.counter(lockKey),
		s.keys.historySeq(lockKey), s.keys.floor()}, more...)
}

// open starts an attempt on one identity: it reads the identity's keys
// (and more) in one round trip, refuses in a closed namespace, and returns
// backend time for the identity.
func (s *Store) open(t *txn, lockKey string, more ...string) (lease.Timestamp, error) {
	if err := t.fetch(s.identityKeys(lockKey, more...)...); err != nil {
		return lease.Timestamp{}, err
	}
	if gate := t.seen[s.keys.gate()].val; gate != nil {
		return lease.Timestamp{}, lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed: %s", gate)
	}
	recorded, ok := readU64(t.seen[s.keys.time(lockKey)].val)
	if !ok {
		recorded = 0 // a malformed time is rewritten by the next transition
	}
	return s.identityTime(int64(recorded)), nil
}

// stamp records now as the identity's time, in the attempt's transaction.
func (s *Store) stamp(t *txn, lockKey string, now lease.Timestamp) {
	k := s.keys.time(lockKey)
	t.put(k, u64(uint64(now.UnixMilli())))
	t.clocks[k] = true
}

// mutation runs lease mutation p in attempts: each opens at backend time,
// so a request past its deadline or answered by its evidence goes no
// further; then op decides, and its result is remembered as evidence in
// the same transaction.
func (s *Store) mutation(ctx context.Context, p lease.Prepared, at time.Time,
	op func(*txn, lease.Timestamp) (lease.Result, error)) (lease.Result, error) {
	due := lease.Deadline(ctx, at)
	return change(s, ctx, func(t *txn) (lease.Result, error) {
		now, err := s.open(t, p.LockKey, s.keys.idem(p.Scope))
		if err != nil {
			return lease.Result{}, err
		}
		if err := s.pastDeadline(due); err != nil {
			return lease.Result{}, err
		}
		// Every answer decided at now records it, refusals and replays
		// included, so no transition that commits after this attempt's
		// read can carry an earlier time (see "Backend time").
		s.stamp(t, p.LockKey, now)
		if v := t.seen[s.keys.idem(p.Scope)].val; v != nil && !isTombstone(v) {
			ev, err := p.DecodeEvidence(v)
			if err != nil {
				return lease.Result{}, s.quarantine(t, p.LockKey, p.Identity, "idempotency evidence is corrupt")
			}
			r, err := p.Replay(ev, now, func(orig *lease.Record) (*lease.Record, error) { return s.currentOf(t, orig, now) })
			return r, refuse(err)
		}
		res, err := op(t, now)
		if err != nil {
			return lease.Result{}, err
		}
		return res, s.remember(t, p, res)
	})
}

// currentOf finds the state now of a lease: active, or its terminal record.
func (s *Store) currentOf(t *txn, orig *lease.Record, now lease.Timestamp) (*lease.Record, error) {
	cur, err := s.loadActive(t, orig.LockKey)
	if err != nil {
		return nil, err
	}
	// The history is read only when CurrentOf asks for it: the active
	// record is not this lease's.
	var readErr error
	state := lease.CurrentOf(orig, cur, now, func() *lease.HistoryEntry {
		var h *lease.HistoryEntry
		h, readErr = s.findHistory(t, orig.LockKey, orig.LeaseID)
		return h
	})
	if readErr != nil {
		return nil, readErr
	}
	return state, nil
}

// held returns the active lease matching every ownership field and
// unexpired at now; otherwise it refuses with lease_lost (or corrupt),
// archiving an expired match so it is never seen as active.
func (s *Store) held(t *txn, lockKey string, now lease.Timestamp, leaseID string, token uint64, owner, instance string) (*lease.Record, error) {
	cur, err := s.loadActive(t, lockKey)
	if err != nil {
		return nil, err
	}
	if cur == nil || !cur.HeldBy(leaseID, token, owner, instance) {
		return nil, refuse(lease.Lost(now))
	}
	if !cur.LiveAt(now) {
		return nil, s.lostExpired(t, cur, now)
	}
	return cur, nil
}

// lostExpired archives cur, a match that expired, and refuses with
// lease_lost. The archive records that the identity's time reached the
// expiry, so no server with a clock behind can renew it afterwards.
func (s *Store) lostExpired(t *txn, cur *lease.Record, now lease.Timestamp) error {
	if err := s.archive(t, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
		return err
	}
	return refuse(lease.Lost(now))
}

// remember stores the typed result as idempotency evidence in the same
// transaction as the mutation, with its expiry index entry.
func (s *Store) remember(t *txn, p lease.Prepared, res lease.Result) error {
	ev := &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: p.Op, Digest: p.Digest,
		Code: res.Code, Lease: res.Lease, BackendTime: res.BackendTime}
	b, err := ev.Encode()
	if err != nil {
		return err
	}
	if ms, ok := tombstoneExpiry(t.seen[s.keys.idem(p.Scope)].val); ok {
		// The tombstone's retention entry would drop this evidence.
		t.del(s.keys.expiry(idemExpiry, ms, p.Scope))
	}
	t.put(s.keys.idem(p.Scope), b)
	exp := res.BackendTime.Add(s.opts.IdempotencyRetention).UnixMilli()
	t.put(s.keys.expiry(idemExpiry, exp, p.Scope), nil)
	return nil
}

// A tombstone stands where a request's evidence would be once a lookup
// answered not found: "\x00tombstone:" and its retention end (16 hex ms).
const tombstonePrefix = "\x00tombstone:"

// tombstone puts a tombstone for scope, kept like evidence.
func (s *Store) tombstone(t *txn, scope string, now lease.Timestamp) {
	exp := now.Add(s.opts.IdempotencyRetention).UnixMilli()
	t.put(s.keys.idem(scope), []byte(tombstonePrefix+hex16(uint64(exp))))
	t.put(s.keys.expiry(idemExpiry, exp, scope), nil)
}

func isTombstone(v []byte) bool { return strings.HasPrefix(string(v), tombstonePrefix) }

// tombstoneExpiry is the retention end of tombstone v; ok is false if v is
// not one.
func tombstoneExpiry(v []byte) (int64, bool) {
	h, ok := strings.CutPrefix(string(v), tombstonePrefix)
	if !ok {
		return 0, false
	}
	ms, err := strconv.ParseUint(h, 16, 64)
	return int64(ms), err == nil
}

// loadActive strictly decodes the active record of lockKey; nil if none. A
// record that fails decoding is quarantined and refused as corrupt.
func (s *Store) loadActive(t *txn, lockKey string) (*lease.Record, error) {
	v, err := t.get(s.keys.active(lockKey))
	if err != nil || v == nil {
		return nil, err
	}
	rec, err := lease.DecodeRecord(v)
	if err == nil && rec.LockKey != lockKey {
		err = lease.Errorf(lease.CodeCorrupt, "record: stored under a foreign lock key")
	}
	if err != nil {
		return nil, s.quarantine(t, lockKey, lease.Identity{}, lease.AsError(err).Reason)
	}
	return rec, nil
}

// quarantine records a corrupt identity for operators and alerts; the
// value itself is never overwritten. It returns the refusal.
func (s *Store) quarantine(t *txn, lockKey string, id lease.Identity, reason string) error {
	if lockKey != "" {
		t.put(s.keys.quarantine(lockKey), []byte(reason))
	}
	return refuse(lease.CorruptState(s.log, id, reason))
}

// putActive writes rec as the active record and its expiry index entry,
// replacing prev's (nil for a new lease).
func (s *Store) putActive(t *txn, rec, prev *lease.Record) error {
	b, err := rec.Encode()
	if err != nil {
		return err
	}
	if prev != nil {
		t.del(s.activeExpiry(prev))
	}
	t.put(s.keys.active(rec.LockKey), b)
	t.put(s.activeExpiry(rec), []byte(rec.LeaseID+"\x00"+strconv.FormatUint(rec.FencingToken, 10)))
	return nil
}

// activeExpiry is the reaper's index entry of an active record: ordered by
// expires_at, naming the identity and the lease it is for (so a successor
// expiring in the same millisecond has an entry of its own).
func (s *Store) activeExpiry(rec *lease.Record) string {
	return s.keys.expiry(activeExpiry, rec.ExpiresAt.UnixMilli(), rec.LockKey+"/"+rec.LeaseID)
}

const activeExpiry = "ae"

// ended says who ended a lease and why.
type ended struct{ by, requestID, reason, incident string }

// archive moves the active record cur to history in state, at endedAt. The
// caller has read cur in this attempt, so the removal is conditional on it.
func (s *Store) archive(t *txn, cur *lease.Record, state lease.State, endedAt lease.Timestamp, why ended) error {
	final := cur.Clone()
	final.State = state
	h := &lease.HistoryEntry{HistoryVersion: lease.HistoryVersion, Record: final, EndedAt: endedAt,
		EndedBy: why.by, RequestID: why.requestID, Reason: why.reason, IncidentID: why.incident}
	b, err := h.Encode()
	if err != nil {
		return err
	}
	seq, ok, err := t.getU64(s.keys.historySeq(cur.LockKey))
	if err != nil {
		return err
	}
	if !ok {
		return s.quarantine(t, cur.LockKey, cur.Identity(), "history sequence is malformed")
	}
	seq++
	t.put(s.keys.historySeq(cur.LockKey), u64(seq))
	t.put(s.keys.history(cur.LockKey, seq), b)
	t.put(s.keys.expiry(historyExpiry, endedAt.UnixMilli(), cur.LockKey+"/"+hex16(seq)), []byte(cur.LeaseID))
	// Only the newest HistoryPerIdentity entries are kept: the one that
	// falls out goes now (its lease-id entry with retention).
	if keep := uint64(s.opts.HistoryPerIdentity); seq > keep {
		t.del(s.keys.history(cur.LockKey, seq-keep))
	}
	t.del(s.keys.active(cur.LockKey))
	t.del(s.activeExpiry(cur))
	for _, k := range s.indexKeys(cur) {
		t.del(k)
	}
	t.put(s.keys.leaseID(cur.LeaseID), leaseLocation(cur.LockKey, seq))
	return nil
}

// leaseLocation is the value of a lease-id entry: the lock key and the
// history sequence of the lease's terminal evidence (0 while active).
func leaseLocation(lockKey string, seq uint64) []byte {
	return []byte(lockKey + "\x00" + hex16(seq))
}

// parseLeaseLocation reads a lease-id entry; ok is false if malformed.
func parseLeaseLocation(v []byte) (lockKey string, seq uint64, ok bool) {
	k, h, found := strings.Cut(string(v), "\x00")
	if !found || len(h) != 16 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(h, 16, 64)
	return k, n, err == nil
}

// findHistory finds the terminal evidence of leaseID under lockKey.
func (s *Store) findHistory(t *txn, lockKey, leaseID string) (*lease.HistoryEntry, error) {
	v, err := t.get(s.keys.leaseID(leaseID))
	if err != nil || v == nil {
		return nil, err
	}
	k, seq, ok := parseLeaseLocation(v)
	if !ok || k != lockKey || seq == 0 {
		return nil, nil
	}
	raw, err := t.get(s.keys.history(lockKey, seq))
	if err != nil || raw == nil {
		return nil, err
	}
	if h := lease.MatchHistory(raw, leaseID); h != nil && h.Record.LockKey == lockKey {
		return h, nil
	}
	return nil, nil
}

// indexKeys are the List index entries of an active record.
func (s *Store) indexKeys(r *lease.Record) []string {
	var keys []string
	for _, f := range lease.FiltersOf(r) {
		keys = append(keys, s.keys.index(f, r.LeaseID))
	}
	return keys
}
