package auth

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// readSmallFile returns what os.ReadFile returns, at every size around its
// buffer's growth points, whatever buffer it starts from.
func TestReadSmallFileReadsTheWholeFile(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, 511, 512, 513, 2047, 2048, 2049, 4096, 10_000, maxCredentialFile - 1} {
		p := filepath.Join(dir, "f")
		want := bytes.Repeat([]byte{'a', 'b', 'c', '\n', 0}, n/5+1)[:n]
		if err := os.WriteFile(p, want, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, start := range [][]byte{nil, make([]byte, 0, 2<<10), make([]byte, 7, 9)} {
			got, err := readSmallFile(p, start[:0])
			if err != nil {
				t.Fatalf("%d bytes from a buffer of %d: %v", n, cap(start), err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes from a buffer of %d: read %d bytes, not the file's", n, cap(start), len(got))
			}
		}
	}
}

func TestReadSmallFileFailsClosed(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	for _, n := range []int{maxCredentialFile, maxCredentialFile + 1, 1 << 20} {
		if err := os.WriteFile(big, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, start := range [][]byte{nil, make([]byte, 0, 2<<10), make([]byte, 0, 3000)} {
			if _, err := readSmallFile(big, start); !errors.Is(err, errCredentialFileTooLarge) {
				t.Fatalf("%d bytes from a buffer of %d: %v, want errCredentialFileTooLarge", n, cap(start), err)
			}
		}
	}
	if _, err := readSmallFile(filepath.Join(dir, "missing"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v, want os.ErrNotExist", err)
	}
	// A directory opens but does not read: an error, and not "not found".
	_, err := readSmallFile(dir, nil)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a directory: %v, want a read error", err)
	}
}

// A credential file that is not what the store writes — too large, or a
// directory in its place — is an unavailable store, never "not found" (an
// unknown key) nor a credential; and the buffers Get reads into are its
// own per call: concurrent Gets of different credentials each decode
// their own.
func TestFileStoreGetReadsOwnBuffers(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	var creds []Credential
	for range 12 {
		_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
		creds = append(creds, c)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				want := creds[(g+i)%len(creds)]
				got, err := s.Get(ctx, want.ID)
				if err != nil {
					errs <- err
					return
				}
				if got.ID != want.ID || !bytes.Equal(got.verifier, want.verifier) || !bytes.Equal(got.salt, want.salt) || !bytes.Equal(got.mac, want.mac) {
					errs <- errors.New("Get returned another credential's fields")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	big, dir := creds[0], creds[1]
	if err := os.WriteFile(filepath.Join(s.dir, big.ID+".json"), make([]byte, maxCredentialFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(s.dir, dir.ID+".json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(s.dir, dir.ID+".json"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{big.ID, dir.ID} {
		if _, err := s.Get(ctx, id); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Get of a file the store did not write: %v, want ErrUnavailable", err)
		}
	}
	// The large read left nothing behind for the next one.
	got, err := s.Get(ctx, creds[2].ID)
	if err != nil || got.ID != creds[2].ID {
		t.Fatalf("Get after a refused read: %v, %q", err, got.ID)
	}
}

// BenchmarkFileStoreGet is the credential read every authenticated request
// makes (the store keeps no cache).
func BenchmarkFileStoreGet(b *testing.B) {
	s := openFileStore(b)
	_, c := issueT(b, s, IssueRequest{Scope: mustScope(b, everything)})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Get(context.Background(), c.ID); err != nil {
			b.Fatal(err)
		}
	}
}
