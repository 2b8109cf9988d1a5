package auth

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestIssueValidation(t *testing.T) {
	ctx := context.Background()
	all := mustScope(t, everything)
	actorScope := mustScope(t, "tenant:*,program:*,target-namespace:*,target:*,actor:usernamegen")
	base := IssueRequest{PrincipalID: "prn_1", Class: ClassAPIClient, Capabilities: []Capability{CapLease}, Scope: all}
	bad := map[string]func(*IssueRequest){
		"no principal":         func(r *IssueRequest) { r.PrincipalID = "" },
		"principal with slash": func(r *IssueRequest) { r.PrincipalID = "prn/1" },
		"client with space":    func(r *IssueRequest) { r.ClientID = "client 1" },
		"unknown class":        func(r *IssueRequest) { r.Class = "root" },
		"empty class":          func(r *IssueRequest) { r.Class = "" },
		"no capability":        func(r *IssueRequest) { r.Capabilities = nil },
		"unknown capability":   func(r *IssueRequest) { r.Capabilities = []Capability{CapLease, "targets:write"} },
		"capability case":      func(r *IssueRequest) { r.Capabilities = []Capability{"Targets:Lease"} },
		"negative ttl":         func(r *IssueRequest) { r.TTL = -time.Second },
		"huge ttl":             func(r *IssueRequest) { r.TTL = MaxKeyTTL + 1 },
		"long label":           func(r *IssueRequest) { r.Label = strings.Repeat("x", MaxLabelBytes+1) },
		"control in label":     func(r *IssueRequest) { r.Label = "a\nb" },
		"actor without actor": func(r *IssueRequest) {
			r.Class = ClassActorComponent
			r.Scope = mustScope(t, "tenant:*,program:*,target-namespace:*,target:*")
		},
		"actor with actor *": func(r *IssueRequest) { r.Class = ClassActorComponent },
		"actor with two actors": func(r *IssueRequest) {
			r.Class = ClassActorComponent
			r.Scope = mustScope(t, "actor:a,actor:b,tenant:*")
		},
		"actor with empty scope": func(r *IssueRequest) { r.Class = ClassActorComponent; r.Scope = Scope{} },
		"force-release non-admin": func(r *IssueRequest) {
			r.Capabilities = []Capability{CapForceRelease}
		},
	}
	for name, mod := range bad {
		s := NewMemoryStore()
		req := base
		mod(&req)
		key, c, err := Issue(ctx, s, testPepper, req)
		if err == nil {
			t.Errorf("%s: Issue succeeded: %v", name, c)
			continue
		}
		if key != "" {
			t.Errorf("%s: a key came back with the error", name)
		}
		if all, _ := s.List(ctx, "", 0); len(all) != 0 {
			t.Errorf("%s: a refused credential was stored", name)
		}
	}

	good := map[string]func(*IssueRequest){
		"defaults":        func(r *IssueRequest) {},
		"actor component": func(r *IssueRequest) { r.Class = ClassActorComponent; r.Scope = actorScope },
		"admin force": func(r *IssueRequest) {
			r.Class = ClassAdministrator
			r.Capabilities = []Capability{CapForceRelease, CapRead}
		},
		"empty scope":        func(r *IssueRequest) { r.Scope = Scope{}; r.Capabilities = []Capability{CapCredentialsManage} },
		"all capabilities":   func(r *IssueRequest) { r.Class = ClassAdministrator; r.Capabilities = Capabilities() },
		"duplicate caps":     func(r *IssueRequest) { r.Capabilities = []Capability{CapRead, CapLease, CapRead} },
		"client and label":   func(r *IssueRequest) { r.ClientID = "client_x"; r.Label = "ci — runner" },
		"ttl":                func(r *IssueRequest) { r.TTL = time.Hour },
		"service instance":   func(r *IssueRequest) { r.Class = ClassServiceInstance },
		"max ttl is allowed": func(r *IssueRequest) { r.TTL = MaxKeyTTL },
	}
	for name, mod := range good {
		s := NewMemoryStore()
		req := base
		mod(&req)
		key, c, err := Issue(ctx, s, testPepper, req)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if _, err := newAuth(t, s, nil).Authenticate(ctx, bearer(key)); err != nil {
			t.Errorf("%s: the issued key does not authenticate: %v", name, err)
		}
		if req.ClientID == "" && c.ClientID != c.PrincipalID {
			t.Errorf("%s: default client id %q", name, c.ClientID)
		}
		if req.TTL > 0 && c.ExpiresAt.Sub(c.CreatedAt) != req.TTL {
			t.Errorf("%s: lifetime %v", name, c.ExpiresAt.Sub(c.CreatedAt))
		}
		if req.TTL == 0 && !c.ExpiresAt.IsZero() {
			t.Errorf("%s: a key without TTL expires", name)
		}
	}
	if _, _, err := Issue(ctx, NewMemoryStore(), Pepper{}, base); err == nil {
		t.Error("Issue without a pepper succeeded")
	}
}

func TestParseClassAndCapabilities(t *testing.T) {
	for _, c := range Classes() {
		if got, err := ParseClass(string(c)); err != nil || got != c {
			t.Errorf("ParseClass(%q)", c)
		}
	}
	for _, bad := range []string{"", "admin", "Administrator", "api-client"} {
		if _, err := ParseClass(bad); err == nil {
			t.Errorf("ParseClass(%q) accepted", bad)
		}
	}
	got, err := ParseCapabilities(" targets:read , targets:lease,targets:read")
	if err != nil || len(got) != 2 || got[0] != CapLease || got[1] != CapRead {
		t.Fatalf("ParseCapabilities = %v, %v", got, err)
	}
	for _, bad := range []string{"", "targets:lease,", "targets:lease,,targets:read", "targets:*", "*", "audit:write", "TARGETS:LEASE"} {
		if _, err := ParseCapabilities(bad); err == nil {
			t.Errorf("ParseCapabilities(%q) accepted", bad)
		}
	}
}
