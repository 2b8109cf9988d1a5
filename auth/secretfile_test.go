package auth

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// ReadSecretFile is the one definition of a secret file's checks: the
// pepper, the API key file and the AMQP URL file all read through it.
func TestReadSecretFile(t *testing.T) {
	secret := "star_sk_v1_s3cret"
	for _, tc := range []struct {
		name, data string
		mode       os.FileMode
		want       string
	}{
		{"0600", secret + "\n", 0o600, secret},
		{"0400 crlf", secret + "\r\n", 0o400, secret},
		{"one newline only", secret + "\n\n", 0o600, secret + "\n"},
		{"exactly max", strings.Repeat("k", 32), 0o600, strings.Repeat("k", 32)},
	} {
		b, err := ReadSecretFile(writeFile(t, "f", tc.data, tc.mode), "test file", 32)
		if err != nil || string(b) != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, b, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name, data string
		mode       os.FileMode
		want       string
	}{
		{"group readable", secret, 0o640, "test file permissions 0640 allow access by group or others"},
		{"world readable", secret, 0o604, "group or others"},
		{"group writable", secret, 0o620, "group or others"},
		{"too large", strings.Repeat("s3cret", 6), 0o600, "test file is larger than 32 bytes"},
	} {
		_, err := ReadSecretFile(writeFile(t, "f", tc.data, tc.mode), "test file", 32)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the content: %v", tc.name, err)
		}
	}
	dir := t.TempDir()
	if _, err := ReadSecretFile(filepath.Join(dir, "missing"), "test file", 32); !errors.Is(err, fs.ErrNotExist) ||
		err.Error() != "test file does not exist: file does not exist" {
		t.Errorf("missing: %v", err)
	}
	if _, err := ReadSecretFile(dir, "test file", 32); err == nil || err.Error() != "test file is not a regular file" {
		t.Errorf("directory: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err == nil {
		// Refused before opening: opening a FIFO would block.
		if _, err := ReadSecretFile(fifo, "test file", 32); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("fifo: %v", err)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(writeFile(t, "real", secret, 0o600), link); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadSecretFile(link, "test file", 32); err != nil || string(b) != secret {
		t.Errorf("symlink to a 0600 file: %q, %v", b, err)
	}
}
