package httpapi_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// TestReplayResolvesUnderLimits: the retry of a committed mutation, which
// is how a client resolves lease_outcome_unknown, is answered from its
// idempotency evidence even while the caller's rate limit or active-lease
// quota refuses new work; the same request id with a changed body is still
// idempotency_conflict, and new work is still refused.
func TestReplayResolvesUnderLimits(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	rows := newRowRecorder()
	t.Run("rate_limit", func(t *testing.T) {
		t.Parallel()
		// One acquire or renew per second per principal, burst 2.
		s := startServer(t, bin, rows, "--principal-rate", "1")
		for _, sc := range []struct {
			name string
			run  func(t *testing.T, s *e2eServer, k *e2eKey, later func(func()))
		}{
			{"acquire", replayAcquireThrottled}, {"renew", replayRenewThrottled},
			{"release", replayReleaseThrottled}, {"force_release_and_revoke", replayAdminThrottled},
		} {
			t.Run(sc.name, func(t *testing.T) {
				throttledWindow(t, func(attempt int) *e2eKey {
					return s.createKey(fmt.Sprintf("prn-rl-%s-%d", sc.name, attempt), "administrator",
						"targets:lease,targets:force-release", "tenant:tenant-a,program:program-a")
				}, func(k *e2eKey, later func(func())) { sc.run(t, s, k, later) })
			})
		}
	})
	t.Run("active_quota", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, bin, rows, "--max-active-per-principal", "1")
		k := s.createKey("prn-quota", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
		first := identity("quota-1", "usernamegen")
		body := acquireBody(first, uniqueID("req-quota"))
		a1 := post(t, s, k, "/acquire", body)
		wantStatus(t, a1, 200, "lease_acquired")
		second := acquireBody(identity("quota-2", "usernamegen"), uniqueID("req-quota"))
		wantStatus(t, post(t, s, k, "/acquire", second), 429, "lease_rate_limited")
		// The retry of the first acquire is its original result.
		wantReplay(t, post(t, s, k, "/acquire", body), a1)
		wantStatus(t, post(t, s, k, "/acquire", with(body, "ttl_ms", 31000)), 409, "idempotency_conflict")
		// The replay granted nothing: the quota still refuses new work...
		wantStatus(t, post(t, s, k, "/acquire", second), 429, "lease_rate_limited")
		// ...until the lease is released (the refused request stored nothing).
		l := leaseOf(t, a1, "lease")
		rel := post(t, s, k, "/"+l["lease_id"].(string)+"/release", heldBody(first, l, uniqueID("req-rel")))
		wantStatus(t, rel, 200, "lease_released")
		wantStatus(t, post(t, s, k, "/acquire", second), 200, "lease_acquired")
	})
}

// throttledWindow runs scenario with a fresh principal (burst 2 at one per
// second) and, if the run took under 900 ms, the checks it deferred with
// later: a bucket that two requests emptied holds less than one token
// until a second after the first of them, so every later request of a run
// that short met a refusing limiter. A slower run proves nothing and is
// repeated with a fresh principal, three times at most.
func throttledWindow(t *testing.T, key func(attempt int) *e2eKey, scenario func(k *e2eKey, later func(check func()))) {
	t.Helper()
	for attempt := 0; attempt < 3; attempt++ {
		k := key(attempt)
		var checks []func()
		start := time.Now()
		scenario(k, func(check func()) { checks = append(checks, check) })
		if took := time.Since(start); took >= 900*time.Millisecond {
			t.Logf("attempt %d took %v: the limiter may have refilled; again with a fresh principal", attempt, took)
			continue
		}
		for _, check := range checks {
			check()
		}
		return
	}
	t.Fatal("no run finished within 900 ms, so none proved a replay passes a refusing rate limiter")
}

// The scenarios check at once what holds whatever the limiter's state (a
// fresh principal's first two requests), and later what needs it
// refusing.

func replayAcquireThrottled(t *testing.T, s *e2eServer, k *e2eKey, later func(func())) {
	body := acquireBody(identity(uniqueID("rl-acq"), "usernamegen"), uniqueID("req"))
	a1 := post(t, s, k, "/acquire", body)
	wantStatus(t, a1, 200, "lease_acquired")
	wantStatus(t, post(t, s, k, "/acquire", acquireBody(identity(uniqueID("rl-acq"), "usernamegen"), uniqueID("req"))), 200, "lease_acquired")
	replay := post(t, s, k, "/acquire", body)
	changed := post(t, s, k, "/acquire", with(body, "ttl_ms", 31000))
	fresh := post(t, s, k, "/acquire", acquireBody(identity(uniqueID("rl-acq"), "usernamegen"), uniqueID("req")))
	later(func() {
		wantReplay(t, replay, a1)
		wantStatus(t, changed, 409, "idempotency_conflict")
		wantStatus(t, fresh, 429, "lease_rate_limited")
	})
}

func replayRenewThrottled(t *testing.T, s *e2eServer, k *e2eKey, later func(func())) {
	id := identity(uniqueID("rl-renew"), "usernamegen")
	a := post(t, s, k, "/acquire", acquireBody(id, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	path := "/" + l["lease_id"].(string) + "/renew"
	body := heldBody(id, l, uniqueID("req-renew"))
	r1 := post(t, s, k, path, body)
	wantStatus(t, r1, 200, "lease_renewed")
	replay := post(t, s, k, path, body)
	changed := post(t, s, k, path, with(body, "ttl_ms", 20000))
	fresh := post(t, s, k, path, heldBody(id, l, uniqueID("req-renew")))
	later(func() {
		wantReplay(t, replay, r1)
		wantStatus(t, changed, 409, "idempotency_conflict")
		wantStatus(t, fresh, 429, "lease_rate_limited")
	})
}

func replayReleaseThrottled(t *testing.T, s *e2eServer, k *e2eKey, later func(func())) {
	id := identity(uniqueID("rl-rel"), "usernamegen")
	a := post(t, s, k, "/acquire", acquireBody(id, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	wantStatus(t, post(t, s, k, "/acquire", acquireBody(identity(uniqueID("rl-rel"), "usernamegen"), uniqueID("req"))), 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	path := "/" + l["lease_id"].(string) + "/release"
	body := heldBody(id, l, uniqueID("req-release"))
	r1 := post(t, s, k, path, body)
	replay := post(t, s, k, path, body)
	changed := post(t, s, k, path, with(body, "service_instance_id", "inst-other"))
	fresh := post(t, s, k, "/acquire", acquireBody(identity(uniqueID("rl-rel"), "usernamegen"), uniqueID("req")))
	later(func() {
		wantStatus(t, r1, 200, "lease_released")
		wantReplay(t, replay, r1)
		wantStatus(t, changed, 409, "idempotency_conflict")
		wantStatus(t, fresh, 429, "lease_rate_limited")
	})
}

func replayAdminThrottled(t *testing.T, s *e2eServer, k *e2eKey, later func(func())) {
	var leases [2]map[string]any
	var ids [2]lease.Identity
	for i := range leases {
		ids[i] = identity(uniqueID("rl-adm"), "usernamegen")
		a := post(t, s, k, "/acquire", acquireBody(ids[i], uniqueID("req")))
		wantStatus(t, a, 200, "lease_acquired")
		leases[i] = leaseOf(t, a, "lease")
	}
	for i, op := range []string{"force-release", "revoke"} {
		l := leases[i]
		path := "/" + l["lease_id"].(string) + "/" + op
		body := map[string]any{"lock_identity": ids[i], "fencing_token": l["fencing_token"], "reason": "operator cleanup",
			"request_id": uniqueID("req-" + op)}
		r1 := post(t, s, k, path, body)
		replay := post(t, s, k, path, body)
		changed := post(t, s, k, path, with(body, "reason", "another reason"))
		later(func() {
			wantStatus(t, r1, 200, map[string]string{"force-release": "lease_released", "revoke": "lease_revoked"}[op])
			wantReplay(t, replay, r1)
			wantStatus(t, changed, 409, "idempotency_conflict")
		})
	}
	fresh := post(t, s, k, "/acquire", acquireBody(identity(uniqueID("rl-adm"), "usernamegen"), uniqueID("req")))
	later(func() { wantStatus(t, fresh, 429, "lease_rate_limited") })
}

// post sends a JSON body to apiBase+path with k.
func post(t *testing.T, s *e2eServer, k *e2eKey, path string, body any) rawResp {
	t.Helper()
	return s.do(t, rawReq{Method: "POST", Path: apiBase + path, Key: k.APIKey, Body: body})
}

// heldBody is a renew or release body for lease l (decoded from an
// acquire answer) of id, with acquireBody's service instance.
func heldBody(id lease.Identity, l map[string]any, requestID string) map[string]any {
	return map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"], "service_instance_id": "inst-raw",
		"request_id": requestID}
}

func wantStatus(t *testing.T, r rawResp, status int, code string) {
	t.Helper()
	if r.Status != status || r.code() != code {
		t.Fatalf("want %d %s, got %d %s", status, code, r.Status, r.Body)
	}
}

// wantReplay checks that r answers the request first answered with
// exactly first's result, from evidence.
func wantReplay(t *testing.T, r, first rawResp) {
	t.Helper()
	if r.Status != 200 || r.code() != first.code() || r.JSON["replayed"] != true {
		t.Fatalf("replay: want 200 %s replayed, got %d %s", first.code(), r.Status, r.Body)
	}
	got, want := leaseOf(t, r, "lease"), leaseOf(t, first, "lease")
	for _, f := range []string{"lease_id", "fencing_token", "expires_at", "state"} {
		if got[f] != want[f] {
			t.Fatalf("replay %s = %v, the original answered %v\nreplay: %s\noriginal: %s", f, got[f], want[f], r.Body, first.Body)
		}
	}
}
