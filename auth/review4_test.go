package auth

// Review 4 (HTTP perf branch) attacks on the Authenticator's memo of decoded
// FileStore records (decodedRecords). The memo is keyed by a record's exact
// bytes; these tests try to get a stale or foreign decision out of it, to
// flood it, and to tell known from unknown credential ids through it.

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// review4File returns the path of credential id's record in the FileStore at dir.
func review4File(dir, id string) string { return filepath.Join(dir, id+".json") }

func review4Store(t *testing.T) (*FileStore, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "credentials")
	s, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// HELD. No decision is remembered: a revoked, rotated or expired key fails
// on the very next call although every record it flips between was
// remembered before, and restoring the old bytes is the old answer again
// (memo hit), in both directions, many times over.
func TestReview4MemoNeverRemembersADecision(t *testing.T) {
	ctx := context.Background()
	s, dir := review4Store(t)
	clk := &clock{t: time.Now()}
	a := newAuth(t, s, clk.now)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), TTL: time.Hour})
	file := review4File(dir, c.ID)
	active, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Revoke(ctx, s, c.ID); err != nil {
		t.Fatal(err)
	}
	revoked, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, want Reason) {
		t.Helper()
		_, fail, err := a.AuthenticateDetail(ctx, bearer(key))
		if want == ReasonNone && err != nil || want != ReasonNone && fail.Reason != want {
			t.Fatalf("%s: %v %+v, want %q", what, err, fail, want)
		}
	}
	for i := 0; i < 5; i++ { // both versions are remembered after the first round
		if err := os.WriteFile(file, active, 0o600); err != nil {
			t.Fatal(err)
		}
		check("active", ReasonNone)
		check("active again", ReasonNone)
		if err := os.WriteFile(file, revoked, 0o600); err != nil {
			t.Fatal(err)
		}
		check("revoked", ReasonRevoked)
		check("revoked again", ReasonRevoked)
	}
	if _, ok := a.records.m[string(active)]; !ok {
		t.Fatal("the active record is not remembered: the test exercises no memo hit")
	}

	// Expiry at the exact boundary, the record remembered.
	if err := os.WriteFile(file, active, 0o600); err != nil {
		t.Fatal(err)
	}
	c2, err := DecodeCredential(active)
	if err != nil {
		t.Fatal(err)
	}
	clk.t = c2.ExpiresAt.Add(-time.Millisecond)
	check("1 ms before expiry", ReasonNone)
	clk.t = c2.ExpiresAt
	check("at expiry", ReasonExpired)
	clk.t = c2.ExpiresAt.Add(-time.Millisecond)
	check("clock back before expiry", ReasonNone)

	// Rotation: the old key fails at once, the new one works, the old one
	// keeps failing after the new one's record is remembered.
	clk.t = time.Now()
	newKey, _, err := Rotate(ctx, s, testPepper, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	check("rotated away", ReasonRevoked)
	if _, err := a.Authenticate(ctx, bearer(newKey)); err != nil {
		t.Fatalf("successor key: %v", err)
	}
	check("rotated away, after the successor was used", ReasonRevoked)
}

// HELD. A record copied byte for byte under another id's file name decodes
// (and is remembered) as the credential it names, not the file's: neither
// key authenticates through it, whichever was remembered first.
func TestReview4MemoRecordCopiedUnderAnotherID(t *testing.T) {
	ctx := context.Background()
	s, dir := review4Store(t)
	a := newAuth(t, s, nil)
	victimKey, victim := issueT(t, s, IssueRequest{Scope: mustScope(t, "tenant:a"), PrincipalID: "prn_victim"})
	adminKey, admin := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), PrincipalID: "prn_admin",
		Class: ClassAdministrator, Capabilities: []Capability{CapLease, CapForceRelease}})
	// Remember the admin's record first, through its own key.
	if p, err := a.Authenticate(ctx, bearer(adminKey)); err != nil || p.ID != "prn_admin" {
		t.Fatalf("admin: %+v %v", p, err)
	}
	adminRec, err := os.ReadFile(review4File(dir, admin.ID))
	if err != nil {
		t.Fatal(err)
	}
	// The admin's exact record under the victim's id (a memo hit).
	if err := os.WriteFile(review4File(dir, victim.ID), adminRec, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{victimKey, FormatKey(victim.ID, mustSecret(t, adminKey))} {
		p, fail, err := a.AuthenticateDetail(ctx, bearer(k))
		if err == nil || fail.Reason != ReasonCorrupt {
			t.Fatalf("admin record under the victim's id: %+v %+v %v, want corrupt", p, fail, err)
		}
	}
}

func mustSecret(t *testing.T, key string) Secret {
	t.Helper()
	_, s, err := ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// HELD. Nothing an unauthenticated caller sends enters the memo: unknown
// ids (only the dummy's one record), malformed keys, wrong secrets for a
// known id (its one record) and corrupt records (never remembered).
func TestReview4MemoCannotBeFlooded(t *testing.T) {
	ctx := context.Background()
	s, dir := review4Store(t)
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	secret := mustSecret(t, key)
	for i := 0; i < 3000; i++ {
		id, err := NewCredentialID(time.Now().Add(time.Duration(i) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		a.Authenticate(ctx, bearer(FormatKey(id, secret)))
		a.Authenticate(ctx, []string{"Bearer star_sk_v1_" + id + "_zz"})
	}
	if n := len(a.records.m); n != 1 {
		t.Fatalf("%d records remembered after 6000 unknown or malformed keys, want 1 (the dummy)", n)
	}
	var wrong Secret
	for i := 0; i < 100; i++ {
		wrong[0] = byte(i)
		a.Authenticate(ctx, bearer(FormatKey(c.ID, wrong)))
	}
	if n := len(a.records.m); n != 2 {
		t.Fatalf("%d records remembered, want 2", n)
	}
	// Corrupt variants of the record are decoded every time, never kept.
	orig, err := os.ReadFile(review4File(dir, c.ID))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		b := append(append([]byte(nil), orig...), []byte(" ")[0])
		for j := 0; j < i; j++ {
			b = append(b, ' ')
		}
		os.WriteFile(review4File(dir, c.ID), b, 0o600)
		if _, fail, _ := a.AuthenticateDetail(ctx, bearer(key)); fail.Reason != ReasonCorrupt {
			t.Fatalf("corrupt record: %+v", fail)
		}
	}
	if n := len(a.records.m); n != 2 {
		t.Fatalf("%d records remembered after corrupt ones, want 2", n)
	}
}

// HELD. What the Authenticator hands out cannot change the remembered
// decoding: a caller that scribbles over the principal's capabilities does
// not raise or break the next authentication with the same record.
func TestReview4MemoNotAliasedByPrincipal(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	key, _ := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	p, err := a.Authenticate(ctx, bearer(key))
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Capabilities {
		p.Capabilities[i] = CapForceRelease
	}
	p.Capabilities = append(p.Capabilities, CapForceRelease)
	q, err := a.Authenticate(ctx, bearer(key))
	if err != nil {
		t.Fatalf("after mutating a principal: %v", err)
	}
	if q.Has(CapForceRelease) || len(q.Capabilities) != 1 || q.Capabilities[0] != CapLease {
		t.Fatalf("remembered decoding changed through a principal: %v", q.Capabilities)
	}
}

// HELD (run with -race). Concurrent authentications while another process
// flips the record between active and revoked and the memo is cleared at
// its bound: no data race, and once the record stays revoked every call
// fails.
func TestReview4MemoConcurrentFlipAndClear(t *testing.T) {
	ctx := context.Background()
	s, dir := review4Store(t)
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	file := review4File(dir, c.ID)
	active, _ := os.ReadFile(file)
	if _, err := Revoke(ctx, s, c.ID); err != nil {
		t.Fatal(err)
	}
	revoked, _ := os.ReadFile(file)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				a.Authenticate(ctx, bearer(key))
			}
		}()
	}
	// Fill the memo past its bound meanwhile, so it is cleared under load.
	x := c
	for i := 0; i < maxDecodedRecords+50; i++ {
		x.Label = "l" + time.Duration(i).String()
		b, err := EncodeCredential(x)
		if err != nil {
			t.Fatal(err)
		}
		a.records.decode(b)
		if i%200 == 0 {
			rec := active
			if i%400 == 0 {
				rec = revoked
			}
			tmp := file + ".tmp"
			os.WriteFile(tmp, rec, 0o600)
			os.Rename(tmp, file)
		}
	}
	tmp := file + ".tmp"
	os.WriteFile(tmp, revoked, 0o600)
	os.Rename(tmp, file)
	stop.Store(true)
	wg.Wait()
	for i := 0; i < 3; i++ {
		if _, fail, err := a.AuthenticateDetail(ctx, bearer(key)); err == nil || fail.Reason != ReasonRevoked {
			t.Fatalf("revoked record at rest: %+v %v", fail, err)
		}
	}
}

// BROKEN (timing). The commit says found and unknown ids cost alike
// because the unknown-id path decodes its dummy through the same memo. It
// does on a warm memo, but the dummy is remembered after the first unknown
// id and then always hits, while a known id misses — a full decode and
// re-encode, about 30–40 µs on this machine against a map hit — on its
// first call after start-up, after each change of its record (revoke,
// rotate, label) and after each clearing of the memo. So one probe with a
// wrong secret tells a known id from an unknown one by a decode's cost,
// and repeated probes of a known id tell when its record was last
// rewritten (the first probe after a revocation is slow again). Before
// the memo both paths did a full decode on every call.
//
// Observed here without a clock: the cold known id adds a memo entry (a
// miss: DecodeCredential ran) where an unknown id never does. Measured
// (not asserted) medians over 300 ids: unknown ≈ 11–18 µs, known warm ≈
// 20–27 µs, known cold ≈ 58–65 µs; before 7afa840: unknown ≈ 28–44 µs,
// known ≈ 48–60 µs.
func TestReview4ColdKnownIDCostsADecodeUnknownNever(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	var wrong Secret
	unknown, _ := NewCredentialID(time.Now())
	a.Authenticate(ctx, bearer(FormatKey(unknown, wrong))) // the dummy is now remembered
	misses := func(k string) int {
		before := len(a.records.m)
		a.Authenticate(ctx, bearer(k))
		return len(a.records.m) - before
	}
	other, _ := NewCredentialID(time.Now().Add(time.Second))
	mu := misses(FormatKey(other, wrong))
	mk := misses(FormatKey(c.ID, wrong))
	if mu != mk {
		t.Errorf("first probe: an unknown id costs %d decodes, a known id %d: a wrong-secret probe tells them apart by a decode's time", mu, mk)
	}
	// And a known id's record changing is visible to a prober holding no key.
	if mk2 := misses(FormatKey(c.ID, wrong)); mk2 != 0 {
		t.Fatalf("second probe of a known id missed too (%d)", mk2)
	}
	if _, err := Revoke(ctx, s, c.ID); err != nil {
		t.Fatal(err)
	}
	if mk3 := misses(FormatKey(c.ID, wrong)); mk3 != misses(FormatKey(other, wrong)) {
		t.Errorf("after a revocation the next wrong-secret probe costs %d decodes against an unknown id's 0: the prober learns the record changed", mk3)
	}
}
