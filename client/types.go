package client

import (
	"errors"
	"time"

	"github.com/starintel/starlease/lease"
)

// Requests mirror the HTTP bodies of the API. Owner principal, client and
// credential ids come from the API key, never from a body.

// AcquireRequest is the body of POST /acquire. WorkflowName and
// OperationClass of the identity may be empty (they mean "default").
// MaximumLifetimeMs zero means the server's configured maximum; WaitMs asks
// for bounded retry on conflict; a zero DeadlineAt means the call's
// deadline (sent as X-Request-Timeout-Ms).
type AcquireRequest struct {
	LockIdentity      lease.Identity `json:"lock_identity"`
	TTLMs             int64          `json:"ttl_ms"`
	MaximumLifetimeMs int64          `json:"maximum_lifetime_ms,omitempty"`
	ServiceInstanceID string         `json:"service_instance_id"`
	ExecutionID       string         `json:"execution_id"`
	JobID             string         `json:"job_id"`
	TraceID           string         `json:"trace_id,omitempty"`
	Metadata          map[string]any `json:"metadata,omitempty"`
	RequestID         string         `json:"request_id"`
	DeadlineAt        time.Time      `json:"deadline_at,omitzero"`
	WaitMs            int64          `json:"wait_ms,omitempty"`
}

// RenewRequest is the body of POST /{lease_id}/renew. TTLMs zero keeps the
// lease's TTL.
type RenewRequest struct {
	LeaseID           string         `json:"-"`
	LockIdentity      lease.Identity `json:"lock_identity"`
	FencingToken      uint64         `json:"fencing_token"`
	ServiceInstanceID string         `json:"service_instance_id"`
	TTLMs             int64          `json:"ttl_ms,omitempty"`
	RequestID         string         `json:"request_id"`
	DeadlineAt        time.Time      `json:"deadline_at,omitzero"`
}

// ReleaseRequest is the body of POST /{lease_id}/release.
type ReleaseRequest struct {
	LeaseID           string         `json:"-"`
	LockIdentity      lease.Identity `json:"lock_identity"`
	FencingToken      uint64         `json:"fencing_token"`
	ServiceInstanceID string         `json:"service_instance_id"`
	RequestID         string         `json:"request_id"`
	DeadlineAt        time.Time      `json:"deadline_at,omitzero"`
}

// AdminRequest is the body of POST /{lease_id}/force-release and
// /{lease_id}/revoke: the observed lease and a reason or incident id.
type AdminRequest struct {
	LeaseID      string         `json:"-"`
	LockIdentity lease.Identity `json:"lock_identity"`
	FencingToken uint64         `json:"fencing_token"`
	Reason       string         `json:"reason,omitempty"`
	IncidentID   string         `json:"incident_id,omitempty"`
	RequestID    string         `json:"request_id"`
	DeadlineAt   time.Time      `json:"deadline_at,omitzero"`
}

type inspectBody struct {
	LockIdentity lease.Identity `json:"lock_identity"`
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
	LockIdentity      lease.Identity `json:"lock_identity"`
	LeaseID           string         `json:"lease_id"`
	FencingToken      uint64         `json:"fencing_token"`
	ServiceInstanceID string         `json:"service_instance_id"`
	Sink              string         `json:"sink"`
	CommitID          string         `json:"commit_id"`
	ExecutionID       string         `json:"execution_id"`
	JobID             string         `json:"job_id"`
	TraceID           string         `json:"trace_id,omitempty"`
	// Target and PayloadSHA256 name the one write authorized: the object
	// it changes in the sink and the SHA-256 (hex) of what it writes.
	Target        string `json:"target,omitempty"`
	PayloadSHA256 string `json:"payload_sha256,omitempty"`
	// Outbox, when set, is a fenced publication: the server appends it to
	// its backend's outbox in the same atomic step as the lease check, and
	// its relay publishes it. The message is then the write: Target and
	// PayloadSHA256 stay empty and the answer names the message id and the
	// body's SHA-256.
	Outbox *Outbox `json:"outbox,omitempty"`
}

// Outbox is a publication (POST /commits/authorize's outbox object).
// Body travels as standard base64 (encoding/json's form of []byte), at
// most lease.MaxOutboxBody bytes before encoding. Headers are application
// headers the relay publishes with the message (bounds in
// lease.MaxOutboxHeaders and beside it; names under
// lease.ReservedHeaderPrefix are refused).
type Outbox struct {
	Exchange    string            `json:"exchange"`
	RoutingKey  string            `json:"routing_key"`
	ContentType string            `json:"content_type,omitempty"`
	Body        []byte            `json:"body"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// Lease is the contract's success shape of a lease.
type Lease struct {
	LockIdentity lease.Identity `json:"lock_identity"`
	LeaseID      string         `json:"lease_id"`
	FencingToken uint64         `json:"fencing_token"`
	AcquiredAt   time.Time      `json:"acquired_at"`
	RenewedAt    time.Time      `json:"renewed_at"`
	ExpiresAt    time.Time      `json:"expires_at"`
	TTLMs        int64          `json:"ttl_ms"`
	State        lease.State    `json:"state"`
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

// Wire shapes, decoded strictly (lease.DecodeStrict). No omitempty: the
// strict decoder re-encodes to find case-variant keys.

type successWire struct {
	Status        string        `json:"status"`
	Code          lease.Code    `json:"code"`
	CorrelationID string        `json:"correlation_id"`
	Lease         *leaseWire    `json:"lease"`
	Current       *leaseWire    `json:"current"`
	Replayed      bool          `json:"replayed"`
	Leases        []leaseWire   `json:"leases"`
	NextPageToken *string       `json:"next_page_token"`
	History       []historyWire `json:"history"`
	Commit        *commitWire   `json:"commit"`
}

type leaseWire struct {
	LockIdentity *lease.Identity  `json:"lock_identity"`
	LeaseID      string           `json:"lease_id"`
	FencingToken uint64           `json:"fencing_token"`
	AcquiredAt   *lease.Timestamp `json:"acquired_at"`
	RenewedAt    *lease.Timestamp `json:"renewed_at"`
	ExpiresAt    *lease.Timestamp `json:"expires_at"`
	TTLMs        int64            `json:"ttl_ms"`
	State        lease.State      `json:"state"`
}

func (w *leaseWire) lease() (Lease, error) {
	switch {
	case w.LockIdentity == nil:
		return Lease{}, errors.New("lease without lock_identity")
	case w.LeaseID == "":
		return Lease{}, errors.New("lease without lease_id")
	case w.FencingToken < 1 || w.FencingToken > lease.MaxFencingToken:
		return Lease{}, errors.New("lease fencing_token out of range")
	case w.AcquiredAt == nil || w.RenewedAt == nil || w.ExpiresAt == nil:
		return Lease{}, errors.New("lease without its timestamps")
	case w.TTLMs <= 0:
		return Lease{}, errors.New("lease ttl_ms not positive")
	case !w.State.Valid():
		return Lease{}, errors.New("lease state unknown")
	}
	return Lease{LockIdentity: *w.LockIdentity, LeaseID: w.LeaseID, FencingToken: w.FencingToken,
		AcquiredAt: w.AcquiredAt.Time(), RenewedAt: w.RenewedAt.Time(), ExpiresAt: w.ExpiresAt.Time(),
		TTLMs: w.TTLMs, State: w.State}, nil
}

type historyWire struct {
	leaseWire
	EndedAt    *lease.Timestamp `json:"ended_at"`
	Reason     string           `json:"reason"`
	IncidentID string           `json:"incident_id"`
}

type commitWire struct {
	LockKey       string           `json:"lock_key"`
	Sink          string           `json:"sink"`
	CommitID      string           `json:"commit_id"`
	LeaseID       string           `json:"lease_id"`
	FencingToken  uint64           `json:"fencing_token"`
	ExecutionID   string           `json:"execution_id"`
	JobID         string           `json:"job_id"`
	TraceID       string           `json:"trace_id"`
	Target        string           `json:"target"`
	PayloadSHA256 string           `json:"payload_sha256"`
	CommitSeq     uint64           `json:"commit_seq"`
	AcceptedAt    *lease.Timestamp `json:"accepted_at"`
	BackendTime   *lease.Timestamp `json:"backend_time"`
}

type errorWire struct {
	Status        string     `json:"status"`
	Code          lease.Code `json:"code"`
	Msg           string     `json:"msg"`
	Field         string     `json:"field"`
	CorrelationID string     `json:"correlation_id"`
	Retryable     bool       `json:"retryable"`
	RetryAfterMs  *int64     `json:"retry_after_ms"`
}
