package httpapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// The relay's lease lives in the reserved tenant (lease.InternalTenant):
// no API key reaches it, not even with "tenant:*" scope, so no caller can
// hold it (stopping every tenant's publications), end it, read it or list
// it. (From an adversarial review: a wildcard key held the relay's lease
// across a restart and no relay published again.)
func TestRelayIdentityIsOutOfEveryScope(t *testing.T) {
	s := startServer(t, testenv.BuildStarlease(t), newRowRecorder())
	wide := s.createKey("prn-wide", "api_client", "targets:lease,targets:read", "tenant:*,program:*")
	admin := s.createKey("prn-admin-wide", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
		"tenant:*,program:*")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	relay := rabbitmq.RelayIdentity("bolt")
	for _, k := range []*e2eKey{wide, admin} {
		st := client.NewLeaseStore(s.client(k), k.Principal)
		_, err := st.Acquire(ctx, lease.AcquireRequest{Identity: relay, ServiceInstanceID: "hijack", TTL: 30 * time.Second,
			ExecutionID: "exec-hijack", JobID: "job-hijack", Mutation: lease.Mutation{RequestID: uniqueID("req"),
				DeadlineAt: time.Now().Add(10 * time.Second)}})
		if lease.CodeOf(err) != lease.CodeAccessDenied {
			t.Fatalf("%s acquiring the relay's identity: %v, want access_denied", k.Principal, err)
		}
		_, err = st.Inspect(ctx, lease.InspectRequest{Identity: relay, DeadlineAt: time.Now().Add(10 * time.Second)})
		if c := lease.CodeOf(err); c != lease.CodeAccessDenied && c != lease.CodeNotFound {
			t.Fatalf("%s inspecting the relay's identity: %v, want a refusal", k.Principal, err)
		}
		r := s.do(t, rawReq{Method: "GET", Path: apiBase + "/?tenant_id=" + lease.InternalTenant + "&program_id=relay", Key: k.APIKey})
		if r.Status != 403 {
			t.Fatalf("%s listing the relay's program: %d %s, want 403", k.Principal, r.Status, r.Body)
		}
	}
	r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/lease_01ANYTHINGATALL0000000000/force-release", Key: admin.APIKey,
		Body: map[string]any{"lock_identity": relay, "fencing_token": 1, "reason": "take the relay down", "request_id": uniqueID("req")}})
	if r.Status != 403 {
		t.Fatalf("an administrator force-releasing the relay's lease: %d %s, want 403", r.Status, r.Body)
	}
}
