package client

import (
	"time"

	"github.com/starintel/starlease/lease"
)

// Requests are what a caller asks; the client turns each into its body
// (package wire, the one definition of the API's JSON). Owner principal,
// client and credential ids come from the API key, never from a body.

// AcquireRequest is the body of POST /acquire. WorkflowName and
// OperationClass of the identity may be empty (they mean "default").
// MaximumLifetimeMs zero means the server's configured maximum; WaitMs asks
// for bounded retry on conflict; a zero DeadlineAt means the call's
// deadline (sent as X-Request-Timeout-Ms).
type AcquireRequest struct {
	LockIdentity      lease.Identity
	TTLMs             int64
	MaximumLifetimeMs int64
	ServiceInstanceID string
	ExecutionID       string
	JobID             string
	TraceID           string
	Metadata          map[string]any
	RequestID         string
	DeadlineAt        time.Time
	WaitMs            int64
}

// RenewRequest is the body of POST /{lease_id}/renew. TTLMs zero keeps the
// lease's TTL.
type RenewRequest struct {
	LeaseID           string
	LockIdentity      lease.Identity
	FencingToken      uint64
	ServiceInstanceID string
	TTLMs             int64
	RequestID         string
	DeadlineAt        time.Time
}

// ReleaseRequest is the body of POST /{lease_id}/release.
type ReleaseRequest struct {
	LeaseID           string
	LockIdentity      lease.Identity
	FencingToken      uint64
	ServiceInstanceID string
	RequestID         string
	DeadlineAt        time.Time
}

// AdminRequest is the body of POST /{lease_id}/force-release and
// /{lease_id}/revoke: the observed lease and a reason or incident id.
type AdminRequest struct {
	LeaseID      string
	LockIdentity lease.Identity
	FencingToken uint64
	Reason       string
	IncidentID   string
	RequestID    string
	DeadlineAt   time.Time
}

// ListRequest selects the leases of GET /: by owner (OwnerPrincipalID), by
// target (all four target fields) or by program (TenantID and ProgramID).
// PageSize zero is the server's default.
type ListRequest struct {
	OwnerPrincipalID string
	TenantID         string
	ProgramID        string
	TargetNamespace  string
	TargetID         string
	PageSize         int
	PageToken        string
}

// CommitRequest is the body of POST /commits/authorize.
type CommitRequest struct {
	LockIdentity      lease.Identity
	LeaseID           string
	FencingToken      uint64
	ServiceInstanceID string
	Sink              string
	CommitID          string
	ExecutionID       string
	JobID             string
	TraceID           string
	// Target and PayloadSHA256 name the one write authorized: the object
	// it changes in the sink and the SHA-256 (hex) of what it writes.
	Target        string
	PayloadSHA256 string
	// Outbox, when set, is a fenced publication: the server appends it to
	// its backend's outbox in the same atomic step as the lease check, and
	// its relay publishes it. The message is then the write: Target and
	// PayloadSHA256 stay empty and the answer names the message id and the
	// body's SHA-256.
	Outbox *Outbox
}

// Outbox is a publication (POST /commits/authorize's outbox object).
// Body travels as standard base64 (encoding/json's form of []byte), at
// most lease.MaxOutboxBody bytes before encoding. Headers are application
// headers the relay publishes with the message (bounds in
// lease.MaxOutboxHeaders and beside it; names under
// lease.ReservedHeaderPrefix are refused).
type Outbox struct {
	Exchange    string
	RoutingKey  string
	ContentType string
	Body        []byte
	Headers     map[string]string
}

// Lease is the contract's success shape of a lease.
type Lease struct {
	LockIdentity lease.Identity
	LeaseID      string
	FencingToken uint64
	AcquiredAt   time.Time
	RenewedAt    time.Time
	ExpiresAt    time.Time
	TTLMs        int64
	State        lease.State
}

// TTL is TTLMs as a duration.
func (l Lease) TTL() time.Duration { return time.Duration(l.TTLMs) * time.Millisecond }

// LeaseResult answers acquire, renew, release, force-release, revoke,
// inspect and get.
type LeaseResult struct {
	// Code is the wire code (lease_acquired, …).
	Code          lease.Code
	CorrelationID string
	// RequestID is the request id the mutation was sent with (empty for
	// reads).
	RequestID string
	Lease     Lease
	// Current is, on a replay whose lease has since ended, its state now.
	Current *Lease
	// Replayed reports a result returned from the idempotency record of an
	// earlier request with the same request id.
	Replayed bool
}

// ListResult is one page of a list.
type ListResult struct {
	Code          lease.Code
	CorrelationID string
	Leases        []Lease
	// NextPageToken is empty on the last page.
	NextPageToken string
}

// HistoryEntry is one terminal record.
type HistoryEntry struct {
	Lease
	EndedAt    time.Time
	Reason     string
	IncidentID string
}

// HistoryResult is one page of a lease identity's terminal history.
type HistoryResult struct {
	Code          lease.Code
	CorrelationID string
	History       []HistoryEntry
	NextPageToken string
}

// Commit is an accepted commit authorization of one write.
type Commit struct {
	// LockKey is the canonical lock key of the request's identity, as the
	// server answered it; AuthorizeCommit checks it against the client's
	// own (lease.CanonicalLockKey) and refuses an answer that differs.
	LockKey       string
	Sink          string
	CommitID      string
	LeaseID       string
	FencingToken  uint64
	ExecutionID   string
	JobID         string
	TraceID       string
	Target        string
	PayloadSHA256 string
	// CommitSeq orders the lease's commits: a guard carries it.
	CommitSeq   uint64
	AcceptedAt  time.Time
	BackendTime time.Time
}

// CommitResult answers AuthorizeCommit.
type CommitResult struct {
	Code          lease.Code
	CorrelationID string
	Replayed      bool
	Commit        Commit
}
