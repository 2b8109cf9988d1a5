package auth

import (
	"bytes"
	"context"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The credential store never holds a secret or a key: only salts and
// verifiers.
func TestFileStoreHoldsNoSecret(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "credentials")
	s, err := OpenFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var creds []Credential
	for i := range 5 {
		req := IssueRequest{Scope: mustScope(t, everything), TTL: time.Duration(i) * time.Hour}
		key, c := issueT(t, s, req)
		keys, creds = append(keys, key), append(creds, c)
	}
	k2, c2, err := Rotate(ctx, s, testPepper, creds[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	keys, creds = append(keys, k2), append(creds, c2)
	if _, err := Revoke(ctx, s, creds[1].ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Every file of the store, concatenated, is what is searched; none is
	// readable by others.
	var raw []byte
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s mode %#o", p, st.Mode().Perm())
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			raw = append(raw, b...)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range keys {
		_, secret, err := ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		for _, needle := range [][]byte{[]byte(key), []byte(key[len(key)-64:]), secret[:], secret[:8], []byte(hex.EncodeToString(secret[:8]))} {
			if bytes.Contains(raw, needle) {
				t.Fatalf("key %d: the credential file contains secret material", i)
			}
		}
		// Sanity: the file does hold the record (id and verifier), so the
		// search above looked at the right bytes.
		if !bytes.Contains(raw, []byte(creds[i].ID)) || !bytes.Contains(raw, []byte(hex.EncodeToString(creds[i].verifier))) {
			t.Fatalf("key %d: record not found in the file", i)
		}
	}
	if bytes.Contains(raw, testPepper.key) {
		t.Fatal("the credential file contains the pepper")
	}

	// Reopen: everything still authenticates as before.
	s2, err := OpenFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	a := newAuth(t, s2, nil)
	for i, key := range keys {
		_, err := a.Authenticate(ctx, bearer(key))
		if wantOK := i != 0 && i != 1; (err == nil) != wantOK {
			t.Errorf("key %d after reopen: %v", i, err)
		}
	}
}
