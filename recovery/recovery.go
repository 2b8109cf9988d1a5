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
// is a durable, high-priority audit event (Options.Audit) and a log record.
//
// Verify works on any backend's closed namespace (lease.ClosedNamespace),
// as a Backend's OpenClosed gives it: a restored bolt store or a restored
// or sealed Valkey namespace (bolt.Namespace, valkey.Namespace). A Site
// runs each recovery command on a Backend: backup, restore, seal, and
// Verify with the downstream proof read from its Sources.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
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

// ErrReopenedAuditIncomplete is returned, with the report, when the
// namespace was recovered and reopened but an audit event written after
// the reopening failed (the decision's event was written before).
var ErrReopenedAuditIncomplete = errors.New("recovery: namespace reopened, but an audit event after the reopening was not written")

// Options configures Verify.
type Options struct {
	// EpochGap is the epoch path's gap above the maximum known token; zero
	// means DefaultEpochGap.
	EpochGap uint64
	// Audit receives one durable event per recovery step: the decision
	// (written before anything changes: if it cannot be written, nothing
	// is), each restored lease ended, and the reopening. Nil means the
	// logger alone.
	Audit audit.Sink
	// Logger receives the same steps as log records; nil means
	// slog.Default(). Either way secret-shaped values are screened
	// (audit.ScreenLogger).
	Logger *slog.Logger
}

// Report is the outcome of Verify.
type Report struct {
	Epoch         bool     `json:"epoch"`           // the epoch path was taken
	EpochNumber   uint64   `json:"epoch_number"`    // the namespace's recovery epoch after Verify
	MaxKnownToken uint64   `json:"max_known_token"` // the maximum of counters, marks and proof tokens
	Floor         uint64   `json:"floor"`           // the counter floor set by the epoch path
	Shortfalls    []string `json:"shortfalls"`      // lock keys whose restored counter was below a known token
	Raised        int      `json:"raised"`          // counters raised or created
	Revoked       []string `json:"revoked"`         // lease ids of restored live leases revoked
	Expired       []string `json:"expired"`         // lease ids of restored leases archived as expired
}

// Step writes one recovery audit event (and its log record): typ, allowed
// or denied, with its details in reason. Without a sink it only logs.
func Step(ctx context.Context, sink audit.Sink, log *slog.Logger, typ audit.EventType, allowed bool, reason string) error {
	log = audit.ScreenLogger(log, nil)
	level := slog.LevelInfo
	e := audit.NewEvent(typ, time.Now())
	e.Decision, e.Reason, e.PrincipalID = audit.DecisionAllow, audit.CutReason(reason), lease.RecoveryPrincipal
	if !allowed {
		e.Decision, level = audit.DecisionDeny, slog.LevelError
	}
	log.Log(ctx, level, "AUDIT "+string(typ), "decision", e.Decision, "reason", e.Reason, "event_id", e.EventID)
	if sink == nil {
		return nil
	}
	if err := sink.Write(ctx, e); err != nil {
		log.Error("recovery audit event not written", "event_type", typ, "error", err.Error())
		return lease.Errorf(lease.CodeBackendUnavailable, "recovery audit event not written: %v", err)
	}
	return nil
}

// Verify runs recovery for a closed namespace (a restored bolt store, a
// restored or sealed Valkey namespace) and reopens it; see the package
// comment. ns is closed afterwards.
func Verify(ctx context.Context, ns lease.ClosedNamespace, proof Proof, o Options) (Report, error) {
	defer ns.Close()
	log := audit.ScreenLogger(o.Logger, nil)
	gap := o.EpochGap
	if gap == 0 {
		gap = DefaultEpochGap
	}
	if gap > lease.MaxFencingToken {
		return Report{}, lease.Invalid("epoch_gap", "must be at most 2^53-1")
	}
	deny := func(err error, why string) (Report, error) {
		Step(ctx, o.Audit, log, audit.EventRecoveryReopen, false, why+"; namespace stays closed ("+string(lease.CodeOf(err))+")")
		return Report{}, err
	}
	st, err := ns.State(ctx)
	if err != nil {
		return deny(err, "restored state unreadable")
	}

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
	// A restored active record's token counts too: a backup whose record
	// is ahead of its counter must not have that token issued again.
	for _, a := range st.Active {
		keys[a.LockKey] = true
		rep.MaxKnownToken = max(rep.MaxKnownToken, a.FencingToken)
		if a.FencingToken > st.Counters[a.LockKey] {
			rep.Shortfalls = append(rep.Shortfalls, a.LockKey)
		}
	}
	for k, m := range proof.Marks {
		if err := lease.CheckLockKey(k); err != nil {
			return deny(err, "downstream proof names a malformed lock key")
		}
		keys[k] = true
		rep.MaxKnownToken = max(rep.MaxKnownToken, m)
		if m > st.Counters[k] {
			rep.Shortfalls = append(rep.Shortfalls, k)
		}
	}
	sort.Strings(rep.Shortfalls)
	rep.Shortfalls = slices.Compact(rep.Shortfalls)
	plan := lease.RecoveryPlan{Reason: RevokeReason}
	rep.EpochNumber = st.Epoch
	var decision string
	if !proof.Complete || len(rep.Shortfalls) > 0 {
		rep.Epoch = true
		if rep.MaxKnownToken > lease.MaxFencingToken-gap {
			return deny(lease.Errorf(lease.CodeCounterExhausted, "recovery epoch would exceed the fencing token limit"),
				fmt.Sprintf("epoch would exceed the fencing token limit (max known token %d, gap %d)", rep.MaxKnownToken, gap))
		}
		rep.Floor = rep.MaxKnownToken + gap
		rep.EpochNumber = st.Epoch + 1
		plan.Epoch, plan.Floor = rep.EpochNumber, rep.Floor
		plan.Counters = make(map[string]uint64, len(keys))
		for k := range keys {
			plan.Counters[k] = rep.Floor
		}
		decision = fmt.Sprintf("epoch path (proof complete: %t, shortfalls: %d): epoch %d, every counter and the floor raised to %d = max known token %d + gap %d over %d identities",
			proof.Complete, len(rep.Shortfalls), rep.EpochNumber, rep.Floor, rep.MaxKnownToken, gap, len(keys))
	} else {
		decision = fmt.Sprintf("proof complete: every restored counter covers every downstream token (max known token %d); counters kept", rep.MaxKnownToken)
	}
	decision += fmt.Sprintf("; backup %s; proof sources %v with %d marks; %d active leases to end",
		backupName(st.Marker.BackupSHA256), proof.Sources, len(proof.Marks), len(st.Active))
	// The decision is durable before anything changes.
	if err := Step(ctx, o.Audit, log, audit.EventRecoveryVerify, true, decision); err != nil {
		return Report{}, err
	}
	res, err := ns.Finish(ctx, plan)
	// A Finish that failed part-way (a backend without one transaction for
	// it) may still have ended leases: each is audited either way.
	var errs []error
	for _, id := range res.Revoked {
		errs = append(errs, Step(ctx, o.Audit, log, audit.EventRecoveryRevoke, true, "restored lease "+id+" revoked: "+RevokeReason))
	}
	if err != nil {
		return deny(errors.Join(fmt.Errorf("recovery: %w", err), errors.Join(errs...)), "recovery step failed")
	}
	rep.Raised, rep.Revoked, rep.Expired = res.Raised, res.Revoked, res.Expired
	errs = append(errs, Step(ctx, o.Audit, log, audit.EventRecoveryReopen, true,
		fmt.Sprintf("namespace reopened: epoch path %t, epoch %d, floor %d, %d counters raised, %d leases revoked, %d archived as expired",
			rep.Epoch, rep.EpochNumber, rep.Floor, rep.Raised, len(rep.Revoked), len(rep.Expired))))
	// The namespace is open and correct; an audit write that failed now is
	// reported, not undone.
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("%w: %w", ErrReopenedAuditIncomplete, err)
	}
	return rep, nil
}

// backupName names a backup in an audit reason.
func backupName(sha string) string {
	if sha == "" {
		return "none (failover)"
	}
	return ShortSHA(sha)
}

// ShortSHA names a backup in an audit reason by its checksum's first 16
// hex digits: the whole 64 would trip the audit's guard against key
// material.
func ShortSHA(sha string) string { return "sha256:" + sha[:min(16, len(sha))] }
