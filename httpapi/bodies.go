package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/starintel/starlease/lease"
)

// Request bodies, as DESIGN's wire table names them. Owner principal,
// client and credential ids come from the credential, never from a body.

type acquireBody struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	TTLMs             int64           `json:"ttl_ms"`
	MaximumLifetimeMs int64           `json:"maximum_lifetime_ms"`
	ServiceInstanceID string          `json:"service_instance_id"`
	ExecutionID       string          `json:"execution_id"`
	JobID             string          `json:"job_id"`
	TraceID           string          `json:"trace_id"`
	Metadata          json.RawMessage `json:"metadata"`
	RequestID         string          `json:"request_id"`
	DeadlineAt        string          `json:"deadline_at"`
	WaitMs            int64           `json:"wait_ms"`
}

type heldBody struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	FencingToken      uint64          `json:"fencing_token"`
	ServiceInstanceID string          `json:"service_instance_id"`
	TTLMs             int64           `json:"ttl_ms"`
	RequestID         string          `json:"request_id"`
	DeadlineAt        string          `json:"deadline_at"`
}

type releaseBody struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	FencingToken      uint64          `json:"fencing_token"`
	ServiceInstanceID string          `json:"service_instance_id"`
	RequestID         string          `json:"request_id"`
	DeadlineAt        string          `json:"deadline_at"`
}

type adminBody struct {
	LockIdentity *lease.Identity `json:"lock_identity"`
	FencingToken uint64          `json:"fencing_token"`
	Reason       string          `json:"reason"`
	IncidentID   string          `json:"incident_id"`
	RequestID    string          `json:"request_id"`
	DeadlineAt   string          `json:"deadline_at"`
}

type inspectBody struct {
	LockIdentity *lease.Identity `json:"lock_identity"`
}

type commitBody struct {
	LockIdentity      *lease.Identity `json:"lock_identity"`
	LeaseID           string          `json:"lease_id"`
	FencingToken      uint64          `json:"fencing_token"`
	ServiceInstanceID string          `json:"service_instance_id"`
	Sink              string          `json:"sink"`
	CommitID          string          `json:"commit_id"`
	ExecutionID       string          `json:"execution_id"`
	JobID             string          `json:"job_id"`
	TraceID           string          `json:"trace_id"`
	Target            string          `json:"target"`
	PayloadSHA256     string          `json:"payload_sha256"`
	Outbox            *outboxBody     `json:"outbox"`
}

// outboxBody is a fenced publication: the message the authorization
// appends to the backend's outbox. Body is the payload bytes in standard
// base64 (padded): a publication's body is bytes, not text (payload_sha256
// is over those exact bytes, and a JSON string cannot carry every byte
// sequence), and base64 bounds the wire size at 4/3 of the body, where
// JSON string escapes could take up to 6 bytes per byte.
//
// Headers are application headers published with the message. Each value
// stays raw until message() checks it is a JSON string: decoding into
// string would take null as "".
type outboxBody struct {
	Exchange    string                     `json:"exchange"`
	RoutingKey  string                     `json:"routing_key"`
	ContentType string                     `json:"content_type"`
	Body        string                     `json:"body"`
	Headers     map[string]json.RawMessage `json:"headers"`
}

// message decodes the publication. The body must be canonical standard
// base64: padded, no line breaks, zero padding bits, so one body has one
// encoding.
func (o *outboxBody) message() (*lease.OutboxMessage, error) {
	if o == nil {
		return nil, nil
	}
	if len(o.Body) > base64.StdEncoding.EncodedLen(lease.MaxOutboxBody) {
		return nil, lease.Invalid("outbox.body", "must be at most 64 KiB (before base64)")
	}
	b, err := base64.StdEncoding.Strict().DecodeString(o.Body)
	if err != nil || base64.StdEncoding.EncodeToString(b) != o.Body {
		return nil, lease.Invalid("outbox.body", "must be standard base64 (padded, no line breaks)")
	}
	var headers map[string]string
	if len(o.Headers) > 0 {
		headers = make(map[string]string, len(o.Headers))
		for name, raw := range o.Headers {
			var v string
			if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &v) != nil {
				return nil, lease.Invalid("outbox.headers", "header values must be JSON strings")
			}
			headers[name] = v
		}
	}
	// The store checks the headers' bounds and reserved names.
	return &lease.OutboxMessage{Exchange: o.Exchange, RoutingKey: o.RoutingKey, ContentType: o.ContentType, Body: b,
		Headers: headers}, nil
}

// Response shapes: only authorized, non-secret fields.

// LeaseView is the contract's success shape of a lease.
type LeaseView struct {
	LockIdentity lease.Identity  `json:"lock_identity"`
	LeaseID      string          `json:"lease_id"`
	FencingToken uint64          `json:"fencing_token"`
	AcquiredAt   lease.Timestamp `json:"acquired_at"`
	RenewedAt    lease.Timestamp `json:"renewed_at"`
	ExpiresAt    lease.Timestamp `json:"expires_at"`
	TTLMs        int64           `json:"ttl_ms"`
	State        lease.State     `json:"state"`
}

func viewOf(r *lease.Record) *LeaseView {
	if r == nil {
		return nil
	}
	return &LeaseView{LockIdentity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt, TTLMs: r.TTLMs, State: r.State}
}

// Success is the success envelope.
type Success struct {
	Status        string `json:"status"`
	Code          string `json:"code"`
	CorrelationID string `json:"correlation_id"`
	// Lease is the lease acted on; Current, on a replay whose lease has
	// since ended, its state now.
	Lease    *LeaseView `json:"lease,omitempty"`
	Current  *LeaseView `json:"current,omitempty"`
	Replayed bool       `json:"replayed,omitempty"`
	// Leases and NextPageToken answer a list.
	Leases        []LeaseView `json:"leases,omitempty"`
	NextPageToken *string     `json:"next_page_token,omitempty"`
	// History answers a history read.
	History []HistoryView `json:"history,omitempty"`
	// Commit answers a commit authorization.
	Commit *CommitView `json:"commit,omitempty"`
}

// HistoryView is one terminal record for audit:read callers.
type HistoryView struct {
	LeaseView
	EndedAt    lease.Timestamp `json:"ended_at"`
	Reason     string          `json:"reason,omitempty"`
	IncidentID string          `json:"incident_id,omitempty"`
}

// CommitView is an accepted commit authorization: the one write (target,
// payload_sha256) it authorizes under the lease, execution and job. A
// remote writer stores these fields as its guard. LockKey is the canonical
// lock key of the request's identity, which the guard carries: clients in
// other languages take it from here rather than reimplement the key
// function. It discloses nothing the caller did not send.
type CommitView struct {
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

// parseDeadline reads deadline_at (RFC 3339) or X-Request-Timeout-Ms, and
// whether either was given: the zero time is a deadline like any other
// (long past), so presence is not read from the value. Neither is the
// server default; both is ambiguous.
func parseDeadline(body, header string, now time.Time) (time.Time, bool, error) {
	switch {
	case body != "" && header != "":
		return time.Time{}, false, lease.Invalid("deadline_at", "give deadline_at or X-Request-Timeout-Ms, not both")
	case body != "":
		t, err := time.Parse(time.RFC3339Nano, body)
		if err != nil {
			return time.Time{}, false, lease.Invalid("deadline_at", "must be an RFC 3339 timestamp")
		}
		return t, true, nil
	case header != "":
		var ms int64
		if err := json.Unmarshal([]byte(header), &ms); err != nil || ms <= 0 || ms > 24*3600*1000 {
			return time.Time{}, false, lease.Invalid("X-Request-Timeout-Ms", "must be a positive integer of milliseconds")
		}
		return now.Add(time.Duration(ms) * time.Millisecond), true, nil
	}
	return time.Time{}, false, nil
}
