package couchdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// identity is a canonical lock identity (already normalized, so payloads
// read back unchanged).
func identity(target string) lease.Identity {
	return lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: target, ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
}

// point is one enforcement point seen generically by the tests.
type point struct {
	name  string
	docID func(e *env, id lease.Identity) string
	// write commits the payload labelled label through fence.Write.
	write func(ctx context.Context, e *env, c *fence.Committer, id lease.Identity, commitID, label string) (fence.Guard, error)
	// direct hands the payload straight to the sink with g, bypassing
	// authorization (a stale holder replaying or late-using a guard).
	direct func(ctx context.Context, e *env, g fence.Guard, id lease.Identity, label string) error
	// bind is the binding of the write of the payload labelled label.
	bind func(e *env, id lease.Identity, label string) (fence.Binding, error)
	// read reads the typed document back; want is what a write of label
	// reads back as.
	read func(ctx context.Context, e *env, id lease.Identity) (any, *fence.Guard, error)
	want func(id lease.Identity, label string) any
}

func mkPoint[P any](name string, sink func(w *couchdb.Writer) fence.Sink[P],
	payload func(id lease.Identity, label string) P,
	read func(ctx context.Context, sink fence.Sink[P], id lease.Identity) (P, *fence.Guard, error),
	docID func(e *env, id lease.Identity) string) point {
	return point{
		name:  name,
		docID: docID,
		write: func(ctx context.Context, e *env, c *fence.Committer, id lease.Identity, commitID, label string) (fence.Guard, error) {
			return fence.Write(ctx, c, sink(e.w), commitID, payload(id, label))
		},
		direct: func(ctx context.Context, e *env, g fence.Guard, id lease.Identity, label string) error {
			return sink(e.w).Commit(ctx, g, payload(id, label))
		},
		bind: func(e *env, id lease.Identity, label string) (fence.Binding, error) {
			return sink(e.w).Bind(payload(id, label))
		},
		read: func(ctx context.Context, e *env, id lease.Identity) (any, *fence.Guard, error) {
			return read(ctx, sink(e.w), id)
		},
		want: func(id lease.Identity, label string) any { return payload(id, label) },
	}
}

func jsonOf(v string) json.RawMessage { return json.RawMessage(v) }

func points() []point {
	next := lease.At(time.Date(2026, 8, 5, 13, 0, 0, 0, time.UTC))
	return []point{
		mkPoint("1_target_state",
			func(w *couchdb.Writer) fence.Sink[couchdb.TargetState] { return couchdb.NewTargetStates(w) },
			func(id lease.Identity, label string) couchdb.TargetState {
				return couchdb.TargetState{Identity: id, Status: couchdb.TargetAccepted, Reason: label,
					Data: jsonOf(`{"by":"` + label + `"}`)}
			},
			func(ctx context.Context, s fence.Sink[couchdb.TargetState], id lease.Identity) (couchdb.TargetState, *fence.Guard, error) {
				return s.(*couchdb.TargetStates).Get(ctx, id)
			},
			func(e *env, id lease.Identity) string { d, _ := e.db.TargetStateID(id); return d }),
		mkPoint("2_result",
			func(w *couchdb.Writer) fence.Sink[couchdb.Result] { return couchdb.NewResults(w) },
			func(id lease.Identity, label string) couchdb.Result {
				return couchdb.Result{Identity: id, Name: "ports", ContentType: "application/json",
					Data: jsonOf(`{"by":"` + label + `","open":[22,80]}`)}
			},
			func(ctx context.Context, s fence.Sink[couchdb.Result], id lease.Identity) (couchdb.Result, *fence.Guard, error) {
				return s.(*couchdb.Results).Get(ctx, id, "ports")
			},
			func(e *env, id lease.Identity) string { d, _ := e.db.ResultID(id, "ports"); return d }),
		mkPoint("4_schedule",
			func(w *couchdb.Writer) fence.Sink[couchdb.ScheduleState] { return couchdb.NewSchedules(w) },
			func(id lease.Identity, label string) couchdb.ScheduleState {
				return couchdb.ScheduleState{Identity: id, Status: couchdb.ScheduleRescheduled, NextRunAt: &next,
					Attempt: 2, Reason: label}
			},
			func(ctx context.Context, s fence.Sink[couchdb.ScheduleState], id lease.Identity) (couchdb.ScheduleState, *fence.Guard, error) {
				return s.(*couchdb.Schedules).Get(ctx, id)
			},
			func(e *env, id lease.Identity) string { d, _ := e.db.ScheduleID(id); return d }),
		mkPoint("5_job",
			func(w *couchdb.Writer) fence.Sink[couchdb.JobState] { return couchdb.NewJobs(w) },
			func(id lease.Identity, label string) couchdb.JobState {
				// The lease's own job (env.acquire's): a guard writes no other.
				return couchdb.JobState{JobID: "job-1", Identity: id, Status: couchdb.JobRunning,
					Checkpoint: jsonOf(`{"by":"` + label + `","offset":1}`), Reason: label}
			},
			func(ctx context.Context, s fence.Sink[couchdb.JobState], id lease.Identity) (couchdb.JobState, *fence.Guard, error) {
				return s.(*couchdb.Jobs).Get(ctx, id, "job-1")
			},
			func(e *env, id lease.Identity) string { d, _ := e.db.JobDocID(id, "job-1"); return d }),
	}
}

// sameJSON compares two values by their JSON encoding (CouchDB re-encodes
// the raw JSON members).
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	var x, y any
	for _, p := range []struct {
		in  any
		out *any
	}{{a, &x}, {b, &y}} {
		bs, err := json.Marshal(p.in)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(bs, p.out); err != nil {
			t.Fatal(err)
		}
	}
	return reflect.DeepEqual(x, y)
}

// expectDoc reads the point's document back and requires exactly the write
// of label under guard g, at revision generation gen.
func expectDoc(t *testing.T, ctx context.Context, e *env, p point, id lease.Identity, label string, g fence.Guard, gen string) {
	t.Helper()
	got, fg, err := p.read(ctx, e, id)
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	if !sameJSON(t, got, p.want(id, label)) {
		t.Fatalf("document holds %+v, want the write %q: %+v", got, label, p.want(id, label))
	}
	if fg == nil || *fg != g {
		t.Fatalf("document fence %+v, want %+v", fg, g)
	}
	status, v := e.rawDoc(p.docID(e, id))
	if status != 200 || !strings.HasPrefix(v["_rev"].(string), gen+"-") {
		t.Fatalf("raw document %d %v, want revision %s-…", status, v, gen)
	}
	if !sameJSON(t, v[couchdb.FenceField], guardJSON(t, g)) {
		t.Fatalf("raw fence %v, want %+v", v[couchdb.FenceField], g)
	}
}

// expectFenceRejected requires err to be CouchDB's 403 from the fence for a
// lower token, typed commit_rejected.
func expectFenceRejected(t *testing.T, what string, err error) {
	t.Helper()
	var ce *couchdb.Error
	if !errors.As(err, &ce) || !errors.Is(err, couchdb.ErrFenceRejected) || ce.Status != http.StatusForbidden ||
		ce.CouchError != "forbidden" || code(err) != lease.CodeCommitRejected ||
		ce.Lease.Reason != "fencing token is lower than the stored token" {
		t.Fatalf("%s: %v (%#v), want CouchDB's 403 from the fence, commit_rejected", what, err, ce)
	}
}

// expectBindingRejected requires the writer's refusal of a guard issued
// for another write (nothing sent to CouchDB).
func expectBindingRejected(t *testing.T, what string, err error) {
	t.Helper()
	var ce *couchdb.Error
	if !errors.As(err, &ce) || !errors.Is(err, couchdb.ErrFenceRejected) || ce.Status != 0 ||
		code(err) != lease.CodeCommitRejected || ce.Lease.Reason != "the guard was authorized for another payload" {
		t.Fatalf("%s: %v (%#v), want the writer's refusal of a guard for another write", what, err, ce)
	}
}

// For each enforcement point, against pouchdb-server and a bolt lease
// store: an expired holder's commit is lease_lost and writes nothing; after
// a successor acquired and committed, the former holder is refused at
// AuthorizeCommit (lease_lost) and — bypassing authorization with a guard
// it got while valid, through the writer or with a raw PUT — by CouchDB's
// validate_doc_update (403); the successor's commit succeeds; the document
// holds only accepted writes. Then (point 6) after revoke and
// force-release, the holder's next commit is refused.
func TestEnforcementPoints(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	for _, p := range points() {
		t.Run(p.name, func(t *testing.T) {
			t.Run("stale_holder_fenced_out", func(t *testing.T) { testFencedOut(t, couch, p) })
			for _, op := range []lease.Op{lease.OpRevoke, lease.OpForceRelease} {
				t.Run("6_after_"+string(op), func(t *testing.T) { testAdminEnd(t, couch, p, op) })
			}
		})
	}
}

func testFencedOut(t *testing.T, couch *testenv.CouchDB, p point) {
	ctx := context.Background()
	e := newEnv(t, couch)
	id := identity("target-" + strings.ReplaceAll(p.name, "_", "-"))

	recA := e.acquire(id, "instance-a")
	var lossA fencetest.LossRecorder
	a := e.committer(recA, fence.WithLossHandler(lossA.Handler))
	gA, err := p.write(ctx, e, a, id, "a-1", "from-a")
	if err != nil {
		t.Fatalf("holder's first commit: %v", err)
	}
	// a is authorized for one more commit while valid, then pauses.
	lateWrite, err := p.bind(e, id, "paused-a")
	if err != nil {
		t.Fatal(err)
	}
	late, err := a.Authorize(ctx, sinkName, "a-late", lateWrite)
	if err != nil {
		t.Fatal(err)
	}
	gLate := a.Guard(late)
	expectDoc(t, ctx, e, p, id, "from-a", gA, "1")

	// Expired: lease_lost at AuthorizeCommit, nothing written.
	e.clock.Add(ttl + time.Millisecond)
	if _, err := p.write(ctx, e, a, id, "a-2", "expired-a"); code(err) != lease.CodeLost {
		t.Fatalf("expired holder's commit: %v, want lease_lost", err)
	}
	if got := lossA.Seen(); !reflect.DeepEqual(got, []lease.Code{lease.CodeLost}) {
		t.Fatalf("loss handler saw %v", got)
	}
	expectDoc(t, ctx, e, p, id, "from-a", gA, "1")

	// The successor acquires and commits.
	recB := e.acquire(id, "instance-b")
	if recB.FencingToken <= recA.FencingToken {
		t.Fatalf("successor token %d not above %d", recB.FencingToken, recA.FencingToken)
	}
	gB, err := p.write(ctx, e, e.committer(recB), id, "b-1", "from-b")
	if err != nil {
		t.Fatalf("successor's commit: %v", err)
	}
	expectDoc(t, ctx, e, p, id, "from-b", gB, "2")

	// The former holder: refused at AuthorizeCommit …
	if _, err := p.write(ctx, e, a, id, "a-3", "stale-a"); code(err) != lease.CodeLost {
		t.Fatalf("former holder's commit after the successor: %v, want lease_lost", err)
	}
	// … and, bypassing authorization, by CouchDB: with the guard it was
	// authorized before its pause, and with its first (replayed) guard.
	expectFenceRejected(t, "paused holder's late write", p.direct(ctx, e, gLate, id, "paused-a"))
	expectFenceRejected(t, "replayed guard", p.direct(ctx, e, gA, id, "from-a"))
	// The same guards for another body: refused by the writer, since a
	// guard authorizes one write.
	expectBindingRejected(t, "replayed guard, another body", p.direct(ctx, e, gA, id, "replayed-a"))
	expectBindingRejected(t, "paused holder's guard, another body", p.direct(ctx, e, gLate, id, "paused-a-changed"))
	// A raw PUT with the current _rev and the old fence: CouchDB's 403.
	_, cur := e.rawDoc(p.docID(e, id))
	cur[couchdb.FenceField] = guardJSON(t, gLate)
	cur["stale"] = true
	status, v := raw(t, http.MethodPut, e.docURL(p.docID(e, id)), cur)
	if status != 403 || v["error"] != "forbidden" ||
		v["reason"] != "starintel_fence: fencing token is lower than the stored token" {
		t.Fatalf("raw PUT with the old fence: %d %v, want 403 from validate_doc_update", status, v)
	}

	// The successor commits again; only accepted writes are stored.
	gB2, err := p.write(ctx, e, e.committer(recB), id, "b-2", "from-b-again")
	if err != nil {
		t.Fatalf("successor's second commit: %v", err)
	}
	expectDoc(t, ctx, e, p, id, "from-b-again", gB2, "3")
}

func testAdminEnd(t *testing.T, couch *testenv.CouchDB, p point, op lease.Op) {
	ctx := context.Background()
	e := newEnv(t, couch)
	id := identity("target-admin-" + strings.ReplaceAll(p.name, "_", "-"))

	recA := e.acquire(id, "instance-a")
	var lossA fencetest.LossRecorder
	a := e.committer(recA, fence.WithLossHandler(lossA.Handler))
	gA, err := p.write(ctx, e, a, id, "a-1", "from-a")
	if err != nil {
		t.Fatal(err)
	}
	e.adminEnd(op, id, recA)
	// Once ForceRelease/Revoke returned, the next commit is refused.
	if _, err := p.write(ctx, e, a, id, "a-2", "after-"+string(op)); code(err) != lease.CodeLost {
		t.Fatalf("commit after %s: %v, want lease_lost", op, err)
	}
	if got := lossA.Seen(); !reflect.DeepEqual(got, []lease.Code{lease.CodeLost}) {
		t.Fatalf("loss handler saw %v", got)
	}
	expectDoc(t, ctx, e, p, id, "from-a", gA, "1")

	// A new holder takes over; the invalidated holder's guard is then
	// refused by CouchDB too.
	recC := e.acquire(id, "instance-c")
	gC, err := p.write(ctx, e, e.committer(recC), id, "c-1", "from-c")
	if err != nil {
		t.Fatal(err)
	}
	expectFenceRejected(t, "invalidated holder's guard", p.direct(ctx, e, gA, id, "from-a"))
	expectBindingRejected(t, "invalidated holder's guard, another body", p.direct(ctx, e, gA, id, "from-a-again"))
	expectDoc(t, ctx, e, p, id, "from-c", gC, "2")
}
