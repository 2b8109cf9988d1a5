// Package authtest is the conformance suite of auth.Store: every credential
// store implementation (bbolt, memory, a future Valkey adapter) runs
//
//	authtest.Run(t, func(t *testing.T) auth.Store { ... })
//
// and must pass it unchanged.
package authtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/auth"
)

// Run runs the suite; open returns a new, empty store for each subtest (the
// suite closes it).
func Run(t *testing.T, open func(t *testing.T) auth.Store) {
	pepper, err := auth.NewPepper([]byte("authtest-pepper-0123456789abcdef0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	scope, err := auth.ParseScope("tenant:*,program:program-a,target-namespace:*,target:*,actor:*")
	if err != nil {
		t.Fatal(err)
	}
	base := auth.IssueRequest{
		PrincipalID: "prn_conformance", Class: auth.ClassAPIClient,
		Capabilities: []auth.Capability{auth.CapLease, auth.CapRead}, Scope: scope, Label: "conformance",
	}
	issue := func(t *testing.T, s auth.Store, mod func(*auth.IssueRequest)) (string, auth.Credential) {
		t.Helper()
		req := base
		if mod != nil {
			mod(&req)
		}
		key, c, err := auth.Issue(context.Background(), s, pepper, req)
		if err != nil {
			t.Fatalf("Issue: %v", err)
		}
		return key, c
	}
	run := func(name string, fn func(t *testing.T, s auth.Store)) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			defer s.Close()
			fn(t, s)
		})
	}
	ctx := context.Background()

	run("CreateGet", func(t *testing.T, s auth.Store) {
		_, c := issue(t, s, func(r *auth.IssueRequest) { r.TTL = time.Hour })
		got, err := s.Get(ctx, c.ID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if got.String() != c.String() || got.Label != c.Label || !got.Scope.Equal(c.Scope) || !got.ExpiresAt.Equal(c.ExpiresAt) {
			t.Fatalf("Get = %v, want %v", got, c)
		}
		a, _ := auth.EncodeCredential(got)
		b, _ := auth.EncodeCredential(c)
		if string(a) != string(b) {
			t.Fatal("stored record differs from the issued one")
		}
	})
	run("CreateExisting", func(t *testing.T, s auth.Store) {
		_, c := issue(t, s, nil)
		if err := s.Create(ctx, c); !errors.Is(err, auth.ErrExists) {
			t.Fatalf("second Create = %v, want ErrExists", err)
		}
	})
	run("CreateInvalid", func(t *testing.T, s auth.Store) {
		if err := s.Create(ctx, auth.Credential{ID: "01ARZ3NDEKTSV4RRFFQ69G5FAV"}); err == nil {
			t.Fatal("Create of a credential without a verifier succeeded")
		}
		if _, err := s.Get(ctx, "01ARZ3NDEKTSV4RRFFQ69G5FAV"); !errors.Is(err, auth.ErrNotFound) {
			t.Fatalf("Get after refused Create = %v, want ErrNotFound", err)
		}
	})
	run("GetUnknown", func(t *testing.T, s auth.Store) {
		for _, id := range []string{"01ARZ3NDEKTSV4RRFFQ69G5FAV", "", "nope"} {
			if _, err := s.Get(ctx, id); !errors.Is(err, auth.ErrNotFound) {
				t.Fatalf("Get(%q) = %v, want ErrNotFound", id, err)
			}
		}
	})
	run("List", func(t *testing.T, s auth.Store) {
		if got, err := s.List(ctx, "", 0); err != nil || len(got) != 0 {
			t.Fatalf("List on empty store = %v, %v", got, err)
		}
		var ids []string
		for i := range 5 {
			_, c := issue(t, s, func(r *auth.IssueRequest) { r.Label = fmt.Sprint("k", i) })
			ids = append(ids, c.ID)
		}
		all, err := s.List(ctx, "", 0)
		if err != nil || len(all) != 5 {
			t.Fatalf("List = %d, %v; want 5", len(all), err)
		}
		for i := 1; i < len(all); i++ {
			if all[i-1].ID >= all[i].ID {
				t.Fatal("List is not in id order")
			}
		}
		slices.Sort(ids)
		for i, c := range all {
			if c.ID != ids[i] {
				t.Fatalf("List returned %s at %d; issued were %v", c.ID, i, ids)
			}
		}
		var paged []string
		after := ""
		for {
			page, err := s.List(ctx, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > 2 {
				t.Fatalf("page of %d > limit 2", len(page))
			}
			if len(page) == 0 {
				break
			}
			for _, c := range page {
				paged = append(paged, c.ID)
			}
			after = page[len(page)-1].ID
		}
		if len(paged) != 5 {
			t.Fatalf("paging saw %d credentials, want 5", len(paged))
		}
		for i, c := range all {
			if paged[i] != c.ID {
				t.Fatal("paging order differs from List order")
			}
		}
	})
	run("Revoke", func(t *testing.T, s auth.Store) {
		_, c := issue(t, s, nil)
		at := time.Date(2030, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
		r, err := s.Revoke(ctx, c.ID, at)
		if err != nil || !r.RevokedAt.Equal(at) || r.ReplacedBy != "" {
			t.Fatalf("Revoke = %v, %v", r, err)
		}
		r2, err := s.Revoke(ctx, c.ID, at.Add(time.Hour))
		if err != nil || !r2.RevokedAt.Equal(at) {
			t.Fatalf("second Revoke = %v, %v; want the first revocation kept", r2, err)
		}
		got, err := s.Get(ctx, c.ID)
		if err != nil || got.Status(time.Now()) != auth.StatusRevoked {
			t.Fatalf("Get after Revoke = %v, %v", got, err)
		}
		if _, err := s.Revoke(ctx, "01ARZ3NDEKTSV4RRFFQ69G5FAV", at); !errors.Is(err, auth.ErrNotFound) {
			t.Fatalf("Revoke unknown = %v, want ErrNotFound", err)
		}
	})
	run("Rotate", func(t *testing.T, s auth.Store) {
		_, old := issue(t, s, nil)
		_, next := issue(t, auth.NewMemoryStore(), nil)
		at := time.Now()
		r, err := s.Rotate(ctx, old.ID, at, next)
		if err != nil {
			t.Fatalf("Rotate: %v", err)
		}
		if r.RevokedAt.IsZero() || r.ReplacedBy != next.ID {
			t.Fatalf("rotated old = %v (replaced by %q)", r, r.ReplacedBy)
		}
		if got, err := s.Get(ctx, next.ID); err != nil || got.ID != next.ID {
			t.Fatalf("Get(next) = %v, %v", got, err)
		}
		_, other := issue(t, auth.NewMemoryStore(), nil)
		if _, err := s.Rotate(ctx, old.ID, at, other); !errors.Is(err, auth.ErrRevoked) {
			t.Fatalf("Rotate of a revoked credential = %v, want ErrRevoked", err)
		}
		if _, err := s.Get(ctx, other.ID); !errors.Is(err, auth.ErrNotFound) {
			t.Fatalf("refused Rotate stored its new credential: %v", err)
		}
		_, live := issue(t, s, nil)
		if _, err := s.Rotate(ctx, live.ID, at, next); !errors.Is(err, auth.ErrExists) {
			t.Fatalf("Rotate onto an existing id = %v, want ErrExists", err)
		}
		if got, _ := s.Get(ctx, live.ID); !got.RevokedAt.IsZero() {
			t.Fatal("refused Rotate revoked the old credential")
		}
		if _, err := s.Rotate(ctx, "01ARZ3NDEKTSV4RRFFQ69G5FAV", at, other); !errors.Is(err, auth.ErrNotFound) {
			t.Fatalf("Rotate unknown = %v, want ErrNotFound", err)
		}
	})
	run("RotateRace", func(t *testing.T, s auth.Store) {
		_, old := issue(t, s, nil)
		const n = 8
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range n {
			_, next := issue(t, auth.NewMemoryStore(), nil)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.Rotate(ctx, old.ID, time.Now(), next); err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				} else if !errors.Is(err, auth.ErrRevoked) {
					t.Errorf("concurrent Rotate: %v", err)
				}
			}()
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("%d concurrent rotations of one credential succeeded, want exactly 1", wins)
		}
		all, _ := s.List(ctx, "", 0)
		if len(all) != 2 {
			t.Fatalf("store holds %d credentials after the race, want 2", len(all))
		}
	})
	run("NoCache", func(t *testing.T, s auth.Store) {
		a, err := auth.NewAuthenticator(s, pepper, nil)
		if err != nil {
			t.Fatal(err)
		}
		key, c := issue(t, s, nil)
		h := []string{"Bearer " + key}
		if _, err := a.Authenticate(ctx, h); err != nil {
			t.Fatalf("Authenticate: %v", err)
		}
		if _, err := s.Revoke(ctx, c.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Authenticate(ctx, h); err != auth.ErrInvalidCredential {
			t.Fatalf("Authenticate after Revoke = %v, want ErrInvalidCredential", err)
		}
	})
	t.Run("Closed", func(t *testing.T) {
		s := open(t)
		_, c := issue(t, s, nil)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, c.ID); !errors.Is(err, auth.ErrUnavailable) {
			t.Fatalf("Get after Close = %v, want ErrUnavailable", err)
		}
		if _, err := s.List(ctx, "", 0); !errors.Is(err, auth.ErrUnavailable) {
			t.Fatalf("List after Close = %v, want ErrUnavailable", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}
