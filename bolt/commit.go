package bolt

import (
	"context"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// AuthorizeCommit validates, at the linearization point, that the exact
// lease is active and unexpired and its token is not below the sink's
// high-water mark, then records the accepted commit and raises the mark.
func (s *Store) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	req, p, err := lease.PrepareCommit(req, s.opts)
	if err != nil {
		return lease.CommitResult{}, err
	}
	due := lease.Deadline(ctx, req.DeadlineAt)
	if req.ReplayOnly {
		// A read transaction: it answers from the evidence and cannot
		// write (no clock, mark, sequence or quarantine).
		return read(s, ctx, due, func(tx *layered.View, now lease.Timestamp) (lease.CommitResult, error) {
			res, found, err := s.commitReplay(tx, p, now)
			if err == nil && !found {
				err = lease.RequestNotFound(now)
			}
			return res, err
		})
	}
	return change(s, ctx, func(tx *layered.View) (lease.CommitResult, error) {
		now := s.clock(tx)
		if err := lease.PastDeadline(now, due); err != nil {
			return lease.CommitResult{}, refuse(err)
		}
		if res, found, err := s.commitReplay(tx, p, now); found {
			return res, refuse(err)
		}
		cur, err := s.held(tx, p.LockKey, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID)
		if err != nil {
			return lease.CommitResult{}, err
		}
		if cur.ExecutionID != req.ExecutionID || cur.JobID != req.JobID {
			// A guard names the lease's own execution and job, never
			// another one the caller claims.
			return lease.CommitResult{}, refuse(lease.Lost(now))
		}
		commits := tx.Bucket(bucketCommits)
		marks := tx.Bucket(bucketHighWater)
		markKey := join(p.LockKey, req.Sink)
		mark, ok := counterAt(marks, markKey)
		if !ok {
			return lease.CommitResult{}, refuse(s.quarantine(tx, p.LockKey, p.Identity, "high-water mark is malformed"))
		}
		if req.FencingToken < mark {
			return lease.CommitResult{}, refuse(lease.CommitRejected(s.log, p.Identity, now))
		}
		seqs := tx.Bucket(bucketCommitSeq)
		seq, ok := counterAt(seqs, []byte(p.LockKey))
		switch {
		case !ok:
			return lease.CommitResult{}, refuse(s.quarantine(tx, p.LockKey, p.Identity, "commit sequence is malformed"))
		case seq >= lease.MaxFencingToken:
			return lease.CommitResult{}, refuse(s.quarantine(tx, p.LockKey, p.Identity, "commit sequence is exhausted"))
		}
		if req.Outbox != nil {
			// The outbox's bounds, in the same transaction as the append:
			// a full outbox refuses before anything is written.
			pending, bytes := outboxUsage(tx)
			if full := s.opts.OutboxRoom(pending, bytes, req.Outbox.Size()); full != nil {
				full.BackendTime = now.Time()
				return lease.CommitResult{}, refuse(full)
			}
		}
		// Every check that can refuse has run: the writes follow.
		seq++
		if err := marks.Put(markKey, u64(req.FencingToken)); err != nil {
			return lease.CommitResult{}, err
		}
		if err := seqs.Put([]byte(p.LockKey), u64(seq)); err != nil {
			return lease.CommitResult{}, err
		}
		c := req.Commit(now, seq, p.Digest)
		b, err := lease.EncodeCommit(c)
		if err != nil {
			return lease.CommitResult{}, err
		}
		if err := commits.Put([]byte(p.Scope), b); err != nil {
			return lease.CommitResult{}, err
		}
		exp := now.Add(s.opts.CommitRetention).UnixMilli()
		if err := tx.Bucket(bucketCommitExp).Put(append(u64(uint64(exp)), p.Scope...), nil); err != nil {
			return lease.CommitResult{}, err
		}
		if req.Outbox != nil {
			if err := putOutbox(tx, lease.OutboxEntry{MessageID: lease.OutboxMessageID(p.Scope), Identity: p.Identity,
				LockKey: p.LockKey, LeaseID: req.LeaseID, FencingToken: req.FencingToken, ExecutionID: req.ExecutionID,
				TraceID: req.TraceID, Sink: req.Sink, CommitID: req.CommitID, AcceptedAt: now, Message: *req.Outbox}); err != nil {
				return lease.CommitResult{}, err
			}
		}
		return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, BackendTime: now}, nil
	})
}

// commitReplay answers commit p from its accepted-commit evidence in tx,
// if there is any (found): the replay, or idempotency_conflict if the
// inputs differ. Corrupt evidence quarantines the lock key (in a write
// transaction only) and fails closed.
func (s *Store) commitReplay(tx *layered.View, p lease.PreparedCommit, now lease.Timestamp) (res lease.CommitResult, found bool, err error) {
	v := tx.Bucket(bucketCommits).Get([]byte(p.Scope))
	if v == nil {
		return lease.CommitResult{}, false, nil
	}
	c, err := lease.DecodeCommit(v)
	switch {
	case err != nil:
		return lease.CommitResult{}, true, s.quarantine(tx, p.LockKey, p.Identity, "accepted-commit evidence is corrupt")
	case c.Digest != p.Digest:
		return lease.CommitResult{}, true, lease.CommitIdempotencyConflict(now)
	}
	return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: now}, true, nil
}
