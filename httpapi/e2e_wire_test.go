package httpapi_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
)

// wireKeys are the keys of a server for the request-edge tests.
type wireKeys struct {
	admin, client, reader, auditor *e2eKey
}

func startWireServer(t *testing.T) (*e2eServer, wireKeys) {
	t.Helper()
	s := startServer(t, testenv.BuildStarlease(t), newRowRecorder())
	scope := "tenant:tenant-a,program:program-a"
	return s, wireKeys{
		admin:   s.createKey("prn-wire-admin", "administrator", "targets:lease,targets:read,targets:force-release,audit:read", scope),
		client:  s.createKey("prn-wire-client", "api_client", "targets:lease", scope),
		reader:  s.createKey("prn-wire-reader", "api_client", "targets:read", scope),
		auditor: s.createKey("prn-wire-auditor", "api_client", "audit:read", scope),
	}
}

// bodyRoutes are the routes that take a JSON body, with a body the
// administrator key may send (its lease id and identity need not exist).
func bodyRoutes() []rawReq {
	id := identity("wire-ct", "usernamegen")
	held := map[string]any{"lock_identity": id, "fencing_token": 1, "service_instance_id": "inst-raw", "request_id": uniqueID("req")}
	admin := map[string]any{"lock_identity": id, "fencing_token": 1, "reason": "cleanup", "request_id": uniqueID("req")}
	return []rawReq{
		{Method: "POST", Path: apiBase + "/acquire", Body: acquireBody(id, uniqueID("req"))},
		{Method: "POST", Path: apiBase + "/lease_01WIRE/renew", Body: held},
		{Method: "POST", Path: apiBase + "/lease_01WIRE/release", Body: held},
		{Method: "DELETE", Path: apiBase + "/lease_01WIRE", Body: held},
		{Method: "POST", Path: apiBase + "/lease_01WIRE/force-release", Body: admin},
		{Method: "POST", Path: apiBase + "/lease_01WIRE/revoke", Body: admin},
		{Method: "POST", Path: apiBase + "/inspect", Body: map[string]any{"lock_identity": id}},
		{Method: "POST", Path: apiBase + "/commits/authorize", Body: map[string]any{"lock_identity": id, "lease_id": "lease_01WIRE",
			"fencing_token": 1, "service_instance_id": "inst-raw", "sink": "couchdb", "commit_id": "c-1", "execution_id": "e"}},
	}
}

// Every route that takes a body takes exactly application/json, with at
// most a charset parameter of utf-8; anything else, a missing
// Content-Type included, is 400 invalid_lease_request naming Content-Type.
func TestContentTypeIsExactlyJSON(t *testing.T) {
	s, k := startWireServer(t)
	refused := [][][2]string{
		{{"Content-Type", "application/jsonx"}},
		{{"Content-Type", "application/json-patch+json"}},
		{{"Content-Type", "text/json"}},
		{{"Content-Type", "text/plain"}},
		{{"Content-Type", "application/json; charset=latin1"}},
		{{"Content-Type", "application/json; charset=utf-16"}},
		{{"Content-Type", "application/json; profile=x"}},
		{{"Content-Type", "application/json; charset=utf-8; charset=latin1"}},
		{{"Content-Type", "application/json,text/plain"}},
		{{"Content-Type", ""}},
		{},                                     // missing
		{{"Content-Type", "application/json"}}, // twice (with the one do sets)
	}
	for _, rt := range bodyRoutes() {
		for _, h := range refused {
			r := rt
			r.Key = k.admin.APIKey
			twice := len(h) == 1 && h[0][1] == "application/json"
			if !twice {
				r.Header = append([][2]string{{"Content-Type", "\x00delete"}}, h...)
			} else {
				r.Header = h
			}
			got := s.do(t, r)
			if got.Status != 400 || got.code() != "invalid_lease_request" || got.str("field") != "Content-Type" {
				t.Errorf("%s %s with Content-Type %q: %d %s", r.Method, r.Path, h, got.Status, got.Body)
			}
		}
	}
	// Accepted spellings: the media type is case-insensitive, and so is the
	// charset's value.
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", `Application/JSON;charset="UTF-8"`} {
		r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: k.client.APIKey,
			Body:   acquireBody(identity(uniqueID("wire-ct-ok"), "usernamegen"), uniqueID("req")),
			Header: [][2]string{{"Content-Type", "\x00delete"}, {"Content-Type", ct}}})
		if r.Status != 200 || r.code() != "lease_acquired" {
			t.Errorf("acquire with Content-Type %q: %d %s", ct, r.Status, r.Body)
		}
	}
}

// force-release and revoke check the capability right after
// authentication, before the body is read: a caller without
// targets:force-release (or not an administrator) gets 403 access_denied
// for a malformed body or content type too, never the body's validation
// details.
func TestAdminCapabilityBeforeBody(t *testing.T) {
	s, k := startWireServer(t)
	noForce := s.createKey("prn-wire-noforce", "administrator", "targets:lease,targets:read,audit:read", "tenant:tenant-a,program:program-a")
	malformed := []struct {
		name   string
		body   any
		header [][2]string
	}{
		{"not JSON", "{not json", nil},
		{"wrong field types", `{"lock_identity":5,"fencing_token":"x"}`, nil},
		{"unknown field", `{"surprise":true}`, nil},
		{"no reason", map[string]any{"lock_identity": identity("wire-adm", "usernamegen"), "fencing_token": 1, "request_id": "r-1"}, nil},
		{"wrong content type", `{}`, [][2]string{{"Content-Type", "\x00delete"}, {"Content-Type", "text/plain"}}},
	}
	for _, op := range []string{"force-release", "revoke"} {
		path := apiBase + "/lease_01WIRE/" + op
		for _, key := range []*e2eKey{k.client, k.reader, k.auditor, noForce} {
			for _, m := range malformed {
				got := s.do(t, rawReq{Method: "POST", Path: path, Key: key.APIKey, Body: m.body, Header: m.header})
				if got.Status != 403 || got.code() != "access_denied" {
					t.Errorf("%s by %s, %s: %d %s", op, key.Principal, m.name, got.Status, got.Body)
				}
			}
		}
		// With the capability, the same malformed body is the 400 it is.
		got := s.do(t, rawReq{Method: "POST", Path: path, Key: k.admin.APIKey, Body: "{not json"})
		if got.Status != 400 || got.code() != "invalid_lease_request" || got.str("field") != "body" {
			t.Errorf("malformed %s by the administrator: %d %s", op, got.Status, got.Body)
		}
	}
}

// deadline_at "0001-01-01T00:00:00Z" is a deadline like any other, long
// past, not the absence of one: 408 deadline_exceeded, and nothing done.
func TestZeroDeadlineIsPast(t *testing.T) {
	s, k := startWireServer(t)
	id := identity("wire-zero-deadline", "usernamegen")
	a := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: k.admin.APIKey, Body: acquireBody(id, uniqueID("req"))})
	wantStatus(t, a, 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	leaseID := l["lease_id"].(string)
	held := heldBody(id, l, "")
	admin := map[string]any{"lock_identity": id, "fencing_token": l["fencing_token"], "reason": "cleanup"}
	for _, zero := range []string{"0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000Z", "0001-01-01T01:00:00+01:00"} {
		for _, r := range []rawReq{
			{Method: "POST", Path: apiBase + "/acquire", Body: acquireBody(identity(uniqueID("wire-zero"), "usernamegen"), "")},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/renew", Body: held},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/release", Body: held},
			{Method: "DELETE", Path: apiBase + "/" + leaseID, Body: held},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/force-release", Body: admin},
			{Method: "POST", Path: apiBase + "/" + leaseID + "/revoke", Body: admin},
		} {
			r.Key = k.admin.APIKey
			r.Body = with(r.Body.(map[string]any), "deadline_at", zero, "request_id", uniqueID("req"))
			got := s.do(t, r)
			if got.Status != 408 || got.code() != "deadline_exceeded" {
				t.Errorf("%s %s with deadline_at %s: %d %s", r.Method, r.Path, zero, got.Status, got.Body)
			}
		}
	}
	// Nothing was done: the lease is as acquired, and no other was granted.
	got := s.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseID, Key: k.admin.APIKey})
	wantStatus(t, got, 200, "lease_inspected")
	if now := leaseOf(t, got, "lease"); now["state"] != "active" || now["expires_at"] != l["expires_at"] {
		t.Errorf("after requests with a past deadline the lease is %s, acquired as %s", got.Body, a.Body)
	}
	list := s.do(t, rawReq{Method: "GET", Path: apiBase + "?owner_principal_id=prn-wire-admin", Key: k.admin.APIKey})
	if leases, _ := list.JSON["leases"].([]any); list.Status != 200 || len(leases) != 1 {
		t.Errorf("leases of the caller after requests with a past deadline: %s", list.Body)
	}
}

// Query parameters are parsed strictly on every GET route: a pair
// url.ParseQuery cannot parse (a ';', a bad %-escape), which url.Values
// would silently drop, an unknown parameter and a repeated one are each
// 400 invalid_lease_request naming the parameter, so "give it once" and
// "unknown parameter" see every pair the client sent.
func TestQueryParametersParsedStrictly(t *testing.T) {
	s, k := startWireServer(t)
	a := post(t, s, k.client, "/acquire", acquireBody(identity("x-query", "usernamegen"), uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	leaseID := leaseOf(t, a, "lease")["lease_id"].(string)
	for _, c := range []struct {
		key         *e2eKey
		path, field string
	}{
		{k.admin, "/?owner_principal_id=prn-wire-client&owner_principal_id=prn-other;x", "owner_principal_id"},
		{k.admin, "/?owner_principal_id=prn-wire-client&owner_principal_id=%zz", "owner_principal_id"},
		{k.admin, "/?owner_principal_id=prn-wire-client&bogus;=1", "bogus;"},
		{k.admin, "/?owner_principal_id=prn-wire-client&page_size=1;page_size=100", "page_size"},
		{k.admin, "/?owner_principal_id=prn-wire-client&bogus=1", "bogus"},
		{k.auditor, "/" + leaseID + "/history?page_size=1&page_size=1000", "page_size"},
		{k.auditor, "/" + leaseID + "/history?page_token=&page_token=forged", "page_token"},
		{k.auditor, "/" + leaseID + "/history?page_size=1;x", "page_size"},
		{k.admin, "/" + leaseID + "?;", ";"},
		{k.admin, "/" + leaseID + "?x=%zz", "x"},
		{k.admin, "/" + leaseID + "?x=1", "x"},
	} {
		r := s.do(t, rawReq{Method: "GET", Path: apiBase + c.path, Key: c.key.APIKey})
		if r.Status != 400 || r.code() != "invalid_lease_request" || r.str("field") != c.field {
			t.Errorf("GET %s: want 400 invalid_lease_request on %s, got %d %s", c.path, c.field, r.Status, r.Body)
		}
	}
	for _, c := range []struct {
		key  *e2eKey
		path string
	}{
		{k.admin, "/?owner_principal_id=prn-wire-client&page_size=1&page_token="},
		{k.auditor, "/" + leaseID + "/history?page_size=1"},
		{k.admin, "/" + leaseID},
	} {
		if r := s.do(t, rawReq{Method: "GET", Path: apiBase + c.path, Key: c.key.APIKey}); r.Status != 200 {
			t.Errorf("GET %s: want 200, got %d %s", c.path, r.Status, r.Body)
		}
	}
}

// Reads take X-Request-Timeout-Ms as mutations do: list, inspect (GET and
// POST /inspect) and history refuse 0, -1 or a value that is not a number
// with 400 invalid_lease_request on X-Request-Timeout-Ms, and a valid one
// is the read's deadline (audited as the client's, or capped by the
// server), not the server's default.
func TestReadsHonourRequestTimeout(t *testing.T) {
	s, k := startWireServer(t)
	id := identity("x-timeout", "usernamegen")
	a := post(t, s, k.client, "/acquire", acquireBody(id, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	leaseID := leaseOf(t, a, "lease")["lease_id"].(string)
	reads := []rawReq{
		{Method: "GET", Path: apiBase + "/?owner_principal_id=prn-wire-client"},
		{Method: "GET", Path: apiBase + "/" + leaseID},
		{Method: "GET", Path: apiBase + "/" + leaseID + "/history"},
		{Method: "POST", Path: apiBase + "/inspect", Body: map[string]any{"lock_identity": id}},
	}
	for _, req := range reads {
		for _, v := range []string{"0", "-1", "soon"} {
			req.Key, req.Header = k.admin.APIKey, [][2]string{{"X-Request-Timeout-Ms", v}}
			r := s.do(t, req)
			if r.Status != 400 || r.code() != "invalid_lease_request" || r.str("field") != "X-Request-Timeout-Ms" {
				t.Errorf("%s %s with X-Request-Timeout-Ms %s: want 400 on X-Request-Timeout-Ms, got %d %s", req.Method, req.Path, v, r.Status, r.Body)
			}
		}
	}
	want := map[string]string{}
	for i, req := range reads {
		for v, class := range map[string]string{"5000": audit.DeadlineClient, "86400000": audit.DeadlineCapped} {
			corr := fmt.Sprintf("corr-read-timeout-%d-%s", i, class)
			req.Key, req.Header = k.admin.APIKey, [][2]string{{"X-Request-Timeout-Ms", v}, {"X-Correlation-ID", corr}}
			if r := s.do(t, req); r.Status != 200 {
				t.Errorf("%s %s with X-Request-Timeout-Ms %s: want 200, got %d %s", req.Method, req.Path, v, r.Status, r.Body)
			}
			want[corr] = class
		}
	}
	events, err := audit.ReadFile(filepath.Join(s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if class, ok := want[e.CorrelationID]; ok {
			if e.DeadlineClass != class {
				t.Errorf("%s %s: deadline class %q, want %q", e.CorrelationID, e.EventType, e.DeadlineClass, class)
			}
			delete(want, e.CorrelationID)
		}
	}
	if len(want) != 0 {
		t.Errorf("reads without an audit event: %v", want)
	}
}
