package httpapi_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// hex64 is a fresh 64-hex value: the shape of a SHA-256 digest and of an
// API key's secret part alike.
func hex64() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// auditEventsOf reads the server's audit.jsonl strictly.
func auditEventsOf(t *testing.T, s *e2eServer) []audit.Event {
	t.Helper()
	evs, err := audit.ReadFile(filepath.Join(s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatalf("audit.ReadFile: %v", err)
	}
	return evs
}

// eventsFor are the events of one lease id and event type, in file order.
func eventsFor(evs []audit.Event, typ audit.EventType, leaseID string) []audit.Event {
	var out []audit.Event
	for _, e := range evs {
		if e.EventType == typ && e.LeaseID == leaseID {
			out = append(out, e)
		}
	}
	return out
}

// TestAuditInputCannotSwitchOffAudit (issue 11 §2): over HTTP on bolt, a
// caller-chosen value of 64 hex characters — a SHA-256 target id, a
// correlation, request, execution or incident id, a reason quoting a
// digest — neither suppresses the request's audit event nor blocks an
// administrator's revoke or force-release. The value itself never reaches
// the audit sinks: it is replaced by a keyed hash, the same for the same
// value.
func TestAuditInputCannotSwitchOffAudit(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	s := startServer(t, bin, newRowRecorder())
	admin := s.createKey("admin-audit", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
		"tenant:*,program:*,target-namespace:*,target:*,actor:*")
	cl := s.createKey("prn-audit-client", "api_client", "targets:lease",
		"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	// The server's redacted form of a value: keyed by its pepper.
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
	sum := sha256.Sum256([]byte("https://example.com/login"))
	digest := hex.EncodeToString(sum[:]) // an ordinary OSINT target id: a hashed URL
	var raws []string                    // every 64-hex value sent; none may be stored
	raws = append(raws, digest)

	acquire := func(t *testing.T, target string, body map[string]any, corr string) (map[string]any, lease.Identity) {
		t.Helper()
		id := identity(target, "usernamegen")
		b := acquireBody(id, uniqueID("req"))
		for k, v := range body {
			b[k] = v
		}
		r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey, Body: b,
			Header: [][2]string{{"X-Correlation-ID", corr}}})
		if r.Status != 200 || r.code() != "lease_acquired" {
			t.Fatalf("acquire: %d %s", r.Status, r.Body)
		}
		return leaseOf(t, r, "lease"), id
	}
	// checkAcquireAudited finds the one acquire event of leaseID.
	checkAcquireAudited := func(t *testing.T, leaseID string) audit.Event {
		t.Helper()
		evs := eventsFor(auditEventsOf(t, s), audit.EventAcquire, leaseID)
		if len(evs) != 1 {
			t.Fatalf("%d audit events for the acquire of %s, want 1", len(evs), leaseID)
		}
		e := evs[0]
		if e.ResultCode != lease.CodeAcquired || e.Decision != audit.DecisionAllow || e.PrincipalID != "prn-audit-client" {
			t.Fatalf("acquire audited as %+v", e)
		}
		return e
	}

	t.Run("acquire", func(t *testing.T) {
		l, _ := acquire(t, digest, nil, uniqueID("corr"))
		e := checkAcquireAudited(t, l["lease_id"].(string))
		if want := red.Value(digest); e.TargetID != want || !strings.HasPrefix(want, "redacted:") {
			t.Errorf("target_id audited as %q, want its keyed hash %q", e.TargetID, want)
		}
		// The same value has the same redacted form in every event.
		l2, _ := acquire(t, digest, map[string]any{"lock_identity": map[string]any{"tenant_id": "tenant-a",
			"program_id": "program-a", "target_namespace": "starintel-target", "target_id": digest, "actor_name": "other"}},
			uniqueID("corr"))
		if e2 := checkAcquireAudited(t, l2["lease_id"].(string)); e2.TargetID != e.TargetID {
			t.Errorf("one target id audited as %q and %q", e.TargetID, e2.TargetID)
		}
		for _, field := range []string{"X-Correlation-ID", "request_id", "execution_id"} {
			v := hex64()
			raws = append(raws, v)
			body, corr := map[string]any{}, uniqueID("corr")
			switch field {
			case "X-Correlation-ID":
				corr = v
			default:
				body[field] = v
			}
			l, _ := acquire(t, uniqueID("target"), body, corr)
			e := checkAcquireAudited(t, l["lease_id"].(string))
			got := map[string]string{"X-Correlation-ID": e.CorrelationID, "request_id": e.RequestID, "execution_id": e.ExecutionID}[field]
			if want := red.Value(v); got != want {
				t.Errorf("%s audited as %q, want its keyed hash %q", field, got, want)
			}
		}
	})

	t.Run("unauthenticated", func(t *testing.T) {
		corr := hex64()
		count := func() int {
			n := 0
			for _, e := range auditEventsOf(t, s) {
				if e.EventType == audit.EventAuthFailed && e.CorrelationID == red.Value(corr) {
					n++
				}
			}
			return n
		}
		before := count()
		raws = append(raws, corr)
		r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: "star_sk_v1_not-a-key",
			Body: acquireBody(identity("x", "usernamegen"), "req-1"), Header: [][2]string{{"X-Correlation-ID", corr}}})
		if r.Status != 401 {
			t.Fatalf("bad key: %d %s", r.Status, r.Body)
		}
		if got := count(); got != before+1 {
			t.Fatalf("a 401 with a 64-hex correlation id wrote %d auth-failure events, want 1", got-before)
		}
	})

	t.Run("admin", func(t *testing.T) {
		for _, op := range []struct {
			path, code string
			audited    lease.Code // the audit event's (internal) result code
		}{{"revoke", "lease_revoked", lease.CodeRevoked}, {"force-release", "lease_released", lease.CodeForceReleased}} {
			for _, hostile := range []string{"target_id", "reason", "incident_id", "request_id", "X-Correlation-ID"} {
				t.Run(op.path+"/"+hostile, func(t *testing.T) {
					v := hex64()
					target := uniqueID("adm")
					if hostile == "target_id" {
						target = v
					}
					raws = append(raws, v)
					l, id := acquire(t, target, nil, uniqueID("corr"))
					leaseID := l["lease_id"].(string)
					body := map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"],
						"reason": "operator cleanup", "request_id": uniqueID("adm-req")}
					corr := uniqueID("corr")
					switch hostile {
					case "reason":
						body["reason"] = "target url hash " + v + " was misrouted"
					case "incident_id", "request_id":
						body[hostile] = v
					case "X-Correlation-ID":
						corr = v
					}
					r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/" + leaseID + "/" + op.path, Key: admin.APIKey,
						Body: body, Header: [][2]string{{"X-Correlation-ID", corr}}})
					if r.Status != 200 || r.code() != op.code {
						t.Fatalf("%s with a 64-hex %s: %d %s", op.path, hostile, r.Status, r.Body)
					}
					// The lease is no longer active: renewing it is lease_lost.
					renew := s.do(t, rawReq{Method: "POST", Path: apiBase + "/" + leaseID + "/renew", Key: cl.APIKey,
						Body: map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"],
							"service_instance_id": "inst-raw", "request_id": uniqueID("renew")}})
					if renew.Status != 409 || renew.code() != "lease_lost" {
						t.Fatalf("renew after %s: %d %s", op.path, renew.Status, renew.Body)
					}
					typ := audit.EventRevoke
					if op.path == "force-release" {
						typ = audit.EventForceRelease
					}
					evs := eventsFor(auditEventsOf(t, s), typ, leaseID)
					if len(evs) != 2 || evs[0].ResultCode != lease.CodeOutcomeUnknown || evs[1].ResultCode != op.audited {
						t.Fatalf("%s audited as %+v; want the attempt then the result", op.path, evs)
					}
					for _, e := range evs {
						if e.Priority != audit.PriorityHigh || e.Decision != audit.DecisionAllow || e.PrincipalID != "admin-audit" ||
							e.Reason == "" && e.IncidentID == "" {
							t.Errorf("%s event %+v", op.path, e)
						}
						got := map[string]string{"target_id": e.TargetID, "reason": e.Reason, "incident_id": e.IncidentID,
							"request_id": e.RequestID, "X-Correlation-ID": e.CorrelationID}[hostile]
						sent := v
						if hostile == "reason" {
							sent = body["reason"].(string)
						}
						if want := red.Value(sent); got != want {
							t.Errorf("%s: %s audited as %q, want its keyed hash %q", op.path, hostile, got, want)
						}
					}
					if hostile == "reason" || hostile == "incident_id" {
						// Stored in the terminal record and returned by history:
						// there too only the same keyed redacted form, never v.
						h := s.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseID + "/history", Key: admin.APIKey})
						if h.Status != 200 || strings.Contains(string(h.Body), v) {
							t.Fatalf("history after %s with a 64-hex %s: %d %s", op.path, hostile, h.Status, h.Body)
						}
						sent := v
						if hostile == "reason" {
							sent = body["reason"].(string)
						}
						if want := `"` + hostile + `":"` + red.Value(sent) + `"`; !strings.Contains(string(h.Body), want) {
							t.Fatalf("history after %s: %s, want %s", op.path, h.Body, want)
						}
					}
				})
			}
		}
	})

	// §6: metadata holding credential material is refused, and nothing is
	// stored.
	t.Run("metadata_secrets", func(t *testing.T) {
		for name, md := range map[string]map[string]any{
			"password key": {"password": "hunter2-canary"}, "bearer value": {"note": "Bearer hunter2-canary"},
			"api key value": {"note": "star_sk_v1_01J0000000000000000000000A_" + strings.Repeat("ab", 32)},
		} {
			b := acquireBody(identity(uniqueID("meta"), "usernamegen"), uniqueID("req"))
			b["metadata"] = md
			r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey, Body: b})
			if r.Status != 400 || r.code() != "invalid_lease_request" || r.str("field") != "metadata" {
				t.Errorf("metadata with %s: %d %s", name, r.Status, r.Body)
			}
		}
	})

	t.Run("raw_values_never_stored", func(t *testing.T) {
		if err := s.Stop(); err != nil {
			t.Errorf("server did not stop cleanly: %v", err)
		}
		blobs := map[string][]byte{"server stderr": s.Stderr(), "server stdout": s.Stdout()}
		for _, name := range []string{"audit.jsonl", bolt.AuditFileName} {
			blobs[name] = readFileOrEmpty(t, filepath.Join(s.DataDir(), name))
		}
		for name, b := range blobs {
			b = bytes.ToLower(b)
			for _, v := range raws {
				if bytes.Contains(b, []byte(strings.ToLower(v))) {
					t.Errorf("%s holds a raw 64-hex value sent by a caller", name)
				}
			}
		}
		if bytes.Contains(readFileOrEmpty(t, filepath.Join(s.DataDir(), "starlease.db")), []byte("hunter2-canary")) {
			t.Errorf("the lease store holds refused metadata")
		}
		if bytes.Contains(s.Stderr(), []byte("audit write failed")) || bytes.Contains(s.Stderr(), []byte("durable audit")) {
			t.Errorf("the server failed to write audit events:\n%s", s.Stderr())
		}
	})
}

// readyz returns /readyz's status code and string body fields (the
// components object left out).
func readyz(t *testing.T, s *e2eServer) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get(s.URL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatalf("/readyz body: %v", err)
	}
	body := map[string]string{}
	for k, v := range raw {
		if s, ok := v.(string); ok {
			body[k] = s
		}
	}
	return resp.StatusCode, body
}

// TestAuditSurvivesDiskFull (issue 11 §5): the bolt server's data
// directory on a real tmpfs that fills up. While it is full /readyz says
// degraded and why, an administrator's action is refused rather than
// reported without durable audit, and the audit file never holds a torn
// line; once space is freed the same process audits again, /readyz is ok,
// a force-release succeeds with its events written, and a restart appends
// on a line boundary.
func TestAuditSurvivesDiskFull(t *testing.T) {
	tmp := testenv.Tmpfs(t, 16<<20)
	bin := testenv.BuildStarlease(t)
	dataDir := filepath.Join(tmp, "data")
	s := startServer(t, bin, newRowRecorder(), "--data-dir", dataDir)
	admin := s.createKey("admin-full", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
		"tenant:*,program:*,target-namespace:*,target:*,actor:*")
	cl := s.createKey("prn-full", "api_client", "targets:lease",
		"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	acquire := func(target string) rawResp {
		return s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey,
			Body: acquireBody(identity(target, "usernamegen"), uniqueID("req"))})
	}
	forceRelease := func(r rawResp) rawResp {
		l := leaseOf(t, r, "lease")
		return s.do(t, rawReq{Method: "POST", Path: apiBase + "/" + l["lease_id"].(string) + "/force-release", Key: admin.APIKey,
			Body: map[string]any{"lock_identity": l["lock_identity"], "fencing_token": l["fencing_token"],
				"reason": "disk full drill", "request_id": uniqueID("fr")}})
	}
	held := acquire("full-1")
	if held.Status != 200 {
		t.Fatalf("acquire before the disk fills: %d %s", held.Status, held.Body)
	}
	if code, body := readyz(t, s); code != 200 || body["status"] != "ok" {
		t.Fatalf("/readyz before the disk fills: %d %v", code, body)
	}

	filler := filepath.Join(tmp, "filler")
	testenv.FillDisk(t, filler)
	degraded := false
	var statuses []int
	for i := 0; i < 300 && !degraded; i++ {
		statuses = append(statuses, acquire(uniqueID("full")).Status)
		code, body := readyz(t, s)
		if code == 503 && body["status"] == "degraded" {
			// The audit file failing, or audit.db (its index) failing
			// first while the file still took every line, or the lease
			// store's redo log (which refuses writes until it recovers).
			diskFault := strings.Contains(body["reason"], "durable audit unavailable") ||
				strings.Contains(body["reason"], audit.ErrIndexBehind.Error()) ||
				strings.Contains(body["reason"], "redo log append failed")
			if !diskFault || strings.Contains(body["reason"], tmp) {
				t.Fatalf("/readyz reason %q: want the audit or redo log fault, without paths", body["reason"])
			}
			degraded = true
		}
	}
	if !degraded {
		t.Fatalf("/readyz never said degraded while the disk was full (%d acquires answered, the first %v)", len(statuses), statuses[0])
	}
	t.Logf("answers while the disk filled up: %v", statuses)
	fr := forceRelease(held)
	switch {
	case fr.Status == 503 && fr.code() == "lease_backend_unavailable":
		// Refused: the lease must still be active.
		get := s.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseOf(t, held, "lease")["lease_id"].(string), Key: admin.APIKey})
		if get.Status != 200 || leaseOf(t, get, "lease")["state"] != "active" {
			t.Fatalf("a refused force-release changed the lease: %d %s", get.Status, get.Body)
		}
	case fr.Status == 200:
		// Its events fitted in the file's last page: they must be there.
		t.Logf("force-release on a full disk succeeded: its events fitted")
		held = rawResp{}
	default:
		t.Fatalf("force-release on a full disk: %d %s", fr.Status, fr.Body)
	}
	if _, err := audit.ReadFile(filepath.Join(dataDir, "audit.jsonl")); err != nil {
		t.Fatalf("audit file while the disk is full: %v", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, s); code != 200 || body["status"] != "ok" {
		t.Fatalf("/readyz after space was freed: %d %v", code, body)
	}
	if held.JSON == nil {
		held = acquire("full-2")
	}
	leaseID := leaseOf(t, held, "lease")["lease_id"].(string)
	if fr := forceRelease(held); fr.Status != 200 || fr.code() != "lease_released" {
		t.Fatalf("force-release after space was freed: %d %s", fr.Status, fr.Body)
	}
	after := acquire("full-3")
	if after.Status != 200 {
		t.Fatalf("acquire after space was freed: %d %s", after.Status, after.Body)
	}
	evs := auditEventsOf(t, s)
	if got := eventsFor(evs, audit.EventForceRelease, leaseID); len(got) < 2 || got[len(got)-1].ResultCode != lease.CodeForceReleased {
		t.Fatalf("force-release after recovery audited as %+v", got)
	}
	if got := eventsFor(evs, audit.EventAcquire, leaseOf(t, after, "lease")["lease_id"].(string)); len(got) != 1 {
		t.Fatalf("acquire after recovery: %d events", len(got))
	}

	// A restart appends on a line boundary (a new server, a new pepper: an
	// authentication failure is enough to write).
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	before := len(auditEventsOf(t, s))
	s2 := startServer(t, bin, newRowRecorder(), "--data-dir", dataDir)
	if r := s2.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseID, Key: "star_sk_v1_nope"}); r.Status != 401 {
		t.Fatalf("bad key after restart: %d", r.Status)
	}
	if err := s2.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if n := len(auditEventsOf(t, s2)); n != before+1 {
		t.Fatalf("%d events after a restart and one request, want %d", n, before+1)
	}
}

// TestAuditBadKeyFloodSparesAuthenticated (issue 11 §6): over HTTP on
// bolt, a flood of bad keys exhausts the audit volume budget of
// unauthenticated failures only: an authenticated principal's own denials
// during the flood are each written, with the principal, and the
// aggregate of what was dropped says whose events those were.
func TestAuditBadKeyFloodSparesAuthenticated(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	s := startServer(t, bin, newRowRecorder())
	cl := s.createKey("prn-flood-victim", "api_client", "targets:lease",
		"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	corrs, flooded := floodBadKeysThenDeny(t, s, cl.APIKey)
	byCorr, authFailed, droppedUnauth, droppedAuth := tallyFlood(auditEventsOf(t, s))
	t.Logf("%d bad keys sent, %d audited, %d aggregated; %d authenticated events aggregated",
		flooded, authFailed, droppedUnauth, droppedAuth)
	if droppedUnauth == 0 || authFailed+droppedUnauth != flooded {
		t.Fatalf("the flood of %d bad keys: %d written, %d in unauthenticated aggregates; want every one accounted for, some aggregated",
			flooded, authFailed, droppedUnauth)
	}
	for i, corr := range corrs {
		e, ok := byCorr[corr]
		if !ok {
			t.Errorf("denial %d of the authenticated principal was not written during the flood", i)
			continue
		}
		if e.ResultCode != lease.CodeAccessDenied || e.PrincipalID != "prn-flood-victim" {
			t.Errorf("denial %d audited as %+v", i, e)
		}
	}
	if droppedAuth != 0 {
		t.Errorf("%d authenticated events were aggregated", droppedAuth)
	}
}

// floodBadKeysThenDeny floods s with requests bearing a bad key from 8
// goroutines until well past the unauthenticated budget's burst, then sends
// five out-of-scope acquires with key (each must be 403), ends the flood and
// stops the server (Close flushes the drop aggregates). It returns the
// denials' correlation ids and how many bad-key requests were answered.
func floodBadKeysThenDeny(t *testing.T, s *e2eServer, key string) (corrs []string, flooded int64) {
	t.Helper()
	var n atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("GET", s.URL()+apiBase+"/lease_x", nil)
				req.Header.Set("Authorization", "Bearer star_sk_v1_not-a-key")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				resp.Body.Close()
				n.Add(1)
			}
		}()
	}
	for n.Load() < 400 {
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 5 {
		corr := uniqueID(fmt.Sprintf("denied-%d", i))
		corrs = append(corrs, corr)
		b := acquireBody(lease.Identity{TenantID: "tenant-b", ProgramID: "program-a", TargetNamespace: "starintel-target",
			TargetID: "flood", ActorName: "usernamegen"}, uniqueID("req"))
		if r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: b,
			Header: [][2]string{{"X-Correlation-ID", corr}}}); r.Status != 403 {
			close(stop)
			wg.Wait()
			t.Fatalf("out-of-scope acquire: %d %s", r.Status, r.Body)
		}
	}
	close(stop)
	wg.Wait()
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	return corrs, n.Load()
}

// tallyFlood indexes events by correlation id and counts the written
// auth failures and the events aggregated as dropped, unauthenticated and
// authenticated.
func tallyFlood(evs []audit.Event) (byCorr map[string]audit.Event, authFailed, droppedUnauth, droppedAuth int64) {
	byCorr = map[string]audit.Event{}
	for _, e := range evs {
		byCorr[e.CorrelationID] = e
		switch {
		case e.EventType == audit.EventAuthFailed:
			authFailed++
		case e.EventType == audit.EventDropped && e.Reason == audit.DroppedUnauthenticated:
			droppedUnauth += e.DroppedCount
		case e.EventType == audit.EventDropped:
			droppedAuth += e.DroppedCount
		}
	}
	return byCorr, authFailed, droppedUnauth, droppedAuth
}
