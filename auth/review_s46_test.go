package auth

import (
	"testing"

	"github.com/starintel/starlease/lease"
)

// From the first review of session 46: scope edges that held (prefixes,
// wildcards, empty and case-variant values, the internal tenant).
func TestS46ScopeEdgesHold(t *testing.T) {
	sc, err := ParseScope("tenant:tenant-a,program:program-a,actor:crawler")
	if err != nil {
		t.Fatal(err)
	}
	id := func(tn, pr, actor string) lease.Identity {
		return lease.Identity{TenantID: tn, ProgramID: pr, TargetNamespace: "web", TargetID: "x.example", ActorName: actor,
			WorkflowName: "default", OperationClass: "default"}
	}
	deny := []lease.Identity{
		id("tenant-ab", "program-a", "crawler"), id("tenant", "program-a", "crawler"), id("tenant-a", "program-ab", "crawler"),
		id("tenant-a", "program-a", "crawler2"), id("*", "program-a", "crawler"), id("tenant-a", "*", "crawler"),
		id("", "program-a", "crawler"), id("tenant-a", "", "crawler"), id("Tenant-A", "program-a", "crawler"),
		id("starlease", "program-a", "crawler"),
	}
	for _, d := range deny {
		if sc.Allows(d) {
			t.Errorf("scope allows %+v", d)
		}
	}
	for _, bad := range []string{"tenant:tenant-a*", "tenant:*tenant", "tenant:%2A", "tenant:", "tenant:starlease",
		"tenant:Starlease", "tenant:tenant a"} {
		if s, err := ParseScope(bad + ",program:p"); err == nil {
			t.Errorf("ParseScope(%q) = %v, want an error", bad, s)
		}
	}
	// Wildcard tenant never reaches the internal tenant, whatever spelling
	// normalizes to it; look-alikes (NFC, not NFKC: by design) are other
	// tenants with other lock keys.
	wild, _ := ParseScope("tenant:*,program:*")
	_, internalKey, _ := lease.CanonicalLockKey(id("starlease", "p", "a"), lease.OperationClasses{})
	for _, tn := range []string{"starlease", "Starlease", " STARLEASE ", "ſtarlease", "ｓｔａｒｌｅａｓｅ"} {
		c, key, err := lease.CanonicalLockKey(id(tn, "p", "a"), lease.OperationClasses{})
		if err != nil {
			continue // refused outright
		}
		if c.TenantID == lease.InternalTenant && wild.Allows(c) {
			t.Errorf("tenant:* reaches %q (canonical %q)", tn, c.TenantID)
		}
		if c.TenantID != lease.InternalTenant && key == internalKey {
			t.Errorf("%q has the internal tenant's lock key", tn)
		}
	}
}
