package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/valkey"
)

// buildBinary builds the command once for a test.
func buildBinary(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "starlease")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// server is one running "starlease serve" process.
type server struct {
	base    string
	dataDir string
	cmd     *exec.Cmd
	stderr  *bytes.Buffer
	done    chan struct{}
}

// startServer starts "starlease serve" on a free loopback port and waits
// until /readyz answers 200.
func startServer(t *testing.T, bin, dataDir string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "STARLEASE_LISTEN=") // the flags here win anyway
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{dataDir: dataDir, cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop(t) })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "starlease serving on http://"); ok {
				addr <- strings.Fields(rest)[0]
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() { cmd.Wait(); close(s.done) }()
	select {
	case a := <-addr:
		s.base = "http://" + a
	case <-s.done:
		t.Fatalf("serve exited: %s", s.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start: %s", s.stderr)
	}
	for limit := time.Now().Add(10 * time.Second); ; {
		if r, err := http.Get(s.base + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(limit) {
			t.Fatalf("serve not ready: %s", s.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the server gracefully (SIGTERM), killing it if it hangs.
func (s *server) stop(t *testing.T) {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		t.Errorf("serve did not shut down on SIGTERM")
	}
}

// do sends one request with the key and returns the status and the
// decoded body.
func (s *server) do(t *testing.T, key, method, path string, body any) (int, map[string]any) {
	t.Helper()
	return apiCall(t, s.base, key, method, path, body)
}

// apiCall sends one request to the server at base with the key and body
// (JSON, none if nil) and returns the status and the decoded body.
func apiCall(t *testing.T, base, key, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: body is not JSON: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// TestValkeyServersShareOneBackend runs the real binary: "keys create" on
// Valkey, then two "serve --backend valkey" processes on the same server
// as the documented least-privilege ACL user. A key created once works on
// both; a lease acquired through one conflicts through the other; a key
// revoked with "keys revoke" fails on both at the next request; both
// servers' audit events reach the shared stream and their own files.
func TestValkeyServersShareOneBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts servers")
	}
	bin := buildBinary(t)
	tmp := t.TempDir()
	pwFile := filepath.Join(tmp, "valkey-password")
	if err := os.WriteFile(pwFile, []byte("valkey-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := testenv.StartRedisWith(t, testenv.RedisConfig{ACL: []string{
		"user default on nopass ~* &* +@all", testenv.DocumentedACL(t, filepath.Join("..", "..", "valkey", "doc.go"), "valkey-secret")}})
	pepper := filepath.Join(tmp, "pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-valkey-serve-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vflags := []string{"--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-username", "starlease",
		"--valkey-password-file", pwFile, "--valkey-key-prefix", "starlease:shared"}

	keys := func(args ...string) map[string]any {
		t.Helper()
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, append(append([]string{"keys"}, args...), vflags...)...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("keys %v: %v\n%s", args, err, errb.String())
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
	if !strings.HasPrefix(key, "star_sk_v1_") || credID == "" {
		t.Fatalf("keys create printed %v", created)
	}
	if list := keys("list"); len(list["credentials"].([]any)) != 1 {
		t.Fatalf("keys list: %v", list)
	}
	// Nothing was written to a local credentials directory.
	if _, err := os.Stat(filepath.Join(tmp, "credentials")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("keys with --backend valkey touched a local directory: %v", err)
	}

	args := append([]string{"--pepper-file", pepper}, vflags...)
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
	leaseID := out["lease"].(map[string]any)["lease_id"].(string)

	// The key created once works on server 2, which sees the same lease.
	code, out = s2.do(t, key, "GET", base+"/"+leaseID, nil)
	if code != 200 || out["lease"].(map[string]any)["lease_id"] != leaseID {
		t.Fatalf("inspect on server 2: %d %v", code, out)
	}
	code, out = s2.do(t, key, "POST", base+"/acquire", acquire("req-2"))
	if code != 409 || out["code"] != "lease_conflict" {
		t.Fatalf("acquire on server 2: %d %v, want 409 lease_conflict", code, out)
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
	// shared stream.
	s1.stop(t)
	s2.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vs, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), Username: "starlease", PasswordFile: pwFile,
		KeyPrefix: "starlease:shared", ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	stream, err := vs.AuditSink(valkey.AuditOptions{}).Read(ctx, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	inStream := map[string]bool{}
	for _, e := range stream {
		inStream[e.EventID] = true
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
			if !inStream[e.EventID] {
				t.Fatalf("event %s of %s is not in the shared stream", e.EventID, s.dataDir)
			}
			types[fmt.Sprintf("%s/%s", e.EventType, e.ResultCode)] = true
		}
	}
	for _, want := range []string{"target_lease_acquire/lease_acquired", "target_lease_acquire/lease_conflict"} {
		if !types[want] {
			t.Errorf("no %s event; saw %v", want, types)
		}
	}
	if n, err := vs.ActiveLeases(ctx); err != nil || n != 1 {
		t.Errorf("active leases %d, %v; want 1", n, err)
	}
}
