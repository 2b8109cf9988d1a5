package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/lease"
)

// Review of session 46: a request to one of the API's routes that
// ServeHTTP refuses before routing (a header block over MaxHeaderBytes, a
// Content-Length net/http did not parse) got the envelope but no audit
// event, and its key was never checked. It now reaches its route, which
// authenticates it and audits the refusal as that route's, like a
// malformed body; a wrong key is a 401 and an authentication failure.
func TestS46RefusalsBeforeRoutingAreAudited(t *testing.T) {
	s := newAttackServer(t)
	acq := map[string]any{"lock_identity": map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
		"target_namespace": "web", "target_id": "refused.example", "actor_name": "crawler"},
		"ttl_ms": 30000, "service_instance_id": "inst-1", "execution_id": "exec-1", "job_id": "job-1", "request_id": s.rid("acq")}
	pad := []string{"X-Pad", strings.Repeat("a", MaxHeaderBytes+1)}

	st, body, evs := s.do(t, s.holder, "POST", Base+"/acquire", acq, pad...)
	if st != http.StatusBadRequest || body["code"] != string(lease.CodeInvalidRequest) || body["field"] != "headers" || evs != 1 {
		t.Fatalf("acquire with a header block over the limit: %d %v, %d events; want 400 field headers and one event", st, body, evs)
	}
	all := s.audit.Events()
	e := all[len(all)-1]
	if e.EventType != audit.EventAcquire || e.ResultCode != lease.CodeInvalidRequest || e.Decision != audit.DecisionDeny ||
		e.PrincipalID != "prn-holder" {
		t.Fatalf("its event: %s %s %s by %q; want target_lease_acquire, invalid_lease_request, deny, prn-holder",
			e.EventType, e.ResultCode, e.Decision, e.PrincipalID)
	}
	// Nothing was acquired: the refusal stands before the route's work.
	st, body, _ = s.do(t, s.holder, "GET", Base+"?owner_principal_id=prn-holder", nil)
	if leases, _ := body["leases"].([]any); st != http.StatusOK || body["code"] != "lease_listed" || len(leases) != 0 {
		t.Fatalf("list after the refused acquire: %d %v, want no lease", st, body)
	}

	// A wrong key with the same headers is an authentication failure.
	wrong := "star_sk_v1_01H00000000000000000000000_" + strings.Repeat("0", 64)
	st, body, evs = s.do(t, wrong, "POST", Base+"/acquire", acq, pad...)
	if st != http.StatusUnauthorized || evs != 1 {
		t.Fatalf("wrong key, header block over the limit: %d %v, %d events; want 401 and one event", st, body, evs)
	}
	all = s.audit.Events()
	if e := all[len(all)-1]; e.EventType != audit.EventAuthFailed {
		t.Fatalf("its event is %s, want target_lease_auth_failed", e.EventType)
	}

	// What names no route is still answered before any handler, unaudited:
	// an unclean path, and the health endpoints keep their refusal.
	if st, body, evs := s.do(t, s.holder, "POST", Base+"/x/../acquire", acq); st != http.StatusNotFound || evs != 0 {
		t.Fatalf("unclean path: %d %v, %d events; want 404 and none", st, body, evs)
	}
	if st, body, _ := s.do(t, s.holder, "GET", "/healthz", nil, pad...); st != http.StatusBadRequest || body["field"] != "headers" {
		t.Fatalf("healthz with a header block over the limit: %d %v, want the 400 it had", st, body)
	}
}

// Second review of session 46: with a header block over the limit, a path
// that is not clean went on to ServeMux (the header refusal was reported
// first), which redirected it (307, no envelope, no key checked); and the
// refusal was answered before the capability check, so a key without
// targets:force-release got 400 instead of 403. An unclean path is now the
// unknown-route 404 whatever else is wrong, and the refusal comes after
// credential and capability, as a malformed body's does.
func TestS46RefusalsKeepRouteAndCapabilityOrder(t *testing.T) {
	s := newAttackServer(t)
	pad := []string{"X-Pad", strings.Repeat("a", MaxHeaderBytes+1)}
	fr := map[string]any{"lock_identity": map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
		"target_namespace": "web", "target_id": "order.example", "actor_name": "crawler"},
		"fencing_token": 1, "reason": "drill", "request_id": s.rid("fr")}
	for _, path := range []string{Base + "/l1/../l2/force-release", Base + "/./acquire", Base + "//acquire"} {
		st, body, evs := s.do(t, s.admin, "POST", path, fr, pad...)
		if st != http.StatusNotFound || body["code"] != string(lease.CodeNotFound) || evs != 0 {
			t.Errorf("%s with a header block over the limit: %d %v, %d events; want the unknown-route 404 and none", path, st, body, evs)
		}
	}
	for _, op := range []string{"force-release", "revoke"} {
		st, body, evs := s.do(t, s.holder, "POST", Base+"/lease_x/"+op, fr, pad...)
		all := s.audit.Events()
		if st != http.StatusForbidden || body["code"] != string(lease.CodeAccessDenied) || evs != 1 ||
			all[len(all)-1].ResultCode != lease.CodeAccessDenied {
			t.Errorf("%s by a key without targets:force-release, header block over the limit: %d %v, %d events; want 403 access_denied, audited",
				op, st, body, evs)
		}
	}
}

// From the first review of session 46, probes that held: mix-ups of lease
// id, token, identity and case, and replays of a commit id for another
// write, after a force-release and by the successor.
func TestS46FencingProbesHold(t *testing.T) {
	s := newAttackServer(t)
	idA, leaseA, tokA := s46Acquire(t, s, "probe-a.example")
	idB, leaseB, tokB := s46Acquire(t, s, "probe-b.example")
	type probe struct {
		name string
		body map[string]any
		want int
	}
	probes := []probe{
		{"lease id of B with identity/token of A", s46Commit(idA, leaseB, tokA, s.rid("c"), "d"), http.StatusConflict},
		{"identity B with lease/token of A", s46Commit(idB, leaseA, tokA, s.rid("c"), "d"), http.StatusConflict},
		{"token of B with lease of B on A", s46Commit(idA, leaseB, tokB, s.rid("c"), "d"), http.StatusConflict},
		{"lease id upper-cased", s46Commit(idA, strings.ToUpper(leaseA), tokA, s.rid("c"), "d"), http.StatusConflict},
		{"lease id lower-cased", s46Commit(idA, strings.ToLower(leaseA), tokA, s.rid("c"), "d"), http.StatusConflict},
		{"token+1", s46Commit(idA, leaseA, num64(tokA)+1, s.rid("c"), "d"), http.StatusConflict},
	}
	for _, p := range probes {
		st, body, evs := s.do(t, s.holder, "POST", Base+"/commits/authorize", p.body)
		if st != p.want || evs != 1 {
			t.Errorf("%s: %d %v (%d events), want %d", p.name, st, body, evs, p.want)
		}
	}
	// Replay of A's commit id for another document, and after revoke.
	st, body, _ := s.do(t, s.holder, "POST", Base+"/commits/authorize", s46Commit(idA, leaseA, tokA, "c-fixed", "doc-1"))
	if st != http.StatusOK {
		t.Fatal(st, body)
	}
	st, body, _ = s.do(t, s.holder, "POST", Base+"/commits/authorize", s46Commit(idA, leaseA, tokA, "c-fixed", "doc-2"))
	if st != http.StatusConflict || body["code"] != "idempotency_conflict" {
		t.Errorf("same commit id, other doc: %d %v", st, body)
	}
	st, body, _ = s.do(t, s.admin, "POST", Base+"/"+leaseA+"/force-release", map[string]any{"lock_identity": idA,
		"fencing_token": tokA, "reason": "drill", "request_id": s.rid("fr")})
	if st != http.StatusOK {
		t.Fatal(st, body)
	}
	// Successor (same principal, same instance) takes over.
	_, leaseA2, tokA2 := s46Acquire(t, s, "probe-a.example")
	if leaseA2 == leaseA || num64(tokA2) <= num64(tokA) {
		t.Fatalf("successor %s/%v vs %s/%v", leaseA2, tokA2, leaseA, tokA)
	}
	// The successor's guard under the old commit id: conflict, not a reuse.
	st, body, _ = s.do(t, s.holder, "POST", Base+"/commits/authorize", s46Commit(idA, leaseA2, tokA2, "c-fixed", "doc-1"))
	if st != http.StatusConflict {
		t.Errorf("successor reusing commit id: %d %v", st, body)
	}
	// The stale lease with the old commit id and another document.
	st, body, _ = s.do(t, s.holder, "POST", Base+"/commits/authorize", s46Commit(idA, leaseA, tokA, "c-fixed", "doc-9"))
	if st != http.StatusConflict {
		t.Errorf("stale commit id other doc: %d %v", st, body)
	}
	// Case variants of the identity reach the same lock (normalized) but
	// the stale lease is still refused.
	up := map[string]string{}
	for k, v := range idA {
		up[k] = strings.ToUpper(v)
	}
	st, body, _ = s.do(t, s.holder, "POST", Base+"/commits/authorize", s46Commit(up, leaseA, tokA, s.rid("c"), "doc-x"))
	if st != http.StatusConflict {
		t.Errorf("upper-cased identity, stale lease: %d %v", st, body)
	}
	st, body, _ = s.do(t, s.holder, "POST", Base+"/commits/authorize", s46Commit(up, leaseA2, tokA2, s.rid("c"), "doc-x"))
	if st != http.StatusOK {
		t.Errorf("upper-cased identity, live lease: %d %v", st, body)
	}
}

func s46Acquire(t *testing.T, s *attackServer, target string) (map[string]string, string, any) {
	t.Helper()
	id := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a", "target_namespace": "web",
		"target_id": target, "actor_name": "crawler"}
	st, body, _ := s.do(t, s.holder, "POST", Base+"/acquire", map[string]any{"lock_identity": id, "ttl_ms": 30000,
		"service_instance_id": "inst-1", "execution_id": "exec-1", "job_id": "job-1", "request_id": s.rid("acq")})
	if st != http.StatusOK {
		t.Fatalf("acquire: %d %v", st, body)
	}
	l := body["lease"].(map[string]any)
	return id, l["lease_id"].(string), l["fencing_token"]
}

func s46Commit(id map[string]string, leaseID string, token any, commitID, target string) map[string]any {
	return map[string]any{"lock_identity": id, "lease_id": leaseID, "fencing_token": token,
		"service_instance_id": "inst-1", "sink": "couchdb", "commit_id": commitID, "execution_id": "exec-1",
		"job_id": "job-1", "target": target, "payload_sha256": strings.Repeat("ab", 32)}
}

func num64(v any) uint64 { f, _ := v.(float64); return uint64(f) }
