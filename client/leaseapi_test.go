package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/httpapi"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
)

// The adapter has exactly the method set the executor and the fenced-write
// boundary need.
var (
	_ executor.LeaseAPI = (*LeaseStore)(nil)
	_ fence.Authorizer  = (*LeaseStore)(nil)
)

const storeTestKey = "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ0_5f1d0c7e9a2b4c6d8e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"

var storeIdent = lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns",
	TargetID: "target-1", ActorName: "usernamegen"}

// canonicalIdent is storeIdent as the server answers it.
var canonicalIdent = lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns",
	TargetID: "target-1", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}

const identJSON = `{"tenant_id":"tenant-a","program_id":"program-a","target_namespace":"ns",` +
	`"target_id":"target-1","actor_name":"usernamegen","workflow_name":"default","operation_class":"default"}`

// viewJSON is a lease answer: acquired at 12:00:00, renewed at renewed,
// expiring at expires.
func viewJSON(leaseID string, token int, renewed, expires string, ttlMs int, state string) string {
	return `{"lock_identity":` + identJSON + `,"lease_id":"` + leaseID + `","fencing_token":` + strconv.Itoa(token) +
		`,"acquired_at":"2026-08-05T12:00:00.000Z","renewed_at":"2026-08-05T` + renewed + `Z","expires_at":"2026-08-05T` +
		expires + `Z","ttl_ms":` + strconv.Itoa(ttlMs) + `,"state":"` + state + `"}`
}

func okBody(code, extra string) string {
	return `{"status":"success","code":"` + code + `","correlation_id":"corr_1"` + extra + `}`
}

func errBody(code string, retryable bool, extra string) string {
	return `{"status":"error","code":"` + code + `","msg":"m","correlation_id":"corr_1","retryable":` +
		strconv.FormatBool(retryable) + extra + `}`
}

// got is one request a stub server received.
type got struct {
	Method, Path string
	Header       http.Header
	Body         map[string]any
}

// stub answers each request with the reply its route maps to.
type stub struct {
	srv    *httptest.Server
	mu     sync.Mutex
	seen   []got
	routes map[string][2]string // "POST /path" → {status, body}
}

func newStub(t *testing.T) *stub {
	s := &stub{routes: map[string][2]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		if len(b) > 0 {
			if err := json.Unmarshal(b, &m); err != nil {
				t.Errorf("request body is not JSON: %q", b)
			}
		}
		s.mu.Lock()
		s.seen = append(s.seen, got{r.Method, strings.TrimPrefix(r.URL.Path, BasePath), r.Header.Clone(), m})
		reply, ok := s.routes[r.Method+" "+strings.TrimPrefix(r.URL.Path, BasePath)]
		s.mu.Unlock()
		if !ok {
			reply = [2]string{"404", errBody("lease_not_found", false, "")}
		}
		status, _ := strconv.Atoi(reply[0])
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, reply[1])
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stub) on(route string, status int, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[route] = [2]string{strconv.Itoa(status), body}
}

func (s *stub) last(t *testing.T) got {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == 0 {
		t.Fatal("no request reached the server")
	}
	return s.seen[len(s.seen)-1]
}

func (s *stub) count() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.seen) }

func (s *stub) store(t *testing.T, principal string) *LeaseStore {
	t.Helper()
	c, err := New(s.srv.URL, storeTestKey)
	if err != nil {
		t.Fatal(err)
	}
	return NewLeaseStore(c, principal)
}

func keysOf(m map[string]any) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return strings.Join(ks, ",")
}

func acquireReq(deadline time.Time) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: storeIdent, ServiceInstanceID: "inst-1", TTL: 30 * time.Second,
		MaximumLifetime: time.Hour, ExecutionID: "exec-1", JobID: "job-1", TraceID: "trace-1",
		Metadata: lease.Metadata{"k": "v"},
		Mutation: lease.Mutation{RequestID: "req-acquire-1", DeadlineAt: deadline,
			Caller: lease.Caller{PrincipalID: "ignored", ClientID: "ignored", CredentialID: "ignored", CorrelationID: "corr-test-1"}}}
}

func TestLeaseStoreAcquireMapsRequestAndRecord(t *testing.T) {
	s := newStub(t)
	s.on("POST /acquire", 200, okBody("lease_acquired", `,"lease":`+viewJSON("lease_01", 7, "12:00:00.000", "12:00:30.000", 30000, "active")))
	st := s.store(t, "prn-owner")
	deadline := time.Date(2026, 8, 5, 12, 0, 5, 123e6, time.UTC)
	res, err := st.Acquire(t.Context(), acquireReq(deadline))
	if err != nil {
		t.Fatal(err)
	}
	g := s.last(t)
	if g.Method != "POST" || g.Path != "/acquire" {
		t.Fatalf("request %s %s", g.Method, g.Path)
	}
	if k := keysOf(g.Body); k != "deadline_at,execution_id,job_id,lock_identity,maximum_lifetime_ms,metadata,request_id,service_instance_id,trace_id,ttl_ms" {
		t.Fatalf("body fields %s (owner fields must come from the key)", k)
	}
	b := g.Body
	if b["ttl_ms"] != 30000.0 || b["maximum_lifetime_ms"] != 3600000.0 || b["request_id"] != "req-acquire-1" ||
		b["service_instance_id"] != "inst-1" || b["execution_id"] != "exec-1" || b["job_id"] != "job-1" || b["trace_id"] != "trace-1" {
		t.Fatalf("body %v", b)
	}
	if d, _ := time.Parse(time.RFC3339Nano, b["deadline_at"].(string)); !d.Equal(deadline) {
		t.Fatalf("deadline_at %v, want %v", b["deadline_at"], deadline)
	}
	if id := b["lock_identity"].(map[string]any); id["target_id"] != "target-1" || id["actor_name"] != "usernamegen" {
		t.Fatalf("lock_identity %v", id)
	}
	if g.Header.Get("X-Request-Timeout-Ms") != "" {
		t.Fatal("deadline_at and X-Request-Timeout-Ms both sent")
	}
	if g.Header.Get("X-Correlation-ID") != "corr-test-1" {
		t.Fatalf("X-Correlation-ID %q", g.Header.Get("X-Correlation-ID"))
	}

	_, key, _ := lease.CanonicalLockKey(storeIdent, lease.DefaultOperationClasses())
	rec := res.Lease
	want := &lease.Record{RecordVersion: lease.RecordVersion, LockKey: key, LeaseID: "lease_01", OwnerPrincipalID: "prn-owner",
		ServiceInstanceID: "inst-1", FencingToken: 7, AcquiredAt: lease.UnixMilli(rec.AcquiredAt.UnixMilli()),
		TTLMs: 30000, MaximumLifetimeMs: 3600000, ExecutionID: "exec-1", JobID: "job-1", TraceID: "trace-1",
		RequestID: "req-acquire-1", Metadata: lease.Metadata{"k": "v"}, State: lease.StateActive}
	want.SetIdentity(canonicalIdent)
	want.RenewedAt, want.ExpiresAt = rec.RenewedAt, rec.ExpiresAt
	if rec.AcquiredAt.String() != "2026-08-05T12:00:00.000Z" || rec.ExpiresAt.String() != "2026-08-05T12:00:30.000Z" {
		t.Fatalf("times %s %s", rec.AcquiredAt, rec.ExpiresAt)
	}
	if a, _ := json.Marshal(rec); !bytes.Equal(a, mustJSON(t, want)) {
		t.Fatalf("record\n got %s\nwant %s", a, mustJSON(t, want))
	}
	if res.Code != lease.CodeAcquired || res.Replayed || res.BackendTime != rec.RenewedAt || res.Current != nil {
		t.Fatalf("result %+v", res)
	}
	// The executor's acceptance check of an acquisition holds.
	if fence.EnvelopeOf(rec).Validate() != nil {
		t.Fatalf("envelope of the record is incomplete: %v", fence.EnvelopeOf(rec).Validate())
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLeaseStoreRenewReleaseInspectRemember(t *testing.T) {
	s := newStub(t)
	s.on("POST /acquire", 200, okBody("lease_acquired", `,"lease":`+viewJSON("lease_01", 7, "12:00:00.000", "12:00:30.000", 30000, "active")))
	s.on("POST /lease_01/renew", 200, okBody("lease_renewed", `,"lease":`+viewJSON("lease_01", 7, "12:00:20.000", "12:00:50.000", 30000, "active")))
	s.on("GET /lease_01", 200, okBody("lease_inspected", `,"lease":`+viewJSON("lease_01", 7, "12:00:20.000", "12:00:50.000", 30000, "active")))
	s.on("POST /inspect", 200, okBody("lease_inspected", `,"lease":`+viewJSON("lease_99", 3, "12:00:00.000", "12:00:30.000", 30000, "active")))
	s.on("POST /lease_01/release", 200, okBody("lease_released", `,"lease":`+viewJSON("lease_01", 7, "12:00:20.000", "12:00:50.000", 30000, "released")))
	st := s.store(t, "prn-owner")
	ctx := t.Context()
	if _, err := st.Acquire(ctx, acquireReq(time.Now().Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	if st.remembered() != 1 {
		t.Fatalf("remembers %d leases", st.remembered())
	}

	deadline := time.Now().Add(2 * time.Second).UTC()
	res, err := st.Renew(ctx, lease.RenewRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7,
		ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-renew-1", DeadlineAt: deadline}})
	if err != nil {
		t.Fatal(err)
	}
	g := s.last(t)
	if g.Path != "/lease_01/renew" || keysOf(g.Body) != "deadline_at,fencing_token,lock_identity,request_id,service_instance_id" ||
		g.Body["fencing_token"] != 7.0 || g.Body["request_id"] != "req-renew-1" || g.Body["service_instance_id"] != "inst-1" {
		t.Fatalf("renew %s %v", g.Path, g.Body)
	}
	rec := res.Lease
	// What the answer does not carry comes from the acquisition.
	if res.Code != lease.CodeRenewed || rec.ExecutionID != "exec-1" || rec.JobID != "job-1" || rec.TraceID != "trace-1" ||
		rec.MaximumLifetimeMs != 3600000 || rec.OwnerPrincipalID != "prn-owner" || rec.ServiceInstanceID != "inst-1" ||
		rec.RequestID != "req-acquire-1" || rec.Metadata["k"] != "v" || rec.ExpiresAt.String() != "2026-08-05T12:00:50.000Z" {
		t.Fatalf("renewed record %+v", rec)
	}
	if res.BackendTime != rec.RenewedAt {
		t.Fatalf("backend time %s, want renewed_at", res.BackendTime)
	}

	// Inspect by id: GET, the deadline as X-Request-Timeout-Ms.
	before := time.Now()
	res, err = st.Inspect(ctx, lease.InspectRequest{LeaseID: "lease_01", DeadlineAt: before.Add(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	g = s.last(t)
	ms, _ := strconv.Atoi(g.Header.Get("X-Request-Timeout-Ms"))
	if g.Method != "GET" || g.Path != "/lease_01" || ms <= 2000 || ms > 3000 {
		t.Fatalf("inspect %s %s timeout %q", g.Method, g.Path, g.Header.Get("X-Request-Timeout-Ms"))
	}
	if res.Code != lease.CodeInspected || res.Lease.ExecutionID != "exec-1" || !res.BackendTime.IsZero() {
		t.Fatalf("inspect result %+v", res)
	}

	// Inspect by identity answers someone else's lease: no owner fields.
	res, err = st.Inspect(ctx, lease.InspectRequest{Identity: storeIdent})
	if err != nil {
		t.Fatal(err)
	}
	if g := s.last(t); g.Method != "POST" || g.Path != "/inspect" || keysOf(g.Body) != "lock_identity" {
		t.Fatalf("inspect by identity %s %s %v", g.Method, g.Path, g.Body)
	}
	if r := res.Lease; r.LeaseID != "lease_99" || r.OwnerPrincipalID != "" || r.ExecutionID != "" || r.MaximumLifetimeMs != lease.MaxLifetime.Milliseconds() {
		t.Fatalf("foreign lease %+v", r)
	}
	n := s.count()
	for _, bad := range []lease.InspectRequest{{}, {Identity: storeIdent, LeaseID: "lease_01"}} {
		if _, err := st.Inspect(ctx, bad); lease.CodeOf(err) != lease.CodeInvalidRequest {
			t.Fatalf("inspect %+v: %v", bad, err)
		}
	}
	if s.count() != n {
		t.Fatal("an invalid inspect was sent")
	}

	res, err = st.Release(ctx, lease.ReleaseRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7,
		ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-release-1", DeadlineAt: deadline}})
	if err != nil {
		t.Fatal(err)
	}
	if g := s.last(t); g.Path != "/lease_01/release" || keysOf(g.Body) != "deadline_at,fencing_token,lock_identity,request_id,service_instance_id" {
		t.Fatalf("release %s %v", g.Path, g.Body)
	}
	if res.Code != lease.CodeReleased || res.Lease.State != lease.StateReleased || res.Lease.ExecutionID != "exec-1" {
		t.Fatalf("release result %+v", res.Lease)
	}
	if st.remembered() != 0 {
		t.Fatal("a released lease is still remembered")
	}
	// A renewal the server grants for a lease the adapter does not know:
	// owner and instance are the ones the server matched.
	res, err = st.Renew(ctx, lease.RenewRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7,
		ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-renew-2", DeadlineAt: deadline}})
	if err != nil || res.Lease.OwnerPrincipalID != "prn-owner" || res.Lease.ServiceInstanceID != "inst-1" || res.Lease.ExecutionID != "" {
		t.Fatalf("renew of an unknown lease: %v %+v", err, res.Lease)
	}
}

func TestLeaseStoreReplayAndCurrent(t *testing.T) {
	s := newStub(t)
	s.on("POST /acquire", 200, okBody("lease_acquired", `,"replayed":true,"lease":`+
		viewJSON("lease_01", 7, "12:00:00.000", "12:00:30.000", 30000, "active")+`,"current":`+
		viewJSON("lease_01", 7, "12:00:00.000", "12:00:30.000", 30000, "released")))
	res, err := s.store(t, "prn-owner").Acquire(t.Context(), acquireReq(time.Now().Add(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Current == nil || res.Current.State != lease.StateReleased || res.Current.ExecutionID != "exec-1" ||
		!res.BackendTime.IsZero() {
		t.Fatalf("replay %+v current %+v", res, res.Current)
	}
}

func TestLeaseStoreMaximumLifetime(t *testing.T) {
	s := newStub(t)
	// Renewed at 12:59:50 with a 30 s TTL but expiring at 13:00:00: capped
	// by the maximum lifetime (one hour from 12:00:00).
	s.on("POST /lease_01/renew", 200, okBody("lease_renewed", `,"lease":`+viewJSON("lease_01", 7, "12:59:50.000", "13:00:00.000", 30000, "active")))
	s.on("POST /lease_02/renew", 200, okBody("lease_renewed", `,"lease":`+viewJSON("lease_02", 8, "12:10:00.000", "12:10:30.000", 30000, "active")))
	st := s.store(t, "prn-owner")
	renew := func(id string) *lease.Record {
		res, err := st.Renew(t.Context(), lease.RenewRequest{Identity: storeIdent, LeaseID: id, FencingToken: 7,
			ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-" + id}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Lease
	}
	if got := renew("lease_01").MaximumLifetimeMs; got != 3600000 {
		t.Fatalf("capped lease: maximum lifetime %d, want 3600000", got)
	}
	if got := renew("lease_02").MaximumLifetimeMs; got != lease.MaxLifetime.Milliseconds() {
		t.Fatalf("unknown maximum lifetime %d, want the upper bound", got)
	}
	// Sub-millisecond durations are refused before sending, as by lease.Store.
	n := s.count()
	req := acquireReq(time.Now().Add(time.Second))
	req.TTL += time.Microsecond
	if _, err := st.Acquire(t.Context(), req); lease.CodeOf(err) != lease.CodeInvalidRequest || lease.AsError(err).Field != "ttl_ms" {
		t.Fatalf("sub-ms ttl: %v", err)
	}
	req = acquireReq(time.Now().Add(time.Second))
	req.RequestID = ""
	if _, err := st.Acquire(t.Context(), req); lease.CodeOf(err) != lease.CodeInvalidRequest || lease.AsError(err).Field != "request_id" {
		t.Fatalf("acquire without a request id: %v", err)
	}
	if _, err := st.Renew(t.Context(), lease.RenewRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Fatalf("renew without a request id: %v", err)
	}
	if _, err := st.Release(t.Context(), lease.ReleaseRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Fatalf("release without a request id: %v", err)
	}
	if s.count() != n {
		t.Fatal("an invalid mutation was sent")
	}
}

func TestLeaseStoreAuthorizeCommit(t *testing.T) {
	s := newStub(t)
	_, key, _ := lease.CanonicalLockKey(storeIdent, lease.DefaultOperationClasses())
	commit := `,"commit":{"lock_key":"` + key + `","sink":"results","commit_id":"c-1","lease_id":"lease_01","fencing_token":7,"execution_id":"exec-1",` +
		`"job_id":"job-1","trace_id":"trace-1","target":"doc-1","payload_sha256":"` + strings.Repeat("a", 64) + `","commit_seq":3,` +
		`"accepted_at":"2026-08-05T12:00:01.000Z","backend_time":"2026-08-05T12:00:01.000Z"}`
	s.on("POST /commits/authorize", 200, okBody("lease_inspected", commit))
	st := s.store(t, "prn-owner")
	req := lease.CommitRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7, ServiceInstanceID: "inst-1",
		Sink: "results", CommitID: "c-1", ExecutionID: "exec-1", JobID: "job-1", TraceID: "trace-1", Target: "doc-1",
		PayloadSHA256: strings.Repeat("a", 64), DeadlineAt: time.Now().Add(2 * time.Second),
		Caller: lease.Caller{PrincipalID: "ignored"}}
	res, err := st.AuthorizeCommit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	g := s.last(t)
	ms, _ := strconv.Atoi(g.Header.Get("X-Request-Timeout-Ms"))
	if g.Path != "/commits/authorize" || keysOf(g.Body) != "commit_id,execution_id,fencing_token,job_id,lease_id,lock_identity,payload_sha256,service_instance_id,sink,target,trace_id" ||
		ms <= 1000 || ms > 2000 {
		t.Fatalf("commit %s %v timeout %q", g.Path, g.Body, g.Header.Get("X-Request-Timeout-Ms"))
	}
	if res.Code != lease.CodeCommitAuthorized || res.Commit.CommitID != "c-1" || res.Commit.FencingToken != 7 ||
		res.Commit.AcceptedAt.String() != "2026-08-05T12:00:01.000Z" || res.BackendTime.IsZero() {
		t.Fatalf("commit result %+v", res)
	}
	// An answer for another commit is not this one's.
	other := req
	other.Sink = "elsewhere"
	if _, err := st.AuthorizeCommit(t.Context(), other); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("mismatched commit answer: %v", err)
	}
	// The API has no replay-only commit: one is refused without a
	// request, never sent as a real commit.
	n := s.count()
	if _, err := st.AuthorizeCommit(t.Context(), replayOnly(req)); lease.CodeOf(err) != lease.CodeInvalidRequest ||
		lease.AsError(err).Field != "replay_only" {
		t.Fatalf("replay-only commit: %v", err)
	}
	if s.count() != n {
		t.Fatal("a replay-only commit was sent")
	}
	// A publication with its own target is refused without a request.
	req.Outbox = &lease.OutboxMessage{Exchange: "documents", RoutingKey: "q", ContentType: "application/json", Body: []byte("x\x00\xff"),
		Headers: map[string]string{"x-schema": "port-scan/v2", "note": "a\tb"}}
	if _, err := st.AuthorizeCommit(t.Context(), req); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Fatalf("outbox commit with a target: %v", err)
	}
	if s.count() != n {
		t.Fatal("an outbox commit with a target was sent")
	}
	// A publication travels as the outbox object, its body in base64; the
	// answer names the message id and the body's digest.
	sum := sha256.Sum256(req.Outbox.Body)
	digest := hex.EncodeToString(sum[:])
	s.on("POST /commits/authorize", 200, okBody("lease_inspected", strings.NewReplacer("doc-1", "msg_abc", strings.Repeat("a", 64), digest).Replace(commit)))
	req.Target, req.PayloadSHA256 = "", ""
	res, err = st.AuthorizeCommit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	g = s.last(t)
	ob, _ := g.Body["outbox"].(map[string]any)
	if keysOf(g.Body) != "commit_id,execution_id,fencing_token,job_id,lease_id,lock_identity,outbox,service_instance_id,sink,trace_id" ||
		ob["body"] != base64.StdEncoding.EncodeToString(req.Outbox.Body) || ob["exchange"] != "documents" || ob["routing_key"] != "q" ||
		ob["content_type"] != "application/json" || !reflect.DeepEqual(ob["headers"], map[string]any{"x-schema": "port-scan/v2", "note": "a\tb"}) {
		t.Fatalf("outbox commit body %v", g.Body)
	}
	if res.Commit.Target != "msg_abc" || res.Commit.PayloadSHA256 != digest {
		t.Fatalf("outbox commit result %+v", res)
	}
	// An answer bound to another body is not this publication's.
	req.Outbox.Body = []byte("y")
	if _, err := st.AuthorizeCommit(t.Context(), req); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("outbox answer for another body: %v", err)
	}
}

func TestLeaseStoreErrorsAreLeaseErrors(t *testing.T) {
	s := newStub(t)
	st := s.store(t, "prn-owner")
	renew := func() error {
		_, err := st.Renew(t.Context(), lease.RenewRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7,
			ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-1"}})
		return err
	}
	for _, tc := range []struct {
		status int
		body   string
		code   lease.Code
		field  string
		after  time.Duration
	}{
		{409, errBody("lease_lost", false, ""), lease.CodeLost, "", 0},
		{409, errBody("lease_conflict", true, `,"retry_after_ms":1500`), lease.CodeConflict, "", 1500 * time.Millisecond},
		{400, errBody("invalid_lease_request", false, `,"field":"ttl_ms"`), lease.CodeInvalidRequest, "ttl_ms", 0},
		{503, errBody("lease_outcome_unknown", true, `,"retry_after_ms":250`), lease.CodeOutcomeUnknown, "", 250 * time.Millisecond},
		{401, `{"status":"error","code":"invalid_credential","msg":"m","correlation_id":"corr_1","retryable":false}`, lease.CodeInvalidCredential, "", 0},
		{200, okBody("lease_renewed", `,"lease":{"lock_identity":{"tenant_id":"Tenant-A","program_id":"program-a","target_namespace":"ns","target_id":"target-1","actor_name":"usernamegen","workflow_name":"default","operation_class":"default"},"lease_id":"lease_01","fencing_token":7,"acquired_at":"2026-08-05T12:00:00.000Z","renewed_at":"2026-08-05T12:00:00.000Z","expires_at":"2026-08-05T12:00:30.000Z","ttl_ms":30000,"state":"active"}`), lease.CodeCorrupt, "", 0},
	} {
		s.on("POST /lease_01/renew", tc.status, tc.body)
		err := renew()
		le, ok := err.(*lease.Error)
		if !ok {
			t.Fatalf("%d %s: error %v (%T) is not a *lease.Error", tc.status, tc.code, err, err)
		}
		if le.Code != tc.code || le.Field != tc.field || le.RetryAfter != tc.after || lease.CodeOf(err) != tc.code ||
			!errors.Is(err, &lease.Error{Code: tc.code}) {
			t.Fatalf("%d %s: got %+v", tc.status, tc.code, le)
		}
	}
}

func TestLeaseStoreTransportFailures(t *testing.T) {
	// A server that reads the request and never answers.
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	c, _ := New(srv.URL, storeTestKey)
	st := NewLeaseStore(c, "prn-owner")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := st.Renew(ctx, lease.RenewRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7,
		ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-1", DeadlineAt: time.Now().Add(200 * time.Millisecond)}})
	if _, ok := err.(*lease.Error); !ok || lease.CodeOf(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("renew without an answer: %v (%T)", err, err)
	}
	start := time.Now()
	_, err = st.AuthorizeCommit(t.Context(), lease.CommitRequest{Identity: storeIdent, LeaseID: "lease_01", FencingToken: 7,
		ServiceInstanceID: "inst-1", Sink: "results", CommitID: "c-1", ExecutionID: "exec-1", DeadlineAt: time.Now().Add(200 * time.Millisecond)})
	if lease.CodeOf(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("commit without an answer: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the commit's DeadlineAt did not bound the call: %v", d)
	}
	_, err = st.Inspect(t.Context(), lease.InspectRequest{LeaseID: "lease_01", DeadlineAt: time.Now().Add(200 * time.Millisecond)})
	if lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("inspect without an answer: %v", err)
	}

	// Nothing listening: nothing was sent.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, _ = New("http://"+addr, storeTestKey)
	_, err = NewLeaseStore(c, "prn-owner").Acquire(t.Context(), acquireReq(time.Now().Add(time.Second)))
	if lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire with nothing listening: %v", err)
	}
}

// liveServer is the real HTTP API (httpapi over service over bolt) on a
// loopback port, with one key per principal.
type liveServer struct {
	url  string
	keys map[string]string
}

func startLiveServer(t *testing.T, principals ...string) *liveServer {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rec := &audittest.Recorder{}
	svc, err := service.New(store, rec, service.Options{Logger: slog.New(slog.DiscardHandler),
		Config: service.Config{MinTTL: time.Millisecond, PrincipalRate: 1e6, PrincipalBurst: 1e6,
			TargetRate: 1e6, TargetBurst: 1e6}})
	if err != nil {
		t.Fatal(err)
	}
	creds := auth.NewMemoryStore()
	pepper, err := auth.NewPepper(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	scope, err := auth.ParseScope("tenant:*,program:*")
	if err != nil {
		t.Fatal(err)
	}
	ls := &liveServer{keys: map[string]string{}}
	for _, p := range principals {
		key, _, err := auth.Issue(t.Context(), creds, pepper, auth.IssueRequest{PrincipalID: p, Class: auth.ClassAPIClient,
			Capabilities: []auth.Capability{auth.CapLease}, Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		ls.keys[p] = key
	}
	authn, err := auth.NewAuthenticator(creds, pepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(svc, authn, rec, httpapi.Options{Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	ls.url = srv.URL
	return ls
}

func (ls *liveServer) store(t *testing.T, principal string) *LeaseStore {
	t.Helper()
	c, err := New(ls.url, ls.keys[principal])
	if err != nil {
		t.Fatal(err)
	}
	return c.LeaseStore(principal)
}

// The executor runs over the adapter against the real HTTP API: acquire,
// renewals, a fenced commit, release; a second holder conflicts meanwhile
// and succeeds afterwards with a higher token.
func TestLeaseStoreRunsTheExecutor(t *testing.T) {
	ls := startLiveServer(t, "prn-a", "prn-b")
	a, b := ls.store(t, "prn-a"), ls.store(t, "prn-b")
	sink := fencetest.NewMemorySink("results")
	spec := func(inst string) executor.Spec {
		return executor.Spec{Identity: storeIdent, ServiceInstanceID: inst, ExecutionID: "exec-" + inst, JobID: "job-1",
			// 1.5 s: renewals over HTTP under -race on a loaded machine
			// (CI runs every package at once) need more than 600 ms.
			TraceID: "trace-" + inst, TTL: 1500 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	}
	var first *lease.Record
	err := executor.Run(t.Context(), a, spec("inst-a"), func(ctx context.Context, l *executor.Lease) error {
		first = l.Record()
		if err := executor.Run(t.Context(), b, spec("inst-b"), func(context.Context, *executor.Lease) error { return nil }); lease.CodeOf(err) != lease.CodeConflict {
			t.Errorf("second holder while the first holds: %v", err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(2 * time.Second): // more than a TTL: renewals must keep it
		}
		if l.Renewals() < 1 {
			t.Errorf("no renewal in 2 s of a 1.5 s lease")
		}
		if r := l.Record(); r.ExecutionID != "exec-inst-a" || r.OwnerPrincipalID != "prn-a" || r.MaximumLifetimeMs != time.Hour.Milliseconds() {
			t.Errorf("record after renewals: %+v", r)
		}
		_, err := fence.Write(ctx, l.Committer(), sink, "commit-a", fencetest.Doc{ID: "doc", Body: "from a"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if a.remembered() != 0 {
		t.Fatal("the released lease is still remembered")
	}
	res, err := a.Inspect(t.Context(), lease.InspectRequest{LeaseID: first.LeaseID, DeadlineAt: time.Now().Add(time.Second)})
	if err != nil || res.Lease.State != lease.StateReleased {
		t.Fatalf("after Run: %v %+v", err, res.Lease)
	}
	err = executor.Run(t.Context(), b, spec("inst-b"), func(ctx context.Context, l *executor.Lease) error {
		if l.FencingToken() <= first.FencingToken {
			t.Errorf("token %d not above %d", l.FencingToken(), first.FencingToken)
		}
		_, err := fence.Write(ctx, l.Committer(), sink, "commit-b", fencetest.Doc{ID: "doc", Body: "from b"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first holder's committer, after its lease ended: lease_lost.
	if _, err := fence.NewCommitter(a, fence.EnvelopeOf(first), lease.Caller{}).Authorize(t.Context(), "results", "late-a",
		fence.Binding{Target: "doc", PayloadSHA256: strings.Repeat("a", 64)}); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("stale commit: %v", err)
	}
	doc, _ := sink.Get("doc")
	if doc.Body != "from b" || doc.Rev != 2 || len(sink.Accepted()) != 2 || len(sink.Rejected()) != 0 {
		t.Fatalf("sink: %+v accepted %d rejected %d", doc, len(sink.Accepted()), len(sink.Rejected()))
	}
}

// The maximum lifetime reaches the executor over HTTP: it stops renewing
// and cancels the work when the lifetime ends.
func TestLeaseStoreMaximumLifetimeEndsWork(t *testing.T) {
	ls := startLiveServer(t, "prn-a")
	spec := executor.Spec{Identity: storeIdent, ServiceInstanceID: "inst-a", ExecutionID: "exec-a", JobID: "job-1",
		TTL: 400 * time.Millisecond, MaxLifetime: 700 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	start := time.Now()
	err := executor.Run(t.Context(), ls.store(t, "prn-a"), spec, func(ctx context.Context, l *executor.Lease) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled at the maximum lifetime")
		}
	})
	// Cancelled at the lifetime the adapter remembered, not by a renewal
	// loop that kept trying to extend a capped lease.
	if !errors.Is(err, executor.ErrLeaseExpired) || !strings.Contains(err.Error(), "maximum lifetime reached") {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancelled after %v, long past the maximum lifetime", d)
	}
}

func replayOnly(r lease.CommitRequest) lease.CommitRequest {
	r.ReplayOnly = true
	return r
}
