package couchdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

var successor = lease.Caller{PrincipalID: "prn-successor", ClientID: "client-2", CredentialID: "key-2"}

// staleHolder is the stale-holder property at one CouchDB enforcement
// point, on a fresh fenced database of a real pouchdb-server.
func staleHolder[P any](e *env, sink fence.Sink[P], objects int, jobBound bool,
	payload func(rec *lease.Record, obj int, label string) P,
	read func(ctx context.Context, rec *lease.Record, obj int) (string, *fence.Guard, error)) fencetest.StaleHolder[P] {
	return fencetest.StaleHolder[P]{Store: e.store, Now: e.clock.Now, Expire: func() { e.clock.Add(ttl + time.Second) },
		TTL: ttl, Identity: identity("stale"), Holder: actor, Successor: successor, Admin: admin,
		Sink: sink, Objects: objects, Payload: payload, Read: read, JobBound: jobBound}
}

// label reads the "label" member of a JSON object.
func label(b json.RawMessage) string {
	var v struct {
		Label string `json:"label"`
	}
	_ = json.Unmarshal(b, &v)
	return v.Label
}

func labelled(l string) json.RawMessage { return json.RawMessage(`{"label":` + strconv.Quote(l) + `}`) }

// Every CouchDB enforcement point and the raw writer: a holder whose lease
// ended lands nothing but the write authorized while it was live.
func TestStaleHolderAtEveryCouchDBPoint(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	t.Run("1_target_state", func(t *testing.T) {
		e := newEnv(t, couch)
		s := couchdb.NewTargetStates(e.w)
		staleHolder(e, fence.Sink[couchdb.TargetState](s), 1, false,
			func(rec *lease.Record, _ int, l string) couchdb.TargetState {
				return couchdb.TargetState{Identity: rec.Identity(), Status: couchdb.TargetAccepted, Reason: l}
			},
			func(ctx context.Context, rec *lease.Record, _ int) (string, *fence.Guard, error) {
				st, g, err := s.Get(ctx, rec.Identity())
				return st.Reason, g, err
			}).Run(t)
	})
	t.Run("2_result", func(t *testing.T) {
		e := newEnv(t, couch)
		s := couchdb.NewResults(e.w)
		name := func(obj int) string { return "result-" + strconv.Itoa(obj) }
		staleHolder(e, fence.Sink[couchdb.Result](s), 2, false,
			func(rec *lease.Record, obj int, l string) couchdb.Result {
				return couchdb.Result{Identity: rec.Identity(), Name: name(obj), Data: labelled(l)}
			},
			func(ctx context.Context, rec *lease.Record, obj int) (string, *fence.Guard, error) {
				r, g, err := s.Get(ctx, rec.Identity(), name(obj))
				return label(r.Data), g, err
			}).Run(t)
	})
	t.Run("4_schedule", func(t *testing.T) {
		e := newEnv(t, couch)
		s := couchdb.NewSchedules(e.w)
		staleHolder(e, fence.Sink[couchdb.ScheduleState](s), 1, false,
			func(rec *lease.Record, _ int, l string) couchdb.ScheduleState {
				return couchdb.ScheduleState{Identity: rec.Identity(), Status: couchdb.ScheduleCompleted, Reason: l}
			},
			func(ctx context.Context, rec *lease.Record, _ int) (string, *fence.Guard, error) {
				st, g, err := s.Get(ctx, rec.Identity())
				return st.Reason, g, err
			}).Run(t)
	})
	t.Run("5_job", func(t *testing.T) {
		e := newEnv(t, couch)
		s := couchdb.NewJobs(e.w)
		staleHolder(e, fence.Sink[couchdb.JobState](s), 1, true,
			func(rec *lease.Record, _ int, l string) couchdb.JobState {
				return couchdb.JobState{JobID: rec.JobID, Identity: rec.Identity(), Status: couchdb.JobRunning, Reason: l}
			},
			func(ctx context.Context, rec *lease.Record, _ int) (string, *fence.Guard, error) {
				st, g, err := s.Get(ctx, rec.Identity(), rec.JobID)
				return st.Reason, g, err
			}).Run(t)
	})
	t.Run("raw_writer", func(t *testing.T) {
		e := newEnv(t, couch)
		docID := func(rec *lease.Record, obj int) string { return "raw:" + rec.TargetID + ":" + strconv.Itoa(obj) }
		staleHolder(e, fence.Sink[couchdb.Doc](e.w), 2, false,
			func(rec *lease.Record, obj int, l string) couchdb.Doc {
				return couchdb.Doc{ID: docID(rec, obj), Body: labelled(l)}
			},
			func(ctx context.Context, rec *lease.Record, obj int) (string, *fence.Guard, error) {
				d, err := e.db.Get(ctx, docID(rec, obj))
				return label(d.Body), d.Fence, err
			}).Run(t)
	})
}

// A live holder cannot write the state of a job that is not its lease's,
// not even one whose document does not exist yet: the job writer refuses
// the guard, and so does validate_doc_update for a write that bypasses the
// typed writer. The real owner of that job then writes it.
func TestJobStateIsBoundToTheLeasesJob(t *testing.T) {
	couch := testenv.StartCouchDB(t)
	ctx := context.Background()
	e := newEnv(t, couch)
	jobs := couchdb.NewJobs(e.w)
	x := e.acquire(identity("target-x"), "instance-x") // job-1
	cx := e.committer(x)

	victim := couchdb.JobState{JobID: "job-victim", Identity: x.Identity(), Status: couchdb.JobSucceeded}
	if _, err := fence.Write(ctx, cx, jobs, "steal-1", victim); code(err) != lease.CodeCommitRejected {
		t.Fatalf("writing another job's state through the job writer: %v, want commit_rejected", err)
	}
	// The raw writer writes no typed document (TestValidateRefusesForeign
	// TypedDocuments: nor does CouchDB's fence admit one bypassing it).
	body, _ := json.Marshal(map[string]any{"type": couchdb.TypeJob, "job_id": "job-victim", "status": "succeeded",
		"terminal": true, "lock_identity": x.Identity()})
	victimDoc, err := e.db.JobDocID(identity("target-victim"), "job-victim")
	if err != nil {
		t.Fatal(err)
	}
	for i, docID := range []string{victimDoc, "job:job-victim"} {
		doc := couchdb.Doc{ID: docID, Body: body}
		if _, err := fence.Write(ctx, cx, e.w, "steal-2-"+strconv.Itoa(i), doc); !errors.Is(err, couchdb.ErrInvalid) {
			t.Fatalf("writing another job's document %q through the raw writer: %v, want invalid_lease_request", docID, err)
		}
		if _, err := e.db.Get(ctx, docID); !errors.Is(err, couchdb.ErrNotFound) {
			t.Fatalf("job document %q exists after the refusals: %v", docID, err)
		}
	}
	// The holder's own job is fine.
	own := couchdb.JobState{JobID: x.JobID, Identity: x.Identity(), Status: couchdb.JobRunning}
	if _, err := fence.Write(ctx, cx, jobs, "own-1", own); err != nil {
		t.Fatalf("the holder's own job: %v", err)
	}
	// The victim's owner creates its job document undisturbed.
	res, err := e.store.Acquire(ctx, lease.AcquireRequest{Identity: identity("target-victim"),
		ServiceInstanceID: "instance-v", TTL: ttl, MaximumLifetime: time.Hour, ExecutionID: "exec-v", JobID: "job-victim",
		Mutation: lease.Mutation{RequestID: "req-victim", DeadlineAt: e.far(), Caller: actor}})
	if err != nil {
		t.Fatal(err)
	}
	v := res.Lease
	victim.Identity = v.Identity()
	g, err := fence.Write(ctx, e.committer(v), jobs, "victim-1", victim)
	if err != nil {
		t.Fatalf("the victim's own job state: %v", err)
	}
	got, fg, err := jobs.Get(ctx, v.Identity(), "job-victim")
	if err != nil || got.Status != couchdb.JobSucceeded || fg == nil || *fg != g || fg.JobID != "job-victim" {
		t.Fatalf("victim's job document: %+v %+v %v", got, fg, err)
	}
}
