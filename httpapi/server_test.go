package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
	"github.com/starintel/starlease/wire"
)

// testServer is a Server on a temporary bolt store with one issued key.
type testServer struct {
	*Server
	key   string
	audit *audittest.Recorder
}

func newTestServer(t testing.TB) *testServer {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rec := &audittest.Recorder{}
	svc, err := service.New(store, rec, service.Options{Config: service.Config{PrincipalRate: 1e6, PrincipalBurst: 1e6,
		TargetRate: 1e6, TargetBurst: 1e6, MaxConcurrent: 4096, MaxActivePerPrincipal: 100}})
	if err != nil {
		t.Fatal(err)
	}
	creds := auth.NewMemoryStore()
	pepper, err := auth.NewPepper(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	scope, err := auth.ParseScope("tenant:*,program:*")
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := auth.Issue(t.Context(), creds, pepper, auth.IssueRequest{PrincipalID: "prn-bench", Class: auth.ClassServiceInstance,
		Capabilities: []auth.Capability{auth.CapLease, auth.CapRead}, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.NewAuthenticator(creds, pepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &testServer{Server: New(svc, authn, rec, Options{}), key: key, audit: rec}
}

func (s *testServer) do(t testing.TB, method, path string, body any, header ...string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req := httptest.NewRequest(method, path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %s: body is not JSON: %q", method, path, rec.Body.String())
	}
	return rec, out
}

var httpIdentity = map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
	"target_namespace": "web", "target_id": "example.com", "actor_name": "crawler"}

func acquireBodyFor(id map[string]string, requestID string) map[string]any {
	return map[string]any{"lock_identity": id, "ttl_ms": 30000, "service_instance_id": "inst-1",
		"execution_id": "exec-1", "job_id": "job-1", "request_id": requestID}
}

func TestAcquireRenewReleaseEnvelopes(t *testing.T) {
	s := newTestServer(t)
	rec, out := s.do(t, "POST", Base+"/acquire", acquireBodyFor(httpIdentity, "req-1"), "X-Correlation-ID", "corr-test-1")
	if rec.Code != 200 || out["status"] != "success" || out["code"] != "lease_acquired" || out["correlation_id"] != "corr-test-1" {
		t.Fatalf("acquire: %d %v", rec.Code, out)
	}
	l := out["lease"].(map[string]any)
	if l["fencing_token"].(float64) != 1 || l["state"] != "active" || l["ttl_ms"].(float64) != 30000 {
		t.Fatalf("lease: %v", l)
	}
	for _, private := range []string{"owner_principal_id", "owner_credential_id", "metadata", "lock_key", "request_id"} {
		if _, ok := l[private]; ok {
			t.Errorf("success envelope discloses %s", private)
		}
	}
	id := l["lease_id"].(string)
	rec, out = s.do(t, "POST", Base+"/"+id+"/renew", map[string]any{"lock_identity": httpIdentity, "fencing_token": 1,
		"service_instance_id": "inst-1", "request_id": "req-2"})
	if rec.Code != 200 || out["code"] != "lease_renewed" {
		t.Fatalf("renew: %d %v", rec.Code, out)
	}
	rec, out = s.do(t, "POST", Base+"/"+id+"/renew", map[string]any{"lock_identity": httpIdentity, "fencing_token": 2,
		"service_instance_id": "inst-1", "request_id": "req-3"})
	if rec.Code != 409 || out["code"] != "lease_lost" || out["retryable"] != false {
		t.Fatalf("stale renew: %d %v", rec.Code, out)
	}
	rec, out = s.do(t, "DELETE", Base+"/"+id, map[string]any{"lock_identity": httpIdentity, "fencing_token": 1,
		"service_instance_id": "inst-1"}, "Idempotency-Key", "req-4")
	if rec.Code != 200 || out["code"] != "lease_released" || out["lease"].(map[string]any)["state"] != "released" {
		t.Fatalf("release: %d %v", rec.Code, out)
	}
}

func TestStrictBodies(t *testing.T) {
	s := newTestServer(t)
	for name, tc := range map[string]struct {
		raw, field string
	}{
		"unknown field":   {`{"lock_identity":{},"ttl":5}`, "ttl"},
		"trailing data":   {`{"request_id":"r"} {}`, "body"},
		"duplicate key":   {`{"request_id":"a","request_id":"b"}`, "body"},
		"not UTF-8":       {"{\"request_id\":\"r\xff\"}", "body"},
		"wrong type":      {`{"ttl_ms":"5"}`, "ttl_ms"},
		"not an object":   {`[]`, "body"},
		"empty body":      {``, "body"},
		"oversize":        {`{"trace_id":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, "body"},
		"no lock ident":   {`{"request_id":"r","ttl_ms":30000}`, "lock_identity"},
		"missing request": {`{"lock_identity":{"tenant_id":"t","program_id":"p","target_namespace":"n","target_id":"x","actor_name":"a"},"ttl_ms":30000}`, "request_id"},
	} {
		req := httptest.NewRequest("POST", Base+"/acquire", strings.NewReader(tc.raw))
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var out wire.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 400 || out.Code != string(lease.CodeInvalidRequest) || out.Field != tc.field {
			t.Errorf("%s: %d %+v (%v)", name, rec.Code, out, err)
		}
	}
}

func TestUnauthorizedIsUniform(t *testing.T) {
	s := newTestServer(t)
	bodies := map[string]bool{}
	wrong := "0"
	if strings.HasSuffix(s.key, "0") {
		wrong = "1"
	}
	for _, h := range [][]string{nil, {"Basic abc"}, {"Bearer " + s.key, "Bearer " + s.key}, {"Bearer star_sk_v1_x"},
		{"Bearer " + s.key[:len(s.key)-1] + wrong}} {
		req := httptest.NewRequest("GET", Base+"/lease_01X", nil)
		for _, v := range h {
			req.Header.Add("Authorization", v)
		}
		req.Header.Set("X-Correlation-ID", "corr-fixed")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 401 || rec.Header().Get("WWW-Authenticate") == "" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("%v: %d %v", h, rec.Code, rec.Header())
		}
		bodies[rec.Body.String()] = true
	}
	if len(bodies) != 1 {
		t.Fatalf("401 bodies differ: %v", bodies)
	}
}

func TestMetrics(t *testing.T) {
	s := newTestServer(t)
	s.do(t, "POST", Base+"/acquire", acquireBodyFor(httpIdentity, "req-m1"))
	s.do(t, "POST", Base+"/acquire", acquireBodyFor(httpIdentity, "req-m2")) // conflict
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`starlease_operations_total{code="lease_acquired",operation="acquire"} 1`,
		`starlease_operations_total{code="lease_conflict",operation="acquire"} 1`,
		`starlease_active_leases 1`,
		`starlease_backend_healthy 1`,
		`starlease_operation_duration_seconds_count{operation="acquire"} 2`,
		`starlease_outbox_pending_entries 0`,
		`starlease_outbox_pending_bytes 0`,
		`starlease_outbox_max_pending_entries 100000`,
		`starlease_outbox_max_bytes 2.68435456e+08`,
		`starlease_outbox_fill_ratio 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// fakeMeter reports a fixed outbox usage.
type fakeMeter struct {
	u   lease.OutboxUsage
	err error
}

func (f fakeMeter) OutboxUsage(context.Context) (lease.OutboxUsage, error) { return f.u, f.err }

// The outbox's /readyz component: ok below OutboxNearFull of either bound,
// degraded near and at it (publications are refused only at it), and
// degraded when its usage cannot be read.
func TestOutboxReadiness(t *testing.T) {
	for _, c := range []struct {
		u      lease.OutboxUsage
		err    error
		status string
		reason string
	}{
		{u: lease.OutboxUsage{Pending: 0, Bytes: 0, MaxPending: 10, MaxBytes: 1000}, status: "ok"},
		{u: lease.OutboxUsage{Pending: 8, Bytes: 899, MaxPending: 10, MaxBytes: 1000}, status: "ok"},
		{u: lease.OutboxUsage{Pending: 9, Bytes: 10, MaxPending: 10, MaxBytes: 1000}, status: "degraded", reason: "90% of its bound"},
		{u: lease.OutboxUsage{Pending: 1, Bytes: 950, MaxPending: 10, MaxBytes: 1000}, status: "degraded", reason: "95% of its bound"},
		{u: lease.OutboxUsage{Pending: 10, Bytes: 10, MaxPending: 10, MaxBytes: 1000}, status: "degraded", reason: "full"},
		{u: lease.OutboxUsage{Pending: 1, Bytes: 1000, MaxPending: 10, MaxBytes: 1000}, status: "degraded", reason: "full"},
		{err: lease.Errorf(lease.CodeBackendUnavailable, "down"), status: "degraded", reason: "cannot be read"},
	} {
		h := outboxHealth(fakeMeter{c.u, c.err})(context.Background())
		if h.Status != c.status || !strings.Contains(h.Reason, c.reason) {
			t.Errorf("usage %+v (%v): %+v, want %s %q", c.u, c.err, h, c.status, c.reason)
		}
	}
}

// A request refused by the adapter (malformed body) is still audited: one
// event per request, whatever the result.
func TestRejectedRequestsAreAudited(t *testing.T) {
	s := newTestServer(t)
	before := len(s.audit.Events())
	req := httptest.NewRequest("POST", Base+"/acquire", strings.NewReader(`{"nope":1}`))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Correlation-ID", "corr-rejected")
	s.ServeHTTP(httptest.NewRecorder(), req)
	evs := s.audit.Events()
	if len(evs) != before+1 {
		t.Fatalf("want one event for the rejected request, got %d", len(evs)-before)
	}
	ev := evs[len(evs)-1]
	if ev.EventType != "target_lease_acquire" || ev.ResultCode != lease.CodeInvalidRequest || ev.Decision != "deny" ||
		ev.CorrelationID != "corr-rejected" || ev.PrincipalID != "prn-bench" {
		t.Fatalf("event: %+v", ev)
	}
}
