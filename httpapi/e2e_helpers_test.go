package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/lease"
)

// This file holds the machinery of e2e_test.go: building the real
// starlease binary, running "starlease serve" and "starlease keys" as
// processes, raw HTTP requests and bookkeeping of the wire-table rows seen.

const apiBase = "/api/v1/target-leases"

// buildStarlease builds cmd/starlease into a temporary directory of t.
func buildStarlease(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "starlease")
	cmd := exec.Command(goTool, "build", "-o", bin, "github.com/starintel/starlease/cmd/starlease")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/starlease: %v\n%s", err, out)
	}
	return bin
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

// e2eKey is an API key created with "starlease keys create".
type e2eKey struct {
	Principal    string
	Class        string
	APIKey       string
	CredentialID string
	Secret       string // the 64 hex characters after the credential id
}

// e2eServer is a running "starlease serve" process.
type e2eServer struct {
	t          *testing.T
	bin        string
	dataDir    string
	pepperFile string
	pepper     string
	addr       string
	base       string
	stdout     *lockedBuffer
	stderr     *lockedBuffer
	cmd        *exec.Cmd
	exited     chan struct{}
	exitErr    error
	rows       *rowRecorder
	// backendArgs are the serve flags that name the backend; the keys
	// command needs them too, since the credentials live in the backend.
	backendArgs []string

	mu   sync.Mutex
	keys []*e2eKey
}

// startServer starts "starlease serve" on a free loopback port with a new
// data directory and pepper file, waits for GET /readyz 200, and stops it
// with SIGTERM in t.Cleanup (checking that it shuts down cleanly).
func startServer(t *testing.T, bin string, rows *rowRecorder, extra ...string) *e2eServer {
	t.Helper()
	dir := t.TempDir()
	s := &e2eServer{t: t, bin: bin, dataDir: filepath.Join(dir, "data"), pepperFile: filepath.Join(dir, "pepper"), rows: rows}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i] == "--backend" || strings.HasPrefix(extra[i], "--valkey-") {
			s.backendArgs = append(s.backendArgs, extra[i], extra[i+1])
		}
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	s.pepper = hex.EncodeToString(raw)
	if err := os.WriteFile(s.pepperFile, []byte(s.pepper+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.start(extra); lastErr == nil {
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("starlease serve did not start: %v", lastErr)
	return nil
}

// freePort picks a port by listening on 127.0.0.1:0 and closing.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// cleanEnv is the environment without STARLEASE_* variables, so the flags
// given are the whole configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STARLEASE_") {
			env = append(env, kv)
		}
	}
	return env
}

func (s *e2eServer) start(extra []string) error {
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(s.t)))
	s.base = "http://" + s.addr
	args := append([]string{"serve", "--data-dir", s.dataDir, "--pepper-file", s.pepperFile, "--listen", s.addr}, extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Env = cleanEnv()
	s.stdout, s.stderr = &lockedBuffer{}, &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = s.stdout, s.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { s.exitErr = cmd.Wait(); close(s.exited) }()
	limit := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("exited during start (%v): %s", s.exitErr, s.stderr.Bytes())
		default:
		}
		resp, err := http.Get(s.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(limit) {
			s.stopProcess()
			return fmt.Errorf("GET /readyz not 200 within 15 s: %s", s.stderr.Bytes())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// stopProcess sends SIGTERM and waits (SIGKILL after 15 s). It reports
// whether the process exited by itself after SIGTERM with status 0.
func (s *e2eServer) stopProcess() (clean bool) {
	select {
	case <-s.exited:
		return s.exitErr == nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return s.exitErr == nil
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return false
	}
}

func (s *e2eServer) stop() {
	if s.t.Failed() {
		tail := s.stderr.Bytes()
		if len(tail) > 6000 {
			tail = tail[len(tail)-6000:]
		}
		s.t.Logf("starlease serve stderr (tail):\n%s", tail)
	}
	if !s.stopProcess() {
		s.t.Errorf("starlease serve did not shut down cleanly on SIGTERM: %v\nstderr:\n%s", s.exitErr, s.stderr.Bytes())
	}
}

// runCLI runs the binary with args and returns stdout; a non-zero exit
// fails the test.
func (s *e2eServer) runCLI(args ...string) []byte {
	s.t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("starlease %s: %v\n%s", args[0], err, stderr.Bytes())
	}
	return stdout.Bytes()
}

var apiKeyRE = regexp.MustCompile(`^star_sk_v1_([0-9A-HJKMNP-TV-Z]{26})_([0-9a-f]{64})$`)

// createKey runs "starlease keys create" against the server's data
// directory while it runs.
func (s *e2eServer) createKey(principal, class, caps, scope string, extra ...string) *e2eKey {
	s.t.Helper()
	args := append([]string{"keys", "create", "--data-dir", s.dataDir, "--pepper-file", s.pepperFile,
		"--principal", principal, "--class", class, "--capabilities", caps, "--scope", scope}, s.backendArgs...)
	args = append(args, extra...)
	out := s.runCLI(args...)
	var got struct {
		APIKey     string `json:"api_key"`
		Credential struct {
			CredentialID string `json:"credential_id"`
			PrincipalID  string `json:"principal_id"`
			Class        string `json:"class"`
		} `json:"credential"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		s.t.Fatalf("keys create output does not decode: %v", err)
	}
	m := apiKeyRE.FindStringSubmatch(got.APIKey)
	if m == nil || m[1] != got.Credential.CredentialID || got.Credential.PrincipalID != principal || got.Credential.Class != class {
		s.t.Fatalf("keys create printed an unexpected key or credential (principal %q class %q id %q)",
			got.Credential.PrincipalID, got.Credential.Class, got.Credential.CredentialID)
	}
	k := &e2eKey{Principal: principal, Class: class, APIKey: got.APIKey, CredentialID: m[1], Secret: m[2]}
	s.mu.Lock()
	s.keys = append(s.keys, k)
	s.mu.Unlock()
	return k
}

// revokeKey runs "starlease keys revoke".
func (s *e2eServer) revokeKey(k *e2eKey) {
	s.t.Helper()
	s.runCLI(append([]string{"keys", "revoke", "--data-dir", s.dataDir, "--id", k.CredentialID}, s.backendArgs...)...)
}

// rotateKey runs "starlease keys rotate" and returns the new key.
func (s *e2eServer) rotateKey(old *e2eKey) *e2eKey {
	s.t.Helper()
	out := s.runCLI(append([]string{"keys", "rotate", "--data-dir", s.dataDir, "--pepper-file", s.pepperFile, "--id", old.CredentialID}, s.backendArgs...)...)
	var got struct {
		APIKey     string `json:"api_key"`
		Credential struct {
			CredentialID string `json:"credential_id"`
			PrincipalID  string `json:"principal_id"`
		} `json:"credential"`
		Revoked string `json:"revoked"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		s.t.Fatalf("keys rotate output does not decode: %v", err)
	}
	m := apiKeyRE.FindStringSubmatch(got.APIKey)
	if m == nil || m[1] != got.Credential.CredentialID || got.Revoked != old.CredentialID || got.Credential.PrincipalID != old.Principal {
		s.t.Fatalf("keys rotate printed an unexpected key or credential (id %q, revoked %q)", got.Credential.CredentialID, got.Revoked)
	}
	k := &e2eKey{Principal: old.Principal, Class: old.Class, APIKey: got.APIKey, CredentialID: m[1], Secret: m[2]}
	s.mu.Lock()
	s.keys = append(s.keys, k)
	s.mu.Unlock()
	return k
}

// client returns a client package client authenticating with k.
func (s *e2eServer) client(k *e2eKey, opts ...client.Option) *client.Client {
	s.t.Helper()
	c, err := client.New(s.base, k.APIKey, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// rawResp is a raw HTTP answer.
type rawResp struct {
	Status int
	Header http.Header
	Body   []byte
	JSON   map[string]any
}

func (r rawResp) str(key string) string { v, _ := r.JSON[key].(string); return v }

func (r rawResp) code() string { return r.str("code") }

// rawReq is one raw request. Body is sent verbatim when it is a string or
// []byte, JSON-encoded otherwise. Headers may repeat a name.
type rawReq struct {
	Method string
	Path   string // after the host; apiBase is not added
	Key    string // "Bearer " + Key unless empty; Auth overrides
	Auth   []string
	Body   any
	Header [][2]string
}

var corrRE = regexp.MustCompile(`^corr_[0-9A-HJKMNP-TV-Z]{26}$`)

// do sends r and checks what every lease API answer must have: a JSON
// envelope with a status and a correlation_id, the X-Correlation-ID header
// equal to it, Cache-Control: no-store, and a status/code pair from the
// wire table. The row is recorded.
func (s *e2eServer) do(t *testing.T, r rawReq) rawResp {
	t.Helper()
	var body io.Reader
	switch b := r.Body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(r.Method, s.base+r.Path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.Key != "" {
		req.Header.Set("Authorization", "Bearer "+r.Key)
	}
	if r.Auth != nil {
		req.Header.Del("Authorization")
		for _, a := range r.Auth {
			req.Header.Add("Authorization", a)
		}
	}
	for _, h := range r.Header {
		if h[1] == "\x00delete" {
			req.Header.Del(h[0])
			continue
		}
		req.Header.Add(h[0], h[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", r.Method, r.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", r.Method, r.Path, err)
	}
	out := rawResp{Status: resp.StatusCode, Header: resp.Header, Body: b}
	if strings.HasPrefix(r.Path, apiBase) {
		if err := json.Unmarshal(b, &out.JSON); err != nil {
			t.Fatalf("%s %s: %d answer is not a JSON object: %q", r.Method, r.Path, resp.StatusCode, b)
		}
		corr := out.str("correlation_id")
		if corr == "" {
			t.Errorf("%s %s: %d answer without correlation_id: %s", r.Method, r.Path, resp.StatusCode, b)
		}
		if h := resp.Header.Values("X-Correlation-ID"); len(h) > 1 || len(h) == 1 && h[0] != corr {
			t.Errorf("%s %s: X-Correlation-ID header %q, body correlation_id %q", r.Method, r.Path, h, corr)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s %s: Cache-Control %q", r.Method, r.Path, cc)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s %s: Content-Type %q", r.Method, r.Path, ct)
		}
		s.rows.record(t, resp.StatusCode, lease.Code(out.code()), r.Method+" "+r.Path)
		if want := map[bool]string{true: "success", false: "error"}[resp.StatusCode == 200]; out.str("status") != want {
			t.Errorf("%s %s: %d answer with status %q", r.Method, r.Path, resp.StatusCode, out.str("status"))
		}
		if resp.StatusCode != 200 {
			checkErrorEnvelope(t, out)
		}
	}
	return out
}

// checkErrorEnvelope checks the contract's error envelope: exactly its
// fields, retryable always present and consistent with the code, and
// retry_after_ms exactly when retryable.
func checkErrorEnvelope(t *testing.T, r rawResp) {
	t.Helper()
	allowed := map[string]bool{"status": true, "code": true, "msg": true, "field": true, "correlation_id": true,
		"retryable": true, "retry_after_ms": true}
	for k := range r.JSON {
		if !allowed[k] {
			t.Errorf("error envelope with field %q: %s", k, r.Body)
		}
	}
	retryable, ok := r.JSON["retryable"].(bool)
	if !ok {
		t.Errorf("error envelope without retryable: %s", r.Body)
	}
	code := lease.Code(r.code())
	if retryable != code.Retryable() {
		t.Errorf("code %s with retryable %v: %s", code, retryable, r.Body)
	}
	if r.str("msg") == "" {
		t.Errorf("error envelope without msg: %s", r.Body)
	}
	ms, has := r.JSON["retry_after_ms"].(float64)
	switch {
	case retryable && (!has || ms <= 0):
		t.Errorf("retryable error without a positive retry_after_ms: %s", r.Body)
	case !retryable && has:
		t.Errorf("retry_after_ms on a non-retryable error: %s", r.Body)
	}
	if _, has := r.JSON["field"]; has && code != lease.CodeInvalidRequest {
		t.Errorf("field on a %s error: %s", code, r.Body)
	}
	if has && r.Header.Get("Retry-After") == "" {
		t.Errorf("retry_after_ms without a Retry-After header: %s", r.Body)
	}
}

// rowRecorder notes every (status, code) pair the servers answered.
type rowRecorder struct {
	mu   sync.Mutex
	seen map[string]string // "409 lease_lost" → first request that produced it
}

func newRowRecorder() *rowRecorder { return &rowRecorder{seen: map[string]string{}} }

// wireTable is the contract's wire table, with 404 lease_not_found which
// the table allows on inspect and list.
var wireTable = map[string]bool{
	"200 lease_acquired": true, "200 lease_renewed": true, "200 lease_released": true,
	"200 lease_inspected": true, "200 lease_listed": true, "200 lease_revoked": true,
	"400 invalid_lease_request": true, "401 invalid_credential": true, "403 access_denied": true,
	"404 lease_not_found": true, "408 deadline_exceeded": true,
	"409 lease_conflict": true, "409 lease_lost": true, "409 idempotency_conflict": true,
	"429 lease_rate_limited":        true,
	"503 lease_backend_unavailable": true, "503 lease_outcome_unknown": true,
}

func (r *rowRecorder) record(t *testing.T, status int, code lease.Code, what string) {
	t.Helper()
	row := fmt.Sprintf("%d %s", status, code)
	if !wireTable[row] {
		t.Errorf("%s: answer %q is not a row of the contract's wire table", what, row)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.seen[row]; !ok {
		r.seen[row] = what
	}
}

// missing lists the wire-table rows never answered.
func (r *rowRecorder) missing() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for row := range wireTable {
		if _, ok := r.seen[row]; !ok {
			out = append(out, row)
		}
	}
	sort.Strings(out)
	return out
}

func (r *rowRecorder) report(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rows []string
	for row, what := range r.seen {
		rows = append(rows, row+"  ← "+what)
	}
	sort.Strings(rows)
	t.Logf("wire-table rows produced end to end:\n  %s", strings.Join(rows, "\n  "))
}

// okLease records and checks a client lease result.
func okLease(t *testing.T, s *e2eServer, res *client.LeaseResult, err error, want lease.Code) *client.LeaseResult {
	t.Helper()
	if err != nil {
		t.Fatalf("want %s, got %v", want, err)
	}
	s.rows.record(t, 200, res.Code, "client "+string(want))
	if res.Code != want {
		t.Fatalf("code %s, want %s", res.Code, want)
	}
	if res.CorrelationID == "" {
		t.Fatalf("result without correlation id")
	}
	return res
}

// wantErr records and checks a client error.
func wantErr(t *testing.T, s *e2eServer, err error, status int, code lease.Code) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want %d %s, got %v", status, code, err)
	}
	if ce.Status != 0 {
		s.rows.record(t, ce.Status, ce.Code, "client")
	}
	if ce.Status != status || ce.Code != code {
		t.Fatalf("want %d %s, got %v", status, code, err)
	}
	if lease.CodeOf(err) != code {
		t.Fatalf("lease.CodeOf = %s, want %s", lease.CodeOf(err), code)
	}
	if ce.CorrelationID == "" {
		t.Fatalf("error without correlation id: %v", err)
	}
	return ce
}

// identity is a lock identity in tenant-a/program-a.
func identity(target, actor string) lease.Identity {
	return lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: target, ActorName: actor}
}

// canonical is id with its defaults, as the server answers it.
func canonical(id lease.Identity) lease.Identity {
	if id.WorkflowName == "" {
		id.WorkflowName = "default"
	}
	if id.OperationClass == "" {
		id.OperationClass = "default"
	}
	return id
}

// acquireBody is a valid raw acquire body.
func acquireBody(id lease.Identity, requestID string) map[string]any {
	return map[string]any{
		"lock_identity": map[string]any{"tenant_id": id.TenantID, "program_id": id.ProgramID,
			"target_namespace": id.TargetNamespace, "target_id": id.TargetID, "actor_name": id.ActorName},
		"ttl_ms": 30000, "service_instance_id": "inst-raw", "execution_id": "exec-raw", "job_id": "job-raw",
		"request_id": requestID,
	}
}

// with returns a copy of m with k set (or deleted when v is nil).
func with(m map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
		} else {
			out[kv[i].(string)] = kv[i+1]
		}
	}
	return out
}

// leaseOf decodes the "lease" object of a raw success answer.
func leaseOf(t *testing.T, r rawResp, key string) map[string]any {
	t.Helper()
	l, ok := r.JSON[key].(map[string]any)
	if !ok {
		t.Fatalf("answer without %s: %s", key, r.Body)
	}
	return l
}

func num(v any) uint64 { f, _ := v.(float64); return uint64(f) }

// uniqueID is a fresh request or correlation id with a prefix.
func uniqueID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// readFileOrEmpty reads a file, or nil if it does not exist.
func readFileOrEmpty(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return b
}
