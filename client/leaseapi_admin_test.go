package client

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/httpapi"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
)

// startOperatorServer is the real HTTP API with an owner key ("prn-a",
// targets:lease) and an administrator key ("admin": lease, read,
// force-release, audit:read): the stores they make.
func startOperatorServer(t *testing.T) (owner, admin *LeaseStore) {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rec := &audittest.Recorder{}
	svc, err := service.New(store, rec, service.Options{Logger: slog.New(slog.DiscardHandler),
		Config: service.Config{PrincipalRate: 1e6, PrincipalBurst: 1e6, TargetRate: 1e6, TargetBurst: 1e6}})
	if err != nil {
		t.Fatal(err)
	}
	creds := auth.NewMemoryStore()
	pepper, err := auth.NewPepper(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		t.Fatal(err)
	}
	scope, err := auth.ParseScope("tenant:*,program:*")
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.NewAuthenticator(creds, pepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(svc, authn, rec, httpapi.Options{Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	issue := func(principal string, class auth.Class, caps ...auth.Capability) *LeaseStore {
		key, _, err := auth.Issue(t.Context(), creds, pepper, auth.IssueRequest{PrincipalID: principal, Class: class,
			Capabilities: caps, Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(srv.URL, key)
		if err != nil {
			t.Fatal(err)
		}
		return c.LeaseStore(principal)
	}
	owner = issue("prn-a", auth.ClassAPIClient, auth.CapLease)
	admin = issue("admin", auth.ClassAdministrator, auth.CapLease, auth.CapRead, auth.CapForceRelease, auth.CapAuditRead)
	return owner, admin
}

func operatorAcquire(t *testing.T, s *LeaseStore, target, requestID string) *lease.Record {
	t.Helper()
	req := acquireReq(time.Now().Add(5 * time.Second))
	req.Identity.TargetID, req.RequestID = target, requestID
	res, err := s.Acquire(t.Context(), req)
	if err != nil {
		t.Fatalf("acquire %s: %v", target, err)
	}
	return res.Lease
}

// ForceRelease, Revoke, List and History over the real HTTP API: typed
// codes, terminal states, paging with the server's tokens, and history by
// identity (needs an active lease) or by any lease id of the identity.
func TestLeaseStoreAdminListHistory(t *testing.T) {
	owner, admin := startOperatorServer(t)
	ctx := t.Context()
	dl := func() time.Time { return time.Now().Add(5 * time.Second) }
	a := operatorAcquire(t, owner, "target-1", "req-a")
	b := operatorAcquire(t, owner, "target-2", "req-b")

	byProgram := lease.ListRequest{By: lease.ListByProgram, TenantID: "tenant-a", ProgramID: "program-a", DeadlineAt: dl()}
	l, err := admin.List(ctx, byProgram)
	if err != nil || len(l.Leases) != 2 || l.NextPageToken != "" {
		t.Fatalf("list by program: %+v, %v", l, err)
	}
	ids := map[string]*lease.Record{}
	for _, r := range l.Leases {
		ids[r.LeaseID] = r
	}
	for _, want := range []*lease.Record{a, b} {
		got := ids[want.LeaseID]
		if got == nil || got.FencingToken != want.FencingToken || got.LockKey != want.LockKey ||
			got.ExpiresAt != want.ExpiresAt || got.State != lease.StateActive || got.OwnerPrincipalID != "" {
			t.Fatalf("listed %+v, want %+v (no owner: the admin's adapter does not know it)", got, want)
		}
	}
	l, err = admin.List(ctx, lease.ListRequest{By: lease.ListByTarget, TenantID: "tenant-a", ProgramID: "program-a",
		TargetNamespace: "ns", TargetID: "target-2", DeadlineAt: dl()})
	if err != nil || len(l.Leases) != 1 || l.Leases[0].LeaseID != b.LeaseID {
		t.Fatalf("list by target: %+v, %v", l, err)
	}
	page := lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-a", PageSize: 1, DeadlineAt: dl()}
	p1, err := admin.List(ctx, page)
	if err != nil || len(p1.Leases) != 1 || p1.NextPageToken == "" {
		t.Fatalf("list by owner, page 1: %+v, %v", p1, err)
	}
	page.PageToken = p1.NextPageToken
	p2, err := admin.List(ctx, page)
	if err != nil || len(p2.Leases) != 1 || p2.Leases[0].LeaseID == p1.Leases[0].LeaseID {
		t.Fatalf("list by owner, page 2: %+v, %v", p2, err)
	}

	force := lease.AdminRequest{Identity: storeIdent, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
		Reason: "stuck worker", Mutation: lease.Mutation{RequestID: "req-force", DeadlineAt: dl()}}
	force.Identity.TargetID = "target-1"
	fr, err := admin.ForceRelease(ctx, force)
	if err != nil || fr.Code != lease.CodeForceReleased || fr.Replayed || fr.Lease.LeaseID != a.LeaseID ||
		fr.Lease.State != lease.StateReleased || fr.Lease.FencingToken != a.FencingToken {
		t.Fatalf("force-release: %+v, %v", fr, err)
	}
	if again, err := admin.ForceRelease(ctx, force); err != nil || !again.Replayed || again.Code != lease.CodeForceReleased {
		t.Fatalf("force-release replay: %+v, %v", again, err)
	}
	rv, err := admin.Revoke(ctx, lease.AdminRequest{Identity: lease.Identity{TenantID: "tenant-a", ProgramID: "program-a",
		TargetNamespace: "ns", TargetID: "target-2", ActorName: "usernamegen"}, LeaseID: b.LeaseID, FencingToken: b.FencingToken,
		IncidentID: "inc-7", Mutation: lease.Mutation{RequestID: "req-revoke", DeadlineAt: dl()}})
	if err != nil || rv.Code != lease.CodeRevoked || rv.Lease.State != lease.StateRevoked {
		t.Fatalf("revoke: %+v, %v", rv, err)
	}
	// The holder's lease is gone: its renewal is lost.
	if _, err := owner.Renew(ctx, lease.RenewRequest{Identity: storeIdent, LeaseID: b.LeaseID, FencingToken: b.FencingToken,
		ServiceInstanceID: "inst-1", Mutation: lease.Mutation{RequestID: "req-renew", DeadlineAt: dl()}}); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("renew after revoke: %v", err)
	}

	id1 := storeIdent
	id1.TargetID = "target-1"
	hreq := lease.HistoryRequest{Identity: id1, DeadlineAt: dl()}
	if _, err := admin.History(ctx, hreq); lease.CodeOf(err) != lease.CodeNotFound ||
		!strings.Contains(lease.AsError(err).Reason, "reads history by lease id") {
		t.Fatalf("history of an identity without an active lease: %v", err)
	}
	h, err := admin.HistoryByLeaseID(ctx, a.LeaseID, lease.HistoryRequest{DeadlineAt: dl()})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != a.LeaseID || h.Entries[0].Reason != "stuck worker" ||
		h.Entries[0].Record.State != lease.StateReleased || h.Entries[0].EndedAt.IsZero() || h.Entries[0].HistoryVersion != lease.HistoryVersion {
		t.Fatalf("history by lease id: %+v, %v", h, err)
	}
	c := operatorAcquire(t, owner, "target-1", "req-c")
	if c.FencingToken != a.FencingToken+1 {
		t.Fatalf("re-acquire token %d", c.FencingToken)
	}
	h, err = admin.History(ctx, hreq)
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != a.LeaseID {
		t.Fatalf("history by identity with an active lease: %+v, %v", h, err)
	}
}

// Filters of another kind are refused before anything is sent.
func TestLeaseStoreListRefusesMixedFilters(t *testing.T) {
	s := newStub(t)
	st := s.store(t, "")
	dl := time.Now().Add(time.Second)
	for name, req := range map[string]lease.ListRequest{
		"owner with target":   {By: lease.ListByOwner, OwnerPrincipalID: "o", TenantID: "t", DeadlineAt: dl},
		"owner empty":         {By: lease.ListByOwner, DeadlineAt: dl},
		"program with target": {By: lease.ListByProgram, TenantID: "t", ProgramID: "p", TargetID: "x", DeadlineAt: dl},
		"target without one":  {By: lease.ListByTarget, TenantID: "t", ProgramID: "p", DeadlineAt: dl},
		"target with owner":   {By: lease.ListByTarget, OwnerPrincipalID: "o", TenantID: "t", ProgramID: "p", TargetNamespace: "n", TargetID: "x", DeadlineAt: dl},
		"no filter":           {TenantID: "t", ProgramID: "p", DeadlineAt: dl},
	} {
		if _, err := st.List(t.Context(), req); lease.CodeOf(err) != lease.CodeInvalidRequest {
			t.Errorf("%s: %v, want invalid_lease_request", name, err)
		}
	}
	if _, err := st.History(t.Context(), lease.HistoryRequest{DeadlineAt: dl}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Errorf("history without an identity: %v", err)
	}
	if _, err := st.ForceRelease(t.Context(), lease.AdminRequest{LeaseID: "l", FencingToken: 1, Reason: "r"}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Errorf("force-release without a request id: %v", err)
	}
	if n := s.count(); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}
