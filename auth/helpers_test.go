package auth

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

var testPepper = func() Pepper {
	p, err := NewPepper([]byte("test-pepper-0123456789abcdef-0123456789abcdef"))
	if err != nil {
		panic(err)
	}
	return p
}()

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func issueT(t testing.TB, s Store, req IssueRequest) (string, Credential) {
	t.Helper()
	if req.PrincipalID == "" {
		req.PrincipalID = "prn_client_1"
	}
	if req.Class == "" {
		req.Class = ClassAPIClient
	}
	if req.Capabilities == nil {
		req.Capabilities = []Capability{CapLease}
	}
	key, c, err := Issue(context.Background(), s, testPepper, req)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	return key, c
}

func newAuth(t *testing.T, s Store, now func() time.Time) *Authenticator {
	t.Helper()
	a, err := NewAuthenticator(s, testPepper, now)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func bearer(key string) []string { return []string{"Bearer " + key} }

func openFileStore(t testing.TB) *FileStore {
	t.Helper()
	s, err := OpenFileStore(filepath.Join(t.TempDir(), "credentials"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
