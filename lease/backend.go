package lease

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// What every backend shares: the deadline rule, one constructor per typed
// result a backend decides, the log attributes of an identity, the
// matching of terminal evidence, and the reaper loop. A result's reason is
// written here once, so every backend answers with the same text.

// Deadline is the deadline a backend enforces at backend time: the earlier
// of the request's deadline (at) and ctx's.
func Deadline(ctx context.Context, at time.Time) Timestamp {
	if d, ok := ctx.Deadline(); ok && d.Before(at) {
		at = d
	}
	return At(at)
}

// PastDeadline is the deadline rule: work starts only strictly before its
// deadline due, at backend time now (the Valkey functions compare the same
// way). It returns DeadlineExceeded(now) past it, else nil; the result is
// error, not *Error, so nil is a nil interface.
func PastDeadline(now, due Timestamp) error {
	if now.Before(due) {
		return nil
	}
	return DeadlineExceeded(now)
}

// CheckStart refuses work that cannot start: on a closed store
// (backend_unavailable), or with ctx already done, a deadline that passed
// before submission.
func CheckStart(ctx context.Context, closed bool) error {
	if closed {
		return Errorf(CodeBackendUnavailable, "store is closed")
	}
	if ctx.Err() != nil {
		return DeadlineExceeded(Timestamp{})
	}
	return nil
}

// DeadlineExceeded is the refusal of work whose deadline passed before it
// started: decided at backend time now, or zero when nothing reached the
// backend.
func DeadlineExceeded(now Timestamp) *Error {
	return &Error{Code: CodeDeadlineExceeded, Reason: "deadline elapsed before the operation started", BackendTime: now.Time()}
}

// Lost is the refusal of a lease that is not held (any more) as the
// request names it.
func Lost(now Timestamp) *Error {
	return &Error{Code: CodeLost, Reason: "the lease is not held", BackendTime: now.Time()}
}

// NotFound is the answer to a read of a lease that does not exist (or the
// caller may not see: zero now).
func NotFound(now Timestamp) *Error {
	return &Error{Code: CodeNotFound, Reason: "no such lease", BackendTime: now.Time()}
}

// RequestNotFound is the answer of LookupRequest for a request id with no
// committed result.
func RequestNotFound(now Timestamp) *Error {
	return &Error{Code: CodeNotFound, Reason: "no committed result for this request id", BackendTime: now.Time()}
}

// Conflict is the refusal of an acquisition while another unexpired lease,
// expiring at expiresAt, holds the identity; it may be retried then.
func Conflict(now, expiresAt Timestamp) *Error {
	return &Error{Code: CodeConflict, Reason: "another unexpired lease holds the identity",
		RetryAfter: expiresAt.Time().Sub(now.Time()), BackendTime: now.Time()}
}

// IdempotencyConflict is the refusal of a mutation whose request id was
// used before with other inputs.
func IdempotencyConflict(now Timestamp) *Error {
	return &Error{Code: CodeIdempotencyConflict, Reason: "request id was reused with different inputs", BackendTime: now.Time()}
}

// CommitIdempotencyConflict is the refusal of a commit authorization whose
// commit id was used before with other inputs.
func CommitIdempotencyConflict(now Timestamp) *Error {
	return &Error{Code: CodeIdempotencyConflict, Reason: "commit id was reused with different inputs", BackendTime: now.Time()}
}

// CounterExhausted is the refusal of an acquisition whose fencing counter
// reached MaxFencingToken. It alerts operators on log.
func CounterExhausted(log *slog.Logger, id Identity, now Timestamp) *Error {
	log.Error("ALERT fencing counter exhausted; acquisition refused", IdentityAttrs(id)...)
	return &Error{Code: CodeCounterExhausted, Reason: "the fencing counter reached 2^53-1", BackendTime: now.Time()}
}

// CommitRejected is the refusal of a commit whose fencing token is below
// the sink's high-water mark. It alerts operators on log.
func CommitRejected(log *slog.Logger, id Identity, now Timestamp) *Error {
	log.Error("ALERT commit token below the sink's high-water mark", IdentityAttrs(id)...)
	return &Error{Code: CodeCommitRejected, Reason: "fencing token is below the sink's high-water mark", BackendTime: now.Time()}
}

// CorruptState alerts operators on log that stored state of identity id
// (zero if unknown) is corrupt, and fails closed with the uniform corrupt
// error; reason goes to the log only.
func CorruptState(log *slog.Logger, id Identity, reason string) *Error {
	attrs := append([]any{"reason", reason}, IdentityAttrs(id)...)
	log.Error("ALERT corrupt lease state; failing closed", attrs...)
	return &Error{Code: CodeCorrupt, Reason: "stored lease state is corrupt; failing closed"}
}

// IdentityAttrs are the log attributes of an identity: its canonical
// scope, never the raw lock key. None for the zero identity.
func IdentityAttrs(id Identity) []any {
	if id == (Identity{}) {
		return nil
	}
	return []any{"tenant_id", id.TenantID, "program_id", id.ProgramID, "target_namespace", id.TargetNamespace,
		"target_id", id.TargetID, "actor_name", id.ActorName, "workflow_name", id.WorkflowName, "operation_class", id.OperationClass}
}

// MatchHistory returns the history entry raw holds if it strictly decodes
// and is the terminal evidence of leaseID; nil otherwise (an entry that
// fails decoding names no lease).
func MatchHistory(raw []byte, leaseID string) *HistoryEntry {
	if h, err := DecodeHistoryEntry(raw); err == nil && h.Record.LeaseID == leaseID {
		return h
	}
	return nil
}

// CurrentOf is the state at backend time now of lease orig, given its
// identity's active record (nil if none) and ended, which finds orig's
// terminal evidence (nil if none): the active record if it is still orig,
// else orig's terminal record, else orig expired, the only terminal state
// that needs no evidence (the evidence of its end is gone with history
// retention).
func CurrentOf(orig, active *Record, now Timestamp, ended func() *HistoryEntry) *Record {
	if active != nil && active.LeaseID == orig.LeaseID {
		return active.ObservedAt(now)
	}
	if h := ended(); h != nil {
		return h.Record
	}
	gone := orig.Clone()
	gone.State = StateExpired
	return gone
}

// Replay answers mutation p from its stored idempotency evidence ev at
// backend time now: the original result, or idempotency_conflict if the
// request id was used with other inputs. A replayed acquire or renewal,
// whose first answer said the caller holds the lease, also reports the
// lease's state now where it has changed (current finds it): a caller
// resolving an unknown outcome learns that it holds nothing any more. The
// contract requires it of an acquire, whose replay fails if current
// fails. A renewal's intact evidence still answers when the state cannot
// be read because a record is corrupt (the state left out, as Lookup
// leaves it out); any other failure (a read that failed) fails it, so an
// ended lease is never answered as renewed for want of a read.
func (p Prepared) Replay(ev *IdempotencyRecord, now Timestamp, current func(orig *Record) (*Record, error)) (Result, error) {
	if ev.Op != p.Op || ev.Digest != p.Digest || ev.Lease.LockKey != p.LockKey {
		return Result{}, IdempotencyConflict(now)
	}
	r := ev.Result()
	if p.Op == OpAcquire || p.Op == OpRenew {
		cur, err := current(ev.Lease)
		switch {
		case err != nil && (p.Op == OpAcquire || CodeOf(err) != CodeCorrupt):
			return Result{}, err
		case err == nil && cur.State != ev.Lease.State:
			r.Current = cur
		}
	}
	return r, nil
}

// DecodeEvidence strictly decodes raw, the idempotency evidence stored
// under p's scope: corrupt if it does not decode, or cannot be evidence
// of p's request (answers). Other checks (operation, digest, lock key)
// are Replay's and Lookup's.
func (p Prepared) DecodeEvidence(raw []byte) (*IdempotencyRecord, error) {
	ev, err := DecodeIdempotencyRecord(raw)
	if err == nil && !p.answers(ev) {
		err = corrupt("idempotency evidence of another request")
	}
	return ev, err
}

// answers reports whether ev can be evidence stored for p's request: an
// acquisition that granted a lease must be that lease's own acquisition,
// whose owner and request id give p's scope. A store that cannot compute
// a scope (Valkey's library) writes an ending's acquisition evidence under
// the scope its record carries; a record whose scope line was changed to
// another request's would otherwise answer that request with this lease
// (review).
func (p Prepared) answers(ev *IdempotencyRecord) bool {
	if ev.Op != OpAcquire || ev.Code != CodeAcquired || ev.Lease == nil {
		return true
	}
	return ev.Lease.AcquisitionScope() == p.Scope
}

// Lookup is the answer of LookupRequest p from raw, the evidence stored
// under its scope: the original result, with the lease's state now where
// it has changed (current finds it; if it cannot, the state is left out).
// ok is false for evidence that fails decoding, is of another operation
// or lock key, or, for an owner's operation (acquire, renew, release), of
// a lease another principal owns, or that p's request cannot have
// (DecodeEvidence): corrupt, since the scope it is stored under names the
// requester (damage, a misplaced copy).
func (p Prepared) Lookup(raw []byte, current func(orig *Record) (*Record, error)) (res Result, ok bool) {
	ev, err := p.DecodeEvidence(raw)
	if err != nil || ev.Op != p.Op || ev.Lease.LockKey != p.LockKey {
		return Result{}, false
	}
	switch p.Op {
	case OpAcquire, OpRenew, OpRelease:
		if ev.Lease.OwnerPrincipalID != p.Principal {
			return Result{}, false
		}
	}
	res = ev.Result()
	if cur, err := current(ev.Lease); err == nil && cur.State != ev.Lease.State {
		res.Current = cur
	}
	return res, true
}

// DefaultReapInterval is how often a backend's reaper runs by default.
const DefaultReapInterval = 30 * time.Second

// Reaper is a backend's periodic storage reclamation.
type Reaper struct {
	// Interval is the time between passes: zero means
	// DefaultReapInterval, negative no reaper.
	Interval time.Duration
	// Bounded gives each pass a context that ends after one interval, so
	// a silent server cannot hold the reaper.
	Bounded bool
	// Pass is one pass. An error other than backend_unavailable (a closed
	// or unreachable store; the next pass tries again) is logged by its
	// code.
	Pass func(context.Context) error
	Log  *slog.Logger
}

// Start runs the reaper in a goroutine counted by wg until stop is closed.
func (r Reaper) Start(wg *sync.WaitGroup, stop <-chan struct{}) {
	if r.Interval == 0 {
		r.Interval = DefaultReapInterval
	}
	if r.Interval < 0 {
		return
	}
	wg.Add(1)
	go r.loop(wg, stop)
}

func (r Reaper) loop(wg *sync.WaitGroup, stop <-chan struct{}) {
	defer wg.Done()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if r.Bounded {
				ctx, cancel = context.WithTimeout(ctx, r.Interval)
			}
			if err := r.Pass(ctx); err != nil && CodeOf(err) != CodeBackendUnavailable {
				r.Log.Warn("lease store cleanup failed", "code", CodeOf(err))
			}
			cancel()
		}
	}
}

// NewLease is the record of the lease acquisition req (prepared as p)
// grants at backend time now with fencing token token. bolt and etcd
// build it here; the Valkey function builds the same record.
func NewLease(req AcquireRequest, p Prepared, now Timestamp, token uint64) *Record {
	rec := &Record{
		RecordVersion: RecordVersion, LockKey: p.LockKey,
		LeaseID:          NewLeaseID(now),
		OwnerPrincipalID: req.Caller.PrincipalID, OwnerClientID: req.Caller.ClientID,
		OwnerCredentialID: req.Caller.CredentialID, ServiceInstanceID: req.ServiceInstanceID,
		FencingToken: token,
		AcquiredAt:   now, RenewedAt: now,
		ExpiresAt:         LeaseExpiry(now, req.TTL, now, req.MaximumLifetime),
		TTLMs:             req.TTL.Milliseconds(),
		MaximumLifetimeMs: req.MaximumLifetime.Milliseconds(),
		ExecutionID:       req.ExecutionID, JobID: req.JobID, TraceID: req.TraceID,
		RequestID: req.RequestID, Metadata: req.Metadata, State: StateActive,
	}
	rec.SetIdentity(p.Identity)
	return rec
}

// Renewed is cur renewed at backend time now with ttl (zero: cur's own
// ttl_ms), its expiry bounded by its maximum lifetime.
func Renewed(cur *Record, ttl time.Duration, now Timestamp) *Record {
	if ttl == 0 {
		ttl = time.Duration(cur.TTLMs) * time.Millisecond
	}
	next := cur.Clone()
	next.RenewedAt = now
	next.ExpiresAt = LeaseExpiry(now, ttl, cur.AcquiredAt, time.Duration(cur.MaximumLifetimeMs)*time.Millisecond)
	next.TTLMs = ttl.Milliseconds()
	return next
}

// LeaseExpiry is min(now+ttl, acquired+maximum lifetime).
func LeaseExpiry(now Timestamp, ttl time.Duration, acquired Timestamp, lifetime time.Duration) Timestamp {
	e, limit := now.Add(ttl), acquired.Add(lifetime)
	if limit.Before(e) {
		return limit
	}
	return e
}

// HeldBy reports whether r is the lease a holder names: lease id, token,
// owner and service instance all match (renew, release, commit).
func (r *Record) HeldBy(leaseID string, token uint64, owner, instance string) bool {
	return r.LeaseID == leaseID && r.FencingToken == token && r.OwnerPrincipalID == owner && r.ServiceInstanceID == instance
}
