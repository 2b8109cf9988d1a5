package httpapi

import (
	"encoding/json"
	"testing"

	"github.com/starintel/starlease/lease"
)

// The commit answer names the canonical lock key of the identity sent,
// normalized by the server (case, surrounding space, defaults), on the
// first answer and on a replay; a remote writer's guard carries it.
func TestCommitAnswerLockKey(t *testing.T) {
	s := newTestServer(t)
	raw := map[string]string{"tenant_id": " Tenant-Main ", "program_id": "PROGRAM-A", "target_namespace": "Web",
		"target_id": "LockKey.Example", "actor_name": "Crawler"}
	id := lease.Identity{TenantID: raw["tenant_id"], ProgramID: raw["program_id"], TargetNamespace: raw["target_namespace"],
		TargetID: raw["target_id"], ActorName: raw["actor_name"]}
	_, want, err := lease.CanonicalLockKey(id, lease.DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	rec, out := s.do(t, "POST", Base+"/acquire", acquireBodyFor(raw, "req-lockkey"))
	if rec.Code != 200 {
		t.Fatalf("acquire: %d %v", rec.Code, out)
	}
	l := out["lease"].(map[string]any)
	body := map[string]any{"lock_identity": raw, "lease_id": l["lease_id"], "fencing_token": l["fencing_token"],
		"service_instance_id": "inst-1", "sink": "couchdb", "commit_id": "c-lockkey", "execution_id": "exec-1",
		"job_id": "job-1", "target": "doc-1"}
	for _, replay := range []bool{false, true} {
		rec, _ := s.do(t, "POST", Base+"/commits/authorize", body)
		var answer struct {
			Code     string `json:"code"`
			Replayed bool   `json:"replayed"`
			Commit   struct {
				LockKey string `json:"lock_key"`
				LeaseID string `json:"lease_id"`
			} `json:"commit"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil || rec.Code != 200 || answer.Replayed != replay {
			t.Fatalf("commit (replay %v): %d %s (%v)", replay, rec.Code, rec.Body, err)
		}
		if answer.Commit.LockKey != want || answer.Commit.LeaseID != l["lease_id"] {
			t.Fatalf("commit answer lock_key %q, want %q (%s)", answer.Commit.LockKey, want, rec.Body)
		}
		if err := lease.CheckLockKey(answer.Commit.LockKey); err != nil {
			t.Fatal(err)
		}
	}
}
