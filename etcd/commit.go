package etcd

import (
	"context"

	"github.com/starintel/starlease/lease"
)

// AuthorizeCommit validates, at the linearization point, that the exact
// lease is active and unexpired and its token is not below the sink's
// high-water mark, then records the accepted commit, raises the mark and
// (with an outbox message) appends the publication, all in one
// transaction.
func (s *Store) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	req, p, err := lease.PrepareCommit(req, s.opts)
	if err != nil {
		return lease.CommitResult{}, err
	}
	due := lease.Deadline(ctx, req.DeadlineAt)
	markKey, seqKey, commitKey := s.keys.highWater(p.LockKey, req.Sink), s.keys.commitSeq(p.LockKey), s.keys.commit(p.Scope)
	if req.ReplayOnly {
		return s.replayCommit(ctx, p, due, commitKey)
	}
	more := []string{commitKey, markKey, seqKey}
	if req.Outbox != nil {
		more = append(more, s.keys.outboxSeq(), s.keys.outboxUsage(), s.keys.outboxID(lease.OutboxMessageID(p.Scope)))
	}
	return change(s, ctx, func(t *txn) (lease.CommitResult, error) {
		now, err := s.open(t, p.LockKey, more...)
		if err != nil {
			return lease.CommitResult{}, err
		}
		if err := s.pastDeadline(due); err != nil {
			return lease.CommitResult{}, err
		}
		s.stamp(t, p.LockKey, now) // every answer records its time (see "Backend time")
		if v := t.seen[commitKey].val; v != nil {
			c, err := lease.DecodeCommit(v)
			switch {
			case err != nil:
				return lease.CommitResult{}, s.quarantine(t, p.LockKey, p.Identity, "accepted-commit evidence is corrupt")
			case c.Digest != p.Digest:
				return lease.CommitResult{}, refuse(lease.CommitIdempotencyConflict(now))
			}
			return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: now}, nil
		}
		return s.authorize(t, req, p, now, markKey, seqKey, commitKey)
	})
}

// replayCommit answers a ReplayOnly commit p from its accepted-commit
// evidence alone, as a read: like LookupRequest it records only the
// identity's time (see "Backend time"), never evidence, a mark, a sequence
// or a quarantine mark, and it does not check the lease.
func (s *Store) replayCommit(ctx context.Context, p lease.PreparedCommit, due lease.Timestamp, commitKey string) (lease.CommitResult, error) {
	return observe(s, ctx, func(t *txn) (lease.CommitResult, error) {
		now, err := s.readAt(t, p.LockKey, due, commitKey)
		if err != nil {
			return lease.CommitResult{}, refuse(err)
		}
		v := t.seen[commitKey].val
		if v == nil {
			return lease.CommitResult{}, refuse(lease.RequestNotFound(now))
		}
		c, err := lease.DecodeCommit(v)
		switch {
		case err != nil:
			return lease.CommitResult{}, refuse(lease.CorruptState(s.log, p.Identity, "accepted-commit evidence is corrupt"))
		case c.Digest != p.Digest:
			return lease.CommitResult{}, refuse(lease.CommitIdempotencyConflict(now))
		}
		return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: now}, nil
	})
}

// authorize decides a new commit in attempt t: every check that can refuse
// runs before the first write.
func (s *Store) authorize(t *txn, req lease.CommitRequest, p lease.PreparedCommit, now lease.Timestamp,
	markKey, seqKey, commitKey string) (lease.CommitResult, error) {
	cur, err := s.held(t, p.LockKey, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID)
	if err != nil {
		return lease.CommitResult{}, err
	}
	if cur.ExecutionID != req.ExecutionID || cur.JobID != req.JobID {
		// A guard names the lease's own execution and job, never another
		// one the caller claims.
		return lease.CommitResult{}, refuse(lease.Lost(now))
	}
	mark, ok, err := t.getU64(markKey)
	if err != nil {
		return lease.CommitResult{}, err
	}
	if !ok {
		return lease.CommitResult{}, s.quarantine(t, p.LockKey, p.Identity, "high-water mark is malformed")
	}
	if req.FencingToken < mark {
		return lease.CommitResult{}, refuse(lease.CommitRejected(s.log, p.Identity, now))
	}
	seq, ok, err := t.getU64(seqKey)
	switch {
	case err != nil:
		return lease.CommitResult{}, err
	case !ok:
		return lease.CommitResult{}, s.quarantine(t, p.LockKey, p.Identity, "commit sequence is malformed")
	case seq >= lease.MaxFencingToken:
		return lease.CommitResult{}, s.quarantine(t, p.LockKey, p.Identity, "commit sequence is exhausted")
	}
	var room *outboxRoom
	if req.Outbox != nil {
		// The outbox's bounds, in the same transaction as the append: a
		// full outbox refuses before anything is written.
		if room, err = s.outboxRoomFor(t, req.Outbox, now); err != nil {
			return lease.CommitResult{}, err
		}
	}
	seq++
	t.put(markKey, u64(req.FencingToken))
	t.put(seqKey, u64(seq))
	c := req.Commit(now, seq, p.Digest)
	b, err := lease.EncodeCommit(c)
	if err != nil {
		return lease.CommitResult{}, err
	}
	t.put(commitKey, b)
	t.put(s.keys.expiry(commitExpiry, now.Add(s.opts.CommitRetention).UnixMilli(), p.Scope), nil)
	if room != nil {
		if err := s.putOutbox(t, room, lease.OutboxEntry{MessageID: lease.OutboxMessageID(p.Scope), Identity: p.Identity,
			LockKey: p.LockKey, LeaseID: req.LeaseID, FencingToken: req.FencingToken, ExecutionID: req.ExecutionID,
			TraceID: req.TraceID, Sink: req.Sink, CommitID: req.CommitID, AcceptedAt: now, Message: *req.Outbox}); err != nil {
			return lease.CommitResult{}, err
		}
	}
	return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, BackendTime: now}, nil
}
