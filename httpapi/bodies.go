package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// The request bodies and answers are package wire's, shared with the Go
// client; this file turns them into the service's inputs and back.

// message decodes the publication. The body must be canonical standard
// base64: padded, no line breaks, zero padding bits, so one body has one
// encoding.
func outboxMessage(o *wire.Outbox) (*lease.OutboxMessage, error) {
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

// viewOf is the answer's shape of a record.
func viewOf(r *lease.Record) *wire.Lease {
	if r == nil {
		return nil
	}
	return &wire.Lease{LockIdentity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		AcquiredAt: r.AcquiredAt, RenewedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt, TTLMs: r.TTLMs, State: r.State}
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
