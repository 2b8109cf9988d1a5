package auth

// Review s29: attacks on auth.Decodes (the per-id memo of decoded
// credential records) as the file store and the Authenticator use it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// outcome is what one authentication says, compared across authenticators.
type s29Outcome struct {
	ok     bool
	reason Reason
	prn    string
}

func s29Auth(a *Authenticator, key string) s29Outcome {
	p, f, err := a.AuthenticateDetail(context.Background(), bearer(key))
	return s29Outcome{ok: err == nil, reason: f.Reason, prn: p.ID}
}

// Every same-length one-byte edit of a record (in place, by "another
// process") must be judged exactly as a store with an empty memo judges
// it, both on the first request after the edit and on the second (the
// memo's). And putting the original back must authenticate again.
func TestReviewS29SameLengthEditsJudgedAsFreshDecode(t *testing.T) {
	s := openFileStore(t)
	clk := &clock{t: time.Now().UTC()}
	warm := newAuth(t, s, clk.now)
	scope, err := ParseScope("tenant:acme,program:program-a,actor:*")
	if err != nil {
		t.Fatal(err)
	}
	key, c := issueT(t, s, IssueRequest{TTL: time.Hour, Scope: scope, Label: "lbl",
		Capabilities: []Capability{CapLease, CapRead}})
	path := filepath.Join(s.dir, c.ID+".json")
	orig := mustRead(t, path)
	// The label is an operator note outside the authority MAC (29bf262
	// too): edits inside it are accepted by any store; all others refused.
	labelAt := bytes.Index(orig, []byte(`"label":"lbl"`)) + len(`"label":"`)
	if o := s29Auth(warm, key); !o.ok {
		t.Fatalf("fresh key refused: %+v", o)
	}
	accepted := 0
	for i := 0; i < len(orig); i++ {
		for _, delta := range []byte{1, 0x20} {
			ed := bytes.Clone(orig)
			ed[i] ^= delta
			if err := os.WriteFile(path, ed, 0o600); err != nil {
				t.Fatal(err)
			}
			fresh, err := OpenFileStore(s.dir) // empty memo: the uncached judgement
			if err != nil {
				t.Fatal(err)
			}
			want := s29Auth(newAuth(t, fresh, clk.now), key)
			for round := 0; round < 2; round++ {
				if got := s29Auth(warm, key); got != want {
					t.Fatalf("byte %d ^%#x round %d: memo store says %+v, fresh store %+v", i, delta, round, got, want)
				}
			}
			if want.ok && !(i >= labelAt && i < labelAt+len("lbl")) {
				accepted++
				t.Logf("accepted edit at byte %d ^%#x: %q -> %q", i, delta, orig[max(0, i-20):min(len(orig), i+10)], ed[max(0, i-20):min(len(ed), i+10)])
			}
		}
	}
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if o := s29Auth(warm, key); !o.ok {
		t.Fatalf("original put back refused: %+v", o)
	}
	if accepted != 0 {
		t.Fatalf("%d one-byte edits outside the label were accepted (by the fresh store too)", accepted)
	}
}

// Requests racing a revocation made by a second store on the same
// directory (the keys command): every request that starts after Revoke
// returned is refused; and a rotation likewise.
func TestReviewS29RevocationRacingConcurrentRequests(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{"revoke", "rotate"} {
		t.Run(mode, func(t *testing.T) {
			s := openFileStore(t)
			a := newAuth(t, s, nil)
			key, c := issueT(t, s, IssueRequest{})
			other, err := OpenFileStore(s.dir)
			if err != nil {
				t.Fatal(err)
			}
			var done atomic.Bool
			var after atomic.Bool
			var okBefore, lateOK, lateRefused atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !done.Load() {
						started := after.Load()
						_, f, err := a.AuthenticateDetail(ctx, bearer(key))
						switch {
						case started && err == nil:
							lateOK.Add(1)
						case started:
							if f.Reason != ReasonRevoked {
								t.Errorf("late request refused for %q, want revoked", f.Reason)
							}
							lateRefused.Add(1)
						case err == nil:
							okBefore.Add(1)
						}
					}
				}()
			}
			time.Sleep(30 * time.Millisecond)
			if mode == "revoke" {
				_, err = Revoke(ctx, other, c.ID)
			} else {
				_, _, err = Rotate(ctx, other, testPepper, c.ID)
			}
			if err != nil {
				t.Fatal(err)
			}
			after.Store(true)
			time.Sleep(30 * time.Millisecond)
			done.Store(true)
			wg.Wait()
			if okBefore.Load() == 0 || lateRefused.Load() == 0 {
				t.Fatalf("race not exercised: %d accepted before, %d refused after", okBefore.Load(), lateRefused.Load())
			}
			if n := lateOK.Load(); n != 0 {
				t.Fatalf("%d requests that started after the %s returned were accepted", n, mode)
			}
		})
	}
}

// A caller changing what it got (Credential from Get, Principal from
// Authenticate, the slices Scope hands out) changes nothing another caller
// or a later request sees, also when done concurrently (run with -race).
func TestReviewS29CallersCannotAliasTheMemo(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	scope, err := ParseScope("tenant:acme,program:program-a,actor:worker-1")
	if err != nil {
		t.Fatal(err)
	}
	key, c := issueT(t, s, IssueRequest{Capabilities: []Capability{CapLease, CapRead}, Scope: scope})
	want, err := s.Get(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantText := fmt.Sprintf("%+v", want)
	wantP, err := a.Authenticate(ctx, bearer(key))
	if err != nil {
		t.Fatal(err)
	}
	wantPText := fmt.Sprintf("%+v", wantP)

	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				got, err := s.Get(ctx, c.ID)
				if err != nil {
					t.Error(err)
					return
				}
				if txt := fmt.Sprintf("%+v", got); txt != wantText {
					t.Errorf("Get saw another caller's change:\n got %s\nwant %s", txt, wantText)
					return
				}
				got.Capabilities[0] = CapForceRelease
				got.Capabilities = append(got.Capabilities[:1], CapForceRelease)
				for d := range got.Scope.grants {
					for j := range got.Scope.grants[d] {
						got.Scope.grants[d][j] = "*"
					}
				}
				got.salt[0] ^= 0xff
				got.verifier[0] ^= 0xff
				got.mac[0] ^= 0xff

				p, err := a.Authenticate(ctx, bearer(key))
				if err != nil {
					t.Errorf("authenticate after a caller's change: %v", err)
					return
				}
				if txt := fmt.Sprintf("%+v", p); txt != wantPText {
					t.Errorf("Principal saw another caller's change:\n got %s\nwant %s", txt, wantPText)
					return
				}
				p.Capabilities[0] = CapForceRelease
				for d := range p.Scope.grants {
					for j := range p.Scope.grants[d] {
						p.Scope.grants[d][j] = "*"
					}
				}
				if v := p.Scope.Values(DimActor); len(v) > 0 {
					v[0] = "*"
				}
			}
		}()
	}
	wg.Wait()
	if p, err := a.Authenticate(ctx, bearer(key)); err != nil || p.Has(CapForceRelease) ||
		!slices.Equal(p.Scope.Values(DimActor), []string{"worker-1"}) {
		t.Fatalf("after the callers' changes: %+v %v", p, err)
	}
}

// The memo keeps its own bytes: a caller that reuses the buffer it passed
// (as a client reusing its read buffer would) cannot make the memo match
// bytes it never decoded.
func TestReviewS29MemoDoesNotAliasCallersBuffer(t *testing.T) {
	s := openFileStore(t)
	key, c := issueT(t, s, IssueRequest{})
	_ = key
	path := filepath.Join(s.dir, c.ID+".json")
	good := mustRead(t, path)
	other, err := OpenFileStore(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Revoke(context.Background(), c.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	revoked := mustRead(t, path)

	var d Decodes
	buf := make([]byte, len(revoked)+64)
	n := copy(buf, good)
	if got, err := d.Decode(c.ID, buf[:n]); err != nil || !got.RevokedAt.IsZero() {
		t.Fatalf("good record: %+v %v", got, err)
	}
	// Reuse the same backing array for the revoked record.
	n = copy(buf, revoked)
	got, err := d.Decode(c.ID, buf[:n])
	if err != nil || got.RevokedAt.IsZero() {
		t.Fatalf("revoked record in a reused buffer decoded as not revoked (%v): the memo aliases the caller's buffer", err)
	}
	// And back: the memo now holds the revoked bytes; good bytes decode good.
	n = copy(buf, good)
	if got, err := d.Decode(c.ID, buf[:n]); err != nil || !got.RevokedAt.IsZero() {
		t.Fatalf("good record again: %+v %v", got, err)
	}
}

// An attacker without a key cannot put anything in the memo: unknown ids,
// malformed keys, a corrupt record, a record stored under another id. It
// holds only ids whose records decoded (and the Authenticator's dummy its
// own one entry).
func TestReviewS29AttackerCannotFillTheMemo(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	_, c := issueT(t, s, IssueRequest{})
	raw := mustRead(t, filepath.Join(s.dir, c.ID+".json"))
	for i := 0; i < 5000; i++ {
		id := fmt.Sprintf("01HZZZZZZZZZZZZZZZ%08d", i)
		k := "star_sk_v1_" + id + "_" + strings.Repeat("a", 64)
		if _, err := a.Authenticate(ctx, bearer(k)); err != ErrInvalidCredential {
			t.Fatalf("unknown id %s: %v", id, err)
		}
	}
	// A corrupt record and one under the wrong id, requested many times.
	bad := "01HZZZZZZZZZZZZZZZZZZZZZZA"
	if err := os.WriteFile(filepath.Join(s.dir, bad+".json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	bad2 := "01HZZZZZZZZZZZZZZZZZZZZZZB"
	if err := os.WriteFile(filepath.Join(s.dir, bad2+".json"), raw[:len(raw)-1], 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		for _, id := range []string{bad, bad2} {
			if _, err := s.Get(ctx, id); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: %v", id, err)
			}
		}
	}
	s.decodes.mu.Lock()
	n := len(s.decodes.last)
	s.decodes.mu.Unlock()
	a.dummyDecodes.mu.Lock()
	nd := len(a.dummyDecodes.last)
	a.dummyDecodes.mu.Unlock()
	if n != 0 || nd != 1 {
		t.Fatalf("memo holds %d store entries and %d dummy entries after attacks, want 0 and 1", n, nd)
	}
}

// The memo's memory bound: 4096 ids, but a record's size is bounded only by
// its scope text (MaxScopeText, 16 KiB), not the "about 1 KB per id" the
// comment says. Measure the largest record Issue accepts; report the worst
// case the memo can pin (raw bytes plus decoded strings).
func TestReviewS29MemoWorstCaseMemory(t *testing.T) {
	s := openFileStore(t)
	var parts []string
	for i := 0; i < 62; i++ { // at most 64 grants
		next := append(slices.Clone(parts), fmt.Sprintf("target:t%05d-%s", i, strings.Repeat("x", 240)))
		if len(strings.Join(append([]string{"tenant:acme", "program:program-a"}, next...), ",")) > MaxScopeText {
			break
		}
		parts = next
	}
	scope, err := ParseScope(strings.Join(append([]string{"tenant:acme", "program:program-a"}, parts...), ","))
	if err != nil {
		t.Fatal(err)
	}
	_, c := issueT(t, s, IssueRequest{Scope: scope, Label: strings.Repeat("l", MaxLabelBytes)})
	raw := mustRead(t, filepath.Join(s.dir, c.ID+".json"))
	perID := 2 * len(raw) // raw copy + decoded strings (lower bound)
	worst := maxDecodes * perID
	t.Logf("largest record %d bytes; worst case pinned by one Decodes ~ %d MiB (4096 ids), per store", len(raw), worst>>20)
	if len(raw) <= 1024 {
		t.Fatalf("expected records can exceed 1 KB, got %d", len(raw))
	}
}
