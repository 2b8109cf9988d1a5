package executor

import (
	"errors"

	"github.com/starintel/starlease/lease"
)

// Cancellation causes of the work context. Each is wrapped in a *CauseError.
var (
	// ErrLeaseExpired: the local estimate of expires_at was reached without
	// a renewal that extended it (a paused renewal loop, the maximum
	// lifetime), or the backend shows the lease expired.
	ErrLeaseExpired = errors.New("executor: lease expired")
	// ErrRenewalRejected: a renewal was refused (lease_lost or another
	// final answer), or a late renewal could not be confirmed by inspection.
	ErrRenewalRejected = errors.New("executor: renewal rejected; lease lost")
	// ErrLeaseLost: a commit found the lease gone (lease_lost from the
	// backend or commit_rejected by a fencing guard) and inspection did not
	// show it revoked, released or expired.
	ErrLeaseLost = errors.New("executor: lease lost at commit")
	// ErrBackendUnavailable: renewals failed until less than half the safety
	// margin was left before the local expiry estimate. The lease may still
	// be active at the backend; the work stops before it expires there.
	ErrBackendUnavailable = errors.New("executor: lease backend unavailable beyond the safety margin")
	// ErrReleased: the lease was released by someone else, typically an
	// administrator's force-release.
	ErrReleased = errors.New("executor: lease released")
	// ErrRevoked: an administrator revoked the lease.
	ErrRevoked = errors.New("executor: lease revoked")
	// ErrWorkDone: the work returned; the executor is releasing the lease.
	ErrWorkDone = errors.New("executor: work done")
)

// CauseError is the cancellation cause of a work context.
type CauseError struct {
	// Reason is one of the Err… sentinels.
	Reason error
	// Err is the backend's typed answer that led here, when there was one.
	Err *lease.Error
	// State is the lease state an inspection showed, when one was made.
	State lease.State
	// Detail is a short explanation.
	Detail string
}

func (e *CauseError) Error() string {
	s := e.Reason.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.State != "" {
		s += " (lease state " + string(e.State) + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap exposes the sentinel and the backend's *lease.Error.
func (e *CauseError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Err}
}

// LeaseLoss reports whether err (typically context.Cause of a work context)
// says the work can no longer act under its lease: every cause except
// ErrWorkDone and the parent context's own.
func LeaseLoss(err error) bool {
	for _, s := range []error{ErrLeaseExpired, ErrRenewalRejected, ErrLeaseLost, ErrBackendUnavailable, ErrReleased, ErrRevoked} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func causeOf(reason error, le *lease.Error, detail string) *CauseError {
	return &CauseError{Reason: reason, Err: le, Detail: detail}
}
