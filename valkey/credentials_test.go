package valkey

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/auth/authtest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease/leasetest"
)

var credPepper = func() auth.Pepper {
	p, err := auth.NewPepper([]byte("valkey-credential-test-pepper-0123456789"))
	if err != nil {
		panic(err)
	}
	return p
}()

func credScope(t testing.TB) auth.Scope {
	t.Helper()
	sc, err := auth.ParseScope("tenant:*,program:*")
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func issue(t testing.TB, s auth.Store) (string, auth.Credential) {
	t.Helper()
	key, c, err := auth.Issue(bg, s, credPepper, auth.IssueRequest{PrincipalID: "prn_cred_test", Class: auth.ClassAPIClient,
		Capabilities: []auth.Capability{auth.CapLease}, Scope: credScope(t), Label: "test"})
	if err != nil {
		t.Fatalf("issue: %v", err)
	}
	return key, c
}

// TestCredentialStoreConformance runs auth's store suite against a real
// server as the documented least-privilege ACL user, each subtest in a
// fresh namespace.
func TestCredentialStoreConformance(t *testing.T) {
	r, pw := aclServer(t)
	authtest.Run(t, func(t *testing.T) auth.Store {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions()})
		return s.CredentialStore()
	})
}

// The stored value is exactly EncodeCredential's bytes, without a TTL, and
// the index holds the id with score 0.
func TestCredentialLayout(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	cs := s.CredentialStore()
	_, c := issue(t, cs)
	raw, ok := get(t, s, s.keys.ns+":cred:"+c.ID)
	if !ok {
		t.Fatal("no credential key")
	}
	want, err := auth.EncodeCredential(c)
	if err != nil {
		t.Fatal(err)
	}
	if raw != string(want) {
		t.Fatalf("stored record differs from EncodeCredential:\n got  %s\n want %s", raw, want)
	}
	if pttl, _ := s.client.Do(bg, s.client.B().Pttl().Key(s.keys.ns+":cred:"+c.ID).Build()).AsInt64(); pttl != -1 {
		t.Fatalf("credential key PTTL %d, want none (-1)", pttl)
	}
	score, err := s.client.Do(bg, s.client.B().Zscore().Key(s.keys.ns+":cred:index").Member(c.ID).Build()).AsFloat64()
	if err != nil || score != 0 {
		t.Fatalf("index score %v, %v; want 0", score, err)
	}
	for _, secretish := range []string{"star_sk_", "pepper"} {
		if strings.Contains(raw, secretish) {
			t.Fatalf("stored record contains %q", secretish)
		}
	}
	// Revocation rewrites the value in place: still no TTL, still indexed.
	if _, err := cs.Revoke(bg, c.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	raw, _ = get(t, s, s.keys.ns+":cred:"+c.ID)
	got, err := auth.DecodeCredential([]byte(raw))
	if err != nil || got.RevokedAt.IsZero() {
		t.Fatalf("revoked record: %v %v", got, err)
	}
	if pttl, _ := s.client.Do(bg, s.client.B().Pttl().Key(s.keys.ns+":cred:"+c.ID).Build()).AsInt64(); pttl != -1 {
		t.Fatalf("revoked credential key PTTL %d, want none", pttl)
	}
}

// Two stores on one server and namespace stand for two servers (or a
// server and the keys command): a key created through one authenticates
// through the other, and a revocation through one applies to the very next
// request through the other.
func TestCredentialStoreShared(t *testing.T) {
	r := sharedServer(t)
	ns := randomPrefix()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	a, err := OpenCredentialStore(ctx, Options{Addr: r.Addr(), KeyPrefix: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := open(t, r, Options{KeyPrefix: ns}).CredentialStore()
	defer b.Close()
	key, c := issue(t, a)
	authn, err := auth.NewAuthenticator(b, credPepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := []string{"Bearer " + key}
	if p, err := authn.Authenticate(bg, h); err != nil || p.ID != "prn_cred_test" {
		t.Fatalf("authenticate through the other store: %v %+v", err, p)
	}
	rotated, next, err := auth.Rotate(bg, a, credPepper, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := authn.Authenticate(bg, h); err != auth.ErrInvalidCredential {
		t.Fatalf("old key after rotation through the other store: %v", err)
	}
	if _, err := authn.Authenticate(bg, []string{"Bearer " + rotated}); err != nil {
		t.Fatalf("rotated key: %v", err)
	}
	if _, err := auth.Revoke(bg, a, next.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := authn.Authenticate(bg, []string{"Bearer " + rotated}); err != auth.ErrInvalidCredential {
		t.Fatalf("revoked key through the other store: %v", err)
	}
	all, err := b.List(bg, "", 0)
	if err != nil || len(all) != 2 || all[0].ID != c.ID || all[1].ID != next.ID {
		t.Fatalf("list: %v %v", all, err)
	}

	// Concurrent revocations through both stores: one revocation time wins
	// and both report it.
	_, d := issue(t, a)
	var wg sync.WaitGroup
	got := make([]auth.Credential, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := auth.Store(a)
			if i%2 == 1 {
				s = b
			}
			var err error
			if got[i], err = s.Revoke(bg, d.ID, time.Now().Add(time.Duration(i)*time.Second)); err != nil {
				t.Errorf("revoke %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	final, err := b.Get(bg, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if !g.RevokedAt.Equal(final.RevokedAt) {
			t.Fatalf("revoke %d reported %v, stored %v", i, g.RevokedAt, final.RevokedAt)
		}
	}
}

// Records that do not decode strictly, records under another id and keys
// of the wrong type fail closed as ErrCorrupt, and nothing overwrites them.
func TestCredentialCorrupt(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	cs := s.CredentialStore()
	set := func(key, v string) {
		t.Helper()
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	_, good := issue(t, cs)
	goodRaw, _ := get(t, s, s.keys.credential(good.ID))

	_, c := issue(t, cs)
	key := s.keys.credential(c.ID)
	raw, _ := get(t, s, key)
	for name, bad := range map[string]string{
		"trailing":   raw + " ",
		"not_json":   "{",
		"foreign_id": goodRaw,
		"unknown":    strings.Replace(raw, `{"record_version":1,`, `{"record_version":1,"extra":1,`, 1),
	} {
		t.Run(name, func(t *testing.T) {
			set(key, bad)
			if _, err := cs.Get(bg, c.ID); !errors.Is(err, auth.ErrCorrupt) {
				t.Fatalf("Get = %v, want ErrCorrupt", err)
			}
			if _, err := cs.List(bg, "", 0); !errors.Is(err, auth.ErrCorrupt) {
				t.Fatalf("List = %v, want ErrCorrupt", err)
			}
			if _, err := cs.Revoke(bg, c.ID, time.Now()); !errors.Is(err, auth.ErrCorrupt) {
				t.Fatalf("Revoke = %v, want ErrCorrupt", err)
			}
			_, next := issue(t, auth.NewMemoryStore())
			if _, err := cs.Rotate(bg, c.ID, time.Now(), next); !errors.Is(err, auth.ErrCorrupt) {
				t.Fatalf("Rotate = %v, want ErrCorrupt", err)
			}
			if now, _ := get(t, s, key); now != bad {
				t.Fatal("corrupt record was overwritten")
			}
			if _, err := cs.Get(bg, next.ID); !errors.Is(err, auth.ErrNotFound) {
				t.Fatalf("refused Rotate stored its new credential: %v", err)
			}
		})
	}
	// A key of the wrong type.
	if err := s.client.Do(bg, s.client.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Lpush().Key(key).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Get(bg, c.ID); !errors.Is(err, auth.ErrCorrupt) {
		t.Fatalf("Get of a list = %v, want ErrCorrupt", err)
	}
	_, fresh := issue(t, auth.NewMemoryStore())
	if err := s.client.Do(bg, s.client.B().Lpush().Key(s.keys.credential(fresh.ID)).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := cs.Create(bg, fresh); !errors.Is(err, auth.ErrCorrupt) && !errors.Is(err, auth.ErrExists) {
		t.Fatalf("Create over a list = %v, want refused", err)
	}
	// The good credential is unaffected.
	if got, err := cs.Get(bg, good.ID); err != nil || got.ID != good.ID {
		t.Fatalf("good credential: %v", err)
	}
}

// A server that may lose acknowledged writes gets no credential writes (a
// revocation must survive a crash); reads still work. A stopped server is
// ErrUnavailable, without transport detail.
func TestCredentialStoreFailsClosed(t *testing.T) {
	r := testenv.StartRedisWith(t, testenv.RedisConfig{AppendFsync: "everysec"})
	s := open(t, r, Options{})
	cs := s.CredentialStore()
	_, c := issue(t, auth.NewMemoryStore())
	if err := cs.Create(bg, c); !errors.Is(err, auth.ErrUnavailable) {
		t.Fatalf("Create on a non-durable server = %v, want ErrUnavailable", err)
	}
	if _, err := cs.Get(bg, c.ID); !errors.Is(err, auth.ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound", err)
	}

	d := sharedServer(t)
	ds := open(t, d, Options{}).CredentialStore()
	_, c = issue(t, ds)
	d.Kill9()
	for _, op := range []func() error{
		func() error { _, err := ds.Get(bg, c.ID); return err },
		func() error { _, err := ds.List(bg, "", 0); return err },
		func() error { _, err := ds.Revoke(bg, c.ID, time.Now()); return err },
	} {
		err := op()
		for i := 0; i < 4 && err != nil && !errors.Is(err, auth.ErrUnavailable); i++ {
			err = op()
		}
		if !errors.Is(err, auth.ErrUnavailable) {
			t.Fatalf("with the server down: %v, want ErrUnavailable", err)
		}
		if strings.Contains(err.Error(), "127.0.0.1") {
			t.Fatalf("error leaks the address: %v", err)
		}
	}
	d.Restart()
	// A pooled connection that died fails once; then the record is back.
	got, err := ds.Get(bg, c.ID)
	for i := 0; i < 4 && err != nil; i++ {
		got, err = ds.Get(bg, c.ID)
	}
	if err != nil || got.ID != c.ID {
		t.Fatalf("after restart: %v", err)
	}
}

// The function library is reloaded when the server lost it.
func TestCredentialLibraryReload(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	cs := s.CredentialStore()
	issue(t, cs)
	if err := s.client.Do(bg, s.client.B().FunctionFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	issue(t, cs)
	if all, err := cs.List(bg, "", 0); err != nil || len(all) != 2 {
		t.Fatalf("list: %d %v", len(all), err)
	}
}
