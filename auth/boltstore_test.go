package auth

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// The credential file never holds a secret or a key: only salts and
// verifiers.
func TestBoltFileHoldsNoSecret(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "credentials.db")
	s, err := OpenBoltStore(path)
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
	st, _ := os.Stat(path)
	if st.Mode().Perm()&0o077 != 0 {
		t.Errorf("credential file mode %#o", st.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
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
	s2, err := OpenBoltStore(path)
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

func TestBoltStoreOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "credentials.db")
	s, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenBoltStore(path); !errors.Is(err, ErrStoreLocked) {
		t.Fatalf("second open = %v, want ErrStoreLocked", err)
	}
	s.Close()

	// A file of another schema is refused.
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketCredMeta).Put(keyCredSchema, []byte("2")) })
	db.Close()
	if _, err := OpenBoltStore(path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("other schema = %v, want ErrCorrupt", err)
	}

	// A corrupt record is ErrCorrupt, never a credential.
	path2 := filepath.Join(dir, "c2.db")
	s2, err := OpenBoltStore(path2)
	if err != nil {
		t.Fatal(err)
	}
	key, c := issueT(t, s2, IssueRequest{Scope: mustScope(t, everything)})
	s2.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketCredentials)
		v := append([]byte(nil), b.Get([]byte(c.ID))...)
		return b.Put([]byte(c.ID), bytes.Replace(v, []byte(`"api_client"`), []byte(`"administrator"`), 1))
	})
	// The record still decodes (the store has no pepper) but no longer
	// authenticates.
	if _, err := s2.Get(context.Background(), c.ID); err != nil {
		t.Fatalf("Get of an edited record: %v", err)
	}
	if _, fail, err := newAuth(t, s2, nil).AuthenticateDetail(context.Background(), bearer(key)); err != ErrInvalidCredential || fail.Reason != ReasonTampered {
		t.Fatalf("edited record: %v %+v", err, fail)
	}
	// Bytes that fail strict decoding are ErrCorrupt.
	s2.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketCredentials).Put([]byte(c.ID), []byte(`{"record_version":1}`))
	})
	if _, err := s2.Get(context.Background(), c.ID); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get of a corrupt record = %v, want ErrCorrupt", err)
	}
	if _, err := s2.List(context.Background(), "", 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("List over a corrupt record = %v, want ErrCorrupt", err)
	}
	s2.Close()

	if _, err := OpenBoltStore(filepath.Join(dir, "missing-dir", "c.db")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("open in a missing directory = %v", err)
	}
}
