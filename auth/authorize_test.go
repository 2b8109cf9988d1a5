package auth

import (
	"errors"
	"testing"

	"github.com/starintel/starlease/lease"
)

func principal(t *testing.T, id string, class Class, scope string, caps ...Capability) Principal {
	t.Helper()
	return Principal{ID: id, Class: class, ClientID: id, CredentialID: "01ARZ3NDEKTSV4RRFFQ69G5FAV", Capabilities: caps, Scope: mustScope(t, scope)}
}

func leaseRec(ident lease.Identity, owner string) *lease.Record {
	r := &lease.Record{OwnerPrincipalID: owner}
	r.SetIdentity(ident)
	return r
}

func TestRequireAndForceRelease(t *testing.T) {
	admin := principal(t, "prn_admin", ClassAdministrator, everything, CapForceRelease)
	adminNoCap := principal(t, "prn_admin", ClassAdministrator, everything, CapRead)
	clientWithCap := principal(t, "prn_c", ClassAPIClient, everything, CapForceRelease)
	if err := Require(admin, CapForceRelease); err != nil {
		t.Fatal(err)
	}
	if err := Require(admin, CapLease); !errors.Is(err, ErrAccessDenied) {
		t.Fatalf("Require missing = %v", err)
	}
	if !CanForceRelease(admin) || CanForceRelease(adminNoCap) || CanForceRelease(clientWithCap) {
		t.Fatal("CanForceRelease needs the capability AND the administrator class")
	}
	a := id("tenant-main", "program-a", "ns", "t1", "usernamegen")
	if err := AuthorizeAdmin(admin, a); err != nil {
		t.Fatal(err)
	}
	narrowAdmin := principal(t, "prn_admin", ClassAdministrator, "tenant:other,program:*,target-namespace:*,target:*,actor:*", CapForceRelease)
	for name, p := range map[string]Principal{"no cap": adminNoCap, "not admin": clientWithCap, "out of scope": narrowAdmin} {
		if err := AuthorizeAdmin(p, a); !errors.Is(err, ErrAccessDenied) {
			t.Errorf("AuthorizeAdmin %s = %v", name, err)
		}
	}
}

func TestLeaseOwnershipRules(t *testing.T) {
	scope := "tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*"
	a := id("tenant-main", "program-a", "ns", "t1", "usernamegen")
	b := id("tenant-main", "program-a", "ns", "t1", "portscan")
	x := id("tenant-other", "program-a", "ns", "t1", "usernamegen")
	leaser := principal(t, "prn_l", ClassServiceInstance, scope, CapLease)
	reader := principal(t, "prn_r", ClassAPIClient, scope, CapRead)
	both := principal(t, "prn_b", ClassAPIClient, scope, CapLease, CapRead)
	actor := principal(t, "prn_actor", ClassActorComponent, "tenant:*,program:*,target-namespace:*,target:*,actor:usernamegen", CapLease)
	auditor := principal(t, "prn_aud", ClassAPIClient, scope, CapAuditRead)

	// Acquire.
	if AuthorizeAcquire(leaser, a) != nil || AuthorizeAcquire(actor, a) != nil {
		t.Error("acquire in scope denied")
	}
	for name, c := range map[string]struct {
		p  Principal
		id lease.Identity
	}{
		"reader cannot acquire": {reader, a},
		"cross-tenant":          {leaser, x},
		"other actor":           {actor, b},
		"raw identity":          {leaser, id("Tenant-Main", "program-a", "ns", "t1", "usernamegen")},
	} {
		if err := AuthorizeAcquire(c.p, c.id); !errors.Is(err, ErrAccessDenied) {
			t.Errorf("AuthorizeAcquire %s = %v", name, err)
		}
	}

	// Renew/release: against the stored lease and its owner.
	if AuthorizeHolder(leaser, leaseRec(a, "prn_l")) != nil {
		t.Error("holder denied its own lease")
	}
	for name, c := range map[string]struct {
		p   Principal
		rec *lease.Record
	}{
		"another owner":              {leaser, leaseRec(a, "prn_other")},
		"reader":                     {reader, leaseRec(a, "prn_r")},
		"stored out of scope":        {leaser, leaseRec(x, "prn_l")},
		"actor, other actor":         {actor, leaseRec(b, "prn_actor")},
		"no record":                  {leaser, nil},
		"reader+leaser, other owner": {both, leaseRec(a, "prn_x")},
	} {
		if err := AuthorizeHolder(c.p, c.rec); !errors.Is(err, ErrAccessDenied) {
			t.Errorf("AuthorizeHolder %s = %v", name, err)
		}
	}

	// View (inspect and list results).
	views := []struct {
		name string
		p    Principal
		rec  *lease.Record
		want bool
	}{
		{"leaser own", leaser, leaseRec(a, "prn_l"), true},
		{"leaser other's", leaser, leaseRec(a, "prn_x"), false},
		{"reader any in scope", reader, leaseRec(a, "prn_x"), true},
		{"reader out of scope", reader, leaseRec(x, "prn_x"), false},
		{"actor own actor", actor, leaseRec(a, "prn_actor"), true},
		{"actor other actor", actor, leaseRec(b, "prn_actor"), false},
		{"auditor", auditor, leaseRec(a, "prn_aud"), false},
		{"nil", reader, nil, false},
	}
	for _, v := range views {
		if got := CanView(v.p, v.rec); got != v.want {
			t.Errorf("CanView %s = %v", v.name, got)
		}
	}
	if AuthorizeInspect(reader, a) != nil || AuthorizeInspect(leaser, a) != nil {
		t.Error("inspect in scope denied")
	}
	if !errors.Is(AuthorizeInspect(auditor, a), ErrAccessDenied) || !errors.Is(AuthorizeInspect(reader, x), ErrAccessDenied) {
		t.Error("inspect without capability or out of scope allowed")
	}
	if AuthorizeHistory(auditor, a) != nil || !errors.Is(AuthorizeHistory(reader, a), ErrAccessDenied) || !errors.Is(AuthorizeHistory(auditor, x), ErrAccessDenied) {
		t.Error("history needs audit:read and scope")
	}
	if CheckActor(actor, "usernamegen") != nil || !errors.Is(CheckActor(actor, "portscan"), ErrAccessDenied) || CheckActor(leaser, "portscan") != nil {
		t.Error("CheckActor")
	}
}

func TestAuthorizeList(t *testing.T) {
	scope := "tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*"
	a := id("tenant-main", "program-a", "ns", "t1", "usernamegen")
	leaser := principal(t, "prn_l", ClassServiceInstance, scope, CapLease)
	reader := principal(t, "prn_r", ClassAPIClient, scope, CapRead)
	auditor := principal(t, "prn_aud", ClassAPIClient, scope, CapAuditRead)

	byOwner := func(o string) lease.ListRequest { return lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: o} }
	byProgram := func(t, p string) lease.ListRequest {
		return lease.ListRequest{By: lease.ListByProgram, TenantID: t, ProgramID: p}
	}
	byTarget := lease.ListRequest{By: lease.ListByTarget, TenantID: "Tenant-Main", ProgramID: "program-a", TargetNamespace: "ns", TargetID: "t1"}

	acc, err := AuthorizeList(leaser, byOwner("prn_l"))
	if err != nil || !acc.OwnOnly {
		t.Fatalf("own list: %v %+v", err, acc)
	}
	if !acc.Visible(leaseRec(a, "prn_l")) || acc.Visible(leaseRec(a, "prn_x")) {
		t.Error("own-only visibility")
	}
	if _, err := AuthorizeList(leaser, byOwner("prn_x")); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("leaser listing another owner: %v", err)
	}
	if acc, err := AuthorizeList(reader, byOwner("prn_x")); err != nil || acc.OwnOnly || !acc.Visible(leaseRec(a, "prn_x")) {
		t.Errorf("reader listing another owner: %v", err)
	}
	if acc, err := AuthorizeList(leaser, byTarget); err != nil || !acc.OwnOnly {
		t.Errorf("leaser by target (normalized): %v", err)
	}
	if _, err := AuthorizeList(reader, byProgram("tenant-other", "program-a")); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("cross-tenant program list: %v", err)
	}
	if _, err := AuthorizeList(reader, byProgram("tenant-main", "program-a")); err != nil {
		t.Errorf("program list: %v", err)
	}
	if _, err := AuthorizeList(auditor, byProgram("tenant-main", "program-a")); !errors.Is(err, ErrAccessDenied) {
		t.Errorf("list without targets:read or targets:lease: %v", err)
	}
	if _, err := AuthorizeList(reader, byProgram("tenant/main", "program-a")); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Errorf("invalid filter value: %v", err)
	}
	if _, err := AuthorizeList(reader, lease.ListRequest{By: "pattern"}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Errorf("unknown filter: %v", err)
	}
	// A reader's results are still filtered by scope.
	acc, _ = AuthorizeList(reader, byOwner("prn_x"))
	if acc.Visible(leaseRec(id("tenant-other", "program-a", "ns", "t1", "a"), "prn_x")) {
		t.Error("list result outside scope visible")
	}
}

func TestPrincipalContext(t *testing.T) {
	p := principal(t, "prn_1", ClassAPIClient, everything, CapLease)
	ctx := NewContext(t.Context(), p)
	got, ok := FromContext(ctx)
	if !ok || got.ID != "prn_1" {
		t.Fatal("FromContext")
	}
	if _, ok := FromContext(t.Context()); ok {
		t.Fatal("FromContext on an empty context")
	}
	c := p.Caller("corr-1")
	if c.PrincipalID != "prn_1" || c.PrincipalClass != "api_client" || c.ClientID != "prn_1" || c.CredentialID != p.CredentialID || c.CorrelationID != "corr-1" {
		t.Fatalf("Caller = %+v", c)
	}
}
