package service

import (
	"context"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Acquire grants a lease to the caller. It is non-blocking unless in.Wait
// asks for bounded retry on conflict: then it retries with jittered
// backoff until the earliest of the wait, the configured maximum wait and
// the deadline — never an unbounded wait or queue.
func (s *Service) Acquire(ctx context.Context, c Call, in AcquireInput) (lease.Result, error) {
	o := s.begin(audit.EventAcquire, c)
	o.ev.RequestedTTLMS = max(in.TTL.Milliseconds(), 0)
	o.ev.ServiceInstanceID, o.ev.ExecutionID = safeID(in.ServiceInstanceID), safeID(in.ExecutionID)
	o.ev.JobID, o.ev.TraceID = safeID(in.JobID), safeID(in.TraceID)
	res, err := s.acquire(ctx, o, in)
	if err == nil && !res.Replayed {
		s.active.add(c.Principal.ID, 1)
	}
	o.lease(res.Lease)
	return res, o.finish(ctx, err)
}

func (s *Service) acquire(ctx context.Context, o *op, in AcquireInput) (lease.Result, error) {
	id, err := s.scoped(o, in.Identity, auth.AuthorizeAcquire)
	if err != nil {
		return lease.Result{}, err
	}
	if err := s.cfg.checkTTL("ttl_ms", in.TTL); err != nil {
		return lease.Result{}, err
	}
	lifetime := in.MaximumLifetime
	switch {
	case lifetime == 0:
		lifetime = s.cfg.MaxLifetime
	case lifetime < 0 || lifetime > s.cfg.MaxLifetime:
		return lease.Result{}, lease.Invalid("maximum_lifetime_ms", "must be positive and at most the configured maximum lifetime")
	}
	if in.Wait < 0 {
		return lease.Result{}, lease.Invalid("wait_ms", "must not be negative")
	}
	m, ctx, cancel := o.mutation(ctx)
	defer cancel()
	req := lease.AcquireRequest{Identity: id, ServiceInstanceID: in.ServiceInstanceID, TTL: in.TTL,
		MaximumLifetime: lifetime, ExecutionID: in.ExecutionID, JobID: in.JobID, TraceID: in.TraceID,
		Metadata: in.Metadata, Mutation: m}
	if _, _, err := lease.PrepareAcquire(req, lease.StoreOptions{OperationClasses: s.classes}); err != nil {
		return lease.Result{}, err // bad input changes nothing and spends no quota
	}
	limit := s.throttle(o.call.Principal, id, false)
	if limit == nil {
		limit = s.checkQuota(ctx, o.call.Principal, m.DeadlineAt)
	}
	if err := s.unlessReplay(ctx, lease.OpAcquire, id, m, limit); err != nil {
		return lease.Result{}, err
	}
	waitUntil := s.now().Add(min(in.Wait, s.cfg.MaxWait))
	var conflictRes lease.Result
	var conflict error
	for attempt := 0; ; attempt++ {
		res, err := s.call(func() (lease.Result, error) { return s.store.Acquire(ctx, req) })
		if conflict != nil && lease.CodeOf(err) == lease.CodeDeadlineExceeded {
			// The deadline passed while the retry waited its turn (a late
			// timer, a busy machine) and the retry changed nothing: the
			// answer is still the conflict the wait was bounded by.
			return conflictRes, conflict
		}
		if lease.CodeOf(err) != lease.CodeConflict || in.Wait == 0 {
			return res, err
		}
		conflictRes, conflict = res, err
		// The same request id is safe to reuse: a conflict stores nothing.
		pause := s.cfg.backoff(attempt)
		if hint := lease.AsError(err).RetryAfter; hint > 0 && hint < pause {
			pause = hint
		}
		if next := s.now().Add(pause); next.After(waitUntil) || !next.Before(m.DeadlineAt) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(pause):
		}
	}
}

// checkQuota refuses an acquisition when the principal already holds its
// quota of active leases. Counting in the store costs a page read per
// hundred leases, so it runs only once this instance's estimate (its own
// acquisitions minus its own releases; expiries are not seen, so the
// estimate only errs high) reaches the quota, and then resets the estimate
// to the count. Several instances each enforce the quota on their own
// view of a principal's acquisitions.
func (s *Service) checkQuota(ctx context.Context, p auth.Principal, deadline time.Time) error {
	if s.active.get(p.ID) < s.cfg.MaxActivePerPrincipal {
		return nil
	}
	n, err := s.countActive(ctx, p, deadline)
	if err != nil {
		return err
	}
	s.active.set(p.ID, n)
	if n >= s.cfg.MaxActivePerPrincipal {
		return &lease.Error{Code: lease.CodeRateLimited, Reason: "active lease quota reached", RetryAfter: time.Second}
	}
	return nil
}

// unlessReplay returns refused, a rate limit's or quota's refusal of a
// mutation, unless the request id already has stored evidence: the retry
// of a committed request (how a client resolves outcome_unknown) must get
// its result, not 429. The store is asked only once a limit refused, so
// the common path pays nothing. With evidence present the store's own
// replay path answers (the original result if the inputs' digest matches,
// idempotency_conflict if not) and mutates nothing, so letting the request
// past the limit spends nothing the limit protects.
func (s *Service) unlessReplay(ctx context.Context, op lease.Op, id lease.Identity, m lease.Mutation, refused error) error {
	if lease.CodeOf(refused) != lease.CodeRateLimited {
		return refused
	}
	_, err := s.call(func() (lease.Result, error) {
		return s.store.LookupRequest(ctx, lease.LookupRequest{Op: op, Identity: id, PrincipalID: m.Caller.PrincipalID,
			RequestID: m.RequestID, DeadlineAt: m.DeadlineAt})
	})
	if err != nil {
		return refused // no evidence, or no answer: the refusal stands
	}
	return nil
}

// countActive counts the principal's active leases, up to the quota.
func (s *Service) countActive(ctx context.Context, p auth.Principal, deadline time.Time) (int, error) {
	held, token := 0, ""
	for {
		page, err := s.store.List(ctx, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: p.ID,
			PageToken: token, DeadlineAt: deadline})
		if err != nil {
			return 0, err
		}
		held += len(page.Leases)
		if token = page.NextPageToken; token == "" || held >= s.cfg.MaxActivePerPrincipal {
			return held, nil
		}
	}
}

// call runs one store operation under the admission cap.
func (s *Service) call(fn func() (lease.Result, error)) (lease.Result, error) {
	done, err := s.admit()
	if err != nil {
		return lease.Result{}, err
	}
	defer done()
	return fn()
}

// Renew extends a lease the caller holds. The store matches identity,
// lease id, owner (the caller), instance and token atomically, which is
// authorization against the stored lease; a mismatch is lease_lost, so a
// caller learns nothing about a lease it does not hold.
func (s *Service) Renew(ctx context.Context, c Call, in HeldInput) (lease.Result, error) {
	o := s.begin(audit.EventRenew, c)
	o.ev.RequestedTTLMS = max(in.TTL.Milliseconds(), 0)
	o.ev.ServiceInstanceID = safeID(in.ServiceInstanceID)
	res, err := s.held(ctx, o, in, true)
	o.lease(res.Lease)
	return res, o.finish(ctx, err)
}

// Release ends a lease the caller holds (compare-and-delete).
func (s *Service) Release(ctx context.Context, c Call, in HeldInput) (lease.Result, error) {
	o := s.begin(audit.EventRelease, c)
	o.ev.ServiceInstanceID = safeID(in.ServiceInstanceID)
	res, err := s.held(ctx, o, in, false)
	if err == nil && !res.Replayed {
		s.active.add(c.Principal.ID, -1)
	}
	o.lease(res.Lease)
	return res, o.finish(ctx, err)
}

func (s *Service) held(ctx context.Context, o *op, in HeldInput, renew bool) (lease.Result, error) {
	// Capability and scope of the identity the store will match exactly;
	// ownership is the store's atomic check.
	id, err := s.scoped(o, in.Identity, auth.AuthorizeAcquire)
	if err != nil {
		return lease.Result{}, err
	}
	o.ev.PreviousState = lease.StateActive
	m, ctx, cancel := o.mutation(ctx)
	defer cancel()
	if renew {
		if in.TTL != 0 {
			if err := s.cfg.checkTTL("ttl_ms", in.TTL); err != nil {
				return lease.Result{}, err
			}
		}
		if err := s.unlessReplay(ctx, lease.OpRenew, id, m, s.throttle(o.call.Principal, id, true)); err != nil {
			return lease.Result{}, err
		}
	}
	return s.call(func() (lease.Result, error) {
		if renew {
			return s.store.Renew(ctx, lease.RenewRequest{Identity: id, LeaseID: in.LeaseID, FencingToken: in.FencingToken,
				ServiceInstanceID: in.ServiceInstanceID, TTL: in.TTL, Mutation: m})
		}
		return s.store.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: in.LeaseID, FencingToken: in.FencingToken,
			ServiceInstanceID: in.ServiceInstanceID, Mutation: m})
	})
}

// ForceRelease ends the observed lease with the operational terminal state.
func (s *Service) ForceRelease(ctx context.Context, c Call, in AdminInput) (lease.Result, error) {
	return s.admin(ctx, audit.EventForceRelease, c, in)
}

// Revoke ends the observed lease with the security terminal state.
func (s *Service) Revoke(ctx context.Context, c Call, in AdminInput) (lease.Result, error) {
	return s.admin(ctx, audit.EventRevoke, c, in)
}

// admin runs force-release or revoke. Order, so that no invalidation is
// ever reported without durable audit:
//
//  1. authorize (targets:force-release and an administrator credential,
//     identity in scope) and validate (reason or incident id, bounded);
//  2. write a durable high-priority event with result lease_outcome_unknown
//     (the attempt): if that fails, nothing is done and the request fails
//     with lease_backend_unavailable — the lease is untouched;
//  3. the store operation (the fenced-write boundary rejects the lease from
//     its commit on, since every commit checks the same active record);
//  4. the durable result event: if that fails after the store committed,
//     the request reports lease_outcome_unknown; the lease IS invalidated
//     (the safe direction) and a retry with the same request id replays the
//     result and writes its event.
func (s *Service) admin(ctx context.Context, t audit.EventType, c Call, in AdminInput) (lease.Result, error) {
	o := s.begin(t, c)
	// A reason or incident id that may hold credential material (a pasted
	// key, a 64-hex digest quoting a target) is stored, returned by
	// history and audited in its keyed redacted form: the record never
	// holds it, and no text an administrator chooses can block the action.
	// Redaction is deterministic, so a retry keeps its idempotency digest;
	// the event keeps the original, which writeAudit redacts to the same
	// form (redacting the redacted form again would hash it anew).
	//
	// The event takes the original whenever the value stored is valid —
	// also when only its redacted form is (a secret-shaped reason over
	// 512 bytes, an incident id with a space): the event then holds what
	// the record holds, never nothing (an allowed admin event without a
	// reason or incident id is invalid, and its refusal read as "audit is
	// unavailable", 503).
	rawReason, rawIncident := in.Reason, in.IncidentID
	in.Reason, in.IncidentID = s.redactor.Value(in.Reason), s.redactor.Value(in.IncidentID)
	if safeReason(in.Reason) != "" {
		o.ev.Reason = rawReason
	}
	if safeID(in.IncidentID) != "" {
		o.ev.IncidentID = rawIncident
	}
	res, err := s.adminOp(ctx, o, t, in)
	if err == nil && !res.Replayed {
		s.active.add(res.Lease.OwnerPrincipalID, -1)
	}
	o.lease(res.Lease)
	o.result(err)
	if werr := s.writeAudit(ctx, &o.ev); werr != nil {
		s.log.Error("durable audit of an administrative result failed", "event_type", t, "correlation_id", o.call.CorrelationID)
		if err == nil {
			return lease.Result{}, &lease.Error{Code: lease.CodeOutcomeUnknown,
				Reason: "the operation committed but its audit event could not be written; retry with the same request id"}
		}
	}
	return res, err
}

func (s *Service) adminOp(ctx context.Context, o *op, t audit.EventType, in AdminInput) (lease.Result, error) {
	id, err := s.scoped(o, in.Identity, auth.AuthorizeAdmin)
	if err != nil {
		return lease.Result{}, err
	}
	opKind := lease.OpForceRelease
	if t == audit.EventRevoke {
		opKind = lease.OpRevoke
	}
	m, ctx, cancel := o.mutation(ctx)
	defer cancel()
	req := lease.AdminRequest{Identity: id, LeaseID: in.LeaseID, FencingToken: in.FencingToken,
		Reason: in.Reason, IncidentID: in.IncidentID, Mutation: m}
	if _, _, err := lease.PrepareAdmin(opKind, req, lease.StoreOptions{OperationClasses: s.classes}); err != nil {
		return lease.Result{}, err
	}
	o.ev.LeaseID = in.LeaseID
	o.ev.SetFencingToken(in.FencingToken)
	o.ev.PreviousState = lease.StateActive
	attempt := o.ev
	attempt.EventID = audit.NewEventID(s.now())
	attempt.SetResult(lease.CodeOutcomeUnknown)
	attempt.Decision = audit.DecisionAllow
	if err := s.writeAudit(ctx, &attempt); err != nil {
		s.log.Error("durable audit of an administrative attempt failed; refusing", "event_type", t, "correlation_id", o.call.CorrelationID)
		return lease.Result{}, &lease.Error{Code: lease.CodeBackendUnavailable, Reason: "audit is unavailable; administrative operations are refused"}
	}
	return s.call(func() (lease.Result, error) {
		if opKind == lease.OpRevoke {
			return s.store.Revoke(ctx, req)
		}
		return s.store.ForceRelease(ctx, req)
	})
}

// Inspect reads the lease of an identity or a lease by id. A lease the
// caller may not see is lease_not_found: absence discloses nothing the
// caller's scope does not already reach.
func (s *Service) Inspect(ctx context.Context, c Call, in InspectInput) (lease.Result, error) {
	o := s.begin(audit.EventInspect, c)
	res, err := s.inspect(ctx, o, in)
	o.lease(res.Lease)
	return res, o.finish(ctx, err)
}

func (s *Service) inspect(ctx context.Context, o *op, in InspectInput) (lease.Result, error) {
	p := o.call.Principal
	req := lease.InspectRequest{LeaseID: in.LeaseID, Caller: p.Caller(o.call.CorrelationID)}
	if in.LeaseID == "" {
		id, err := s.scoped(o, in.Identity, auth.AuthorizeInspect)
		if err != nil {
			return lease.Result{}, err
		}
		req.Identity = id
	} else if !p.Has(auth.CapRead) && !p.Has(auth.CapLease) {
		return lease.Result{}, denied(auth.Require(p, auth.CapRead))
	}
	deadline, ctx, cancel := o.readDeadline(ctx)
	defer cancel()
	req.DeadlineAt = deadline
	res, err := s.call(func() (lease.Result, error) { return s.store.Inspect(ctx, req) })
	if err != nil {
		return res, err
	}
	if !auth.CanView(p, res.Lease) {
		return lease.Result{}, lease.NotFound(lease.Timestamp{})
	}
	o.identity(res.Lease.Identity())
	return res, nil
}

// List pages through the leases a filter selects that the caller may see.
// The page holds only such leases: the service reads store pages until it
// has the page and knows whether one more visible lease follows, the index
// ends, or it has read Config.MaxListReads store pages. The token (sealed,
// see pagetoken.go) then resumes after the page's last lease, so neither
// the token nor a short or empty page stands for a lease the caller may not
// see; only a page cut by the read cap ends short with a token.
func (s *Service) List(ctx context.Context, c Call, req lease.ListRequest) (lease.ListResult, error) {
	o := s.begin(audit.EventList, c)
	res, err := s.list(ctx, o, req)
	return res, o.finish(ctx, err)
}

func (s *Service) list(ctx context.Context, o *op, req lease.ListRequest) (lease.ListResult, error) {
	p := o.call.Principal
	access, err := auth.AuthorizeList(p, req)
	if err != nil {
		return lease.ListResult{}, denied(err)
	}
	deadline, ctx, cancel := o.readDeadline(ctx)
	defer cancel()
	token := req.PageToken
	req.PageToken, req.DeadlineAt, req.Caller = "", deadline, p.Caller(o.call.CorrelationID)
	opts := lease.StoreOptions{OperationClasses: s.classes}
	want, err := lease.PrepareList(req, opts)
	if err != nil {
		return lease.ListResult{}, err
	}
	filter, size := want.Filter, want.Size
	// A caller who may see only its own leases walks its own index
	// (bounded by its active-lease quota), whatever the filter: what that
	// walk skips is the caller's own leases, never another owner's.
	walk, visible := req, access.Visible
	if access.OwnOnly && req.By != lease.ListByOwner {
		walk = lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: p.ID, DeadlineAt: deadline, Caller: req.Caller}
		visible = func(r *lease.Record) bool { return access.Visible(r) && selects(filter, r) }
	}
	walked, err := lease.PrepareList(walk, opts)
	if err != nil {
		return lease.ListResult{}, err
	}
	bind := pageBinding(p, "list", string(filter.By), filter.Value)
	if walk.PageToken, err = s.tokens.open(bind, token); err != nil {
		return lease.ListResult{}, err
	}
	walk.PageSize = 0 // the store's largest page: fewer reads past hidden leases
	done, err := s.admit()
	if err != nil {
		return lease.ListResult{}, err
	}
	defer done()
	out := lease.ListResult{Leases: []*lease.Record{}}
	for reads := 1; ; reads++ {
		page, err := s.store.List(ctx, walk)
		if err != nil {
			return lease.ListResult{}, err
		}
		out.BackendTime = page.BackendTime
		for _, r := range page.Leases {
			if !visible(r) {
				continue
			}
			if len(out.Leases) == size {
				// A visible lease follows: resume after the last one shown.
				if out.NextPageToken, err = s.tokens.seal(bind, walked.NextPageToken(out.Leases[size-1].LeaseID)); err != nil {
					return lease.ListResult{}, err
				}
				return out, nil
			}
			out.Leases = append(out.Leases, r)
		}
		switch {
		case page.NextPageToken == "":
			return out, nil // the index ended: no token, so no empty last page
		case reads >= s.cfg.MaxListReads:
			if out.NextPageToken, err = s.tokens.seal(bind, page.NextPageToken); err != nil {
				return lease.ListResult{}, err
			}
			return out, nil
		}
		walk.PageToken = page.NextPageToken
	}
}

// selects reports whether the canonical filter f selects r.
func selects(f lease.ListFilter, r *lease.Record) bool {
	switch f.By {
	case lease.ListByOwner:
		return lease.OwnerIndexValue(r.OwnerPrincipalID) == f.Value
	case lease.ListByProgram:
		return lease.ProgramIndexValue(r.Identity()) == f.Value
	case lease.ListByTarget:
		return lease.TargetIndexValue(r.Identity()) == f.Value
	}
	return false
}

// History returns the terminal history of the identity of a lease id (a
// lease the caller may see), for audit:read callers. Its page tokens are
// sealed and bound to the identity and the caller, as list tokens are.
func (s *Service) History(ctx context.Context, c Call, leaseID string, pageSize int, pageToken string) (lease.HistoryResult, error) {
	o := s.begin(audit.EventHistory, c)
	res, err := s.history(ctx, o, leaseID, pageSize, pageToken)
	return res, o.finish(ctx, err)
}

func (s *Service) history(ctx context.Context, o *op, leaseID string, pageSize int, pageToken string) (lease.HistoryResult, error) {
	p := o.call.Principal
	if err := auth.Require(p, auth.CapAuditRead); err != nil {
		return lease.HistoryResult{}, denied(err)
	}
	deadline, ctx, cancel := o.readDeadline(ctx)
	defer cancel()
	found, err := s.store.Inspect(ctx, lease.InspectRequest{LeaseID: leaseID, DeadlineAt: deadline})
	if err != nil {
		return lease.HistoryResult{}, err
	}
	id := found.Lease.Identity()
	o.identity(id)
	if err := auth.AuthorizeHistory(p, id); err != nil {
		return lease.HistoryResult{}, lease.NotFound(lease.Timestamp{})
	}
	bind := pageBinding(p, "history", found.Lease.LockKey)
	cursor, err := s.tokens.open(bind, pageToken)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	done, err := s.admit()
	if err != nil {
		return lease.HistoryResult{}, err
	}
	defer done()
	res, err := s.store.History(ctx, lease.HistoryRequest{Identity: id, PageSize: pageSize, PageToken: cursor,
		DeadlineAt: deadline, Caller: p.Caller(o.call.CorrelationID)})
	if err == nil && res.NextPageToken != "" {
		if res.NextPageToken, err = s.tokens.seal(bind, res.NextPageToken); err != nil {
			return lease.HistoryResult{}, err
		}
	}
	return res, err
}

// AuthorizeCommit is the fenced-write validation for remote writers: the
// caller must hold the exact lease (the store checks owner, lease id,
// instance, token and expiry atomically, and the sink's high-water mark).
func (s *Service) AuthorizeCommit(ctx context.Context, c Call, in CommitInput) (lease.CommitResult, error) {
	o := s.begin(audit.EventCommitAuthorized, c)
	// A commit's request id is its commit id, which names the write: its
	// replay (after a revoke too) repeats it, and two writes differ by it.
	o.ev.RequestID = safeID(in.CommitID)
	o.ev.ServiceInstanceID, o.ev.ExecutionID, o.ev.TraceID = safeID(in.ServiceInstanceID), safeID(in.ExecutionID), safeID(in.TraceID)
	o.ev.JobID = safeID(in.JobID)
	res, err := s.commit(ctx, o, in)
	if err != nil {
		o.ev.EventType = audit.EventCommitRejected
		o.ev.Priority = audit.PriorityOf(audit.EventCommitRejected)
		// The lease the caller claimed (its own input, never a
		// successor's), so a stale holder's attempt names it.
		o.ev.LeaseID = safeID(in.LeaseID)
		if in.FencingToken >= 1 && in.FencingToken <= lease.MaxFencingToken { // else an invalid, unwritable event
			o.ev.SetFencingToken(in.FencingToken)
		}
	} else {
		o.ev.LeaseID = res.Commit.LeaseID
		o.ev.SetFencingToken(res.Commit.FencingToken)
	}
	return res, o.finish(ctx, err)
}

func (s *Service) commit(ctx context.Context, o *op, in CommitInput) (lease.CommitResult, error) {
	id, err := s.scoped(o, in.Identity, auth.AuthorizeAcquire)
	if err != nil {
		return lease.CommitResult{}, err
	}
	deadline, ctx, cancel := o.readDeadline(ctx)
	defer cancel()
	req := lease.CommitRequest{Identity: id, LeaseID: in.LeaseID, FencingToken: in.FencingToken,
		ServiceInstanceID: in.ServiceInstanceID, Sink: in.Sink, CommitID: in.CommitID, ExecutionID: in.ExecutionID,
		JobID: in.JobID, TraceID: in.TraceID, Target: in.Target, PayloadSHA256: in.PayloadSHA256, Outbox: in.Outbox,
		DeadlineAt: deadline, Caller: o.call.Principal.Caller(o.call.CorrelationID)}
	var limited error
	if in.Outbox != nil {
		if !s.cfg.publishAllowed(in.Outbox.Exchange) {
			return lease.CommitResult{}, &lease.Error{Code: lease.CodeAccessDenied, PublicReason: true,
				Reason: "outbox.exchange is not an exchange this server publishes to"}
		}
		// Invalid input is refused before it spends a token.
		if _, _, err := lease.PrepareCommit(req, lease.StoreOptions{OperationClasses: s.classes}); err != nil {
			return lease.CommitResult{}, err
		}
		// A publication stores up to 64 KiB in the outbox: it is charged to
		// the principal's bucket like an acquire. A 429 is retryable, and
		// a retry with the same commit id replays, even while the bucket
		// is empty (commitReplay).
		if ok, wait := s.principal.allow(o.call.Principal.ID, s.now()); !ok {
			limited = &lease.Error{Code: lease.CodeRateLimited, Reason: "principal rate limit", RetryAfter: wait}
		}
	}
	if limited != nil {
		return s.commitReplay(ctx, req, limited)
	}
	done, err := s.admit()
	if err != nil {
		return lease.CommitResult{}, err
	}
	defer done()
	return s.store.AuthorizeCommit(ctx, req)
}

// commitReplay is unlessReplay for a commit the principal's bucket refused:
// the store answers from the commit id's evidence alone (ReplayOnly, which
// writes nothing and spends nothing the bucket protects), so the retry of
// an accepted publication gets its authorization and a changed one its
// idempotency_conflict. Without evidence, or without an answer, the
// refusal stands.
func (s *Service) commitReplay(ctx context.Context, req lease.CommitRequest, refused error) (lease.CommitResult, error) {
	req.ReplayOnly = true
	done, err := s.admit()
	if err != nil {
		return lease.CommitResult{}, refused
	}
	defer done()
	res, err := s.store.AuthorizeCommit(ctx, req)
	switch {
	case err == nil:
		return res, nil
	case lease.CodeOf(err) == lease.CodeIdempotencyConflict:
		return lease.CommitResult{}, err
	}
	return lease.CommitResult{}, refused
}
