package httpapi_test

import (
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// TestEveryCallerFieldDigestIsAudited extends issue 11 §2 ("a caller can
// never switch auditing off or block an administrative action by choosing
// an identifier") to the caller-chosen values the reproductions did not
// name: each lock-identity component, job_id, trace_id and
// service_instance_id of 64 hex characters. Over HTTP on bolt and Valkey,
// the acquire answers 200 with exactly one audit event holding the value's
// keyed hash, and an administrator's force-release of that lease succeeds
// and is audited (the attempt and the result).
func TestEveryCallerFieldDigestIsAudited(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	r := testenv.StartRedis(t)
	for _, backend := range []string{"bolt", "valkey"} {
		t.Run(backend, func(t *testing.T) {
			var s *e2eServer
			var events func() []audit.Event
			if backend == "valkey" {
				v := startValkeyServer(t, bin, r)
				s, events = v.e2eServer, func() []audit.Event { return v.stream(t) }
			} else {
				s = startServer(t, bin, newRowRecorder())
				events = func() []audit.Event { return auditEventsOf(t, s) }
			}
			red := serverRedactor(t, s)
			admin := s.createKey("admin-fields", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
				"tenant:*,program:*,target-namespace:*,target:*,actor:*")
			identityFields := []string{"tenant_id", "program_id", "target_namespace", "actor_name", "workflow_name"}
			for _, field := range append(identityFields, "job_id", "trace_id", "service_instance_id") {
				t.Run(field, func(t *testing.T) {
					v := hex64()
					b := acquireBody(identity(uniqueID("fields"), "usernamegen"), uniqueID("req"))
					inIdentity := false
					for _, f := range identityFields {
						inIdentity = inIdentity || f == field
					}
					if inIdentity {
						b["lock_identity"].(map[string]any)[field] = v
					} else {
						b[field] = v
					}
					a := post(t, s, admin, "/acquire", b)
					if a.Status != 200 || a.code() != "lease_acquired" {
						t.Fatalf("acquire with a 64-hex %s: %d %s", field, a.Status, a.Body)
					}
					l := leaseOf(t, a, "lease")
					leaseID := l["lease_id"].(string)
					fieldOf := func(e audit.Event) string {
						return map[string]string{"tenant_id": e.TenantID, "program_id": e.ProgramID, "target_namespace": e.TargetNamespace,
							"actor_name": e.ActorName, "workflow_name": e.WorkflowName, "job_id": e.JobID, "trace_id": e.TraceID,
							"service_instance_id": e.ServiceInstanceID}[field]
					}
					evs := events()
					acq := eventsFor(evs, audit.EventAcquire, leaseID)
					if len(acq) != 1 || acq[0].ResultCode != lease.CodeAcquired || fieldOf(acq[0]) != red.Value(v) {
						t.Fatalf("acquire with a 64-hex %s audited as %+v, want one event with %q", field, acq, red.Value(v))
					}
					fr := post(t, s, admin, "/"+leaseID+"/force-release", map[string]any{"lock_identity": l["lock_identity"],
						"fencing_token": l["fencing_token"], "reason": "operator cleanup", "request_id": uniqueID("fr")})
					if fr.Status != 200 || fr.code() != "lease_released" {
						t.Fatalf("force-release of a lease with a 64-hex %s: %d %s", field, fr.Status, fr.Body)
					}
					got := eventsFor(events(), audit.EventForceRelease, leaseID)
					if len(got) != 2 || got[0].ResultCode != lease.CodeOutcomeUnknown || got[1].ResultCode != lease.CodeForceReleased ||
						got[1].Priority != audit.PriorityHigh {
						t.Fatalf("force-release audited as %+v", got)
					}
					if inIdentity && fieldOf(got[1]) != red.Value(v) {
						t.Errorf("force-release event's %s is %q, want %q", field, fieldOf(got[1]), red.Value(v))
					}
				})
			}
		})
	}
}
