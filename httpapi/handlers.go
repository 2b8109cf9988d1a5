package httpapi

import (
	"context"
	"net/http"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
	"github.com/starintel/starlease/wire"
)

func (s *Server) acquire(r *http.Request, c service.Call) (serviceCall, error) {
	var b wire.AcquireRequest
	if err := decodeBody(r, &b); err != nil {
		return nil, err
	}
	c, err := s.mutationCall(r, c, b.RequestID, b.DeadlineAt)
	if err != nil {
		return nil, err
	}
	in := service.AcquireInput{ServiceInstanceID: b.ServiceInstanceID, ExecutionID: b.ExecutionID,
		JobID: b.JobID, TraceID: b.TraceID}
	if in.Identity, err = identityOf(b.LockIdentity); err != nil {
		return nil, err
	}
	if in.TTL, err = ms(b.TTLMs, "ttl_ms"); err != nil {
		return nil, err
	}
	if in.MaximumLifetime, err = ms(b.MaximumLifetimeMs, "maximum_lifetime_ms"); err != nil {
		return nil, err
	}
	if in.Wait, err = ms(b.WaitMs, "wait_ms"); err != nil {
		return nil, err
	}
	if len(b.Metadata) > 0 && string(b.Metadata) != "null" {
		if in.Metadata, err = lease.DecodeMetadata(b.Metadata); err != nil {
			return nil, err
		}
	}
	return leaseCall(func(ctx context.Context) (lease.Result, error) { return s.svc.Acquire(ctx, c, in) }), nil
}

// leaseCall is the service call of an operation that answers a lease.
func leaseCall(run func(context.Context) (lease.Result, error)) serviceCall {
	return func(ctx context.Context, ok *wire.Success) error {
		res, err := run(ctx)
		if err != nil {
			return err
		}
		setLease(ok, res)
		return nil
	}
}

// mutationBody is a mutation's body: its identity, request id and deadline.
type mutationBody interface {
	Envelope() (id *lease.Identity, requestID, deadline string)
}

// mutate is the common path of a mutation on a named lease: decode the body
// strictly, resolve request id, deadline and identity, then let prepare
// check the rest and name the service call.
func mutate[B mutationBody](s *Server, r *http.Request, c service.Call,
	prepare func(b B, c service.Call, id lease.Identity) (func(context.Context) (lease.Result, error), error)) (serviceCall, error) {
	var b B
	if err := decodeBody(r, &b); err != nil {
		return nil, err
	}
	raw, requestID, deadline := b.Envelope()
	c, err := s.mutationCall(r, c, requestID, deadline)
	if err != nil {
		return nil, err
	}
	id, err := identityOf(raw)
	if err != nil {
		return nil, err
	}
	run, err := prepare(b, c, id)
	if err != nil {
		return nil, err
	}
	return leaseCall(run), nil
}

func (s *Server) renew(r *http.Request, c service.Call) (serviceCall, error) {
	return mutate(s, r, c, func(b wire.RenewRequest, c service.Call, id lease.Identity) (func(context.Context) (lease.Result, error), error) {
		ttl, err := ms(b.TTLMs, "ttl_ms")
		if err != nil {
			return nil, err
		}
		in := service.HeldInput{Identity: id, LeaseID: r.PathValue("lease_id"), FencingToken: b.FencingToken,
			ServiceInstanceID: b.ServiceInstanceID, TTL: ttl}
		return func(ctx context.Context) (lease.Result, error) { return s.svc.Renew(ctx, c, in) }, nil
	})
}

func (s *Server) release(r *http.Request, c service.Call) (serviceCall, error) {
	return mutate(s, r, c, func(b wire.ReleaseRequest, c service.Call, id lease.Identity) (func(context.Context) (lease.Result, error), error) {
		in := service.HeldInput{Identity: id, LeaseID: r.PathValue("lease_id"), FencingToken: b.FencingToken,
			ServiceInstanceID: b.ServiceInstanceID}
		return func(ctx context.Context) (lease.Result, error) { return s.svc.Release(ctx, c, in) }, nil
	})
}

func (s *Server) admin(revoke bool) handlerFunc {
	return func(r *http.Request, c service.Call) (serviceCall, error) {
		op := s.svc.ForceRelease
		if revoke {
			op = s.svc.Revoke
		}
		return mutate(s, r, c, func(b wire.AdminRequest, c service.Call, id lease.Identity) (func(context.Context) (lease.Result, error), error) {
			in := service.AdminInput{Identity: id, LeaseID: r.PathValue("lease_id"), FencingToken: b.FencingToken,
				Reason: b.Reason, IncidentID: b.IncidentID}
			return func(ctx context.Context) (lease.Result, error) { return op(ctx, c, in) }, nil
		})
	}
}

func (s *Server) inspectByID(r *http.Request, c service.Call) (serviceCall, error) {
	if err := noQuery(r); err != nil {
		return nil, err
	}
	c, err := s.readCall(r, c)
	if err != nil {
		return nil, err
	}
	in := service.InspectInput{LeaseID: r.PathValue("lease_id")}
	return leaseCall(func(ctx context.Context) (lease.Result, error) { return s.svc.Inspect(ctx, c, in) }), nil
}

func (s *Server) inspect(r *http.Request, c service.Call) (serviceCall, error) {
	var b wire.InspectRequest
	if err := decodeBody(r, &b); err != nil {
		return nil, err
	}
	id, err := identityOf(b.LockIdentity)
	if err != nil {
		return nil, err
	}
	if c, err = s.readCall(r, c); err != nil {
		return nil, err
	}
	in := service.InspectInput{Identity: id}
	return leaseCall(func(ctx context.Context) (lease.Result, error) { return s.svc.Inspect(ctx, c, in) }), nil
}

// readCall completes the call of a read (inspect, list, history) with its
// deadline: X-Request-Timeout-Ms, refused as a mutation's is when it is
// not one positive integer of milliseconds, capped by the server, and the
// server's default when absent.
func (s *Server) readCall(r *http.Request, c service.Call) (service.Call, error) {
	d, err := s.deadline(r, "")
	c.DeadlineAt = d
	return c, err
}

var listParams = []string{"owner_principal_id", "tenant_id", "program_id", "target_namespace", "target_id",
	"page_size", "page_token"}

func (s *Server) list(r *http.Request, c service.Call) (serviceCall, error) {
	q, err := strictQuery(r, listParams...)
	if err != nil {
		return nil, err
	}
	req := lease.ListRequest{OwnerPrincipalID: q.Get("owner_principal_id"), TenantID: q.Get("tenant_id"),
		ProgramID: q.Get("program_id"), TargetNamespace: q.Get("target_namespace"), TargetID: q.Get("target_id"),
		PageToken: q.Get("page_token")}
	switch {
	case req.OwnerPrincipalID != "":
		req.By = lease.ListByOwner
	case req.TargetNamespace != "" || req.TargetID != "":
		req.By = lease.ListByTarget
	case req.TenantID != "" || req.ProgramID != "":
		req.By = lease.ListByProgram
	default:
		return nil, lease.Invalid("owner_principal_id", "give owner_principal_id, or tenant_id and program_id (and target_namespace and target_id)")
	}
	if req.PageSize, err = queryInt(q, "page_size"); err != nil {
		return nil, err
	}
	if c, err = s.readCall(r, c); err != nil {
		return nil, err
	}
	return func(ctx context.Context, ok *wire.Success) error {
		page, err := s.svc.List(ctx, c, req)
		if err != nil {
			return err
		}
		ok.Code = string(lease.CodeListed)
		ok.Leases = make([]wire.Lease, 0, len(page.Leases))
		for _, rec := range page.Leases {
			ok.Leases = append(ok.Leases, *viewOf(rec))
		}
		ok.NextPageToken = &page.NextPageToken
		return nil
	}, nil
}

func (s *Server) history(r *http.Request, c service.Call) (serviceCall, error) {
	q, err := strictQuery(r, "page_size", "page_token")
	if err != nil {
		return nil, err
	}
	size, err := queryInt(q, "page_size")
	if err != nil {
		return nil, err
	}
	if c, err = s.readCall(r, c); err != nil {
		return nil, err
	}
	leaseID, token := r.PathValue("lease_id"), q.Get("page_token")
	return func(ctx context.Context, ok *wire.Success) error {
		page, err := s.svc.History(ctx, c, leaseID, size, token)
		if err != nil {
			return err
		}
		ok.Code = string(lease.CodeHistory)
		ok.History = make([]wire.HistoryEntry, 0, len(page.Entries))
		for _, h := range page.Entries {
			ok.History = append(ok.History, wire.HistoryEntry{Lease: *viewOf(h.Record), EndedAt: h.EndedAt, Reason: h.Reason, IncidentID: h.IncidentID})
		}
		ok.NextPageToken = &page.NextPageToken
		return nil
	}, nil
}

func (s *Server) authorizeCommit(r *http.Request, c service.Call) (serviceCall, error) {
	var b wire.CommitRequest
	if err := decodeBodyLimit(r, &b, MaxCommitBodyBytes); err != nil {
		return nil, err
	}
	id, err := identityOf(b.LockIdentity)
	if err != nil {
		return nil, err
	}
	msg, err := outboxMessage(b.Outbox)
	if err != nil {
		return nil, err
	}
	if c, err = s.readCall(r, c); err != nil {
		return nil, err
	}
	in := service.CommitInput{Identity: id, LeaseID: b.LeaseID,
		FencingToken: b.FencingToken, ServiceInstanceID: b.ServiceInstanceID, Sink: b.Sink, CommitID: b.CommitID,
		ExecutionID: b.ExecutionID, JobID: b.JobID, TraceID: b.TraceID, Target: b.Target, PayloadSHA256: b.PayloadSHA256,
		Outbox: msg}
	return func(ctx context.Context, ok *wire.Success) error {
		res, err := s.svc.AuthorizeCommit(ctx, c, in)
		if err != nil {
			return err
		}
		// The service accepted this identity under the same operation
		// classes, so this cannot fail; if it did, no answer is given.
		key, err := s.svc.LockKey(id)
		if err != nil {
			return err
		}
		ok.Code = string(res.Code)
		ok.Replayed = res.Replayed
		cm := res.Commit
		ok.Commit = &wire.Commit{LockKey: key, Sink: cm.Sink, CommitID: cm.CommitID, LeaseID: cm.LeaseID, FencingToken: cm.FencingToken,
			ExecutionID: cm.ExecutionID, JobID: cm.JobID, TraceID: cm.TraceID, Target: cm.Target,
			PayloadSHA256: cm.PayloadSHA256, CommitSeq: cm.Seq, AcceptedAt: cm.AcceptedAt, BackendTime: res.BackendTime}
		return nil
	}, nil
}

func noQuery(r *http.Request) error {
	_, err := strictQuery(r)
	return err
}
