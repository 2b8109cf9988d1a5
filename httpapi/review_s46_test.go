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
