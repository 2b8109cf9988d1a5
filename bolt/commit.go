package bolt

import (
	"context"

	bbolt "go.etcd.io/bbolt"

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
	due := deadline(ctx, req.DeadlineAt)
	var res lease.CommitResult
	var opErr error
	err = s.mutate(ctx, func(tx *bbolt.Tx) error {
		res, opErr = lease.CommitResult{}, nil
		now := s.clock(tx)
		if opErr = pastDeadline(now, due); opErr != nil {
			return nil
		}
		commits := tx.Bucket(bucketCommits)
		if v := commits.Get([]byte(p.Scope)); v != nil {
			c, err := lease.DecodeCommit(v)
			switch {
			case err != nil:
				opErr = s.quarantine(tx, p.LockKey, p.Identity, "accepted-commit evidence is corrupt")
			case c.Digest != p.Digest:
				opErr = &lease.Error{Code: lease.CodeIdempotencyConflict, Reason: "commit id was reused with different inputs", BackendTime: now.Time()}
			default:
				res = lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: now}
			}
			return nil
		}
		mp := lease.Prepared{LockKey: p.LockKey, Identity: p.Identity}
		cur, err := s.held(tx, mp, now, req.LeaseID, req.FencingToken, req.Caller.PrincipalID, req.ServiceInstanceID, &opErr)
		if cur == nil || err != nil {
			return err
		}
		if cur.ExecutionID != req.ExecutionID || cur.JobID != req.JobID {
			// A guard names the lease's own execution and job, never
			// another one the caller claims.
			opErr = lost(now)
			return nil
		}
		marks := tx.Bucket(bucketHighWater)
		markKey := join(p.LockKey, req.Sink)
		mark, ok := counterAt(marks, markKey)
		if !ok {
			opErr = s.quarantine(tx, p.LockKey, p.Identity, "high-water mark is malformed")
			return nil
		}
		if req.FencingToken < mark {
			s.log.Error("ALERT commit token below the sink's high-water mark", identityAttrs(p.Identity)...)
			opErr = &lease.Error{Code: lease.CodeCommitRejected, Reason: "fencing token is below the sink's high-water mark", BackendTime: now.Time()}
			return nil
		}
		seqs := tx.Bucket(bucketCommitSeq)
		seq, ok := counterAt(seqs, []byte(p.LockKey))
		switch {
		case !ok:
			opErr = s.quarantine(tx, p.LockKey, p.Identity, "commit sequence is malformed")
			return nil
		case seq >= lease.MaxFencingToken:
			opErr = s.quarantine(tx, p.LockKey, p.Identity, "commit sequence is exhausted")
			return nil
		}
		if req.Outbox != nil {
			// The outbox's bounds, in the same transaction as the append:
			// a full outbox refuses before anything is written.
			pending, bytes := outboxUsage(tx)
			if full := s.opts.OutboxRoom(pending, bytes, req.Outbox.Size()); full != nil {
				full.BackendTime = now.Time()
				opErr = full
				return nil
			}
		}
		// Every check that can refuse has run: the writes follow.
		seq++
		if err := marks.Put(markKey, u64(req.FencingToken)); err != nil {
			return err
		}
		if err := seqs.Put([]byte(p.LockKey), u64(seq)); err != nil {
			return err
		}
		c := req.Commit(now, seq, p.Digest)
		b, err := lease.EncodeCommit(c)
		if err != nil {
			return err
		}
		if err := commits.Put([]byte(p.Scope), b); err != nil {
			return err
		}
		exp := now.Add(s.opts.CommitRetention).UnixMilli()
		if err := tx.Bucket(bucketCommitExp).Put(append(u64(uint64(exp)), p.Scope...), nil); err != nil {
			return err
		}
		if req.Outbox != nil {
			if err := putOutbox(tx, lease.OutboxEntry{MessageID: lease.OutboxMessageID(p.Scope), Identity: p.Identity,
				LockKey: p.LockKey, LeaseID: req.LeaseID, FencingToken: req.FencingToken, ExecutionID: req.ExecutionID,
				TraceID: req.TraceID, Sink: req.Sink, CommitID: req.CommitID, AcceptedAt: now, Message: *req.Outbox}); err != nil {
				return err
			}
		}
		res = lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, BackendTime: now}
		return nil
	})
	if err != nil {
		return lease.CommitResult{}, err
	}
	if opErr != nil {
		return lease.CommitResult{}, opErr
	}
	return res, nil
}
