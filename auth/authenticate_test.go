package auth

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseAuthorization(t *testing.T) {
	key, _ := issueT(t, NewMemoryStore(), IssueRequest{Scope: mustScope(t, everything)})
	cases := []struct {
		name   string
		values []string
		want   Reason
	}{
		{"ok", []string{"Bearer " + key}, ReasonNone},
		{"lower-case scheme accepted", []string{"bearer " + key}, ReasonNone},
		{"upper-case scheme accepted", []string{"BEARER " + key}, ReasonNone},
		{"no header", nil, ReasonMissing},
		{"empty slice", []string{}, ReasonMissing},
		{"empty value", []string{""}, ReasonMissing},
		{"two headers", []string{"Bearer " + key, "Bearer " + key}, ReasonMultiple},
		{"two headers one empty", []string{"Bearer " + key, ""}, ReasonMultiple},
		{"two values in one header", []string{"Bearer " + key + ", Bearer " + key}, ReasonMalformed},
		{"two keys one scheme", []string{"Bearer " + key + "," + key}, ReasonMalformed},
		{"basic", []string{"Basic " + key}, ReasonMalformed},
		{"basic short", []string{"Basic x"}, ReasonMalformed},
		{"bearer without key", []string{"Bearer"}, ReasonMalformed},
		{"bearer space only", []string{"Bearer "}, ReasonMalformed},
		{"double space", []string{"Bearer  " + key}, ReasonMalformed},
		{"double space short", []string{"Bearer  a"}, ReasonMalformed},
		{"tab", []string{"Bearer\t" + key}, ReasonMalformed},
		{"no space", []string{"Bearer" + key}, ReasonMalformed},
		{"leading space", []string{" Bearer " + key}, ReasonMalformed},
		{"trailing space", []string{"Bearer " + key + " "}, ReasonMalformed},
		{"key only", []string{key}, ReasonMalformed},
		{"token68 other", []string{"Bearer abc"}, ReasonMalformed},
		{"malformed key", []string{"Bearer " + strings.ToUpper(key)}, ReasonMalformed},
		{"other scheme same length", []string{"Beaver " + key}, ReasonMalformed},
	}
	for _, tc := range cases {
		_, _, got := parseAuthorization(tc.values)
		if got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	clk := &clock{t: time.Now()}
	a := newAuth(t, s, clk.now)
	scope := mustScope(t, "tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*")
	key, c := issueT(t, s, IssueRequest{PrincipalID: "prn_svc", Class: ClassServiceInstance, ClientID: "client_7",
		Capabilities: []Capability{CapRead, CapLease}, Scope: scope, Now: clk.t})

	p, fail, err := a.AuthenticateDetail(ctx, bearer(key))
	if err != nil || fail.Reason != ReasonNone {
		t.Fatalf("right key: %v (%v)", err, fail)
	}
	want := Principal{ID: "prn_svc", Class: ClassServiceInstance, ClientID: "client_7", CredentialID: c.ID,
		Capabilities: []Capability{CapLease, CapRead}, Scope: scope}
	if p.ID != want.ID || p.Class != want.Class || p.ClientID != want.ClientID || p.CredentialID != want.CredentialID ||
		!slices.Equal(p.Capabilities, want.Capabilities) || !p.Scope.Equal(want.Scope) {
		t.Fatalf("principal = %+v, want %+v", p, want)
	}
	if _, err := a.Authenticate(ctx, []string{"bearer " + key}); err != nil {
		t.Fatalf("lower-case scheme: %v", err)
	}

	// A different key for the same id: wrong secret.
	id, secret, _ := ParseKey(key)
	secret[0] ^= 1
	wrong := FormatKey(id, secret)
	// A well-formed key for an id that does not exist.
	unknownID, _ := NewCredentialID(time.Now())
	unknown := FormatKey(unknownID, secret)

	failures := []struct {
		name   string
		values []string
		reason Reason
		credID string
	}{
		{"no header", nil, ReasonMissing, ""},
		{"two headers", []string{"Bearer " + key, "Bearer " + key}, ReasonMultiple, ""},
		{"basic", []string{"Basic " + key}, ReasonMalformed, ""},
		{"malformed key", []string{"Bearer " + key[:len(key)-1]}, ReasonMalformed, ""},
		{"wrong secret", bearer(wrong), ReasonSecret, c.ID},
		{"unknown id", bearer(unknown), ReasonUnknown, unknownID},
	}
	for _, tc := range failures {
		p, fail, err := a.AuthenticateDetail(ctx, tc.values)
		if err != ErrInvalidCredential {
			t.Errorf("%s: err = %v, want exactly ErrInvalidCredential", tc.name, err)
		}
		if p.ID != "" || p.CredentialID != "" || len(p.Capabilities) != 0 {
			t.Errorf("%s: a principal came back with the error", tc.name)
		}
		if fail.Reason != tc.reason || fail.CredentialID != tc.credID {
			t.Errorf("%s: failure %+v, want %q %q", tc.name, fail, tc.reason, tc.credID)
		}
		if _, err2 := a.Authenticate(ctx, tc.values); err2 != ErrInvalidCredential {
			t.Errorf("%s: Authenticate = %v", tc.name, err2)
		}
	}
	if ErrInvalidCredential.Error() != "invalid_credential" {
		t.Fatal("the error text must carry no detail")
	}

	// Expiry, decided by the authenticator's clock.
	ekey, _ := issueT(t, s, IssueRequest{Scope: scope, TTL: time.Minute, Now: clk.t})
	if _, err := a.Authenticate(ctx, bearer(ekey)); err != nil {
		t.Fatalf("fresh expiring key: %v", err)
	}
	clk.t = clk.t.Add(time.Minute)
	if _, fail, err := a.AuthenticateDetail(ctx, bearer(ekey)); err != ErrInvalidCredential || fail.Reason != ReasonExpired {
		t.Fatalf("expired key: %v %+v", err, fail)
	}
	if _, err := a.Authenticate(ctx, bearer(key)); err != nil {
		t.Fatalf("non-expiring key after the clock moved: %v", err)
	}

	// Revocation.
	if _, err := Revoke(ctx, s, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, fail, err := a.AuthenticateDetail(ctx, bearer(key)); err != ErrInvalidCredential || fail.Reason != ReasonRevoked {
		t.Fatalf("revoked key: %v %+v", err, fail)
	}
	// A wrong secret for a revoked id reports the mismatch, not the state.
	if _, fail, _ := a.AuthenticateDetail(ctx, bearer(wrong)); fail.Reason != ReasonSecret {
		t.Fatalf("wrong secret for a revoked id: %+v", fail)
	}
}

func TestAuthenticateStoreFailure(t *testing.T) {
	s := NewMemoryStore()
	key, _ := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	a := newAuth(t, s, nil)
	s.Close()
	_, fail, err := a.AuthenticateDetail(context.Background(), bearer(key))
	if !errors.Is(err, ErrUnavailable) || err == ErrInvalidCredential || fail.Reason != ReasonUnavailable {
		t.Fatalf("closed store: %v %+v", err, fail)
	}
	// Malformed input never reaches the store.
	if _, err := a.Authenticate(context.Background(), []string{"Basic x"}); err != ErrInvalidCredential {
		t.Fatalf("malformed with a closed store: %v", err)
	}
}

func TestAuthenticateCorruptRecord(t *testing.T) {
	s := NewMemoryStore()
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	s.mu.Lock()
	s.records[c.ID] = append(s.records[c.ID], ' ')
	s.mu.Unlock()
	_, fail, err := newAuth(t, s, nil).AuthenticateDetail(context.Background(), bearer(key))
	if err != ErrInvalidCredential || fail.Reason != ReasonCorrupt {
		t.Fatalf("corrupt record: %v %+v", err, fail)
	}
}

// The unknown-id path runs the same HMACs and constant-time comparisons as
// a known id: counted, not timed.
func TestUnknownIDSamePath(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	key, _ := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	a := newAuth(t, s, nil)
	var mu sync.Mutex
	var trace []string
	a.equal = func(x, y []byte) bool {
		mu.Lock()
		trace = append(trace, fmt.Sprintf("%d/%d", len(x), len(y)))
		mu.Unlock()
		return hmac.Equal(x, y)
	}
	id, secret, _ := ParseKey(key)
	unknownID, _ := NewCredentialID(time.Now())
	secret[5] ^= 0xff
	cases := []struct {
		name string
		h    []string
	}{
		{"right", bearer(key)},
		{"wrong secret", bearer(FormatKey(id, secret))},
		{"unknown id", bearer(FormatKey(unknownID, secret))},
	}
	var want string
	for _, tc := range cases {
		trace = nil
		a.Authenticate(ctx, tc.h)
		got := strings.Join(trace, ",")
		if want == "" {
			want = got
		}
		if got != want {
			t.Errorf("%s: comparisons %s, want the same as a right key: %s", tc.name, got, want)
		}
	}
	if want != "32/32,32/32" {
		t.Errorf("comparisons %s, want two of 32-byte MACs (verifier, authority)", want)
	}
	// Malformed input is rejected before any store read or comparison.
	trace = nil
	a.Authenticate(ctx, []string{"Bearer nope"})
	if len(trace) != 0 {
		t.Error("malformed input reached the comparison")
	}
}

// Someone who can write the store but lacks the pepper cannot raise a
// credential's authority or move a verifier between credentials.
func TestTamperedRecord(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, "tenant:t,program:p,target-namespace:*,target:*,actor:*")})
	_, admin := issueT(t, s, IssueRequest{PrincipalID: "prn_admin", Class: ClassAdministrator,
		Capabilities: []Capability{CapForceRelease}, Scope: mustScope(t, everything)})
	orig := s.rawRecord(c.ID)
	edits := map[string]func(Credential) Credential{
		"class":        func(x Credential) Credential { x.Class = ClassAdministrator; return x },
		"capabilities": func(x Credential) Credential { x.Capabilities = []Capability{CapLease, CapRead}; return x },
		"scope":        func(x Credential) Credential { x.Scope = mustScope(t, everything); return x },
		"principal":    func(x Credential) Credential { x.PrincipalID = "prn_admin"; return x },
		"expiry":       func(x Credential) Credential { x.ExpiresAt = x.CreatedAt.Add(time.Hour); return x },
		// The attacker's own salt and verifier copied into the admin record.
		"moved verifier": func(Credential) Credential {
			x := admin
			x.ID, x.salt, x.verifier = c.ID, c.salt, c.verifier
			return x
		},
	}
	for name, edit := range edits {
		b, err := EncodeCredential(edit(c))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s.mu.Lock()
		s.records[c.ID] = b
		s.mu.Unlock()
		_, fail, err := a.AuthenticateDetail(ctx, bearer(key))
		if err != ErrInvalidCredential || fail.Reason != ReasonTampered {
			t.Errorf("%s: %v %+v, want record_tampered", name, err, fail)
		}
	}
	// Label and revocation are not authority: editing them keeps the key
	// working (revocation is applied without the pepper).
	s.mu.Lock()
	s.records[c.ID] = orig
	s.mu.Unlock()
	relabeled := c
	relabeled.Label = "renamed"
	b, _ := EncodeCredential(relabeled)
	s.mu.Lock()
	s.records[c.ID] = b
	s.mu.Unlock()
	if _, err := a.Authenticate(ctx, bearer(key)); err != nil {
		t.Fatalf("relabeled: %v", err)
	}
}

func TestDifferentPepperCannotVerify(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	key, _ := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	other, _ := NewPepper([]byte("another-pepper-0123456789abcdef-0123456789"))
	a, _ := NewAuthenticator(s, other, nil)
	if _, fail, err := a.AuthenticateDetail(ctx, bearer(key)); err != ErrInvalidCredential || fail.Reason != ReasonSecret {
		t.Fatalf("other pepper: %v %+v", err, fail)
	}
	if _, err := newAuth(t, s, nil).Authenticate(ctx, bearer(key)); err != nil {
		t.Fatalf("own pepper: %v", err)
	}
	if _, err := NewAuthenticator(s, Pepper{}, nil); err == nil {
		t.Fatal("an Authenticator without a pepper was made")
	}
}

func TestRotateRevokeNextRequest(t *testing.T) {
	ctx := context.Background()
	for name, s := range map[string]Store{"memory": NewMemoryStore(), "file": openFileStore(t)} {
		t.Run(name, func(t *testing.T) {
			a := newAuth(t, s, nil)
			key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), TTL: time.Hour, Label: "rot"})
			if _, err := a.Authenticate(ctx, bearer(key)); err != nil {
				t.Fatal(err)
			}
			key2, c2, err := Rotate(ctx, s, testPepper, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			if key2 == key || c2.ID == c.ID || c2.PrincipalID != c.PrincipalID || c2.ClientID != c.ClientID ||
				!slices.Equal(c2.Capabilities, c.Capabilities) || !c2.Scope.Equal(c.Scope) || c2.Label != c.Label {
				t.Fatalf("rotated credential differs: %v vs %v", c2, c)
			}
			if c2.ExpiresAt.Sub(c2.CreatedAt) != time.Hour {
				t.Fatalf("rotated lifetime %v, want 1h", c2.ExpiresAt.Sub(c2.CreatedAt))
			}
			// No grace period, no cache: the old key fails on the very next call.
			if _, fail, err := a.AuthenticateDetail(ctx, bearer(key)); err != ErrInvalidCredential || fail.Reason != ReasonRevoked {
				t.Fatalf("old key after Rotate: %v %+v", err, fail)
			}
			p, err := a.Authenticate(ctx, bearer(key2))
			if err != nil || p.CredentialID != c2.ID {
				t.Fatalf("new key: %v", err)
			}
			old, _ := s.Get(ctx, c.ID)
			if old.ReplacedBy != c2.ID {
				t.Fatalf("old credential replaced by %q, want %q", old.ReplacedBy, c2.ID)
			}
			if _, _, err := Rotate(ctx, s, testPepper, c.ID); !errors.Is(err, ErrRevoked) {
				t.Fatalf("Rotate of a revoked credential: %v", err)
			}
			if _, err := Revoke(ctx, s, c2.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Authenticate(ctx, bearer(key2)); err != ErrInvalidCredential {
				t.Fatalf("new key after Revoke: %v", err)
			}
			if _, err := Revoke(ctx, s, "not-an-id"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Revoke of a malformed id: %v", err)
			}
			s.Close()
		})
	}
}
