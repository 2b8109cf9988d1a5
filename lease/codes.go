package lease

import (
	"errors"
	"fmt"
	"time"
)

// Code is a stable, typed result code. The string is the wire code of the
// contract's HTTP table; the set is closed.
type Code string

const (
	CodeAcquired         Code = "lease_acquired"
	CodeRenewed          Code = "lease_renewed"
	CodeReleased         Code = "lease_released"
	CodeInspected        Code = "lease_inspected"
	CodeListed           Code = "lease_listed"
	CodeForceReleased    Code = "lease_force_released"
	CodeRevoked          Code = "lease_revoked"
	CodeCommitAuthorized Code = "commit_authorized"
	CodeHistory          Code = "lease_history"

	CodeConflict            Code = "lease_conflict"
	CodeLost                Code = "lease_lost"
	CodeIdempotencyConflict Code = "idempotency_conflict"
	CodeDeadlineExceeded    Code = "deadline_exceeded"
	CodeRateLimited         Code = "lease_rate_limited"
	CodeBackendUnavailable  Code = "lease_backend_unavailable"
	CodeOutcomeUnknown      Code = "lease_outcome_unknown"
	CodeInvalidRequest      Code = "invalid_lease_request"
	CodeNotFound            Code = "lease_not_found"
	CodeCorrupt             Code = "lease_corrupt"
	CodeCounterExhausted    Code = "lease_counter_exhausted"
	CodeCommitRejected      Code = "commit_rejected"
	CodeInvalidCredential   Code = "invalid_credential"
	CodeAccessDenied        Code = "access_denied"
)

type codeInfo struct {
	success   bool
	retryable bool
	message   string
}

var codes = map[Code]codeInfo{
	CodeAcquired:         {success: true, message: "Target lease acquired"},
	CodeRenewed:          {success: true, message: "Target lease renewed"},
	CodeReleased:         {success: true, message: "Target lease released"},
	CodeInspected:        {success: true, message: "Target lease inspected"},
	CodeListed:           {success: true, message: "Target leases listed"},
	CodeForceReleased:    {success: true, message: "Target lease force-released"},
	CodeRevoked:          {success: true, message: "Target lease revoked"},
	CodeCommitAuthorized: {success: true, message: "Commit authorized"},
	CodeHistory:          {success: true, message: "Target lease history"},

	// A conflict clears when the holder releases or expires.
	CodeConflict: {retryable: true, message: "Target lease is unavailable"},
	// Lost is final for that lease: a new acquisition is a new request.
	CodeLost:                {message: "Target lease is no longer held"},
	CodeIdempotencyConflict: {message: "Request id was reused with different inputs"},
	// The operation did not start; the same request may be sent again.
	CodeDeadlineExceeded:   {retryable: true, message: "Deadline elapsed before the operation started"},
	CodeRateLimited:        {retryable: true, message: "Request rejected by admission control"},
	CodeBackendUnavailable: {retryable: true, message: "Lease backend cannot give a safe answer"},
	// Retryable only with the same request id, which resolves it.
	CodeOutcomeUnknown:    {retryable: true, message: "Outcome unknown; resolve by request id"},
	CodeInvalidRequest:    {message: "Invalid target lease request"},
	CodeNotFound:          {message: "Target lease not found"},
	CodeCorrupt:           {message: "Stored lease state is corrupt; failing closed"},
	CodeCounterExhausted:  {message: "Fencing counter exhausted; acquisition refused"},
	CodeCommitRejected:    {message: "Commit rejected by the fencing guard"},
	CodeInvalidCredential: {message: "Invalid credential"},
	CodeAccessDenied:      {message: "Access denied"},
}

// Codes returns every defined code.
func Codes() []Code {
	out := make([]Code, 0, len(codes))
	for c := range codes {
		out = append(out, c)
	}
	return out
}

// Known reports whether c is one of the closed set.
func (c Code) Known() bool { _, ok := codes[c]; return ok }

// Success reports whether c is a success code.
func (c Code) Success() bool { return codes[c].success }

// Retryable reports whether a caller may retry (outcome_unknown only with the
// same request id).
func (c Code) Retryable() bool { return codes[c].retryable }

// Message is the stable, non-secret human text for c.
func (c Code) Message() string {
	if i, ok := codes[c]; ok {
		return i.message
	}
	return "Unknown result"
}

// Error is the only error type that crosses the Store boundary. Reason and
// Field are safe to show the caller: they never carry backend detail, another
// owner's fields or secrets.
type Error struct {
	Code Code
	// Field names the offending input for invalid_request ("lock_identity.target_id").
	Field string
	// Reason is a short, safe explanation.
	Reason string
	// RetryAfter hints when a retry may succeed (conflict, rate limit).
	RetryAfter time.Duration
	// BackendTime is the backend time of the decision, when one was made.
	BackendTime time.Time
	// PublicReason marks a Reason written for the caller, which the HTTP
	// envelope shows in msg as it does every invalid_request's (a full
	// outbox, an exchange the server does not publish to). Other reasons
	// stay in logs: they may name backend detail.
	PublicReason bool
}

func (e *Error) Error() string {
	switch {
	case e.Field != "" && e.Reason != "":
		return fmt.Sprintf("%s: %s: %s", e.Code, e.Field, e.Reason)
	case e.Reason != "":
		return fmt.Sprintf("%s: %s", e.Code, e.Reason)
	default:
		return string(e.Code)
	}
}

// Is lets errors.Is(err, &Error{Code: c}) match on the code alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Field == "" && t.Reason == ""
}

// Errorf builds an *Error with a formatted reason.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// Invalid builds an invalid_request error naming the field.
func Invalid(field, reason string) *Error {
	return &Error{Code: CodeInvalidRequest, Field: field, Reason: reason}
}

// CodeOf maps any error to its code; an error that is not an *Error is a
// programming fault and reported as backend_unavailable, never as success.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var le *Error
	if errors.As(err, &le) {
		return le.Code
	}
	return CodeBackendUnavailable
}

// AsError returns err as *Error, wrapping foreign errors as
// backend_unavailable without their text, which may hold backend detail.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var le *Error
	if errors.As(err, &le) {
		return le
	}
	return &Error{Code: CodeBackendUnavailable, Reason: "backend error"}
}
