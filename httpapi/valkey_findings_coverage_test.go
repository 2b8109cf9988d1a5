package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
	vk "github.com/valkey-io/valkey-go"
)

// Issue 11 asks for its reproductions over HTTP for findings 2, 3 and 6,
// on bolt and on a real redis-server wherever a backend is involved. The
// tests of audit_e2e_test.go, list_scope_test.go, e2e_replay_test.go and
// e2e_wire_test.go run the real binary on bolt; the tests here run the
// same attacks against `starlease serve --backend valkey` on a durable
// redis-server (leases, credentials and the audit stream in Valkey), and
// read the audit events back from the Valkey stream.

// valkeyServer is a server on the valkey backend in its own key prefix of r.
type valkeyServer struct {
	*e2eServer
	redis  *testenv.Redis
	prefix string
}

var valkeyPrefixSeq atomic.Int64

func startValkeyServer(t *testing.T, bin string, r *testenv.Redis, extra ...string) *valkeyServer {
	t.Helper()
	prefix := fmt.Sprintf("i11cov%d-%s", valkeyPrefixSeq.Add(1), uniqueID("p")[2:])
	args := append([]string{"--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-key-prefix", prefix}, extra...)
	return &valkeyServer{e2eServer: startServer(t, bin, newRowRecorder(), args...), redis: r, prefix: prefix}
}

// stream reads every event of the server's Valkey audit stream, in stream
// order, paging with Filter.After.
func (v *valkeyServer) stream(t *testing.T) []audit.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vs, err := valkey.Open(ctx, valkey.Options{Addr: v.redis.Addr(), KeyPrefix: v.prefix, ReapInterval: -1})
	if err != nil {
		t.Fatalf("valkey.Open: %v", err)
	}
	defer vs.Close()
	sink := vs.AuditSink(valkey.AuditOptions{})
	var all []audit.Event
	after := ""
	for {
		page, err := sink.Read(ctx, audit.Filter{After: after}, audit.MaxReadLimit)
		if err != nil {
			t.Fatalf("reading the Valkey audit stream: %v", err)
		}
		all = append(all, page...)
		if len(page) < audit.MaxReadLimit {
			return all
		}
		after = page[len(page)-1].EventID
	}
}

// redactor is the server's keyed redaction (its pepper's key).
func (v *valkeyServer) redactor(t *testing.T) *audit.Redactor {
	t.Helper()
	return serverRedactor(t, v.e2eServer)
}

// serverRedactor is the keyed redaction of server s (its pepper's key), to
// compute the audited form of a value.
func serverRedactor(t *testing.T, s *e2eServer) *audit.Redactor {
	t.Helper()
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
	return red
}

// TestAuditInputCannotSwitchOffAuditOnValkey is issue 11 §2 over HTTP on
// Valkey: a 64-hex target id, correlation, request or execution id never
// suppresses an event in the Valkey stream; a 401 with a 64-hex
// correlation id is audited; an administrator's revoke and force-release
// of a lease whose target id, request id or correlation id is 64 hex
// succeed, end the lease and are audited (high priority, attempt then
// result) with the value's keyed hash; no raw value reaches the stream,
// the local audit file or the server's output.
func TestAuditInputCannotSwitchOffAuditOnValkey(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	s := startValkeyServer(t, bin, testenv.StartRedis(t))
	admin := s.createKey("admin-audit-vk", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
		"tenant:*,program:*,target-namespace:*,target:*,actor:*")
	cl := s.createKey("prn-audit-vk", "api_client", "targets:lease",
		"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	red := s.redactor(t)
	var raws []string

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
	type sent struct {
		leaseID, field, value string
	}
	var acquires []sent
	for _, field := range []string{"target_id", "X-Correlation-ID", "request_id", "execution_id"} {
		v := hex64()
		raws = append(raws, v)
		body, corr, target := map[string]any{}, uniqueID("corr"), uniqueID("target")
		switch field {
		case "target_id":
			target = v
		case "X-Correlation-ID":
			corr = v
		default:
			body[field] = v
		}
		l, _ := acquire(t, target, body, corr)
		acquires = append(acquires, sent{l["lease_id"].(string), field, v})
	}

	badCorr := hex64()
	raws = append(raws, badCorr)
	if r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: "star_sk_v1_not-a-key",
		Body: acquireBody(identity("x", "usernamegen"), "req-1"), Header: [][2]string{{"X-Correlation-ID", badCorr}}}); r.Status != 401 {
		t.Fatalf("bad key: %d %s", r.Status, r.Body)
	}

	var admins []sent
	for _, op := range []struct{ path, code string }{{"revoke", "lease_revoked"}, {"force-release", "lease_released"}} {
		for _, hostile := range []string{"target_id", "request_id", "X-Correlation-ID"} {
			v := hex64()
			raws = append(raws, v)
			target := uniqueID("adm")
			if hostile == "target_id" {
				target = v
			}
			l, id := acquire(t, target, nil, uniqueID("corr"))
			leaseID := l["lease_id"].(string)
			body := map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"],
				"reason": "operator cleanup", "request_id": uniqueID("adm-req")}
			corr := uniqueID("corr")
			if hostile == "request_id" {
				body["request_id"] = v
			}
			if hostile == "X-Correlation-ID" {
				corr = v
			}
			r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/" + leaseID + "/" + op.path, Key: admin.APIKey,
				Body: body, Header: [][2]string{{"X-Correlation-ID", corr}}})
			if r.Status != 200 || r.code() != op.code {
				t.Fatalf("%s with a 64-hex %s on valkey: %d %s", op.path, hostile, r.Status, r.Body)
			}
			renew := s.do(t, rawReq{Method: "POST", Path: apiBase + "/" + leaseID + "/renew", Key: cl.APIKey,
				Body: map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"],
					"service_instance_id": "inst-raw", "request_id": uniqueID("renew")}})
			if renew.Status != 409 || renew.code() != "lease_lost" {
				t.Fatalf("renew after %s: %d %s", op.path, renew.Status, renew.Body)
			}
			admins = append(admins, sent{leaseID, op.path + "/" + hostile, v})
		}
	}

	evs := s.stream(t)
	fieldOf := func(e audit.Event, field string) string {
		return map[string]string{"target_id": e.TargetID, "X-Correlation-ID": e.CorrelationID, "request_id": e.RequestID,
			"execution_id": e.ExecutionID}[field]
	}
	for _, a := range acquires {
		got := eventsFor(evs, audit.EventAcquire, a.leaseID)
		if len(got) != 1 || got[0].ResultCode != lease.CodeAcquired || got[0].PrincipalID != "prn-audit-vk" {
			t.Errorf("acquire with a 64-hex %s: %d events in the Valkey stream %+v, want 1", a.field, len(got), got)
			continue
		}
		if want := red.Value(a.value); fieldOf(got[0], a.field) != want {
			t.Errorf("%s audited as %q, want its keyed hash %q", a.field, fieldOf(got[0], a.field), want)
		}
	}
	n := 0
	for _, e := range evs {
		if e.EventType == audit.EventAuthFailed && e.CorrelationID == red.Value(badCorr) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("a 401 with a 64-hex correlation id: %d auth-failure events in the Valkey stream, want 1", n)
	}
	for _, a := range admins {
		typ, code := audit.EventRevoke, lease.CodeRevoked
		if strings.HasPrefix(a.field, "force-release") {
			typ, code = audit.EventForceRelease, lease.CodeForceReleased
		}
		got := eventsFor(evs, typ, a.leaseID)
		if len(got) != 2 || got[0].ResultCode != lease.CodeOutcomeUnknown || got[1].ResultCode != code {
			t.Errorf("%s audited in the Valkey stream as %+v; want the attempt then the result", a.field, got)
			continue
		}
		hostile := a.field[strings.Index(a.field, "/")+1:]
		for _, e := range got {
			if e.Priority != audit.PriorityHigh || e.PrincipalID != "admin-audit-vk" || fieldOf(e, hostile) != red.Value(a.value) {
				t.Errorf("%s event %+v (want high priority, the admin, %s as its keyed hash)", a.field, e, hostile)
			}
		}
	}

	if err := s.Stop(); err != nil {
		t.Errorf("server did not stop cleanly: %v", err)
	}
	streamJSON, _ := json.Marshal(s.stream(t))
	blobs := map[string][]byte{"Valkey audit stream": streamJSON, "server stderr": s.Stderr(), "server stdout": s.Stdout(),
		"audit.jsonl": readFileOrEmpty(t, filepath.Join(s.DataDir(), "audit.jsonl"))}
	for name, b := range blobs {
		b = bytes.ToLower(b)
		for _, v := range raws {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a raw 64-hex value sent by a caller", name)
			}
		}
	}
	if bytes.Contains(s.Stderr(), []byte("audit write failed")) || bytes.Contains(s.Stderr(), []byte("durable audit")) {
		t.Errorf("the server failed to write audit events:\n%s", s.Stderr())
	}
}

// TestListScopeOnValkey is TestListScope (issue 11 §3) against a server on
// Valkey: every list route and history as callers of every scope shape,
// pages holding exactly the visible leases, opaque tokens, tokens refused
// for another principal, scope, filter or identity, and tokens valid
// across a restart.
func TestListScopeOnValkey(t *testing.T) {
	s := startValkeyServer(t, testenv.BuildStarlease(t), testenv.StartRedis(t))
	f := newListFixtureOn(t, s.e2eServer)
	t.Run("pages", f.pages)
	t.Run("history", f.historyPages)
	t.Run("tokens_bound", f.tokensBound)
	t.Run("tokens_survive_restart", f.tokensSurviveRestart)
}

// TestReplayResolvesUnderLimitsOnValkey is TestReplayResolvesUnderLimits
// (issue 11 §6, first bullet) on Valkey: the retry of a committed acquire,
// renew, release, force-release or revoke is answered from its evidence,
// not 429, while the principal's rate limit or the active-lease quota
// (counted in Valkey) refuses new work.
func TestReplayResolvesUnderLimitsOnValkey(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	r := testenv.StartRedis(t)
	t.Run("rate_limit", func(t *testing.T) {
		s := startValkeyServer(t, bin, r, "--principal-rate", "1")
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
				}, func(k *e2eKey, later func(func())) { sc.run(t, s.e2eServer, k, later) })
			})
		}
	})
	t.Run("active_quota", func(t *testing.T) {
		s := startValkeyServer(t, bin, r, "--max-active-per-principal", "1")
		k := s.createKey("prn-quota", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
		first := identity("quota-1", "usernamegen")
		body := acquireBody(first, uniqueID("req-quota"))
		a1 := post(t, s.e2eServer, k, "/acquire", body)
		wantStatus(t, a1, 200, "lease_acquired")
		second := acquireBody(identity("quota-2", "usernamegen"), uniqueID("req-quota"))
		wantStatus(t, post(t, s.e2eServer, k, "/acquire", second), 429, "lease_rate_limited")
		wantReplay(t, post(t, s.e2eServer, k, "/acquire", body), a1)
		wantStatus(t, post(t, s.e2eServer, k, "/acquire", with(body, "ttl_ms", 31000)), 409, "idempotency_conflict")
		wantStatus(t, post(t, s.e2eServer, k, "/acquire", second), 429, "lease_rate_limited")
		l := leaseOf(t, a1, "lease")
		relBody := heldBody(first, l, uniqueID("req-rel"))
		rel := post(t, s.e2eServer, k, "/"+l["lease_id"].(string)+"/release", relBody)
		wantStatus(t, rel, 200, "lease_released")
		wantStatus(t, post(t, s.e2eServer, k, "/acquire", second), 200, "lease_acquired")
		// The quota is full again; the release's retry is still its result.
		wantReplay(t, post(t, s.e2eServer, k, "/"+l["lease_id"].(string)+"/release", relBody), rel)
	})
}

// TestSmallerFindingsOnValkey covers the backend-involving bullets of issue
// 11 §6 over HTTP on Valkey: metadata holding credential material is
// refused and nothing of it is stored (records, history, audit stream);
// deadline_at "0001-01-01T00:00:00Z" is a past deadline (408) on every
// mutation and changes nothing in Valkey; and under a flood of bad keys an
// authenticated principal's denials each reach the Valkey stream.
func TestSmallerFindingsOnValkey(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	r := testenv.StartRedis(t)
	t.Run("metadata_secrets", func(t *testing.T) {
		s := startValkeyServer(t, bin, r)
		cl := s.createKey("prn-meta-vk", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
		for name, md := range map[string]map[string]any{
			"password key": {"password": "hunter2-canary"}, "bearer value": {"note": "Bearer hunter2-canary"},
			"api key value": {"note": "star_sk_v1_01J0000000000000000000000A_" + strings.Repeat("ab", 32)},
			"64-hex value":  {"note": "hunter2-canary " + hex64()},
		} {
			id := identity(uniqueID("meta"), "usernamegen")
			b := acquireBody(id, uniqueID("req"))
			b["metadata"] = md
			r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey, Body: b})
			if r.Status != 400 || r.code() != "invalid_lease_request" || r.str("field") != "metadata" || strings.Contains(string(r.Body), "hunter2") {
				t.Errorf("metadata with %s: %d %s", name, r.Status, r.Body)
			}
			// Nothing was acquired: the identity is free for a clean acquire.
			ok := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: cl.APIKey, Body: acquireBody(id, uniqueID("req"))})
			if ok.Status != 200 || leaseOf(t, ok, "lease")["fencing_token"].(float64) != 1 {
				t.Errorf("after the refused acquire with %s: %d %s (want the identity's first lease)", name, ok.Status, ok.Body)
			}
		}
		evs, _ := json.Marshal(s.stream(t))
		if bytes.Contains(evs, []byte("hunter2")) {
			t.Errorf("the Valkey audit stream holds refused metadata")
		}
		if dump := redisDump(t, r, s.prefix); bytes.Contains(dump, []byte("hunter2")) {
			t.Errorf("Valkey holds refused metadata under %s", s.prefix)
		}
	})

	t.Run("zero_deadline", func(t *testing.T) {
		s := startValkeyServer(t, bin, r)
		k := s.createKey("prn-zero-vk", "administrator", "targets:lease,targets:read,targets:force-release,audit:read",
			"tenant:tenant-a,program:program-a")
		id := identity("vk-zero-deadline", "usernamegen")
		a := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: k.APIKey, Body: acquireBody(id, uniqueID("req"))})
		wantStatus(t, a, 200, "lease_acquired")
		l := leaseOf(t, a, "lease")
		leaseID := l["lease_id"].(string)
		held := heldBody(id, l, "")
		adm := map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"], "reason": "cleanup"}
		fresh := identity(uniqueID("vk-zero"), "usernamegen")
		for _, req := range []rawReq{
			{Method: "POST", Path: apiBase + "/acquire", Body: acquireBody(fresh, "")},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/renew", Body: held},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/release", Body: held},
			{Method: "DELETE", Path: apiBase + "/" + leaseID, Body: held},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/force-release", Body: adm},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/revoke", Body: adm},
		} {
			req.Key = k.APIKey
			req.Body = with(req.Body.(map[string]any), "deadline_at", "0001-01-01T00:00:00Z", "request_id", uniqueID("req"))
			if got := s.do(t, req); got.Status != 408 || got.code() != "deadline_exceeded" {
				t.Errorf("%s %s with deadline_at 0001-01-01: %d %s", req.Method, req.Path, got.Status, got.Body)
			}
		}
		got := s.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseID, Key: k.APIKey})
		wantStatus(t, got, 200, "lease_inspected")
		if now := leaseOf(t, got, "lease"); now["state"] != "active" || now["expires_at"] != l["expires_at"] {
			t.Errorf("after requests with a past deadline the lease is %s, acquired as %s", got.Body, a.Body)
		}
		// The refused acquire granted nothing: the fresh identity's first
		// lease has token 1.
		f := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: k.APIKey, Body: acquireBody(fresh, uniqueID("req"))})
		if f.Status != 200 || leaseOf(t, f, "lease")["fencing_token"].(float64) != 1 {
			t.Errorf("acquire after the refused one: %d %s", f.Status, f.Body)
		}
	})

	t.Run("bad_key_flood", func(t *testing.T) {
		s := startValkeyServer(t, bin, r)
		cl := s.createKey("prn-flood-vk", "api_client", "targets:lease",
			"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
		corrs, flooded := floodBadKeysThenDeny(t, s.e2eServer, cl.APIKey)
		byCorr, authFailed, droppedUnauth, droppedAuth := tallyFlood(s.stream(t))
		t.Logf("%d bad keys sent, %d audited, %d aggregated; %d authenticated events aggregated",
			flooded, authFailed, droppedUnauth, droppedAuth)
		if droppedUnauth == 0 || authFailed+droppedUnauth != flooded {
			t.Errorf("the flood of %d bad keys: %d in the Valkey stream, %d in unauthenticated aggregates; want every one accounted for, some aggregated",
				flooded, authFailed, droppedUnauth)
		}
		for i, corr := range corrs {
			if e, ok := byCorr[corr]; !ok || e.ResultCode != lease.CodeAccessDenied || e.PrincipalID != "prn-flood-vk" {
				t.Errorf("denial %d of the authenticated principal in the Valkey stream: %+v (present %v)", i, e, ok)
			}
		}
		if droppedAuth != 0 {
			t.Errorf("%d authenticated events were aggregated", droppedAuth)
		}
	})
}

// redisDump is every key under prefix and its value (strings, hashes,
// lists, sets, sorted sets and streams), for searching what Valkey stores.
func redisDump(t *testing.T, r *testenv.Redis, prefix string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := vk.NewClient(vk.ClientOption{InitAddress: []string{r.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys, err := c.Do(ctx, c.B().Keys().Pattern(prefix+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	if len(keys) == 0 {
		t.Fatalf("no key under %s: the dump would prove nothing", prefix)
	}
	t.Logf("searching %d keys under %s", len(keys), prefix)
	var out bytes.Buffer
	for _, k := range keys {
		typ, err := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		if err != nil {
			t.Fatalf("TYPE %s: %v", k, err)
		}
		var cmd vk.Completed
		switch typ {
		case "string":
			cmd = c.B().Get().Key(k).Build()
		case "hash":
			cmd = c.B().Hgetall().Key(k).Build()
		case "list":
			cmd = c.B().Lrange().Key(k).Start(0).Stop(-1).Build()
		case "set":
			cmd = c.B().Smembers().Key(k).Build()
		case "zset":
			cmd = c.B().Zrange().Key(k).Min("0").Max("-1").Build()
		case "stream":
			cmd = c.B().Xrange().Key(k).Start("-").End("+").Build()
		default:
			fmt.Fprintf(&out, "%s (%s)\n", k, typ)
			continue
		}
		v, err := c.Do(ctx, cmd).ToAny()
		if err != nil {
			t.Fatalf("reading %s (%s): %v", k, typ, err)
		}
		fmt.Fprintf(&out, "%s %v\n", k, v)
	}
	return out.Bytes()
}
