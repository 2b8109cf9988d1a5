package client

import (
	"strconv"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// Error is every failure a Client returns: the server's error envelope, or
// a transport or decoding failure classified by the contract's codes
// (Status 0 when no HTTP answer was read).
type Error struct {
	// Status is the HTTP status, 0 when no answer was read.
	Status int
	// Code is the wire code.
	Code lease.Code
	// Msg is the server's message, or the client's description.
	Msg string
	// Field names the offending input of an invalid_lease_request.
	Field string
	// CorrelationID is the server's correlation id of the request.
	CorrelationID string
	// Retryable is the server's retryability (for lease_outcome_unknown:
	// only with the same request id).
	Retryable bool
	// RetryAfter is the server's retry_after_ms hint.
	RetryAfter time.Duration
	// RequestID is the request id a mutation was sent with: retry with it
	// to resolve lease_outcome_unknown.
	RequestID string
	// Err is the transport or decoding cause, nil for a server answer.
	Err error
}

// Error describes the failure; it never contains the API key.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("starlease: ")
	if e.Status != 0 {
		b.WriteString(strconv.Itoa(e.Status))
		b.WriteByte(' ')
	}
	b.WriteString(string(e.Code))
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	if e.Field != "" && !strings.Contains(e.Msg, e.Field) {
		b.WriteString(" (field ")
		b.WriteString(e.Field)
		b.WriteByte(')')
	}
	if e.CorrelationID != "" {
		b.WriteString(" [correlation_id ")
		b.WriteString(e.CorrelationID)
		b.WriteByte(']')
	}
	if e.RequestID != "" && e.Code == lease.CodeOutcomeUnknown {
		b.WriteString(" [request_id ")
		b.WriteString(e.RequestID)
		b.WriteByte(']')
	}
	return b.String()
}

// Unwrap returns the transport or decoding cause.
func (e *Error) Unwrap() error { return e.Err }

// LeaseError converts e to the typed lease error of its code.
func (e *Error) LeaseError() *lease.Error {
	return &lease.Error{Code: e.Code, Field: e.Field, Reason: e.Msg, RetryAfter: e.RetryAfter}
}

// As lets errors.As(err, &leaseErr) and so lease.CodeOf and lease.AsError
// see the lease error of e.
func (e *Error) As(target any) bool {
	if p, ok := target.(**lease.Error); ok {
		*p = e.LeaseError()
		return true
	}
	return false
}

// Is matches a *lease.Error by code (errors.Is(err, &lease.Error{Code: c})).
func (e *Error) Is(target error) bool {
	t, ok := target.(*lease.Error)
	return ok && e.LeaseError().Is(t)
}
