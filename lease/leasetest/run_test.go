package leasetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRunAgainstMemStore validates the suite itself against the in-memory
// reference store.
func TestRunAgainstMemStore(t *testing.T) {
	Run(t, func(t *testing.T) Backend {
		m := newMemStore(StoreOptions())
		t.Cleanup(func() { m.Close() })
		return Backend{Store: m, Faults: m}
	})
}

// TestSuiteCatchesMemStoreBugs checks the suite's power: with each bug
// switched on in the reference store, the subtest named for the contract
// rule it breaks must fail. It re-runs this test binary once per bug, so it
// is opt-in: LEASETEST_MUTATION=1 go test ./lease/leasetest -run TestSuiteCatchesMemStoreBugs
func TestSuiteCatchesMemStoreBugs(t *testing.T) {
	if os.Getenv("LEASETEST_MUTATION") == "" {
		t.Skip("set LEASETEST_MUTATION=1 to run")
	}
	for bug, row := range map[string]string{
		"racy_acquire":             "two_concurrent_acquires/exactly_one_winner_of_64",
		"no_idempotency":           "idempotent_retries/acquire",
		"ignore_digest":            "duplicate_request_id_with_changed_body/idempotency_conflict_no_mutation/acquire",
		"ignore_deadline":          "finite_deadlines/past_deadline_exceeded/acquire",
		"trust_stored_key":         "malformed_corrupt_record/tuple_of_another_identity",
		"overwrite_corrupt":        "malformed_corrupt_record/bad_json",
		"history_unbounded":        "history/bounded_per_identity",
		"no_expiry":                "ttl_and_lifetime/lease_expires_at_backend_time",
		"revive_expired":           "renew_races_expiry/expired_renewal_cannot_revive",
		"ignore_instance":          "renew_requires_every_field/service_instance_id",
		"ignore_token":             "release_requires_every_field/fencing_token",
		"wrap_counter":             "counter_approaches_numeric_limit/refuse_never_wrap",
		"no_lifetime_cap":          "ttl_and_lifetime/renew_is_capped_by_maximum_lifetime",
		"reset_counter_on_release": "tokens_strictly_increase/after_release",
		"list_expired":             "inspect_and_list/list_by_owner_only_live_leases_of_that_owner",
		"no_high_water":            "former_holder_commits_after_new_acquisition/lower_token_rejected",
		"unconditional_cleanup":    "delayed_expiry_cleanup_sees_successor/successor_remains_active",
		"commit_replay_any_write":  "commit_binds_one_write/replay_with_another_target",
		"commit_any_job":           "commit_binds_one_write/another_job",
		"reuse_commit_seq":         "commit_authorization/authorized_commit_read_back",
		"outbox_unbounded":         "bounded_outbox/full_outbox_refuses_retryably_and_changes_nothing",
		"replay_only_commits":      "commit_replay_only/no_evidence_writes_nothing",
	} {
		t.Run(bug, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestRunAgainstMemStore$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "LEASETEST_MEMSTORE_BUGS="+bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store with bug %s", bug)
			}
			if !strings.Contains(string(out), "--- FAIL: TestRunAgainstMemStore/"+row+" ") {
				t.Fatalf("bug %s did not fail %s", bug, row)
			}
		})
	}
}
