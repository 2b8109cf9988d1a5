package service

import (
	"time"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Call is what every request brings besides its own fields: who is calling
// (resolved by auth from the credential, never from the body), the
// correlation id, and for mutations the request id and the deadline the
// client asked for.
type Call struct {
	Principal     auth.Principal
	CorrelationID string
	RequestID     string
	// DeadlineAt is the client's deadline. HasDeadline says it was given
	// even if it is the zero time, which is then a deadline long past, not
	// the absence of one; a DeadlineAt that is not the zero time is given
	// by itself. Without either the server default applies.
	DeadlineAt  time.Time
	HasDeadline bool
}

// AcquireInput is an acquire request. MaximumLifetime zero means the
// configured maximum; Wait asks for bounded retry on conflict.
type AcquireInput struct {
	Identity          lease.Identity
	TTL               time.Duration
	MaximumLifetime   time.Duration
	ServiceInstanceID string
	ExecutionID       string
	JobID             string
	TraceID           string
	Metadata          lease.Metadata
	Wait              time.Duration
}

// HeldInput names a lease the caller holds (renew, release). TTL is renew's
// optional new TTL.
type HeldInput struct {
	Identity          lease.Identity
	LeaseID           string
	FencingToken      uint64
	ServiceInstanceID string
	TTL               time.Duration
}

// AdminInput names the observed lease an administrator ends.
type AdminInput struct {
	Identity     lease.Identity
	LeaseID      string
	FencingToken uint64
	Reason       string
	IncidentID   string
}

// InspectInput names exactly one of an identity or a lease id.
type InspectInput struct {
	Identity lease.Identity
	LeaseID  string
}

// CommitInput asks for a fenced-write authorization.
type CommitInput struct {
	Identity          lease.Identity
	LeaseID           string
	FencingToken      uint64
	ServiceInstanceID string
	Sink              string
	CommitID          string
	ExecutionID       string
	JobID             string
	TraceID           string
	// Target and PayloadSHA256 name the one write authorized
	// (lease.CommitRequest).
	Target        string
	PayloadSHA256 string
	// Outbox, when set, is a publication the authorization appends to the
	// store's fenced outbox in the same atomic step as the lease check
	// (lease.CommitRequest.Outbox); Target and PayloadSHA256 are then empty.
	Outbox *lease.OutboxMessage
}
