package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/starintel/starlease/lease"
)

// LeaseStore adapts a Client to the lease-store protocol: its Acquire,
// Renew, Release, Inspect and AuthorizeCommit have the signatures of
// lease.Store's, so it satisfies executor.LeaseAPI and fence.Authorizer and
// a leased actor runs over the HTTP API exactly as over an embedded store
// (ForceRelease, Revoke, List and History have lease.Store's signatures
// too; the HTTP API has no request-id lookup, so LookupRequest is not here):
//
//	store := client.NewLeaseStore(c, "prn-portscan") // the API key's principal
//	err := executor.Run(ctx, store, spec, work)
//
// # Requests
//
// The owner's security context comes from the API key: req.Caller is not
// sent (its CorrelationID, when set, travels as X-Correlation-ID). Request
// ids pass through unchanged (a retry with the same id resolves an unknown
// outcome); a mutation without one is refused, as lease.Store refuses it.
// The identity travels as lock_identity, TTL and MaximumLifetime as whole
// milliseconds (ttl_ms, maximum_lifetime_ms), and a mutation's DeadlineAt
// as deadline_at (zero: the context's deadline, as X-Request-Timeout-Ms).
// Inspect and AuthorizeCommit carry no deadline in their bodies: their
// DeadlineAt bounds the call's context, and so its X-Request-Timeout-Ms.
// The context bounds how long any call waits for its answer. AuthorizeCommit
// with an Outbox message sends it as the request's outbox object: the
// server appends it to its backend's fenced outbox in the same atomic step
// as the lease check, so rabbitmq.Publisher works over HTTP; the answer
// must name the message's body digest (payload_sha256) and a message id.
//
// # Results
//
// The HTTP answer carries the lease's identity, id, fencing token,
// acquired_at, renewed_at, expires_at, ttl_ms and state; the adapter
// computes LockKey with lease.CanonicalLockKey and fills the rest of the
// *lease.Record from what it knows:
//
//   - OwnerPrincipalID is the principal given to NewLeaseStore (when that is
//     empty: the request's Caller.PrincipalID). The answer does not name the
//     owner, so the adapter fills it only where the server has established
//     it: leases acquired through this LeaseStore and answers to
//     renew/release (which the server grants only to the owner). A lease
//     the adapter does not know (Inspect of someone else's lease) has no
//     owner fields.
//   - ServiceInstanceID, ExecutionID, JobID, TraceID, Metadata, RequestID
//     (of the acquisition) and MaximumLifetimeMs come from the request, and
//     for later answers about the same lease from the adapter's memory of
//     its acquisition: a LeaseStore remembers each lease acquired through it
//     until it is released or can no longer be alive (its maximum lifetime
//     has passed), at most MaxRememberedLeases of them.
//   - MaximumLifetimeMs is the requested maximum lifetime. When it is
//     unknown (zero was requested, so the server's configured maximum
//     applies, or the lease was acquired elsewhere) it is lease.MaxLifetime,
//     an upper bound — unless the answer shows the lease capped (expires_at −
//     renewed_at shorter than ttl_ms), which happens only at the maximum
//     lifetime: then it is exactly expires_at − acquired_at.
//   - OwnerClientID and OwnerCredentialID are left empty: the answer does not
//     carry them.
//   - BackendTime is renewed_at for a fresh (not replayed) acquisition or
//     renewal (the backend time of that decision), backend_time for a commit
//     authorization, and zero — unknown — otherwise: the lease answers of the
//     HTTP API do not carry the backend time of a read.
//
// Result codes are the typed codes: commit authorization answers
// commit_authorized (the wire code is lease_inspected).
//
// # Errors
//
// Every error is a *lease.Error (from Error.LeaseError), so lease.CodeOf,
// lease.AsError and errors.Is(err, &lease.Error{Code: …}) work, and
// transport failures keep the client's classification: not sent is
// lease_backend_unavailable (or deadline_exceeded), sent without an answer
// is lease_outcome_unknown for mutations and commit authorizations,
// lease_backend_unavailable for reads. An answer the adapter cannot map to a
// record (a non-canonical identity) or that answers another request (a
// commit of another sink) is lease_corrupt. Invalid input the adapter can
// see (no request id, a sub-millisecond duration) is
// invalid_lease_request and nothing is sent.
//
// A LeaseStore is safe for concurrent use.
type LeaseStore struct {
	c           *Client
	principalID string
	now         func() time.Time

	mu    sync.Mutex
	known map[string]*knownLease
}

// MaxRememberedLeases bounds the acquisitions a LeaseStore remembers.
const MaxRememberedLeases = 10000

// knownLease is what the adapter remembers of a lease acquired through it.
type knownLease struct {
	ownerPrincipalID  string
	serviceInstanceID string
	executionID       string
	jobID             string
	traceID           string
	requestID         string
	metadata          lease.Metadata
	maxLifetimeMs     int64 // 0: unknown
	forgetAt          time.Time
}

// NewLeaseStore returns the lease-store adapter over c. ownerPrincipalID is
// the principal of c's API key (the owner of every lease acquired through
// it); the HTTP answers do not carry it. If it is empty, each request's
// Caller.PrincipalID is used instead.
func NewLeaseStore(c *Client, ownerPrincipalID string) *LeaseStore {
	return &LeaseStore{c: c, principalID: ownerPrincipalID, now: time.Now, known: map[string]*knownLease{}}
}

// LeaseStore is NewLeaseStore(c, ownerPrincipalID).
func (c *Client) LeaseStore(ownerPrincipalID string) *LeaseStore {
	return NewLeaseStore(c, ownerPrincipalID)
}

// Client returns the client the adapter sends with.
func (s *LeaseStore) Client() *Client { return s.c }

func (s *LeaseStore) owner(caller lease.Caller) string {
	if s.principalID != "" {
		return s.principalID
	}
	return caller.PrincipalID
}

// withCorrelation sends the caller's correlation id, when it has one.
func withCorrelation(ctx context.Context, caller lease.Caller) context.Context {
	if caller.CorrelationID != "" {
		return ContextWithCorrelationID(ctx, caller.CorrelationID)
	}
	return ctx
}

// withDeadline bounds ctx by deadline (when set) for calls whose body has no
// deadline_at: the client derives X-Request-Timeout-Ms from it.
func withDeadline(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if deadline.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline)
}

// wholeMs converts d to milliseconds; a duration with a sub-millisecond
// part is invalid, as lease.Store has it.
func wholeMs(field string, d time.Duration) (int64, error) {
	if d < 0 {
		return 0, lease.Invalid(field, "must not be negative")
	}
	if d%time.Millisecond != 0 {
		return 0, lease.Invalid(field, "must be whole milliseconds")
	}
	return d.Milliseconds(), nil
}

// requireRequestID refuses a mutation without a request id, as lease.Store
// does: the client would mint a fresh one per call, so a retry after an
// unknown outcome could not resolve it.
func requireRequestID(id string) error {
	if id == "" {
		return lease.Invalid("request_id", "a request id is required")
	}
	return nil
}

// leaseErr converts any error of the client to a *lease.Error.
func leaseErr(err error, mutation bool) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce.LeaseError()
	}
	var le *lease.Error
	if errors.As(err, &le) {
		return le
	}
	code := lease.CodeBackendUnavailable
	if mutation {
		code = lease.CodeOutcomeUnknown
	}
	return &lease.Error{Code: code, Reason: "client failure: " + err.Error()}
}

func corrupt(reason string) *lease.Error {
	return &lease.Error{Code: lease.CodeCorrupt, Reason: reason}
}

// Acquire asks for a lease (POST /acquire).
func (s *LeaseStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	if err := requireRequestID(req.RequestID); err != nil {
		return lease.Result{}, err
	}
	ttl, err := wholeMs("ttl_ms", req.TTL)
	if err != nil {
		return lease.Result{}, err
	}
	life, err := wholeMs("maximum_lifetime_ms", req.MaximumLifetime)
	if err != nil {
		return lease.Result{}, err
	}
	body := AcquireRequest{LockIdentity: req.Identity, TTLMs: ttl, MaximumLifetimeMs: life,
		ServiceInstanceID: req.ServiceInstanceID, ExecutionID: req.ExecutionID, JobID: req.JobID,
		TraceID: req.TraceID, RequestID: req.RequestID, DeadlineAt: req.DeadlineAt}
	if len(req.Metadata) > 0 {
		body.Metadata = map[string]any(req.Metadata)
	}
	res, err := s.c.Acquire(withCorrelation(ctx, req.Caller), body)
	if err != nil {
		return lease.Result{}, leaseErr(err, true)
	}
	k := &knownLease{ownerPrincipalID: s.owner(req.Caller), serviceInstanceID: req.ServiceInstanceID,
		executionID: req.ExecutionID, jobID: req.JobID, traceID: req.TraceID, requestID: res.RequestID,
		metadata: cloneMetadata(req.Metadata), maxLifetimeMs: life}
	out, err := s.result(res, k, true)
	if err != nil {
		return lease.Result{}, err
	}
	s.remember(out.Lease, k)
	return out, nil
}

// Renew extends a held lease (POST /{lease_id}/renew).
func (s *LeaseStore) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	if err := requireRequestID(req.RequestID); err != nil {
		return lease.Result{}, err
	}
	ttl, err := wholeMs("ttl_ms", req.TTL)
	if err != nil {
		return lease.Result{}, err
	}
	res, err := s.c.Renew(withCorrelation(ctx, req.Caller), RenewRequest{LeaseID: req.LeaseID, LockIdentity: req.Identity,
		FencingToken: req.FencingToken, ServiceInstanceID: req.ServiceInstanceID, TTLMs: ttl,
		RequestID: req.RequestID, DeadlineAt: req.DeadlineAt})
	if err != nil {
		return lease.Result{}, leaseErr(err, true)
	}
	// Only the owner's instance may renew: the server matched both.
	return s.result(res, s.held(req.LeaseID, req.Caller, req.ServiceInstanceID), true)
}

// Release ends a held lease (POST /{lease_id}/release). The adapter forgets
// the lease once the server has released it.
func (s *LeaseStore) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	if err := requireRequestID(req.RequestID); err != nil {
		return lease.Result{}, err
	}
	res, err := s.c.Release(withCorrelation(ctx, req.Caller), ReleaseRequest{LeaseID: req.LeaseID, LockIdentity: req.Identity,
		FencingToken: req.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
		RequestID: req.RequestID, DeadlineAt: req.DeadlineAt})
	if err != nil {
		if lease.CodeOf(err) == lease.CodeLost {
			s.forget(req.LeaseID)
		}
		return lease.Result{}, leaseErr(err, true)
	}
	out, err := s.result(res, s.held(req.LeaseID, req.Caller, req.ServiceInstanceID), false)
	if err == nil {
		s.forget(req.LeaseID)
	}
	return out, err
}

// Inspect reads a lease by id (GET /{lease_id}) or the lease of an identity
// (POST /inspect); exactly one of them must be given.
func (s *LeaseStore) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	byID := req.LeaseID != ""
	if byID == (req.Identity != lease.Identity{}) {
		return lease.Result{}, lease.Invalid("lease_id", "give exactly one of a lease id or a lock identity")
	}
	ctx, cancel := withDeadline(withCorrelation(ctx, req.Caller), req.DeadlineAt)
	defer cancel()
	var (
		res *LeaseResult
		err error
	)
	if byID {
		res, err = s.c.Get(ctx, req.LeaseID)
	} else {
		res, err = s.c.Inspect(ctx, req.Identity)
	}
	if err != nil {
		return lease.Result{}, leaseErr(err, false)
	}
	if byID && res.Lease.LeaseID != req.LeaseID {
		return lease.Result{}, corrupt("inspect answered another lease")
	}
	return s.result(res, s.lookup(res.Lease.LeaseID), false)
}

// AuthorizeCommit asks the fenced-write boundary to accept a commit
// (POST /commits/authorize).
//
// The API has no replay-only commit: a request with ReplayOnly set is
// refused as invalid before anything is sent, never sent as a commit that
// could be authorized and recorded.
func (s *LeaseStore) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	if req.ReplayOnly {
		return lease.CommitResult{}, lease.Invalid("replay_only", "the HTTP API cannot answer a commit from its evidence alone")
	}
	var outbox *Outbox
	target, payload := req.Target, req.PayloadSHA256
	if m := req.Outbox; m != nil {
		if target != "" || payload != "" {
			return lease.CommitResult{}, lease.Invalid("target", "a publication is its own target: give target and payload_sha256 only without outbox")
		}
		// The message is the write: the backend binds the commit to its
		// message id and the SHA-256 of its body.
		outbox = &Outbox{Exchange: m.Exchange, RoutingKey: m.RoutingKey, ContentType: m.ContentType, Body: m.Body,
			Headers: m.Headers}
		payload = lease.PayloadSHA256(m.Body)
	}
	ctx, cancel := withDeadline(withCorrelation(ctx, req.Caller), req.DeadlineAt)
	defer cancel()
	res, err := s.c.AuthorizeCommit(ctx, CommitRequest{LockIdentity: req.Identity, LeaseID: req.LeaseID,
		FencingToken: req.FencingToken, ServiceInstanceID: req.ServiceInstanceID, Sink: req.Sink,
		CommitID: req.CommitID, ExecutionID: req.ExecutionID, JobID: req.JobID, TraceID: req.TraceID,
		Target: req.Target, PayloadSHA256: req.PayloadSHA256, Outbox: outbox})
	if err != nil {
		return lease.CommitResult{}, leaseErr(err, true)
	}
	cm := res.Commit
	if outbox != nil && strings.HasPrefix(cm.Target, "msg_") {
		target = cm.Target // the message id, derived by the backend from the commit
	}
	if cm.LeaseID != req.LeaseID || cm.FencingToken != req.FencingToken || cm.CommitID != req.CommitID || cm.Sink != req.Sink ||
		cm.ExecutionID != req.ExecutionID || cm.JobID != req.JobID || cm.Target != target || cm.PayloadSHA256 != payload {
		return lease.CommitResult{}, corrupt("commit answer does not match the request")
	}
	return lease.CommitResult{Code: lease.CodeCommitAuthorized, Replayed: res.Replayed, BackendTime: lease.At(cm.BackendTime),
		Commit: lease.Commit{Sink: cm.Sink, CommitID: cm.CommitID, LeaseID: cm.LeaseID, FencingToken: cm.FencingToken,
			ExecutionID: cm.ExecutionID, JobID: cm.JobID, TraceID: cm.TraceID, Target: cm.Target,
			PayloadSHA256: cm.PayloadSHA256, Seq: cm.CommitSeq, AcceptedAt: lease.At(cm.AcceptedAt)}}, nil
}

// held is what the adapter knows of a lease the server has just let the
// caller renew or release: its memory of the acquisition, or else the owner
// and instance the server matched.
func (s *LeaseStore) held(leaseID string, caller lease.Caller, instance string) *knownLease {
	if k := s.lookup(leaseID); k != nil {
		return k
	}
	return &knownLease{ownerPrincipalID: s.owner(caller), serviceInstanceID: instance}
}

// result maps a lease answer to a typed result.
func (s *LeaseStore) result(res *LeaseResult, k *knownLease, decision bool) (lease.Result, error) {
	rec, err := record(res.Lease, k)
	if err != nil {
		return lease.Result{}, err
	}
	out := lease.Result{Code: res.Code, Lease: rec, Replayed: res.Replayed}
	if res.Current != nil {
		if res.Current.LeaseID != res.Lease.LeaseID {
			return lease.Result{}, corrupt("current state of another lease")
		}
		if out.Current, err = record(*res.Current, k); err != nil {
			return lease.Result{}, err
		}
	}
	if decision && !res.Replayed {
		out.BackendTime = rec.RenewedAt
	}
	return out, nil
}

// record builds the *lease.Record of a lease answer; k (may be nil) is what
// the adapter knows beyond the answer.
func record(l Lease, k *knownLease) (*lease.Record, error) {
	classes, err := lease.NewOperationClasses(l.LockIdentity.OperationClass)
	if err != nil {
		return nil, corrupt("answer with a malformed operation class")
	}
	id, key, err := lease.CanonicalLockKey(l.LockIdentity, classes)
	if err != nil || id != l.LockIdentity {
		return nil, corrupt("answer with a non-canonical lock identity")
	}
	rec := &lease.Record{RecordVersion: lease.RecordVersion, LockKey: key, LeaseID: l.LeaseID,
		FencingToken: l.FencingToken, AcquiredAt: lease.At(l.AcquiredAt), RenewedAt: lease.At(l.RenewedAt),
		ExpiresAt: lease.At(l.ExpiresAt), TTLMs: l.TTLMs, State: l.State}
	rec.SetIdentity(id)
	if k != nil {
		rec.OwnerPrincipalID, rec.ServiceInstanceID = k.ownerPrincipalID, k.serviceInstanceID
		rec.ExecutionID, rec.JobID, rec.TraceID, rec.RequestID = k.executionID, k.jobID, k.traceID, k.requestID
		rec.Metadata = cloneMetadata(k.metadata)
		rec.MaximumLifetimeMs = k.maxLifetimeMs
	}
	if granted := rec.ExpiresAt.UnixMilli() - rec.RenewedAt.UnixMilli(); granted < rec.TTLMs {
		// Only the maximum lifetime shortens a grant below the TTL.
		rec.MaximumLifetimeMs = rec.ExpiresAt.UnixMilli() - rec.AcquiredAt.UnixMilli()
	} else if rec.MaximumLifetimeMs == 0 {
		rec.MaximumLifetimeMs = lease.MaxLifetime.Milliseconds()
	}
	return rec, nil
}

func cloneMetadata(m lease.Metadata) lease.Metadata {
	if m == nil {
		return nil
	}
	c := make(lease.Metadata, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// remember keeps k for the lease rec, forgetting leases that can no longer
// be alive (and the oldest, beyond MaxRememberedLeases).
func (s *LeaseStore) remember(rec *lease.Record, k *knownLease) {
	now := s.now()
	life := time.Duration(rec.MaximumLifetimeMs) * time.Millisecond
	// The local clock and backend time differ; a minute of slack on top of
	// the lifetime, counted from now (after the acquisition), is plenty.
	k.forgetAt = now.Add(life + time.Minute)
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, o := range s.known {
		if now.After(o.forgetAt) {
			delete(s.known, id)
		}
	}
	for len(s.known) >= MaxRememberedLeases {
		var oldest string
		for id, o := range s.known {
			if oldest == "" || o.forgetAt.Before(s.known[oldest].forgetAt) {
				oldest = id
			}
		}
		delete(s.known, oldest)
	}
	s.known[rec.LeaseID] = k
}

func (s *LeaseStore) lookup(leaseID string) *knownLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known[leaseID]
}

func (s *LeaseStore) forget(leaseID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.known, leaseID)
}

// remembered reports how many leases s remembers (for tests).
func (s *LeaseStore) remembered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.known)
}
