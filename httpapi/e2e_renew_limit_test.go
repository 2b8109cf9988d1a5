package httpapi_test

import (
	"testing"

	"github.com/starintel/starlease/internal/testenv"
)

// A holder's renewal does not depend on other principals' traffic: the
// per-target bucket that every principal's acquires share is not charged
// for renewals, which go to the holder's own bucket for the target. Another
// principal in scope that holds nothing and sends acquires that answer
// lease_conflict (until the shared bucket answers 429), and renewals of the
// holder's lease that answer lease_lost (until its own renewal bucket
// answers 429), leaves the holder's next renewal, a new request id and so
// no replay, answered 200.
func TestOthersAcquiresDoNotStarveHoldersRenew(t *testing.T) {
	s := startServer(t, testenv.BuildStarlease(t), newRowRecorder(), "--target-rate", "1")
	scope := "tenant:tenant-a,program:program-a"
	holder := s.createKey("prn-x-holder", "api_client", "targets:lease", scope)
	attacker := s.createKey("prn-x-attacker", "api_client", "targets:lease", scope)
	id := identity("x-starve", "usernamegen")
	a := post(t, s, holder, "/acquire", acquireBody(id, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	for i := 0; i < 10; i++ {
		r := post(t, s, attacker, "/acquire", acquireBody(id, uniqueID("req")))
		if r.Status == 429 {
			break
		}
		wantStatus(t, r, 409, "lease_conflict")
	}
	for i := 0; i < 4; i++ {
		r := post(t, s, attacker, "/"+l["lease_id"].(string)+"/renew", heldBody(id, l, uniqueID("req")))
		if r.Status == 429 {
			break
		}
		wantStatus(t, r, 409, "lease_lost")
	}
	r := post(t, s, holder, "/"+l["lease_id"].(string)+"/renew", heldBody(id, l, uniqueID("req")))
	if r.Status != 200 {
		t.Fatalf("holder's renewal refused because another principal's conflicting acquires drained the target bucket: %d %s", r.Status, r.Body)
	}
}
