package client

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// The bodies of the requests, in package wire's shapes.

func deadlineString(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func (r AcquireRequest) body() (wire.AcquireRequest, error) {
	b := wire.AcquireRequest{LockIdentity: &r.LockIdentity, TTLMs: r.TTLMs, MaximumLifetimeMs: r.MaximumLifetimeMs,
		ServiceInstanceID: r.ServiceInstanceID, ExecutionID: r.ExecutionID, JobID: r.JobID, TraceID: r.TraceID,
		RequestID: r.RequestID, DeadlineAt: deadlineString(r.DeadlineAt), WaitMs: r.WaitMs}
	if len(r.Metadata) > 0 {
		m, err := json.Marshal(r.Metadata)
		if err != nil {
			return b, err
		}
		b.Metadata = m
	}
	return b, nil
}

func (r RenewRequest) body() wire.RenewRequest {
	return wire.RenewRequest{LockIdentity: &r.LockIdentity, FencingToken: r.FencingToken, ServiceInstanceID: r.ServiceInstanceID,
		TTLMs: r.TTLMs, RequestID: r.RequestID, DeadlineAt: deadlineString(r.DeadlineAt)}
}

func (r ReleaseRequest) body() wire.ReleaseRequest {
	return wire.ReleaseRequest{LockIdentity: &r.LockIdentity, FencingToken: r.FencingToken, ServiceInstanceID: r.ServiceInstanceID,
		RequestID: r.RequestID, DeadlineAt: deadlineString(r.DeadlineAt)}
}

func (r AdminRequest) body() wire.AdminRequest {
	return wire.AdminRequest{LockIdentity: &r.LockIdentity, FencingToken: r.FencingToken, Reason: r.Reason,
		IncidentID: r.IncidentID, RequestID: r.RequestID, DeadlineAt: deadlineString(r.DeadlineAt)}
}

func (r CommitRequest) body() (wire.CommitRequest, error) {
	b := wire.CommitRequest{LockIdentity: &r.LockIdentity, LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Sink: r.Sink, CommitID: r.CommitID, ExecutionID: r.ExecutionID,
		JobID: r.JobID, TraceID: r.TraceID, Target: r.Target, PayloadSHA256: r.PayloadSHA256}
	if o := r.Outbox; o != nil {
		b.Outbox = &wire.Outbox{Exchange: o.Exchange, RoutingKey: o.RoutingKey, ContentType: o.ContentType,
			Body: base64.StdEncoding.EncodeToString(o.Body)}
		if len(o.Headers) > 0 {
			b.Outbox.Headers = make(map[string]json.RawMessage, len(o.Headers))
			for k, v := range o.Headers {
				raw, err := json.Marshal(v)
				if err != nil {
					return b, err
				}
				b.Outbox.Headers[k] = raw
			}
		}
	}
	return b, nil
}

// leaseOf checks and converts an answered lease.
func leaseOf(w *wire.Lease) (Lease, error) {
	switch {
	case w.LockIdentity == (lease.Identity{}):
		return Lease{}, errors.New("lease without lock_identity")
	case w.LeaseID == "":
		return Lease{}, errors.New("lease without lease_id")
	case w.FencingToken < 1 || w.FencingToken > lease.MaxFencingToken:
		return Lease{}, errors.New("lease fencing_token out of range")
	case w.AcquiredAt.IsZero() || w.RenewedAt.IsZero() || w.ExpiresAt.IsZero():
		return Lease{}, errors.New("lease without its timestamps")
	case w.TTLMs <= 0:
		return Lease{}, errors.New("lease ttl_ms not positive")
	case !w.State.Valid():
		return Lease{}, errors.New("lease state unknown")
	}
	return Lease{LockIdentity: w.LockIdentity, LeaseID: w.LeaseID, FencingToken: w.FencingToken,
		AcquiredAt: w.AcquiredAt.Time(), RenewedAt: w.RenewedAt.Time(), ExpiresAt: w.ExpiresAt.Time(),
		TTLMs: w.TTLMs, State: w.State}, nil
}
