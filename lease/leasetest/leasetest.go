// Package leasetest is the backend-neutral conformance suite of the lease-store
// protocol. Every backend's tests call Run, the way testing/fstest.TestFS is
// called for file systems. Subtests are named after the rows of the contract's
// race/failure table and the items of its "MUST collectively prove" list.
package leasetest

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// OperationClasses are the operation classes a backend under test must be
// configured with (see StoreOptions).
var OperationClasses = []string{"default", "scrape", "enrich"}

// StoreOptions returns the options a backend under test must be opened
// with: the suite's operation classes and small page and history bounds so
// pagination and retention are exercised.
func StoreOptions() lease.StoreOptions {
	classes, err := lease.NewOperationClasses(OperationClasses...)
	if err != nil {
		panic(err)
	}
	return lease.StoreOptions{
		OperationClasses:   classes,
		MaxPageSize:        50,
		HistoryPerIdentity: 8,
	}
}

// Faults reaches into a backend to create states no client request can.
type Faults interface {
	// Counter reads the durable fencing counter of lockKey (0 if none).
	Counter(ctx context.Context, lockKey string) (uint64, error)
	// SetCounter sets the durable fencing counter of lockKey.
	SetCounter(ctx context.Context, lockKey string, value uint64) error
	// PutRawActive stores raw bytes as the active record of lockKey,
	// bypassing every check, as corruption or a foreign writer would.
	PutRawActive(ctx context.Context, lockKey string, raw []byte) error
	// ExpireIfCurrent runs the backend's own delayed expiry cleanup for one
	// lease: it must act only if the active record still has this lease id
	// and token and is expired at backend time. When it does nothing it
	// returns nil or a *lease.Error; it never touches a corrupt record.
	ExpireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error
}

// Backend is a store under test and its fault hooks.
type Backend struct {
	Store  lease.Store
	Faults Faults
}

// Factory opens a fresh, empty backend configured with StoreOptions. It
// registers its own cleanup with t.Cleanup. Run calls it once for the backend
// its subtests share, and once more for a subtest that closes its store, so
// the cleanup must tolerate a store that is already closed.
type Factory func(t *testing.T) Backend

// Short is the TTL the suite uses where it waits for expiry; long enough for
// a loaded CI machine to finish the steps before it, short enough to keep the
// suite fast.
const Short = 400 * time.Millisecond

// Run is the conformance suite. It opens one shared backend with newBackend
// and runs every subtest on it in parallel, each with its own identity
// (random tenant, program and target), owner and administrator; subtests
// that must close a store open their own backend. Subtests are named after
// the contract's race/failure rows and "MUST collectively prove" items, and
// assert the records, tokens and counters read back, not only result codes.
//
// Run returns before its parallel subtests finish; they complete before t
// does, and so before cleanups registered on t run.
func Run(t *testing.T, newBackend Factory) {
	t.Helper()
	s := &suite{newBackend: newBackend, opts: StoreOptions().WithDefaults()}
	s.shared = newBackend(t)
	if s.shared.Store == nil || s.shared.Faults == nil {
		t.Fatal("leasetest: the factory returned a Backend without Store or Faults")
	}
	for _, g := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"canonical_identity", s.canonicalIdentity},
		{"no_collisions_across_fields", s.noCollisions},
		{"acquire_if_free", s.acquireIfFree},
		{"two_concurrent_acquires", s.concurrentAcquires},
		{"tokens_strictly_increase", s.tokensIncrease},
		{"ttl_and_lifetime", s.ttlAndLifetime},
		{"finite_deadlines", s.finiteDeadlines},
		{"renew_requires_every_field", s.requiresEveryField(opRenew)},
		{"release_requires_every_field", s.requiresEveryField(opRelease)},
		{"commit_requires_every_field", s.requiresEveryField(opCommit)},
		{"terminal_never_reactivates", s.terminalNeverReactivates},
		{"stale_operations_never_mutate_successor", s.staleNeverMutatesSuccessor},
		{"idempotent_retries", s.idempotentRetries},
		{"duplicate_request_id_with_changed_body", s.changedBody},
		{"acquire_response_lost", s.acquireResponseLost},
		{"renew_races_expiry", s.renewRacesExpiry},
		{"renew_races_release", s.renewRacesEnd(endRelease)},
		{"renew_races_force_release", s.renewRacesEnd(endForceRelease)},
		{"renew_races_revoke", s.renewRacesEnd(endRevoke)},
		{"release_races_revoke", s.releaseRacesRevoke},
		{"release_races_release", s.releaseRacesRelease},
		{"stale_release_after_reacquire", s.staleReleaseAfterReacquire},
		{"delayed_expiry_cleanup_sees_successor", s.delayedExpiryCleanup},
		{"former_holder_commits_after_expiry", s.commitsAfterExpiry},
		{"former_holder_commits_after_release", s.commitsAfterRelease},
		{"former_holder_commits_after_new_acquisition", s.commitsAfterNewAcquisition},
		{"commit_authorization", s.commitAuthorization},
		{"commit_binds_one_write", s.commitBindsOneWrite},
		{"commit_replay_only", s.commitReplayOnly},
		{"stale_holder_write_paths", s.staleHolderWritePaths},
		{"fenced_outbox", s.fencedOutbox},
		{"bounded_outbox", s.boundedOutbox},
		{"outbox_dead_letter_admin", s.deadLetterAdminLeaves},
		{"service_crash_after_backend_commit", s.crashAfterCommit},
		{"service_crash_before_backend_commit", s.crashBeforeCommit},
		{"backend_unavailable_before_submission", s.backendUnavailable},
		{"timeout_after_submission", s.timeoutAfterSubmission},
		{"malformed_corrupt_record", s.corruptRecords},
		{"counter_approaches_numeric_limit", s.counterLimit},
		{"inspect_and_list", s.inspectAndList},
		{"history", s.historyGroup},
		{"invalid_request", s.invalidRequests},
		{"health", s.health},
	} {
		group(t, g.name, g.run)
	}
}
