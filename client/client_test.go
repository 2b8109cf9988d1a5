package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/lease"
)

// testKey has the shape of a real key; its secret part must never leak.
const (
	testSecret = "5f1d0c7e9a2b4c6d8e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"
	testKey    = "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ0_" + testSecret
)

var ident = lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns",
	TargetID: "target-1", ActorName: "usernamegen"}

const leaseJSON = `{"lock_identity":{"tenant_id":"tenant-a","program_id":"program-a","target_namespace":"ns",` +
	`"target_id":"target-1","actor_name":"usernamegen","workflow_name":"default","operation_class":"default"},` +
	`"lease_id":"lease_01","fencing_token":42,"acquired_at":"2026-08-05T12:00:00.000Z",` +
	`"renewed_at":"2026-08-05T12:00:00.000Z","expires_at":"2026-08-05T12:00:30.000Z","ttl_ms":30000,"state":"active"}`

// lockKeyOf is the canonical lock key of id, as a server answers it.
func lockKeyOf(id lease.Identity) string {
	classes := lease.DefaultOperationClasses()
	if id.OperationClass != "" {
		classes, _ = lease.NewOperationClasses(id.OperationClass)
	}
	_, key, err := lease.CanonicalLockKey(id, classes)
	if err != nil {
		panic(err)
	}
	return key
}

func success(code string, extra string) string {
	return `{"status":"success","code":"` + code + `","correlation_id":"corr_1"` + extra + `}`
}

// seen is one request the fake server received.
type seen struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

// fake is an httptest server answering with a handler the test sets.
type fake struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []seen
	h    http.HandlerFunc
}

func newFake(t *testing.T, h http.HandlerFunc) *fake {
	f := &fake{h: h}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), b})
		h := f.h
		f.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) last(t *testing.T) seen {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("the server saw no request")
	}
	return f.reqs[len(f.reqs)-1]
}

func (f *fake) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.reqs) }

func answer(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Correlation-ID", "corr_1")
		w.WriteHeader(status)
		io.WriteString(w, body+"\n")
	}
}

func newClient(t *testing.T, base string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(base, testKey, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func asError(t *testing.T, err error) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *client.Error", err, err)
	}
	return ce
}

func decodeBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("request body %q: %v", b, err)
	}
	return m
}

var requestIDRE = regexp.MustCompile(`^req_[0-9A-HJKMNP-TV-Z]{26}$`)

func TestAcquireRequestShape(t *testing.T) {
	f := newFake(t, answer(200, success("lease_acquired", `,"lease":`+leaseJSON)))
	c := newClient(t, f.srv.URL)
	res, err := c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: ident, TTLMs: 30000,
		ServiceInstanceID: "inst-1", ExecutionID: "exec-1", JobID: "job-1", Metadata: map[string]any{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	r := f.last(t)
	if r.Method != "POST" || r.Path != "/api/v1/target-leases/acquire" {
		t.Fatalf("request %s %s", r.Method, r.Path)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+testKey {
		t.Fatalf("Authorization %q", got)
	}
	if r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("Content-Type %q", r.Header.Get("Content-Type"))
	}
	if v := r.Header.Values("Idempotency-Key"); len(v) != 0 {
		t.Fatalf("request id must travel only in the body, got Idempotency-Key %q", v)
	}
	body := decodeBody(t, r.Body)
	id, _ := body["request_id"].(string)
	if !requestIDRE.MatchString(id) {
		t.Fatalf("generated request_id %q is not req_<ULID>", id)
	}
	if res.RequestID != id {
		t.Fatalf("result request id %q, sent %q", res.RequestID, id)
	}
	li, _ := body["lock_identity"].(map[string]any)
	if li["tenant_id"] != "tenant-a" || li["actor_name"] != "usernamegen" || body["ttl_ms"] != 30000.0 ||
		body["service_instance_id"] != "inst-1" || body["execution_id"] != "exec-1" || body["job_id"] != "job-1" {
		t.Fatalf("body %v", body)
	}
	for _, absent := range []string{"deadline_at", "wait_ms", "maximum_lifetime_ms", "trace_id"} {
		if _, ok := body[absent]; ok {
			t.Errorf("optional %s sent although unset: %v", absent, body)
		}
	}
	// Default timeout: the deadline travels as X-Request-Timeout-Ms.
	ms, err := strconv.Atoi(r.Header.Get("X-Request-Timeout-Ms"))
	if err != nil || ms <= 0 || ms > int(client.DefaultTimeout/time.Millisecond) {
		t.Fatalf("X-Request-Timeout-Ms %q", r.Header.Get("X-Request-Timeout-Ms"))
	}
	want := client.Lease{LockIdentity: lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns",
		TargetID: "target-1", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"},
		LeaseID: "lease_01", FencingToken: 42, AcquiredAt: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC),
		RenewedAt: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC), ExpiresAt: time.Date(2026, 8, 5, 12, 0, 30, 0, time.UTC),
		TTLMs: 30000, State: lease.StateActive}
	if res.Lease != want || res.Code != lease.CodeAcquired || res.CorrelationID != "corr_1" || res.Replayed || res.Current != nil {
		t.Fatalf("result %+v", res)
	}
	if res.Lease.TTL() != 30*time.Second {
		t.Fatalf("TTL %v", res.Lease.TTL())
	}
}

func TestRequestIDKeptAndDeadlines(t *testing.T) {
	f := newFake(t, answer(200, success("lease_renewed", `,"lease":`+leaseJSON+`,"replayed":true`)))
	c := newClient(t, f.srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res, err := c.Renew(ctx, client.RenewRequest{LeaseID: "lease_01", LockIdentity: ident, FencingToken: 42,
		ServiceInstanceID: "inst-1", RequestID: "my-request-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.RequestID != "my-request-1" {
		t.Fatalf("result %+v", res)
	}
	r := f.last(t)
	if r.Path != "/api/v1/target-leases/lease_01/renew" {
		t.Fatalf("path %s", r.Path)
	}
	if decodeBody(t, r.Body)["request_id"] != "my-request-1" {
		t.Fatalf("body %s", r.Body)
	}
	ms, err := strconv.Atoi(r.Header.Get("X-Request-Timeout-Ms"))
	if err != nil || ms <= 0 || ms > 1500 {
		t.Fatalf("X-Request-Timeout-Ms %q from a 1.5 s context", r.Header.Get("X-Request-Timeout-Ms"))
	}

	// A body deadline is sent instead of the header, never both.
	f.h = answer(200, success("lease_released", `,"lease":`+leaseJSON))
	at := time.Now().Add(time.Minute).UTC()
	if _, err := c.Release(ctx, client.ReleaseRequest{LeaseID: "lease_01", LockIdentity: ident, FencingToken: 42,
		ServiceInstanceID: "inst-1", DeadlineAt: at}); err != nil {
		t.Fatal(err)
	}
	r = f.last(t)
	if v := r.Header.Values("X-Request-Timeout-Ms"); len(v) != 0 {
		t.Fatalf("header %q sent with a body deadline_at", v)
	}
	got, err := time.Parse(time.RFC3339Nano, decodeBody(t, r.Body)["deadline_at"].(string))
	if err != nil || !got.Equal(at) {
		t.Fatalf("deadline_at %v (%v), want %v", got, err, at)
	}

	// No deadline anywhere: no header.
	c0 := newClient(t, f.srv.URL, client.WithTimeout(0))
	if _, err := c0.Release(context.Background(), client.ReleaseRequest{LeaseID: "lease_01", LockIdentity: ident,
		FencingToken: 42, ServiceInstanceID: "inst-1"}); err != nil {
		t.Fatal(err)
	}
	if v := f.last(t).Header.Values("X-Request-Timeout-Ms"); len(v) != 0 {
		t.Fatalf("header %q without any deadline", v)
	}
}

func TestRoutes(t *testing.T) {
	type tc struct {
		name         string
		answer       string
		run          func(c *client.Client) error
		method, path string
		query        string
		bodyKeys     []string
	}
	ctx := client.ContextWithCorrelationID(context.Background(), "my-corr-1")
	leaseAns := func(code string) string { return success(code, `,"lease":`+leaseJSON) }
	cases := []tc{
		{name: "force-release", answer: leaseAns("lease_released"), method: "POST", path: "/api/v1/target-leases/lease_01/force-release",
			bodyKeys: []string{"fencing_token", "lock_identity", "reason", "request_id"},
			run: func(c *client.Client) error {
				_, err := c.ForceRelease(ctx, client.AdminRequest{LeaseID: "lease_01", LockIdentity: ident, FencingToken: 42, Reason: "stuck"})
				return err
			}},
		{name: "revoke", answer: leaseAns("lease_revoked"), method: "POST", path: "/api/v1/target-leases/lease_01/revoke",
			bodyKeys: []string{"fencing_token", "incident_id", "lock_identity", "request_id"},
			run: func(c *client.Client) error {
				_, err := c.Revoke(ctx, client.AdminRequest{LeaseID: "lease_01", LockIdentity: ident, FencingToken: 42, IncidentID: "inc-1"})
				return err
			}},
		{name: "inspect", answer: leaseAns("lease_inspected"), method: "POST", path: "/api/v1/target-leases/inspect",
			bodyKeys: []string{"lock_identity"},
			run:      func(c *client.Client) error { _, err := c.Inspect(ctx, ident); return err }},
		{name: "get escapes the id", answer: leaseAns("lease_inspected"), method: "GET", path: "/api/v1/target-leases/a b",
			run: func(c *client.Client) error { _, err := c.Get(ctx, "a b"); return err }},
		{name: "list by owner", answer: success("lease_listed", `,"leases":[`+leaseJSON+`],"next_page_token":"tok2"`),
			method: "GET", path: "/api/v1/target-leases", query: "owner_principal_id=prn-a&page_size=5&page_token=tok1",
			run: func(c *client.Client) error {
				res, err := c.List(ctx, client.ListRequest{OwnerPrincipalID: "prn-a", PageSize: 5, PageToken: "tok1"})
				if err == nil && (len(res.Leases) != 1 || res.NextPageToken != "tok2" || res.Leases[0].FencingToken != 42) {
					err = fmt.Errorf("list result %+v", res)
				}
				return err
			}},
		{name: "list by target, empty page", answer: success("lease_listed", `,"next_page_token":""`),
			method: "GET", path: "/api/v1/target-leases", query: "program_id=program-a&target_id=t&target_namespace=ns&tenant_id=tenant-a",
			run: func(c *client.Client) error {
				res, err := c.List(ctx, client.ListRequest{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns", TargetID: "t"})
				if err == nil && (res.Leases == nil || len(res.Leases) != 0 || res.NextPageToken != "") {
					err = fmt.Errorf("list result %+v", res)
				}
				return err
			}},
		{name: "history", answer: success("lease_listed", `,"history":[`+strings.TrimSuffix(leaseJSON, "}")+
			`,"ended_at":"2026-08-05T12:00:10.000Z","reason":"stuck"}],"next_page_token":""`),
			method: "GET", path: "/api/v1/target-leases/lease_01/history", query: "page_size=2",
			run: func(c *client.Client) error {
				res, err := c.History(ctx, "lease_01", 2, "")
				if err == nil && (len(res.History) != 1 || res.History[0].Reason != "stuck" || res.History[0].EndedAt.IsZero()) {
					err = fmt.Errorf("history result %+v", res)
				}
				return err
			}},
		{name: "commit", answer: success("lease_inspected", `,"commit":{"lock_key":"`+lockKeyOf(ident)+`","sink":"couchdb","commit_id":"c1","lease_id":"lease_01",`+
			`"fencing_token":42,"execution_id":"exec-1","job_id":"job-1","target":"doc-1","commit_seq":1,"accepted_at":"2026-08-05T12:00:01.000Z","backend_time":"2026-08-05T12:00:01.000Z"}`),
			method: "POST", path: "/api/v1/target-leases/commits/authorize",
			bodyKeys: []string{"commit_id", "execution_id", "fencing_token", "job_id", "lease_id", "lock_identity", "service_instance_id", "sink", "target"},
			run: func(c *client.Client) error {
				res, err := c.AuthorizeCommit(ctx, client.CommitRequest{LockIdentity: ident, LeaseID: "lease_01", FencingToken: 42,
					ServiceInstanceID: "inst-1", Sink: "couchdb", CommitID: "c1", ExecutionID: "exec-1", JobID: "job-1", Target: "doc-1"})
				if err == nil && (res.Commit.FencingToken != 42 || res.Commit.Sink != "couchdb" || res.Commit.AcceptedAt.IsZero() ||
					res.Commit.Target != "doc-1" || res.Commit.JobID != "job-1" || res.Commit.LockKey != lockKeyOf(ident)) {
					err = fmt.Errorf("commit result %+v", res)
				}
				return err
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, answer(200, tc.answer))
			c := newClient(t, f.srv.URL)
			if err := tc.run(c); err != nil {
				t.Fatal(err)
			}
			r := f.last(t)
			if r.Method != tc.method || r.Path != tc.path || r.RawQuery != tc.query {
				t.Fatalf("request %s %s ? %s, want %s %s ? %s", r.Method, r.Path, r.RawQuery, tc.method, tc.path, tc.query)
			}
			if r.Header.Get("X-Correlation-ID") != "my-corr-1" {
				t.Fatalf("X-Correlation-ID %q", r.Header.Get("X-Correlation-ID"))
			}
			if tc.bodyKeys == nil {
				if len(r.Body) != 0 {
					t.Fatalf("GET with a body %q", r.Body)
				}
				return
			}
			var keys []string
			for k := range decodeBody(t, r.Body) {
				keys = append(keys, k)
			}
			if fmt.Sprint(sortStrings(keys)) != fmt.Sprint(tc.bodyKeys) {
				t.Fatalf("body keys %v, want %v", sortStrings(keys), tc.bodyKeys)
			}
		})
	}
}

func sortStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

func TestErrorStatusMapping(t *testing.T) {
	cases := []struct {
		status     int
		body       string
		code       lease.Code
		field      string
		retryable  bool
		retryAfter time.Duration
	}{
		{400, `{"status":"error","code":"invalid_lease_request","msg":"Invalid target lease request: ttl_ms must be positive","field":"ttl_ms","correlation_id":"corr_1","retryable":false}`,
			lease.CodeInvalidRequest, "ttl_ms", false, 0},
		{401, `{"status":"error","code":"invalid_credential","msg":"Invalid credential","correlation_id":"corr_1","retryable":false}`,
			lease.CodeInvalidCredential, "", false, 0},
		{403, `{"status":"error","code":"access_denied","msg":"Access denied","correlation_id":"corr_1","retryable":false}`,
			lease.CodeAccessDenied, "", false, 0},
		{404, `{"status":"error","code":"lease_not_found","msg":"Target lease not found","correlation_id":"corr_1","retryable":false}`,
			lease.CodeNotFound, "", false, 0},
		{408, `{"status":"error","code":"deadline_exceeded","msg":"Deadline elapsed","correlation_id":"corr_1","retryable":true,"retry_after_ms":250}`,
			lease.CodeDeadlineExceeded, "", true, 250 * time.Millisecond},
		{409, `{"status":"error","code":"lease_conflict","msg":"Target lease is unavailable","correlation_id":"corr_1","retryable":true,"retry_after_ms":1234}`,
			lease.CodeConflict, "", true, 1234 * time.Millisecond},
		{409, `{"status":"error","code":"lease_lost","msg":"Target lease is no longer held","correlation_id":"corr_1","retryable":false}`,
			lease.CodeLost, "", false, 0},
		{409, `{"status":"error","code":"idempotency_conflict","msg":"Request id was reused","correlation_id":"corr_1","retryable":false}`,
			lease.CodeIdempotencyConflict, "", false, 0},
		{429, `{"status":"error","code":"lease_rate_limited","msg":"Rejected","correlation_id":"corr_1","retryable":true,"retry_after_ms":900}`,
			lease.CodeRateLimited, "", true, 900 * time.Millisecond},
		{503, `{"status":"error","code":"lease_backend_unavailable","msg":"Unavailable","correlation_id":"corr_1","retryable":true,"retry_after_ms":250}`,
			lease.CodeBackendUnavailable, "", true, 250 * time.Millisecond},
		{503, `{"status":"error","code":"lease_outcome_unknown","msg":"Unknown","correlation_id":"corr_1","retryable":true,"retry_after_ms":250}`,
			lease.CodeOutcomeUnknown, "", true, 250 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(string(tc.code), func(t *testing.T) {
			f := newFake(t, answer(tc.status, tc.body))
			c := newClient(t, f.srv.URL)
			_, err := c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: ident, TTLMs: 30000, RequestID: "r-1"})
			ce := asError(t, err)
			if ce.Status != tc.status || ce.Code != tc.code || ce.Field != tc.field || ce.Retryable != tc.retryable ||
				ce.RetryAfter != tc.retryAfter || ce.CorrelationID != "corr_1" || ce.RequestID != "r-1" || ce.Msg == "" || ce.Err != nil {
				t.Fatalf("error %#v", ce)
			}
			if got := lease.CodeOf(err); got != tc.code {
				t.Fatalf("lease.CodeOf = %s, want %s", got, tc.code)
			}
			if !errors.Is(err, &lease.Error{Code: tc.code}) {
				t.Fatalf("errors.Is(err, lease code %s) is false", tc.code)
			}
			le := ce.LeaseError()
			if le.Code != tc.code || le.Field != tc.field || le.RetryAfter != tc.retryAfter {
				t.Fatalf("LeaseError %#v", le)
			}
			if lease.AsError(err).Code != tc.code {
				t.Fatalf("lease.AsError %#v", lease.AsError(err))
			}
			if !strings.Contains(err.Error(), string(tc.code)) || !strings.Contains(err.Error(), strconv.Itoa(tc.status)) {
				t.Fatalf("Error() %q", err.Error())
			}
		})
	}
}

func TestStrictDecoding(t *testing.T) {
	type tc struct {
		name, body string
		status     int
	}
	cases := []tc{
		{"unknown field", success("lease_acquired", `,"lease":`+leaseJSON+`,"owner_principal_id":"x"`), 200},
		{"unknown nested field", success("lease_acquired", `,"lease":`+strings.TrimSuffix(leaseJSON, "}")+`,"lock_key":"k"}`), 200},
		{"trailing data", success("lease_acquired", `,"lease":`+leaseJSON) + `{}`, 200},
		{"duplicate key", success("lease_acquired", `,"lease":`+leaseJSON+`,"code":"lease_acquired"`), 200},
		{"case-variant key", success("lease_acquired", `,"Lease":`+leaseJSON), 200},
		{"wrong code for the operation", success("lease_renewed", `,"lease":`+leaseJSON), 200},
		{"unknown code", success("lease_grabbed", `,"lease":`+leaseJSON), 200},
		{"no lease", success("lease_acquired", ``), 200},
		{"a list where a lease belongs", success("lease_acquired", `,"lease":`+leaseJSON+`,"leases":[],"next_page_token":""`), 200},
		{"bad timestamp", success("lease_acquired", `,"lease":`+strings.Replace(leaseJSON, "12:00:30.000Z", "12:00:30Z", 1)), 200},
		{"token zero", success("lease_acquired", `,"lease":`+strings.Replace(leaseJSON, `"fencing_token":42`, `"fencing_token":0`, 1)), 200},
		{"negative token", success("lease_acquired", `,"lease":`+strings.Replace(leaseJSON, `"fencing_token":42`, `"fencing_token":-1`, 1)), 200},
		{"unknown state", success("lease_acquired", `,"lease":`+strings.Replace(leaseJSON, `"active"`, `"paused"`, 1)), 200},
		{"error envelope with 200", `{"status":"error","code":"lease_conflict","msg":"x","correlation_id":"c","retryable":true}`, 200},
		{"success envelope with 409", success("lease_acquired", `,"lease":`+leaseJSON), 409},
		{"status and code disagree", `{"status":"error","code":"lease_conflict","msg":"x","correlation_id":"c","retryable":true}`, 400},
		{"error with unknown field", `{"status":"error","code":"lease_conflict","msg":"x","correlation_id":"c","retryable":true,"holder":"prn-b"}`, 409},
		{"error without correlation id", `{"status":"error","code":"lease_conflict","msg":"x","retryable":true}`, 409},
		{"error with an unknown code", `{"status":"error","code":"teapot","msg":"x","correlation_id":"c","retryable":false}`, 418},
		{"html from a proxy", `<html>bad gateway</html>`, 502},
		{"empty", ``, 503},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, answer(tc.status, tc.body))
			c := newClient(t, f.srv.URL)
			_, err := c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: ident, TTLMs: 30000})
			ce := asError(t, err)
			// The server may have acted on a mutation: outcome unknown.
			if ce.Code != lease.CodeOutcomeUnknown || ce.Status != tc.status || !strings.Contains(ce.Msg, "malformed response") ||
				ce.RequestID == "" || !ce.Retryable {
				t.Fatalf("error %#v", ce)
			}
			// The same answers to a read are backend_unavailable.
			_, err = c.Inspect(context.Background(), ident)
			if ce := asError(t, err); ce.Code != lease.CodeBackendUnavailable || !strings.Contains(ce.Msg, "malformed response") {
				t.Fatalf("read: error %#v", ce)
			}
		})
	}
	t.Run("oversize", func(t *testing.T) {
		f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			io.WriteString(w, `{"status":"success","code":"lease_listed","correlation_id":"c","leases":[`)
			for i := 0; i < client.MaxResponseBytes/len(leaseJSON)+1; i++ {
				io.WriteString(w, leaseJSON+",")
			}
			io.WriteString(w, leaseJSON+`],"next_page_token":""}`)
		})
		_, err := newClient(t, f.srv.URL).List(context.Background(), client.ListRequest{OwnerPrincipalID: "p"})
		if ce := asError(t, err); ce.Code != lease.CodeBackendUnavailable || !strings.Contains(ce.Msg, "too large") {
			t.Fatalf("error %#v", ce)
		}
	})
}

func TestRedaction(t *testing.T) {
	f := newFake(t, answer(409, `{"status":"error","code":"lease_conflict","msg":"Target lease is unavailable","correlation_id":"corr_1","retryable":true,"retry_after_ms":5}`))
	c := newClient(t, f.srv.URL)
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outs = append(outs, fmt.Sprintf(verb, c), fmt.Sprintf(verb, *c), fmt.Sprintf(verb, []any{c}),
			fmt.Sprintf(verb, struct{ C *client.Client }{c}))
	}
	outs = append(outs, c.String(), c.GoString())
	if b, err := json.Marshal(c); err != nil {
		t.Fatal(err)
	} else {
		outs = append(outs, string(b))
	}
	_, err := c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: ident, TTLMs: 30000})
	outs = append(outs, err.Error(), fmt.Sprintf("%#v", err), fmt.Sprintf("%+v", err))
	// Transport errors too.
	dead := newClient(t, closedURL(t))
	_, err = dead.Get(context.Background(), "lease_01")
	outs = append(outs, err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err))
	// Constructor errors.
	for _, base := range []string{"://x", "ftp://h", "http://", "http://u:p@h", "http://h/?q=1"} {
		if _, err := client.New(base, testKey); err == nil {
			t.Errorf("New(%q) accepted", base)
		} else {
			outs = append(outs, err.Error())
		}
	}
	for _, o := range outs {
		if strings.Contains(o, testSecret) || strings.Contains(o, "star_sk_") {
			t.Fatalf("output leaks the API key: %s", o)
		}
	}
	if !strings.Contains(c.String(), "[redacted]") {
		t.Fatalf("String %q", c.String())
	}
}

func TestNewRejects(t *testing.T) {
	for _, key := range []string{"", "star_sk_v1_x\r\nX-Evil: 1", "key with space"} {
		if _, err := client.New("http://127.0.0.1:1", key); err == nil {
			t.Errorf("New accepted key %q", key)
		}
	}
	c := newClient(t, "http://127.0.0.1:1/prefix/")
	if _, err := c.Get(context.Background(), ""); lease.CodeOf(err) != lease.CodeInvalidRequest || asError(t, err).Field != "lease_id" {
		t.Fatalf("empty lease id: %v", err)
	}
}

func TestBasePathPrefix(t *testing.T) {
	f := newFake(t, answer(200, success("lease_inspected", `,"lease":`+leaseJSON)))
	c := newClient(t, f.srv.URL+"/proxy/starlease/")
	if _, err := c.Get(context.Background(), "lease_01"); err != nil {
		t.Fatal(err)
	}
	if p := f.last(t).Path; p != "/proxy/starlease/api/v1/target-leases/lease_01" {
		t.Fatalf("path %s", p)
	}
}

// closedURL is a loopback URL on which nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func TestConnectionRefusedIsBackendUnavailable(t *testing.T) {
	c := newClient(t, closedURL(t))
	for name, run := range map[string]func() error{
		"acquire (mutation)": func() error {
			_, err := c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: ident, TTLMs: 30000})
			return err
		},
		"get (read)": func() error { _, err := c.Get(context.Background(), "lease_01"); return err },
	} {
		err := run()
		ce := asError(t, err)
		// Nothing was sent, so nothing can have happened: not outcome-unknown.
		if ce.Code != lease.CodeBackendUnavailable || ce.Status != 0 || !ce.Retryable || ce.Err == nil {
			t.Fatalf("%s: error %#v", name, ce)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Fatalf("%s: cause %v is not a *net.OpError", name, ce.Err)
		}
	}
}

func TestExpiredContextSendsNothing(t *testing.T) {
	f := newFake(t, answer(200, success("lease_acquired", `,"lease":`+leaseJSON)))
	c := newClient(t, f.srv.URL)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := c.Acquire(ctx, client.AcquireRequest{LockIdentity: ident, TTLMs: 30000})
	if ce := asError(t, err); ce.Code != lease.CodeDeadlineExceeded || !ce.Retryable || ce.RequestID == "" {
		t.Fatalf("error %#v", ce)
	}
	if f.count() != 0 {
		t.Fatalf("server saw %d requests", f.count())
	}
}

// TestHangingServerIsOutcomeUnknown: a server that accepts the request and
// never answers within the deadline leaves a mutation's outcome unknown
// (and a read merely unavailable).
func TestHangingServerIsOutcomeUnknown(t *testing.T) {
	release := make(chan struct{})
	var got atomic.Int32
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := newClient(t, f.srv.URL)
	mutations := map[string]func(ctx context.Context) (string, error){
		"acquire": func(ctx context.Context) (string, error) {
			_, err := c.Acquire(ctx, client.AcquireRequest{LockIdentity: ident, TTLMs: 30000, RequestID: "req-hang"})
			return "req-hang", err
		},
		"renew": func(ctx context.Context) (string, error) {
			_, err := c.Renew(ctx, client.RenewRequest{LeaseID: "l", LockIdentity: ident, FencingToken: 1, ServiceInstanceID: "i"})
			return "", err
		},
		"release": func(ctx context.Context) (string, error) {
			_, err := c.Release(ctx, client.ReleaseRequest{LeaseID: "l", LockIdentity: ident, FencingToken: 1, ServiceInstanceID: "i"})
			return "", err
		},
		"revoke": func(ctx context.Context) (string, error) {
			_, err := c.Revoke(ctx, client.AdminRequest{LeaseID: "l", LockIdentity: ident, FencingToken: 1, Reason: "r"})
			return "", err
		},
		"commit": func(ctx context.Context) (string, error) {
			_, err := c.AuthorizeCommit(ctx, client.CommitRequest{LockIdentity: ident, LeaseID: "l", FencingToken: 1})
			return "", err
		},
	}
	for name, run := range mutations {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		start := time.Now()
		want, err := run(ctx)
		cancel()
		ce := asError(t, err)
		if ce.Code != lease.CodeOutcomeUnknown || ce.Status != 0 || !ce.Retryable || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: error %#v", name, ce)
		}
		if want != "" && ce.RequestID != want {
			t.Fatalf("%s: request id %q, want %q", name, ce.RequestID, want)
		}
		if name != "commit" && !requestIDRE.MatchString(ce.RequestID) && ce.RequestID != want {
			t.Fatalf("%s: request id %q", name, ce.RequestID)
		}
		if !strings.Contains(err.Error(), ce.RequestID) {
			t.Fatalf("%s: Error() %q omits the request id to resolve with", name, err.Error())
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s: took %v past a 150 ms deadline", name, d)
		}
	}
	reads := map[string]func(ctx context.Context) error{
		"get":     func(ctx context.Context) error { _, err := c.Get(ctx, "l"); return err },
		"inspect": func(ctx context.Context) error { _, err := c.Inspect(ctx, ident); return err },
		"list": func(ctx context.Context) error {
			_, err := c.List(ctx, client.ListRequest{OwnerPrincipalID: "p"})
			return err
		},
		"history": func(ctx context.Context) error { _, err := c.History(ctx, "l", 0, ""); return err },
	}
	for name, run := range reads {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		err := run(ctx)
		cancel()
		if ce := asError(t, err); ce.Code != lease.CodeBackendUnavailable || !ce.Retryable {
			t.Fatalf("%s: error %#v", name, ce)
		}
	}
	if int(got.Load()) != len(mutations)+len(reads) {
		t.Fatalf("server saw %d requests", got.Load())
	}
	// The client's own timeout applies when the context has none.
	short := newClient(t, f.srv.URL, client.WithTimeout(100*time.Millisecond))
	_, err := short.Acquire(context.Background(), client.AcquireRequest{LockIdentity: ident, TTLMs: 30000})
	if lease.CodeOf(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("WithTimeout: %v", err)
	}
	// And an http.Client's own timeout is a failure after sending too.
	hc := newClient(t, f.srv.URL, client.WithHTTPClient(&http.Client{Timeout: 100 * time.Millisecond}), client.WithTimeout(0))
	_, err = hc.Release(context.Background(), client.ReleaseRequest{LeaseID: "l", LockIdentity: ident, FencingToken: 1, ServiceInstanceID: "i"})
	if lease.CodeOf(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("http.Client timeout: %v", err)
	}
}

// TestResetAfterSendIsOutcomeUnknown: the server reads the whole request,
// then resets the connection without answering.
func TestResetAfterSendIsOutcomeUnknown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int32
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func(conn net.Conn) {
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err == nil {
					io.Copy(io.Discard, req.Body)
					n.Add(1)
				}
				if tc, ok := conn.(*net.TCPConn); ok {
					tc.SetLinger(0) // RST, not FIN
				}
				conn.Close()
			}(conn)
		}
	}()
	c := newClient(t, "http://"+l.Addr().String())
	_, err = c.Release(context.Background(), client.ReleaseRequest{LeaseID: "l", LockIdentity: ident, FencingToken: 1, ServiceInstanceID: "i"})
	if ce := asError(t, err); ce.Code != lease.CodeOutcomeUnknown || ce.Status != 0 {
		t.Fatalf("mutation: error %#v", ce)
	}
	_, err = c.Get(context.Background(), "l")
	if ce := asError(t, err); ce.Code != lease.CodeBackendUnavailable || ce.Status != 0 {
		t.Fatalf("read: error %#v", ce)
	}
	if n.Load() != 2 {
		t.Fatalf("server read %d requests", n.Load())
	}
}

func TestTimeoutHeaderLeavesAMargin(t *testing.T) {
	f := newFake(t, answer(200, success("lease_inspected", `,"lease":`+leaseJSON)))
	c := newClient(t, f.srv.URL)
	for _, tc := range []struct {
		ctx      time.Duration
		min, max int
	}{
		{1000 * time.Millisecond, 850, 900},  // a tenth off
		{20 * time.Second, 19400, 19500},     // at most 500 ms off
		{48 * time.Hour, 86400000, 86400000}, // the server's ceiling
	} {
		ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
		_, err := c.Get(ctx, "lease_01")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		ms, err := strconv.Atoi(f.last(t).Header.Get("X-Request-Timeout-Ms"))
		if err != nil || ms < tc.min || ms > tc.max {
			t.Errorf("context of %v: X-Request-Timeout-Ms %d, want %d..%d", tc.ctx, ms, tc.min, tc.max)
		}
	}
}

// The commit answer's lock_key must be the canonical lock key of the
// identity the client sent: a missing or different one is a malformed
// answer (a guard with another lock key would guard another lease's
// writes), so AuthorizeCommit fails closed.
func TestCommitLockKeyChecked(t *testing.T) {
	commit := func(key string) string {
		return success("lease_inspected", `,"commit":{"lock_key":"`+key+`","sink":"couchdb","commit_id":"c1","lease_id":"lease_01",`+
			`"fencing_token":42,"execution_id":"exec-1","job_id":"job-1","trace_id":"","target":"doc-1","payload_sha256":"",`+
			`"commit_seq":1,"accepted_at":"2026-08-05T12:00:01.000Z","backend_time":"2026-08-05T12:00:01.000Z"}`)
	}
	other := ident
	other.TargetID = "target-2"
	// The server normalizes the identity sent (case, operation class):
	// its key is the canonical identity's.
	raw := ident
	raw.TenantID, raw.OperationClass = " Tenant-A ", "SCAN"
	canonical := ident
	canonical.OperationClass = "scan"
	req := func(id lease.Identity) client.CommitRequest {
		return client.CommitRequest{LockIdentity: id, LeaseID: "lease_01", FencingToken: 42, ServiceInstanceID: "inst-1",
			Sink: "couchdb", CommitID: "c1", ExecutionID: "exec-1", JobID: "job-1", Target: "doc-1"}
	}
	for _, tc := range []struct {
		name   string
		sent   lease.Identity
		answer string
		ok     bool
	}{
		{"own key", ident, commit(lockKeyOf(ident)), true},
		{"normalized identity", raw, commit(lockKeyOf(canonical)), true},
		{"another identity's key", ident, commit(lockKeyOf(other)), false},
		{"key of the identity without its operation class", raw, commit(lockKeyOf(ident)), false},
		{"empty key", ident, commit(""), false},
		{"no key", ident, strings.Replace(commit(""), `"lock_key":"",`, "", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, answer(200, tc.answer))
			res, err := newClient(t, f.srv.URL).AuthorizeCommit(context.Background(), req(tc.sent))
			if tc.ok {
				if err != nil || res.Commit.LockKey != lockKeyOf(canonicalOf(tc.sent)) {
					t.Fatalf("commit %+v, %v", res, err)
				}
				return
			}
			ce := asError(t, err)
			if res != nil || ce.Code != lease.CodeOutcomeUnknown || !ce.Retryable || !strings.Contains(ce.Msg, "malformed response") {
				t.Fatalf("answer accepted or misclassified: %+v, %#v", res, ce)
			}
		})
	}
}

// canonicalOf normalizes id with its own operation class allowed.
func canonicalOf(id lease.Identity) lease.Identity {
	classes := lease.DefaultOperationClasses()
	if oc, err := lease.NormalizeIdentifier("operation_class", id.OperationClass); err == nil {
		classes, _ = lease.NewOperationClasses(oc)
	}
	n, err := id.Normalize(classes)
	if err != nil {
		panic(err)
	}
	return n
}
