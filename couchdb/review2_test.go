package couchdb_test

// Outside review (i11b) of job documents job:<identity>~<job_id> on a real
// pouchdb-server: with a REAL guard of its own lease (another tenant, the
// victim's job id), an attacker tries every id/lock_identity spelling and
// _bulk_docs (new_edits true and false) to create or own the victim's job
// document; the victim's holder must then write and read its state.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

func TestReview2JobDocumentSpellings(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, testenv.StartCouchDB(t))
	jobs := couchdb.NewJobs(e.w)
	attackerID := identity("attacker-target")
	attackerID.TenantID = "tenant-evil"
	victimID := identity("victim-target")
	victimDoc, err := e.db.JobDocID(victimID, "job-victim")
	if err != nil {
		t.Fatal(err)
	}
	att := e.acquireJob(attackerID, "instance-evil", "job-victim")
	ca := e.committer(att)
	n := 0
	guard := func(docID string) map[string]any {
		n++
		c, err := ca.Authorize(ctx, sinkName, fmt.Sprintf("r2-%d", n), fence.Binding{Target: docID})
		if err != nil {
			t.Fatal(err)
		}
		return guardJSON(t, ca.Guard(c))
	}
	body := func(docID string, li any, jobID string) map[string]any {
		return map[string]any{"_id": docID, "type": couchdb.TypeJob, "job_id": jobID, "lock_identity": li,
			"status": couchdb.JobCancelled, "terminal": true, couchdb.FenceField: guard(docID)}
	}
	asMap := func(id lease.Identity) map[string]any {
		return map[string]any{"tenant_id": id.TenantID, "program_id": id.ProgramID, "target_namespace": id.TargetNamespace,
			"target_id": id.TargetID, "actor_name": id.ActorName, "workflow_name": id.WorkflowName, "operation_class": id.OperationClass}
	}
	upper := asMap(victimID)
	upper["tenant_id"] = strings.ToUpper(victimID.TenantID)
	// The attacker's identity with the victim's components shifted in via "~".
	shifted := asMap(attackerID)
	shifted["target_id"] = "x~" + victimID.TargetID
	attDoc, err := e.db.JobDocID(attackerID, "job-victim")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		docID string
		li    any
		jobID string
	}{
		{"victim id, upper-case victim identity", victimDoc, upper, "job-victim"},
		{"victim id, shifted components", victimDoc, shifted, "job-victim"},
		{"victim id, attacker identity", victimDoc, asMap(attackerID), "job-victim"},
		{"attacker id with a suffix", attDoc + "~x", asMap(attackerID), "job-victim"},
		{"old form", "job:job-victim", asMap(attackerID), "job-victim"},
		{"old form, upper-case prefix and type", "JOB:job-victim", asMap(attackerID), "job-victim"},
		{"victim id, body job id differs from the fence", victimDoc, asMap(victimID), "job-other"},
	} {
		b := body(tc.docID, tc.li, tc.jobID)
		if strings.HasPrefix(tc.docID, "JOB:") {
			b["type"] = "STARINTEL.JOB"
		}
		if st, v := raw(t, http.MethodPut, e.docURL(tc.docID), b); st < 400 {
			t.Errorf("PUT %s: %d %v, want refused", tc.name, st, v)
		}
		for _, newEdits := range []bool{true, false} {
			bb := body(tc.docID, tc.li, tc.jobID)
			if !newEdits {
				bb["_rev"] = "1-" + strings.Repeat("a", 32)
			}
			st, v := raw(t, http.MethodPost, e.couch.URL()+"/"+e.db.Name()+"/_bulk_docs",
				map[string]any{"docs": []any{bb}, "new_edits": newEdits})
			l, _ := v["list"].([]any)
			ok := st < 300 && len(l) == 1
			if ok {
				r, _ := l[0].(map[string]any)
				ok = r["error"] == nil
			}
			if ok && newEdits {
				t.Errorf("_bulk_docs %s (new_edits=%v): %d %v, want the doc refused", tc.name, newEdits, st, v)
			}
		}
	}
	for _, id := range []string{victimDoc, "job:job-victim", "JOB:job-victim"} {
		if st, v := e.rawDoc(id); st != http.StatusNotFound {
			t.Errorf("%s exists after the refused writes: %d %v", id, st, v)
		}
	}
	// The victim's holder writes and reads its job state.
	vic := e.acquireJob(victimID, "instance-v", "job-victim")
	g, err := fence.Write(ctx, e.committer(vic), fence.Sink[couchdb.JobState](jobs), "victim-1",
		couchdb.JobState{JobID: "job-victim", Identity: victimID, Status: couchdb.JobRunning})
	if err != nil {
		t.Fatalf("the victim's write: %v", err)
	}
	st, fg, err := jobs.Get(ctx, victimID, "job-victim")
	if err != nil || st.Status != couchdb.JobRunning || fg == nil || *fg != g {
		t.Fatalf("the victim's job state: %+v %v", st, err)
	}
	// Reading another identity's job state never returns the victim's.
	if _, _, err := jobs.Get(ctx, attackerID, "job-victim"); !errors.Is(err, couchdb.ErrNotFound) {
		t.Fatalf("the attacker's job document: %v, want not found", err)
	}
	// Job ids the Go side refuses ("~", "..", unicode, star_sk_, > 256
	// bytes) name no document.
	for _, j := range []string{"a~b", "a..b", "jöb", "star_sk_x", strings.Repeat("j", 257), ""} {
		if _, err := e.db.JobDocID(victimID, j); err == nil {
			t.Errorf("JobDocID accepted job id %q", j)
		}
	}
}
