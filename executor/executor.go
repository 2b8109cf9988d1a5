package executor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/lease"
)

// LeaseAPI is the part of the lease-store protocol the executor uses. A
// lease.Store satisfies it, and so does an adapter over the HTTP client.
// Errors are *lease.Error; anything else is treated as backend_unavailable.
type LeaseAPI interface {
	Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error)
	Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error)
	Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error)
	Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error)
	AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error)
}

var _ LeaseAPI = lease.Store(nil)

// Spec describes one leased execution.
type Spec struct {
	// Identity is the lock identity of the work.
	Identity lease.Identity
	// ServiceInstanceID names this process; ExecutionID, JobID and TraceID
	// the execution (TraceID may be empty).
	ServiceInstanceID string
	ExecutionID       string
	JobID             string
	TraceID           string
	// Metadata is the bounded, non-secret metadata of the lease.
	Metadata lease.Metadata
	// Caller is the owner's security context (principal, client,
	// credential id). Through the HTTP API it comes from the credential.
	Caller lease.Caller

	// TTL is the requested lease TTL (whole milliseconds). Required.
	TTL time.Duration
	// MaxLifetime bounds the lease however often it is renewed. Zero means
	// the larger of TTL and one hour.
	MaxLifetime time.Duration

	// RenewMargin is how long before the local expiry estimate a renewal is
	// sent. Zero means a third of the effective TTL; it is capped at half.
	// Renewals that fail are retried until half the margin is left, then
	// the work is cancelled with ErrBackendUnavailable.
	RenewMargin time.Duration
	// RenewJitter spreads renewals: each is sent up to this much earlier,
	// at random. Zero means a quarter of the margin; negative disables it.
	RenewJitter time.Duration
	// SkewAllowance is subtracted from the local expiry estimate to cover
	// clock-rate differences. Zero means 2% of the effective TTL, between
	// 1 ms and 1 s; negative disables it.
	SkewAllowance time.Duration
	// CallTimeout bounds each call to the lease API (its deadline_at and
	// the local deadline of its reply). Zero means a quarter of the renewal
	// margin (so a renewal can be retried at least once before half the
	// margin is left), at most 10 s.
	CallTimeout time.Duration
	// AcquireWait, if positive, retries a conflicting acquisition with
	// backoff and jitter for at most this long. Zero is one attempt
	// (conflict returns at once).
	AcquireWait time.Duration

	// NewRequestID generates request ids; nil means "req_" and a ULID.
	NewRequestID func() string
	// Clock is the local clock; nil means SystemClock().
	Clock Clock
	// Logger receives lease events; nil means slog.Default(). Either way
	// secret-shaped values are screened (audit.ScreenLogger).
	Logger *slog.Logger

	hooks *hooks
}

// hooks let tests inside the package reach points no store can.
type hooks struct {
	// wake is called at the top of every renewal-loop iteration; blocking
	// in it freezes the loop as a paused process would be.
	wake func()
}

// NewRequestID returns a new request id: "req_" and a ULID.
func NewRequestID() string { return "req_" + ulid.MustNew(ulid.Now(), rand.Reader).String() }

const (
	defaultLifetime   = time.Hour
	maxCallTimeout    = 10 * time.Second
	resolveAttempts   = 3
	releaseAttempts   = 3
	minRetryBackoff   = 5 * time.Millisecond
	acquireMaxBackoff = time.Second
)

func (s Spec) withDefaults() (Spec, error) {
	if s.TTL <= 0 {
		return s, lease.Invalid("ttl_ms", "must be positive")
	}
	if s.MaxLifetime == 0 {
		s.MaxLifetime = max(s.TTL, defaultLifetime)
	}
	if s.RenewMargin < 0 || s.RenewMargin >= s.TTL {
		return s, lease.Invalid("renew_margin", "must be shorter than the TTL")
	}
	if s.AcquireWait < 0 {
		return s, lease.Invalid("acquire_wait", "must not be negative")
	}
	if s.NewRequestID == nil {
		s.NewRequestID = NewRequestID
	}
	if s.Clock == nil {
		s.Clock = SystemClock()
	}
	// Its log names the lease's identity: a target id of 64 hex digits is
	// screened there as it is in audit events.
	s.Logger = audit.ScreenLogger(s.Logger, nil)
	return s, nil
}

// timing is the renewal schedule derived from the effective TTL.
type timing struct {
	margin, jitter, skew, callTimeout, minGap time.Duration
}

func timingFor(s Spec, ttl time.Duration) timing {
	var t timing
	t.margin = ttl / 3
	if s.RenewMargin > 0 {
		t.margin = min(s.RenewMargin, ttl/2)
	}
	switch {
	case s.RenewJitter == 0:
		t.jitter = t.margin / 4
	case s.RenewJitter > 0:
		t.jitter = min(s.RenewJitter, t.margin/2)
	}
	switch {
	case s.SkewAllowance == 0:
		t.skew = min(max(ttl/50, time.Millisecond), time.Second)
	case s.SkewAllowance > 0:
		t.skew = min(s.SkewAllowance, ttl/4)
	}
	t.callTimeout = s.CallTimeout
	if t.callTimeout <= 0 {
		t.callTimeout = min(t.margin/4, maxCallTimeout)
	}
	t.minGap = ttl / 10
	return t
}

// Run acquires the lease of spec on store, runs work under it and releases
// it. work gets a context cancelled, with a *CauseError cause, when the lease
// can no longer be trusted (see the package documentation), and the *Lease,
// whose Committer is the only way its commits may be made.
//
// Acquisition failures return the store's typed error (lease_conflict when
// another holder has the lease). Otherwise Run returns work's error; if that
// error is a context cancellation, the cancellation cause is joined to it.
// When work returns, fails or panics, the renewal loop stops and the lease is
// released with a new request id; a release failure is logged, not returned.
// A panic in work is re-raised after the release.
func Run(ctx context.Context, store LeaseAPI, spec Spec, work func(ctx context.Context, l *Lease) error) (err error) {
	if work == nil {
		return lease.Invalid("work", "must not be nil")
	}
	spec, err = spec.withDefaults()
	if err != nil {
		return err
	}
	rec, sent, err := acquire(ctx, store, spec)
	if err != nil {
		return fmt.Errorf("executor: acquire: %w", err)
	}
	l := newLease(store, spec, rec, sent)
	wctx, cancel := context.WithCancelCause(ctx)
	l.ctx, l.cancel = wctx, cancel
	l.log.Info("lease acquired", l.attrs()...)

	loopDone := make(chan struct{})
	go l.renewLoop(loopDone)
	defer func() {
		p := recover()
		cancel(ErrWorkDone)
		<-loopDone
		l.release(context.WithoutCancel(ctx))
		if p != nil {
			panic(p)
		}
	}()

	err = work(wctx, l)
	if err != nil && errors.Is(err, context.Canceled) {
		if c := context.Cause(wctx); c != nil && !errors.Is(err, c) {
			err = fmt.Errorf("%w: %w", err, c)
		}
	}
	return err
}

// acquire takes the lease: one attempt, or retries within spec.AcquireWait.
// Every attempt carries the same request id, so a retry after an unknown
// outcome returns the original lease instead of a second one. It returns the
// record and the local send time the expiry estimate starts from.
func acquire(ctx context.Context, store LeaseAPI, spec Spec) (*lease.Record, time.Time, error) {
	clk := spec.Clock
	tm := timingFor(spec, spec.TTL)
	req := lease.AcquireRequest{Identity: spec.Identity, ServiceInstanceID: spec.ServiceInstanceID,
		TTL: spec.TTL, MaximumLifetime: spec.MaxLifetime, ExecutionID: spec.ExecutionID, JobID: spec.JobID,
		TraceID: spec.TraceID, Metadata: spec.Metadata,
		Mutation: lease.Mutation{RequestID: spec.NewRequestID(), Caller: spec.Caller}}
	waitUntil := clk.Now().Add(spec.AcquireWait)
	var first time.Time
	delay := max(tm.margin/8, minRetryBackoff)
	unresolved := 0
	for {
		send := clk.Now()
		if first.IsZero() {
			first = send
		}
		req.DeadlineAt = send.Add(tm.callTimeout)
		cctx, cancel := context.WithTimeout(ctx, tm.callTimeout)
		res, err := store.Acquire(cctx, req)
		cancel()
		if err == nil {
			rec, err := checkAcquired(spec, res)
			if err != nil {
				return nil, time.Time{}, err
			}
			return rec, first, nil
		}
		le := lease.AsError(err)
		switch le.Code {
		case lease.CodeConflict:
			// A definitive answer: nothing was committed under this request
			// id, so the estimate may start from the next send.
			first = time.Time{}
			if !clk.Now().Before(waitUntil) {
				return nil, time.Time{}, le
			}
		case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded, lease.CodeRateLimited:
			unresolved++
			if unresolved >= resolveAttempts && !clk.Now().Before(waitUntil) {
				return nil, time.Time{}, le
			}
		default:
			return nil, time.Time{}, le
		}
		wait := delay/2 + jitter(delay/2)
		if le.RetryAfter > 0 {
			wait = min(wait, le.RetryAfter)
		}
		if rest := waitUntil.Sub(clk.Now()); rest > 0 && wait > rest {
			wait = rest
		}
		delay = min(delay*2, acquireMaxBackoff)
		if err := sleep(ctx, clk, wait); err != nil {
			return nil, time.Time{}, &lease.Error{Code: lease.CodeDeadlineExceeded, Reason: "context ended while acquiring"}
		}
	}
}

// checkAcquired fails closed on a result that is not an active lease of the
// requested identity.
func checkAcquired(spec Spec, res lease.Result) (*lease.Record, error) {
	rec := res.Lease
	if rec == nil || rec.State != lease.StateActive || res.Code != lease.CodeAcquired {
		return nil, &lease.Error{Code: lease.CodeCorrupt, Reason: "acquire returned no active lease"}
	}
	if res.Current != nil && res.Current.State != lease.StateActive {
		// A replay of a lease that has since ended: the caller must acquire
		// again with a new request id.
		return nil, &lease.Error{Code: lease.CodeLost, Reason: "the acquired lease has already ended"}
	}
	classes, err := lease.NewOperationClasses(rec.OperationClass)
	if err != nil {
		return nil, &lease.Error{Code: lease.CodeCorrupt, Reason: "acquired lease has a malformed identity"}
	}
	want, key, err := lease.CanonicalLockKey(spec.Identity, classes)
	if err != nil || want != rec.Identity() || key != rec.LockKey || rec.ServiceInstanceID != spec.ServiceInstanceID {
		return nil, &lease.Error{Code: lease.CodeCorrupt, Reason: "acquired lease is not the requested one"}
	}
	return rec, nil
}

// jitter is uniform in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(mrand.Int64N(int64(d)))
}
