package auth

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

const everything = "tenant:*,program:*,target-namespace:*,target:*,actor:*"

func mustScope(t testing.TB, s string) Scope {
	t.Helper()
	sc, err := ParseScope(s)
	if err != nil {
		t.Fatalf("ParseScope(%q): %v", s, err)
	}
	return sc
}

func TestParseScope(t *testing.T) {
	ok := []struct{ in, canonical string }{
		{"", ""},
		{"  ", ""},
		{"tenant:*,program:program-a", "tenant:*,program:program-a"},
		{"program:program-a,tenant:*", "tenant:*,program:program-a"},
		{" tenant:Tenant-Main , program:PROGRAM-A ", "tenant:tenant-main,program:program-a"},
		{"tenant:b,tenant:a,tenant:b", "tenant:a,tenant:b"},
		{"tenant:a,tenant:*,tenant:b", "tenant:*"},
		{"tenant: *", "tenant:*"},
		{"target:ns:abc-1", "target:ns:abc-1"},
		{everything, everything},
		{"actor:usernamegen", "actor:usernamegen"},
		{"target-namespace:starintel-target", "target-namespace:starintel-target"},
	}
	for _, tc := range ok {
		sc, err := ParseScope(tc.in)
		if err != nil {
			t.Errorf("ParseScope(%q): %v", tc.in, err)
			continue
		}
		if sc.String() != tc.canonical {
			t.Errorf("ParseScope(%q) = %q, want %q", tc.in, sc.String(), tc.canonical)
		}
		again := mustScope(t, sc.String())
		if !again.Equal(sc) {
			t.Errorf("%q does not round-trip", tc.in)
		}
	}
	bad := []string{
		"tenant",     // no colon
		"tenant:",    // empty value
		"tenants:a",  // unknown dimension
		"Tenant:a",   // dimensions are exact
		"workflow:a", // not a scope dimension
		"tenant:a,",  // empty item
		",tenant:a",  // empty item
		"tenant:a,,program:b",
		"tenant:a*", // pattern characters are not wildcards
		"tenant:**",
		"tenant:a/b", // path syntax
		"tenant:../x",
		"tenant:-a",   // must start with a letter or digit
		"tenant:a b",  // whitespace inside
		"tenant:\x01", // control
		"tenant:" + strings.Repeat("a", 257),
		strings.Repeat("tenant:a,", MaxScopeGrants) + "tenant:b",
	}
	for _, in := range bad {
		if sc, err := ParseScope(in); err == nil {
			t.Errorf("ParseScope(%q) = %q, want an error", in, sc)
		}
	}
}

func id(tenant, program, ns, target, actor string) lease.Identity {
	return lease.Identity{TenantID: tenant, ProgramID: program, TargetNamespace: ns, TargetID: target,
		ActorName: actor, WorkflowName: "default", OperationClass: "default"}
}

func TestScopeAllows(t *testing.T) {
	a := id("tenant-main", "program-a", "starintel-target", "target-1", "usernamegen")
	otherTenant := id("tenant-other", "program-a", "starintel-target", "target-1", "usernamegen")
	otherProgram := id("tenant-main", "program-b", "starintel-target", "target-1", "usernamegen")
	otherActor := id("tenant-main", "program-a", "starintel-target", "target-1", "portscan")
	raw := id("Tenant-Main", "program-a", "starintel-target", "target-1", "usernamegen")
	cases := []struct {
		scope string
		id    lease.Identity
		want  bool
	}{
		{everything, a, true},
		{everything, otherTenant, true},
		{everything, raw, false}, // not canonical: denied even under wildcards
		{"", a, false},           // empty grants reach nothing
		{"", otherTenant, false},
		{"tenant:*,program:program-a", a, true}, // absent narrowing dimensions are unrestricted
		{"tenant:*,program:*,target-namespace:*,target:*", a, true},
		{"tenant:*,program:program-b", a, false},
		{"program:program-a,target:*", a, false}, // no tenant grant: the ownership boundary reaches nothing
		{"tenant:*,actor:usernamegen", a, false}, // no program grant
		{"tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*", a, true},
		{"tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*", otherTenant, false}, // cross-tenant
		{"tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*", otherProgram, false},
		{"tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:usernamegen", a, true},
		{"tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:usernamegen", otherActor, false},
		{"tenant:tenant-main,tenant:tenant-other,program:program-a,target-namespace:*,target:*,actor:*", otherTenant, true},
		{"tenant:*,program:program-a,target-namespace:starintel-target,target:target-1,actor:*", a, true},
		{"tenant:*,program:program-a,target-namespace:starintel-target,target:target-2,actor:*", a, false},
		{"tenant:TENANT-MAIN,program:Program-A,target-namespace:*,target:*,actor:*", a, true}, // grants normalized
	}
	for _, tc := range cases {
		if got := mustScope(t, tc.scope).Allows(tc.id); got != tc.want {
			t.Errorf("Scope(%q).Allows(%v) = %v, want %v", tc.scope, tc.id, got, tc.want)
		}
	}
	if (Scope{}).Allows(a) {
		t.Error("zero Scope allows an identity")
	}
}

func TestScopeFilters(t *testing.T) {
	sc := mustScope(t, "tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*")
	if !sc.AllowsTenant("tenant-main") || sc.AllowsTenant("tenant-other") {
		t.Error("AllowsTenant")
	}
	if !sc.AllowsProgram("tenant-main", "program-a") || sc.AllowsProgram("tenant-other", "program-a") || sc.AllowsProgram("tenant-main", "program-b") {
		t.Error("AllowsProgram")
	}
	if sc.AllowsProgram("TENANT-MAIN", "program-a") {
		t.Error("AllowsProgram accepted a non-canonical value")
	}
	if !sc.AllowsTarget("tenant-main", "program-a", "ns", "t1") || sc.AllowsTarget("tenant-main", "program-b", "ns", "t1") {
		t.Error("AllowsTarget")
	}
	if !sc.CoversProgram("tenant-main", "program-a") || !sc.CoversTarget("tenant-main", "program-a", "ns", "t1") {
		t.Error("Covers with wildcards below")
	}
	narrow := mustScope(t, "tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:usernamegen")
	if !narrow.AllowsProgram("tenant-main", "program-a") || narrow.CoversProgram("tenant-main", "program-a") {
		t.Error("an actor-restricted scope reaches but does not cover the program")
	}
	partial := mustScope(t, "tenant:*,program:program-a")
	if !partial.AllowsProgram("tenant-main", "program-a") || !partial.CoversProgram("tenant-main", "program-a") {
		t.Error("unrestricted narrowing dimensions cover the program")
	}
	if got := partial.Missing(); len(got) != 0 {
		t.Errorf("Missing = %v", got)
	}
	ownerless := mustScope(t, "target:*,actor:*")
	if ownerless.AllowsProgram("tenant-main", "program-a") {
		t.Error("a scope without tenant and program grants reaches nothing, not even for list filters")
	}
	if got := ownerless.Missing(); !slices.Equal(got, []Dimension{DimTenant, DimProgram}) {
		t.Errorf("Missing = %v", got)
	}
	if !(Scope{}).IsEmpty() || partial.IsEmpty() {
		t.Error("IsEmpty")
	}
	if v := narrow.Values(DimActor); !slices.Equal(v, []string{"usernamegen"}) {
		t.Errorf("Values = %v", v)
	}
	if b, ok := narrow.ActorBinding(); !ok || b != "usernamegen" {
		t.Error("ActorBinding of one explicit actor")
	}
	for _, s := range []string{everything, "actor:a,actor:b", ""} {
		if _, ok := mustScope(t, s).ActorBinding(); ok {
			t.Errorf("ActorBinding of %q", s)
		}
	}
}

func TestScopeJSON(t *testing.T) {
	sc := mustScope(t, "program:program-a,tenant:*")
	b, err := json.Marshal(sc)
	if err != nil || string(b) != `["tenant:*","program:program-a"]` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	var back Scope
	if err := json.Unmarshal(b, &back); err != nil || !back.Equal(sc) {
		t.Fatalf("Unmarshal = %v, %v", back, err)
	}
	if b, _ := json.Marshal(Scope{}); string(b) != "[]" {
		t.Fatalf("empty scope = %s", b)
	}
	for _, in := range []string{`null`, `"tenant:*"`, `["program:program-a","tenant:*"]`, `["tenant:A"]`, `["tenant:a","tenant:a"]`, `["tenant:a","tenant:*"]`, `["x:y"]`} {
		var s Scope
		if err := json.Unmarshal([]byte(in), &s); err == nil {
			t.Errorf("Unmarshal(%s) accepted a non-canonical scope", in)
		}
	}
}

// The reserved tenant of the server's own leases is never granted and
// never reached, not even by a wildcard.
func TestInternalTenantIsOutOfEveryScope(t *testing.T) {
	if _, err := ParseScope("tenant:" + lease.InternalTenant + ",program:*"); err == nil {
		t.Fatal("a scope granting the internal tenant was accepted")
	}
	if _, err := ParseScope("tenant:StarLease,program:*"); err == nil {
		t.Fatal("a scope granting the internal tenant in another case was accepted")
	}
	sc, err := ParseScope("tenant:*,program:*")
	if err != nil {
		t.Fatal(err)
	}
	id := lease.Identity{TenantID: lease.InternalTenant, ProgramID: "relay", TargetNamespace: "outbox", TargetID: "bolt",
		ActorName: "relay", WorkflowName: "default", OperationClass: "default"}
	if sc.Allows(id) || sc.AllowsTenant(lease.InternalTenant) || sc.AllowsProgram(lease.InternalTenant, "relay") ||
		sc.CoversProgram(lease.InternalTenant, "relay") || sc.CoversTarget(lease.InternalTenant, "relay", "outbox", "bolt") {
		t.Fatal("a wildcard scope reaches the internal tenant")
	}
	id.TenantID = "starlease-tenant"
	if !sc.Allows(id) {
		t.Fatal("a tenant that only starts like the internal one is not reached")
	}
}
