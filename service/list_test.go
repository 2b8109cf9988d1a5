package service

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
)

// countingStore counts List calls.
type countingStore struct {
	lease.Store
	lists atomic.Int64
}

func (c *countingStore) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	c.lists.Add(1)
	return c.Store.List(ctx, req)
}

// listService is a service over a bolt store with store pages of two
// leases, so a few leases span several store pages.
func listService(t *testing.T, cfg Config, key []byte) (*Service, *countingStore) {
	t.Helper()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1,
		StoreOptions: lease.StoreOptions{MaxPageSize: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	store := &countingStore{Store: st}
	s, err := New(store, &audittest.Recorder{}, Options{Config: cfg, PageTokenKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return s, store
}

// acquireActors acquires, as p, one lease per actor in program-a, in
// order, and returns their lease ids.
func acquireActors(t *testing.T, s *Service, p auth.Principal, actors ...string) []string {
	t.Helper()
	var ids []string
	for i, a := range actors {
		id := target
		id.ActorName, id.TargetID = a, fmt.Sprintf("t-%d.example.com", i)
		res, err := s.Acquire(context.Background(), call(p), acquireInput(id))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Lease.LeaseID)
	}
	return ids
}

func leaseIDs(rs []*lease.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.LeaseID)
	}
	return out
}

// A list request reads at most MaxListReads store pages. A page the cap
// cuts ends short, with a token that resumes where the reading stopped;
// paging on still yields exactly the visible leases, in order, once each,
// and never a token that shows a lease id.
func TestListReadCap(t *testing.T) {
	ctx := context.Background()
	s, store := listService(t, Config{MaxListReads: 2}, nil)
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	reader := principal(t, "prn-reader2", auth.ClassActorComponent, "tenant:*,program:*,actor:crawler", auth.CapRead)
	ids := acquireActors(t, s, holder, "other", "other", "other", "other", "other", "crawler", "other", "crawler", "other")
	// Lists page in lease-id order; ids made in the same millisecond
	// need not sort as they were made.
	want := []string{ids[5], ids[7]}
	slices.Sort(want)
	req := lease.ListRequest{By: lease.ListByProgram, TenantID: target.TenantID, ProgramID: target.ProgramID, PageSize: 10}
	var got []string
	short := 0
	for pages := 0; ; pages++ {
		before := store.lists.Load()
		page, err := s.List(ctx, call(reader), req)
		if err != nil {
			t.Fatal(err)
		}
		if n := store.lists.Load() - before; n > 2 {
			t.Fatalf("one list request read %d store pages, cap 2", n)
		}
		for _, id := range ids {
			if strings.Contains(page.NextPageToken, id) {
				t.Fatalf("token %q shows %s", page.NextPageToken, id)
			}
		}
		got = append(got, leaseIDs(page.Leases)...)
		if page.NextPageToken == "" {
			break
		}
		if len(page.Leases) < req.PageSize {
			short++
		}
		if pages > len(ids) {
			t.Fatal("more pages than leases")
		}
		req.PageToken = page.NextPageToken
	}
	if !slices.Equal(got, want) || short == 0 {
		t.Fatalf("listed %v with %d short pages, want %v and at least one page cut by the cap", got, short, want)
	}
}

// A caller that may see only its own leases walks its own index: other
// owners' leases in the program cost it no reads, so they cannot cut its
// page short (with a one-read cap, the program index would).
func TestListOwnLeasesWalkOwnIndex(t *testing.T) {
	ctx := context.Background()
	s, _ := listService(t, Config{MaxListReads: 1}, nil)
	other := principal(t, "prn-other1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	own := principal(t, "prn-own2", auth.ClassAPIClient, "tenant:tenant-main,program:program-a", auth.CapLease)
	acquireActors(t, s, other, "a0", "a1", "a2", "a3", "a4", "a5")
	// A listing is in lease-id order, and two leases acquired in one
	// millisecond can sort either way.
	mine := slices.Sorted(slices.Values(acquireActors(t, s, own, "b0", "b1")))
	for _, req := range []lease.ListRequest{
		{By: lease.ListByProgram, TenantID: target.TenantID, ProgramID: target.ProgramID, PageSize: 5},
		{By: lease.ListByOwner, OwnerPrincipalID: own.ID, PageSize: 5},
	} {
		page, err := s.List(ctx, call(own), req)
		if err != nil || !slices.Equal(leaseIDs(page.Leases), mine) || page.NextPageToken != "" {
			t.Fatalf("%s: %v next %q, %v; want %v and no token", req.By, leaseIDs(page.Leases), page.NextPageToken, err, mine)
		}
	}
	// One own lease in another program: the by-program listing skips it.
	id := target
	id.ProgramID, id.ActorName = "program-b", "b9"
	own.Scope, _ = auth.ParseScope("tenant:tenant-main,program:*")
	if _, err := s.Acquire(ctx, call(own), acquireInput(id)); err != nil {
		t.Fatal(err)
	}
	page, err := s.List(ctx, call(own), lease.ListRequest{By: lease.ListByProgram, TenantID: target.TenantID, ProgramID: target.ProgramID, PageSize: 1})
	if err != nil || !slices.Equal(leaseIDs(page.Leases), mine[:1]) || page.NextPageToken == "" {
		t.Fatalf("first page of 1: %v next %q, %v", leaseIDs(page.Leases), page.NextPageToken, err)
	}
	page, err = s.List(ctx, call(own), lease.ListRequest{By: lease.ListByProgram, TenantID: target.TenantID, ProgramID: target.ProgramID,
		PageSize: 1, PageToken: page.NextPageToken})
	if err != nil || !slices.Equal(leaseIDs(page.Leases), mine[1:]) || page.NextPageToken != "" {
		t.Fatalf("second page of 1: %v next %q, %v; want %v and no token", leaseIDs(page.Leases), page.NextPageToken, err, mine[1:])
	}
}

// Servers configured with the same page token key continue each other's
// list and history pages; a server with another key (or a random one)
// refuses them as 400 on page_token.
func TestPageTokenKeyShared(t *testing.T) {
	ctx := context.Background()
	key := []byte(strings.Repeat("k", 32))
	s1, store := listService(t, Config{}, key)
	s2, err := New(store, &audittest.Recorder{}, Options{PageTokenKey: key})
	if err != nil {
		t.Fatal(err)
	}
	s3, err := New(store, &audittest.Recorder{}, Options{PageTokenKey: []byte(strings.Repeat("x", 32))})
	if err != nil {
		t.Fatal(err)
	}
	s4, err := New(store, &audittest.Recorder{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(store, &audittest.Recorder{}, Options{PageTokenKey: []byte("short")}); err == nil {
		t.Fatal("a 5-byte page token key was accepted")
	}
	p := principal(t, "prn-admin1", auth.ClassAdministrator, "tenant:*,program:*", auth.CapLease, auth.CapRead, auth.CapAuditRead)
	acquireActors(t, s1, p, "a0", "a1", "a2")
	// The list's own order (by index key), read in one page.
	all, err := s1.List(ctx, call(p), lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: p.ID, PageSize: 3})
	if err != nil || len(all.Leases) != 3 {
		t.Fatalf("one page of 3: %v, %v", all.Leases, err)
	}
	ids := leaseIDs(all.Leases)
	req := lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: p.ID, PageSize: 1}
	first, err := s1.List(ctx, call(p), req)
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v", err)
	}
	req.PageToken = first.NextPageToken
	if page, err := s2.List(ctx, call(p), req); err != nil || !slices.Equal(leaseIDs(page.Leases), ids[1:2]) {
		t.Fatalf("same key, other server: %v %v", leaseIDs(page.Leases), err)
	}
	for name, s := range map[string]*Service{"another key": s3, "a random key": s4} {
		if _, err := s.List(ctx, call(p), req); code(err) != lease.CodeInvalidRequest || lease.AsError(err).Field != "page_token" {
			t.Fatalf("%s: %v, want invalid_lease_request on page_token", name, err)
		}
	}

	// History: three ended leases of one identity.
	for range 3 {
		res, err := s1.Acquire(ctx, call(p), acquireInput(target))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s1.Release(ctx, call(p), HeldInput{Identity: target, LeaseID: res.Lease.LeaseID,
			FencingToken: res.Lease.FencingToken, ServiceInstanceID: "inst-1"}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Lease.LeaseID)
	}
	h, err := s1.History(ctx, call(p), ids[3], 1, "")
	if err != nil || h.NextPageToken == "" {
		t.Fatalf("history: %v", err)
	}
	if next, err := s2.History(ctx, call(p), ids[3], 1, h.NextPageToken); err != nil || len(next.Entries) != 1 ||
		next.Entries[0].Record.LeaseID != ids[4] {
		t.Fatalf("history, same key, other server: %+v %v", next.Entries, err)
	}
	if _, err := s3.History(ctx, call(p), ids[3], 1, h.NextPageToken); code(err) != lease.CodeInvalidRequest {
		t.Fatalf("history, another key: %v", err)
	}
}
