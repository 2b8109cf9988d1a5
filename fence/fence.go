package fence

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/starintel/starlease/lease"
)

// Envelope is what every authoritative commit carries from the lease holder
// to the fenced-write boundary: the contract's lock_key, lease_id,
// fencing_token, expires_at, execution_id and trace_id, plus the identity,
// service instance and owner the backend matches the lease against.
//
// ExpiresAt is the backend's expires_at as of the holder's last successful
// acquire or renewal. It travels for the record; it never authorizes anything
// (only AuthorizeCommit at backend time does) and must not be compared with
// a local clock.
type Envelope struct {
	LockKey           string          `json:"lock_key"`
	Identity          lease.Identity  `json:"lock_identity"`
	LeaseID           string          `json:"lease_id"`
	FencingToken      uint64          `json:"fencing_token"`
	ExpiresAt         lease.Timestamp `json:"expires_at"`
	ExecutionID       string          `json:"execution_id"`
	JobID             string          `json:"job_id"`
	TraceID           string          `json:"trace_id,omitempty"`
	ServiceInstanceID string          `json:"service_instance_id"`
	OwnerPrincipalID  string          `json:"owner_principal_id"`
}

// EnvelopeOf builds the envelope of a lease record.
func EnvelopeOf(rec *lease.Record) Envelope {
	return Envelope{
		LockKey: rec.LockKey, Identity: rec.Identity(), LeaseID: rec.LeaseID,
		FencingToken: rec.FencingToken, ExpiresAt: rec.ExpiresAt,
		ExecutionID: rec.ExecutionID, JobID: rec.JobID, TraceID: rec.TraceID,
		ServiceInstanceID: rec.ServiceInstanceID, OwnerPrincipalID: rec.OwnerPrincipalID,
	}
}

// Validate checks that every field a commit needs is present. It is a
// shape check only: whether the lease is held is the backend's decision.
func (e Envelope) Validate() error {
	if lease.CheckLockKey(e.LockKey) != nil {
		return lease.Invalid("lock_key", "must be a canonical lock key")
	}
	if e.FencingToken < 1 || e.FencingToken > lease.MaxFencingToken {
		return lease.Invalid("fencing_token", "must be between 1 and 2^53-1")
	}
	for _, f := range []struct{ name, v string }{
		{"lease_id", e.LeaseID}, {"execution_id", e.ExecutionID}, {"job_id", e.JobID},
		{"service_instance_id", e.ServiceInstanceID}, {"owner_principal_id", e.OwnerPrincipalID},
	} {
		if err := lease.CheckOpaqueID(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

// CommitRequest is the AuthorizeCommit request of this envelope for the
// one write w to sink. A publication through the fenced outbox passes the
// zero Binding and sets the request's Outbox: the message is its write.
func (e Envelope) CommitRequest(sink, commitID string, w Binding, deadline time.Time, caller lease.Caller) lease.CommitRequest {
	return lease.CommitRequest{
		Identity: e.Identity, LeaseID: e.LeaseID, FencingToken: e.FencingToken,
		ServiceInstanceID: e.ServiceInstanceID, Sink: sink, CommitID: commitID,
		ExecutionID: e.ExecutionID, JobID: e.JobID, TraceID: e.TraceID,
		Target: w.Target, PayloadSHA256: w.PayloadSHA256, DeadlineAt: deadline, Caller: caller,
	}
}

// Binding names the one write an authorization is for: Target, the object
// the write changes in its sink (a document id), and PayloadSHA256, the hex
// SHA-256 of what the sink writes there as the sink computes it (empty only
// where a sink cannot check a payload). The backend covers both with the
// commit's digest and returns them in the commit; the guard carries them;
// the sink refuses the guard for any other write (Guard.Authorizes).
type Binding struct {
	Target        string
	PayloadSHA256 string
}

// Authorizer runs the fenced-write validation at the lease backend's
// linearization point. lease.Store satisfies it; so does an adapter over the
// HTTP client. Errors are *lease.Error.
type Authorizer interface {
	AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error)
}

// Guard is the proof of one accepted commit authorization: what a writer
// stores with the write and conditions the write on. Its JSON form is the
// "starintel_fence" object of fenced documents.
//
// A guard authorizes exactly one write: Target and PayloadSHA256 (the
// Binding the backend accepted) name it, JobID the lease's job, and
// CommitSeq orders it among the lease's commits, so an object holding a
// later commit of the lease refuses an earlier (or the same) one. Guards
// stored before the binding existed lack them; they still order tokens
// (Validate), but no new write is admitted without them (Admit).
type Guard struct {
	LockKey       string          `json:"lock_key"`
	LeaseID       string          `json:"lease_id"`
	FencingToken  uint64          `json:"fencing_token"`
	ExecutionID   string          `json:"execution_id"`
	JobID         string          `json:"job_id,omitempty"`
	TraceID       string          `json:"trace_id,omitempty"`
	Sink          string          `json:"sink"`
	CommitID      string          `json:"commit_id"`
	Target        string          `json:"target,omitempty"`
	PayloadSHA256 string          `json:"payload_sha256,omitempty"`
	CommitSeq     uint64          `json:"commit_seq,omitempty"`
	AcceptedAt    lease.Timestamp `json:"accepted_at"`
}

// NewGuard builds the guard of an accepted commit under env.
func NewGuard(env Envelope, c lease.Commit) Guard {
	return Guard{LockKey: env.LockKey, LeaseID: c.LeaseID, FencingToken: c.FencingToken,
		ExecutionID: c.ExecutionID, JobID: c.JobID, TraceID: c.TraceID, Sink: c.Sink, CommitID: c.CommitID,
		Target: c.Target, PayloadSHA256: c.PayloadSHA256, CommitSeq: c.Seq, AcceptedAt: c.AcceptedAt}
}

// Binding is the write g was authorized for.
func (g Guard) Binding() Binding { return Binding{Target: g.Target, PayloadSHA256: g.PayloadSHA256} }

// Authorizes reports, as commit_rejected, a guard that was not issued for
// the write w: another target, or another payload (a guard without a
// payload digest was issued by a sink that cannot check one, and is
// refused by one that can). It is every sink's check of the binding, made
// at the sink's own linearization point beside Admit.
func (g Guard) Authorizes(w Binding) error {
	switch {
	case g.Target == "" || g.JobID == "" || g.CommitSeq < 1:
		return rejected("the write's fence names no write or job (issued before writes were bound)")
	case g.Target != w.Target:
		return rejected("the guard was authorized for another write")
	case g.PayloadSHA256 != w.PayloadSHA256:
		return rejected("the guard was authorized for another payload")
	}
	return nil
}

// Validate reports a missing or incomplete guard as commit_rejected: a write
// without a complete fence is never accepted. It is the shape of any
// stored guard, including those written before writes were bound (no
// Target or JobID); Admit also requires the binding of a new write.
func (g Guard) Validate() error {
	switch {
	case lease.CheckLockKey(g.LockKey) != nil:
		return rejected("the write carries no fence (lock key missing or malformed)")
	case g.FencingToken < 1 || g.FencingToken > lease.MaxFencingToken:
		return rejected("the write's fencing token is out of range")
	case g.LeaseID == "" || g.ExecutionID == "" || g.Sink == "" || g.CommitID == "":
		return rejected("the write's fence is incomplete")
	case g.AcceptedAt.IsZero():
		return rejected("the write's fence has no accepted_at")
	case lease.CheckPayloadSHA256(g.PayloadSHA256) != nil:
		return rejected("the write's fence has a malformed payload digest")
	case g.CommitSeq > lease.MaxFencingToken:
		return rejected("the write's fence has a commit seq out of range")
	}
	return nil
}

// Admit is the conditional-write rule every fenced store applies atomically
// with the write, given the guard stored with the current object (nil if
// none): next must be a complete guard, bound to a write and a job, for the
// same lock key with a token not lower than the stored one. One token
// belongs to one lease, so an equal token with a different lease id is
// refused too; at an equal token the commit seq must be higher than the
// stored one, so a lease's earlier (or the same) authorization never lands
// over its later one: a replay after revoke rolls nothing back. A sink
// answers the exact repeat of the write it holds (same guard, same
// payload) itself, as already done. The error is a *lease.Error with code
// commit_rejected, or lease_conflict for an earlier commit of the same
// lease (the holder's own concurrent writes, not a loss). CouchDB's validate_doc_update enforces the same rule.
// Admit does not know which write is made: the sink also checks
// next.Authorizes(the write).
func Admit(stored *Guard, next Guard) error {
	if err := next.Validate(); err != nil {
		return err
	}
	if next.Target == "" || next.JobID == "" || next.CommitSeq < 1 {
		return rejected("the write's fence names no write or job (issued before writes were bound)")
	}
	if stored == nil {
		return nil
	}
	switch {
	case stored.LockKey != next.LockKey:
		return rejected("the object belongs to a different lock key")
	case next.FencingToken < stored.FencingToken:
		return rejected("fencing token is lower than the stored token")
	case next.FencingToken == stored.FencingToken && next.LeaseID != stored.LeaseID:
		return rejected("fencing token belongs to another lease")
	case next.FencingToken == stored.FencingToken && next.CommitSeq <= stored.CommitSeq:
		// Not a loss (the lease may be live): a lease_conflict, which the
		// committer's loss handler does not see.
		return &lease.Error{Code: lease.CodeConflict, Reason: "the object already holds this or a later commit of the lease"}
	}
	return nil
}

func rejected(reason string) *lease.Error {
	return &lease.Error{Code: lease.CodeCommitRejected, Reason: reason}
}

// Defaults of a Committer.
const (
	DefaultAttempts    = 4
	DefaultCallTimeout = 5 * time.Second
	DefaultBackoff     = 20 * time.Millisecond
)

// Option configures a Committer.
type Option func(*Committer)

// WithAttempts bounds how many times one authorization is sent (first try
// included) when the outcome is unknown or the backend cannot answer; every
// retry uses the same commit id. n < 1 means DefaultAttempts.
func WithAttempts(n int) Option { return func(c *Committer) { c.retry.Attempts = n } }

// WithCallTimeout bounds each AuthorizeCommit call; its deadline_at is the
// earlier of now+d and the context's deadline.
func WithCallTimeout(d time.Duration) Option { return func(c *Committer) { c.retry.CallTimeout = d } }

// WithBackoff sets the first retry delay (doubled on each retry).
func WithBackoff(d time.Duration) Option { return func(c *Committer) { c.retry.Backoff = d } }

// WithClock sets the clock deadlines are computed from.
func WithClock(now func() time.Time) Option { return func(c *Committer) { c.retry.Now = now } }

// WithLossHandler registers f, called (synchronously, before Authorize or
// Write returns) when the boundary reports that the lease is gone: lease_lost
// from authorization, or commit_rejected from authorization or from a sink's
// conditional write. The executor uses it to cancel the work at once.
func WithLossHandler(f func(err *lease.Error)) Option { return func(c *Committer) { c.onLoss = f } }

// Committer authorizes the commits of one lease. It is safe for concurrent use.
type Committer struct {
	authz  Authorizer
	caller lease.Caller
	retry  Retry
	onLoss func(*lease.Error)

	mu  sync.Mutex
	env Envelope
}

// NewCommitter returns the committer of the lease env describes. caller is
// the owner's security context; an empty PrincipalID is taken from the
// envelope.
func NewCommitter(authz Authorizer, env Envelope, caller lease.Caller, opts ...Option) *Committer {
	if caller.PrincipalID == "" {
		caller.PrincipalID = env.OwnerPrincipalID
	}
	c := &Committer{authz: authz, env: env, caller: caller}
	for _, o := range opts {
		o(c)
	}
	c.retry = c.retry.WithDefaults()
	return c
}

// Envelope returns the current envelope.
func (c *Committer) Envelope() Envelope {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.env
}

// SetExpiresAt records the backend expires_at of a renewal in the envelope.
// The lease holder's renewal loop calls it; it authorizes nothing.
func (c *Committer) SetExpiresAt(t lease.Timestamp) {
	c.mu.Lock()
	c.env.ExpiresAt = t
	c.mu.Unlock()
}

// Guard returns the guard of an accepted commit of this lease.
func (c *Committer) Guard(commit lease.Commit) Guard { return NewGuard(c.Envelope(), commit) }

// Authorize asks the lease backend whether the one write w to sink may
// linearize now under this lease. The commit id names the commit: a retry
// with the same id and write returns the original authorization
// (replayed), so an outcome_unknown, backend_unavailable or
// deadline_exceeded answer is retried with the same id up to the configured
// attempts. Errors are *lease.Error and pass through typed: lease_lost (the
// lease is not held at backend time), commit_rejected (the token is below
// the sink's high-water mark), outcome_unknown (still unresolved after
// every attempt: do not write), invalid_lease_request, idempotency_conflict
// (the id was used for a different commit or another write).
func (c *Committer) Authorize(ctx context.Context, sink, commitID string, w Binding) (lease.Commit, error) {
	env := c.Envelope()
	res, err := c.retry.Authorize(ctx, c.authz, func(deadline time.Time) lease.CommitRequest {
		return env.CommitRequest(sink, commitID, w, deadline, c.caller)
	})
	if err != nil {
		if isLoss(err) {
			c.lost(lease.AsError(err))
		}
		return lease.Commit{}, err
	}
	if err := CheckCommit(env, commitID, w, res); err != nil {
		return lease.Commit{}, err
	}
	return res.Commit, nil
}

// Retry is the retry rule of a commit authorization: an answer that says
// nothing was decided (outcome_unknown, backend_unavailable,
// deadline_exceeded, rate limited) is retried with the same request — the
// same commit id, which makes AuthorizeCommit idempotent — up to Attempts
// times with doubling backoff; every other answer is final.
type Retry struct {
	Attempts    int
	CallTimeout time.Duration
	Backoff     time.Duration
	Now         func() time.Time
}

// WithDefaults fills unset fields with DefaultAttempts, DefaultCallTimeout,
// DefaultBackoff and time.Now.
func (r Retry) WithDefaults() Retry {
	if r.Attempts < 1 {
		r.Attempts = DefaultAttempts
	}
	if r.CallTimeout <= 0 {
		r.CallTimeout = DefaultCallTimeout
	}
	if r.Backoff <= 0 {
		r.Backoff = DefaultBackoff
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	return r
}

// Authorize sends build(deadline) until an answer is final. Each attempt's
// deadline is the earlier of now+CallTimeout and ctx's. Errors are
// *lease.Error.
func (r Retry) Authorize(ctx context.Context, authz Authorizer, build func(deadline time.Time) lease.CommitRequest) (lease.CommitResult, error) {
	var last *lease.Error
	delay := r.Backoff
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return lease.CommitResult{}, last
			}
			return lease.CommitResult{}, &lease.Error{Code: lease.CodeDeadlineExceeded, Reason: "context ended before the commit was authorized"}
		}
		deadline := r.Now().Add(r.CallTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		res, err := authz.AuthorizeCommit(ctx, build(deadline))
		if err == nil {
			return res, nil
		}
		last = lease.AsError(err)
		switch last.Code {
		case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded, lease.CodeRateLimited:
		default:
			return lease.CommitResult{}, last
		}
		if attempt >= r.Attempts {
			return lease.CommitResult{}, last
		}
		wait := delay
		if last.RetryAfter > wait {
			wait = last.RetryAfter
		}
		delay *= 2
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// isLoss reports whether err says the lease no longer authorizes commits.
func isLoss(err error) bool {
	c := lease.CodeOf(err)
	return c == lease.CodeLost || c == lease.CodeCommitRejected
}

// CheckCommit fails closed on an authorization that is not for this lease,
// commit and write. A publication passes the zero Binding: its write is the
// message, which the backend names (message id and body digest).
func CheckCommit(env Envelope, commitID string, w Binding, res lease.CommitResult) error {
	cm := res.Commit
	if res.Code != lease.CodeCommitAuthorized || cm.LeaseID != env.LeaseID ||
		cm.FencingToken != env.FencingToken || cm.CommitID != commitID || cm.AcceptedAt.IsZero() ||
		cm.ExecutionID != env.ExecutionID || cm.JobID != env.JobID || cm.Target == "" || cm.Seq < 1 ||
		(w != Binding{} && (cm.Target != w.Target || cm.PayloadSHA256 != w.PayloadSHA256)) {
		return &lease.Error{Code: lease.CodeCorrupt, Reason: "commit authorization does not match the lease"}
	}
	return nil
}

func (c *Committer) lost(err *lease.Error) {
	if c.onLoss != nil {
		c.onLoss(err)
	}
}

// ReportLoss tells the committer's loss handler that a commit made under its
// envelope by another path (a publication through the fenced outbox) was
// refused with lease_lost or commit_rejected, so the lease's holder learns
// of the loss on that commit as on its own. Other codes are ignored.
func (c *Committer) ReportLoss(err error) {
	var le *lease.Error
	if isLoss(err) && errors.As(err, &le) {
		c.lost(le)
	}
}

// Sink is a fenced writer: one store where commits land (a CouchDB database,
// a RabbitMQ outbox, an in-memory map in tests).
//
// Name is the sink name authorization is scoped by: the lease backend keeps
// the highest accepted token per lock key and sink. It must be a canonical
// identifier (lower case, letters, digits, "._:-").
//
// Bind names the one write payload is (Binding): a pure function of the
// payload, the same on every call.
//
// Commit MUST make the write conditional on g, atomically, in the store:
// refuse it unless g.Authorizes(Bind(payload)) and Admit(stored guard, g)
// hold for the object written, and record g with it. It returns a
// *lease.Error with code commit_rejected when the store refuses the guard;
// other errors are the store's own (a retry of the whole Write with the
// same commit id and payload is safe: authorization replays).
type Sink[P any] interface {
	Name() string
	Bind(payload P) (Binding, error)
	Commit(ctx context.Context, g Guard, payload P) error
}

// Write is one fenced commit: authorize the write of payload under the
// lease, then write it to sink conditioned on the resulting guard. It
// returns the guard the write carried. A rejection by the sink's guard
// (commit_rejected) also counts as lease loss and reaches the committer's
// loss handler.
func Write[P any](ctx context.Context, c *Committer, sink Sink[P], commitID string, payload P) (Guard, error) {
	w, err := sink.Bind(payload)
	if err != nil {
		return Guard{}, err
	}
	commit, err := c.Authorize(ctx, sink.Name(), commitID, w)
	if err != nil {
		return Guard{}, err
	}
	g := c.Guard(commit)
	if err := sink.Commit(ctx, g, payload); err != nil {
		c.ReportLoss(err)
		return g, err
	}
	return g, nil
}
