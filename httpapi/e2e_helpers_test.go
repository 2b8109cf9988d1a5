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
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// This file holds the machinery of e2e_test.go: building the real
// starlease binary, running "starlease serve" and "starlease keys" as
// processes, raw HTTP requests and bookkeeping of the wire-table rows seen.

const apiBase = "/api/v1/target-leases"

// e2eKey is an API key created with "starlease keys create".
type e2eKey struct {
	Principal    string
	Class        string
	APIKey       string
	CredentialID string
	Secret       string // the 64 hex characters after the credential id
}

// e2eServer is a running "starlease serve" process, with the keys created
// for it and the recorder of the wire-table rows it answered.
type e2eServer struct {
	*testenv.Starlease
	t    *testing.T
	rows *rowRecorder

	mu   sync.Mutex
	keys []*e2eKey
}

// startServer starts "starlease serve" (testenv.StartStarlease) and, in
// t.Cleanup, checks that it shuts down cleanly on SIGTERM.
func startServer(t *testing.T, bin string, rows *rowRecorder, extra ...string) *e2eServer {
	t.Helper()
	s := &e2eServer{Starlease: testenv.StartStarlease(t, bin, extra...), t: t, rows: rows}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("starlease serve did not shut down cleanly on SIGTERM: %v\nstderr:\n%s", err, s.Stderr())
		}
	})
	return s
}

// secretOf is the 64 hex characters after the credential id of an API key.
func secretOf(apiKey string) string { return apiKey[len(apiKey)-64:] }

// createKey runs "starlease keys create" against the server's data
// directory while it runs.
func (s *e2eServer) createKey(principal, class, caps, scope string, extra ...string) *e2eKey {
	s.t.Helper()
	apiKey, id := s.CreateKey(principal, class, caps, scope, extra...)
	k := &e2eKey{Principal: principal, Class: class, APIKey: apiKey, CredentialID: id, Secret: secretOf(apiKey)}
	s.mu.Lock()
	s.keys = append(s.keys, k)
	s.mu.Unlock()
	return k
}

// revokeKey runs "starlease keys revoke".
func (s *e2eServer) revokeKey(k *e2eKey) {
	s.t.Helper()
	s.RevokeKey(k.CredentialID)
}

// rotateKey runs "starlease keys rotate" and returns the new key.
func (s *e2eServer) rotateKey(old *e2eKey) *e2eKey {
	s.t.Helper()
	apiKey, id := s.RotateKey(old.CredentialID)
	k := &e2eKey{Principal: old.Principal, Class: old.Class, APIKey: apiKey, CredentialID: id, Secret: secretOf(apiKey)}
	s.mu.Lock()
	s.keys = append(s.keys, k)
	s.mu.Unlock()
	return k
}

// client returns a client package client authenticating with k.
func (s *e2eServer) client(k *e2eKey, opts ...client.Option) *client.Client {
	s.t.Helper()
	c, err := client.New(s.URL(), k.APIKey, opts...)
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
	req, err := http.NewRequest(r.Method, s.URL()+r.Path, body)
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
