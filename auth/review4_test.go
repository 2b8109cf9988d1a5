package auth

// Review 4 (HTTP perf branch) attacks on a memo of decoded FileStore records
// the Authenticator briefly had. The memo was removed: a known id's first
// request after any change to its record paid a decode an unknown id never
// did, so one wrong-secret request told known ids from unknown ones. These
// tests of what a memo must never do (remember a decision, share a record
// between ids, alias a principal) stay as regression tests.

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// review4File returns the path of credential id's record in the FileStore at dir.
func review4File(dir, id string) string { return filepath.Join(dir, id+".json") }

func review4Store(t *testing.T) (*FileStore, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "credentials")
	s, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// HELD. No decision is remembered: a revoked, rotated or expired key fails
// on the very next call although every record it flips between was
// remembered before, and restoring the old bytes is the old answer again
// (memo hit), in both directions, many times over.
func TestReview4MemoNeverRemembersADecision(t *testing.T) {
	ctx := context.Background()
	s, dir := review4Store(t)
	clk := &clock{t: time.Now()}
	a := newAuth(t, s, clk.now)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), TTL: time.Hour})
	file := review4File(dir, c.ID)
	active, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Revoke(ctx, s, c.ID); err != nil {
		t.Fatal(err)
	}
	revoked, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, want Reason) {
		t.Helper()
		_, fail, err := a.AuthenticateDetail(ctx, bearer(key))
		if want == ReasonNone && err != nil || want != ReasonNone && fail.Reason != want {
			t.Fatalf("%s: %v %+v, want %q", what, err, fail, want)
		}
	}
	for i := 0; i < 5; i++ { // both versions are remembered after the first round
		if err := os.WriteFile(file, active, 0o600); err != nil {
			t.Fatal(err)
		}
		check("active", ReasonNone)
		check("active again", ReasonNone)
		if err := os.WriteFile(file, revoked, 0o600); err != nil {
			t.Fatal(err)
		}
		check("revoked", ReasonRevoked)
		check("revoked again", ReasonRevoked)
	}

	// Expiry at the exact boundary, the record remembered.
	if err := os.WriteFile(file, active, 0o600); err != nil {
		t.Fatal(err)
	}
	c2, err := DecodeCredential(active)
	if err != nil {
		t.Fatal(err)
	}
	clk.t = c2.ExpiresAt.Add(-time.Millisecond)
	check("1 ms before expiry", ReasonNone)
	clk.t = c2.ExpiresAt
	check("at expiry", ReasonExpired)
	clk.t = c2.ExpiresAt.Add(-time.Millisecond)
	check("clock back before expiry", ReasonNone)

	// Rotation: the old key fails at once, the new one works, the old one
	// keeps failing after the new one's record is remembered.
	clk.t = time.Now()
	newKey, _, err := Rotate(ctx, s, testPepper, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	check("rotated away", ReasonRevoked)
	if _, err := a.Authenticate(ctx, bearer(newKey)); err != nil {
		t.Fatalf("successor key: %v", err)
	}
	check("rotated away, after the successor was used", ReasonRevoked)
}

// HELD. A record copied byte for byte under another id's file name decodes
// (and is remembered) as the credential it names, not the file's: neither
// key authenticates through it, whichever was remembered first.
func TestReview4MemoRecordCopiedUnderAnotherID(t *testing.T) {
	ctx := context.Background()
	s, dir := review4Store(t)
	a := newAuth(t, s, nil)
	victimKey, victim := issueT(t, s, IssueRequest{Scope: mustScope(t, "tenant:a"), PrincipalID: "prn_victim"})
	adminKey, admin := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), PrincipalID: "prn_admin",
		Class: ClassAdministrator, Capabilities: []Capability{CapLease, CapForceRelease}})
	// Remember the admin's record first, through its own key.
	if p, err := a.Authenticate(ctx, bearer(adminKey)); err != nil || p.ID != "prn_admin" {
		t.Fatalf("admin: %+v %v", p, err)
	}
	adminRec, err := os.ReadFile(review4File(dir, admin.ID))
	if err != nil {
		t.Fatal(err)
	}
	// The admin's exact record under the victim's id (a memo hit).
	if err := os.WriteFile(review4File(dir, victim.ID), adminRec, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{victimKey, FormatKey(victim.ID, mustSecret(t, adminKey))} {
		p, fail, err := a.AuthenticateDetail(ctx, bearer(k))
		if err == nil || fail.Reason != ReasonCorrupt {
			t.Fatalf("admin record under the victim's id: %+v %+v %v, want corrupt", p, fail, err)
		}
	}
}

func mustSecret(t *testing.T, key string) Secret {
	t.Helper()
	_, s, err := ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// HELD. What the Authenticator hands out cannot change the remembered
// decoding: a caller that scribbles over the principal's capabilities does
// not raise or break the next authentication with the same record.
func TestReview4MemoNotAliasedByPrincipal(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	key, _ := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	p, err := a.Authenticate(ctx, bearer(key))
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Capabilities {
		p.Capabilities[i] = CapForceRelease
	}
	p.Capabilities = append(p.Capabilities, CapForceRelease)
	q, err := a.Authenticate(ctx, bearer(key))
	if err != nil {
		t.Fatalf("after mutating a principal: %v", err)
	}
	if q.Has(CapForceRelease) || len(q.Capabilities) != 1 || q.Capabilities[0] != CapLease {
		t.Fatalf("remembered decoding changed through a principal: %v", q.Capabilities)
	}
}
