package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// TestE2E builds the real starlease binary once, starts real "starlease
// serve" processes (bolt by default; one with tight rate limits; one on the
// valkey backend behind a fault-injecting proxy), creates keys with the real
// "starlease keys" command, and drives the servers over HTTP with the client
// package and with raw requests. At the end every row of the contract's
// wire table must have been answered by a real server. It never skips
// (redis-server missing fails it, like every test using internal/testenv):
// a run that exercises nothing must not pass.
func TestE2E(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	rows := newRowRecorder()
	var ran atomic.Int32
	t.Run("servers", func(t *testing.T) {
		for name, run := range map[string]func(*testing.T, string, *rowRecorder){
			"bolt": testBoltServer, "rate_limits": testRateLimits, "valkey_faults": testValkeyFaults,
		} {
			t.Run(name, func(t *testing.T) { t.Parallel(); ran.Add(1); run(t, bin, rows) })
		}
	})
	rows.report(t)
	// The row check needs all three servers (a -run filter may select fewer).
	if m := rows.missing(); len(m) > 0 && ran.Load() == 3 {
		t.Errorf("wire-table rows never produced end to end: %v", m)
	}
}

// keyring holds the keys of the bolt server.
type keyring struct {
	admin, adminNoForce, clientA, clientB, actor, reader, otherTenant *e2eKey
}

func testBoltServer(t *testing.T, bin string, rows *rowRecorder) {
	s := startServer(t, bin, rows)
	scopeA := "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*"
	k := keyring{
		admin: s.createKey("admin-1", "administrator",
			"targets:lease,targets:read,targets:force-release,audit:read,credentials:manage",
			"tenant:*,program:*,target-namespace:*,target:*,actor:*"),
		adminNoForce: s.createKey("admin-noforce", "administrator", "targets:lease,targets:read", scopeA),
		clientA:      s.createKey("prn-client-a", "api_client", "targets:lease", scopeA),
		clientB:      s.createKey("prn-client-b", "api_client", "targets:lease", scopeA),
		actor: s.createKey("prn-actor-ug", "actor_component", "targets:lease",
			"tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:usernamegen"),
		reader:      s.createKey("prn-reader", "api_client", "targets:read", scopeA),
		otherTenant: s.createKey("prn-tenant-b", "api_client", "targets:lease,targets:read", "tenant:tenant-b,program:*,target-namespace:*,target:*,actor:*"),
	}
	// Values that must never reach the audit log or the server's output.
	const metaCanary = "meta-canary-5d1e9a"
	st := &boltState{s: s, k: k, metaCanary: metaCanary, corr: map[string]string{}}
	t.Run("lifecycle_with_client", st.lifecycle)
	t.Run("commit_code_in_wire_table", st.commitCodeInTable)
	t.Run("pagination", st.pagination)
	t.Run("invalid_requests", st.invalidRequests)
	t.Run("unauthorized_uniform", st.unauthorized)
	t.Run("correlation_ids", st.correlation)
	t.Run("scope_and_capability", st.scope)
	t.Run("conflict_and_lost", st.conflictLost)
	t.Run("idempotent_replays", st.idempotency)
	t.Run("deadline", st.deadline)
	t.Run("force_release_and_revoke", st.admin)
	t.Run("audit_events", st.auditEvents)
	t.Run("every_request_audited", st.everyRequestAudited)
	t.Run("metrics", st.metrics)
	t.Run("credential_store_unavailable", st.credentialStoreUnavailable)
	// Stop the server first so its output and audit file are complete.
	t.Run("no_secrets_anywhere", func(t *testing.T) {
		start := time.Now()
		if err := s.Stop(); err != nil {
			t.Errorf("server did not stop cleanly: %v", err)
		}
		t.Logf("graceful shutdown took %v", time.Since(start))
		st.noSecrets(t)
	})
}

type boltState struct {
	s          *e2eServer
	k          keyring
	metaCanary string
	// corr maps a purpose to the correlation id sent for it, for the audit
	// checks.
	corr map[string]string
	// Values the audit checks compare with.
	acquired     *client.LeaseResult
	acquireReqID string
	revoked      *client.LeaseResult
	commitCode   lease.Code
	// invalid: the 400 requests (name → correlation id), each must be
	// audited.
	invalid [][2]string
}

func (st *boltState) ctxFor(purpose string) context.Context {
	id := uniqueID("e2e-" + purpose)
	st.corr[purpose] = id
	return client.ContextWithCorrelationID(context.Background(), id)
}

// lifecycle: acquire, renew, get, inspect, list three ways, commit, release,
// reacquire (strictly greater token), release by DELETE, history.
func (st *boltState) lifecycle(t *testing.T) {
	s, c := st.s, st.s.client(st.k.clientA)
	id := identity("life-1", "usernamegen")
	res, err := c.Acquire(st.ctxFor("acquire"), client.AcquireRequest{LockIdentity: id, TTLMs: 30000,
		ServiceInstanceID: "inst-a", ExecutionID: "exec-1", JobID: "job-1", TraceID: "trace-1",
		Metadata: map[string]any{"note": st.metaCanary}})
	a := okLease(t, s, res, err, lease.CodeAcquired)
	st.acquired, st.acquireReqID = a, a.RequestID
	l := a.Lease
	if l.LockIdentity != canonical(id) || l.FencingToken < 1 || l.TTLMs != 30000 || l.State != lease.StateActive ||
		!l.AcquiredAt.Equal(l.RenewedAt) || !l.ExpiresAt.Equal(l.AcquiredAt.Add(30*time.Second)) || a.Replayed ||
		!strings.HasPrefix(l.LeaseID, "lease_") || a.Current != nil {
		t.Fatalf("acquired %+v", a)
	}
	if !regexp.MustCompile(`^req_[0-9A-Z]{26}$`).MatchString(a.RequestID) {
		t.Fatalf("generated request id %q", a.RequestID)
	}

	res, err = c.Renew(context.Background(), client.RenewRequest{LeaseID: l.LeaseID, LockIdentity: id,
		FencingToken: l.FencingToken, ServiceInstanceID: "inst-a", TTLMs: 60000})
	r := okLease(t, s, res, err, lease.CodeRenewed).Lease
	if r.LeaseID != l.LeaseID || r.FencingToken != l.FencingToken || r.TTLMs != 60000 || r.RenewedAt.Before(l.RenewedAt) ||
		!r.ExpiresAt.Equal(r.RenewedAt.Add(60*time.Second)) || !r.AcquiredAt.Equal(l.AcquiredAt) {
		t.Fatalf("renewed %+v after %+v", r, l)
	}

	res, err = c.Get(context.Background(), l.LeaseID)
	if g := okLease(t, s, res, err, lease.CodeInspected).Lease; g != r {
		t.Fatalf("get %+v, want %+v", g, r)
	}
	// Inspect by identity, spelled non-canonically: the server normalizes.
	upper := id
	upper.TenantID, upper.TargetID = "TENANT-A", " Life-1 "
	res, err = c.Inspect(context.Background(), upper)
	if g := okLease(t, s, res, err, lease.CodeInspected).Lease; g != r {
		t.Fatalf("inspect %+v, want %+v", g, r)
	}
	for name, q := range map[string]client.ListRequest{
		"owner":   {OwnerPrincipalID: "prn-client-a"},
		"target":  {TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "starintel-target", TargetID: "life-1"},
		"program": {TenantID: "tenant-a", ProgramID: "program-a"},
	} {
		page, err := c.List(context.Background(), q)
		if err != nil {
			t.Fatalf("list by %s: %v", name, err)
		}
		s.rows.record(t, 200, page.Code, "client list")
		if page.Code != lease.CodeListed || page.CorrelationID == "" || !containsLease(page.Leases, l.LeaseID) {
			t.Fatalf("list by %s: %+v", name, page)
		}
	}

	cm, err := c.AuthorizeCommit(context.Background(), client.CommitRequest{LockIdentity: id, LeaseID: l.LeaseID,
		FencingToken: l.FencingToken, ServiceInstanceID: "inst-a", Sink: "couchdb", CommitID: "commit-1",
		ExecutionID: "exec-1", JobID: "job-1", TraceID: "trace-1", Target: "doc-1", PayloadSHA256: strings.Repeat("c", 64)})
	if err != nil {
		t.Fatalf("authorize commit: %v", err)
	}
	if cm.Commit.FencingToken != l.FencingToken || cm.Commit.LeaseID != l.LeaseID || cm.Commit.Sink != "couchdb" ||
		cm.Commit.CommitID != "commit-1" || cm.Commit.AcceptedAt.IsZero() || cm.Commit.Target != "doc-1" ||
		cm.Commit.JobID != "job-1" || cm.Commit.PayloadSHA256 != strings.Repeat("c", 64) {
		t.Fatalf("commit %+v", cm)
	}
	st.commitCode = cm.Code

	res, err = c.Release(context.Background(), client.ReleaseRequest{LeaseID: l.LeaseID, LockIdentity: id,
		FencingToken: l.FencingToken, ServiceInstanceID: "inst-a"})
	if rel := okLease(t, s, res, err, lease.CodeReleased).Lease; rel.State != lease.StateReleased || rel.LeaseID != l.LeaseID {
		t.Fatalf("released %+v", rel)
	}

	res, err = c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: id, TTLMs: 30000,
		ServiceInstanceID: "inst-a", ExecutionID: "exec-2", JobID: "job-2"})
	l2 := okLease(t, s, res, err, lease.CodeAcquired).Lease
	if l2.FencingToken <= l.FencingToken || l2.LeaseID == l.LeaseID {
		t.Fatalf("reacquired %+v after %+v: token must grow, lease id change", l2, l)
	}
	// DELETE /{lease_id} is release too.
	del := s.do(t, rawReq{Method: "DELETE", Path: apiBase + "/" + l2.LeaseID, Key: st.k.clientA.APIKey,
		Body: map[string]any{"lock_identity": id, "fencing_token": l2.FencingToken, "service_instance_id": "inst-a",
			"request_id": uniqueID("del")}})
	if del.Status != 200 || del.code() != "lease_released" || leaseOf(t, del, "lease")["state"] != "released" {
		t.Fatalf("DELETE: %d %s", del.Status, del.Body)
	}

	// History (audit:read) shows both terminal leases.
	h, err := s.client(st.k.admin).History(context.Background(), l2.LeaseID, 0, "")
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	s.rows.record(t, 200, h.Code, "client history")
	found := map[string]lease.State{}
	for _, e := range h.History {
		found[e.LeaseID] = e.State
		if e.EndedAt.IsZero() {
			t.Errorf("history entry without ended_at: %+v", e)
		}
	}
	if found[l.LeaseID] != lease.StateReleased || found[l2.LeaseID] != lease.StateReleased {
		t.Fatalf("history %+v", h)
	}
}

// commitCodeInTable: the success code of POST /commits/authorize must be
// one of the wire table's 200 rows ("the contract's wire table, which is
// closed: codes the table does not name travel as the row whose meaning
// they have", wire.go; "Envelopes, codes and statuses EXACTLY as the
// contract's wire table", issue 4).
func (st *boltState) commitCodeInTable(t *testing.T) {
	if st.commitCode == "" {
		t.Fatal("no commit was authorized")
	}
	row := "200 " + string(st.commitCode)
	if !wireTable[row] {
		t.Errorf("POST /commits/authorize answers %q, which is not a row of the contract's closed wire table", row)
	}
}

func containsLease(ls []client.Lease, id string) bool {
	for _, l := range ls {
		if l.LeaseID == id {
			return true
		}
	}
	return false
}

// pagination: list by owner with page_size and page_token.
func (st *boltState) pagination(t *testing.T) {
	s, c := st.s, st.s.client(st.k.clientB)
	want := map[string]bool{}
	for i := 0; i < 3; i++ {
		res, err := c.Acquire(context.Background(), client.AcquireRequest{LockIdentity: identity(fmt.Sprintf("page-%d", i), "pager"),
			TTLMs: 30000, ServiceInstanceID: "inst-b", ExecutionID: "exec-p", JobID: "job-p"})
		want[okLease(t, s, res, err, lease.CodeAcquired).Lease.LeaseID] = true
	}
	got := map[string]bool{}
	token, pages := "", 0
	for {
		page, err := c.List(context.Background(), client.ListRequest{OwnerPrincipalID: "prn-client-b", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Leases) > 2 {
			t.Fatalf("page of %d leases with page_size 2", len(page.Leases))
		}
		for _, l := range page.Leases {
			if got[l.LeaseID] {
				t.Fatalf("lease %s on two pages", l.LeaseID)
			}
			got[l.LeaseID] = true
		}
		if token = page.NextPageToken; token == "" || pages > 10 {
			break
		}
	}
	for id := range want {
		if !got[id] {
			t.Fatalf("lease %s missing from the pages (%d pages, got %v)", id, pages, got)
		}
	}
	if pages < 2 {
		t.Fatalf("3 leases in %d page(s) of 2", pages)
	}
}

// invalidRequests: every 400 names its field, never echoes input.
func (st *boltState) invalidRequests(t *testing.T) {
	s := st.s
	key := st.k.clientA.APIKey
	id := identity("invalid-1", "usernamegen")
	valid := acquireBody(id, "")
	enc := func(m map[string]any) string {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	big := enc(with(valid, "request_id", uniqueID("big"), "job_id", strings.Repeat("j", 70<<10)))
	const badTarget = "../../etc/passwd"
	acq := apiBase + "/acquire"
	cases := []struct {
		name, method, path string
		body               any
		header             [][2]string
		field              string
	}{
		{"unknown field", "POST", acq, with(valid, "request_id", uniqueID("r"), "owner_principal_id", "prn-admin"), nil, "owner_principal_id"},
		{"unknown nested field", "POST", acq, with(valid, "request_id", uniqueID("r"), "lock_identity",
			map[string]any{"tenant_id": "tenant-a", "program_id": "program-a", "target_namespace": "ns", "target_id": "t",
				"actor_name": "a", "lock_key": "starintel:target-lease:v1:x"}), nil, "lock_key"},
		{"trailing data", "POST", acq, enc(with(valid, "request_id", uniqueID("r"))) + ` {"ttl_ms":1}`, nil, "body"},
		{"oversize body", "POST", acq, big, nil, "body"},
		{"malformed JSON", "POST", acq, `{"lock_identity":`, nil, "body"},
		{"empty body", "POST", acq, ``, nil, "body"},
		{"wrong type", "POST", acq, with(valid, "request_id", uniqueID("r"), "ttl_ms", "30s"), nil, "ttl_ms"},
		{"not JSON content type", "POST", acq, enc(with(valid, "request_id", uniqueID("r"))),
			[][2]string{{"Content-Type", "\x00delete"}, {"Content-Type", "text/plain"}}, "Content-Type"},
		{"bad identity", "POST", acq, with(valid, "request_id", uniqueID("r"), "lock_identity",
			map[string]any{"tenant_id": "tenant-a", "program_id": "program-a", "target_namespace": "ns",
				"target_id": badTarget, "actor_name": "usernamegen"}), nil, "lock_identity.target_id"},
		{"missing identity", "POST", acq, with(valid, "request_id", uniqueID("r"), "lock_identity", nil), nil, "lock_identity"},
		{"unknown operation class", "POST", acq, with(valid, "request_id", uniqueID("r"), "lock_identity",
			map[string]any{"tenant_id": "tenant-a", "program_id": "program-a", "target_namespace": "ns",
				"target_id": "t", "actor_name": "usernamegen", "operation_class": "turbo"}), nil, "lock_identity.operation_class"},
		{"ttl below policy", "POST", acq, with(valid, "request_id", uniqueID("r"), "ttl_ms", 500), nil, "ttl_ms"},
		{"ttl at the minimum", "POST", acq, with(valid, "request_id", uniqueID("r"), "ttl_ms", 1000), nil, "ttl_ms"},
		{"ttl above policy", "POST", acq, with(valid, "request_id", uniqueID("r"), "ttl_ms", 11*60*1000), nil, "ttl_ms"},
		{"negative ttl", "POST", acq, with(valid, "request_id", uniqueID("r"), "ttl_ms", -1), nil, "ttl_ms"},
		{"lifetime above policy", "POST", acq, with(valid, "request_id", uniqueID("r"), "maximum_lifetime_ms", 2*3600*1000), nil, "maximum_lifetime_ms"},
		{"missing request_id", "POST", acq, valid, nil, "request_id"},
		{"Idempotency-Key differs from request_id", "POST", acq, with(valid, "request_id", uniqueID("r")),
			[][2]string{{"Idempotency-Key", uniqueID("k")}}, "request_id"},
		{"two Idempotency-Keys", "POST", acq, valid,
			[][2]string{{"Idempotency-Key", uniqueID("k")}, {"Idempotency-Key", uniqueID("k")}}, "Idempotency-Key"},
		{"deadline not RFC 3339", "POST", acq, with(valid, "request_id", uniqueID("r"), "deadline_at", "tomorrow"), nil, "deadline_at"},
		{"deadline twice", "POST", acq, with(valid, "request_id", uniqueID("r"), "deadline_at", time.Now().Add(time.Minute).Format(time.RFC3339)),
			[][2]string{{"X-Request-Timeout-Ms", "1000"}}, "deadline_at"},
		{"bad timeout header", "POST", acq, with(valid, "request_id", uniqueID("r")),
			[][2]string{{"X-Request-Timeout-Ms", "soon"}}, "X-Request-Timeout-Ms"},
		{"nested metadata", "POST", acq, with(valid, "request_id", uniqueID("r"), "metadata",
			map[string]any{"note": map[string]any{"deep": st.metaCanary}}), nil, "metadata.note"},
		{"renew without token", "POST", apiBase + "/lease_01ABC/renew", map[string]any{"lock_identity": valid["lock_identity"],
			"service_instance_id": "i", "request_id": uniqueID("r")}, nil, "fencing_token"},
		// Checked by the adapter after the body decoded: still audited as
		// a request rejected before the service.
		{"renew with negative ttl", "POST", apiBase + "/lease_01ABC/renew", map[string]any{"lock_identity": valid["lock_identity"],
			"fencing_token": 1, "service_instance_id": "i", "ttl_ms": -1, "request_id": uniqueID("r")}, nil, "ttl_ms"},
		{"force-release without reason", "POST", apiBase + "/lease_01ABC/force-release", map[string]any{
			"lock_identity": valid["lock_identity"], "fencing_token": 1, "request_id": uniqueID("r")},
			[][2]string{{"Authorization", "\x00delete"}, {"Authorization", "Bearer " + st.k.admin.APIKey}}, "reason"},
		{"list without filter", "GET", apiBase, nil, nil, "owner_principal_id"},
		{"list page_size negative", "GET", apiBase + "?owner_principal_id=prn-client-a&page_size=-1", nil, nil, "page_size"},
		{"list unknown parameter", "GET", apiBase + "?owner_principal_id=prn-client-a&lock_key=x", nil, nil, "lock_key"},
		{"list bad tenant", "GET", apiBase + "?tenant_id=..%2Fx&program_id=program-a", nil, nil, "tenant_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			corr := uniqueID("e2e-invalid")
			st.invalid = append(st.invalid, [2]string{tc.name, corr})
			hdr := append([][2]string{{"X-Correlation-ID", corr}}, tc.header...)
			r := s.do(t, rawReq{Method: tc.method, Path: tc.path, Key: key, Body: tc.body, Header: hdr})
			if r.Status != 400 || r.code() != "invalid_lease_request" || r.str("field") != tc.field || r.JSON["retryable"] != false {
				t.Fatalf("want 400 invalid_lease_request field %q, got %d %s", tc.field, r.Status, r.Body)
			}
			for _, leak := range []string{badTarget, st.metaCanary, "prn-admin", "starintel:target-lease", "jjjjjjjj", "turbo", "tomorrow", "soon"} {
				if bytes.Contains(r.Body, []byte(leak)) {
					t.Fatalf("400 body echoes input %q: %s", leak, r.Body)
				}
			}
		})
	}
	// Through the client: the same 400 with its field.
	_, err := st.s.client(st.k.clientA).Acquire(context.Background(), client.AcquireRequest{LockIdentity: id, TTLMs: 10,
		ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
	if ce := wantErr(t, s, err, 400, lease.CodeInvalidRequest); ce.Field != "ttl_ms" || ce.Retryable {
		t.Fatalf("client 400: %#v", ce)
	}
}

// unauthorized: every authentication failure is the same 401 body (but for
// the correlation id), with WWW-Authenticate and Cache-Control: no-store.
func (st *boltState) unauthorized(t *testing.T) {
	s := st.s
	good := st.k.clientA
	revoked := s.createKey("prn-revoked", "api_client", "targets:lease", "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	expired := s.createKey("prn-expired", "api_client", "targets:lease", "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*", "--ttl", "1ms")
	// The revoked key works until it is revoked by the CLI while the
	// server runs; the next request fails (no credential cache).
	pre := s.do(t, rawReq{Method: "GET", Path: apiBase + "?owner_principal_id=prn-revoked", Key: revoked.APIKey})
	if pre.Status != 200 {
		t.Fatalf("fresh key: %d %s", pre.Status, pre.Body)
	}
	s.revokeKey(revoked)
	// Rotation while the server runs: the old key fails on its next
	// request, the new one works at once.
	rotOld := s.createKey("prn-rotated", "api_client", "targets:lease", "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	if r := s.do(t, rawReq{Method: "GET", Path: apiBase + "?owner_principal_id=prn-rotated", Key: rotOld.APIKey}); r.Status != 200 {
		t.Fatalf("key before rotation: %d %s", r.Status, r.Body)
	}
	rotNew := s.rotateKey(rotOld)
	if r := s.do(t, rawReq{Method: "GET", Path: apiBase + "?owner_principal_id=prn-rotated", Key: rotNew.APIKey}); r.Status != 200 {
		t.Fatalf("rotated key: %d %s", r.Status, r.Body)
	}

	wrongSecret := "star_sk_v1_" + good.CredentialID + "_" + strings.Repeat("ab", 32)
	unknownID := "star_sk_v1_01ARZ3NDEKTSV4RRFFQ69G5FAV_" + good.Secret
	st.corr["authfail"] = uniqueID("e2e-authfail")
	body := acquireBody(identity("auth-1", "usernamegen"), uniqueID("r"))
	cases := []struct {
		name   string
		auth   []string
		method string
		corr   string
	}{
		{"no header", []string{}, "POST", ""},
		{"empty header", []string{""}, "POST", ""},
		{"two headers", []string{"Bearer " + good.APIKey, "Bearer " + good.APIKey}, "POST", ""},
		{"two values in one header", []string{"Bearer " + good.APIKey + ", Bearer " + good.APIKey}, "POST", ""},
		{"basic", []string{"Basic " + "YWRtaW46YWRtaW4="}, "POST", ""},
		{"bearer without key", []string{"Bearer "}, "GET", ""},
		{"malformed key", []string{"Bearer star_sk_v1_nothex"}, "POST", ""},
		{"upper-case secret", []string{"Bearer star_sk_v1_" + good.CredentialID + "_" + strings.ToUpper(good.Secret)}, "POST", ""},
		{"unknown id", []string{"Bearer " + unknownID}, "POST", ""},
		{"wrong secret", []string{"Bearer " + wrongSecret}, "POST", st.corr["authfail"]},
		{"revoked key", []string{"Bearer " + revoked.APIKey}, "GET", ""},
		{"rotated-out key", []string{"Bearer " + rotOld.APIKey}, "GET", ""},
		{"expired key", []string{"Bearer " + expired.APIKey}, "POST", ""},
	}
	var reference []byte
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rawReq{Method: tc.method, Auth: tc.auth}
			if tc.method == "POST" {
				r.Path, r.Body = apiBase+"/acquire", body
			} else {
				r.Path = apiBase + "?owner_principal_id=prn-client-a"
			}
			if tc.corr != "" {
				r.Header = [][2]string{{"X-Correlation-ID", tc.corr}}
			}
			resp := s.do(t, r)
			if resp.Status != 401 || resp.code() != "invalid_credential" {
				t.Fatalf("want 401 invalid_credential, got %d %s", resp.Status, resp.Body)
			}
			if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("WWW-Authenticate %q", resp.Header.Get("WWW-Authenticate"))
			}
			if resp.Header.Get("Cache-Control") != "no-store" {
				t.Fatalf("Cache-Control %q", resp.Header.Get("Cache-Control"))
			}
			if tc.corr != "" && resp.str("correlation_id") != tc.corr {
				t.Fatalf("correlation id %q, sent %q", resp.str("correlation_id"), tc.corr)
			}
			norm := bytes.Replace(resp.Body, []byte(resp.str("correlation_id")), []byte("CORR"), 1)
			if reference == nil {
				reference = norm
			} else if !bytes.Equal(norm, reference) {
				t.Fatalf("401 body differs:\n%s\nvs\n%s", norm, reference)
			}
		})
	}
	// The client reports the same failure as a typed error.
	bad, err := client.New(s.URL(), wrongSecret)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Inspect(context.Background(), identity("auth-1", "usernamegen"))
	wantErr(t, s, err, 401, lease.CodeInvalidCredential)
}

// correlation: a well-formed X-Correlation-ID is echoed on success, error
// and 401 answers; a malformed one is replaced by a fresh corr_<ULID>.
func (st *boltState) correlation(t *testing.T) {
	s := st.s
	list := apiBase + "?owner_principal_id=prn-client-a"
	for _, tc := range []struct {
		name string
		req  rawReq
	}{
		{"success", rawReq{Method: "GET", Path: list, Key: st.k.clientA.APIKey}},
		{"error", rawReq{Method: "GET", Path: apiBase, Key: st.k.clientA.APIKey}},
		{"unauthorized", rawReq{Method: "GET", Path: list}},
		{"not found", rawReq{Method: "GET", Path: apiBase + "/lease_01NOSUCHLEASE", Key: st.k.clientA.APIKey}},
	} {
		want := "trace-" + strings.ReplaceAll(tc.name, " ", "-") + ":01.ab_c"
		tc.req.Header = [][2]string{{"X-Correlation-ID", want}}
		if r := s.do(t, tc.req); r.str("correlation_id") != want || r.Header.Get("X-Correlation-ID") != want {
			t.Errorf("%s: correlation id %q (header %q), sent %q", tc.name, r.str("correlation_id"), r.Header.Get("X-Correlation-ID"), want)
		}
	}
	for _, bad := range [][]string{
		{"has space"}, {"../../etc"}, {"a..b"}, {strings.Repeat("x", 200)}, {"-leading-dash"}, {"ünïcode"},
		{"ok-1", "ok-2"}, {"semi;colon"},
	} {
		hdr := [][2]string{}
		for _, v := range bad {
			hdr = append(hdr, [2]string{"X-Correlation-ID", v})
		}
		r := s.do(t, rawReq{Method: "GET", Path: list, Key: st.k.clientA.APIKey, Header: hdr})
		got := r.str("correlation_id")
		if !corrRE.MatchString(got) {
			t.Errorf("malformed %q: correlation id %q, want a fresh corr_<ULID>", bad, got)
		}
	}
	// Without one, each answer gets its own.
	a := s.do(t, rawReq{Method: "GET", Path: list, Key: st.k.clientA.APIKey})
	b := s.do(t, rawReq{Method: "GET", Path: list, Key: st.k.clientA.APIKey})
	if !corrRE.MatchString(a.str("correlation_id")) || a.str("correlation_id") == b.str("correlation_id") {
		t.Errorf("minted correlation ids %q, %q", a.str("correlation_id"), b.str("correlation_id"))
	}
}

// scope: capability and scope denials, actor binding, list filtering, and
// 404 for leases a caller may not see.
func (st *boltState) scope(t *testing.T) {
	s := st.s
	ctx := context.Background()
	ca, cb := s.client(st.k.clientA), s.client(st.k.clientB)
	reader, other, actor, admin := s.client(st.k.reader), s.client(st.k.otherTenant), s.client(st.k.actor), s.client(st.k.admin)
	acquire := func(c *client.Client, id lease.Identity) client.Lease {
		t.Helper()
		res, err := c.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "inst-s",
			ExecutionID: "exec-s", JobID: "job-s"})
		return okLease(t, s, res, err, lease.CodeAcquired).Lease
	}
	mine := identity("scope-1", "usernamegen")
	la := acquire(ca, mine)
	otherActor := identity("scope-2", "portscan")
	lOtherActor := acquire(ca, otherActor)
	tenantB := lease.Identity{TenantID: "tenant-b", ProgramID: "program-z", TargetNamespace: "starintel-target", TargetID: "scope-3", ActorName: "usernamegen"}
	lB := acquire(admin, tenantB)

	// Capability missing: targets:read cannot acquire.
	_, err := reader.Acquire(st.ctxFor("denied"), client.AcquireRequest{LockIdentity: identity("scope-4", "usernamegen"),
		TTLMs: 30000, ServiceInstanceID: "inst-r", ExecutionID: "exec-r", JobID: "job-r"})
	if ce := wantErr(t, s, err, 403, lease.CodeAccessDenied); ce.Retryable || ce.RetryAfter != 0 {
		t.Fatalf("403: %#v", ce)
	}
	// Scope mismatch: tenant-a key on tenant-b, program mismatch, and the
	// other tenant's key on tenant-a.
	_, err = ca.Acquire(ctx, client.AcquireRequest{LockIdentity: tenantB, TTLMs: 30000, ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	progB := identity("scope-5", "usernamegen")
	progB.ProgramID = "program-b"
	_, err = ca.Acquire(ctx, client.AcquireRequest{LockIdentity: progB, TTLMs: 30000, ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = other.Inspect(ctx, mine)
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = other.Get(ctx, la.LeaseID)
	wantErr(t, s, err, 404, lease.CodeNotFound)
	_, err = other.Renew(ctx, client.RenewRequest{LeaseID: la.LeaseID, LockIdentity: mine, FencingToken: la.FencingToken, ServiceInstanceID: "inst-s"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	// History needs audit:read.
	_, err = ca.History(ctx, la.LeaseID, 0, "")
	wantErr(t, s, err, 403, lease.CodeAccessDenied)

	// The actor_component works on its own actor only.
	own := acquire(actor, identity("scope-6", "usernamegen"))
	_, err = actor.Acquire(ctx, client.AcquireRequest{LockIdentity: identity("scope-7", "portscan"), TTLMs: 30000,
		ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = actor.Renew(ctx, client.RenewRequest{LeaseID: lOtherActor.LeaseID, LockIdentity: otherActor,
		FencingToken: lOtherActor.FencingToken, ServiceInstanceID: "inst-s"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = actor.Release(ctx, client.ReleaseRequest{LeaseID: lOtherActor.LeaseID, LockIdentity: otherActor,
		FencingToken: lOtherActor.FencingToken, ServiceInstanceID: "inst-s"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = actor.Inspect(ctx, otherActor)
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = actor.Get(ctx, lOtherActor.LeaseID)
	wantErr(t, s, err, 404, lease.CodeNotFound)
	// An actor_component holding targets:lease sees its own lease only.
	res, err := actor.Get(ctx, own.LeaseID)
	okLease(t, s, res, err, lease.CodeInspected)
	if g, err := ca.Get(ctx, lOtherActor.LeaseID); err != nil || g.Lease.State != lease.StateActive {
		t.Fatalf("the other actor's lease must be untouched: %+v %v", g, err)
	}

	// A targets:lease-only caller cannot see another principal's lease: 404
	// by id and by identity.
	_, err = cb.Get(ctx, la.LeaseID)
	wantErr(t, s, err, 404, lease.CodeNotFound)
	_, err = cb.Inspect(ctx, mine)
	wantErr(t, s, err, 404, lease.CodeNotFound)
	// An unknown lease id is 404 too, for everyone.
	_, err = admin.Get(ctx, "lease_01ARZ3NDEKTSV4RRFFQ69G5FAV")
	wantErr(t, s, err, 404, lease.CodeNotFound)
	// targets:read sees every lease in scope.
	res, err = reader.Get(ctx, la.LeaseID)
	okLease(t, s, res, err, lease.CodeInspected)

	// Lists never show a lease outside the caller's scope.
	listAll := func(c *client.Client, q client.ListRequest) []client.Lease {
		t.Helper()
		var out []client.Lease
		for {
			page, err := c.List(ctx, q)
			if err != nil {
				t.Fatalf("list %+v: %v", q, err)
			}
			s.rows.record(t, 200, page.Code, "client list")
			out = append(out, page.Leases...)
			if q.PageToken = page.NextPageToken; q.PageToken == "" {
				return out
			}
		}
	}
	program := client.ListRequest{TenantID: "tenant-a", ProgramID: "program-a"}
	for _, l := range listAll(cb, program) {
		if !strings.HasPrefix(l.LockIdentity.TargetID, "page-") {
			t.Errorf("client B (targets:lease) listed a lease it does not own: %+v", l)
		}
	}
	readerSees := listAll(reader, program)
	if !containsLease(readerSees, la.LeaseID) || !containsLease(readerSees, lOtherActor.LeaseID) {
		t.Errorf("reader (targets:read) must see every tenant-a lease")
	}
	for _, l := range readerSees {
		if l.LockIdentity.TenantID != "tenant-a" || l.LockIdentity.ProgramID != "program-a" {
			t.Errorf("reader listed a lease outside its scope: %+v", l)
		}
	}
	for _, l := range listAll(actor, program) {
		if l.LockIdentity.ActorName != "usernamegen" || l.LeaseID == lOtherActor.LeaseID {
			t.Errorf("actor_component listed another actor's lease: %+v", l)
		}
	}
	for _, l := range listAll(reader, client.ListRequest{OwnerPrincipalID: "admin-1"}) {
		if l.LeaseID == lB.LeaseID || l.LockIdentity.TenantID != "tenant-a" {
			t.Errorf("reader listed admin's tenant-b lease by owner: %+v", l)
		}
	}
	if ls := listAll(other, client.ListRequest{OwnerPrincipalID: "prn-client-a"}); len(ls) != 0 {
		t.Errorf("tenant-b key listed tenant-a leases: %+v", ls)
	}
	_, err = other.List(ctx, program)
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = cb.List(ctx, client.ListRequest{OwnerPrincipalID: "prn-client-a"})
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	if ls := listAll(admin, client.ListRequest{TenantID: "tenant-b", ProgramID: "program-z"}); !containsLease(ls, lB.LeaseID) {
		t.Errorf("admin must see the tenant-b lease")
	}
}

// conflictLost: 409 lease_conflict with retry_after_ms; 409 lease_lost for
// stale token, wrong owner, wrong instance, wrong lease id, late release.
func (st *boltState) conflictLost(t *testing.T) {
	s := st.s
	ctx := context.Background()
	ca, cb := s.client(st.k.clientA), s.client(st.k.clientB)
	id := identity("conflict-1", "usernamegen")
	res, err := ca.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "inst-a", ExecutionID: "e", JobID: "j"})
	l := okLease(t, s, res, err, lease.CodeAcquired).Lease

	_, err = cb.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "inst-b", ExecutionID: "e", JobID: "j"})
	ce := wantErr(t, s, err, 409, lease.CodeConflict)
	if !ce.Retryable || ce.RetryAfter <= 0 || ce.RetryAfter > 30*time.Second {
		t.Fatalf("conflict: %#v", ce)
	}
	raw := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: st.k.clientB.APIKey, Body: acquireBody(id, uniqueID("r"))})
	if raw.Status != 409 || raw.code() != "lease_conflict" || raw.Header.Get("Retry-After") == "" {
		t.Fatalf("raw conflict: %d %v %s", raw.Status, raw.Header, raw.Body)
	}
	for _, leak := range []string{"prn-client-a", "inst-a", l.LeaseID, "starintel:target-lease"} {
		if bytes.Contains(raw.Body, []byte(leak)) {
			t.Fatalf("conflict body reveals %q: %s", leak, raw.Body)
		}
	}

	renew := func(c *client.Client, leaseID string, token uint64, inst string) error {
		_, err := c.Renew(ctx, client.RenewRequest{LeaseID: leaseID, LockIdentity: id, FencingToken: token, ServiceInstanceID: inst})
		return err
	}
	for name, err := range map[string]error{
		"wrong owner":    renew(cb, l.LeaseID, l.FencingToken, "inst-a"),
		"stale token":    renew(ca, l.LeaseID, l.FencingToken+1, "inst-a"),
		"wrong instance": renew(ca, l.LeaseID, l.FencingToken, "inst-other"),
		"wrong lease id": renew(ca, "lease_01ARZ3NDEKTSV4RRFFQ69G5FAV", l.FencingToken, "inst-a"),
	} {
		t.Run(name, func(t *testing.T) {
			if ce := wantErr(t, s, err, 409, lease.CodeLost); ce.Retryable {
				t.Fatalf("lease_lost must not be retryable: %#v", ce)
			}
		})
	}
	// The lease is untouched by all of that.
	res, err = ca.Get(ctx, l.LeaseID)
	if g := okLease(t, s, res, err, lease.CodeInspected).Lease; g.FencingToken != l.FencingToken || g.State != lease.StateActive {
		t.Fatalf("after stale attempts: %+v", g)
	}
	res, err = ca.Release(ctx, client.ReleaseRequest{LeaseID: l.LeaseID, LockIdentity: id, FencingToken: l.FencingToken, ServiceInstanceID: "inst-a"})
	okLease(t, s, res, err, lease.CodeReleased)
	// Late renew and a second release (new request id) of the ended lease.
	wantErr(t, s, renew(ca, l.LeaseID, l.FencingToken, "inst-a"), 409, lease.CodeLost)
	_, err = ca.Release(ctx, client.ReleaseRequest{LeaseID: l.LeaseID, LockIdentity: id, FencingToken: l.FencingToken, ServiceInstanceID: "inst-a"})
	wantErr(t, s, err, 409, lease.CodeLost)
	// A successor; the stale holder's release cannot touch it.
	res, err = cb.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "inst-b", ExecutionID: "e", JobID: "j"})
	succ := okLease(t, s, res, err, lease.CodeAcquired).Lease
	if succ.FencingToken <= l.FencingToken {
		t.Fatalf("successor token %d after %d", succ.FencingToken, l.FencingToken)
	}
	_, err = ca.Release(ctx, client.ReleaseRequest{LeaseID: l.LeaseID, LockIdentity: id, FencingToken: l.FencingToken, ServiceInstanceID: "inst-a"})
	wantErr(t, s, err, 409, lease.CodeLost)
	_, err = ca.AuthorizeCommit(ctx, client.CommitRequest{LockIdentity: id, LeaseID: l.LeaseID, FencingToken: l.FencingToken,
		ServiceInstanceID: "inst-a", Sink: "couchdb", CommitID: "late-commit", ExecutionID: "e", JobID: "j", Target: "doc"})
	wantErr(t, s, err, 409, lease.CodeLost)
	res, err = cb.Get(ctx, succ.LeaseID)
	if g := okLease(t, s, res, err, lease.CodeInspected).Lease; g.State != lease.StateActive || g.FencingToken != succ.FencingToken {
		t.Fatalf("successor after stale release: %+v", g)
	}
}

// idempotency: replays by request_id and by Idempotency-Key return the same
// lease and token with "replayed": true; a changed body is
// idempotency_conflict; a replay of an ended lease reports its current state.
func (st *boltState) idempotency(t *testing.T) {
	s := st.s
	key := st.k.clientA.APIKey
	id := identity("idem-1", "usernamegen")
	rid := uniqueID("req-idem")
	body := acquireBody(id, rid)
	first := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: body})
	if first.Status != 200 || first.code() != "lease_acquired" || first.JSON["replayed"] != nil {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	l1 := leaseOf(t, first, "lease")
	second := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: body})
	l2 := leaseOf(t, second, "lease")
	if second.Status != 200 || second.JSON["replayed"] != true || l2["lease_id"] != l1["lease_id"] ||
		l2["fencing_token"] != l1["fencing_token"] || l2["expires_at"] != l1["expires_at"] {
		t.Fatalf("replay: %s\nfirst: %s", second.Body, first.Body)
	}
	if second.str("correlation_id") == first.str("correlation_id") {
		t.Fatalf("a replay is a new request with its own correlation id")
	}
	changed := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: with(body, "ttl_ms", 45000)})
	if changed.Status != 409 || changed.code() != "idempotency_conflict" || changed.JSON["retryable"] != false {
		t.Fatalf("changed body: %d %s", changed.Status, changed.Body)
	}

	// Idempotency-Key instead of request_id, and both when they agree.
	id2 := identity("idem-2", "usernamegen")
	ik := uniqueID("idem-key")
	hdr := [][2]string{{"Idempotency-Key", ik}}
	h1 := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: acquireBody(id2, ""), Header: hdr})
	h2 := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: acquireBody(id2, ""), Header: hdr})
	h3 := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: acquireBody(id2, ik), Header: hdr})
	h4 := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: acquireBody(id2, ik)})
	for i, r := range []rawResp{h2, h3, h4} {
		if r.Status != 200 || r.JSON["replayed"] != true || leaseOf(t, r, "lease")["lease_id"] != leaseOf(t, h1, "lease")["lease_id"] ||
			leaseOf(t, r, "lease")["fencing_token"] != leaseOf(t, h1, "lease")["fencing_token"] {
			t.Fatalf("Idempotency-Key replay %d: %s (first %s)", i, r.Body, h1.Body)
		}
	}
	if h1.Status != 200 || h1.JSON["replayed"] != nil {
		t.Fatalf("first with Idempotency-Key: %s", h1.Body)
	}

	// Renew and release replays through the client.
	c := s.client(st.k.clientA)
	leaseID, token := l1["lease_id"].(string), num(l1["fencing_token"])
	rr := client.RenewRequest{LeaseID: leaseID, LockIdentity: id, FencingToken: token, ServiceInstanceID: "inst-raw", RequestID: uniqueID("renew")}
	res, err := c.Renew(context.Background(), rr)
	r1 := okLease(t, s, res, err, lease.CodeRenewed)
	res, err = c.Renew(context.Background(), rr)
	r2 := okLease(t, s, res, err, lease.CodeRenewed)
	if r1.Replayed || !r2.Replayed || r2.Lease != r1.Lease {
		t.Fatalf("renew replay %+v after %+v", r2, r1)
	}
	rel := client.ReleaseRequest{LeaseID: leaseID, LockIdentity: id, FencingToken: token, ServiceInstanceID: "inst-raw", RequestID: uniqueID("release")}
	res, err = c.Release(context.Background(), rel)
	x1 := okLease(t, s, res, err, lease.CodeReleased)
	res, err = c.Release(context.Background(), rel)
	x2 := okLease(t, s, res, err, lease.CodeReleased)
	if !x2.Replayed || x2.Lease.LeaseID != x1.Lease.LeaseID || x2.Lease.State != lease.StateReleased {
		t.Fatalf("release replay %+v", x2)
	}
	// The acquire replayed after its lease ended: the original result plus
	// the current terminal state, and no new lease.
	late := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: key, Body: body})
	if late.Status != 200 || late.JSON["replayed"] != true || leaseOf(t, late, "lease")["lease_id"] != l1["lease_id"] ||
		leaseOf(t, late, "lease")["fencing_token"] != l1["fencing_token"] {
		t.Fatalf("late replay: %s", late.Body)
	}
	if cur, ok := late.JSON["current"].(map[string]any); !ok || cur["state"] != "released" || cur["lease_id"] != l1["lease_id"] {
		t.Fatalf("late replay must report the current (released) state: %s", late.Body)
	}
	// The client replays too.
	a := client.AcquireRequest{LockIdentity: identity("idem-3", "usernamegen"), TTLMs: 30000, ServiceInstanceID: "i",
		ExecutionID: "e", JobID: "j", RequestID: uniqueID("client-idem")}
	res, err = c.Acquire(context.Background(), a)
	c1 := okLease(t, s, res, err, lease.CodeAcquired)
	res, err = c.Acquire(context.Background(), a)
	c2 := okLease(t, s, res, err, lease.CodeAcquired)
	if !c2.Replayed || c2.Lease != c1.Lease {
		t.Fatalf("client replay %+v after %+v", c2, c1)
	}
	a.TTLMs = 31000
	_, err = c.Acquire(context.Background(), a)
	wantErr(t, s, err, 409, lease.CodeIdempotencyConflict)
}

// deadline: a deadline_at in the past is 408 deadline_exceeded.
func (st *boltState) deadline(t *testing.T) {
	s := st.s
	id := identity("deadline-1", "usernamegen")
	r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: st.k.clientA.APIKey,
		Body: with(acquireBody(id, uniqueID("r")), "deadline_at", "2020-01-01T00:00:00Z")})
	if r.Status != 408 || r.code() != "deadline_exceeded" || r.JSON["retryable"] != true {
		t.Fatalf("past deadline: %d %s", r.Status, r.Body)
	}
	// Through the client, a body deadline in the past (the context is fine).
	_, err := s.client(st.k.clientA).Acquire(context.Background(), client.AcquireRequest{LockIdentity: id, TTLMs: 30000,
		ServiceInstanceID: "i", ExecutionID: "e", JobID: "j", DeadlineAt: time.Now().Add(-time.Second)})
	wantErr(t, s, err, 408, lease.CodeDeadlineExceeded)
	// Nothing was acquired.
	_, err = s.client(st.k.clientA).Inspect(context.Background(), id)
	if lease.CodeOf(err) != lease.CodeNotFound {
		t.Fatalf("after deadline_exceeded, inspect: %v", err)
	}
	s.rows.record(t, 404, lease.CodeOf(err), "inspect after deadline")
}

// admin: force-release and revoke need reason/incident and an
// administrator with targets:force-release; after revoke the fenced-write
// validation rejects the old lease.
func (st *boltState) admin(t *testing.T) {
	s := st.s
	ctx := context.Background()
	ca, cb, admin := s.client(st.k.clientA), s.client(st.k.clientB), s.client(st.k.admin)
	noForce, reader := s.client(st.k.adminNoForce), s.client(st.k.reader)
	acquire := func(target string) (lease.Identity, client.Lease) {
		id := identity(target, "usernamegen")
		res, err := ca.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "inst-a",
			ExecutionID: "exec-adm", JobID: "job-adm", TraceID: "trace-adm"})
		return id, okLease(t, s, res, err, lease.CodeAcquired).Lease
	}
	adminReq := func(id lease.Identity, l client.Lease, reason, incident string) client.AdminRequest {
		return client.AdminRequest{LeaseID: l.LeaseID, LockIdentity: id, FencingToken: l.FencingToken, Reason: reason, IncidentID: incident}
	}

	// force-release
	id1, l1 := acquire("admin-1")
	for name, c := range map[string]*client.Client{"api_client (owner)": ca, "api_client": cb, "targets:read": reader,
		"administrator without targets:force-release": noForce} {
		_, err := c.ForceRelease(ctx, adminReq(id1, l1, "operator cleanup", ""))
		if lease.CodeOf(err) != lease.CodeAccessDenied {
			t.Fatalf("force-release by %s: %v", name, err)
		}
		wantErr(t, s, err, 403, lease.CodeAccessDenied)
	}
	_, err := admin.ForceRelease(ctx, adminReq(id1, l1, "", ""))
	if ce := wantErr(t, s, err, 400, lease.CodeInvalidRequest); ce.Field != "reason" {
		t.Fatalf("force-release without reason: %#v", ce)
	}
	_, err = admin.ForceRelease(ctx, adminReq(id1, l1, strings.Repeat("r", 600), ""))
	if ce := wantErr(t, s, err, 400, lease.CodeInvalidRequest); ce.Field != "reason" {
		t.Fatalf("force-release with a 600-byte reason: %#v", ce)
	}
	_, err = admin.ForceRelease(ctx, adminReq(id1, l1, "bad\nline", ""))
	wantErr(t, s, err, 400, lease.CodeInvalidRequest)
	// The observed lease must match: a wrong token changes nothing.
	stale := adminReq(id1, l1, "operator cleanup", "")
	stale.FencingToken++
	_, err = admin.ForceRelease(ctx, stale)
	wantErr(t, s, err, 409, lease.CodeLost)
	res, err := admin.ForceRelease(ctx, adminReq(id1, l1, "operator cleanup of a stuck job", ""))
	fr := okLease(t, s, res, err, lease.CodeReleased).Lease
	if fr.State != lease.StateReleased || fr.LeaseID != l1.LeaseID || fr.FencingToken != l1.FencingToken {
		t.Fatalf("force-released %+v", fr)
	}
	_, err = ca.Renew(ctx, client.RenewRequest{LeaseID: l1.LeaseID, LockIdentity: id1, FencingToken: l1.FencingToken, ServiceInstanceID: "inst-a"})
	wantErr(t, s, err, 409, lease.CodeLost)

	// revoke
	id2, l2 := acquire("admin-2")
	commit := client.CommitRequest{LockIdentity: id2, LeaseID: l2.LeaseID, FencingToken: l2.FencingToken,
		ServiceInstanceID: "inst-a", Sink: "couchdb", CommitID: "commit-before", ExecutionID: "exec-adm", JobID: "job-adm",
		TraceID: "trace-adm", Target: "doc-adm"}
	if _, err := ca.AuthorizeCommit(ctx, commit); err != nil {
		t.Fatalf("commit before revoke: %v", err)
	}
	_, err = admin.Revoke(ctx, adminReq(id2, l2, "", ""))
	if ce := wantErr(t, s, err, 400, lease.CodeInvalidRequest); ce.Field != "reason" {
		t.Fatalf("revoke without reason: %#v", ce)
	}
	_, err = cb.Revoke(ctx, adminReq(id2, l2, "compromised", "INC-42"))
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	_, err = noForce.Revoke(ctx, adminReq(id2, l2, "compromised", "INC-42"))
	wantErr(t, s, err, 403, lease.CodeAccessDenied)
	res, err = admin.Revoke(st.ctxFor("revoke"), adminReq(id2, l2, "suspected credential compromise", "INC-42"))
	rv := okLease(t, s, res, err, lease.CodeRevoked)
	st.revoked = rv
	if rv.Lease.State != lease.StateRevoked || rv.Lease.LeaseID != l2.LeaseID || rv.Lease.FencingToken != l2.FencingToken {
		t.Fatalf("revoked %+v", rv.Lease)
	}
	// After revoke: the fenced-write validation rejects the old lease.
	commit.CommitID = "commit-after"
	_, err = ca.AuthorizeCommit(ctx, commit)
	wantErr(t, s, err, 409, lease.CodeLost)
	raw := s.do(t, rawReq{Method: "POST", Path: apiBase + "/commits/authorize", Key: st.k.clientA.APIKey, Body: map[string]any{
		"lock_identity": id2, "lease_id": l2.LeaseID, "fencing_token": l2.FencingToken, "service_instance_id": "inst-a",
		"sink": "couchdb", "commit_id": "commit-after-raw", "execution_id": "exec-adm", "job_id": "job-adm",
		"trace_id": "trace-adm", "target": "doc-adm"}})
	if raw.Status != 409 || raw.code() != "lease_lost" {
		t.Fatalf("raw commit after revoke: %d %s", raw.Status, raw.Body)
	}
	// The commit authorized before the revoke replays for its own write
	// only: its id for another document is idempotency_conflict, so the
	// revoked holder cannot land a new write by replaying it.
	commit.CommitID = "commit-before"
	if r, err := ca.AuthorizeCommit(ctx, commit); err != nil || !r.Replayed || r.Commit.Target != "doc-adm" {
		t.Fatalf("replay of the commit authorized before the revoke: %+v %v", r, err)
	}
	for _, change := range []func(*client.CommitRequest){
		func(c *client.CommitRequest) { c.Target = "doc-adm-2" },
		func(c *client.CommitRequest) { c.PayloadSHA256 = strings.Repeat("d", 64) },
		func(c *client.CommitRequest) { c.JobID = "job-other" },
	} {
		other := commit
		change(&other)
		_, err = ca.AuthorizeCommit(ctx, other)
		wantErr(t, s, err, 409, lease.CodeIdempotencyConflict)
	}
	_, err = ca.Renew(ctx, client.RenewRequest{LeaseID: l2.LeaseID, LockIdentity: id2, FencingToken: l2.FencingToken, ServiceInstanceID: "inst-a"})
	wantErr(t, s, err, 409, lease.CodeLost)
	// The revoke replays by request id without a second invalidation.
	again := adminReq(id2, l2, "suspected credential compromise", "INC-42")
	again.RequestID = rv.RequestID
	res, err = admin.Revoke(ctx, again)
	if rp := okLease(t, s, res, err, lease.CodeRevoked); !rp.Replayed || rp.Lease.LeaseID != l2.LeaseID {
		t.Fatalf("revoke replay %+v", rp)
	}
	// History records the reason and incident.
	h, err := admin.History(ctx, l2.LeaseID, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range h.History {
		if e.LeaseID == l2.LeaseID {
			found = e.State == lease.StateRevoked && e.Reason == "suspected credential compromise" && e.IncidentID == "INC-42"
		}
	}
	if !found {
		t.Fatalf("history without the revoked entry and its reason: %+v", h.History)
	}
}

// auditEvents reads DATA_DIR/audit.jsonl with audit.ReadFile and checks one
// acquire, one denied request, one authentication failure and one revoke
// field by field.
func (st *boltState) auditEvents(t *testing.T) {
	events, err := audit.ReadFile(filepath.Join(st.s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatalf("audit.ReadFile: %v", err)
	}
	byCorr := func(purpose string) []audit.Event {
		t.Helper()
		corr := st.corr[purpose]
		if corr == "" {
			t.Fatalf("no request made for %s", purpose)
		}
		var out []audit.Event
		for _, e := range events {
			if e.CorrelationID == corr {
				out = append(out, e)
			}
		}
		if len(out) == 0 {
			t.Fatalf("no audit event with correlation id %s (%s)", corr, purpose)
		}
		return out
	}
	type field struct {
		name      string
		got, want any
	}
	check := func(t *testing.T, what string, fs []field) {
		t.Helper()
		for _, f := range fs {
			if fmt.Sprint(f.got) != fmt.Sprint(f.want) {
				t.Errorf("%s: %s = %v, want %v", what, f.name, f.got, f.want)
			}
		}
	}
	token := func(e audit.Event) any {
		if e.FencingToken == nil {
			return "<nil>"
		}
		return *e.FencingToken
	}

	t.Run("acquire", func(t *testing.T) {
		evs := byCorr("acquire")
		if len(evs) != 1 {
			t.Fatalf("%d events for one acquire", len(evs))
		}
		e, a := evs[0], st.acquired
		check(t, "acquire", []field{
			{"event_type", e.EventType, audit.EventAcquire}, {"result_code", e.ResultCode, lease.CodeAcquired},
			{"decision", e.Decision, audit.DecisionAllow}, {"retryable", e.Retryable, false},
			{"principal_id", e.PrincipalID, "prn-client-a"}, {"principal_class", e.PrincipalClass, "api_client"},
			{"credential_id", e.CredentialID, st.k.clientA.CredentialID}, {"request_id", e.RequestID, st.acquireReqID},
			{"service_instance_id", e.ServiceInstanceID, "inst-a"}, {"execution_id", e.ExecutionID, "exec-1"},
			{"job_id", e.JobID, "job-1"}, {"trace_id", e.TraceID, "trace-1"},
			{"tenant_id", e.TenantID, "tenant-a"}, {"program_id", e.ProgramID, "program-a"},
			{"target_namespace", e.TargetNamespace, "starintel-target"}, {"target_id", e.TargetID, "life-1"},
			{"actor_name", e.ActorName, "usernamegen"}, {"workflow_name", e.WorkflowName, "default"},
			{"operation_class", e.OperationClass, "default"},
			{"lease_id", e.LeaseID, a.Lease.LeaseID}, {"fencing_token", token(e), a.Lease.FencingToken},
			{"requested_ttl_ms", e.RequestedTTLMS, 30000}, {"effective_ttl_ms", e.EffectiveTTLMS, 30000},
			{"deadline_class", e.DeadlineClass, audit.DeadlineClient}, {"resulting_state", e.ResultingState, lease.StateActive},
			{"backend_health", e.BackendHealth, lease.HealthOK}, {"priority", e.Priority, audit.PriorityNormal},
			{"reason", e.Reason, ""}, {"incident_id", e.IncidentID, ""},
		})
		if e.LatencyMS < 0 || e.Timestamp.IsZero() || e.EventID == "" {
			t.Errorf("acquire event timing/id: %+v", e)
		}
		if d := e.Timestamp.Time().Sub(a.Lease.AcquiredAt); d < -time.Minute || d > time.Minute {
			t.Errorf("event timestamp %v far from acquired_at %v", e.Timestamp, a.Lease.AcquiredAt)
		}
	})
	t.Run("denied", func(t *testing.T) {
		evs := byCorr("denied")
		if len(evs) != 1 {
			t.Fatalf("%d events for one denied request", len(evs))
		}
		e := evs[0]
		check(t, "denied", []field{
			{"event_type", e.EventType, audit.EventAcquire}, {"result_code", e.ResultCode, lease.CodeAccessDenied},
			{"decision", e.Decision, audit.DecisionDeny}, {"retryable", e.Retryable, false},
			{"principal_id", e.PrincipalID, "prn-reader"}, {"principal_class", e.PrincipalClass, "api_client"},
			{"credential_id", e.CredentialID, st.k.reader.CredentialID},
			{"tenant_id", e.TenantID, "tenant-a"}, {"program_id", e.ProgramID, "program-a"},
			{"target_namespace", e.TargetNamespace, "starintel-target"}, {"target_id", e.TargetID, "scope-4"},
			{"actor_name", e.ActorName, "usernamegen"},
			{"lease_id", e.LeaseID, ""}, {"fencing_token", token(e), "<nil>"},
			{"resulting_state", e.ResultingState, ""}, {"priority", e.Priority, audit.PriorityNormal},
		})
	})
	t.Run("auth_failure", func(t *testing.T) {
		evs := byCorr("authfail")
		if len(evs) != 1 {
			t.Fatalf("%d events for one authentication failure", len(evs))
		}
		e := evs[0]
		check(t, "auth failure", []field{
			{"event_type", e.EventType, audit.EventAuthFailed}, {"result_code", e.ResultCode, lease.CodeInvalidCredential},
			{"decision", e.Decision, audit.DecisionDeny}, {"retryable", e.Retryable, false},
			// The credential id of the presented (well-formed) key; no principal.
			{"credential_id", e.CredentialID, st.k.clientA.CredentialID},
			{"principal_id", e.PrincipalID, ""}, {"principal_class", e.PrincipalClass, ""},
			{"tenant_id", e.TenantID, ""}, {"lease_id", e.LeaseID, ""}, {"request_id", e.RequestID, ""},
			{"priority", e.Priority, audit.PriorityNormal},
		})
	})
	t.Run("revoke", func(t *testing.T) {
		if st.revoked == nil {
			t.Fatal("revoke did not run")
		}
		evs := byCorr("revoke")
		var result *audit.Event
		resultAt, attemptAt := -1, -1
		for i := range evs {
			switch evs[i].ResultCode {
			case lease.CodeRevoked:
				result, resultAt = &evs[i], i
			case lease.CodeOutcomeUnknown:
				attemptAt = i
			}
		}
		if result == nil {
			t.Fatalf("no lease_revoked event among %d events", len(evs))
		}
		// The durable attempt record comes before the result.
		if attemptAt < 0 || attemptAt > resultAt {
			t.Errorf("revoke: the high-priority attempt event must precede the result (attempt %d, result %d)", attemptAt, resultAt)
		} else if evs[attemptAt].Priority != audit.PriorityHigh || evs[attemptAt].EventType != audit.EventRevoke {
			t.Errorf("revoke attempt event %+v", evs[attemptAt])
		}
		e, rv := *result, st.revoked
		check(t, "revoke", []field{
			{"event_type", e.EventType, audit.EventRevoke}, {"result_code", e.ResultCode, lease.CodeRevoked},
			{"decision", e.Decision, audit.DecisionAllow}, {"priority", e.Priority, audit.PriorityHigh},
			{"principal_id", e.PrincipalID, "admin-1"}, {"principal_class", e.PrincipalClass, "administrator"},
			{"credential_id", e.CredentialID, st.k.admin.CredentialID}, {"request_id", e.RequestID, rv.RequestID},
			{"tenant_id", e.TenantID, "tenant-a"}, {"program_id", e.ProgramID, "program-a"},
			{"target_namespace", e.TargetNamespace, "starintel-target"}, {"target_id", e.TargetID, "admin-2"},
			{"actor_name", e.ActorName, "usernamegen"}, {"workflow_name", e.WorkflowName, "default"},
			{"operation_class", e.OperationClass, "default"},
			{"lease_id", e.LeaseID, rv.Lease.LeaseID}, {"fencing_token", token(e), rv.Lease.FencingToken},
			{"previous_state", e.PreviousState, lease.StateActive}, {"resulting_state", e.ResultingState, lease.StateRevoked},
			{"reason", e.Reason, "suspected credential compromise"}, {"incident_id", e.IncidentID, "INC-42"},
			// The lease's owner is another principal: its private fields
			// (execution, job, trace, instance) are not the admin's to see.
			{"execution_id", e.ExecutionID, ""}, {"job_id", e.JobID, ""}, {"service_instance_id", e.ServiceInstanceID, ""},
			{"backend_health", e.BackendHealth, lease.HealthOK},
		})
	})
	t.Run("closed_schema", func(t *testing.T) {
		// The raw lines hold exactly the documented fields (ReadFile would
		// have refused anything else) and one line per event.
		raw := readFileOrEmpty(t, filepath.Join(st.s.DataDir(), "audit.jsonl"))
		if n := bytes.Count(raw, []byte("\n")); n != len(events) {
			t.Fatalf("%d lines, %d events", n, len(events))
		}
		for _, e := range events {
			if !e.EventType.Known() {
				t.Fatalf("unknown event type %s", e.EventType)
			}
		}
	})
}

// everyRequestAudited: "one event per request, whatever the result" — the
// 400s of invalid_requests included.
func (st *boltState) everyRequestAudited(t *testing.T) {
	events, err := audit.ReadFile(filepath.Join(st.s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]audit.Event{}
	for _, e := range events {
		seen[e.CorrelationID] = e
	}
	var missing []string
	for _, inv := range st.invalid {
		e, ok := seen[inv[1]]
		switch {
		case !ok:
			missing = append(missing, inv[0])
		case e.ResultCode != lease.CodeInvalidRequest || e.Decision != audit.DecisionDeny || e.PrincipalID != "prn-client-a" && e.PrincipalID != "admin-1":
			t.Errorf("400 request %q audited as %s/%s by %q", inv[0], e.ResultCode, e.Decision, e.PrincipalID)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d invalid_lease_request answers wrote no audit event (one event per request, whatever the result): %q",
			len(missing), len(st.invalid), missing)
	}
}

// metrics: GET /metrics counts operations by code.
func (st *boltState) metrics(t *testing.T) {
	resp, err := http.Get(st.s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	for _, code := range []string{"lease_acquired", "lease_released", "invalid_credential", "access_denied",
		"invalid_lease_request", "lease_conflict", "lease_lost", "idempotency_conflict", "lease_revoked"} {
		re := regexp.MustCompile(`(?m)^starlease_operations_total\{[^}]*code="` + code + `"[^}]*\} ([0-9.e+]+)$`)
		m := re.FindStringSubmatch(b.String())
		if m == nil || m[1] == "0" {
			t.Errorf("/metrics has no starlease_operations_total for code %s", code)
		}
	}
	if !regexp.MustCompile(`(?m)^starlease_operations_total\{code="lease_acquired",operation="acquire"\} `).MatchString(b.String()) {
		t.Errorf("/metrics: no acquire/lease_acquired series")
	}
	for _, leak := range []string{"star_sk_", st.k.clientA.Secret, st.metaCanary} {
		if strings.Contains(b.String(), leak) {
			t.Errorf("/metrics leaks %q", leak)
		}
	}
}

// credentialStoreUnavailable: when the credential store cannot answer, the
// request is 503 lease_backend_unavailable — not 401, which would tell a
// valid caller its key is bad (auth.Authenticate documents that it returns
// an error wrapping auth.ErrUnavailable then).
func (st *boltState) credentialStoreUnavailable(t *testing.T) {
	s := st.s
	k := s.createKey("prn-unreadable", "api_client", "targets:lease", "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	path := filepath.Join(s.DataDir(), "credentials", k.CredentialID+".json")
	if err := os.Rename(path, path+".moved"); err != nil {
		t.Fatal(err)
	}
	// A directory where the record should be: reading it fails with EISDIR
	// (root ignores permission bits, so unreadable modes would not do).
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.Remove(path)
		os.Rename(path+".moved", path)
	}()
	corr := uniqueID("e2e-credstore")
	r := s.do(t, rawReq{Method: "GET", Path: apiBase + "?owner_principal_id=prn-unreadable", Key: k.APIKey,
		Header: [][2]string{{"X-Correlation-ID", corr}}})
	if r.Status != 503 || r.code() != "lease_backend_unavailable" || r.JSON["retryable"] != true {
		t.Fatalf("credential store unavailable: want 503 lease_backend_unavailable, got %d %s", r.Status, r.Body)
	}
	// A backend-failed result is audited like every other request.
	events, err := audit.ReadFile(filepath.Join(s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range events {
		if e.CorrelationID == corr {
			found = true
			if e.ResultCode != lease.CodeBackendUnavailable || e.Decision != audit.DecisionDeny || e.PrincipalID != "" {
				t.Errorf("credential store unavailable audited as %+v", e)
			}
		}
	}
	if !found {
		t.Errorf("the 503 answered when the credential store failed wrote no audit event")
	}
}

// noSecrets searches the raw bytes of everything the server wrote — audit
// file, audit and lease databases, credential records, stdout and stderr —
// for every API key, its secret part, the key prefix, the pepper and the
// metadata sent.
func (st *boltState) noSecrets(t *testing.T) {
	s := st.s
	type blob struct {
		name string
		b    []byte
		meta bool // metadata may not appear here either
	}
	blobs := []blob{
		{"audit.jsonl", readFileOrEmpty(t, filepath.Join(s.DataDir(), "audit.jsonl")), true},
		{"audit database", readFileOrEmpty(t, filepath.Join(s.DataDir(), bolt.AuditFileName)), true},
		{"server stdout", s.Stdout(), true},
		{"server stderr", s.Stderr(), true},
		// The lease store holds the metadata by design, but no key material.
		{"lease store", readFileOrEmpty(t, filepath.Join(s.DataDir(), "starlease.db")), false},
	}
	if len(blobs[0].b) == 0 || len(blobs[1].b) == 0 {
		t.Fatalf("audit sinks are empty")
	}
	creds, _ := filepath.Glob(filepath.Join(s.DataDir(), "credentials", "*"))
	for _, f := range creds {
		blobs = append(blobs, blob{"credential " + filepath.Base(f), readFileOrEmpty(t, f), true})
	}
	needles := map[string]string{"the key prefix": "star_sk_", "the pepper": s.Pepper()}
	s.mu.Lock()
	for _, k := range s.keys {
		needles["api key of "+k.Principal] = k.APIKey
		needles["secret of "+k.Principal] = k.Secret
	}
	s.mu.Unlock()
	for _, bl := range blobs {
		lower := bytes.ToLower(bl.b)
		for what, needle := range needles {
			if bytes.Contains(lower, bytes.ToLower([]byte(needle))) {
				t.Errorf("%s contains %s", bl.name, what)
			}
		}
		if bl.meta && bytes.Contains(bl.b, []byte(st.metaCanary)) {
			t.Errorf("%s contains a metadata value", bl.name)
		}
		if bytes.Contains(bl.b, []byte("Bearer ")) {
			t.Errorf("%s contains an Authorization value", bl.name)
		}
	}
	// "keys list" shows credentials, never key material.
	blobs = append(blobs, blob{"keys list output", s.RunCLI("keys", "list", "--data-dir", s.DataDir()), true})
	for _, bl := range blobs[len(blobs)-1:] {
		for what, needle := range needles {
			if bytes.Contains(bytes.ToLower(bl.b), bytes.ToLower([]byte(needle))) {
				t.Errorf("%s contains %s", bl.name, what)
			}
		}
	}
	if bytes.Contains(s.Stderr(), []byte("audit write failed")) {
		t.Errorf("the server failed to write audit events:\n%s", s.Stderr())
	}
}

// testRateLimits: a server with one acquire per second per principal and
// per target answers 429 lease_rate_limited with retry_after_ms.
func testRateLimits(t *testing.T, bin string, rows *rowRecorder) {
	s := startServer(t, bin, rows, "--principal-rate", "1", "--target-rate", "1")
	scope := "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*"
	k1 := s.createKey("prn-rl-1", "api_client", "targets:lease", scope)
	ctx := context.Background()
	// Principal bucket: burst 2, then 429.
	c1 := s.client(k1)
	var limited *client.Error
	for i := 0; i < 6 && limited == nil; i++ {
		res, err := c1.Acquire(ctx, client.AcquireRequest{LockIdentity: identity(fmt.Sprintf("rl-%d", i), "usernamegen"),
			TTLMs: 30000, ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
		if err != nil {
			limited = wantErr(t, s, err, 429, lease.CodeRateLimited)
			break
		}
		okLease(t, s, res, err, lease.CodeAcquired)
	}
	if limited == nil {
		t.Fatal("six acquires at --principal-rate 1 were never rate limited")
	}
	if !limited.Retryable || limited.RetryAfter <= 0 || limited.RetryAfter > 2*time.Second {
		t.Fatalf("429: %#v", limited)
	}
	var raw rawResp
	for i := 0; i < 3; i++ { // a token may have refilled meanwhile on a slow machine
		raw = s.do(t, rawReq{Method: "POST", Path: apiBase + "/acquire", Key: k1.APIKey,
			Body: acquireBody(identity(fmt.Sprintf("rl-raw-%d", i), "usernamegen"), uniqueID("r"))})
		if raw.Status != 200 {
			break
		}
	}
	if raw.Status != 429 || raw.code() != "lease_rate_limited" || raw.Header.Get("Retry-After") == "" {
		t.Fatalf("raw 429: %d %v %s", raw.Status, raw.Header, raw.Body)
	}
	// Target bucket (burst 2): one request each from principals with fresh
	// buckets on one hot target; the third is limited by the target alone.
	target := identity("rl-hot", "usernamegen")
	var hot []*client.Client
	for i := 0; i < 4; i++ {
		hot = append(hot, s.client(s.createKey(fmt.Sprintf("prn-rl-hot-%d", i), "api_client", "targets:lease", scope)))
	}
	var targetLimited bool
	for _, c := range hot {
		if targetLimited {
			break
		}
		_, err := c.Acquire(ctx, client.AcquireRequest{LockIdentity: target, TTLMs: 30000, ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
		targetLimited = lease.CodeOf(err) == lease.CodeRateLimited
		if err != nil && !targetLimited && lease.CodeOf(err) != lease.CodeConflict {
			t.Fatalf("hot target: %v", err)
		}
	}
	if !targetLimited {
		t.Fatal("acquires of one target at --target-rate 1 were never rate limited")
	}
	// The limit is progressive, not a lockout: after the hint, it works.
	time.Sleep(limited.RetryAfter + 100*time.Millisecond)
	res, err := c1.Acquire(ctx, client.AcquireRequest{LockIdentity: identity("rl-after", "usernamegen"), TTLMs: 30000,
		ServiceInstanceID: "i", ExecutionID: "e", JobID: "j"})
	okLease(t, s, res, err, lease.CodeAcquired)
	// Rate-limited requests are audited.
	events, err := audit.ReadFile(filepath.Join(s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, e := range events {
		if e.ResultCode == lease.CodeRateLimited && e.Decision == audit.DecisionDeny && e.Retryable {
			n++
		}
	}
	if n < 2 {
		t.Fatalf("%d lease_rate_limited audit events", n)
	}
}

// testValkeyFaults: a server on the valkey backend (redis-server, which
// speaks its protocol) behind a fault-injecting proxy. A renew whose reply
// never comes back is 503 lease_outcome_unknown, resolved by retrying with
// the same request id; an unreachable backend is 503
// lease_backend_unavailable and GET /readyz 503.
func testValkeyFaults(t *testing.T, bin string, rows *rowRecorder) {
	redis := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, redis.Addr())
	s := startServer(t, bin, rows, "--backend", "valkey", "--valkey-addr", proxy.Addr(), "--valkey-key-prefix", "e2e")
	k := s.createKey("prn-vk", "api_client", "targets:lease", "tenant:tenant-a,program:program-a,target-namespace:*,target:*,actor:*")
	c := s.client(k)
	ctx := context.Background()
	id := identity("vk-1", "usernamegen")
	res, err := c.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "inst-v", ExecutionID: "e", JobID: "j"})
	l := okLease(t, s, res, err, lease.CodeAcquired).Lease

	// Replies are delayed 3 s. The credential read (the credentials live
	// in Valkey too) waits them out; the renew reaches the backend but its
	// answer comes after the request's deadline: outcome unknown. The
	// server's deadline (deadline_at, 5 s) is well before the client's.
	proxy.AddToxic("blackhole", "latency", testenv.Downstream, map[string]any{"latency": 3000})
	rr := client.RenewRequest{LeaseID: l.LeaseID, LockIdentity: id, FencingToken: l.FencingToken, ServiceInstanceID: "inst-v",
		TTLMs: 60000, RequestID: uniqueID("vk-renew"), DeadlineAt: time.Now().Add(5 * time.Second)}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = c.Renew(rctx, rr)
	cancel()
	if ce := wantErr(t, s, err, 503, lease.CodeOutcomeUnknown); !ce.Retryable || ce.RequestID != rr.RequestID {
		t.Fatalf("outcome unknown: %#v", ce)
	}
	proxy.RemoveToxic("blackhole")
	// Resolved by request id (with a fresh deadline, which is no part of
	// the request's identity): the renew had committed.
	rr.DeadlineAt = time.Time{}
	var resolved *client.LeaseResult
	for deadline := time.Now().Add(10 * time.Second); ; {
		res, err = c.Renew(ctx, rr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Either the renew had committed (the retry replays it) or it had not
	// (the retry performs it, once); from then on every retry with the
	// request id answers the one stored result.
	resolved = okLease(t, s, res, err, lease.CodeRenewed)
	if resolved.Lease.TTLMs != 60000 || resolved.Lease.FencingToken != l.FencingToken || resolved.Lease.LeaseID != l.LeaseID {
		t.Fatalf("resolved renew %+v", resolved)
	}
	t.Logf("the renew whose answer was lost had committed: %v", resolved.Replayed)
	res, err = c.Renew(ctx, rr)
	if again := okLease(t, s, res, err, lease.CodeRenewed); !again.Replayed || again.Lease != resolved.Lease {
		t.Fatalf("second retry %+v, want the stored result %+v replayed", again, resolved.Lease)
	}

	// The backend is unreachable: reads and mutations are unavailable, the
	// server is not ready.
	proxy.Cut()
	r := s.do(t, rawReq{Method: "POST", Path: apiBase + "/inspect", Key: k.APIKey, Body: map[string]any{"lock_identity": id}})
	if r.Status != 503 || r.code() != "lease_backend_unavailable" || r.JSON["retryable"] != true {
		t.Fatalf("inspect with the backend down: %d %s", r.Status, r.Body)
	}
	// A mutation fails closed with a retryable 503: unavailable, or — when
	// the client library hands it a connection that broke under it —
	// outcome-unknown (it cannot tell whether the command was written).
	_, err = c.Acquire(ctx, client.AcquireRequest{LockIdentity: identity("vk-2", "usernamegen"), TTLMs: 30000,
		ServiceInstanceID: "inst-v", ExecutionID: "e", JobID: "j"})
	if code := lease.CodeOf(err); code != lease.CodeBackendUnavailable && code != lease.CodeOutcomeUnknown {
		t.Fatalf("acquire with the backend down: %v", err)
	}
	wantErr(t, s, err, 503, lease.CodeOf(err))
	resp, err := http.Get(s.URL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("GET /readyz with the backend down: %d", resp.StatusCode)
	}
	proxy.Restore()
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(s.URL() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("GET /readyz not 200 again after the backend came back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The failures were audited with their backend health.
	events, err := audit.ReadFile(filepath.Join(s.DataDir(), "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[lease.Code]bool{}
	for _, e := range events {
		if e.BackendHealth == lease.HealthUnavailable {
			got[e.ResultCode] = true
		}
	}
	if !got[lease.CodeOutcomeUnknown] || !got[lease.CodeBackendUnavailable] {
		t.Fatalf("audit events with backend_health unavailable: %v", got)
	}
}
