package syncdir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A directory syncs; a missing one is an error, not a silent success.
func TestSync(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Sync(dir); err != nil {
		t.Fatalf("sync of a directory: %v", err)
	}
	if err := Sync(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("sync of a missing directory: %v, want ErrNotExist", err)
	}
}
