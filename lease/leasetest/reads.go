package leasetest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// acquireIn acquires a fresh target of e's tenant and program for c.
func (e *env) acquireIn(c lease.Caller) *lease.Record {
	e.t.Helper()
	return e.mustAcquire(e.acquireReqFor(e.otherTarget(), c))
}

// wantListed asserts a full listing is exactly want, in lease id order, with
// the records as inspected.
func (e *env) wantListed(r lease.ListRequest, want ...*lease.Record) {
	e.t.Helper()
	got := e.list(r)
	ids := leaseIDs(want)
	slices.Sort(ids)
	wantStrings(e.t, "listed lease ids", leaseIDs(got), ids)
	for _, rec := range got {
		sameRecord(e.t, "listed record", rec, e.byID(rec.LeaseID))
	}
}

func byProgram(id lease.Identity) lease.ListRequest {
	return lease.ListRequest{By: lease.ListByProgram, TenantID: id.TenantID, ProgramID: id.ProgramID}
}

// opaqueToken asserts a page token shows no filter value or backend key.
func opaqueToken(t *testing.T, tok string, secrets ...string) {
	t.Helper()
	for _, s := range append(secrets, lease.KeyPrefix, "starintel") {
		if strings.Contains(tok, s) {
			t.Fatalf("page token %q exposes %q", tok, s)
		}
	}
}

// pages reads pages of size n and returns each page's lease ids.
func (e *env) pages(r lease.ListRequest, n int) (pages [][]string, tokens []string) {
	e.t.Helper()
	r.PageSize = n
	for i := 0; i < 100; i++ {
		r.DeadlineAt = deadline()
		res, err := e.st.List(bg, r)
		if err != nil {
			e.t.Fatalf("list page %d: %v", i, err)
		}
		if len(res.Leases) > n {
			e.t.Fatalf("page of %d leases exceeds page size %d", len(res.Leases), n)
		}
		pages = append(pages, leaseIDs(res.Leases))
		if res.NextPageToken == "" {
			return pages, tokens
		}
		tokens = append(tokens, res.NextPageToken)
		r.PageToken = res.NextPageToken
	}
	e.t.Fatalf("list does not terminate")
	return nil, nil
}

// inspect_and_list: inspect and bounded list filters cannot cross
// authorization scope or expose backend key patterns.
func (s *suite) inspectAndList(t *testing.T) {
	s.leaf(t, "inspect_by_identity_returns_active_record", func(e *env) {
		rec := e.grab()
		sameRecord(e.t, "inspected", e.active(e.id), rec)
		renewed := e.mustRenew(e.renewReq(rec))
		sameRecord(e.t, "inspected after renewal", e.active(e.id), renewed)
	})
	s.leaf(t, "inspect_by_lease_id_finds_active_and_terminal", func(e *env) {
		rec := e.grab()
		sameRecord(e.t, "active by id", e.byID(rec.LeaseID), rec)
		released := e.mustRelease(e.releaseReq(rec))
		sameRecord(e.t, "released by id", e.byID(rec.LeaseID), released)
		next := e.grab()
		revoked := e.mustAdmin(lease.OpRevoke, e.adminReq(next))
		sameRecord(e.t, "revoked by id", e.byID(next.LeaseID), revoked)
		sameRecord(e.t, "older lease by id", e.byID(rec.LeaseID), released)
	})
	s.leaf(t, "inspect_unknown_is_not_found", func(e *env) {
		_, err := e.inspect(e.id)
		mustCode(e.t, err, lease.CodeNotFound)
		_, err = e.inspectID(lease.NewLeaseID(lease.At(deadline())))
		mustCode(e.t, err, lease.CodeNotFound)
	})
	s.leaf(t, "list_by_owner_only_live_leases_of_that_owner", func(e *env) {
		live := []*lease.Record{e.acquireIn(e.owner), e.acquireIn(e.owner), e.acquireIn(e.owner)}
		e.mustRelease(e.releaseReq(e.acquireIn(e.owner)))
		r := e.acquireReqFor(e.otherTarget(), e.owner)
		r.TTL = Short
		expired := e.mustAcquire(r)
		q := newCaller("actor")
		theirs := e.acquireIn(q)
		e.waitExpired(expired)
		e.wantListed(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID}, live...)
		e.wantListed(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: q.PrincipalID}, theirs)
	})
	s.leaf(t, "list_by_target_scoped_to_target", func(e *env) {
		var in []*lease.Record
		for _, f := range []func(*lease.Identity){
			func(*lease.Identity) {},
			func(id *lease.Identity) { id.ActorName = "subdomainenum" },
			func(id *lease.Identity) { id.OperationClass = "scrape" },
		} {
			id := e.id
			f(&id)
			in = append(in, e.mustAcquire(e.acquireReqFor(id, newCaller("actor"))))
		}
		for _, f := range []func(*lease.Identity){
			func(id *lease.Identity) { id.TargetID = uid("target_") },
			func(id *lease.Identity) { id.TargetNamespace = "starintel-other" },
			func(id *lease.Identity) { id.TenantID = uid("tenant-") },
			func(id *lease.Identity) { id.ProgramID = uid("program-") },
		} {
			id := e.id
			f(&id)
			e.mustAcquire(e.acquireReqFor(id, newCaller("actor")))
		}
		e.wantListed(lease.ListRequest{By: lease.ListByTarget, TenantID: e.id.TenantID, ProgramID: e.id.ProgramID,
			TargetNamespace: e.id.TargetNamespace, TargetID: e.id.TargetID}, in...)
	})
	s.leaf(t, "list_by_program_scoped_to_tenant_and_program", func(e *env) {
		in := []*lease.Record{e.acquireIn(e.owner), e.acquireIn(newCaller("actor"))}
		e.mustRelease(e.releaseReq(e.acquireIn(e.owner)))
		otherProgram, otherTenant := e.otherTarget(), e.otherTarget()
		otherProgram.ProgramID = uid("program-")
		otherTenant.TenantID = uid("tenant-")
		e.mustAcquire(e.acquireReqFor(otherProgram, e.owner))
		e.mustAcquire(e.acquireReqFor(otherTenant, e.owner))
		e.wantListed(byProgram(e.id), in...)
	})
	s.leaf(t, "list_pages_are_stable_and_bounded", func(e *env) {
		var all []*lease.Record
		for i := 0; i < 7; i++ {
			all = append(all, e.acquireIn(e.owner))
		}
		want := leaseIDs(all)
		slices.Sort(want)
		pages, tokens := e.pages(byProgram(e.id), 3)
		if len(pages) != 3 || len(pages[0]) != 3 || len(pages[1]) != 3 || len(pages[2]) != 1 {
			e.t.Fatalf("pages %q, want sizes 3, 3, 1", pages)
		}
		wantStrings(e.t, "concatenated pages", slices.Concat(pages...), want)
		for _, tok := range tokens {
			opaqueToken(e.t, tok, e.id.TenantID, e.id.ProgramID, all[0].LeaseID)
		}
		// Re-reading a page with its token gives the same page.
		r := byProgram(e.id)
		r.PageSize, r.PageToken, r.DeadlineAt = 3, tokens[0], deadline()
		res, err := e.st.List(bg, r)
		if err != nil {
			e.t.Fatalf("re-read page 2: %v", err)
		}
		wantStrings(e.t, "page 2 re-read", leaseIDs(res.Leases), pages[1])
	})
	s.leaf(t, "list_page_size_zero_means_server_maximum", func(e *env) {
		all := []*lease.Record{e.acquireIn(e.owner), e.acquireIn(e.owner), e.acquireIn(e.owner)}
		for _, n := range []int{0, StoreOptions().MaxPageSize} {
			r := byProgram(e.id)
			r.PageSize, r.DeadlineAt = n, deadline()
			res, err := e.st.List(bg, r)
			if err != nil || res.NextPageToken != "" || len(res.Leases) != len(all) {
				e.t.Fatalf("page size %d: %d leases, next %q, %v; want all %d in one page", n, len(res.Leases), res.NextPageToken, err, len(all))
			}
		}
	})
	s.leaf(t, "list_page_token_bound_to_filter", func(e *env) {
		e.acquireIn(e.owner)
		e.acquireIn(e.owner)
		_, tokens := e.pages(byProgram(e.id), 1)
		if len(tokens) == 0 {
			e.t.Fatalf("no page token for 2 leases at page size 1")
		}
		otherProgram := byProgram(e.id)
		otherProgram.ProgramID = uid("program-")
		for _, r := range []lease.ListRequest{
			{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID},
			otherProgram,
			{By: lease.ListByTarget, TenantID: e.id.TenantID, ProgramID: e.id.ProgramID,
				TargetNamespace: e.id.TargetNamespace, TargetID: e.id.TargetID},
		} {
			r.PageToken, r.DeadlineAt = tokens[0], deadline()
			_, err := e.st.List(bg, r)
			mustInvalid(e.t, err, "page_token")
		}
	})
	s.leaf(t, "list_rejects_patterns", func(e *env) {
		e.grab()
		for _, c := range []struct {
			r     lease.ListRequest
			field string
		}{
			{lease.ListRequest{By: lease.ListByProgram, TenantID: "tenant-*", ProgramID: e.id.ProgramID}, "tenant_id"},
			{lease.ListRequest{By: lease.ListByProgram, TenantID: e.id.TenantID, ProgramID: "program-?"}, "program_id"},
			{lease.ListRequest{By: lease.ListByTarget, TenantID: e.id.TenantID, ProgramID: e.id.ProgramID,
				TargetNamespace: e.id.TargetNamespace, TargetID: "[a-z]*"}, "target_id"},
			{lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn_*"}, "owner_principal_id"},
			{lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: lease.KeyPrefix + "*"}, "owner_principal_id"},
		} {
			c.r.DeadlineAt = deadline()
			_, err := e.st.List(bg, c.r)
			mustInvalid(e.t, err, c.field)
		}
	})
}

// cycle acquires and releases e.id n times and returns the released
// records, oldest first.
func (e *env) cycle(n int) []*lease.Record {
	e.t.Helper()
	var out []*lease.Record
	for i := 0; i < n; i++ {
		out = append(out, e.mustRelease(e.releaseReq(e.grab())))
	}
	return out
}

// history: terminal evidence of an identity, newest first, bounded.
func (s *suite) historyGroup(t *testing.T) {
	s.leaf(t, "newest_first_with_terminal_states", func(e *env) {
		r1 := e.mustRelease(e.releaseReq(e.grab()))
		r2 := e.mustAdmin(lease.OpForceRelease, e.adminReq(e.grab()))
		r3 := e.mustAdmin(lease.OpRevoke, e.adminReq(e.grab()))
		r4 := e.grabShort()
		e.waitExpired(r4)
		r5 := e.mustRelease(e.releaseReq(e.grab()))
		wantStrings(e.t, "history", e.historyStates(e.id), []string{r5.LeaseID + ":released", r4.LeaseID + ":expired",
			r3.LeaseID + ":revoked", r2.LeaseID + ":released", r1.LeaseID + ":released"})
		for _, h := range e.history(e.id) {
			if h.EndedAt.IsZero() || h.EndedAt.Before(h.Record.AcquiredAt) {
				e.t.Fatalf("ended_at %v of a lease acquired at %v", h.EndedAt, h.Record.AcquiredAt)
			}
			sameRecord(e.t, "history record", h.Record, e.byID(h.Record.LeaseID))
		}
	})
	s.leaf(t, "admin_reason_and_incident_recorded", func(e *env) {
		fr := e.adminReq(e.grab())
		fr.Reason = "stuck worker drained by operator"
		e.mustAdmin(lease.OpForceRelease, fr)
		rv := e.adminReq(e.grab())
		rv.Reason, rv.IncidentID = "", uid("inc_")
		e.mustAdmin(lease.OpRevoke, rv)
		h := e.history(e.id)
		if len(h) != 2 {
			e.t.Fatalf("history has %d entries, want 2", len(h))
		}
		for i, c := range []struct {
			r     lease.AdminRequest
			state lease.State
		}{{rv, lease.StateRevoked}, {fr, lease.StateReleased}} {
			got := h[i]
			if got.Record.LeaseID != c.r.LeaseID || got.Record.State != c.state || got.Reason != c.r.Reason ||
				got.IncidentID != c.r.IncidentID || got.EndedBy != e.admin.PrincipalID || got.RequestID != c.r.RequestID {
				e.t.Fatalf("history entry %d: %s, want lease %s %s reason %q incident %q ended by %s request %s", i, js(got),
					c.r.LeaseID, c.state, c.r.Reason, c.r.IncidentID, e.admin.PrincipalID, c.r.RequestID)
			}
		}
	})
	s.leaf(t, "bounded_per_identity", func(e *env) {
		ended := e.cycle(10)
		bound := StoreOptions().HistoryPerIdentity
		var want []string
		for i := len(ended) - 1; i >= len(ended)-bound; i-- {
			want = append(want, ended[i].LeaseID+":released")
		}
		wantStrings(e.t, "bounded history", e.historyStates(e.id), want)
		e.wantCounter(e.key, 10)
	})
	s.leaf(t, "pages_newest_first", func(e *env) {
		ended := e.cycle(5)
		var all, tokens []string
		sizes := []int{}
		r := lease.HistoryRequest{Identity: e.id, PageSize: 2, Caller: e.admin}
		for i := 0; i < 10; i++ {
			r.DeadlineAt = deadline()
			res, err := e.st.History(bg, r)
			if err != nil {
				e.t.Fatalf("history page %d: %v", i, err)
			}
			sizes = append(sizes, len(res.Entries))
			for _, h := range res.Entries {
				all = append(all, h.Record.LeaseID)
			}
			if r.PageToken = res.NextPageToken; r.PageToken == "" {
				break
			}
			tokens = append(tokens, r.PageToken)
		}
		if !slices.Equal(sizes, []int{2, 2, 1}) {
			e.t.Fatalf("page sizes %v, want [2 2 1]", sizes)
		}
		var want []string
		for i := len(ended) - 1; i >= 0; i-- {
			want = append(want, ended[i].LeaseID)
		}
		wantStrings(e.t, "paged history", all, want)
		for _, tok := range tokens {
			opaqueToken(e.t, tok, e.id.TenantID, e.id.TargetID, e.key)
		}
	})
	s.leaf(t, "isolated_per_identity", func(e *env) {
		e.cycle(1)
		other, scrape := e.otherTarget(), e.id
		scrape.OperationClass = "scrape"
		for _, id := range []lease.Identity{other, scrape} {
			if h := e.history(id); len(h) != 0 {
				e.t.Fatalf("history of %+v shows %d foreign entries", id, len(h))
			}
		}
	})
	s.leaf(t, "page_token_bound_to_identity", func(e *env) {
		e.cycle(2)
		res, err := e.st.History(bg, lease.HistoryRequest{Identity: e.id, PageSize: 1, DeadlineAt: deadline(), Caller: e.admin})
		if err != nil || res.NextPageToken == "" {
			e.t.Fatalf("history page: %v, next %q", err, res.NextPageToken)
		}
		_, err = e.st.History(bg, lease.HistoryRequest{Identity: e.otherTarget(), PageSize: 1, PageToken: res.NextPageToken,
			DeadlineAt: deadline(), Caller: e.admin})
		mustInvalid(e.t, err, "page_token")
	})
}

// CheckStaleIndexListsNothing is the check of a backend's test that put
// back the List index entries of an ended lease of id, held by
// staleOwner, while successor (another owner's lease) holds id: listing by
// staleOwner finds nothing, and listing by successor's owner, by id's
// program and by id's target finds successor alone. The entries' lease-id
// lookup still names id, so only List's check that the active record is
// the entry's lease keeps successor out of staleOwner's page.
func CheckStaleIndexListsNothing(t *testing.T, s lease.Store, id lease.Identity, staleOwner string, successor *lease.Record) {
	t.Helper()
	for _, tc := range []struct {
		req  lease.ListRequest
		want string
	}{
		{lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: staleOwner}, ""},
		{lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: successor.OwnerPrincipalID}, successor.LeaseID},
		{lease.ListRequest{By: lease.ListByProgram, TenantID: id.TenantID, ProgramID: id.ProgramID}, successor.LeaseID},
		{lease.ListRequest{By: lease.ListByTarget, TenantID: id.TenantID, ProgramID: id.ProgramID,
			TargetNamespace: id.TargetNamespace, TargetID: id.TargetID}, successor.LeaseID},
	} {
		tc.req.DeadlineAt, tc.req.PageSize = time.Now().Add(time.Minute), 50
		res, err := s.List(context.Background(), tc.req)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range res.Leases {
			got = append(got, r.LeaseID)
		}
		if want := []string{tc.want}; tc.want == "" && len(got) != 0 || tc.want != "" && !slices.Equal(got, want) {
			t.Fatalf("list by %s %q: %q, want %q", tc.req.By, tc.req.OwnerPrincipalID, got, tc.want)
		}
	}
}

// CheckHistoryHoldsOnlyItsIdentity is the check of a backend's test that
// put foreign, an ended lease of another identity, among the history of
// id, where own has ended: id's history lists own and never foreign,
// which a caller allowed id's history need not be allowed to see.
func CheckHistoryHoldsOnlyItsIdentity(t *testing.T, s lease.Store, id lease.Identity, caller lease.Caller, own, foreign *lease.Record) {
	t.Helper()
	res, err := s.History(context.Background(), lease.HistoryRequest{Identity: id, PageSize: 50,
		DeadlineAt: time.Now().Add(time.Minute), Caller: caller})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range res.Entries {
		got = append(got, e.Record.LeaseID)
	}
	if !slices.Equal(got, []string{own.LeaseID}) {
		t.Fatalf("history of the identity: %q, want only %s (not the foreign %s)", got, own.LeaseID, foreign.LeaseID)
	}
}

// CheckListHoldsOnlyItsFilter is the check of a backend's test that put,
// under each of own's three List filters (lease.FiltersOf), an index entry
// naming foreign: a live lease of another owner, tenant, program and
// target, whose own entries and lease-id lookup are intact. Listing by
// own's owner, target and program finds own alone: foreign is selected by
// none of these filters, and a caller allowed own's scope need not be
// allowed foreign's.
func CheckListHoldsOnlyItsFilter(t *testing.T, s lease.Store, own, foreign *lease.Record) {
	t.Helper()
	id := own.Identity()
	for _, req := range []lease.ListRequest{
		{By: lease.ListByOwner, OwnerPrincipalID: own.OwnerPrincipalID},
		{By: lease.ListByTarget, TenantID: id.TenantID, ProgramID: id.ProgramID, TargetNamespace: id.TargetNamespace, TargetID: id.TargetID},
		{By: lease.ListByProgram, TenantID: id.TenantID, ProgramID: id.ProgramID},
	} {
		req.DeadlineAt, req.PageSize = time.Now().Add(time.Minute), 50
		res, err := s.List(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range res.Leases {
			got = append(got, r.LeaseID)
		}
		if !slices.Equal(got, []string{own.LeaseID}) {
			t.Errorf("list by %s of the own lease's filter: %q, want only %s (not the foreign %s, tenant %s)",
				req.By, got, own.LeaseID, foreign.LeaseID, foreign.TenantID)
		}
	}
}

// CheckLookupHoldsOnlyItsPrincipal is the check of a backend's test that
// copied the acquire evidence of orig (acquired by its owner with
// requestID) under the evidence key of the same identity, operation and
// request id for principal, another principal: LookupRequest for
// principal does not answer with orig, a lease principal never acquired
// (the idempotency key is scoped by the owner principal; the evidence
// names its owner, so a lookup can tell it is not principal's).
func CheckLookupHoldsOnlyItsPrincipal(t *testing.T, s lease.Store, orig *lease.Record, principal, requestID string) {
	t.Helper()
	res, err := s.LookupRequest(context.Background(), lease.LookupRequest{Op: lease.OpAcquire, Identity: orig.Identity(),
		PrincipalID: principal, RequestID: requestID, DeadlineAt: time.Now().Add(time.Minute)})
	if err == nil {
		t.Fatalf("lookup of %s's acquire %s: %s of lease %s owned by %s, want not found or corrupt",
			principal, requestID, res.Code, res.Lease.LeaseID, res.Lease.OwnerPrincipalID)
	}
	if c := lease.CodeOf(err); c != lease.CodeNotFound && c != lease.CodeCorrupt {
		t.Fatalf("lookup: %v, want not found or corrupt", err)
	}
}
