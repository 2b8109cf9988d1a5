package httpapi_test

// Outside review (i11b): administrator reason/incident redaction over
// HTTP on bolt and on a real redis-server (valkey backend), and the
// absence of any wire field that sets CommitRequest.ReplayOnly.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/internal/testenv"
)

func TestReview2AdminRedactionOverHTTP(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	for _, backend := range []string{"bolt", "valkey"} {
		t.Run(backend, func(t *testing.T) {
			var extra []string
			if backend == "valkey" {
				r := testenv.StartRedis(t)
				extra = []string{"--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-key-prefix", "r2"}
			}
			s := startServer(t, bin, newRowRecorder(), extra...)
			review2AdminRedaction(t, s)
		})
	}
}

func review2AdminRedaction(t *testing.T, s *e2eServer) {
	admin := s.createKey("admin-r2", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
		"tenant:*,program:*,target-namespace:*,target:*,actor:*")
	cl := s.createKey("prn-r2-client", "api_client", "targets:lease,targets:read",
		"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	pepper, err := auth.LoadPepper(s.PepperFile())
	if err != nil {
		t.Fatal(err)
	}
	key, err := pepper.DeriveKey(audit.RedactionKeyPurpose)
	if err != nil {
		t.Fatal(err)
	}
	red, err := audit.NewRedactor(key)
	if err != nil {
		t.Fatal(err)
	}
	secret1, secret2 := hex64(), hex64()
	acquire := func() (string, map[string]any, any) {
		id := identity(uniqueID("r2"), "usernamegen")
		r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey, Body: acquireBody(id, uniqueID("req"))})
		if r.Status != 200 {
			t.Fatalf("acquire: %d %s", r.Status, r.Body)
		}
		l := leaseOf(t, r, "lease")
		return l["lease_id"].(string), l["lock_identity"].(map[string]any), l["fencing_token"]
	}
	revoke := func(leaseID string, li map[string]any, tok any, reqID string, kv ...any) rawResp {
		body := with(map[string]any{"lock_identity": li, "fencing_token": tok, "request_id": reqID}, kv...)
		return s.do(t, rawReq{Method: "POST", Path: apiBase + "/" + leaseID + "/revoke", Key: admin.APIKey, Body: body})
	}

	// Idempotency: same request id and reason replays; a different
	// secret-shaped reason under it is idempotency_conflict.
	leaseID, li, tok := acquire()
	reqID := uniqueID("adm")
	reason1 := "holder key leaked: Bearer " + secret1
	r := revoke(leaseID, li, tok, reqID, "reason", reason1)
	if r.Status != 200 || r.code() != "lease_revoked" || strings.Contains(string(r.Body), secret1) {
		t.Fatalf("revoke with a bearer reason: %d %s", r.Status, r.Body)
	}
	r = revoke(leaseID, li, tok, reqID, "reason", reason1)
	if r.Status != 200 || r.code() != "lease_revoked" {
		t.Fatalf("identical retry: %d %s", r.Status, r.Body)
	}
	r = revoke(leaseID, li, tok, reqID, "reason", "holder key leaked: Bearer "+secret2)
	if r.Status != 409 || r.code() != "idempotency_conflict" || strings.Contains(string(r.Body), secret2) {
		t.Fatalf("same request id, other secret reason: %d %s, want 409 idempotency_conflict", r.Status, r.Body)
	}
	h := s.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseID + "/history", Key: admin.APIKey})
	if h.Status != 200 || strings.Contains(string(h.Body), secret1) || !strings.Contains(string(h.Body), red.Value(reason1)) {
		t.Fatalf("history: %d %s, want %s", h.Status, h.Body, red.Value(reason1))
	}

	// A value that only redaction makes valid: 200 with consistent audit,
	// or 400 on its field; never a 503 "audit is unavailable".
	for _, tc := range []struct {
		name  string
		field string
		value string
	}{
		{"overlong bearer reason", "reason", "Bearer " + secret1 + strings.Repeat(" x", 300)},
		{"incident id with a space and bearer", "incident_id", "Bearer " + secret1},
	} {
		leaseID, li, tok := acquire()
		r := revoke(leaseID, li, tok, uniqueID("adm"), tc.field, tc.value)
		if strings.Contains(string(r.Body), secret1) {
			t.Fatalf("%s: the answer echoes the secret: %s", tc.name, r.Body)
		}
		switch {
		case r.Status == 200:
			evs := eventsForAny(t, s, leaseID)
			for _, e := range evs {
				got := map[string]string{"reason": e.Reason, "incident_id": e.IncidentID}[tc.field]
				if got != red.Value(tc.value) {
					t.Errorf("%s: audited %s %q, want %q", tc.name, tc.field, got, red.Value(tc.value))
				}
			}
		case r.Status == 400 && r.code() == "invalid_lease_request":
		default:
			t.Errorf("%s: %d %s; want 200 (redacted) or 400 invalid_lease_request", tc.name, r.Status, r.Body)
		}
	}
	// The raw secrets are in no file the server wrote, and not in its logs.
	_ = filepath.Walk(s.DataDir(), func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), secret1) || strings.Contains(string(b), secret2) {
			t.Errorf("%s holds a raw secret", p)
		}
		return nil
	})
	if se := string(s.Stderr()); strings.Contains(se, secret1) || strings.Contains(se, secret2) {
		t.Errorf("the server log holds a raw secret")
	}
}

// eventsForAny are the revoke events of a lease in audit.jsonl, if the
// backend keeps one (bolt); none otherwise.
func eventsForAny(t *testing.T, s *e2eServer, leaseID string) []audit.Event {
	t.Helper()
	if _, err := os.Stat(filepath.Join(s.DataDir(), "audit.jsonl")); err != nil {
		return nil
	}
	return eventsFor(auditEventsOf(t, s), audit.EventRevoke, leaseID)
}

// No HTTP field, in any spelling, sets ReplayOnly: an unknown field is
// refused, so a commit can never be asked "replay only" over the wire.
func TestReview2NoReplayOnlyWireField(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	s := startServer(t, bin, newRowRecorder())
	cl := s.createKey("prn-r2-commit", "api_client", "targets:lease",
		"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	id := identity(uniqueID("r2c"), "usernamegen")
	r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey, Body: acquireBody(id, uniqueID("req"))})
	if r.Status != 200 {
		t.Fatalf("acquire: %d %s", r.Status, r.Body)
	}
	l := leaseOf(t, r, "lease")
	base := map[string]any{"lock_identity": l["lock_identity"], "lease_id": l["lease_id"], "fencing_token": l["fencing_token"],
		"service_instance_id": "inst-raw", "sink": "couchdb", "commit_id": uniqueID("c"), "execution_id": "exec-raw",
		"job_id": "job-raw", "target": "doc-1"}
	for _, f := range []string{"replay_only", "ReplayOnly", "replayOnly", "REPLAY_ONLY"} {
		r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/commits/authorize", Key: cl.APIKey, Body: with(base, f, true)})
		if r.Status != 400 {
			t.Errorf("commit with %q: %d %s, want 400", f, r.Status, r.Body)
		}
	}
}
