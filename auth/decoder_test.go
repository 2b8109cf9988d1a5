package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Every change to a credential's record applies at the next request
// although the store remembers decodes: a revocation by another process
// (a second store on the same directory, as the keys command is), a
// same-length edit that breaks the authority MAC, and an expiry.
func TestDecodesNeverServeAStaleRecord(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	clk := &clock{t: time.Now().UTC()}
	a := newAuth(t, s, clk.now)
	key, c := issueT(t, s, IssueRequest{TTL: time.Hour})
	ok := func(when string) {
		t.Helper()
		for i := 0; i < 2; i++ { // the second from memory
			if _, fail, err := a.AuthenticateDetail(ctx, bearer(key)); err != nil {
				t.Fatalf("%s: %v (%s)", when, err, fail.Reason)
			}
		}
	}
	refused := func(when string, want Reason) {
		t.Helper()
		for i := 0; i < 2; i++ {
			if _, fail, err := a.AuthenticateDetail(ctx, bearer(key)); err == nil || fail.Reason != want {
				t.Fatalf("%s: %v, reason %q; want %q", when, err, fail.Reason, want)
			}
		}
	}
	ok("fresh key")

	path := filepath.Join(s.dir, c.ID+".json")
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(orig, []byte(`"prn_client_1"`), []byte(`"prn_client_2"`), 1)
	if bytes.Equal(edited, orig) || len(edited) != len(orig) {
		t.Fatal("the edit did not apply")
	}
	if err := os.WriteFile(path, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	refused("principal edited in place", ReasonTampered)
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	ok("record put back")

	clk.t = clk.t.Add(2 * time.Hour)
	refused("past its expiry", ReasonExpired)
	clk.t = clk.t.Add(-2 * time.Hour)
	ok("clock back")

	other, err := OpenFileStore(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Revoke(ctx, c.ID, clk.t); err != nil {
		t.Fatal(err)
	}
	refused("revoked by another store", ReasonRevoked)
}

// A caller gets a credential of its own: changing one changes neither the
// memory nor another caller's; and the memory keeps its own copy of the
// bytes, so a caller reusing its buffer for other bytes gets those decoded.
func TestDecodesHandOutCopies(t *testing.T) {
	s := openFileStore(t)
	scope, err := ParseScope("tenant:*,program:program-a")
	if err != nil {
		t.Fatal(err)
	}
	_, c := issueT(t, s, IssueRequest{Capabilities: []Capability{CapLease, CapRead}, Scope: scope})
	path := filepath.Join(s.dir, c.ID+".json")
	var d Decodes
	if _, err := d.Decode(c.ID, mustRead(t, path)); err != nil {
		t.Fatal(err)
	}
	first, err := d.Decode(c.ID, mustRead(t, path)) // from memory
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%+v", first)
	first.Capabilities[0] = CapForceRelease
	first.salt[0] ^= 1
	first.verifier[0] ^= 1
	first.mac[0] ^= 1
	for i := range first.Scope.grants {
		for j := range first.Scope.grants[i] {
			first.Scope.grants[i][j] = "changed"
		}
	}
	again, err := d.Decode(c.ID, mustRead(t, path))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%+v", again); got != want {
		t.Fatalf("the memory changed with a caller's copy:\n got %s\nwant %s", got, want)
	}

	var fresh Decodes
	buf := mustRead(t, path)
	if _, err := fresh.Decode(c.ID, buf); err != nil {
		t.Fatal(err)
	}
	copy(buf[bytes.Index(buf, []byte(`"prn_client_1"`)):], `"prn_client_9"`)
	if got, err := fresh.Decode(c.ID, buf); err != nil || got.PrincipalID != "prn_client_9" {
		t.Fatalf("bytes changed in the caller's buffer decoded as %q (%v), want prn_client_9", got.PrincipalID, err)
	}
}

// Only a record stored under its own id decodes; a failure is never
// remembered; past the bound every id still decodes right.
func TestDecodesChecksAndBounds(t *testing.T) {
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{})
	raw := mustRead(t, filepath.Join(s.dir, c.ID+".json"))
	var d Decodes
	if _, err := d.Decode("01ARZ3NDEKTSV4RRFFQ69G5FAV", raw); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("record under another id: %v", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := d.Decode(c.ID, raw[:len(raw)-2]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut record: %v", err)
		}
	}
	for i := 0; i < maxDecodes+10; i++ {
		if _, err := d.Decode(fmt.Sprintf("id-%d", i), raw); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("filler %d: %v", i, err)
		}
		if i%1000 == 0 {
			if got, err := d.Decode(c.ID, raw); err != nil || got.ID != c.ID {
				t.Fatalf("after %d others: %v", i, err)
			}
		}
	}
	if n := len(d.last); n > maxDecodes {
		t.Fatalf("holds %d decodes, bound %d", n, maxDecodes)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
