// Package recovery restores a lease namespace from a backup without ever
// regressing the fencing high-water mark.
//
// A restored namespace stays closed (backend_unavailable) until Verify
// runs. Verify takes the downstream proof — for each lock key, the highest
// fencing token an authoritative downstream store accepted (CouchDB
// starintel_fence documents, Rabbit outbox/consumer records) — and:
//
//   - if the proof is complete and every restored counter is at least every
//     downstream token (and its own high-water marks), reopens the namespace
//     with the counters as restored;
//   - otherwise takes the EPOCH path: every counter (and every lock key named
//     by the proof) is raised to M + gap, where M is the maximum known token
//     (restored counters, restored high-water marks and proof tokens) and the
//     gap is Options.EpochGap (DefaultEpochGap = 1,000,000), so every token
//     issued after the backup that recovery does not know of — up to gap
//     acquisitions per identity beyond M — is below every new token; then it
//     reopens.
//
// In both paths every restored active lease is ended through the normal
// archive path (revoked with a recovery reason if still live): a restored
// TTL is never resurrected, and its holder must acquire again. Counters are
// never lowered, lease ids are never reused (new ids are fresh ULIDs), and
// idempotency evidence survives, so a replayed pre-backup request returns
// its original result (with the lease's current, ended state). Every step
// is logged as an AUDIT record.
package recovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/recovery/backupfile"
)

// DefaultEpochGap is the documented amount by which the epoch path raises
// every counter above the maximum known token.
const DefaultEpochGap uint64 = 1_000_000

// RevokeReason is recorded on restored leases recovery ends.
const RevokeReason = "namespace restored from backup; lease invalidated by recovery, acquire again"

// ReadBackup strictly verifies a backup (magic, version, header, length,
// SHA-256) and returns its manifest; errors match the backupfile sentinels.
func ReadBackup(r io.Reader) (backupfile.Header, error) { return backupfile.Read(r, io.Discard) }

// Proof is the downstream high-water evidence for a restored namespace.
type Proof struct {
	// Marks maps lock key → the highest fencing token accepted downstream.
	Marks map[string]uint64
	// Complete asserts that Marks covers every identity and every
	// authoritative downstream store. Without it recovery takes the epoch
	// path.
	Complete bool
	// Sources names where the marks came from, for the audit trail.
	Sources []string
}

// Observe records a downstream token, keeping the highest per lock key.
func (p *Proof) Observe(lockKey string, token uint64) {
	if p.Marks == nil {
		p.Marks = map[string]uint64{}
	}
	p.Marks[lockKey] = max(p.Marks[lockKey], token)
}

// Options configures Verify.
type Options struct {
	// EpochGap is the epoch path's gap above the maximum known token; zero
	// means DefaultEpochGap.
	EpochGap uint64
	// Bolt configures the opened store (clock, retention, logger).
	Bolt bolt.Options
	// Logger receives the audit records; nil means slog.Default().
	Logger *slog.Logger
}

// Report is the outcome of Verify.
type Report struct {
	Epoch         bool     // the epoch path was taken
	EpochNumber   uint64   // the namespace's recovery epoch after Verify
	MaxKnownToken uint64   // the maximum of counters, marks and proof tokens
	Floor         uint64   // the counter floor set by the epoch path
	Shortfalls    []string // lock keys whose restored counter was below a known token
	Raised        int
	Revoked       []string // lease ids of restored live leases revoked
	Expired       []string // lease ids of restored leases archived as expired
}

// Verify runs recovery for the bolt store restored at path (bolt.Restore)
// and reopens it; see the package comment.
func Verify(ctx context.Context, path string, proof Proof, o Options) (Report, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	gap := o.EpochGap
	if gap == 0 {
		gap = DefaultEpochGap
	}
	r, err := bolt.OpenRestored(path, o.Bolt)
	if err != nil {
		return Report{}, err
	}
	defer r.Close() // idempotent; Finish closes it on success
	st, err := r.State(ctx)
	if err != nil {
		log.Error("AUDIT recovery aborted: restored state unreadable", "code", lease.CodeOf(err))
		return Report{}, err
	}
	log.Info("AUDIT recovery started", "backup_sha256", st.Marker.BackupSHA256, "backup_created_at", st.Marker.BackupCreatedAt,
		"counters", len(st.Counters), "active", len(st.Active), "proof_marks", len(proof.Marks),
		"proof_complete", proof.Complete, "proof_sources", proof.Sources)

	var rep Report
	keys := map[string]bool{}
	for k, c := range st.Counters {
		keys[k] = true
		rep.MaxKnownToken = max(rep.MaxKnownToken, c)
	}
	for k, m := range st.HighWater {
		keys[k] = true
		rep.MaxKnownToken = max(rep.MaxKnownToken, m)
		if m > st.Counters[k] {
			rep.Shortfalls = append(rep.Shortfalls, k)
		}
	}
	for k, m := range proof.Marks {
		keys[k] = true
		rep.MaxKnownToken = max(rep.MaxKnownToken, m)
		if m > st.Counters[k] {
			rep.Shortfalls = append(rep.Shortfalls, k)
		}
	}
	sort.Strings(rep.Shortfalls)
	plan := bolt.FinishPlan{Reason: RevokeReason}
	rep.EpochNumber = st.Epoch
	if !proof.Complete || len(rep.Shortfalls) > 0 {
		rep.Epoch = true
		if rep.MaxKnownToken > lease.MaxFencingToken-gap {
			log.Error("AUDIT recovery aborted: epoch would exceed the fencing token limit", "max_known_token", rep.MaxKnownToken, "gap", gap)
			return Report{}, lease.Errorf(lease.CodeCounterExhausted, "recovery epoch would exceed the fencing token limit")
		}
		rep.Floor = rep.MaxKnownToken + gap
		rep.EpochNumber = st.Epoch + 1
		plan.Epoch, plan.Floor = rep.EpochNumber, rep.Floor
		plan.Counters = make(map[string]uint64, len(keys))
		for k := range keys {
			plan.Counters[k] = rep.Floor
		}
		log.Warn("AUDIT recovery proof incomplete or short; allocating a new epoch",
			"proof_complete", proof.Complete, "shortfalls", len(rep.Shortfalls), "max_known_token", rep.MaxKnownToken,
			"gap", gap, "floor", rep.Floor, "epoch", rep.EpochNumber, "identities", len(keys))
	} else {
		log.Info("AUDIT recovery proof complete: every counter covers every downstream token", "max_known_token", rep.MaxKnownToken)
	}
	res, err := r.Finish(ctx, plan)
	if err != nil {
		log.Error("AUDIT recovery failed; namespace stays closed", "code", lease.CodeOf(err))
		return Report{}, fmt.Errorf("recovery: %w", err)
	}
	rep.Raised, rep.Revoked, rep.Expired = res.Raised, res.Revoked, res.Expired
	for _, id := range res.Revoked {
		log.Info("AUDIT recovery revoked a restored lease", "lease_id", id, "reason", RevokeReason)
	}
	log.Info("AUDIT recovery finished; namespace reopened", "epoch_path", rep.Epoch, "epoch", rep.EpochNumber,
		"raised", rep.Raised, "revoked", len(rep.Revoked), "expired", len(rep.Expired))
	return rep, nil
}
