package httpapi

// Outside adversarial review of the issue 11 fixes (i11-attack), over the
// HTTP API in process (httptest, bolt): each test asserts a guarantee and
// fails if it is broken.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
)

type attackServer struct {
	srv    *Server
	audit  *audittest.Recorder
	holder string
	admin  string
	n      int
}

func newAttackServer(t *testing.T) *attackServer {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rec := &audittest.Recorder{}
	red, err := audit.NewRedactor(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(store, rec, service.Options{Redactor: red, Config: service.Config{PrincipalRate: 1e6, PrincipalBurst: 1e6,
		TargetRate: 1e6, TargetBurst: 1e6, MaxConcurrent: 4096, MaxActivePerPrincipal: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	creds := auth.NewMemoryStore()
	pepper, err := auth.NewPepper(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	scope, _ := auth.ParseScope("tenant:*,program:*")
	holder, _, err := auth.Issue(t.Context(), creds, pepper, auth.IssueRequest{PrincipalID: "prn-holder", Class: auth.ClassServiceInstance,
		Capabilities: []auth.Capability{auth.CapLease, auth.CapRead}, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	admin, _, err := auth.Issue(t.Context(), creds, pepper, auth.IssueRequest{PrincipalID: "prn-admin", Class: auth.ClassAdministrator,
		Capabilities: []auth.Capability{auth.CapForceRelease, auth.CapRead, auth.CapAuditRead}, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.NewAuthenticator(creds, pepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &attackServer{srv: New(svc, authn, rec, Options{}), audit: rec, holder: holder, admin: admin}
}

// do sends one request and returns the status, the decoded body and the
// number of audit events it produced.
func (s *attackServer) do(t *testing.T, key, method, path string, body any, header ...string) (int, map[string]any, int) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	before := s.audit.Len()
	w := httptest.NewRecorder()
	s.srv.ServeHTTP(w, req)
	var out map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out, s.audit.Len() - before
}

func (s *attackServer) rid(p string) string { s.n++; return fmt.Sprintf("%s-%d", p, s.n) }

// poison are caller-chosen values shaped like secrets, digests or
// redactions (issue 11 §2), valid as identifiers where that matters.
var poison = map[string]string{
	"hex64":         strings.Repeat("ab12", 16),
	"HEX64":         strings.Repeat("AB12", 16),
	"hex64-prefix":  "sha256:" + strings.Repeat("0f", 32),
	"hex128":        strings.Repeat("e3b0c442", 16),
	"redacted":      "redacted",
	"REDACTED-form": "REDACTED:" + strings.Repeat("a", 32),
	"redacted-form": "redacted:" + strings.Repeat("0", 32),
	"long256":       strings.Repeat("x", 256-64) + strings.Repeat("c", 64),
}

// Issue 11 §2 over HTTP, every route, every caller-chosen identifier: each
// request is answered (never 503 because of a value) and writes exactly one
// audit event (two for revoke/force-release: attempt and result), and an
// administrator revokes or force-releases a lease whose every identifier
// is secret-shaped.
func TestAttackPoisonedIdentifiersAuditedEverywhere(t *testing.T) {
	s := newAttackServer(t)
	for name, v := range poison {
		t.Run(name, func(t *testing.T) {
			id := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
				"target_namespace": "web", "target_id": v, "actor_name": "crawler"}
			if name == "redacted" || strings.HasPrefix(name, "REDACTED") || strings.HasPrefix(name, "redacted") {
				// keep target id canonical-able
				id["target_id"] = strings.ToLower(v)
			}
			pre := v
			if len(pre) > 20 {
				pre = pre[:20]
			}
			if len(id["target_id"]) < 200 {
				id["target_id"] = fmt.Sprintf("t%d.%s", len(name)*7+int(name[0]), id["target_id"])
			}
			corr := v
			if len(corr) > 128 {
				corr = corr[:128]
			}
			acq := map[string]any{"lock_identity": id, "ttl_ms": 30000, "service_instance_id": "inst-" + strings.ToLower(pre[:8]),
				"execution_id": v, "job_id": v, "trace_id": v, "request_id": s.rid(pre)}
			st, body, evs := s.do(t, s.holder, "POST", Base+"/acquire", acq, "X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 1 {
				t.Fatalf("acquire with %s identifiers: %d %v, %d audit events", name, st, body["code"], evs)
			}
			l := body["lease"].(map[string]any)
			leaseID := l["lease_id"].(string)
			token := l["fencing_token"]
			inst := acq["service_instance_id"]
			st, body, evs = s.do(t, s.holder, "POST", Base+"/"+leaseID+"/renew", map[string]any{"lock_identity": id,
				"fencing_token": token, "service_instance_id": inst, "request_id": s.rid(pre)}, "X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 1 {
				t.Errorf("renew: %d %v, %d events", st, body["code"], evs)
			}
			st, body, evs = s.do(t, s.holder, "POST", Base+"/commits/authorize", map[string]any{"lock_identity": id,
				"lease_id": leaseID, "fencing_token": token, "service_instance_id": inst, "sink": "couchdb",
				"commit_id": v, "execution_id": v, "job_id": v, "trace_id": v, "target": v,
				"payload_sha256": strings.Repeat("0", 64)}, "X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 1 {
				t.Errorf("commit: %d %v, %d events", st, body["code"], evs)
			}
			st, body, evs = s.do(t, s.holder, "GET", Base+"/"+leaseID, nil, "X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 1 {
				t.Errorf("inspect by id: %d %v, %d events", st, body["code"], evs)
			}
			st, body, evs = s.do(t, s.holder, "GET", Base+"?tenant_id=tenant-main&program_id=program-a&target_namespace=web&target_id="+
				id["target_id"], nil, "X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 1 {
				t.Errorf("list by target: %d %v, %d events", st, body["code"], evs)
			}
			op := "revoke"
			if len(name)%2 == 0 {
				op = "force-release"
			}
			st, body, evs = s.do(t, s.admin, "POST", Base+"/"+leaseID+"/"+op, map[string]any{"lock_identity": id,
				"fencing_token": token, "reason": "incident drill", "request_id": s.rid(pre)},
				"X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 2 {
				t.Errorf("%s of a lease with %s identifiers: %d %v %v, %d events", op, name, st, body["code"], body["msg"], evs)
			}
			st, body, evs = s.do(t, s.admin, "GET", Base+"/"+leaseID+"/history", nil, "X-Correlation-ID", corr)
			if st != http.StatusOK || evs != 1 {
				t.Errorf("history: %d %v, %d events", st, body["code"], evs)
			}
			// Stale holder after the admin action: refused and audited.
			st, body, evs = s.do(t, s.holder, "POST", Base+"/commits/authorize", map[string]any{"lock_identity": id,
				"lease_id": leaseID, "fencing_token": token, "service_instance_id": inst, "sink": "couchdb",
				"commit_id": "c-2", "execution_id": v, "job_id": v, "target": "doc-2"}, "X-Correlation-ID", corr)
			if st != http.StatusConflict || evs != 1 {
				t.Errorf("stale commit: %d %v, %d events", st, body["code"], evs)
			}
			// No event holds the raw value.
			for _, e := range s.audit.Events() {
				b, _ := json.Marshal(e)
				if lease.SecretShaped(v) && strings.Contains(strings.ToLower(string(b)), strings.ToLower(v)) {
					t.Fatalf("an audit event holds the secret-shaped value %q: %s", v, b)
				}
			}
		})
	}
}

// Malformed caller values (not identifiers at all) on every mutating
// route: 400, one audit event each, never 503.
func TestAttackMalformedValuesAudited(t *testing.T) {
	s := newAttackServer(t)
	id := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a", "target_namespace": "web",
		"target_id": "malformed.example", "actor_name": "crawler"}
	bad := []string{"star_sk_v1_01H00000000000000000000000_" + strings.Repeat("a", 64), "Bearer abc",
		"a b", strings.Repeat("z", 300), "é\u200b", "../x", "x\x00y"}
	for i, v := range bad {
		for _, field := range []string{"request_id", "execution_id", "job_id", "trace_id", "service_instance_id"} {
			acq := map[string]any{"lock_identity": id, "ttl_ms": 30000, "service_instance_id": "inst-1",
				"execution_id": "e", "job_id": "j", "request_id": s.rid("m")}
			acq[field] = v
			st, body, evs := s.do(t, s.holder, "POST", Base+"/acquire", acq, "X-Correlation-ID", v)
			if st != http.StatusBadRequest || evs != 1 {
				t.Errorf("acquire, %s = bad[%d]: %d %v, %d events", field, i, st, body["code"], evs)
			}
		}
		for _, field := range []string{"reason", "incident_id", "request_id"} {
			adm := map[string]any{"lock_identity": id, "fencing_token": 1, "reason": "r", "request_id": s.rid("a")}
			adm[field] = v
			st, body, evs := s.do(t, s.admin, "POST", Base+"/lease-x/revoke", adm)
			if st == http.StatusServiceUnavailable || evs < 1 {
				t.Errorf("revoke, %s = bad[%d]: %d %v, %d events", field, i, st, body["code"], evs)
			}
		}
	}
}

// The README says "No caller-chosen value can make an event invalid,
// suppress it, or make a force-release or revoke fail", and issue 11 §2
// lists an admin's incident_id or reason holding a digest among the values
// that blocked revoke. The fix refuses such a revoke with 400 instead of
// 503 (README: "such a value is refused"): an incident id from a ticketing
// system or SIEM that is a SHA-256 (or a reason quoting the SHA-256 target
// id the lease is for) still makes the revoke fail.
func TestAttackAdminIncidentDigestDoesNotBlockRevoke(t *testing.T) {
	s := newAttackServer(t)
	digest := strings.Repeat("5e", 32)
	for i, adm := range []map[string]any{
		{"incident_id": digest},
		{"incident_id": "inc-" + digest},
		{"reason": "target sha256 " + digest + " leaked credentials upstream"},
	} {
		id := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a", "target_namespace": "web",
			"target_id": fmt.Sprintf("incident-%d.example", i), "actor_name": "crawler"}
		st, body, _ := s.do(t, s.holder, "POST", Base+"/acquire", map[string]any{"lock_identity": id, "ttl_ms": 30000,
			"service_instance_id": "inst-1", "execution_id": "e", "job_id": "j", "request_id": s.rid("inc")})
		if st != http.StatusOK {
			t.Fatal(st, body)
		}
		l := body["lease"].(map[string]any)
		adm["lock_identity"], adm["fencing_token"], adm["request_id"] = id, l["fencing_token"], s.rid("rv")
		st, body, evs := s.do(t, s.admin, "POST", Base+"/"+l["lease_id"].(string)+"/revoke", adm)
		if st != http.StatusOK || evs != 2 {
			t.Errorf("revoke with %v: %d %v %v (%d events); the lease stays active", adm["incident_id"], st, body["code"], body["msg"], evs)
		}
	}
}
