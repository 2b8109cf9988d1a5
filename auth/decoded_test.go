package auth

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// With a FileStore the Authenticator remembers decodings by the record's
// exact bytes: every change another process makes to the file (a
// revocation, a tampered or corrupt record, a record moved under another
// id) applies on the next request, and expiry is decided at each call.
func TestDecodedRecordsFollowTheFile(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "credentials")
	s, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Now()}
	a := newAuth(t, s, clk.now)
	if a.records == nil {
		t.Fatal("a FileStore's records are not decoded by the Authenticator")
	}
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), TTL: time.Hour})
	file := filepath.Join(dir, c.ID+".json")
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	write := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := func(what string, reason Reason) {
		t.Helper()
		for i := 0; i < 2; i++ { // the second call may be answered from a remembered decoding
			_, fail, err := a.AuthenticateDetail(ctx, bearer(key))
			if reason == ReasonNone && err != nil || reason != ReasonNone && (err != ErrInvalidCredential || fail.Reason != reason) {
				t.Fatalf("%s (call %d): %v %+v, want reason %q", what, i+1, err, fail, reason)
			}
		}
	}
	want("issued", ReasonNone)

	// Another process (the keys command) revokes it.
	other, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Revoke(ctx, other, c.ID); err != nil {
		t.Fatal(err)
	}
	want("revoked", ReasonRevoked)
	write(orig)
	want("restored", ReasonNone)

	// A record raised without the pepper.
	raised := c
	raised.Class = ClassAdministrator
	b, err := EncodeCredential(raised)
	if err != nil {
		t.Fatal(err)
	}
	write(b)
	want("tampered", ReasonTampered)
	write(append(append([]byte(nil), orig...), ' '))
	want("corrupt", ReasonCorrupt)
	// Another credential's exact record under this id.
	_, c2 := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	b2, err := os.ReadFile(filepath.Join(dir, c2.ID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	write(b2)
	want("moved", ReasonCorrupt)
	write(orig)
	want("restored again", ReasonNone)

	// Expiry is the clock's at each call, never the remembered one's.
	clk.t = clk.t.Add(2 * time.Hour)
	want("expired", ReasonExpired)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	want("deleted", ReasonUnknown)
}

func TestDecodedRecordsBounded(t *testing.T) {
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	for i := 0; i < maxDecodedRecords+10; i++ {
		x := c
		x.Label = "l" + time.Duration(i).String()
		b, err := EncodeCredential(x)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.records.decode(b); err != nil {
			t.Fatal(err)
		}
		if n := len(a.records.m); n > maxDecodedRecords {
			t.Fatalf("%d decodings remembered, bound %d", n, maxDecodedRecords)
		}
	}
	if _, err := a.Authenticate(context.Background(), bearer(key)); err != nil {
		t.Fatal(err)
	}
}

// With a FileStore, an unknown id still runs both comparisons, and the
// dummy record goes through the remembered decodings as a found one does.
func TestUnknownIDSamePathFileStore(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	key, _ := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	a := newAuth(t, s, nil)
	n := 0
	a.equal = func(x, y []byte) bool { n++; return len(x) == len(y) }
	id, secret, _ := ParseKey(key)
	unknownID, _ := NewCredentialID(time.Now())
	for _, k := range []string{key, FormatKey(unknownID, secret), FormatKey(id, secret)} {
		n = 0
		a.Authenticate(ctx, bearer(k))
		if n != 2 {
			t.Errorf("%d comparisons, want 2", n)
		}
	}
	if _, ok := a.records.m[string(a.dummyRecord)]; !ok {
		t.Error("the unknown-id path did not decode the dummy through the remembered decodings")
	}
}
