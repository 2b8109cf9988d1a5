// Package service is the typed lease service over a lease.Store: every
// request runs authorize (capability and canonical scope) → policy (TTL
// bounds, maximum lifetime, deadline cap, rate limits, admission, quota) →
// one store call → audit → typed result. Authentication happens before, in
// the adapter that reads credentials (httpapi); the service receives the
// authenticated auth.Principal and never trusts body fields for identity.
//
// List and History hand out page tokens the client cannot read or make:
// the store's cursor, sealed under a server key (Options.PageTokenKey) and
// bound to the filter (for history, the identity) and to the caller's
// principal, class, capabilities and scope. A list page holds only leases
// the caller may see and its token resumes after the last of them, so
// neither tokens nor page shapes reveal a lease outside the caller's scope,
// except that a page cut by Config.MaxListReads ends short with a token.
package service

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Service is safe for concurrent use.
type Service struct {
	store     lease.Store
	sink      audit.Sink
	redactor  *audit.Redactor
	cfg       Config
	classes   lease.OperationClasses
	principal *limiters
	target    *limiters // acquires, per target: shared by every principal
	holder    *limiters // renewals, per (target, principal): the caller's own
	admission chan struct{}
	active    activeCounts
	tokens    *pageSealer
	log       *slog.Logger
	now       func() time.Time
}

// Options are the service's dependencies besides the store and audit sink.
type Options struct {
	Config           Config
	OperationClasses lease.OperationClasses
	Logger           *slog.Logger
	// Redactor gives values that may be credential material their keyed
	// redacted form in every event this service builds (key it with
	// auth.Pepper.DeriveKey(audit.RedactionKeyPurpose)). Nil makes one
	// with a random key, good for this process only: an administrator's
	// redacted reason is part of a request's idempotency digest, so two
	// different secrets must not redact to one form (retried after a
	// restart, the same request is then an idempotency_conflict, never a
	// wrong replay).
	Redactor *audit.Redactor
	// Now is the server clock (deadlines, rate limits); nil is time.Now.
	// Lease time is always the backend's.
	Now func() time.Time
	// PageTokenKey (at least 32 bytes) seals the page tokens of list and
	// history. Every server of a deployment needs the same key to continue
	// each other's pages: starlease serve derives it from the pepper. Nil
	// makes a random key, good for this process only.
	PageTokenKey []byte
}

// New builds a Service. sink receives one event per request; force-release
// and revoke are not reported successful unless it wrote them durably.
func New(store lease.Store, sink audit.Sink, o Options) (*Service, error) {
	cfg, err := o.Config.withDefaults()
	if err != nil {
		return nil, err
	}
	tokens, err := newPageSealer(o.PageTokenKey)
	if err != nil {
		return nil, err
	}
	if o.Redactor == nil {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if o.Redactor, err = audit.NewRedactor(key); err != nil {
			return nil, err
		}
	}
	s := &Service{store: store, sink: sink, redactor: o.Redactor, cfg: cfg, classes: o.OperationClasses, tokens: tokens,
		log: o.Logger, now: o.Now,
		principal: newLimiters(cfg.PrincipalRate, cfg.PrincipalBurst, false),
		target:    newLimiters(cfg.TargetRate, cfg.TargetBurst, false),
		holder:    newLimiters(cfg.TargetRate, cfg.TargetBurst, true),
		admission: make(chan struct{}, cfg.MaxConcurrent)}
	// The log writes a secret-shaped value as its audit form.
	s.log = audit.ScreenLogger(s.log, s.redactor)
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Config returns the effective policy.
func (s *Service) Config() Config { return s.cfg }

// Health is the backend's health, degraded while durable audit is
// unavailable (audit.Check of the sink fails): force-release and revoke
// are refused then, since they need it. It is degraded too while the
// queryable audit store is behind the durable audit file
// (audit.ErrIndexBehind), which refuses nothing.
func (s *Service) Health(ctx context.Context) lease.Health {
	h := s.store.Health(ctx)
	err := audit.Check(ctx, s.sink)
	if err == nil {
		return h
	}
	why := "durable audit unavailable: " + strings.ReplaceAll(err.Error(), "\n", "; ")
	if errors.Is(err, audit.ErrIndexBehind) {
		why = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	if h.Status == lease.HealthOK {
		return lease.Health{Status: lease.HealthDegraded, Reason: why}
	}
	h.Reason += "; " + why
	return h
}

// op is one request in flight: its audit event and timing.
type op struct {
	s     *Service
	ev    audit.Event
	start time.Time
	call  Call
}

func (s *Service) begin(t audit.EventType, c Call) *op {
	now := s.now()
	o := &op{s: s, ev: audit.NewEvent(t, now), start: now, call: c}
	o.ev.SetCaller(c.Principal.Caller(c.CorrelationID))
	o.ev.RequestID = safeID(c.RequestID)
	o.ev.DeadlineClass = audit.DeadlineDefault
	return o
}

// identity sets the event's scope from a canonical identity.
func (o *op) identity(id lease.Identity) { o.ev.SetScope(id) }

// lease records the disclosed lease fields of a result.
func (o *op) lease(r *lease.Record) {
	if r == nil {
		return
	}
	o.ev.LeaseID = r.LeaseID
	o.ev.SetFencingToken(r.FencingToken)
	o.ev.EffectiveTTLMS = r.TTLMs
	o.ev.ResultingState = r.State
	// Execution, job, trace and instance are the owner's private fields.
	if r.OwnerPrincipalID != o.call.Principal.ID {
		return
	}
	o.ev.ExecutionID, o.ev.JobID = r.ExecutionID, r.JobID
	if r.TraceID != "" {
		o.ev.TraceID = r.TraceID
	}
	o.ev.ServiceInstanceID = r.ServiceInstanceID
}

// finish writes the request's audit event with its result code and returns
// err unchanged. A normal-priority event that cannot be written is logged
// (the request's outcome stands); high-priority events go through durable
// paths of their own (admin).
func (o *op) finish(ctx context.Context, err error) error {
	o.result(err)
	if werr := o.s.writeAudit(ctx, &o.ev); werr != nil {
		o.s.log.Error("audit write failed", "event_type", o.ev.EventType, "correlation_id", o.call.CorrelationID)
	}
	return err
}

func (o *op) result(err error) {
	o.ev.LatencyMS = o.s.now().Sub(o.start).Milliseconds()
	code := lease.CodeOf(err)
	if err == nil {
		code = successCode(o.ev.EventType)
	}
	o.ev.SetResult(code)
	o.ev.BackendHealth = lease.HealthOK
	if code == lease.CodeBackendUnavailable || code == lease.CodeOutcomeUnknown || code == lease.CodeCorrupt {
		o.ev.BackendHealth = lease.HealthUnavailable
	}
}

func successCode(t audit.EventType) lease.Code {
	switch t {
	case audit.EventAcquire:
		return lease.CodeAcquired
	case audit.EventRenew:
		return lease.CodeRenewed
	case audit.EventRelease:
		return lease.CodeReleased
	case audit.EventForceRelease:
		return lease.CodeForceReleased
	case audit.EventRevoke:
		return lease.CodeRevoked
	case audit.EventInspect, audit.EventLookup:
		return lease.CodeInspected
	case audit.EventList:
		return lease.CodeListed
	case audit.EventHistory:
		return lease.CodeHistory
	case audit.EventCommitAuthorized:
		return lease.CodeCommitAuthorized
	}
	return lease.CodeInspected
}

// denied maps an auth denial to access_denied (never its internal reason).
func denied(err error) error {
	if errors.Is(err, auth.ErrAccessDenied) {
		return &lease.Error{Code: lease.CodeAccessDenied, Reason: "capability or scope does not allow this request"}
	}
	return err // invalid_request from normalization
}

// scoped canonicalizes raw, records it on the request's audit event and
// applies authorize to the canonical identity: the request path's order
// (normalize, then authorize on trusted values) in one place.
func (s *Service) scoped(o *op, raw lease.Identity, authorize func(auth.Principal, lease.Identity) error) (lease.Identity, error) {
	id, err := s.canonical(raw)
	if err != nil {
		return lease.Identity{}, err
	}
	o.identity(id)
	if err := authorize(o.call.Principal, id); err != nil {
		return lease.Identity{}, denied(err)
	}
	return id, nil
}

// canonical normalizes an identity with the configured operation classes.
func (s *Service) canonical(id lease.Identity) (lease.Identity, error) {
	n, _, err := lease.CanonicalLockKey(id, s.classes)
	return n, err
}

// LockKey is the canonical lock key of an identity under the configured
// operation classes. A commit answer names it so a remote writer's guard
// carries it without the client deriving it in another language.
func (s *Service) LockKey(id lease.Identity) (string, error) {
	_, key, err := lease.CanonicalLockKey(id, s.classes)
	return key, err
}

// admit applies the concurrent-operation cap: excess work is refused, not
// queued. release must be called when admitted.
func (s *Service) admit() (func(), error) {
	select {
	case s.admission <- struct{}{}:
		return func() { <-s.admission }, nil
	default:
		return nil, &lease.Error{Code: lease.CodeRateLimited, Reason: "too many concurrent operations", RetryAfter: 50 * time.Millisecond}
	}
}

// throttle applies the token buckets of an acquire (renew false) or a
// renewal (renew true): the caller's per-principal bucket, then for an
// acquire the per-target bucket every principal shares, for a renewal the
// caller's own bucket for the target (see Config.TargetRate). No other
// principal's traffic can empty a bucket a renewal is charged to, so a
// holder cannot be starved of renewals by acquires that only conflict.
func (s *Service) throttle(p auth.Principal, id lease.Identity, renew bool) error {
	now := s.now()
	if ok, wait := s.principal.allow(p.ID, now); !ok {
		return &lease.Error{Code: lease.CodeRateLimited, Reason: "principal rate limit", RetryAfter: wait}
	}
	target := id.TenantID + "\x00" + id.ProgramID + "\x00" + id.TargetNamespace + "\x00" + id.TargetID
	if renew {
		// A principal id never holds a NUL, so the key is unambiguous.
		if ok, wait := s.holder.allow(target+"\x00"+p.ID, now); !ok {
			return &lease.Error{Code: lease.CodeRateLimited, Reason: "renewal rate limit", RetryAfter: wait}
		}
		return nil
	}
	if ok, wait := s.target.allow(target, now); !ok {
		return &lease.Error{Code: lease.CodeRateLimited, Reason: "target rate limit", RetryAfter: wait}
	}
	return nil
}

// mutation builds the store's Mutation for c: the effective deadline and
// the caller as the store sees it.
func (o *op) mutation(parent context.Context) (lease.Mutation, context.Context, context.CancelFunc) {
	deadline, class := o.s.cfg.deadline(o.s.now(), o.call)
	o.ev.DeadlineClass = string(class)
	ctx, cancel := context.WithDeadline(parent, deadline)
	return lease.Mutation{RequestID: o.call.RequestID, DeadlineAt: deadline,
		Caller: o.call.Principal.Caller(o.call.CorrelationID)}, ctx, cancel
}

// readDeadline is the effective deadline of a read.
func (o *op) readDeadline(parent context.Context) (time.Time, context.Context, context.CancelFunc) {
	deadline, class := o.s.cfg.deadline(o.s.now(), o.call)
	o.ev.DeadlineClass = string(class)
	ctx, cancel := context.WithDeadline(parent, deadline)
	return deadline, ctx, cancel
}

// safeID is v if it is a well-formed identifier, else empty: an audit
// event carries only validated values, so a malformed request is still
// audited (without the malformed value). A well-formed value that may be
// credential material is kept here and redacted by writeAudit.
func safeID(v string) string {
	if lease.CheckOpaqueID("id", v) != nil {
		return ""
	}
	return v
}

// safeReason is an administrator reason that passes the reason rule, else
// empty (the request is then refused as invalid before any change).
func safeReason(r string) string {
	if lease.CheckReason(r) != nil {
		return ""
	}
	return r
}

// Store is the lease store under the service (benchmarks compare against it).
func (s *Service) Store() lease.Store { return s.store }

// AuditRejected audits a request the adapter refused before it reached the
// service (a malformed body, a bad header): one event per request, whatever
// the result. t is the operation's event type.
func (s *Service) AuditRejected(ctx context.Context, t audit.EventType, c Call, err error) {
	o := s.begin(t, c)
	if t == audit.EventCommitAuthorized {
		o.ev.EventType, o.ev.Priority = audit.EventCommitRejected, audit.PriorityOf(audit.EventCommitRejected)
	}
	o.finish(ctx, err)
}

// AuditTimeout bounds one audit write: a sink that hangs (a backend behind
// a partition) must not hold the request past it. The write outlives the
// request's own cancellation, so a client that gave up is still audited.
const AuditTimeout = 2 * time.Second

// writeAudit redacts ev in place — the one place every event this service
// builds passes, so a caller's value never decides whether an event is
// written — and writes it. Log a request's own values, not ev's after this: the
// log gives a value the same form (audit.LogHandler), and would hash an
// already redacted one again.
func (s *Service) writeAudit(ctx context.Context, ev *audit.Event) error {
	s.redactor.Event(ev)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AuditTimeout)
	defer cancel()
	return s.sink.Write(ctx, *ev)
}

// AuditAuthFailure audits an authentication failure, which happens before
// any principal exists: the correlation id and, for a well-formed key, the
// presented credential id.
func (s *Service) AuditAuthFailure(ctx context.Context, correlationID, credentialID string, start time.Time) {
	ev := audit.NewEvent(audit.EventAuthFailed, s.now())
	ev.CorrelationID, ev.CredentialID = correlationID, credentialID
	ev.SetResult(lease.CodeInvalidCredential)
	ev.LatencyMS = max(time.Since(start).Milliseconds(), 0)
	ev.DeadlineClass = audit.DeadlineDefault
	ev.BackendHealth = lease.HealthOK
	if err := s.writeAudit(ctx, &ev); err != nil {
		s.log.Error("audit write failed", "event_type", ev.EventType, "correlation_id", correlationID)
	}
}
