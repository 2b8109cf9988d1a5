package leasetest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

// contractLockKey is the contract's canonical-target-lock-key function,
// written out independently of package lease: versioned JSON array, SHA-256,
// unpadded base64url, prefix.
func contractLockKey(id lease.Identity) string {
	b, _ := json.Marshal([]string{"v1", id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID,
		id.ActorName, id.WorkflowName, id.OperationClass})
	sum := sha256.Sum256(b)
	return "starintel:target-lease:v1:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// canonical_identity: canonical equivalent inputs produce one lock key and
// raw/noncanonical inputs are rejected.
func (s *suite) canonicalIdentity(t *testing.T) {
	s.leaf(t, "equivalent_inputs_share_one_lock_key", func(e *env) {
		r := uid("")
		raw := lease.Identity{TenantID: " Tenant-" + r + "\t", ProgramID: "PROGRAM-" + r,
			TargetNamespace: "StarIntel-Target", TargetID: "Cafe\u0301-" + r, ActorName: "UserNameGen"}
		want := lease.Identity{TenantID: "tenant-" + r, ProgramID: "program-" + r,
			TargetNamespace: "starintel-target", TargetID: "caf\u00e9-" + r, ActorName: "usernamegen",
			WorkflowName: "default", OperationClass: "default"}
		rec := e.mustAcquire(e.acquireReqFor(raw, e.owner))
		if rec.Identity() != want {
			e.t.Fatalf("stored tuple %+v, want canonical %+v", rec.Identity(), want)
		}
		if rec.LockKey != contractLockKey(want) {
			e.t.Fatalf("lock_key %q, want the contract's %q", rec.LockKey, contractLockKey(want))
		}
		// Every equivalent spelling names the same lease.
		for _, id := range []lease.Identity{raw, want} {
			sameRecord(e.t, "inspect by equivalent identity", e.active(id), rec)
		}
		alt := lease.Identity{TenantID: "TENANT-" + r, ProgramID: " program-" + r + " ",
			TargetNamespace: "STARINTEL-TARGET", TargetID: "CAF\u00c9-" + r, ActorName: "usernameGEN",
			WorkflowName: " DEFAULT", OperationClass: "Default"}
		_, err := e.st.Acquire(bg, e.acquireReqFor(alt, newCaller("actor")))
		mustCode(e.t, err, lease.CodeConflict)
		h := heldOf(rec)
		h.Identity = raw
		e.mustRenew(h.renew(e))
		e.wantCounter(contractLockKey(want), 1)
	})
	s.leaf(t, "defaults_fill_workflow_and_operation_class", func(e *env) {
		raw := e.id
		raw.WorkflowName, raw.OperationClass = "", ""
		rec := e.mustAcquire(e.acquireReqFor(raw, e.owner))
		if rec.WorkflowName != "default" || rec.OperationClass != "default" {
			e.t.Fatalf("workflow_name %q operation_class %q, want default/default", rec.WorkflowName, rec.OperationClass)
		}
		if rec.LockKey != contractLockKey(e.id) {
			e.t.Fatalf("omitted components hashed differently from explicit default")
		}
		sameRecord(e.t, "inspect with explicit defaults", e.active(e.id), rec)
	})
	s.leaf(t, "operation_class_is_a_closed_enum", func(e *env) {
		base := e.grab()
		scrape := e.id
		scrape.OperationClass = "SCRAPE"
		rec := e.mustAcquire(e.acquireReqFor(scrape, e.owner))
		if rec.OperationClass != "scrape" || rec.LockKey == base.LockKey || rec.FencingToken != 1 {
			e.t.Fatalf("configured class: got %q key-equal=%v token %d", rec.OperationClass, rec.LockKey == base.LockKey, rec.FencingToken)
		}
		bogus := e.id
		bogus.OperationClass = "bogus"
		_, err := e.st.Acquire(bg, e.acquireReqFor(bogus, e.owner))
		mustInvalid(e.t, err, "lock_identity.operation_class")
		sameRecord(e.t, "default class lease", e.active(e.id), base)
	})
	group(t, "rejects_noncanonical", func(t *testing.T) {
		for _, c := range []struct {
			name, field string
			mutate      func(*lease.Identity)
		}{
			{"empty_tenant_id", "tenant_id", func(id *lease.Identity) { id.TenantID = "" }},
			{"blank_program_id", "program_id", func(id *lease.Identity) { id.ProgramID = " \t " }},
			{"path_separator", "target_id", func(id *lease.Identity) { id.TargetID = "a/" + id.TargetID }},
			{"backslash", "target_id", func(id *lease.Identity) { id.TargetID = `a\` + id.TargetID }},
			{"dot_dot", "target_id", func(id *lease.Identity) { id.TargetID += "..x" }},
			{"glob_pattern", "target_id", func(id *lease.Identity) { id.TargetID += "*" }},
			{"bracket_pattern", "actor_name", func(id *lease.Identity) { id.ActorName = "actor[1]" }},
			{"brace_pattern", "workflow_name", func(id *lease.Identity) { id.WorkflowName = "wf{a,b}" }},
			{"control_character", "target_id", func(id *lease.Identity) { id.TargetID += "\x00" }},
			{"inner_whitespace", "actor_name", func(id *lease.Identity) { id.ActorName = "user name" }},
			{"invalid_utf8", "target_namespace", func(id *lease.Identity) { id.TargetNamespace = "ns\xff" }},
			{"too_long", "target_id", func(id *lease.Identity) { id.TargetID = strings.Repeat("a", lease.MaxIdentifierBytes+1) }},
			{"leading_punctuation", "target_namespace", func(id *lease.Identity) { id.TargetNamespace = "-ns" }},
			{"unknown_operation_class", "operation_class", func(id *lease.Identity) { id.OperationClass = "bogus" }},
		} {
			s.leaf(t, c.name, func(e *env) {
				bad := e.id
				c.mutate(&bad)
				_, err := e.st.Acquire(bg, e.acquireReqFor(bad, e.owner))
				mustInvalid(e.t, err, "lock_identity."+c.field)
				_, err = e.st.Inspect(bg, lease.InspectRequest{Identity: bad, DeadlineAt: deadline(), Caller: e.owner})
				mustInvalid(e.t, err, "lock_identity."+c.field)
				_, err = e.st.History(bg, lease.HistoryRequest{Identity: bad, DeadlineAt: deadline(), Caller: e.admin})
				mustInvalid(e.t, err, "lock_identity."+c.field)
				if got := e.list(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID}); len(got) != 0 {
					e.t.Fatalf("rejected acquire left %d leases", len(got))
				}
				e.wantCounter(e.key, 0)
			})
		}
	})
}

// no_collisions_across_fields: different tenant, program, namespace, target,
// actor, workflow or operation class values cannot collide.
func (s *suite) noCollisions(t *testing.T) {
	for _, c := range []struct {
		field  string
		mutate func(*lease.Identity)
	}{
		{"tenant_id", func(id *lease.Identity) { id.TenantID = uid("tenant-") }},
		{"program_id", func(id *lease.Identity) { id.ProgramID = uid("program-") }},
		{"target_namespace", func(id *lease.Identity) { id.TargetNamespace = "starintel-other" }},
		{"target_id", func(id *lease.Identity) { id.TargetID = uid("target_") }},
		{"actor_name", func(id *lease.Identity) { id.ActorName = "subdomainenum" }},
		{"workflow_name", func(id *lease.Identity) { id.WorkflowName = "nightly" }},
		{"operation_class", func(id *lease.Identity) { id.OperationClass = "enrich" }},
	} {
		s.leaf(t, c.field, func(e *env) {
			other := e.id
			c.mutate(&other)
			e.wantIndependent(e.id, other)
		})
	}
	s.leaf(t, "component_boundary_shift", func(e *env) {
		// Joining components with a separator would make each pair collide.
		a, b := e.id, e.id
		a.TenantID, a.ProgramID = e.id.TenantID+":x", "y"
		b.TenantID, b.ProgramID = e.id.TenantID, "x:y"
		e.wantIndependent(a, b)
		c, d := e.id, e.id
		c.ActorName, c.WorkflowName = "actor-a", "b"
		d.ActorName, d.WorkflowName = "actor", "a-b"
		e.wantIndependent(c, d)
	})
}

// wantIndependent asserts a and b are separate locks with separate counters.
func (e *env) wantIndependent(a, b lease.Identity) {
	e.t.Helper()
	ra := e.mustAcquire(e.acquireReqFor(a, e.owner))
	rb := e.mustAcquire(e.acquireReqFor(b, newCaller("actor")))
	if ra.LockKey == rb.LockKey {
		e.t.Fatalf("%+v and %+v share lock key %s", a, b, ra.LockKey)
	}
	if ra.FencingToken != 1 || rb.FencingToken != 1 {
		e.t.Fatalf("tokens %d and %d, want 1 and 1: counters are shared", ra.FencingToken, rb.FencingToken)
	}
	e.mustRelease(e.releaseReq(rb))
	sameRecord(e.t, "lease of the first identity", e.active(a), ra)
	e.wantCounter(ra.LockKey, 1)
	e.wantCounter(rb.LockKey, 1)
}

// acquire_if_free: the non-blocking acquisition and its conflict result.
func (s *suite) acquireIfFree(t *testing.T) {
	s.leaf(t, "new_lease_record_read_back", func(e *env) {
		r := e.acquireReq()
		r.Metadata = lease.Metadata{"purpose": "conformance", "priority": 3, "dry_run": true}
		rec := e.mustAcquire(r)
		sameRecord(e.t, "inspect by identity", e.active(e.id), rec)
		sameRecord(e.t, "inspect by lease id", e.byID(rec.LeaseID), rec)
		got := e.list(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID})
		if len(got) != 1 {
			e.t.Fatalf("list by owner: %d leases, want 1", len(got))
		}
		sameRecord(e.t, "listed lease", got[0], rec)
		e.wantCounter(e.key, 1)
		if h := e.history(e.id); len(h) != 0 {
			e.t.Fatalf("history of a live lease: %d entries", len(h))
		}
	})
	s.leaf(t, "conflict_changes_nothing", func(e *env) {
		rec := e.grab()
		before := e.snap(e.id)
		r := e.acquireReqFor(e.id, newCaller("actor"))
		_, err := e.st.Acquire(bg, r)
		le := mustCode(e.t, err, lease.CodeConflict)
		if le.RetryAfter <= 0 || le.RetryAfter > Long {
			e.t.Fatalf("conflict retry_after %v, want in (0, %v]", le.RetryAfter, Long)
		}
		e.unchanged(e.id, before)
		sameRecord(e.t, "holder", e.active(e.id), rec)
		_, err = e.lookup(lease.OpAcquire, e.id, r.Caller.PrincipalID, r.RequestID)
		mustCode(e.t, err, lease.CodeNotFound)
	})
	s.leaf(t, "conflicted_request_id_may_succeed_once_free", func(e *env) {
		rec := e.grab()
		r := e.acquireReqFor(e.id, newCaller("actor"))
		_, err := e.st.Acquire(bg, r)
		mustCode(e.t, err, lease.CodeConflict)
		e.mustRelease(e.releaseReq(rec))
		next := e.mustAcquire(r)
		if next.FencingToken != rec.FencingToken+1 {
			e.t.Fatalf("token %d after %d", next.FencingToken, rec.FencingToken)
		}
		res, err := e.st.Acquire(bg, r)
		e.replayed("acquire", res, err, lease.CodeAcquired, next)
		e.wantCounter(e.key, 2)
	})
}

func (s *suite) health(t *testing.T) {
	s.leaf(t, "ok_when_open", func(e *env) {
		if h := e.st.Health(bg); h.Status != lease.HealthOK {
			e.t.Fatalf("health %+v, want ok", h)
		}
	})
}

func (e *env) lookup(op lease.Op, id lease.Identity, principal, requestID string) (lease.Result, error) {
	return e.st.LookupRequest(bg, lease.LookupRequest{Op: op, Identity: id, PrincipalID: principal,
		RequestID: requestID, DeadlineAt: deadline()})
}

// mustLookup asserts the stored result of a request replays original.
func (e *env) mustLookup(op lease.Op, id lease.Identity, principal, requestID string, code lease.Code, original *lease.Record) {
	e.t.Helper()
	res, err := e.lookup(op, id, principal, requestID)
	e.replayed("lookup "+string(op), res, err, code, original)
	if res.Op != op {
		e.t.Fatalf("lookup: op %q, want %q", res.Op, op)
	}
}
