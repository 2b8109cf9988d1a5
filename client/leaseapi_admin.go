package client

import (
	"context"

	"github.com/starintel/starlease/lease"
)

// The administrative and read operations of the lease-store protocol over
// HTTP, with lease.Store's signatures: an operator tool (the starlease CLI's
// remote mode) runs them against a server as against an embedded store.

// ForceRelease ends the observed lease as an administrator
// (POST /{lease_id}/force-release; targets:force-release). The result code
// is the typed lease.CodeForceReleased (the wire code is lease_released).
// The adapter forgets the lease.
func (s *LeaseStore) ForceRelease(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return s.admin(ctx, lease.OpForceRelease, req)
}

// Revoke ends the observed lease with the security terminal state
// (POST /{lease_id}/revoke; targets:force-release). The adapter forgets the
// lease.
func (s *LeaseStore) Revoke(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return s.admin(ctx, lease.OpRevoke, req)
}

func (s *LeaseStore) admin(ctx context.Context, op lease.Op, req lease.AdminRequest) (lease.Result, error) {
	if err := requireRequestID(req.RequestID); err != nil {
		return lease.Result{}, err
	}
	body := AdminRequest{LeaseID: req.LeaseID, LockIdentity: req.Identity, FencingToken: req.FencingToken,
		Reason: req.Reason, IncidentID: req.IncidentID, RequestID: req.RequestID, DeadlineAt: req.DeadlineAt}
	ctx = withCorrelation(ctx, req.Caller)
	var (
		res *LeaseResult
		err error
	)
	if op == lease.OpRevoke {
		res, err = s.c.Revoke(ctx, body)
	} else {
		res, err = s.c.ForceRelease(ctx, body)
	}
	if err != nil {
		return lease.Result{}, leaseErr(err, true)
	}
	if res.Lease.LeaseID != req.LeaseID {
		return lease.Result{}, corrupt("administrative answer about another lease")
	}
	// The administrator is not the owner: what the adapter knows of the
	// lease comes only from an acquisition through it.
	out, err := s.result(res, s.lookup(req.LeaseID), false)
	if err != nil {
		return lease.Result{}, err
	}
	out.Code, _ = lease.AdminOutcome(op)
	s.forget(req.LeaseID)
	return out, nil
}

// List pages through unexpired active leases (GET /?…) by the filter
// req.By names: by owner (OwnerPrincipalID), by target (TenantID,
// ProgramID, TargetNamespace, TargetID) or by program (TenantID,
// ProgramID). Fields of another filter are refused, as lease.Store refuses
// them, so the server never answers a different filter than asked.
// NextPageToken is the server's opaque token. BackendTime is zero
// (unknown): the list answer does not carry it.
func (s *LeaseStore) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	q := ListRequest{PageSize: req.PageSize, PageToken: req.PageToken}
	targetFields := req.TenantID != "" || req.ProgramID != "" || req.TargetNamespace != "" || req.TargetID != ""
	switch req.By {
	case lease.ListByOwner:
		if targetFields {
			return lease.ListResult{}, lease.Invalid("owner_principal_id", "list by owner takes no target fields")
		}
		if req.OwnerPrincipalID == "" {
			return lease.ListResult{}, lease.Invalid("owner_principal_id", "list by owner needs an owner")
		}
		q.OwnerPrincipalID = req.OwnerPrincipalID
	case lease.ListByTarget, lease.ListByProgram:
		if req.OwnerPrincipalID != "" {
			return lease.ListResult{}, lease.Invalid("owner_principal_id", "list by target or program takes no owner")
		}
		if req.By == lease.ListByProgram && (req.TargetNamespace != "" || req.TargetID != "") {
			return lease.ListResult{}, lease.Invalid("target_id", "list by program takes no target fields")
		}
		if req.By == lease.ListByTarget && req.TargetNamespace == "" && req.TargetID == "" {
			return lease.ListResult{}, lease.Invalid("target_id", "list by target needs target_namespace and target_id")
		}
		q.TenantID, q.ProgramID, q.TargetNamespace, q.TargetID = req.TenantID, req.ProgramID, req.TargetNamespace, req.TargetID
	default:
		return lease.ListResult{}, lease.Invalid("by", "must be owner, target or program")
	}
	ctx, cancel := withDeadline(withCorrelation(ctx, req.Caller), req.DeadlineAt)
	defer cancel()
	res, err := s.c.List(ctx, q)
	if err != nil {
		return lease.ListResult{}, leaseErr(err, false)
	}
	out := lease.ListResult{Leases: make([]*lease.Record, 0, len(res.Leases)), NextPageToken: res.NextPageToken}
	for _, l := range res.Leases {
		rec, err := record(l, s.lookup(l.LeaseID))
		if err != nil {
			return lease.ListResult{}, err
		}
		out.Leases = append(out.Leases, rec)
	}
	return out, nil
}

// History pages through the terminal history of req.Identity, newest first
// (audit:read). The HTTP API reads history by a lease id of the identity
// (GET /{lease_id}/history): History finds one by inspecting the identity,
// so an identity without an unexpired active lease is lease_not_found here;
// HistoryByLeaseID reads the history by any lease id of the identity, active
// or ended. Page tokens are the server's (bound to the identity, so a page
// token works with either method). An entry has the record as the answer
// carries it (see LeaseStore), ended_at, reason and incident id; EndedBy and
// RequestID are not in the answer and stay empty.
func (s *LeaseStore) History(ctx context.Context, req lease.HistoryRequest) (lease.HistoryResult, error) {
	if req.Identity == (lease.Identity{}) {
		return lease.HistoryResult{}, lease.Invalid("lock_identity", "lock_identity is required")
	}
	ctx, cancel := withDeadline(withCorrelation(ctx, req.Caller), req.DeadlineAt)
	defer cancel()
	cur, err := s.c.Inspect(ctx, req.Identity)
	if err != nil {
		if lease.CodeOf(err) == lease.CodeNotFound {
			return lease.HistoryResult{}, &lease.Error{Code: lease.CodeNotFound,
				Reason: "the identity has no active lease to read its history by: the HTTP API reads history by lease id"}
		}
		return lease.HistoryResult{}, leaseErr(err, false)
	}
	at, err := record(cur.Lease, nil)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	out, err := s.history(ctx, cur.Lease.LeaseID, req.PageSize, req.PageToken)
	if err == nil && len(out.Entries) > 0 && out.Entries[0].Record.LockKey != at.LockKey {
		return lease.HistoryResult{}, corrupt("history of another identity")
	}
	return out, err
}

// HistoryByLeaseID pages through the terminal history of the identity of
// the lease leaseID (active or ended), newest first (audit:read); see
// History.
func (s *LeaseStore) HistoryByLeaseID(ctx context.Context, leaseID string, req lease.HistoryRequest) (lease.HistoryResult, error) {
	ctx, cancel := withDeadline(withCorrelation(ctx, req.Caller), req.DeadlineAt)
	defer cancel()
	return s.history(ctx, leaseID, req.PageSize, req.PageToken)
}

func (s *LeaseStore) history(ctx context.Context, leaseID string, size int, token string) (lease.HistoryResult, error) {
	res, err := s.c.History(ctx, leaseID, size, token)
	if err != nil {
		return lease.HistoryResult{}, leaseErr(err, false)
	}
	out := lease.HistoryResult{Entries: make([]lease.HistoryEntry, 0, len(res.History)), NextPageToken: res.NextPageToken}
	for _, h := range res.History {
		rec, err := record(h.Lease, s.lookup(h.LeaseID))
		if err != nil {
			return lease.HistoryResult{}, err
		}
		if !rec.State.Terminal() {
			return lease.HistoryResult{}, corrupt("history entry of a lease that has not ended")
		}
		if len(out.Entries) > 0 && rec.LockKey != out.Entries[0].Record.LockKey {
			return lease.HistoryResult{}, corrupt("history of more than one identity")
		}
		out.Entries = append(out.Entries, lease.HistoryEntry{HistoryVersion: lease.HistoryVersion, Record: rec,
			EndedAt: lease.At(h.EndedAt), Reason: h.Reason, IncidentID: h.IncidentID})
	}
	return out, nil
}
