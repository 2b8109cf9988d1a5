package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// etcdUser enables authentication on the cluster (a root user) and adds
// the user "starlease" whose role may read and write prefix's keys only,
// as the README documents; it returns the user's password file and a
// client of the root user.
func etcdUser(t *testing.T, c *testenv.EtcdCluster, prefix string) (string, *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cli := c.Client()
	k := prefix + "/"
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "root-secret-for-tests"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "starlease"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "starlease", k, clientv3.GetPrefixRangeEnd(k), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, "starlease", "etcd-secret-for-tests"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "starlease", "starlease"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enabling etcd authentication: %v", err)
		}
	}
	pw := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(pw, []byte("etcd-secret-for-tests\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second,
		Username: "root", Password: "root-secret-for-tests", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return pw, root
}

// etcdLeader is the index of the member that says it leads (with
// authentication on, the status call needs the root user, so the
// cluster's own Leader cannot ask).
func etcdLeader(t *testing.T, c *testenv.EtcdCluster, root *clientv3.Client) int {
	t.Helper()
	for limit := time.Now().Add(10 * time.Second); time.Now().Before(limit); time.Sleep(50 * time.Millisecond) {
		for i := range c.Size() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			r, err := root.Status(ctx, c.Member(i).ClientURL())
			cancel()
			if err == nil && r.Leader != 0 && r.Leader == r.Header.MemberId {
				return i
			}
		}
	}
	t.Fatal("no etcd member says it leads")
	return -1
}

// TestEtcdServersShareOneCluster runs the real binary on a real
// three-member cluster with authentication on: "keys create" on etcd,
// then two "serve --backend etcd" processes on the same prefix as the
// least-privilege user. A key created once works on both; a lease
// acquired through one conflicts through the other and is released
// through it; when the cluster's leader is killed the servers go on
// without an operator step (a retried acquire, by its request id, gets its
// lease); a key revoked with "keys revoke" fails on both at the next
// request; both servers' audit events reach the shared stream, which is
// read back.
func TestEtcdServersShareOneCluster(t *testing.T) {
	bin := starleaseBin(t)
	tmp := t.TempDir()
	c := testenv.StartEtcdCluster(t, 3)
	const prefix = "starlease-shared"
	pwFile, root := etcdUser(t, c, prefix)
	pepper := filepath.Join(tmp, "pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-etcd-serve-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eflags := []string{"--backend", "etcd", "--etcd-endpoints", strings.Join(c.Endpoints(), ","),
		"--etcd-username", "starlease", "--etcd-password-file", pwFile, "--etcd-key-prefix", prefix}

	keys := func(args ...string) map[string]any {
		t.Helper()
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, append(append([]string{"keys"}, args...), eflags...)...)
		cmd.Env = testenv.CleanEnv()
		cmd.Dir = tmp
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("keys %v: %v\nstderr: %q\nstdout: %q", args, err, errb.String(), out.String())
		}
		var v map[string]any
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("keys %v printed %q", args, out.String())
		}
		return v
	}
	created := keys("create", "--pepper-file", pepper, "--principal", "prn-worker", "--class", "api_client",
		"--capabilities", "targets:lease,targets:read", "--scope", "tenant:*,program:*")
	key, _ := created["api_key"].(string)
	credID, _ := created["credential"].(map[string]any)["credential_id"].(string)
	if testenv.APIKeyRE.FindStringSubmatch(key) == nil || credID == "" {
		t.Fatalf("keys create printed %v", created)
	}
	list := keys("list")
	if creds, _ := list["credentials"].([]any); len(creds) != 1 || creds[0].(map[string]any)["credential_id"] != credID {
		t.Fatalf("keys list: %v", list)
	}
	// Nothing was written to a local credentials directory.
	if _, err := os.Stat(filepath.Join(tmp, "credentials")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("keys with --backend etcd touched a local directory: %v", err)
	}

	args := append([]string{"--pepper-file", pepper}, eflags...)
	s1 := startServer(t, bin, filepath.Join(tmp, "one"), args...)
	s2 := startServer(t, bin, filepath.Join(tmp, "two"), args...)

	identity := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
		"target_namespace": "web", "target_id": "example.com", "actor_name": "crawler"}
	acquire := func(requestID string) map[string]any {
		return map[string]any{"lock_identity": identity, "ttl_ms": 30000, "service_instance_id": "inst-1",
			"execution_id": "exec-1", "job_id": "job-1", "request_id": requestID}
	}
	const base = "/api/v1/target-leases"
	code, out := s1.do(t, key, "POST", base+"/acquire", acquire("req-1"))
	if code != 200 || out["code"] != "lease_acquired" {
		t.Fatalf("acquire on server 1: %d %v", code, out)
	}
	held := out["lease"].(map[string]any)
	leaseID := held["lease_id"].(string)

	// The key created once works on server 2, which sees the same lease.
	code, out = s2.do(t, key, "GET", base+"/"+leaseID, nil)
	if code != 200 || out["lease"].(map[string]any)["lease_id"] != leaseID || out["lease"].(map[string]any)["state"] != "active" {
		t.Fatalf("inspect on server 2: %d %v", code, out)
	}
	code, out = s2.do(t, key, "POST", base+"/acquire", acquire("req-2"))
	if code != 409 || out["code"] != "lease_conflict" {
		t.Fatalf("acquire on server 2: %d %v, want 409 lease_conflict", code, out)
	}
	// Released through server 2; server 1 then sees it released.
	code, out = s2.do(t, key, "POST", base+"/"+leaseID+"/release", map[string]any{"lock_identity": identity,
		"fencing_token": held["fencing_token"], "service_instance_id": "inst-1", "request_id": "req-3"})
	if code != 200 || out["code"] != "lease_released" {
		t.Fatalf("release on server 2: %d %v", code, out)
	}
	code, out = s1.do(t, key, "GET", base+"/"+leaseID, nil)
	if code != 200 || out["lease"].(map[string]any)["state"] != "released" {
		t.Fatalf("inspect on server 1 after release: %d %v", code, out)
	}

	// Failover: the leader dies; the others elect one and the servers go
	// on. An answer during the election may be 503 (unavailable, or
	// outcome unknown); the retry by request id gets the one lease.
	c.Member(etcdLeader(t, c, root)).Kill()
	killed := time.Now()
	for n := 1; ; n++ {
		code, out = s1.do(t, key, "POST", base+"/acquire", acquire("req-4"))
		if code == 200 {
			t.Logf("acquired %v after the leader's loss, at attempt %d", time.Since(killed).Round(time.Millisecond), n)
			break
		}
		if code != 503 || time.Since(killed) > 20*time.Second {
			t.Fatalf("acquire after the leader's loss: %d %v", code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	next := out["lease"].(map[string]any)
	token := next["fencing_token"].(float64)
	if token <= held["fencing_token"].(float64) {
		t.Fatalf("fencing token %v after %v", token, held["fencing_token"])
	}
	code, out = s2.do(t, key, "GET", base+"/"+next["lease_id"].(string), nil)
	if code != 200 || out["lease"].(map[string]any)["fencing_token"].(float64) != token {
		t.Fatalf("inspect on server 2 after failover: %d %v", code, out)
	}

	revoked := keys("revoke", "--id", credID)
	if revoked["credential"].(map[string]any)["revoked_at"] == nil {
		t.Fatalf("keys revoke printed %v", revoked)
	}
	for i, s := range []*server{s1, s2} {
		code, out := s.do(t, key, "GET", base+"/"+leaseID, nil)
		if code != 401 || out["code"] != "invalid_credential" {
			t.Fatalf("server %d after revoke: %d %v, want 401 invalid_credential", i+1, code, out)
		}
	}

	// Both servers' events are in their own JSON-lines files and in the
	// shared stream, read back as the same user.
	s1.stop(t)
	s2.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	es, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Username: "starlease", PasswordFile: pwFile,
		KeyPrefix: prefix, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	var stream []audit.Event
	for f := (audit.Filter{}); ; {
		page, err := es.AuditSink(etcd.AuditOptions{}).Read(ctx, f, audit.MaxReadLimit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		stream = append(stream, page...)
		f.After = page[len(page)-1].EventID
	}
	inStream := map[string]int{}
	for _, e := range stream {
		inStream[e.EventID]++
	}
	types := map[string]bool{}
	for _, s := range []*server{s1, s2} {
		events, err := audit.ReadFile(filepath.Join(s.dataDir, auditFile))
		if err != nil {
			t.Fatal(err)
		}
		if len(events) == 0 {
			t.Fatalf("no audit events in %s", s.dataDir)
		}
		for _, e := range events {
			if inStream[e.EventID] != 1 {
				t.Fatalf("event %s (%s/%s) of %s is %d times in the shared stream", e.EventID, e.EventType, e.ResultCode,
					s.dataDir, inStream[e.EventID])
			}
			types[fmt.Sprintf("%s/%s", e.EventType, e.ResultCode)] = true
		}
		// Nothing waits in the spool.
		if fi, err := os.Stat(filepath.Join(s.dataDir, auditSpoolFile)); err != nil || fi.Size() != 0 {
			t.Fatalf("spool of %s: %v", s.dataDir, err)
		}
	}
	for _, want := range []string{"target_lease_acquire/lease_acquired", "target_lease_acquire/lease_conflict",
		"target_lease_release/lease_released", "target_lease_inspect/lease_inspected", "target_lease_auth_failed/invalid_credential"} {
		if !types[want] {
			t.Errorf("no %s event; saw %v", want, types)
		}
	}
	// The credential "keys revoke" revoked reads back revoked.
	if r, err := es.CredentialStore().List(ctx, "", 0); err != nil || len(r) != 1 || r[0].RevokedAt.IsZero() {
		t.Fatalf("credentials after revoke: %v %v", r, err)
	}
}

// The relay's outbox name of each backend is a valid relay identity, and
// two etcd prefixes (two outboxes) have two names.
func TestOutboxNames(t *testing.T) {
	names := map[string]bool{}
	for _, f := range []backendFlags{{backend: "bolt"}, {backend: "valkey", valkeyPrefix: "starlease"},
		{backend: "etcd", etcdPrefix: etcd.DefaultKeyPrefix}, {backend: "etcd", etcdPrefix: "Site-B:leases.v2"}} {
		name := outboxName(f)
		if _, err := rabbitmq.RelayIdentity(name).Normalize(lease.DefaultOperationClasses()); err != nil {
			t.Fatalf("%s: %q is not a valid relay identity: %v", f.backend, name, err)
		}
		names[name] = true
	}
	if !names["etcd.starlease"] || len(names) != 4 {
		t.Fatalf("outbox names %v", names)
	}
}

// Bad etcd flags are refused before anything is created: serve's backend
// and the keys command give a typed error naming the flag, and leave no
// file behind.
func TestEtcdFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, eps := range []string{"127.0.0.1:2379", "", "ftp://127.0.0.1:2379"} {
		f := backendFlags{backend: "etcd", etcdEndpoints: eps, etcdPrefix: etcd.DefaultKeyPrefix}
		_, err := openBackend(t.Context(), f, dir, lease.StoreOptions{})
		if lease.CodeOf(err) != lease.CodeInvalidRequest || lease.AsError(err).Field != "endpoints" {
			t.Fatalf("endpoints %q: %v", eps, err)
		}
		var stderr bytes.Buffer
		if code := runKeys([]string{"list", "--backend", "etcd", "--etcd-endpoints", eps}, io.Discard, &stderr); code == exitOK ||
			!strings.Contains(stderr.String(), "endpoint") {
			t.Fatalf("keys with endpoints %q: exit %d, %s", eps, code, stderr.String())
		}
	}
	f := backendFlags{backend: "etcd", etcdEndpoints: "http://127.0.0.1:1", etcdPrefix: "bad/prefix"}
	if _, err := openBackend(t.Context(), f, dir, lease.StoreOptions{}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Fatalf("a bad prefix: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused flags left %v behind", entries)
	}
}
