package recovery

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/backupfile"
)

var credPepper = func() auth.Pepper {
	p, err := auth.NewPepper([]byte("recovery-test-pepper-0123456789abcdef"))
	if err != nil {
		panic(err)
	}
	return p
}()

func fileStore(t *testing.T) *auth.FileStore {
	t.Helper()
	s, err := auth.OpenFileStore(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func issueKey(t *testing.T, s auth.Store, mod func(*auth.IssueRequest)) (string, auth.Credential) {
	t.Helper()
	scope, err := auth.ParseScope("tenant:*,program:program-a,target-namespace:*,target:*,actor:*")
	if err != nil {
		t.Fatal(err)
	}
	req := auth.IssueRequest{PrincipalID: "prn_client_1", Class: auth.ClassAPIClient,
		Capabilities: []auth.Capability{auth.CapLease, auth.CapRead}, Scope: scope, Label: "backup test"}
	if mod != nil {
		mod(&req)
	}
	key, c, err := auth.Issue(context.Background(), s, credPepper, req)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	return key, c
}

func record(t *testing.T, c auth.Credential) string {
	t.Helper()
	b, err := auth.EncodeCredential(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Credentials survive a backup file and a restore into another FileStore:
// every record byte for byte (revocation and replacement included), and
// every original key still verifies against the restored verifiers.
func TestCredentialsRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := fileStore(t)
	live, _ := issueKey(t, src, func(r *auth.IssueRequest) { r.TTL = time.Hour })
	revoked, rc := issueKey(t, src, func(r *auth.IssueRequest) { r.Label = "to revoke" })
	admin, _ := issueKey(t, src, func(r *auth.IssueRequest) {
		r.PrincipalID, r.Class = "prn_admin", auth.ClassAdministrator
		r.Capabilities = []auth.Capability{auth.CapForceRelease, auth.CapCredentialsManage}
	})
	rotatedOld, oc := issueKey(t, src, nil)
	rotatedNew, _, err := auth.Rotate(ctx, src, credPepper, oc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Revoke(ctx, src, rc.ID); err != nil {
		t.Fatal(err)
	}
	keys := []string{live, revoked, admin, rotatedOld, rotatedNew}

	data, n, err := BackupCredentials(ctx, src)
	if err != nil || n != len(keys) || bytes.Count(data, []byte{'\n'}) != n {
		t.Fatalf("BackupCredentials = %d lines, n=%d, %v; want %d", bytes.Count(data, []byte{'\n'}), n, err, len(keys))
	}
	for _, key := range keys {
		id, secret, err := auth.ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		for _, leak := range [][]byte{[]byte(key), []byte(hex.EncodeToString(secret.Bytes())), secret.Bytes(),
			[]byte(strings.ToUpper(hex.EncodeToString(secret.Bytes())))} {
			if bytes.Contains(data, leak) {
				t.Fatalf("the credentials section holds the secret of %s", id)
			}
		}
	}

	// Through the container, as a backend's backup carries it.
	var file bytes.Buffer
	if _, err := backupfile.Write(&file, backupfile.Header{Backend: "bolt", CreatedAt: time.Now().UTC()},
		func(w io.Writer) error { _, err := io.WriteString(w, "db"); return err },
		backupfile.SectionData{Name: CredentialsSection, Data: data}); err != nil {
		t.Fatal(err)
	}
	_, sections, err := backupfile.ReadAll(&file, io.Discard)
	if err != nil || !bytes.Equal(sections[CredentialsSection], data) {
		t.Fatalf("ReadAll: %v", err)
	}

	dst := fileStore(t)
	if got, err := RestoreCredentials(ctx, dst, sections[CredentialsSection]); err != nil || got != n {
		t.Fatalf("RestoreCredentials = %d, %v; want %d", got, err, n)
	}
	all, err := src.List(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range all {
		got, err := dst.Get(ctx, want.ID)
		if err != nil {
			t.Fatalf("Get %s: %v", want.ID, err)
		}
		// The record holds every field, salt, verifier and MAC included.
		if record(t, got) != record(t, want) || !got.RevokedAt.Equal(want.RevokedAt) || got.ReplacedBy != want.ReplacedBy {
			t.Fatalf("restored %v, want %v", got, want)
		}
	}
	if got, _ := dst.Get(ctx, rc.ID); got.Status(time.Now()) != auth.StatusRevoked {
		t.Fatal("a revoked credential was restored live")
	}
	if got, _ := dst.Get(ctx, oc.ID); got.Status(time.Now()) != auth.StatusRevoked || got.ReplacedBy == "" {
		t.Fatal("a rotated credential lost its revocation or replacement")
	}

	a, err := auth.NewAuthenticator(dst, credPepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{live, admin, rotatedNew} {
		if _, err := a.Authenticate(ctx, []string{"Bearer " + key}); err != nil {
			t.Fatalf("a live key does not authenticate after restore: %v", err)
		}
	}
	// ReasonRevoked is only reached after the secret matched the verifier.
	for _, key := range []string{revoked, rotatedOld} {
		if _, f, err := a.AuthenticateDetail(ctx, []string{"Bearer " + key}); !errors.Is(err, auth.ErrInvalidCredential) || f.Reason != auth.ReasonRevoked {
			t.Fatalf("revoked key after restore: %v %v, want %s", f.Reason, err, auth.ReasonRevoked)
		}
	}
	// A wrong secret still fails, so the checks above are not vacuous.
	wrong := live[:len(live)-1] + "a"
	if wrong == live {
		wrong = live[:len(live)-1] + "b"
	}
	if _, f, _ := a.AuthenticateDetail(ctx, []string{"Bearer " + wrong}); f.Reason != auth.ReasonSecret {
		t.Fatalf("a wrong secret after restore: %q, want %s", f.Reason, auth.ReasonSecret)
	}
}

// Paging reaches every credential past the List cap, in id order.
func TestBackupCredentialsPages(t *testing.T) {
	ctx := context.Background()
	src := auth.NewMemoryStore()
	want := auth.MaxListLimit + 3
	for range want {
		issueKey(t, src, nil)
	}
	data, n, err := BackupCredentials(ctx, src)
	if err != nil || n != want {
		t.Fatalf("BackupCredentials n=%d %v, want %d", n, err, want)
	}
	creds, err := decodeCredentials(data)
	if err != nil || len(creds) != want {
		t.Fatalf("decode: %d %v", len(creds), err)
	}
	if empty, n, err := BackupCredentials(ctx, auth.NewMemoryStore()); err != nil || n != 0 || len(empty) != 0 {
		t.Fatalf("empty store: %q %d %v", empty, n, err)
	}
}

func backedUp(t *testing.T, count int) []byte {
	t.Helper()
	src := auth.NewMemoryStore()
	for range count {
		issueKey(t, src, nil)
	}
	data, _, err := BackupCredentials(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestRestoreCredentialsMalformedCreatesNothing(t *testing.T) {
	data := backedUp(t, 2)
	lines := strings.SplitAfter(string(data), "\n")[:2]
	for name, bad := range map[string]string{
		"no final newline": strings.TrimSuffix(string(data), "\n"),
		"empty line":       lines[0] + "\n" + lines[1],
		"crlf":             strings.Replace(lines[0], "\n", "\r\n", 1) + lines[1],
		"unknown field":    lines[0] + strings.Replace(lines[1], `{"record_version":1,`, `{"record_version":1,"x":1,`, 1),
		"cut line":         lines[0] + lines[1][:len(lines[1])/2] + "\n",
		"repeated":         lines[0] + lines[0],
		"out of order":     lines[1] + lines[0],
		"not json":         lines[0] + "hello\n",
	} {
		t.Run(name, func(t *testing.T) {
			if bad == string(data) {
				t.Fatal("the case did not change the section")
			}
			dst := fileStore(t)
			n, err := RestoreCredentials(context.Background(), dst, []byte(bad))
			if !errors.Is(err, auth.ErrCorrupt) || n != 0 {
				t.Fatalf("RestoreCredentials = %d, %v; want 0, ErrCorrupt", n, err)
			}
			if got, err := dst.List(context.Background(), "", 0); err != nil || len(got) != 0 {
				t.Fatalf("a refused restore left %d credentials (%v)", len(got), err)
			}
		})
	}
}

func TestRestoreCredentialsRefusesNonEmptyStore(t *testing.T) {
	ctx := context.Background()
	data := backedUp(t, 2)
	dst := fileStore(t)
	_, existing := issueKey(t, dst, nil)
	if n, err := RestoreCredentials(ctx, dst, data); !errors.Is(err, ErrCredentialTarget) || n != 0 {
		t.Fatalf("RestoreCredentials = %d, %v; want 0, ErrCredentialTarget", n, err)
	}
	if got, err := dst.List(ctx, "", 0); err != nil || len(got) != 1 || got[0].ID != existing.ID {
		t.Fatalf("the refused restore changed the store: %v %v", got, err)
	}
	// An empty section into an empty store is a restore of nothing.
	if n, err := RestoreCredentials(ctx, fileStore(t), nil); err != nil || n != 0 {
		t.Fatalf("empty section: %d %v", n, err)
	}
}
