package etcd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/auth/authtest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

var credPepper = func() auth.Pepper {
	p, err := auth.NewPepper([]byte("etcd-credential-test-pepper-0123456789abc"))
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

// credIssue creates a key in s and returns it with its credential.
func credIssue(t testing.TB, s auth.Store) (string, auth.Credential) {
	t.Helper()
	key, c, err := auth.Issue(t.Context(), s, credPepper, auth.IssueRequest{PrincipalID: "prn_cred_test", Class: auth.ClassAPIClient,
		Capabilities: []auth.Capability{auth.CapLease}, Scope: credScope(t), Label: "test"})
	if err != nil {
		t.Fatalf("issue: %v", err)
	}
	return key, c
}

// privilegeCluster is a three-member cluster with authentication enabled: a
// root user for the test's own reads and writes, and the user "starlease"
// whose role is granted read-write on one key prefix at a time, exactly
// as the README documents, so the backend runs with least privilege.
type privilegeCluster struct {
	c      *testenv.EtcdCluster
	root   *clientv3.Client
	pwFile string
}

const (
	testRootPassword = "root-secret-for-tests"
	testUserPassword = "starlease-secret-for-tests"
)

func startPrivilegeCluster(t *testing.T) *privilegeCluster {
	t.Helper()
	c := testenv.StartEtcdCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	admin := c.Client()
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", testRootPassword); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "starlease"); return err },
		func() error { _, err := admin.UserAdd(ctx, "starlease", testUserPassword); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "starlease", "starlease"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enabling etcd authentication: %v", err)
		}
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second,
		Username: "root", Password: testRootPassword, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	pw := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(pw, []byte(testUserPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &privilegeCluster{c: c, root: root, pwFile: pw}
}

// grant gives the role "starlease" read-write on prefix's keys (prefix/
// and below), the documented permission.
func (a *privilegeCluster) grant(t testing.TB, prefix string) {
	t.Helper()
	k := prefix + "/"
	if _, err := a.root.RoleGrantPermission(t.Context(), "starlease", k, clientv3.GetPrefixRangeEnd(k), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatalf("grant: %v", err)
	}
}

// options are the user's connection options on a fresh granted prefix.
func (a *privilegeCluster) options(t testing.TB, o Options) Options {
	t.Helper()
	if o.KeyPrefix == "" {
		o.KeyPrefix = randomPrefix()
	}
	a.grant(t, o.KeyPrefix)
	o.Endpoints, o.Username, o.PasswordFile = a.c.Endpoints(), "starlease", a.pwFile
	return o
}

// open opens a store as the user on a fresh granted prefix.
func (a *privilegeCluster) open(t testing.TB, o Options) *Store {
	t.Helper()
	return open(t, a.c, a.options(t, o))
}

// raw reads key as root: its value and whether it exists, with its
// metadata.
func (a *privilegeCluster) raw(t testing.TB, key string) ([]byte, bool, int64) {
	t.Helper()
	r, err := a.root.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return nil, false, 0
	}
	return r.Kvs[0].Value, true, r.Kvs[0].Lease
}

func (a *privilegeCluster) put(t testing.TB, key, value string) {
	t.Helper()
	if _, err := a.root.Put(t.Context(), key, value); err != nil {
		t.Fatal(err)
	}
}

// snapshot is every key under the store's prefix with its mod revision.
func (a *privilegeCluster) snapshot(t testing.TB, s *Store) map[string]int64 {
	t.Helper()
	r, err := a.root.Get(t.Context(), s.keys.p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range r.Kvs {
		// The servers' clock beats change every second by design.
		if !strings.HasPrefix(string(kv.Key), s.keys.clockPrefix()) {
			out[string(kv.Key)] = kv.ModRevision
		}
	}
	return out
}

// TestCredentialStore runs the credential store on one three-member
// cluster with authentication on, as the least-privilege user, every
// subtest in a fresh prefix.
func TestCredentialStore(t *testing.T) {
	a := startPrivilegeCluster(t)

	t.Run("Conformance", func(t *testing.T) {
		authtest.Run(t, func(t *testing.T) auth.Store {
			return a.open(t, Options{StoreOptions: leasetest.StoreOptions()}).CredentialStore()
		})
	})

	// The stored value is exactly EncodeCredential's bytes, without an
	// etcd lease (no TTL), and the prefix holds nothing else but the
	// schema: no index, no secret.
	t.Run("Layout", func(t *testing.T) {
		s := a.open(t, Options{})
		cs := s.CredentialStore()
		key, c := credIssue(t, cs)
		k := s.keys.p + "cred/" + c.ID
		raw, ok, leaseID := a.raw(t, k)
		if !ok {
			t.Fatal("no credential key")
		}
		want, err := auth.EncodeCredential(c)
		if err != nil {
			t.Fatal(err)
		}
		if string(raw) != string(want) {
			t.Fatalf("stored record differs from EncodeCredential:\n got  %s\n want %s", raw, want)
		}
		if leaseID != 0 {
			t.Fatalf("credential key is attached to etcd lease %x; want none", leaseID)
		}
		secret := testenv.APIKeyRE.FindStringSubmatch(key)[2]
		for _, secretish := range []string{"star_sk_", secret, "etcd-credential-test-pepper"} {
			if strings.Contains(string(raw), secretish) {
				t.Fatalf("stored record contains %q", secretish)
			}
		}
		keys := slices.Sorted(maps.Keys(a.snapshot(t, s)))
		if !slices.Equal(keys, []string{k, s.keys.schema()}) {
			t.Fatalf("keys under the prefix: %q", keys)
		}
		// Revocation rewrites the record in place: same key, no lease.
		before, _ := a.root.Get(t.Context(), k)
		if _, err := cs.Revoke(t.Context(), c.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		after, _ := a.root.Get(t.Context(), k)
		if kv := after.Kvs[0]; kv.CreateRevision != before.Kvs[0].CreateRevision || kv.Version != 2 || kv.Lease != 0 {
			t.Fatalf("revoked record: create revision %d (was %d), version %d, lease %x", kv.CreateRevision, before.Kvs[0].CreateRevision, kv.Version, kv.Lease)
		}
		got, err := auth.DecodeCredential(after.Kvs[0].Value)
		if err != nil || got.RevokedAt.IsZero() || got.ID != c.ID {
			t.Fatalf("revoked record: %v %v", got, err)
		}
	})

	// Two stores on one prefix, each with its own client, stand for two
	// servers (or a server and the keys command): a key created through
	// one authenticates through the other, and a rotation or revocation
	// through one applies to the very next request through the other.
	t.Run("Shared", func(t *testing.T) {
		o := a.options(t, Options{})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		sa, err := OpenCredentialStore(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		defer sa.Close()
		b := open(t, a.c, o).CredentialStore()
		defer b.Close()
		key, c := credIssue(t, sa)
		authn, err := auth.NewAuthenticator(b, credPepper, nil)
		if err != nil {
			t.Fatal(err)
		}
		h := []string{"Bearer " + key}
		if p, err := authn.Authenticate(t.Context(), h); err != nil || p.ID != "prn_cred_test" || p.CredentialID != c.ID {
			t.Fatalf("authenticate through the other store: %v %+v", err, p)
		}
		rotated, next, err := auth.Rotate(t.Context(), sa, credPepper, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := authn.Authenticate(t.Context(), h); err != auth.ErrInvalidCredential {
			t.Fatalf("old key after rotation through the other store: %v", err)
		}
		if p, err := authn.Authenticate(t.Context(), []string{"Bearer " + rotated}); err != nil || p.CredentialID != next.ID {
			t.Fatalf("rotated key: %v %+v", err, p)
		}
		if _, err := auth.Revoke(t.Context(), sa, next.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := authn.Authenticate(t.Context(), []string{"Bearer " + rotated}); err != auth.ErrInvalidCredential {
			t.Fatalf("revoked key through the other store: %v", err)
		}
		all, err := b.List(t.Context(), "", 0)
		if err != nil || len(all) != 2 || all[0].ID != c.ID || all[1].ID != next.ID || all[0].ReplacedBy != next.ID ||
			all[1].RevokedAt.IsZero() {
			t.Fatalf("list: %v %v", all, err)
		}

		// Concurrent revocations through both stores: one revocation time
		// wins and every caller reports it.
		_, d := credIssue(t, sa)
		var wg sync.WaitGroup
		got := make([]auth.Credential, 8)
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := auth.Store(sa)
				if i%2 == 1 {
					s = b
				}
				var err error
				if got[i], err = s.Revoke(t.Context(), d.ID, time.Now().Add(time.Duration(i)*time.Second)); err != nil {
					t.Errorf("revoke %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		final, err := b.Get(t.Context(), d.ID)
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range got {
			if !g.RevokedAt.Equal(final.RevokedAt) {
				t.Fatalf("revoke %d reported %v, stored %v", i, g.RevokedAt, final.RevokedAt)
			}
		}

		// Concurrent rotations through both stores: exactly one wins, and
		// the stored old record names the winner's credential.
		_, e := credIssue(t, sa)
		nexts := make([]auth.Credential, 8)
		wins := make([]bool, len(nexts))
		for i := range nexts {
			_, nexts[i] = credIssue(t, auth.NewMemoryStore())
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := auth.Store(sa)
				if i%2 == 1 {
					s = b
				}
				_, err := s.Rotate(t.Context(), e.ID, time.Now(), nexts[i])
				switch {
				case err == nil:
					wins[i] = true
				case !errors.Is(err, auth.ErrRevoked):
					t.Errorf("rotate %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		old, err := b.Get(t.Context(), e.ID)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for i, w := range wins {
			_, gerr := sa.Get(t.Context(), nexts[i].ID)
			switch {
			case w && (gerr != nil || old.ReplacedBy != nexts[i].ID):
				t.Fatalf("winner %d: stored %v, old replaced by %q", i, gerr, old.ReplacedBy)
			case !w && !errors.Is(gerr, auth.ErrNotFound):
				t.Fatalf("loser %d stored its credential: %v", i, gerr)
			case w:
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d concurrent rotations won, want 1", n)
		}
	})

	// Records that do not decode strictly, records under another id and
	// foreign keys in the credential prefix fail closed as ErrCorrupt, and
	// nothing overwrites them.
	t.Run("Corrupt", func(t *testing.T) {
		s := a.open(t, Options{})
		cs := s.CredentialStore()
		_, good := credIssue(t, cs)
		goodRaw, _, _ := a.raw(t, s.keys.credential(good.ID))

		_, c := credIssue(t, cs)
		key := s.keys.credential(c.ID)
		raw, _, _ := a.raw(t, key)
		for name, bad := range map[string]string{
			"trailing":   string(raw) + " ",
			"not_json":   "{",
			"empty":      "",
			"foreign_id": string(goodRaw),
			"unknown":    strings.Replace(string(raw), `{"record_version":1,`, `{"record_version":1,"extra":1,`, 1),
		} {
			t.Run(name, func(t *testing.T) {
				a.put(t, key, bad)
				if _, err := cs.Get(t.Context(), c.ID); !errors.Is(err, auth.ErrCorrupt) {
					t.Fatalf("Get = %v, want ErrCorrupt", err)
				}
				if _, err := cs.List(t.Context(), "", 0); !errors.Is(err, auth.ErrCorrupt) {
					t.Fatalf("List = %v, want ErrCorrupt", err)
				}
				before := a.snapshot(t, s)
				if _, err := cs.Revoke(t.Context(), c.ID, time.Now()); !errors.Is(err, auth.ErrCorrupt) {
					t.Fatalf("Revoke = %v, want ErrCorrupt", err)
				}
				_, next := credIssue(t, auth.NewMemoryStore())
				if _, err := cs.Rotate(t.Context(), c.ID, time.Now(), next); !errors.Is(err, auth.ErrCorrupt) {
					t.Fatalf("Rotate = %v, want ErrCorrupt", err)
				}
				if err := cs.Create(t.Context(), c); !errors.Is(err, auth.ErrExists) {
					t.Fatalf("Create over it = %v, want ErrExists", err)
				}
				if now, _, _ := a.raw(t, key); string(now) != bad {
					t.Fatal("corrupt record was overwritten")
				}
				if after := a.snapshot(t, s); !maps.Equal(before, after) {
					t.Fatalf("refused calls changed the prefix:\n%v\n%v", before, after)
				}
			})
		}
		// A key in the credential prefix that is not a credential id.
		a.put(t, key, string(raw))
		a.put(t, s.keys.credPrefix()+"not-an-id", "x")
		if _, err := cs.List(t.Context(), "", 0); !errors.Is(err, auth.ErrCorrupt) {
			t.Fatalf("List with a foreign key = %v, want ErrCorrupt", err)
		}
		// The good credentials are unaffected.
		for _, id := range []string{good.ID, c.ID} {
			if got, err := cs.Get(t.Context(), id); err != nil || got.ID != id {
				t.Fatalf("credential %s: %v", id, err)
			}
		}
	})

	// Bad input gets a typed error and writes nothing.
	t.Run("BadInput", func(t *testing.T) {
		s := a.open(t, Options{})
		cs := s.CredentialStore()
		_, c := credIssue(t, cs)
		before := a.snapshot(t, s)
		_, next := credIssue(t, auth.NewMemoryStore())
		for name, call := range map[string]func() error{
			"create without verifier": func() error { return cs.Create(t.Context(), auth.Credential{ID: "01ARZ3NDEKTSV4RRFFQ69G5FAV"}) },
			"rotate to an invalid credential": func() error {
				_, err := cs.Rotate(t.Context(), c.ID, time.Now(), auth.Credential{ID: next.ID})
				return err
			},
			"rotate onto itself": func() error {
				_, err := cs.Rotate(t.Context(), c.ID, time.Now(), c)
				if !errors.Is(err, auth.ErrExists) {
					return fmt.Errorf("want ErrExists: %w", err)
				}
				return err
			},
			"revoke a malformed id": func() error {
				_, err := cs.Revoke(t.Context(), "../"+c.ID, time.Now())
				if !errors.Is(err, auth.ErrNotFound) {
					return fmt.Errorf("want ErrNotFound: %w", err)
				}
				return err
			},
			"get a malformed id": func() error {
				_, err := cs.Get(t.Context(), c.ID+"/x")
				if !errors.Is(err, auth.ErrNotFound) {
					return fmt.Errorf("want ErrNotFound: %w", err)
				}
				return err
			},
		} {
			err := call()
			if err == nil || strings.HasPrefix(err.Error(), "want ") {
				t.Fatalf("%s: %v", name, err)
			}
		}
		for _, o := range []Options{{Endpoints: a.c.Endpoints(), KeyPrefix: "bad/prefix"}, {KeyPrefix: "ok"}} {
			if _, err := OpenCredentialStore(t.Context(), o); lease.CodeOf(err) != lease.CodeInvalidRequest {
				t.Fatalf("OpenCredentialStore(%+v) = %v, want invalid_lease_request", o, err)
			}
		}
		if page, err := cs.List(t.Context(), "\xff", 0); err != nil || len(page) != 0 {
			t.Fatalf("List after the end: %v %v", page, err)
		}
		if after := a.snapshot(t, s); !maps.Equal(before, after) {
			t.Fatalf("bad input changed the prefix:\n%v\n%v", before, after)
		}
		if got, err := cs.Get(t.Context(), c.ID); err != nil || !got.RevokedAt.IsZero() {
			t.Fatalf("credential after bad input: %v %v", got, err)
		}
	})

	// The user reaches only its granted prefix: another prefix is refused
	// at open, as unavailable, without an endpoint in the error.
	t.Run("LeastPrivilege", func(t *testing.T) {
		o := Options{Endpoints: a.c.Endpoints(), Username: "starlease", PasswordFile: a.pwFile,
			KeyPrefix: randomPrefix(), OpTimeout: 2 * time.Second}
		_, err := OpenCredentialStore(t.Context(), o)
		if !errors.Is(err, auth.ErrUnavailable) || strings.Contains(err.Error(), "127.0.0.1") ||
			strings.Contains(err.Error(), testUserPassword) {
			t.Fatalf("open of an ungranted prefix: %v", err)
		}
		if _, ok, _ := a.raw(t, o.KeyPrefix+"/meta/schema"); ok {
			t.Fatal("the refused open wrote its schema")
		}
		o.PasswordFile = filepath.Join(t.TempDir(), "wrong")
		if err := os.WriteFile(o.PasswordFile, []byte("wrong\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		a.grant(t, o.KeyPrefix)
		_, err = OpenCredentialStore(t.Context(), o)
		if !errors.Is(err, auth.ErrUnavailable) || !strings.Contains(err.Error(), "authentication failed") {
			t.Fatalf("open with a wrong password: %v", err)
		}
	})
}

// TestCredentialStoreFailover: the leader's loss costs no credential and
// needs no operator step; with quorum lost every call is ErrUnavailable
// (without transport detail) and, once quorum is back, the records are
// there.
func TestCredentialStoreFailover(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	s := open(t, c, Options{OpTimeout: 3 * time.Second})
	cs := s.CredentialStore()
	_, cred := credIssue(t, cs)

	leader := c.Leader()
	c.Member(leader).Kill()
	// The client moves to a surviving member once the others elect a
	// leader; until then a call may fail.
	var err error
	var got auth.Credential
	for limit := time.Now().Add(15 * time.Second); time.Now().Before(limit); time.Sleep(50 * time.Millisecond) {
		if got, err = cs.Revoke(t.Context(), cred.ID, time.Now()); err == nil {
			break
		}
	}
	if err != nil || got.RevokedAt.IsZero() {
		t.Fatalf("revoke after the leader's loss: %v", err)
	}
	if read, err := cs.Get(t.Context(), cred.ID); err != nil || !read.RevokedAt.Equal(got.RevokedAt) {
		t.Fatalf("read back after failover: %v %v", read, err)
	}
	_, second := credIssue(t, cs)
	// A new client (a server starting, the keys command) connects with a
	// member down.
	tool, err := OpenCredentialStore(t.Context(), Options{Endpoints: c.Endpoints(), KeyPrefix: strings.TrimSuffix(s.keys.p, "/")})
	if err != nil {
		t.Fatalf("connecting with one member down: %v", err)
	}
	if read, err := tool.Get(t.Context(), second.ID); err != nil || read.ID != second.ID {
		t.Fatalf("read through the new client: %v %v", read, err)
	}
	tool.Close()

	// Quorum lost: a second member down.
	other := (leader + 1) % 3
	c.Member(other).Kill()
	_, doubt := credIssue(t, auth.NewMemoryStore())
	for name, op := range map[string]func() error{
		"get":    func() error { _, err := cs.Get(t.Context(), cred.ID); return err },
		"list":   func() error { _, err := cs.List(t.Context(), "", 0); return err },
		"revoke": func() error { _, err := cs.Revoke(t.Context(), second.ID, time.Now()); return err },
		"create": func() error { return cs.Create(t.Context(), doubt) },
	} {
		err := op()
		if !errors.Is(err, auth.ErrUnavailable) {
			t.Fatalf("%s with quorum lost: %v, want ErrUnavailable", name, err)
		}
		if strings.Contains(err.Error(), "127.0.0.1") {
			t.Fatalf("%s: error leaks the address: %v", name, err)
		}
	}
	c.Member(leader).Restart()
	c.Member(other).Restart()
	c.WaitLeader(15 * time.Second)
	for limit := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, err = cs.Get(t.Context(), cred.ID); err == nil || time.Now().After(limit) {
			break
		}
	}
	if err != nil || got.ID != cred.ID || got.RevokedAt.IsZero() {
		t.Fatalf("after quorum returned: %v %v", got, err)
	}
	// The writes that timed out are in doubt: each is either applied
	// whole or not at all.
	if d, err := cs.Get(t.Context(), doubt.ID); err == nil {
		a, _ := auth.EncodeCredential(d)
		b, _ := auth.EncodeCredential(doubt)
		if string(a) != string(b) {
			t.Fatal("the in-doubt create stored another record")
		}
	} else if !errors.Is(err, auth.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := cs.Revoke(t.Context(), second.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, err := cs.Get(t.Context(), second.ID); err != nil || got.RevokedAt.IsZero() {
		t.Fatalf("revoked after recovery: %v %v", got, err)
	}
	// A closed store refuses.
	s.Close()
	if _, err := cs.Get(t.Context(), cred.ID); !errors.Is(err, auth.ErrUnavailable) {
		t.Fatalf("after the store closed: %v", err)
	}
}
