package auth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, name string, data string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // beat the umask
		t.Fatal(err)
	}
	return p
}

func TestLoadPepper(t *testing.T) {
	k32 := strings.Repeat("k", 32)
	ok := []struct {
		name, data string
		mode       os.FileMode
		wantLen    int
	}{
		{"exactly 32 bytes", k32, 0o600, 32},
		{"hex text with newline", strings.Repeat("ab", 32) + "\n", 0o600, 64},
		{"crlf trimmed", k32 + "\r\n", 0o400, 32},
		{"raw binary", "\x00\xff" + k32, 0o600, 34},
		{"only one newline trimmed", k32 + "\n\n", 0o600, 33},
	}
	for _, tc := range ok {
		p, err := LoadPepper(writeFile(t, "pepper", tc.data, tc.mode))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if len(p.key) != tc.wantLen {
			t.Errorf("%s: key of %d bytes, want %d", tc.name, len(p.key), tc.wantLen)
		}
	}

	bad := []struct {
		name, data string
		mode       os.FileMode
		wantErr    string
	}{
		{"too short", k32[:31], 0o600, "at least 32"},
		{"short after newline trim", k32[:31] + "\n", 0o600, "at least 32"},
		{"empty", "", 0o600, "at least 32"},
		{"world readable 0644", k32, 0o644, "group or others"},
		{"group readable 0640", k32, 0o640, "group or others"},
		{"other readable 0604", k32, 0o604, "group or others"},
		{"group writable 0620", k32, 0o620, "group or others"},
		{"too large", strings.Repeat("k", MaxPepperBytes+1), 0o600, "larger than"},
	}
	for _, tc := range bad {
		_, err := LoadPepper(writeFile(t, "pepper", tc.data, tc.mode))
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: LoadPepper = %v, want an error containing %q", tc.name, err, tc.wantErr)
		}
		if err != nil && len(tc.data) >= 8 && strings.Contains(err.Error(), tc.data[:8]) {
			t.Errorf("%s: error shows the pepper", tc.name)
		}
	}

	dir := t.TempDir()
	if _, err := LoadPepper(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := LoadPepper(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	target := writeFile(t, "real", k32, 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPepper(link); err != nil {
		t.Errorf("symlink to a 0600 regular file: %v", err)
	}
}

func TestGeneratePepperFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pepper")
	if err := GeneratePepperFile(p); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %#o, want 0600", st.Mode().Perm())
	}
	b, _ := os.ReadFile(p)
	if len(b) != 65 || b[64] != '\n' || strings.Trim(string(b[:64]), "0123456789abcdef") != "" {
		t.Fatalf("generated file is not 64 hex characters and a newline: %d bytes", len(b))
	}
	pep, err := LoadPepper(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(pep.key) != string(b[:64]) {
		t.Fatal("loaded key is not the file's text")
	}
	if err := GeneratePepperFile(p); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second GeneratePepperFile = %v, want a refusal", err)
	}
	if b2, _ := os.ReadFile(p); string(b2) != string(b) {
		t.Fatal("the existing pepper was changed")
	}
	q := filepath.Join(t.TempDir(), "other")
	if err := GeneratePepperFile(q); err != nil {
		t.Fatal(err)
	}
	if b2, _ := os.ReadFile(q); string(b2) == string(b) {
		t.Fatal("two generated peppers are equal")
	}
}

func TestPepperRedacted(t *testing.T) {
	p, err := NewPepper([]byte("super-secret-pepper-material-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(struct{ P Pepper }{p})
	for _, out := range []string{fmt.Sprintf("%v %+v %#v %s %x %q", p, p, p, p, p, p), p.String(), string(js)} {
		if strings.Contains(out, "super-secret") || strings.Contains(out, "7375706572") {
			t.Fatalf("pepper printed: %s", out)
		}
	}
	if _, err := NewPepper(make([]byte, 31)); err == nil {
		t.Fatal("NewPepper accepted 31 bytes")
	}
	if (Pepper{}).Valid() {
		t.Fatal("zero Pepper is valid")
	}
}

func TestPepperDeriveKey(t *testing.T) {
	p1, _ := NewPepper(bytes.Repeat([]byte{1}, 32))
	p2, _ := NewPepper(bytes.Repeat([]byte{2}, 32))
	a, b := p1.DeriveKey("audit-redaction/v1"), p1.DeriveKey("audit-redaction/v1")
	if len(a) != 32 || !bytes.Equal(a, b) {
		t.Fatalf("derived keys %x, %x: want one 32-byte key per pepper and purpose", a, b)
	}
	if bytes.Equal(a, p1.DeriveKey("other")) || bytes.Equal(a, p2.DeriveKey("audit-redaction/v1")) ||
		bytes.Equal(a, bytes.Repeat([]byte{1}, 32)) {
		t.Fatal("a derived key must depend on purpose and pepper and never be the pepper")
	}
}
