package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// listRow is one active lease of the list fixture: its id, identity and
// owner principal.
type listRow struct {
	id    string
	ident lease.Identity
	owner string
}

// listCaller is a key of one scope shape and the visibility rule the
// contract gives it, spelled out here independently of the auth package:
// every listed dimension must hold the lease's value (nil: any), and a
// caller without targets:read sees only its own leases.
type listCaller struct {
	name                                           string
	key                                            *e2eKey
	read, history                                  bool
	tenants, programs, namespaces, targets, actors []string
}

func grants(vs []string, v string) bool { return vs == nil || slices.Contains(vs, v) }

func (c listCaller) sees(r listRow) bool {
	id := r.ident
	return grants(c.tenants, id.TenantID) && grants(c.programs, id.ProgramID) && grants(c.namespaces, id.TargetNamespace) &&
		grants(c.targets, id.TargetID) && grants(c.actors, id.ActorName) && (c.read || r.owner == c.key.Principal)
}

// listFilter is one list query and the leases it selects before scope.
type listFilter struct {
	name  string
	query url.Values
	match func(listRow) bool
	// reachable: the filter itself is within the caller's reach (else 403).
	reachable func(listCaller) bool
}

// listFixture is a running server with leases spread over two tenants,
// programs, namespaces, targets, actors and owners, acquired in a shuffled
// order so that every caller's visible leases are interleaved with hidden
// ones in the list order (lease id).
type listFixture struct {
	s       *e2eServer
	rows    []listRow
	callers map[string]listCaller
	history struct {
		active  listRow  // the active lease of the history identity
		ended   []string // its released leases, newest first
		foreign listRow  // a lease of another identity
	}
}

func newListFixture(t *testing.T) *listFixture {
	return newListFixtureOn(t, startServer(t, testenv.BuildStarlease(t), newRowRecorder()))
}

// newListFixtureOn builds the fixture on a server the caller started (bolt
// or Valkey): keys of every scope shape, shuffled leases over two owners,
// and a history identity.
func newListFixtureOn(t *testing.T, s *e2eServer) *listFixture {
	f := &listFixture{s: s, callers: map[string]listCaller{}}
	ownerX := s.createKey("prn-owner-x", "api_client", "targets:lease", "tenant:*,program:*")
	ownerY := s.createKey("prn-owner-y", "api_client", "targets:lease", "tenant:*,program:*")
	tA, pA, pB := []string{"tenant-a"}, []string{"program-a"}, []string{"program-b"}
	for _, c := range []listCaller{
		{name: "tenant_only", key: s.createKey("prn-reader-a", "api_client", "targets:read,audit:read", "tenant:tenant-a,program:*"),
			read: true, history: true, tenants: tA},
		// The same principal with a narrower key: another scope.
		{name: "tenant_program", key: s.createKey("prn-reader-a", "api_client", "targets:read,audit:read", "tenant:tenant-a,program:program-a"),
			read: true, history: true, tenants: tA, programs: pA},
		// Another principal with exactly tenant_only's authority.
		{name: "tenant_only_twin", key: s.createKey("prn-reader-a2", "api_client", "targets:read,audit:read", "tenant:tenant-a,program:*"),
			read: true, history: true, tenants: tA},
		{name: "program_wildcard", key: s.createKey("prn-reader-p", "api_client", "targets:read,audit:read", "tenant:*,program:program-b"),
			read: true, history: true, programs: pB},
		{name: "namespace_narrowed", key: s.createKey("prn-reader-ns", "api_client", "targets:read,audit:read",
			"tenant:tenant-a,program:*,target-namespace:ns-1"), read: true, history: true, tenants: tA, namespaces: []string{"ns-1"}},
		{name: "target_narrowed", key: s.createKey("prn-reader-t", "api_client", "targets:read,audit:read",
			"tenant:tenant-a,program:program-a,target:t-2"), read: true, history: true, tenants: tA, programs: pA, targets: []string{"t-2"}},
		{name: "actor_component", key: s.createKey("prn-actor-1", "actor_component", "targets:lease,targets:read,audit:read",
			"tenant:*,program:*,actor:actor-1"), read: true, history: true, actors: []string{"actor-1"}},
		// An owner's actor-bound key without targets:read: its own
		// actor-2 leases only, not the owner's other leases.
		{name: "owner_actor_component", key: s.createKey("prn-owner-x", "actor_component", "targets:lease",
			"tenant:*,program:*,actor:actor-2"), actors: []string{"actor-2"}},
		{name: "owner", key: ownerX},
		{name: "administrator", key: s.createKey("prn-admin", "administrator",
			"targets:lease,targets:read,targets:force-release,audit:read", "tenant:*,program:*"), read: true, history: true},
		{name: "out_of_scope", key: s.createKey("prn-reader-c", "api_client", "targets:read,audit:read", "tenant:tenant-c,program:*"),
			read: true, history: true, tenants: []string{"tenant-c"}},
	} {
		f.callers[c.name] = c
	}

	ctx := context.Background()
	cx, cy := s.client(ownerX), s.client(ownerY)
	acquire := func(c *client.Client, id lease.Identity) client.Lease {
		t.Helper()
		res, err := c.Acquire(ctx, client.AcquireRequest{LockIdentity: id, TTLMs: 600000, ServiceInstanceID: "inst-l",
			ExecutionID: "exec-l", JobID: "job-l"})
		return okLease(t, s, res, err, lease.CodeAcquired).Lease
	}
	// The history identity: three released leases, then an active one.
	hist := lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "ns-1", TargetID: "t-1",
		ActorName: "actor-1", WorkflowName: "wf-history"}
	for range 3 {
		l := acquire(cx, hist)
		if _, err := cx.Release(ctx, client.ReleaseRequest{LeaseID: l.LeaseID, LockIdentity: hist, FencingToken: l.FencingToken,
			ServiceInstanceID: "inst-l"}); err != nil {
			t.Fatalf("release: %v", err)
		}
		f.history.ended = append([]string{l.LeaseID}, f.history.ended...)
	}
	var ids []lease.Identity
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		for _, program := range []string{"program-a", "program-b"} {
			for _, ns := range []string{"ns-1", "ns-2"} {
				for _, target := range []string{"t-1", "t-2"} {
					for _, actor := range []string{"actor-1", "actor-2"} {
						for _, wf := range []string{"wf-1", "wf-2"} {
							ids = append(ids, lease.Identity{TenantID: tenant, ProgramID: program, TargetNamespace: ns,
								TargetID: target, ActorName: actor, WorkflowName: wf})
						}
					}
				}
			}
		}
	}
	ids = append(ids, hist)
	rng := rand.New(rand.NewPCG(11, 3))
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for i, id := range ids {
		c, owner := cx, ownerX.Principal
		if i%2 == 1 && id != hist {
			c, owner = cy, ownerY.Principal
		}
		l := acquire(c, id)
		row := listRow{id: l.LeaseID, ident: canonical(id), owner: owner}
		f.rows = append(f.rows, row)
		switch {
		case id == hist:
			f.history.active = row
		case id.TenantID == "tenant-a" && id.ProgramID == "program-a" && f.history.foreign.id == "":
			f.history.foreign = row
		}
	}
	return f
}

// filters are the list queries every caller runs: by owner (both owners),
// by program (every pair) and by target (three targets).
func (f *listFixture) filters() []listFilter {
	var out []listFilter
	for _, owner := range []string{"prn-owner-x", "prn-owner-y"} {
		out = append(out, listFilter{name: "owner_" + owner, query: url.Values{"owner_principal_id": {owner}},
			match:     func(r listRow) bool { return r.owner == owner },
			reachable: func(c listCaller) bool { return c.read || c.key.Principal == owner }})
	}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		for _, program := range []string{"program-a", "program-b"} {
			out = append(out, listFilter{name: "program_" + tenant + "_" + program,
				query: url.Values{"tenant_id": {tenant}, "program_id": {program}},
				match: func(r listRow) bool { return r.ident.TenantID == tenant && r.ident.ProgramID == program },
				reachable: func(c listCaller) bool {
					return grants(c.tenants, tenant) && grants(c.programs, program)
				}})
		}
	}
	for _, tg := range [][4]string{{"tenant-a", "program-a", "ns-1", "t-1"}, {"tenant-a", "program-a", "ns-2", "t-2"},
		{"tenant-b", "program-b", "ns-1", "t-2"}} {
		out = append(out, listFilter{name: "target_" + strings.Join(tg[:], "_"),
			query: url.Values{"tenant_id": {tg[0]}, "program_id": {tg[1]}, "target_namespace": {tg[2]}, "target_id": {tg[3]}},
			match: func(r listRow) bool {
				return r.ident.TenantID == tg[0] && r.ident.ProgramID == tg[1] && r.ident.TargetNamespace == tg[2] && r.ident.TargetID == tg[3]
			},
			reachable: func(c listCaller) bool {
				return grants(c.tenants, tg[0]) && grants(c.programs, tg[1]) && grants(c.namespaces, tg[2]) && grants(c.targets, tg[3])
			}})
	}
	return out
}

// allIDs are every lease id of the server, active and ended.
func (f *listFixture) allIDs() []string {
	ids := slices.Clone(f.history.ended)
	for _, r := range f.rows {
		ids = append(ids, r.id)
	}
	return ids
}

// list sends one list request as caller c.
func (f *listFixture) list(t *testing.T, c listCaller, q url.Values, size int, token string) rawResp {
	t.Helper()
	q = cloneQuery(q)
	q.Set("page_size", fmt.Sprint(size))
	if token != "" {
		q.Set("page_token", token)
	}
	return f.s.do(t, rawReq{Method: "GET", Path: apiBase + "/?" + q.Encode(), Key: c.key.APIKey})
}

func cloneQuery(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = slices.Clone(v)
	}
	return out
}

// page decodes a 200 list or history answer: the lease ids of its items
// (under key) and next_page_token.
func page(t *testing.T, r rawResp, key string) ([]string, string) {
	t.Helper()
	if r.Status != 200 {
		t.Fatalf("want 200, got %d: %s", r.Status, r.Body)
	}
	// An empty page omits its items.
	raw, ok := r.JSON[key].([]any)
	next, hasNext := r.JSON["next_page_token"].(string)
	if _, present := r.JSON[key]; present && !ok || !hasNext {
		t.Fatalf("answer without a %s array or next_page_token: %s", key, r.Body)
	}
	var ids []string
	for _, it := range raw {
		m, _ := it.(map[string]any)
		id, _ := m["lease_id"].(string)
		if id == "" {
			t.Fatalf("%s item without lease_id: %s", key, r.Body)
		}
		ids = append(ids, id)
	}
	return ids, next
}

// checkOpaque fails if token, as sent or base64-decoded in any alphabet,
// holds a lease id (or its ULID) or is readable JSON.
func checkOpaque(t *testing.T, token string, ids []string) {
	t.Helper()
	texts := []string{token}
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.StdEncoding} {
		if b, err := enc.DecodeString(token); err == nil {
			texts = append(texts, string(b))
		}
	}
	for _, text := range texts {
		if json.Valid([]byte(text)) {
			t.Errorf("page token %q reads as JSON: %s", token, text)
			return
		}
		for _, id := range ids {
			if strings.Contains(text, id) || strings.Contains(text, strings.TrimPrefix(id, "lease_")) {
				t.Errorf("page token %q discloses lease id %s", token, id)
				return
			}
		}
	}
}

// wantPageTokenRefused checks a 400 invalid_lease_request on page_token.
func wantPageTokenRefused(t *testing.T, r rawResp, what string) {
	t.Helper()
	if r.Status != 400 || r.code() != string(lease.CodeInvalidRequest) || r.str("field") != "page_token" {
		t.Errorf("%s: want 400 invalid_lease_request on page_token, got %d %s", what, r.Status, r.Body)
	}
}

// TestListScope runs a real bolt server holding leases spread over two
// tenants, programs, namespaces, targets, actors and owners, and lists them
// over HTTP as callers of every scope shape (pages, history), replays page
// tokens where they do not belong (tokens_bound), and continues pages
// across a restart (tokens_survive_restart).
func TestListScope(t *testing.T) {
	f := newListFixture(t)
	t.Run("pages", f.pages)
	t.Run("history", f.historyPages)
	t.Run("tokens_bound", f.tokensBound)
	t.Run("tokens_survive_restart", f.tokensSurviveRestart)
}

// pages: every route (by owner, target, program) as every caller, paging
// with page sizes 1 and 5; the decoded bodies hold exactly the leases the
// caller may see, in lease-id order, with no duplicate and no gap although
// hidden leases are interleaved; no page token decodes to a lease id; a
// token comes only before a page that has a lease, and a short page has
// none (so neither page shapes nor tokens reveal hidden leases; a caller
// who sees nothing gets one empty page and no token); 403 where the filter
// is out of reach.
func (f *listFixture) pages(t *testing.T) {
	all := f.allIDs()
	for name, c := range f.callers {
		t.Run(name, func(t *testing.T) {
			for _, flt := range f.filters() {
				var want []string
				for _, r := range f.rows {
					if flt.match(r) && c.sees(r) {
						want = append(want, r.id)
					}
				}
				slices.Sort(want)
				if !flt.reachable(c) {
					r := f.list(t, c, flt.query, 5, "")
					if r.Status != 403 || r.code() != string(lease.CodeAccessDenied) {
						t.Errorf("%s: want 403 access_denied, got %d %s", flt.name, r.Status, r.Body)
					}
					continue
				}
				for _, size := range []int{1, 5} {
					var got []string
					token := ""
					for pages := 1; ; pages++ {
						ids, next := page(t, f.list(t, c, flt.query, size, token), "leases")
						if len(ids) > size {
							t.Fatalf("%s size %d: page of %d", flt.name, size, len(ids))
						}
						if token != "" && len(ids) == 0 {
							t.Errorf("%s size %d: a token led to an empty page", flt.name, size)
						}
						if next != "" && len(ids) < size {
							t.Errorf("%s size %d: short page of %d with a next token", flt.name, size, len(ids))
						}
						got = append(got, ids...)
						if next == "" {
							break
						}
						checkOpaque(t, next, all)
						if pages > len(f.rows)+1 {
							t.Fatalf("%s size %d: more pages than leases", flt.name, size)
						}
						token = next
					}
					if !slices.Equal(got, want) {
						t.Errorf("%s size %d: listed\n  %v\nwant (visible, lease-id order)\n  %v", flt.name, size, got, want)
					}
				}
			}
		})
	}
}

// historyPage sends GET /{lease_id}/history with page size 1 as caller c.
func (f *listFixture) historyPage(t *testing.T, c listCaller, leaseID, token string) rawResp {
	t.Helper()
	q := url.Values{"page_size": {"1"}}
	if token != "" {
		q.Set("page_token", token)
	}
	return f.s.do(t, rawReq{Method: "GET", Path: apiBase + "/" + leaseID + "/history?" + q.Encode(), Key: c.key.APIKey})
}

// historyPages: the history identity's three released leases, newest
// first, one per page, for every caller with audit:read whose scope reaches
// the identity; 404 for the others (403 without audit:read); tokens opaque.
func (f *listFixture) historyPages(t *testing.T) {
	all := f.allIDs()
	for name, c := range f.callers {
		t.Run(name, func(t *testing.T) {
			r := f.historyPage(t, c, f.history.active.id, "")
			switch reach := c.sees(listRow{ident: f.history.active.ident, owner: c.key.Principal}); {
			case !c.history:
				if r.Status != 403 || r.code() != string(lease.CodeAccessDenied) {
					t.Fatalf("without audit:read: want 403, got %d %s", r.Status, r.Body)
				}
				return
			case !reach:
				if r.Status != 404 || r.code() != string(lease.CodeNotFound) {
					t.Fatalf("identity out of scope: want 404, got %d %s", r.Status, r.Body)
				}
				return
			}
			var got []string
			for pages := 1; ; pages++ {
				ids, next := page(t, r, "history")
				if len(ids) != 1 {
					t.Fatalf("history page of %d: %v", len(ids), ids)
				}
				got = append(got, ids...)
				if next == "" || pages > len(f.history.ended) {
					break
				}
				checkOpaque(t, next, all)
				r = f.historyPage(t, c, f.history.active.id, next)
			}
			if !slices.Equal(got, f.history.ended) {
				t.Fatalf("history %v, want %v", got, f.history.ended)
			}
		})
	}
}

// tokensBound: a list token works only for the caller's principal and
// scope and the filter it was minted for; a history token likewise, for
// the identity it pages. Every other use is 400 invalid_lease_request on
// page_token.
func (f *listFixture) tokensBound(t *testing.T) {
	c, twin, narrower := f.callers["tenant_only"], f.callers["tenant_only_twin"], f.callers["tenant_program"]
	byX := url.Values{"owner_principal_id": {"prn-owner-x"}}
	first, tok := page(t, f.list(t, c, byX, 1, ""), "leases")
	if len(first) != 1 || tok == "" {
		t.Fatalf("first page: %v, token %q", first, tok)
	}
	// The token's own caller continues; the same filter with another page
	// size is the same listing.
	if next, _ := page(t, f.list(t, c, byX, 1, tok), "leases"); len(next) != 1 || next[0] <= first[0] {
		t.Fatalf("second page: %v after %v", next, first)
	}
	if next, _ := page(t, f.list(t, c, byX, 5, tok), "leases"); len(next) == 0 || next[0] <= first[0] {
		t.Fatalf("second page of 5: %v after %v", next, first)
	}
	wantPageTokenRefused(t, f.list(t, twin, byX, 1, tok), "another principal, same scope and filter")
	wantPageTokenRefused(t, f.list(t, narrower, byX, 1, tok), "same principal, another scope")
	wantPageTokenRefused(t, f.list(t, c, url.Values{"owner_principal_id": {"prn-owner-y"}}, 1, tok), "another owner filter")
	wantPageTokenRefused(t, f.list(t, c, url.Values{"tenant_id": {"tenant-a"}, "program_id": {"program-a"}}, 1, tok), "a program filter")
	tampered := []byte(tok)
	if i := len(tampered) / 2; tampered[i] == 'A' {
		tampered[i] = 'B'
	} else {
		tampered[i] = 'A'
	}
	wantPageTokenRefused(t, f.list(t, c, byX, 1, string(tampered)), "a tampered token")
	// A cursor a client made in the store's own format.
	forged := lease.EncodePageToken(f.rows[0].id, string(lease.ListByOwner)+"\x00"+lease.OwnerIndexValue("prn-owner-x"))
	wantPageTokenRefused(t, f.list(t, c, byX, 1, forged), "a forged cursor")

	_, htok := page(t, f.historyPage(t, c, f.history.active.id, ""), "history")
	if htok == "" {
		t.Fatal("first history page without a token")
	}
	// The same identity through one of its ended lease ids is the same filter.
	if ids, _ := page(t, f.historyPage(t, c, f.history.ended[0], htok), "history"); !slices.Equal(ids, f.history.ended[1:2]) {
		t.Fatalf("history through an ended lease id: %v", ids)
	}
	wantPageTokenRefused(t, f.historyPage(t, twin, f.history.active.id, htok), "history: another principal")
	wantPageTokenRefused(t, f.historyPage(t, narrower, f.history.active.id, htok), "history: another scope")
	wantPageTokenRefused(t, f.historyPage(t, c, f.history.foreign.id, htok), "history: another identity")
	wantPageTokenRefused(t, f.historyPage(t, c, f.history.active.id, tok), "history: a list token")
	wantPageTokenRefused(t, f.list(t, c, byX, 1, htok), "list: a history token")
}

// tokensSurviveRestart: the token key comes from the pepper, not from the
// process, so a restarted server (like any other server sharing the
// pepper) continues list and history pages.
func (f *listFixture) tokensSurviveRestart(t *testing.T) {
	c := f.callers["administrator"]
	byY := url.Values{"owner_principal_id": {"prn-owner-y"}}
	first, tok := page(t, f.list(t, c, byY, 1, ""), "leases")
	_, htok := page(t, f.historyPage(t, c, f.history.active.id, ""), "history")
	if len(first) != 1 || tok == "" || htok == "" {
		t.Fatalf("first pages: %v, tokens %q %q", first, tok, htok)
	}
	var want []string
	for _, r := range f.rows {
		if r.owner == "prn-owner-y" && r.id > first[0] {
			want = append(want, r.id)
		}
	}
	slices.Sort(want)
	f.s.Restart()
	if next, _ := page(t, f.list(t, c, byY, 1, tok), "leases"); !slices.Equal(next, want[:1]) {
		t.Fatalf("list after restart: %v, want %v", next, want[:1])
	}
	if ids, _ := page(t, f.historyPage(t, c, f.history.active.id, htok), "history"); !slices.Equal(ids, f.history.ended[1:2]) {
		t.Fatalf("history after restart: %v, want %v", ids, f.history.ended[1:2])
	}
}
