// Package wire is the JSON of the lease HTTP API, defined once for both
// ends: the request bodies the server (httpapi) decodes strictly and the Go
// client (client) encodes, and the answers the server encodes and the
// client decodes strictly (lease.DecodeStrict). httpapi/openapi.json
// describes the same shapes; a test holds them together.
//
// Optional fields carry omitempty so that an answer's encoding is exactly
// what a strict decoder re-encodes: a field the server leaves out is never
// sent as a zero value.
package wire

import (
	"encoding/json"

	"github.com/starintel/starlease/lease"
)

// Request bodies. Owner principal, client and credential ids come from the
// credential, never from a body. The lock identity is a pointer so that a
// missing one is told from an empty one; deadlines, metadata, a
// publication's body and its header values stay raw until the server
// checks them exactly.

// AcquireRequest is the body of POST /acquire.
type AcquireRequest struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	TTLMs             int64           `json:"ttl_ms"`
	MaximumLifetimeMs int64           `json:"maximum_lifetime_ms,omitempty"`
	ServiceInstanceID string          `json:"service_instance_id"`
	ExecutionID       string          `json:"execution_id"`
	JobID             string          `json:"job_id"`
	TraceID           string          `json:"trace_id,omitempty"`
	Metadata          json.RawMessage `json:"metadata,omitempty"`
	RequestID         string          `json:"request_id"`
	DeadlineAt        string          `json:"deadline_at,omitempty"`
	WaitMs            int64           `json:"wait_ms,omitempty"`
}

// RenewRequest is the body of POST /{lease_id}/renew; TTLMs zero keeps the
// lease's TTL.
type RenewRequest struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	FencingToken      uint64          `json:"fencing_token"`
	ServiceInstanceID string          `json:"service_instance_id"`
	TTLMs             int64           `json:"ttl_ms,omitempty"`
	RequestID         string          `json:"request_id"`
	DeadlineAt        string          `json:"deadline_at,omitempty"`
}

// ReleaseRequest is the body of POST /{lease_id}/release and of DELETE
// /{lease_id}.
type ReleaseRequest struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	FencingToken      uint64          `json:"fencing_token"`
	ServiceInstanceID string          `json:"service_instance_id"`
	RequestID         string          `json:"request_id"`
	DeadlineAt        string          `json:"deadline_at,omitempty"`
}

// AdminRequest is the body of POST /{lease_id}/force-release and
// /{lease_id}/revoke: the observed lease and a reason or incident id.
type AdminRequest struct {
	LockIdentity *lease.Identity `json:"lock_identity"`
	FencingToken uint64          `json:"fencing_token"`
	Reason       string          `json:"reason,omitempty"`
	IncidentID   string          `json:"incident_id,omitempty"`
	RequestID    string          `json:"request_id"`
	DeadlineAt   string          `json:"deadline_at,omitempty"`
}

// Envelope returns a mutation's identity, request id and deadline.
func (b RenewRequest) Envelope() (*lease.Identity, string, string) {
	return b.LockIdentity, b.RequestID, b.DeadlineAt
}

// Envelope returns a mutation's identity, request id and deadline.
func (b ReleaseRequest) Envelope() (*lease.Identity, string, string) {
	return b.LockIdentity, b.RequestID, b.DeadlineAt
}

// Envelope returns a mutation's identity, request id and deadline.
func (b AdminRequest) Envelope() (*lease.Identity, string, string) {
	return b.LockIdentity, b.RequestID, b.DeadlineAt
}

// InspectRequest is the body of POST /inspect.
type InspectRequest struct {
	LockIdentity *lease.Identity `json:"lock_identity"`
}

// CommitRequest is the body of POST /commits/authorize: the one write it
// authorizes (Target and PayloadSHA256), or a publication (Outbox).
type CommitRequest struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	LeaseID           string          `json:"lease_id"`
	FencingToken      uint64          `json:"fencing_token"`
	ServiceInstanceID string          `json:"service_instance_id"`
	Sink              string          `json:"sink"`
	CommitID          string          `json:"commit_id"`
	ExecutionID       string          `json:"execution_id"`
	JobID             string          `json:"job_id"`
	TraceID           string          `json:"trace_id,omitempty"`
	Target            string          `json:"target,omitempty"`
	PayloadSHA256     string          `json:"payload_sha256,omitempty"`
	Outbox            *Outbox         `json:"outbox,omitempty"`
}

// Outbox is a fenced publication. Body is the payload bytes in standard
// base64 (padded): a publication's body is bytes, not text (payload_sha256
// is over those exact bytes, and a JSON string cannot carry every byte
// sequence), and base64 bounds the wire size at 4/3 of the body, where JSON
// string escapes could take up to 6 bytes per byte. Each header value
// stays raw until the server checks it is a JSON string: decoding into
// string would take null as "".
type Outbox struct {
	Exchange    string                     `json:"exchange"`
	RoutingKey  string                     `json:"routing_key"`
	ContentType string                     `json:"content_type,omitempty"`
	Body        string                     `json:"body"`
	Headers     map[string]json.RawMessage `json:"headers,omitempty"`
}

// Answers: only authorized, non-secret fields.

// Lease is the contract's success shape of a lease.
type Lease struct {
	LockIdentity lease.Identity  `json:"lock_identity"`
	LeaseID      string          `json:"lease_id"`
	FencingToken uint64          `json:"fencing_token"`
	AcquiredAt   lease.Timestamp `json:"acquired_at"`
	RenewedAt    lease.Timestamp `json:"renewed_at"`
	ExpiresAt    lease.Timestamp `json:"expires_at"`
	TTLMs        int64           `json:"ttl_ms"`
	State        lease.State     `json:"state"`
}

// HistoryEntry is one terminal record, for audit:read callers.
type HistoryEntry struct {
	Lease
	EndedAt    lease.Timestamp `json:"ended_at"`
	Reason     string          `json:"reason,omitempty"`
	IncidentID string          `json:"incident_id,omitempty"`
}

// Commit is an accepted commit authorization: the one write (target,
// payload_sha256) it authorizes under the lease, execution and job. A
// remote writer stores these fields as its guard. LockKey is the canonical
// lock key of the request's identity, which the guard carries: clients in
// other languages take it from here rather than reimplement the key
// function. It discloses nothing the caller did not send.
type Commit struct {
	LockKey       string          `json:"lock_key"`
	Sink          string          `json:"sink"`
	CommitID      string          `json:"commit_id"`
	LeaseID       string          `json:"lease_id"`
	FencingToken  uint64          `json:"fencing_token"`
	ExecutionID   string          `json:"execution_id"`
	JobID         string          `json:"job_id"`
	TraceID       string          `json:"trace_id,omitempty"`
	Target        string          `json:"target"`
	PayloadSHA256 string          `json:"payload_sha256,omitempty"`
	CommitSeq     uint64          `json:"commit_seq"`
	AcceptedAt    lease.Timestamp `json:"accepted_at"`
	BackendTime   lease.Timestamp `json:"backend_time"`
}

// Success is the success envelope. Which members it has depends on the
// operation: a lease (and Current, on a replay whose lease has since
// ended), a list page, a history page, or a commit.
type Success struct {
	Status        string `json:"status"`
	Code          string `json:"code"`
	CorrelationID string `json:"correlation_id"`
	Lease         *Lease `json:"lease,omitempty"`
	Current       *Lease `json:"current,omitempty"`
	Replayed      bool   `json:"replayed,omitempty"`
	// Leases and NextPageToken answer a list.
	Leases        []Lease `json:"leases,omitempty"`
	NextPageToken *string `json:"next_page_token,omitempty"`
	// History answers a history read.
	History []HistoryEntry `json:"history,omitempty"`
	// Commit answers a commit authorization.
	Commit *Commit `json:"commit,omitempty"`
}

// Error is the contract's stable error envelope. Field names the offending
// input of an invalid_lease_request.
type Error struct {
	Status        string `json:"status"`
	Code          string `json:"code"`
	Msg           string `json:"msg"`
	Field         string `json:"field,omitempty"`
	CorrelationID string `json:"correlation_id"`
	Retryable     bool   `json:"retryable"`
	RetryAfterMs  *int64 `json:"retry_after_ms,omitempty"`
}
