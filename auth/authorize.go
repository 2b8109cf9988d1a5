package auth

import (
	"errors"
	"fmt"

	"github.com/starintel/starlease/lease"
)

// ErrAccessDenied reports a missing capability or a scope mismatch (403
// access_denied; on mutation paths the service may prefer lease_lost so
// ownership is not revealed). Errors returned by this file wrap it with an
// internal, non-secret reason.
var ErrAccessDenied = errors.New("access_denied")

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrAccessDenied}, args...)...)
}

// Require checks that p holds capability c.
func Require(p Principal, c Capability) error {
	if !p.Has(c) {
		return denied("capability %s required", c)
	}
	return nil
}

// CanForceRelease reports whether p may force-release or revoke at all:
// targets:force-release AND the administrator class. Scope still applies
// (AuthorizeAdmin).
func CanForceRelease(p Principal) bool {
	return p.Has(CapForceRelease) && p.Class == ClassAdministrator
}

// checkScope checks the canonical identity against p's scope and, for an
// actor_component, its actor binding.
func checkScope(p Principal, id lease.Identity) error {
	if !p.Scope.Allows(id) {
		return denied("identity outside the credential's scope")
	}
	if p.Class == ClassActorComponent {
		actor, ok := p.ActorBinding()
		if !ok || actor != id.ActorName {
			return denied("actor does not match the credential's actor binding")
		}
	}
	return nil
}

// CheckActor checks an actor name from the route or body (canonical)
// against an actor_component's binding; other classes pass.
func CheckActor(p Principal, actor string) error {
	if p.Class != ClassActorComponent {
		return nil
	}
	if bound, ok := p.ActorBinding(); !ok || bound != actor {
		return denied("actor does not match the credential's actor binding")
	}
	return nil
}

// AuthorizeAcquire authorizes acquiring a lease on the canonical identity
// id: targets:lease, and id within scope (and the actor binding).
func AuthorizeAcquire(p Principal, id lease.Identity) error {
	if err := Require(p, CapLease); err != nil {
		return err
	}
	return checkScope(p, id)
}

// AuthorizeHolder authorizes renew, release and commit authorization
// against the STORED lease, never the request's claims: targets:lease, the
// stored identity within scope, and the stored owner is p. The service
// should answer a denial on these paths as lease_lost.
func AuthorizeHolder(p Principal, stored *lease.Record) error {
	if err := Require(p, CapLease); err != nil {
		return err
	}
	if stored == nil {
		return denied("no stored lease")
	}
	if err := checkScope(p, stored.Identity()); err != nil {
		return err
	}
	if stored.OwnerPrincipalID != p.ID {
		return denied("lease held by another principal")
	}
	return nil
}

// OwnsLease reports whether p is the stored lease's owner principal.
func OwnsLease(p Principal, stored *lease.Record) bool {
	return stored != nil && stored.OwnerPrincipalID == p.ID
}

// CanView reports whether p may see the stored lease (inspect, list
// results): within scope, and either targets:read, or targets:lease and p
// owns it.
func CanView(p Principal, stored *lease.Record) bool {
	if stored == nil || checkScope(p, stored.Identity()) != nil {
		return false
	}
	return p.Has(CapRead) || p.Has(CapLease) && OwnsLease(p, stored)
}

// AuthorizeInspect authorizes inspecting by canonical identity before the
// read: targets:read or targets:lease, and id within scope. The result must
// still pass CanView (a targets:lease caller sees only its own leases).
func AuthorizeInspect(p Principal, id lease.Identity) error {
	if !p.Has(CapRead) && !p.Has(CapLease) {
		return denied("capability targets:read or targets:lease required")
	}
	return checkScope(p, id)
}

// AuthorizeAdmin authorizes force-release and revoke on the canonical
// identity: CanForceRelease and id within scope. The reason or incident id
// and the durable audit are the service's to enforce.
func AuthorizeAdmin(p Principal, id lease.Identity) error {
	if !CanForceRelease(p) {
		return denied("force-release and revoke need targets:force-release and an administrator credential")
	}
	return checkScope(p, id)
}

// AuthorizeHistory authorizes reading a lease identity's terminal history:
// audit:read and id within scope.
func AuthorizeHistory(p Principal, id lease.Identity) error {
	if err := Require(p, CapAuditRead); err != nil {
		return err
	}
	return checkScope(p, id)
}

// ListAccess is the outcome of AuthorizeList: which records of the page the
// caller may see.
type ListAccess struct {
	p Principal
	// OwnOnly: only the caller's own leases are visible (targets:lease
	// without targets:read).
	OwnOnly bool
}

// Visible reports whether a listed record may be returned. Every record
// of every page must pass it.
func (a ListAccess) Visible(rec *lease.Record) bool {
	if !CanView(a.p, rec) {
		return false
	}
	return !a.OwnOnly || OwnsLease(a.p, rec)
}

// AuthorizeList authorizes a list filter (its values are normalized here;
// an invalid value is a lease invalid_request error). By owner: the
// caller's own leases with targets:lease or targets:read, anyone's with
// targets:read. By target or program: targets:read over a filter the scope
// can reach, or targets:lease for the caller's own leases there. Results
// must still be passed through ListAccess.Visible.
func AuthorizeList(p Principal, req lease.ListRequest) (ListAccess, error) {
	read, own := p.Has(CapRead), p.Has(CapLease)
	if !read && !own {
		return ListAccess{}, denied("capability targets:read or targets:lease required")
	}
	access := ListAccess{p: p, OwnOnly: !read}
	norm := func(field, v string) (string, error) { return lease.NormalizeIdentifier(field, v) }
	switch req.By {
	case lease.ListByOwner:
		if err := lease.CheckOpaqueID("owner_principal_id", req.OwnerPrincipalID); err != nil {
			return ListAccess{}, err
		}
		if req.OwnerPrincipalID != p.ID && !read {
			return ListAccess{}, denied("listing another principal's leases needs targets:read")
		}
		return access, nil
	case lease.ListByTarget, lease.ListByProgram:
		t, err := norm("tenant_id", req.TenantID)
		if err != nil {
			return ListAccess{}, err
		}
		pr, err := norm("program_id", req.ProgramID)
		if err != nil {
			return ListAccess{}, err
		}
		if req.By == lease.ListByProgram {
			if !p.Scope.AllowsProgram(t, pr) {
				return ListAccess{}, denied("program outside the credential's scope")
			}
			return access, nil
		}
		ns, err := norm("target_namespace", req.TargetNamespace)
		if err != nil {
			return ListAccess{}, err
		}
		tg, err := norm("target_id", req.TargetID)
		if err != nil {
			return ListAccess{}, err
		}
		if !p.Scope.AllowsTarget(t, pr, ns, tg) {
			return ListAccess{}, denied("target outside the credential's scope")
		}
		return access, nil
	}
	return ListAccess{}, lease.Invalid("by", "unknown list filter")
}
