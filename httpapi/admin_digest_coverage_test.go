package httpapi_test

import (
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// TestAdminDigestReasonAndIncidentIDSucceed is issue 11 §2's last
// reproduction as the issue states it: "an administrator's revoke or
// force-release ... the same when only the admin's reason, incident_id,
// request_id or correlation id contains a digest. Required: a caller can
// never switch auditing off or block an administrative action by choosing
// an identifier", and Done means "revoke and force-release of a lease with
// 64-hex identifiers succeed and are audited". Over HTTP on bolt and on
// Valkey: a revoke or force-release whose incident_id is a 64-hex digest,
// or whose reason quotes one, must end the lease and be audited (the
// attempt and the result, high priority), the value as its keyed hash.
func TestAdminDigestReasonAndIncidentIDSucceed(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	r := testenv.StartRedis(t)
	for _, backend := range []string{"bolt", "valkey"} {
		t.Run(backend, func(t *testing.T) {
			var s *e2eServer
			var events func() []audit.Event
			var red *audit.Redactor
			if backend == "valkey" {
				v := startValkeyServer(t, bin, r)
				s, events, red = v.e2eServer, func() []audit.Event { return v.stream(t) }, v.redactor(t)
			} else {
				s = startServer(t, bin, newRowRecorder())
				events = func() []audit.Event { return auditEventsOf(t, s) }
				red = serverRedactor(t, s)
			}
			admin := s.createKey("admin-digest", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
				"tenant:*,program:*,target-namespace:*,target:*,actor:*")
			cl := s.createKey("prn-digest", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
			for _, op := range []struct {
				path, code string
				typ        audit.EventType
				audited    lease.Code
			}{{"revoke", "lease_revoked", audit.EventRevoke, lease.CodeRevoked},
				{"force-release", "lease_released", audit.EventForceRelease, lease.CodeForceReleased}} {
				for _, field := range []string{"incident_id", "reason"} {
					t.Run(op.path+"/"+field, func(t *testing.T) {
						v := hex64()
						id := identity(uniqueID("digest"), "usernamegen")
						a := post(t, s, cl, "/acquire", acquireBody(id, uniqueID("req")))
						wantStatus(t, a, 200, "lease_acquired")
						l := leaseOf(t, a, "lease")
						leaseID := l["lease_id"].(string)
						body := map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"], "request_id": uniqueID("adm")}
						sent := v
						if field == "reason" {
							sent = "target url hash " + v + " was misrouted"
							body["reason"] = sent
						} else {
							body["incident_id"] = v
						}
						got := post(t, s, admin, "/"+leaseID+"/"+op.path, body)
						if got.Status != 200 || got.code() != op.code {
							t.Fatalf("%s of a lease with a 64-hex %s: %d %s; the issue requires it to succeed and be audited",
								op.path, field, got.Status, got.Body)
						}
						renew := post(t, s, cl, "/"+leaseID+"/renew", heldBody(id, l, uniqueID("renew")))
						wantStatus(t, renew, 409, "lease_lost")
						evs := eventsFor(events(), op.typ, leaseID)
						if len(evs) != 2 || evs[0].ResultCode != lease.CodeOutcomeUnknown || evs[1].ResultCode != op.audited {
							t.Fatalf("%s audited as %+v; want the attempt then the result", op.path, evs)
						}
						for _, e := range evs {
							value := map[string]string{"incident_id": e.IncidentID, "reason": e.Reason}[field]
							if e.Priority != audit.PriorityHigh || value != red.Value(sent) {
								t.Errorf("%s event %+v: want high priority and %s as its keyed hash %q", op.path, e, field, red.Value(sent))
							}
						}
					})
				}
			}
		})
	}
}
