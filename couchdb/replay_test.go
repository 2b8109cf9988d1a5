package couchdb_test

// Attacks from an adversarial review of the one-write binding: each was a
// hole before the commit seq and the typed-document checks, or a guarantee
// the review attacked and found holding.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// acquireJob acquires id with the given job id.
func (e *env) acquireJob(id lease.Identity, instance, job string) *lease.Record {
	e.t.Helper()
	n := e.seq.Add(1)
	res, err := e.store.Acquire(context.Background(), lease.AcquireRequest{Identity: id,
		ServiceInstanceID: instance, TTL: ttl, MaximumLifetime: time.Hour,
		ExecutionID: fmt.Sprintf("exec-%s-%d", instance, n), JobID: job,
		Mutation: lease.Mutation{RequestID: fmt.Sprintf("req-%d", n), DeadlineAt: e.far(), Caller: actor}})
	if err != nil {
		e.t.Fatalf("acquire: %v", err)
	}
	return res.Lease
}

// At CouchDB point 5 (job checkpoint/terminal state): a job marked
// succeeded is reverted to running by the revoked holder's replay of its
// first checkpoint's commit id, through the typed Jobs writer, after
// Revoke returned.
func TestReplayedCommitDoesNotRollBackAJob(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	id := identity("rev-replay-job")
	rec := e.acquire(id, "instance-a")
	c := e.committer(rec)
	jobs := couchdb.NewJobs(e.w)
	running := couchdb.JobState{JobID: rec.JobID, Identity: id, Status: couchdb.JobRunning}
	done := couchdb.JobState{JobID: rec.JobID, Identity: id, Status: couchdb.JobSucceeded}
	if _, err := fence.Write(ctx, c, fence.Sink[couchdb.JobState](jobs), "ckpt-1", running); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Write(ctx, c, fence.Sink[couchdb.JobState](jobs), "final", done); err != nil {
		t.Fatal(err)
	}
	e.adminEnd(lease.OpRevoke, id, rec)

	_, err := fence.Write(ctx, c, fence.Sink[couchdb.JobState](jobs), "ckpt-1", running)
	st, _, gerr := jobs.Get(ctx, id, rec.JobID)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if err == nil || st.Status != couchdb.JobSucceeded {
		t.Fatalf("revoked holder replayed checkpoint: err=%v, job now %q terminal=%v (want refusal, succeeded kept)",
			err, st.Status, st.Terminal)
	}
}

// The job binding was checked against the body's job_id only, never
// against the document id. A live holder of identity A / job J1 uses the
// generic Writer (a guard for target "job:J2" is authorized: the backend
// treats the target as opaque) to pre-create job J2's document. Jobs.Get
// returns it as J2's (terminal, succeeded) state, and J2's real holder
// (identity B) is locked out forever (the document is bound to A's lock
// key).
func TestForeignJobDocumentRefused(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	idA, idB := identity("rev-job-a"), identity("rev-job-b")
	recA := e.acquireJob(idA, "instance-a", "job-j1")
	cA := e.committer(recA)
	docJ2, err := e.db.JobDocID(idB, "job-j2")
	if err != nil {
		t.Fatal(err)
	}
	forged := couchdb.Doc{ID: docJ2, Body: json.RawMessage(
		`{"type":"starintel.job","job_id":"job-j1","status":"succeeded","terminal":true}`)}
	_, errForge := fence.Write(ctx, cA, fence.Sink[couchdb.Doc](e.w), "forge", forged)

	recB := e.acquireJob(idB, "instance-b", "job-j2")
	jobs := couchdb.NewJobs(e.w)
	_, errB := fence.Write(ctx, e.committer(recB), fence.Sink[couchdb.JobState](jobs), "b-1",
		couchdb.JobState{JobID: "job-j2", Identity: idB, Status: couchdb.JobRunning})
	st, g, _ := jobs.Get(ctx, idB, "job-j2")
	if errForge == nil || errB != nil {
		t.Fatalf("holder of job-j1 wrote job-j2's document: forge err=%v; job-j2's own holder: %v; "+
			"Jobs.Get(job-j2) = status %q terminal=%v job_id %q fence job %q",
			errForge, errB, st.Status, st.Terminal, st.JobID, g.JobID)
	}
}

// The same for target state (point 1): a holder of identity A writes
// identity B's target-state document through the generic Writer; B's
// TargetStates.Get returns the forged state (A's fence) and B's holder is
// locked out.
func TestForeignTargetStateDocumentRefused(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	idA, idB := identity("rev-ts-a"), identity("rev-ts-b")
	recA := e.acquire(idA, "instance-a")
	docB, err := e.db.TargetStateID(idB)
	if err != nil {
		t.Fatal(err)
	}
	bodyB, _ := json.Marshal(map[string]any{"type": couchdb.TypeTargetState, "lock_identity": idB,
		"status": "completed", "reason": "forged by another identity's holder"})
	_, errForge := fence.Write(ctx, e.committer(recA), fence.Sink[couchdb.Doc](e.w), "forge",
		couchdb.Doc{ID: docB, Body: bodyB})

	states := couchdb.NewTargetStates(e.w)
	recB := e.acquire(idB, "instance-b")
	_, errB := fence.Write(ctx, e.committer(recB), fence.Sink[couchdb.TargetState](states), "b-1",
		couchdb.TargetState{Identity: idB, Status: couchdb.TargetAccepted})
	st, g, gerr := states.Get(ctx, idB)
	if errForge == nil || errB != nil {
		t.Fatalf("holder of A wrote B's target state: forge err=%v; B's holder: %v; Get(B) = %q (%v) fence lock key of A: %v",
			errForge, errB, st.Status, gerr, g != nil && g.LockKey == recA.LockKey)
	}
}

// validate_doc_update admitted any write that carries the document's
// stored fence again (equal token, same lease). A client with ordinary
// write access and no lease at all changes a fenced document after the
// holder was revoked: (a) a PUT with the stored fence copied verbatim and
// another body, (b) an attachment PUT (CouchDB hands the VDU the old
// document, stored fence included).
func TestStoredFenceNotReusableByRawWrite(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	id := identity("rev-raw")
	rec := e.acquire(id, "instance-a")
	if _, err := fence.Write(ctx, e.committer(rec), fence.Sink[couchdb.Doc](e.w), "c-1",
		couchdb.Doc{ID: "result-x", Body: json.RawMessage(`{"verdict":"clean"}`)}); err != nil {
		t.Fatal(err)
	}
	e.adminEnd(lease.OpRevoke, id, rec)

	_, cur := e.rawDoc("result-x")
	cur["verdict"] = "owned"
	stA, respA := raw(t, http.MethodPut, e.docURL("result-x"), cur)

	_, cur = e.rawDoc("result-x")
	req, _ := http.NewRequest(http.MethodPut, e.docURL("result-x")+"/evil.txt?rev="+cur["_rev"].(string),
		bytes.NewReader([]byte("attacker bytes")))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if stA < 300 || resp.StatusCode < 300 {
		t.Fatalf("after revoke, a raw write reusing the stored fence: body swap %d %v; attachment %d",
			stA, respA, resp.StatusCode)
	}
}

// the guard's target is compared with the document id byte for
// byte on both sides; a POST without id, a _bulk_docs write under another
// id, and a NFD/NFC twin of the id are refused by validate_doc_update.
func TestTargetIsTheDocID(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	id := identity("rev-target")
	rec := e.acquire(id, "instance-a")
	c := e.committer(rec)
	nfc := "caf\u00e9"
	nfd := "cafe\u0301"
	b, err := e.w.Bind(couchdb.Doc{ID: nfc, Body: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := c.Authorize(ctx, sinkName, "c-nfc", b)
	if err != nil {
		t.Fatal(err)
	}
	g := guardJSON(t, c.Guard(cm))
	if err := e.w.Commit(ctx, c.Guard(cm), couchdb.Doc{ID: nfd, Body: json.RawMessage(`{}`)}); code(err) != lease.CodeCommitRejected {
		t.Errorf("writer, NFD twin: %v", err)
	}
	if st, _ := raw(t, http.MethodPut, e.docURL(nfd), map[string]any{"starintel_fence": g}); st != http.StatusForbidden {
		t.Errorf("raw PUT of the NFD twin: %d", st)
	}
	if st, _ := raw(t, http.MethodPost, e.couch.URL()+"/"+e.db.Name(), map[string]any{"starintel_fence": g}); st != http.StatusForbidden {
		t.Errorf("POST without id: %d", st)
	}
	st, v := raw(t, http.MethodPost, e.couch.URL()+"/"+e.db.Name()+"/_bulk_docs",
		map[string]any{"docs": []any{map[string]any{"_id": "other", "starintel_fence": g}}})
	if l, _ := v["list"].([]any); st >= 300 || len(l) != 1 || l[0].(map[string]any)["error"] != "forbidden" {
		t.Errorf("_bulk_docs under another id: %d %v", st, v)
	}
}

// HELD on pouchdb-server (documented limit for CouchDB): _bulk_docs with new_edits=false. The package
// doc says the validator still runs, against the revision's own ancestor.
// This checks (a) a revision with no fence at all, (b) a stale holder's
// lower-token fence as a new branch that wins over the successor's write.
func TestNewEditsFalseStaysFenced(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	id := identity("rev-newedits")
	recA := e.acquire(id, "instance-a")
	cA := e.committer(recA)
	gA, err := fence.Write(ctx, cA, fence.Sink[couchdb.Doc](e.w), "a-1",
		couchdb.Doc{ID: "doc-x", Body: json.RawMessage(`{"v":"a"}`)})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Add(ttl + time.Second)
	recB := e.acquire(id, "instance-b")
	if _, err := fence.Write(ctx, e.committer(recB), fence.Sink[couchdb.Doc](e.w), "b-1",
		couchdb.Doc{ID: "doc-x", Body: json.RawMessage(`{"v":"b"}`)}); err != nil {
		t.Fatal(err)
	}
	bulk := e.couch.URL() + "/" + e.db.Name() + "/_bulk_docs"
	st1, v1 := raw(t, http.MethodPost, bulk, map[string]any{"new_edits": false, "docs": []any{
		map[string]any{"_id": "doc-y", "_rev": "1-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "v": "unfenced"}}})
	st2, v2 := raw(t, http.MethodPost, bulk, map[string]any{"new_edits": false, "docs": []any{
		map[string]any{"_id": "doc-x", "_rev": "99-ffffffffffffffffffffffffffffffff", "v": "stale-a",
			"starintel_fence": guardJSON(t, gA)}}})
	_, cur := e.rawDoc("doc-x")
	_, y := e.rawDoc("doc-y")
	t.Logf("unfenced new_edits=false: %d %v; doc-y=%v", st1, v1, y)
	t.Logf("stale branch: %d %v; doc-x winner v=%v rev=%v", st2, v2, cur["v"], cur["_rev"])
	if cur["v"] != "b" || y["v"] == "unfenced" {
		t.Errorf("new_edits=false bypass: doc-x reads %v, doc-y %v", cur["v"], y["v"])
	}
}

// The database's own check of typed documents, for a writer that bypasses
// the typed sinks: a live holder of identity A / job J1 gets real guards
// authorized for other identities' and jobs' document ids (the backend
// treats a target as opaque) and PUTs them raw. validate_doc_update
// recomputes the lock key of the document's lock_identity and refuses
// every one; the holder's own typed documents pass the same check.
func TestValidateRefusesForeignTypedDocuments(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	idA, idB := identity("raw-typed-a"), identity("raw-typed-b")
	recA := e.acquireJob(idA, "instance-a", "job-a")
	cA := e.committer(recA)
	n := 0
	put := func(docID string, body map[string]any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		n++
		c, err := cA.Authorize(ctx, sinkName, fmt.Sprintf("raw-%d", n), fence.Binding{Target: docID})
		if err != nil {
			t.Fatal(err)
		}
		doc := map[string]any{}
		_ = json.Unmarshal(b, &doc)
		doc[couchdb.FenceField] = cA.Guard(c)
		return raw(t, http.MethodPut, e.docURL(docID), doc)
	}
	stateID := func(id lease.Identity) string { d, _ := e.db.TargetStateID(id); return d }
	jobID := func(id lease.Identity, job string) string { d, _ := e.db.JobDocID(id, job); return d }
	for _, tc := range []struct {
		name  string
		docID string
		body  map[string]any
		want  string
	}{
		{"another identity's target state", stateID(idB),
			map[string]any{"type": couchdb.TypeTargetState, "lock_identity": idB, "status": "completed"},
			"the document belongs to another lock identity"},
		{"another identity's target state, own identity in the body", stateID(idB),
			map[string]any{"type": couchdb.TypeTargetState, "lock_identity": idA, "status": "completed"},
			"the document id does not match its content"},
		{"another job's document", jobID(idA, "job-b"),
			map[string]any{"type": couchdb.TypeJob, "job_id": "job-b", "lock_identity": idA, "status": "succeeded"},
			"the fence was issued for another job"},
		{"another job's document under the own job id", jobID(idA, "job-b"),
			map[string]any{"type": couchdb.TypeJob, "job_id": "job-a", "lock_identity": idA, "status": "succeeded"},
			"the document id does not match its content"},
		{"another identity's document of the own job id", jobID(idB, "job-a"),
			map[string]any{"type": couchdb.TypeJob, "job_id": "job-a", "lock_identity": idB, "status": "succeeded"},
			"the document belongs to another lock identity"},
		{"another identity's document of the own job id, own identity in the body", jobID(idB, "job-a"),
			map[string]any{"type": couchdb.TypeJob, "job_id": "job-a", "lock_identity": idA, "status": "succeeded"},
			"the document id does not match its content"},
		{"the old form job:<job_id>", "job:job-a",
			map[string]any{"type": couchdb.TypeJob, "job_id": "job-a", "lock_identity": idA, "status": "succeeded"},
			"the document id does not match its content"},
		{"a job document without its type", jobID(idA, "job-a"),
			map[string]any{"job_id": "job-a", "lock_identity": idA, "status": "succeeded"},
			"a typed document needs its exact type and id"},
		{"a job type in other case", jobID(idA, "job-a"),
			map[string]any{"type": "StarIntel.Job", "job_id": "job-a", "lock_identity": idA, "status": "succeeded"},
			"a typed document needs its exact type and id"},
		{"a typed body under an untyped id", "plain-doc",
			map[string]any{"type": couchdb.TypeTargetState, "lock_identity": idA, "status": "completed"},
			"a typed document needs its exact type and id"},
		{"a result of another identity", "result:" + stateID(idB)[len("target:"):] + "~ports",
			map[string]any{"type": couchdb.TypeResult, "lock_identity": idB, "name": "ports", "data": 1},
			"the document belongs to another lock identity"},
	} {
		status, v := put(tc.docID, tc.body)
		if status != http.StatusForbidden || v["reason"] != "starintel_fence: "+tc.want {
			t.Errorf("%s: %d %v, want 403 %q", tc.name, status, v, tc.want)
		}
	}
	// The holder's own documents pass the same check (the JavaScript
	// lock key agrees with Go's), including through a raw PUT.
	if status, v := put(stateID(idA),
		map[string]any{"type": couchdb.TypeTargetState, "lock_identity": idA, "status": "accepted"}); status != http.StatusCreated {
		t.Fatalf("own target state: %d %v", status, v)
	}
	if status, v := put(jobID(idA, "job-a"),
		map[string]any{"type": couchdb.TypeJob, "job_id": "job-a", "lock_identity": idA, "status": "running"}); status != http.StatusCreated {
		t.Fatalf("own job: %d %v", status, v)
	}
	// A fence is not authenticated (a raw writer can edit one), so the
	// job id is checked as an opaque id too: one holding "~" would make
	// the id ambiguous.
	c, err := cA.Authorize(ctx, sinkName, "raw-tilde", fence.Binding{Target: jobID(idA, "job-a") + "~x"})
	if err != nil {
		t.Fatal(err)
	}
	g := guardJSON(t, cA.Guard(c))
	g["job_id"] = "job-a~x"
	if status, v := raw(t, http.MethodPut, e.docURL(jobID(idA, "job-a")+"~x"), map[string]any{"type": couchdb.TypeJob,
		"job_id": "job-a~x", "lock_identity": idA, "status": "running", couchdb.FenceField: g}); status != http.StatusForbidden ||
		v["reason"] != "starintel_fence: the document id does not match its content" {
		t.Fatalf("job id with ~: %d %v", status, v)
	}
}

// The JavaScript lock-key function agrees with lease.CanonicalLockKey on
// identities beyond ASCII: each holder's typed write is admitted, which
// needs validate_doc_update to compute exactly Go's lock key.
func TestValidateLockKeyAgreesWithGo(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	states := couchdb.NewTargetStates(e.w)
	long := strings.Repeat("x", 200) + strings.Repeat("é", 28) // 256 bytes
	for _, target := range []string{"a", "example.com", "ünïcödé.example", "例え.テスト", "target:with:colons_and-dashes.1",
		"𝔘𝔫𝔦𝔠𝔬𝔡𝔢", long} {
		id := identity(target)
		c, key, err := lease.CanonicalLockKey(id, lease.DefaultOperationClasses())
		if err != nil {
			t.Fatalf("%q: %v", target, err)
		}
		rec := e.acquire(c, "instance-"+fmt.Sprint(len(target)))
		if rec.LockKey != key {
			t.Fatalf("lock key %q, want %q", rec.LockKey, key)
		}
		if _, err := fence.Write(ctx, e.committer(rec), states, "state-"+key[len(key)-8:],
			couchdb.TargetState{Identity: c, Status: couchdb.TargetAccepted}); err != nil {
			t.Errorf("%q: the holder's own target state was refused: %v", target, err)
		}
	}
}
