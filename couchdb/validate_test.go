package couchdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// absent marks a fence member (or the whole fence) left out.
type absentT struct{}

var absent = absentT{}

// noFence is a stored document without a fence (written before the fence
// was installed): fence.Admit's stored == nil.
var noFence = &struct{}{}

var keyOne = fencetest.LockKey("one")

// fenceJSON builds a fence object from a valid base with members changed
// (absent deletes a member).
// thisDoc stands for the id of the document a fence is written with: the
// table's fences are bound to their own documents (at).
const thisDoc = "@this-document"

// at is fence f bound to document id (its target placeholder replaced).
func at(f any, id string) any {
	m, ok := f.(map[string]any)
	if !ok || m["target"] != thisDoc {
		return f
	}
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	c["target"] = id
	return c
}

func fenceJSON(changes map[string]any) map[string]any {
	m := map[string]any{
		"lock_key":      keyOne,
		"lease_id":      "lease-5",
		"fencing_token": 5,
		"execution_id":  "exec-5",
		"job_id":        "job-5",
		"trace_id":      "trace-5",
		"sink":          "couchdb",
		"commit_id":     "commit-5",
		"target":        thisDoc,
		"commit_seq":    5,
		"accepted_at":   "2026-08-05T12:00:00.000Z",
	}
	for k, v := range changes {
		if v == absent {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

// goVerdict is fence.Admit over the JSON values a document would carry:
// a next fence that does not decode as a fence.Guard is refused (the Go
// writer could never send it; a Go reader could not use it).
func goVerdict(t *testing.T, docID string, stored, next any) error {
	t.Helper()
	var sg *fence.Guard
	if stored != nil && stored != noFence {
		b, _ := json.Marshal(stored)
		var g fence.Guard
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatalf("stored fence %s does not decode: %v", b, err)
		}
		sg = &g
	}
	var ng fence.Guard
	if next != absent {
		b, _ := json.Marshal(next)
		if err := json.Unmarshal(b, &ng); err != nil {
			return &lease.Error{Code: lease.CodeCommitRejected, Reason: "fence does not decode: " + err.Error()}
		}
	}
	if err := fence.Admit(sg, ng); err != nil {
		return err
	}
	if ng.Target != docID {
		return &lease.Error{Code: lease.CodeCommitRejected, Reason: "the guard was authorized for another write"}
	}
	return nil
}

// TestValidateDocUpdateAgreesWithAdmit runs one table of (stored fence,
// next fence) cases through fence.Admit and through the real
// validate_doc_update on pouchdb-server, and requires the same verdict.
func TestValidateDocUpdateAgreesWithAdmit(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	ctx := context.Background()
	db, err := couchdb.New(couch.URL(), "agreement")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	base := couch.URL() + "/agreement/"

	const max = lease.MaxFencingToken
	s5 := fenceJSON(nil)
	sMax := fenceJSON(map[string]any{"fencing_token": max, "lease_id": "lease-max"})
	type tc struct {
		name   string
		stored any // nil: no document; noFence: a document without a fence
		next   any // absent: no fence member
		ok     bool
	}
	cases := []tc{
		// New documents: the fence must be complete and well formed.
		{"first write", nil, fenceJSON(nil), true},
		{"first write, no fence", nil, absent, false},
		{"first write, fence null", nil, nil, false},
		{"fence is an array", nil, []any{1, 2}, false},
		{"fence is a string", nil, "starintel:target-lease:v1:one", false},
		{"fence is empty", nil, map[string]any{}, false},
		{"lock key missing", nil, fenceJSON(map[string]any{"lock_key": absent}), false},
		{"lock key without prefix", nil, fenceJSON(map[string]any{"lock_key": "one"}), false},
		{"lock key with upper-case prefix", nil, fenceJSON(map[string]any{"lock_key": "STARINTEL:target-lease:v1:one"}), false},
		{"lock key is the bare prefix", nil, fenceJSON(map[string]any{"lock_key": lease.KeyPrefix}), false},
		{"lock key digest too short", nil, fenceJSON(map[string]any{"lock_key": keyOne[:len(keyOne)-1]}), false},
		{"lock key digest too long", nil, fenceJSON(map[string]any{"lock_key": keyOne + "A"}), false},
		{"lock key digest not base64url", nil, fenceJSON(map[string]any{"lock_key": lease.KeyPrefix + "+" + keyOne[len(lease.KeyPrefix)+1:]}), false},
		// "one"'s digest ends in '0' (52): 'B' (1) sets a padding bit.
		{"lock key digest with non-zero padding bits", nil, fenceJSON(map[string]any{"lock_key": keyOne[:len(keyOne)-1] + "B"}), false},
		{"lock key is a number", nil, fenceJSON(map[string]any{"lock_key": 7}), false},
		{"token 0", nil, fenceJSON(map[string]any{"fencing_token": 0}), false},
		{"token 1", nil, fenceJSON(map[string]any{"fencing_token": 1}), true},
		{"token -1", nil, fenceJSON(map[string]any{"fencing_token": -1}), false},
		{"token 2^53-1", nil, fenceJSON(map[string]any{"fencing_token": max}), true},
		{"token 2^53", nil, fenceJSON(map[string]any{"fencing_token": uint64(max + 1)}), false},
		{"token 2^64-1", nil, fenceJSON(map[string]any{"fencing_token": ^uint64(0)}), false},
		{"token 5.5", nil, fenceJSON(map[string]any{"fencing_token": 5.5}), false},
		{"token as a string", nil, fenceJSON(map[string]any{"fencing_token": "5"}), false},
		{"token missing", nil, fenceJSON(map[string]any{"fencing_token": absent}), false},
		{"lease id empty", nil, fenceJSON(map[string]any{"lease_id": ""}), false},
		{"lease id missing", nil, fenceJSON(map[string]any{"lease_id": absent}), false},
		{"lease id a number", nil, fenceJSON(map[string]any{"lease_id": 5}), false},
		{"execution id empty", nil, fenceJSON(map[string]any{"execution_id": ""}), false},
		{"execution id null", nil, fenceJSON(map[string]any{"execution_id": nil}), false},
		{"sink empty", nil, fenceJSON(map[string]any{"sink": ""}), false},
		{"commit id missing", nil, fenceJSON(map[string]any{"commit_id": absent}), false},
		{"trace id missing", nil, fenceJSON(map[string]any{"trace_id": absent}), true},
		{"trace id empty", nil, fenceJSON(map[string]any{"trace_id": ""}), true},
		{"trace id null", nil, fenceJSON(map[string]any{"trace_id": nil}), true},
		{"trace id a number", nil, fenceJSON(map[string]any{"trace_id": 7}), false},
		{"accepted_at missing", nil, fenceJSON(map[string]any{"accepted_at": absent}), false},
		{"accepted_at empty", nil, fenceJSON(map[string]any{"accepted_at": ""}), false},
		{"accepted_at a number", nil, fenceJSON(map[string]any{"accepted_at": 1754395200000}), false},
		{"accepted_at without millis", nil, fenceJSON(map[string]any{"accepted_at": "2026-08-05T12:00:00Z"}), false},
		{"accepted_at with offset", nil, fenceJSON(map[string]any{"accepted_at": "2026-08-05T12:00:00.000+00:00"}), false},
		{"accepted_at Feb 30", nil, fenceJSON(map[string]any{"accepted_at": "2026-02-30T12:00:00.000Z"}), false},
		{"accepted_at hour 24", nil, fenceJSON(map[string]any{"accepted_at": "2026-02-28T24:00:00.000Z"}), false},
		{"accepted_at Go zero time", nil, fenceJSON(map[string]any{"accepted_at": "0001-01-01T00:00:00.000Z"}), false},
		{"accepted_at year 0", nil, fenceJSON(map[string]any{"accepted_at": "0000-01-01T00:00:00.000Z"}), true},
		{"accepted_at year 9999", nil, fenceJSON(map[string]any{"accepted_at": "9999-12-31T23:59:59.999Z"}), true},
		{"unknown fence member", nil, fenceJSON(map[string]any{"extra": true}), true},
		// A fence is bound to one write: its document, and a job.
		{"target missing", nil, fenceJSON(map[string]any{"target": absent}), false},
		{"target empty", nil, fenceJSON(map[string]any{"target": ""}), false},
		{"target another document", nil, fenceJSON(map[string]any{"target": "case-0"}), false},
		{"target a number", nil, fenceJSON(map[string]any{"target": 7}), false},
		{"job id missing", nil, fenceJSON(map[string]any{"job_id": absent}), false},
		{"job id empty", nil, fenceJSON(map[string]any{"job_id": ""}), false},
		{"payload digest", nil, fenceJSON(map[string]any{"payload_sha256": strings.Repeat("a", 64)}), true},
		{"payload digest upper case", nil, fenceJSON(map[string]any{"payload_sha256": strings.Repeat("A", 64)}), false},
		{"payload digest short", nil, fenceJSON(map[string]any{"payload_sha256": "ab"}), false},
		{"stored fence of another document, higher token", s5, fenceJSON(map[string]any{"target": "case-1", "fencing_token": 6, "lease_id": "lease-6"}), false},

		// Over a stored fence: same lock key, token not lower, one lease
		// per token.
		{"same lease, a later commit", s5, fenceJSON(map[string]any{"commit_id": "commit-6", "commit_seq": 6}), true},
		{"same lease, other execution", s5, fenceJSON(map[string]any{"execution_id": "exec-x", "commit_seq": 6}), true},
		// A lease's earlier or same commit never lands over its later one.
		{"same lease, the same commit again", s5, fenceJSON(nil), false},
		{"same lease, an earlier commit", s5, fenceJSON(map[string]any{"commit_id": "commit-4", "commit_seq": 4}), false},
		{"commit seq missing", nil, fenceJSON(map[string]any{"commit_seq": absent}), false},
		{"commit seq 0", nil, fenceJSON(map[string]any{"commit_seq": 0}), false},
		{"commit seq fractional", nil, fenceJSON(map[string]any{"commit_seq": 1.5}), false},
		{"commit seq a string", nil, fenceJSON(map[string]any{"commit_seq": "6"}), false},
		{"commit seq 2^53", nil, fenceJSON(map[string]any{"commit_seq": uint64(max + 1)}), false},
		{"higher token", s5, fenceJSON(map[string]any{"fencing_token": 6, "lease_id": "lease-6"}), true},
		{"much higher token", s5, fenceJSON(map[string]any{"fencing_token": max, "lease_id": "lease-max"}), true},
		{"lower token", s5, fenceJSON(map[string]any{"fencing_token": 4, "lease_id": "lease-4"}), false},
		{"lower token, same lease id", s5, fenceJSON(map[string]any{"fencing_token": 4}), false},
		{"token 1 over 5", s5, fenceJSON(map[string]any{"fencing_token": 1, "lease_id": "lease-1"}), false},
		{"equal token, other lease", s5, fenceJSON(map[string]any{"lease_id": "lease-x"}), false},
		{"other lock key, higher token", s5, fenceJSON(map[string]any{"lock_key": fencetest.LockKey("two"), "fencing_token": 9}), false},
		{"other lock key, same token and lease", s5, fenceJSON(map[string]any{"lock_key": fencetest.LockKey("two")}), false},
		{"no fence over a fenced document", s5, absent, false},
		{"null fence over a fenced document", s5, nil, false},
		{"malformed fence over a fenced document", s5, fenceJSON(map[string]any{"fencing_token": 0}), false},
		{"max token again", sMax, fenceJSON(map[string]any{"fencing_token": max, "lease_id": "lease-max", "commit_seq": 6}), true},
		{"below max token", sMax, fenceJSON(map[string]any{"fencing_token": max - 1, "lease_id": "lease-9"}), false},

		// Over a document written before the fence was installed.
		{"fenced write over an unfenced document", noFence, fenceJSON(nil), true},
		{"unfenced write over an unfenced document", noFence, absent, false},
	}

	// Unfenced documents exist only from before the fence.
	for i, c := range cases {
		if c.stored == noFence {
			if code, v := raw(t, http.MethodPut, base+fmt.Sprintf("case-%d", i), map[string]any{"n": 0}); code != 201 {
				t.Fatalf("seed unfenced doc: %d %v", code, v)
			}
		}
	}
	// A malformed stored fence (possible only from before the fence).
	malformed := fenceJSON(map[string]any{"fencing_token": 0})
	if code, v := raw(t, http.MethodPut, base+"malformed", map[string]any{"n": 0, couchdb.FenceField: malformed}); code != 201 {
		t.Fatalf("seed malformed fence: %d %v", code, v)
	}
	// A fence from before writes were bound (no target, no job_id).
	legacy := fenceJSON(map[string]any{"target": absent, "job_id": absent, "commit_seq": absent})
	if code, v := raw(t, http.MethodPut, base+"legacy", map[string]any{"n": 0, couchdb.FenceField: legacy}); code != 201 {
		t.Fatalf("seed legacy fence: %d %v", code, v)
	}
	if err := db.InstallFence(ctx); err != nil {
		t.Fatal(err)
	}
	// It still orders tokens, and a bound fence replaces it; an unbound
	// one is refused even at a higher token.
	_, l := raw(t, http.MethodGet, base+"legacy", nil)
	for _, w := range []struct {
		next   any
		status int
	}{
		{fenceJSON(map[string]any{"target": absent, "job_id": absent, "commit_seq": absent, "fencing_token": 6, "lease_id": "lease-6"}), 403},
		{at(fenceJSON(map[string]any{"fencing_token": 4, "lease_id": "lease-4"}), "legacy"), 403},
		{at(fenceJSON(map[string]any{"fencing_token": 6, "lease_id": "lease-6"}), "legacy"), 201},
	} {
		if status, v := raw(t, http.MethodPut, base+"legacy", map[string]any{"_rev": l["_rev"], "n": 1,
			couchdb.FenceField: w.next}); status != w.status {
			t.Fatalf("write over a legacy fence: %d %v, want %d", status, v, w.status)
		}
	}

	// Over a malformed stored fence every write fails closed: in CouchDB
	// (403) and in Go, where the stored fence does not decode (ErrCorrupt)
	// and fence.Admit is never reached.
	_, m := raw(t, http.MethodGet, base+"malformed", nil)
	if status, v := raw(t, http.MethodPut, base+"malformed", map[string]any{"_rev": m["_rev"], "n": 1,
		couchdb.FenceField: fenceJSON(map[string]any{"fencing_token": 9, "target": "malformed"})}); status != 403 ||
		v["reason"] != "starintel_fence: the stored fence is malformed" {
		t.Fatalf("write over a malformed stored fence: %d %v", status, v)
	}
	if _, err := db.Get(ctx, "malformed"); !errors.Is(err, couchdb.ErrCorrupt) || code(err) != lease.CodeCorrupt {
		t.Fatalf("Get of a malformed fence: %v, want ErrCorrupt", err)
	}

	for i, c := range cases {
		id := fmt.Sprintf("case-%d", i)
		var rev any
		switch {
		case c.stored == noFence:
			_, v := raw(t, http.MethodGet, base+id, nil)
			rev = v["_rev"]
		case c.stored != nil:
			code, v := raw(t, http.MethodPut, base+id, map[string]any{"n": 0, couchdb.FenceField: at(c.stored, id)})
			if code != 201 {
				t.Fatalf("%s: seeding the stored fence: %d %v", c.name, code, v)
			}
			rev = v["rev"]
		}
		doc := map[string]any{"n": 1}
		if rev != nil {
			doc["_rev"] = rev
		}
		if c.next != absent {
			doc[couchdb.FenceField] = at(c.next, id)
		}
		status, v := raw(t, http.MethodPut, base+id, doc)
		var couchOK bool
		switch status {
		case 201:
			couchOK = true
		case 403:
			if v["error"] != "forbidden" {
				t.Fatalf("%s: 403 %v", c.name, v)
			}
		default:
			t.Fatalf("%s: unexpected answer %d %v", c.name, status, v)
		}
		goErr := goVerdict(t, id, at(c.stored, id), at(c.next, id))
		if goErr != nil && code(goErr) != lease.CodeCommitRejected && code(goErr) != lease.CodeConflict {
			t.Fatalf("%s: Admit: %v", c.name, goErr)
		}
		goOK := goErr == nil
		if couchOK != goOK || goOK != c.ok {
			t.Errorf("%s: validate_doc_update ok=%v (%v), fence.Admit ok=%v (%v), want %v",
				c.name, couchOK, v["reason"], goOK, goErr, c.ok)
		}
	}

	// Every refusal above came with one of the function's own reasons.
	for i, c := range cases {
		if c.ok {
			continue
		}
		_, v := raw(t, http.MethodGet, base+fmt.Sprintf("case-%d", i), nil)
		if c.stored == nil && v["error"] != "not_found" {
			t.Errorf("%s: refused first write left a document: %v", c.name, v)
		}
		if c.stored != nil && c.stored != noFence && v["n"] != float64(0) {
			t.Errorf("%s: refused write changed the document: %v", c.name, v)
		}
	}
}

// Deletes never pass the fence: not a DELETE (which carries no fence), not
// a _bulk_docs delete, not even a PUT with _deleted and a valid, admissible
// fence. Design documents are not fenced.
func TestDeletesAreRejected(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	e := newEnv(t, couch)
	ctx := context.Background()
	id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target-del", ActorName: "usernamegen"}
	rec := e.acquire(id, "instance-a")
	states := couchdb.NewTargetStates(e.w)
	g, err := fence.Write(ctx, e.committer(rec), states, "c-1", couchdb.TargetState{Identity: id, Status: couchdb.TargetAccepted})
	if err != nil {
		t.Fatal(err)
	}
	docID, _ := e.db.TargetStateID(id)
	_, cur := e.rawDoc(docID)
	rev := cur["_rev"].(string)

	status, v := raw(t, http.MethodDelete, e.docURL(docID)+"?rev="+url.QueryEscape(rev), nil)
	if status != 403 || v["error"] != "forbidden" || v["reason"] != "starintel_fence: a fenced document cannot be deleted" {
		t.Fatalf("DELETE without a fence: %d %v, want 403", status, v)
	}
	status, v = raw(t, http.MethodPut, e.docURL(docID), map[string]any{"_rev": rev, "_deleted": true})
	if status != 403 || v["error"] != "forbidden" {
		t.Fatalf("PUT _deleted without a fence: %d %v, want 403", status, v)
	}
	status, v = raw(t, http.MethodPut, e.docURL(docID), map[string]any{"_rev": rev, "_deleted": true,
		couchdb.FenceField: guardJSON(t, g)})
	if status != 403 || v["error"] != "forbidden" {
		t.Fatalf("PUT _deleted with a valid fence: %d %v, want 403", status, v)
	}
	status, v = raw(t, http.MethodPost, e.couch.URL()+"/"+e.db.Name()+"/_bulk_docs", map[string]any{
		"docs": []any{map[string]any{"_id": docID, "_rev": rev, "_deleted": true}}})
	list, _ := v["list"].([]any)
	if status != 201 || len(list) != 1 || list[0].(map[string]any)["error"] != "forbidden" {
		t.Fatalf("_bulk_docs delete: %d %v, want a forbidden per-document error", status, v)
	}
	if status, v := e.rawDoc(docID); status != 200 || v["_rev"] != rev {
		t.Fatalf("after the refused deletes: %d %v", status, v)
	}

	// Unfenced writes of new documents are refused too; design documents
	// are not fenced.
	if status, v := raw(t, http.MethodPut, e.docURL("plain"), map[string]any{"x": 1}); status != 403 ||
		v["reason"] != "starintel_fence: the write carries no fence" {
		t.Fatalf("unfenced create: %d %v", status, v)
	}
	if status, v := raw(t, http.MethodPut, e.couch.URL()+"/"+e.db.Name()+"/_design/views",
		map[string]any{"views": map[string]any{}}); status != 201 {
		t.Fatalf("design document: %d %v", status, v)
	}
}
