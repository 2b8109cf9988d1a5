package couchdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// withTransport opens e's database again through a counting transport.
func (e *env) withTransport(ct *countingTransport) *couchdb.Writer {
	e.t.Helper()
	db := e.openDB(e.db.Name(), couchdb.WithHTTPClient(&http.Client{Transport: ct}))
	w, err := db.Writer(sinkName)
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// A 409 — another write changed the document between the writer's read and
// its PUT — is a typed ErrConflict (lease_conflict), sent once and not
// retried, and not reported as lease loss. Repeating fence.Write with the
// same commit id re-reads and succeeds.
func TestConflictIsTypedAndNotRetried(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	e := newEnv(t, couch)
	ctx := context.Background()
	id := identity("target-conflict")
	rec := e.acquire(id, "instance-a")
	var loss fencetest.LossRecorder
	c := e.committer(rec, fence.WithLossHandler(loss.Handler))
	states := couchdb.NewTargetStates(e.w)
	if _, err := fence.Write(ctx, c, states, "c-1", couchdb.TargetState{Identity: id, Status: couchdb.TargetAccepted}); err != nil {
		t.Fatal(err)
	}

	// The concurrent write lands right before the writer's PUT: the same
	// lease, through another writer.
	ct := &countingTransport{}
	var once sync.Once
	var gOther fence.Guard
	ct.beforePut = func(*http.Request) {
		once.Do(func() {
			var err error
			gOther, err = fence.Write(ctx, c, states, "c-other", couchdb.TargetState{Identity: id, Status: couchdb.TargetRunning})
			if err != nil {
				t.Errorf("concurrent write: %v", err)
			}
		})
	}
	hooked := couchdb.NewTargetStates(e.withTransport(ct))
	want := couchdb.TargetState{Identity: id, Status: couchdb.TargetCompleted}
	_, err := fence.Write(ctx, c, hooked, "c-2", want)
	var ce *couchdb.Error
	// CouchDB answers 409 (stale _rev), or the fence refuses c-2 first:
	// the concurrent write is a later commit of the same lease. Either
	// way a typed conflict, not a loss.
	if !errors.As(err, &ce) || !errors.Is(err, couchdb.ErrConflict) ||
		(ce.Status != http.StatusConflict && ce.Status != http.StatusForbidden) || code(err) != lease.CodeConflict {
		t.Fatalf("write over a concurrent write: %v, want a typed conflict", err)
	}
	if n := ct.count(http.MethodPut); n != 1 {
		t.Fatalf("the writer sent %d PUTs, want 1 (no retry)", n)
	}
	if got := loss.Seen(); len(got) != 0 {
		t.Fatalf("a 409 reached the loss handler: %v", got)
	}
	got, g, err := states.Get(ctx, id)
	if err != nil || got.Status != couchdb.TargetRunning || g == nil || *g != gOther {
		t.Fatalf("document after the conflict: %+v %+v %v, want the concurrent write", got, g, err)
	}

	// Repeating c-2 would put an earlier commit of the lease over a later
	// one: refused, a conflict again. The caller writes anew: a new commit
	// id, re-read, accepted.
	ct.beforePut = nil
	if _, err := fence.Write(ctx, c, hooked, "c-2", want); !errors.Is(err, couchdb.ErrConflict) || code(err) != lease.CodeConflict {
		t.Fatalf("repeat of the earlier commit over the later one: %v, want a typed conflict", err)
	}
	g2, err := fence.Write(ctx, c, hooked, "c-3", want)
	if err != nil {
		t.Fatalf("a new write after the conflict: %v", err)
	}
	got, g, err = states.Get(ctx, id)
	if err != nil || got.Status != couchdb.TargetCompleted || *g != g2 {
		t.Fatalf("document after the repeat: %+v %+v %v", got, g, err)
	}
}

// A PUT that was sent and got no answer is ErrOutcomeUnknown; repeating
// fence.Write with the same commit id finds the write landed and succeeds
// without writing again. A PUT that was never sent is ErrUnavailable.
func TestUnknownOutcomeAndUnavailable(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	e := newEnv(t, couch)
	ctx := context.Background()
	id := identity("target-unknown")
	rec := e.acquire(id, "instance-a")
	c := e.committer(rec)

	ct := &countingTransport{afterPut: errors.New("connection reset after the request was sent")}
	jobs := couchdb.NewJobs(e.withTransport(ct))
	st := couchdb.JobState{JobID: rec.JobID, Identity: id, Status: couchdb.JobSucceeded, Checkpoint: json.RawMessage(`{"offset":9}`)}
	g, err := fence.Write(ctx, c, jobs, "c-1", st)
	if !errors.Is(err, couchdb.ErrOutcomeUnknown) || code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("lost answer: %v, want outcome_unknown", err)
	}
	ct.afterPut = nil
	g2, err := fence.Write(ctx, c, jobs, "c-1", st)
	if err != nil || g2 != g {
		t.Fatalf("repeat with the same commit id: %v (guards %+v, %+v)", err, g, g2)
	}
	if n := ct.count(http.MethodPut); n != 1 {
		t.Fatalf("%d PUTs, want 1: the repeat must find the landed write", n)
	}
	got, fg, err := couchdb.NewJobs(e.w).Get(ctx, id, rec.JobID)
	if err != nil || !got.Terminal || got.Status != couchdb.JobSucceeded || *fg != g {
		t.Fatalf("job document %+v %+v %v", got, fg, err)
	}
	jobDoc, _ := e.db.JobDocID(id, rec.JobID)
	_, v := e.rawDoc(jobDoc)
	if !strings.HasPrefix(v["_rev"].(string), "1-") {
		t.Fatalf("job document revision %v, want one write", v["_rev"])
	}
	// The same guard with another body is not a repeat: the guard was
	// issued for the first body only.
	other := st
	other.Status = couchdb.JobFailed
	if err := jobs.Commit(ctx, g, other); !errors.Is(err, couchdb.ErrFenceRejected) || code(err) != lease.CodeCommitRejected {
		t.Fatalf("same guard, other body: %v, want commit_rejected", err)
	}
	// Nor through authorization: the commit id names the first write.
	if _, err := fence.Write(ctx, c, jobs, "c-1", other); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("same commit id, other body: %v, want idempotency_conflict", err)
	}

	// A client timeout after the PUT was sent: outcome unknown too.
	hangs := &countingTransport{hangAfterPut: true}
	slow := e.openDB(e.db.Name(), couchdb.WithHTTPClient(&http.Client{Transport: hangs, Timeout: 300 * time.Millisecond}))
	slowJobs := couchdb.NewJobs(mustWriter(t, slow, sinkName))
	st2 := couchdb.JobState{JobID: rec.JobID, Identity: id, Status: couchdb.JobRunning}
	if _, err := fence.Write(ctx, c, slowJobs, "c-3", st2); !errors.Is(err, couchdb.ErrOutcomeUnknown) {
		t.Fatalf("timeout after sending: %v, want outcome_unknown", err)
	}
	if _, err := fence.Write(ctx, c, jobs, "c-3", st2); err != nil {
		t.Fatalf("repeat after the timeout: %v", err)
	}

	// Nothing sent (the connection could not be made): unavailable.
	ct.failPut = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	_, err = fence.Write(ctx, c, jobs, "c-2", couchdb.JobState{JobID: rec.JobID, Identity: id, Status: couchdb.JobRunning})
	if !errors.Is(err, couchdb.ErrUnavailable) || code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("dial failure: %v, want backend_unavailable", err)
	}
	// A server that is not there at all.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	gone, err := couchdb.New("http://"+addr, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	gw, _ := gone.Writer(sinkName)
	if _, err := fence.Write(ctx, c, gw, "c-gone", couchdb.Doc{ID: "x"}); !errors.Is(err, couchdb.ErrUnavailable) {
		t.Fatalf("no server: %v, want ErrUnavailable", err)
	}
}

// The writer never writes without a guard for its sink and for the
// document's identity, and never to a database without the fence.
func TestWriterRefusals(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	e := newEnv(t, couch)
	ctx := context.Background()
	id := identity("target-refusals")
	rec := e.acquire(id, "instance-a")
	c := e.committer(rec)
	states := couchdb.NewTargetStates(e.w)
	st := couchdb.TargetState{Identity: id, Status: couchdb.TargetAccepted}
	bound, err := states.Bind(st)
	if err != nil {
		t.Fatal(err)
	}
	commit, err := c.Authorize(ctx, sinkName, "c-1", bound)
	if err != nil {
		t.Fatal(err)
	}
	g := c.Guard(commit)

	ct := &countingTransport{}
	w := e.withTransport(ct)
	for _, tc := range []struct {
		name string
		err  error
		kind error
		code lease.Code
	}{
		{"no guard", w.Commit(ctx, fence.Guard{}, couchdb.Doc{ID: "d"}), couchdb.ErrFenceRejected, lease.CodeCommitRejected},
		{"guard for another sink", couchdb.NewTargetStates(mustWriter(t, w.DB(), "rabbitmq")).Commit(ctx, g, st),
			couchdb.ErrFenceRejected, lease.CodeCommitRejected},
		{"guard for another identity", couchdb.NewTargetStates(w).Commit(ctx, g,
			couchdb.TargetState{Identity: identity("target-other"), Status: couchdb.TargetAccepted}),
			couchdb.ErrInvalid, lease.CodeInvalidRequest},
		{"reserved body member", w.Commit(ctx, g, couchdb.Doc{ID: "d", Body: json.RawMessage(`{"_rev":"1-x"}`)}),
			couchdb.ErrInvalid, lease.CodeInvalidRequest},
		{"body carries a fence", w.Commit(ctx, g, couchdb.Doc{ID: "d", Body: json.RawMessage(`{"starintel_fence":{}}`)}),
			couchdb.ErrInvalid, lease.CodeInvalidRequest},
		{"body not an object", w.Commit(ctx, g, couchdb.Doc{ID: "d", Body: json.RawMessage(`[1]`)}),
			couchdb.ErrInvalid, lease.CodeInvalidRequest},
		{"design doc id", w.Commit(ctx, g, couchdb.Doc{ID: "_design/x"}), couchdb.ErrInvalid, lease.CodeInvalidRequest},
		{"bad status", couchdb.NewTargetStates(w).Commit(ctx, g, couchdb.TargetState{Identity: id, Status: "Bad Status"}),
			couchdb.ErrInvalid, lease.CodeInvalidRequest},
	} {
		if !errors.Is(tc.err, tc.kind) || code(tc.err) != tc.code {
			t.Errorf("%s: %v, want %v (%s)", tc.name, tc.err, tc.kind, tc.code)
		}
	}
	if n := ct.count(http.MethodPut) + ct.count(http.MethodGet); n != 0 {
		t.Fatalf("refused writes sent %d requests", n)
	}

	// A database without the fence: refused before any write.
	bare := e.openDB("unfenced", couchdb.WithHTTPClient(&http.Client{Transport: ct}))
	if err := bare.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	bw, _ := bare.Writer(sinkName)
	unfenced := couchdb.Doc{ID: "d"}
	uw, err := bw.Bind(unfenced)
	if err != nil {
		t.Fatal(err)
	}
	ug, err := c.Authorize(ctx, sinkName, "c-unfenced", uw)
	if err != nil {
		t.Fatal(err)
	}
	if err := bw.Commit(ctx, c.Guard(ug), unfenced); !errors.Is(err, couchdb.ErrFenceMissing) ||
		code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("write to an unfenced database: %v, want ErrFenceMissing", err)
	}
	if n := ct.count(http.MethodPut); n != 1 { // EnsureDatabase's only
		t.Fatalf("%d PUTs, want only EnsureDatabase's", n)
	}
	// The identity-bound write goes through.
	if err := states.Commit(ctx, g, st); err != nil {
		t.Fatal(err)
	}
}

func mustWriter(t *testing.T, db *couchdb.DB, name string) *couchdb.Writer {
	t.Helper()
	w, err := db.Writer(name)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// InstallFence writes only when the function differs; EnsureDatabase
// accepts an existing database.
func TestInstallFenceIsIdempotent(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	e := newEnv(t, couch)
	ctx := context.Background()
	design := e.couch.URL() + "/" + e.db.Name() + "/" + couchdb.FenceDesignDocID
	_, v := raw(t, http.MethodGet, design, nil)
	rev1 := v["_rev"]
	if v["validate_doc_update"] != couchdb.ValidateDocUpdate || v["language"] != "javascript" {
		t.Fatalf("design document %v", v)
	}
	if err := e.db.EnsureDatabase(ctx); err != nil {
		t.Fatalf("EnsureDatabase on an existing database: %v", err)
	}
	if err := e.db.InstallFence(ctx); err != nil {
		t.Fatal(err)
	}
	if _, v := raw(t, http.MethodGet, design, nil); v["_rev"] != rev1 {
		t.Fatalf("InstallFence rewrote an identical fence: %v -> %v", rev1, v["_rev"])
	}
	// An outdated function is replaced; CheckFence sees the difference.
	v["validate_doc_update"] = "function (newDoc) {}"
	if status, r := raw(t, http.MethodPut, design, v); status != 201 {
		t.Fatalf("%d %v", status, r)
	}
	if err := e.db.CheckFence(ctx); !errors.Is(err, couchdb.ErrFenceMissing) {
		t.Fatalf("CheckFence with an outdated function: %v", err)
	}
	if err := e.db.InstallFence(ctx); err != nil {
		t.Fatal(err)
	}
	if _, v := raw(t, http.MethodGet, design, nil); v["validate_doc_update"] != couchdb.ValidateDocUpdate {
		t.Fatalf("fence not updated: %v", v)
	}
	if err := e.db.CheckFence(ctx); err != nil {
		t.Fatal(err)
	}
}

// Basic-auth credentials come from the option, reach the server, and never
// appear in an error.
func TestBasicAuth(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	const user, password = "starlease-admin", "pw-Secret-123"
	if status, v := raw(t, http.MethodPut, couch.URL()+"/_config/admins/"+user, password); status != 200 {
		t.Fatalf("create admin: %d %v", status, v)
	}
	ctx := context.Background()
	authed, err := couchdb.New(couch.URL(), "authed", couchdb.WithBasicAuth(user, password))
	if err != nil {
		t.Fatal(err)
	}
	if err := authed.EnsureDatabase(ctx); err != nil {
		t.Fatalf("EnsureDatabase as admin: %v", err)
	}
	if err := authed.InstallFence(ctx); err != nil {
		t.Fatalf("InstallFence as admin: %v", err)
	}
	// A second database, created by the admin: without credentials its
	// fence cannot be installed (design documents need an admin); with a
	// wrong password nothing can be read.
	second, err := couchdb.New(couch.URL(), "authed-2", couchdb.WithBasicAuth(user, password))
	if err != nil {
		t.Fatal(err)
	}
	if err := second.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]couchdb.Option{nil, {couchdb.WithBasicAuth(user, "wrong-"+password)}} {
		db, err := couchdb.New(couch.URL(), "authed-2", opts...)
		if err != nil {
			t.Fatal(err)
		}
		err = db.InstallFence(ctx)
		if !errors.Is(err, couchdb.ErrAccessDenied) || code(err) != lease.CodeAccessDenied {
			t.Fatalf("InstallFence with credentials %v: %v, want access_denied", len(opts) > 0, err)
		}
		if strings.Contains(err.Error(), password) {
			t.Fatalf("error text holds the password: %v", err)
		}
	}
	if err := second.InstallFence(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := couchdb.New("http://"+user+":"+password+"@127.0.0.1:1", "x"); err == nil ||
		strings.Contains(err.Error(), password) {
		t.Fatalf("credentials in the URL: %v, want refused without echoing them", err)
	}
}

// Document ids come from the canonical identity: raw identities that
// normalize alike share one id; ":" inside a component cannot collide.
func TestDocIDs(t *testing.T) {
	db, err := couchdb.New("http://127.0.0.1:1", "x")
	if err != nil {
		t.Fatal(err)
	}
	raw := lease.Identity{TenantID: " Tenant-Main", ProgramID: "PROGRAM-A", TargetNamespace: "starintel-target",
		TargetID: "Target-1", ActorName: "usernamegen"}
	a, err := db.TargetStateID(raw)
	if err != nil {
		t.Fatal(err)
	}
	if want := "target:tenant-main~program-a~starintel-target~target-1~usernamegen~default~default"; a != want {
		t.Fatalf("TargetStateID %q, want %q", a, want)
	}
	x := identity("a:b")
	x.ActorName = "c"
	y := identity("a")
	y.ActorName = "b:c"
	ix, _ := db.ScheduleID(x)
	iy, _ := db.ScheduleID(y)
	if ix == iy {
		t.Fatalf("distinct identities share id %q", ix)
	}
	if r, _ := db.ResultID(raw, "ports"); r != "result:tenant-main~program-a~starintel-target~target-1~usernamegen~default~default~ports" {
		t.Fatalf("ResultID %q", r)
	}
	if _, err := db.ResultID(raw, "Ports"); code(err) != lease.CodeInvalidRequest {
		t.Fatalf("non-canonical result name: %v", err)
	}
	if _, err := db.TargetStateID(lease.Identity{TenantID: "a/b"}); code(err) != lease.CodeInvalidRequest {
		t.Fatalf("raw path syntax: %v", err)
	}
	// A job document carries the canonical identity: the same job id
	// under another identity (another tenant) is another document.
	if j, err := db.JobDocID(raw, "job_01ABC"); err != nil ||
		j != "job:tenant-main~program-a~starintel-target~target-1~usernamegen~default~default~job_01ABC" {
		t.Fatalf("JobDocID %q %v", j, err)
	}
	other := raw
	other.TenantID = "tenant-evil"
	j1, _ := db.JobDocID(raw, "job-1")
	j2, _ := db.JobDocID(other, "job-1")
	if j1 == "" || j1 == j2 {
		t.Fatalf("one job id under two tenants: ids %q and %q", j1, j2)
	}
	// ":" may appear in a job id and in a component; "~" in neither, so
	// the id still names one identity and one job.
	jx, _ := db.JobDocID(x, "j:1")
	jy, _ := db.JobDocID(y, "j:1")
	if jx == jy {
		t.Fatalf("distinct identities share job id %q", jx)
	}
	for _, bad := range []string{"../x", "a~b", "", "~"} {
		if _, err := db.JobDocID(raw, bad); code(err) != lease.CodeInvalidRequest {
			t.Fatalf("bad job id %q: %v", bad, err)
		}
	}
	if _, err := db.JobDocID(lease.Identity{TenantID: "a/b"}, "job-1"); code(err) != lease.CodeInvalidRequest {
		t.Fatalf("job id under a raw identity: %v", err)
	}
	for _, bad := range []string{"", "https://u:p@host", "ftp://host", "http://host?x=1"} {
		if _, err := couchdb.New(bad, "x"); !errors.Is(err, couchdb.ErrInvalid) {
			t.Errorf("New(%q): %v", bad, err)
		}
	}
	for _, bad := range []string{"", "Upper", "_users", "1abc"} {
		if _, err := couchdb.New("http://h", bad); !errors.Is(err, couchdb.ErrInvalid) {
			t.Errorf("New(db %q): %v", bad, err)
		}
	}
	if _, err := db.Writer("Not Canonical"); !errors.Is(err, couchdb.ErrInvalid) {
		t.Fatalf("bad sink name: %v", err)
	}
}
