package executor

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// Lease is the lease a work function runs under. Its methods are safe for
// concurrent use.
type Lease struct {
	store     LeaseAPI
	spec      Spec
	tm        timing
	clk       Clock
	log       *slog.Logger
	committer *fence.Committer
	ctx       context.Context
	cancel    context.CancelCauseFunc

	mu       sync.Mutex
	rec      *lease.Record
	expiry   time.Time // local estimate of expires_at minus the skew allowance
	renewals int
	gone     bool // the backend said the lease is no longer held
}

func newLease(store LeaseAPI, spec Spec, rec *lease.Record, sent time.Time) *Lease {
	ttl := time.Duration(rec.TTLMs) * time.Millisecond
	l := &Lease{store: store, spec: spec, tm: timingFor(spec, ttl), clk: spec.Clock, rec: rec.Clone()}
	l.expiry = sent.Add(granted(rec) - l.tm.skew)
	l.log = spec.Logger.With("lease_id", rec.LeaseID, "fencing_token", rec.FencingToken,
		"execution_id", rec.ExecutionID, "service_instance_id", rec.ServiceInstanceID)
	l.committer = fence.NewCommitter(store, fence.EnvelopeOf(rec), spec.Caller,
		fence.WithClock(spec.Clock.Now), fence.WithCallTimeout(l.tm.callTimeout),
		fence.WithLossHandler(l.onCommitLoss))
	return l
}

// granted is the duration the backend granted: expires_at − renewed_at,
// both backend times.
func granted(rec *lease.Record) time.Duration {
	return rec.ExpiresAt.Time().Sub(rec.RenewedAt.Time())
}

// Committer is the fenced-write boundary of this lease: the work's commits
// go through it (fence.Write), never around it. A commit it finds the lease
// gone for cancels the work context at once.
func (l *Lease) Committer() *fence.Committer { return l.committer }

// Envelope is the lease's commit envelope (lock key, lease id, token,
// expires_at, execution and trace ids), for dispatch to other components.
func (l *Lease) Envelope() fence.Envelope { return l.committer.Envelope() }

// Record returns a copy of the lease as last acquired or renewed.
func (l *Lease) Record() *lease.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Clone()
}

// LeaseID returns the lease id.
func (l *Lease) LeaseID() string { return l.Record().LeaseID }

// LockKey returns the canonical lock key.
func (l *Lease) LockKey() string { return l.Record().LockKey }

// FencingToken returns the fencing token; it never changes for a lease.
func (l *Lease) FencingToken() uint64 { return l.Record().FencingToken }

// Renewals returns how many renewals have succeeded.
func (l *Lease) Renewals() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewals
}

// LocalExpiry returns the local-clock instant at which the executor will
// consider the lease expired (the estimate minus the skew allowance).
func (l *Lease) LocalExpiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiry
}

func (l *Lease) attrs() []any {
	r := l.Record()
	return []any{"tenant_id", r.TenantID, "program_id", r.ProgramID, "target_namespace", r.TargetNamespace,
		"target_id", r.TargetID, "actor_name", r.ActorName, "expires_at", r.ExpiresAt.String()}
}

// final reports whether rec has reached its maximum lifetime, so no renewal
// can extend it.
func final(rec *lease.Record) bool {
	return rec.ExpiresAt.UnixMilli() >= rec.AcquiredAt.UnixMilli()+rec.MaximumLifetimeMs
}

// lose cancels the work with cause, once.
func (l *Lease) lose(c *CauseError) {
	if l.ctx.Err() != nil {
		return
	}
	l.cancel(c)
	l.log.Warn("lease lost; cancelling work", "cause", c.Error())
}

// round is one renewal: one request id, retried until it succeeds or the
// give-up time passes.
type round struct {
	requestID string
	firstSend time.Time // local send time of the first attempt: the estimate's origin
	giveUpAt  time.Time
	attempts  int
	last      *lease.Error
}

type renewReply struct {
	res      lease.Result
	err      error
	deadline time.Time
}

// renewLoop keeps the lease alive until the work context ends, cancelling
// it on expiry, rejection, revocation or an unavailable backend.
func (l *Lease) renewLoop(done chan<- struct{}) {
	defer close(done)
	ctx := l.ctx
	replies := make(chan renewReply, 1) // one attempt in flight at most
	var (
		inflight    bool
		stopAttempt context.CancelFunc = func() {}
		rd          *round
		isFinal     = final(l.Record())
		next        = l.nextRenewal(l.clk.Now())
	)
	defer func() {
		// No goroutine outlives Run: cancel the attempt in flight and wait
		// for it (LeaseAPI implementations honour their context).
		stopAttempt()
		if inflight {
			<-replies
		}
	}()
	for {
		if h := l.spec.hooks; h != nil && h.wake != nil {
			h.wake()
		}
		if ctx.Err() != nil {
			return
		}
		now := l.clk.Now()
		expiry := l.LocalExpiry()
		if !now.Before(expiry) {
			detail := "local estimate of expires_at reached"
			if isFinal {
				detail = "maximum lifetime reached"
			}
			l.lose(causeOf(ErrLeaseExpired, nil, detail))
			return
		}
		if rd != nil && !now.Before(rd.giveUpAt) {
			l.lose(causeOf(ErrBackendUnavailable, rd.last, "renewal did not succeed within the safety margin"))
			return
		}
		if !inflight && !isFinal && !now.Before(next) {
			if rd == nil {
				rd = &round{requestID: l.spec.NewRequestID(), giveUpAt: expiry.Add(-l.tm.margin / 2)}
				if !now.Before(rd.giveUpAt) {
					rd.giveUpAt = expiry // late start (a paused loop): one last chance
				}
			}
			stopAttempt = l.startRenewal(rd, now, replies)
			inflight = true
		}
		wake := expiry
		if rd != nil && rd.giveUpAt.Before(wake) {
			wake = rd.giveUpAt
		}
		if !inflight && !isFinal && next.Before(wake) {
			wake = next
		}
		t := l.clk.NewTimer(wake.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		case r := <-replies:
			t.Stop()
			stopAttempt()
			inflight = false
			if !l.clk.Now().Before(l.LocalExpiry()) {
				continue // expired while the reply was in flight: the top of the loop cancels
			}
			switch l.handleRenewal(rd, r) {
			case renewStop:
				return
			case renewRetry:
				next = l.clk.Now().Add(l.retryDelay(rd))
			case renewDone:
				rd = nil
				now := l.clk.Now()
				isFinal = final(l.Record())
				next = l.nextRenewal(now)
			}
		}
	}
}

// nextRenewal is when to renew: the margin (and a random jitter) before the
// local expiry estimate, but not sooner than minGap from now.
func (l *Lease) nextRenewal(now time.Time) time.Time {
	at := l.LocalExpiry().Add(-l.tm.margin - jitter(l.tm.jitter))
	if floor := now.Add(l.tm.minGap); at.Before(floor) {
		at = floor
	}
	return at
}

func (l *Lease) retryDelay(rd *round) time.Duration {
	d := max(l.tm.margin/16, minRetryBackoff)
	for i := 1; i < rd.attempts && d < l.tm.margin/4; i++ {
		d *= 2
	}
	d = d/2 + jitter(d/2)
	if rd.last != nil && rd.last.RetryAfter > d {
		d = rd.last.RetryAfter
	}
	return d
}

// startRenewal sends one renewal attempt of rd in the background; its reply
// arrives on replies. Its deadline is the earlier of the call timeout and the
// round's give-up time: a reply after that deadline grants nothing.
func (l *Lease) startRenewal(rd *round, now time.Time, replies chan<- renewReply) context.CancelFunc {
	if rd.firstSend.IsZero() {
		rd.firstSend = now
	}
	deadline := now.Add(l.tm.callTimeout)
	if rd.giveUpAt.Before(deadline) {
		deadline = rd.giveUpAt
	}
	rec := l.Record()
	req := lease.RenewRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: rec.ServiceInstanceID,
		Mutation:          lease.Mutation{RequestID: rd.requestID, DeadlineAt: deadline, Caller: l.spec.Caller}}
	actx, cancel := context.WithTimeout(l.ctx, deadline.Sub(now))
	go func() {
		res, err := l.store.Renew(actx, req)
		replies <- renewReply{res: res, err: err, deadline: deadline}
	}()
	return cancel
}

type renewOutcome int

const (
	renewDone renewOutcome = iota
	renewRetry
	renewStop
)

// handleRenewal applies one renewal reply.
func (l *Lease) handleRenewal(rd *round, r renewReply) renewOutcome {
	rd.attempts++
	if r.err != nil {
		le := lease.AsError(r.err)
		switch le.Code {
		case lease.CodeLost:
			l.lose(l.diagnose(ErrRenewalRejected, le))
			return renewStop
		case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded, lease.CodeRateLimited:
			// Same request id next time: a renewal that did commit replays.
			rd.last = le
			l.log.Debug("renewal failed; retrying", "code", string(le.Code), "attempt", rd.attempts)
			return renewRetry
		default:
			l.lose(causeOf(ErrRenewalRejected, le, "renewal refused"))
			return renewStop
		}
	}
	cur := l.Record()
	rec := r.res.Lease
	if rec == nil || rec.LeaseID != cur.LeaseID || rec.FencingToken != cur.FencingToken ||
		rec.LockKey != cur.LockKey || rec.State != lease.StateActive {
		l.lose(causeOf(ErrRenewalRejected, &lease.Error{Code: lease.CodeCorrupt, Reason: "renewal returned another lease"}, "renewal reply does not match the lease"))
		return renewStop
	}
	if now := r.res.Current; r.res.Replayed && now != nil && now.State != lease.StateActive {
		// The replay of a renewal whose reply was lost, and whose lease
		// has ended since (revoked, released, expired): nothing is held.
		c := classify(now, ErrRenewalRejected, &lease.Error{Code: lease.CodeLost, Reason: "the renewed lease has ended since"})
		c.Detail = "replayed renewal of a lease that has ended"
		l.markGone(c)
		l.lose(c)
		return renewStop
	}
	expiry := rd.firstSend.Add(granted(rec) - l.tm.skew)
	if now := l.clk.Now(); now.After(r.deadline) {
		// A late reply grants nothing by itself: ask the backend.
		l.log.Warn("renewal reply arrived after its deadline; inspecting", "late_by", now.Sub(r.deadline).String())
		confirmed, c := l.confirm(rec)
		if c != nil {
			l.lose(c)
			return renewStop
		}
		if confirmed.Before(expiry) {
			expiry = confirmed
		}
	}
	l.mu.Lock()
	// A renewal changes only these; the rest stays as acquired, whatever
	// else a LeaseAPI's renewal result carries.
	next := l.rec.Clone()
	next.RenewedAt, next.ExpiresAt, next.TTLMs, next.State = rec.RenewedAt, rec.ExpiresAt, rec.TTLMs, rec.State
	l.rec = next
	l.expiry = expiry
	l.renewals++
	l.mu.Unlock()
	l.committer.SetExpiresAt(rec.ExpiresAt)
	l.log.Debug("lease renewed", "expires_at", rec.ExpiresAt.String(), "replayed", r.res.Replayed)
	return renewDone
}

// inspect reads the lease by id, bounded by the call timeout and by until.
func (l *Lease) inspect(until time.Time) (lease.Result, time.Time, time.Time, error) {
	send := l.clk.Now()
	deadline := send.Add(l.tm.callTimeout)
	if !until.IsZero() && until.Before(deadline) {
		deadline = until
	}
	if !send.Before(deadline) {
		return lease.Result{}, send, deadline, &lease.Error{Code: lease.CodeDeadlineExceeded, Reason: "no time left to inspect"}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), deadline.Sub(send))
	defer cancel()
	res, err := l.store.Inspect(ctx, lease.InspectRequest{LeaseID: l.LeaseID(), DeadlineAt: deadline, Caller: l.spec.Caller})
	return res, send, deadline, err
}

// confirm inspects the lease after a late renewal reply. The lease counts as
// renewed only if the backend shows it active, unchanged, with an expiry not
// before the renewed one; the result is then a local expiry estimate from
// the inspection (its send time plus the backend's remaining time).
// expiryUnknown is what confirm returns when the inspection proves the
// lease active but gives no backend time to measure from: later than any
// estimate, so the renewal's own estimate is kept.
var expiryUnknown = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func (l *Lease) confirm(renewed *lease.Record) (time.Time, *CauseError) {
	res, send, deadline, err := l.inspect(l.LocalExpiry())
	if err != nil {
		le := lease.AsError(err)
		if le.Code == lease.CodeNotFound {
			return time.Time{}, causeOf(ErrRenewalRejected, le, "late renewal; the lease is gone")
		}
		return time.Time{}, causeOf(ErrBackendUnavailable, le, "late renewal could not be confirmed")
	}
	if l.clk.Now().After(deadline) {
		return time.Time{}, causeOf(ErrBackendUnavailable, nil, "late renewal; the inspection was late too")
	}
	cur := res.Lease
	if cur == nil || cur.LeaseID != renewed.LeaseID || cur.FencingToken != renewed.FencingToken ||
		cur.State != lease.StateActive || cur.ExpiresAt.Before(renewed.ExpiresAt) {
		c := classify(cur, ErrRenewalRejected, nil)
		c.Detail = "late renewal not confirmed by inspection"
		l.markGone(c)
		return time.Time{}, c
	}
	if res.BackendTime.IsZero() {
		// No backend time in the answer (an HTTP view): the renewal's own
		// estimate stands, the lease being confirmed active.
		return expiryUnknown, nil
	}
	remaining := cur.ExpiresAt.Time().Sub(res.BackendTime.Time())
	if remaining <= 0 {
		return time.Time{}, causeOf(ErrLeaseExpired, nil, "late renewal; the lease has expired")
	}
	l.log.Info("late renewal confirmed by inspection")
	return send.Add(remaining - l.tm.skew), nil
}

// diagnose names why the backend said lease_lost: it inspects the lease by
// id and tells revoked, released (force-release) and expired apart; def is
// the cause when it cannot tell.
func (l *Lease) diagnose(def error, le *lease.Error) *CauseError {
	res, _, _, err := l.inspect(time.Time{})
	var c *CauseError
	if err != nil {
		c = causeOf(def, le, "")
	} else {
		c = classify(res.Lease, def, le)
	}
	l.mu.Lock()
	l.gone = true
	l.mu.Unlock()
	return c
}

func (l *Lease) markGone(c *CauseError) {
	if c.State != "" && c.State != lease.StateActive {
		l.mu.Lock()
		l.gone = true
		l.mu.Unlock()
	}
}

// classify maps an inspected record to a cause.
func classify(rec *lease.Record, def error, le *lease.Error) *CauseError {
	c := causeOf(def, le, "")
	if rec == nil {
		return c
	}
	c.State = rec.State
	switch rec.State {
	case lease.StateRevoked:
		c.Reason = ErrRevoked
	case lease.StateReleased:
		c.Reason = ErrReleased
	case lease.StateExpired:
		c.Reason = ErrLeaseExpired
	}
	return c
}

// onCommitLoss is the committer's loss handler: a commit found the lease
// gone, so the work is cancelled now, not at the next renewal.
func (l *Lease) onCommitLoss(le *lease.Error) {
	if l.ctx.Err() != nil {
		return
	}
	l.lose(l.diagnose(ErrLeaseLost, le))
}

// release ends the lease with a new request id, unless the backend already
// said it is gone. Failures are logged: the lease then expires on its own.
func (l *Lease) release(ctx context.Context) {
	l.mu.Lock()
	gone := l.gone
	l.mu.Unlock()
	if gone {
		l.log.Info("lease already ended; not releasing")
		return
	}
	rec := l.Record()
	req := lease.ReleaseRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: rec.ServiceInstanceID,
		Mutation:          lease.Mutation{RequestID: l.spec.NewRequestID(), Caller: l.spec.Caller}}
	delay := max(l.tm.margin/16, minRetryBackoff)
	for attempt := 1; ; attempt++ {
		send := l.clk.Now()
		req.DeadlineAt = send.Add(l.tm.callTimeout)
		cctx, cancel := context.WithTimeout(ctx, l.tm.callTimeout)
		_, err := l.store.Release(cctx, req)
		cancel()
		if err == nil {
			l.log.Info("lease released")
			return
		}
		le := lease.AsError(err)
		switch le.Code {
		case lease.CodeLost:
			l.log.Info("lease already ended at release", "code", string(le.Code))
			return
		case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded, lease.CodeRateLimited:
			if attempt < releaseAttempts && sleep(ctx, l.clk, delay) == nil {
				delay *= 2
				continue
			}
		}
		l.log.Warn("lease release failed; the lease will expire on its own", "code", string(le.Code), "error", le.Error())
		return
	}
}
