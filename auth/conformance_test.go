package auth_test

import (
	"path/filepath"
	"testing"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/auth/authtest"
)

func TestMemoryStoreConformance(t *testing.T) {
	authtest.Run(t, func(t *testing.T) auth.Store { return auth.NewMemoryStore() })
}

func TestFileStoreConformance(t *testing.T) {
	authtest.Run(t, func(t *testing.T) auth.Store {
		s, err := auth.OpenFileStore(filepath.Join(t.TempDir(), "credentials"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// Two handles on one directory stand for two processes (a running server
// and the keys command): a key revoked through one fails through the other
// on the very next read.
func TestFileStoreSharedBetweenHandles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "credentials")
	a, err := auth.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := auth.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	pepper, err := auth.NewPepper([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	scope, err := auth.ParseScope("tenant:*,program:*")
	if err != nil {
		t.Fatal(err)
	}
	key, c, err := auth.Issue(t.Context(), a, pepper, auth.IssueRequest{PrincipalID: "prn-1", Class: auth.ClassAPIClient,
		Capabilities: []auth.Capability{auth.CapLease}, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.NewAuthenticator(b, pepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := authn.Authenticate(t.Context(), []string{"Bearer " + key}); err != nil || p.ID != "prn-1" {
		t.Fatalf("authenticate through the other handle: %v %+v", err, p)
	}
	if _, err := auth.Revoke(t.Context(), a, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := authn.Authenticate(t.Context(), []string{"Bearer " + key}); err != auth.ErrInvalidCredential {
		t.Fatalf("a key revoked through one handle must fail through the other, got %v", err)
	}
}
