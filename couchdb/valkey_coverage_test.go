package couchdb_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// Issue 11 §4 and §7 with the Valkey backend on a real redis-server
// deciding the authorizations (the tests above use bolt): a job's state is
// bound to the lease's job, and the stale-holder property holds at the
// scheduler (point 4) and job (point 5) enforcement points.

// valkeyCouch is a Valkey store in a fresh namespace and a fresh fenced
// database on couch.
type valkeyCouch struct {
	store *valkey.Store
	db    *couchdb.DB
	w     *couchdb.Writer
}

func newValkeyCouch(t *testing.T, r *testenv.Redis, couch *testenv.CouchDB) *valkeyCouch {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: "couch" + hex.EncodeToString(b), ReapInterval: -1})
	if err != nil {
		t.Fatalf("valkey.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	db, err := couchdb.New(couch.URL(), fmt.Sprintf("fenced-vk-%d", dbSeq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.EnsureDatabase(ctx); err != nil {
		t.Fatalf("EnsureDatabase: %v", err)
	}
	if err := db.InstallFence(ctx); err != nil {
		t.Fatalf("InstallFence: %v", err)
	}
	w, err := db.Writer(sinkName)
	if err != nil {
		t.Fatal(err)
	}
	return &valkeyCouch{store: s, db: db, w: w}
}

func (v *valkeyCouch) acquire(t *testing.T, id lease.Identity, instance, job string) *lease.Record {
	t.Helper()
	res, err := v.store.Acquire(context.Background(), lease.AcquireRequest{Identity: id, ServiceInstanceID: instance,
		TTL: ttl, MaximumLifetime: time.Hour, ExecutionID: "exec-" + instance, JobID: job,
		Mutation: lease.Mutation{RequestID: "req-" + instance + "-" + id.TargetID, DeadlineAt: time.Now().Add(time.Hour), Caller: actor}})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return res.Lease
}

func (v *valkeyCouch) committer(rec *lease.Record) *fence.Committer {
	return fence.NewCommitter(v.store, fence.EnvelopeOf(rec), actor, fence.WithClock(time.Now), fence.WithBackoff(time.Millisecond))
}

// TestJobStateIsBoundToTheLeasesJobOnValkey is TestJobStateIsBoundToTheLeasesJob
// with the Valkey backend: a live holder cannot create another job's state
// document through the job writer or the raw writer; the victim's own
// holder then writes it, and it reads back as the victim's.
func TestJobStateIsBoundToTheLeasesJobOnValkey(t *testing.T) {
	ctx := context.Background()
	v := newValkeyCouch(t, testenv.StartRedis(t), testenv.StartCouchDB(t))
	jobs := couchdb.NewJobs(v.w)
	x := v.acquire(t, identity("target-x"), "instance-x", "job-1")
	cx := v.committer(x)

	victim := couchdb.JobState{JobID: "job-victim", Identity: x.Identity(), Status: couchdb.JobSucceeded}
	// The victim job's document id under the holder's identity: the only
	// one the holder's guards could ever reach.
	victimDoc, err := v.db.JobDocID(x.Identity(), "job-victim")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Write(ctx, cx, jobs, "steal-1", victim); code(err) != lease.CodeCommitRejected {
		t.Fatalf("writing another job's state through the job writer: %v, want commit_rejected", err)
	}
	body, _ := json.Marshal(map[string]any{"type": couchdb.TypeJob, "job_id": "job-victim", "status": "succeeded",
		"terminal": true, "lock_identity": x.Identity()})
	if _, err := fence.Write(ctx, cx, v.w, "steal-2", couchdb.Doc{ID: victimDoc, Body: body}); !errors.Is(err, couchdb.ErrInvalid) {
		t.Fatalf("writing another job's document through the raw writer: %v, want invalid_lease_request", err)
	}
	// The job's own body under the holder's job id, bound to the victim's
	// document id: refused too.
	own, _ := json.Marshal(map[string]any{"type": couchdb.TypeJob, "job_id": x.JobID, "status": "succeeded",
		"terminal": true, "lock_identity": x.Identity()})
	if _, err := fence.Write(ctx, cx, v.w, "steal-3", couchdb.Doc{ID: victimDoc, Body: own}); err == nil {
		t.Fatal("the raw writer wrote the holder's job body under the victim's job document id")
	}
	if _, err := v.db.Get(ctx, victimDoc); !errors.Is(err, couchdb.ErrNotFound) {
		t.Fatalf("the victim's job document exists after the refusals: %v", err)
	}
	if _, err := fence.Write(ctx, cx, jobs, "own-1", couchdb.JobState{JobID: x.JobID, Identity: x.Identity(), Status: couchdb.JobRunning}); err != nil {
		t.Fatalf("the holder's own job: %v", err)
	}
	vr := v.acquire(t, identity("target-victim"), "instance-v", "job-victim")
	victim.Identity = vr.Identity()
	g, err := fence.Write(ctx, v.committer(vr), jobs, "victim-1", victim)
	if err != nil {
		t.Fatalf("the victim's own job state: %v", err)
	}
	got, fg, err := jobs.Get(ctx, vr.Identity(), "job-victim")
	if err != nil || got.Status != couchdb.JobSucceeded || fg == nil || *fg != g || fg.JobID != "job-victim" || fg.LeaseID != vr.LeaseID {
		t.Fatalf("victim's job document: %+v %+v %v", got, fg, err)
	}
}

// TestStaleHolderAtSchedulerAndJobPointsOnValkey is the stale-holder
// property at points 4 and 5 with the Valkey backend (expiry waited out on
// the server's clock).
func TestStaleHolderAtSchedulerAndJobPointsOnValkey(t *testing.T) {
	r, couch := testenv.StartRedis(t), testenv.StartCouchDB(t)
	const vttl = 3 * time.Second
	t.Run("4_schedule", func(t *testing.T) {
		v := newValkeyCouch(t, r, couch)
		s := couchdb.NewSchedules(v.w)
		fencetest.StaleHolder[couchdb.ScheduleState]{Store: v.store, Now: time.Now, Expire: func() { time.Sleep(vttl + 200*time.Millisecond) },
			TTL: vttl, Identity: identity("stale-vk"), Holder: actor, Successor: successor, Admin: admin,
			Sink: fence.Sink[couchdb.ScheduleState](s), Objects: 1,
			Payload: func(rec *lease.Record, _ int, l string) couchdb.ScheduleState {
				return couchdb.ScheduleState{Identity: rec.Identity(), Status: couchdb.ScheduleCompleted, Reason: l}
			},
			Read: func(ctx context.Context, rec *lease.Record, _ int) (string, *fence.Guard, error) {
				st, g, err := s.Get(ctx, rec.Identity())
				return st.Reason, g, err
			}}.Run(t)
	})
	t.Run("5_job", func(t *testing.T) {
		v := newValkeyCouch(t, r, couch)
		s := couchdb.NewJobs(v.w)
		fencetest.StaleHolder[couchdb.JobState]{Store: v.store, Now: time.Now, Expire: func() { time.Sleep(vttl + 200*time.Millisecond) },
			TTL: vttl, Identity: identity("stale-vk"), Holder: actor, Successor: successor, Admin: admin,
			Sink: fence.Sink[couchdb.JobState](s), Objects: 1, JobBound: true,
			Payload: func(rec *lease.Record, _ int, l string) couchdb.JobState {
				return couchdb.JobState{JobID: rec.JobID, Identity: rec.Identity(), Status: couchdb.JobRunning, Reason: l}
			},
			Read: func(ctx context.Context, rec *lease.Record, _ int) (string, *fence.Guard, error) {
				st, g, err := s.Get(ctx, rec.Identity(), rec.JobID)
				return st.Reason, g, err
			}}.Run(t)
	})
}
