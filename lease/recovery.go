package lease

import (
	"context"
	"errors"
	"time"
)

// The recovery protocol: what a backend offers package recovery for a
// namespace that is closed (every mutation refused with
// lease_backend_unavailable) after a restore or a failover, until recovery
// has decided its counters and reopened it. Every backend implements it the
// same way, so recovery's decision is made in one place.

// RestoreMarker names the backup a closed namespace was restored from
// (zero for a namespace closed by a failover).
type RestoreMarker struct {
	BackupCreatedAt time.Time `json:"backup_created_at"`
	BackupSHA256    string    `json:"backup_sha256"`
	RestoredAt      time.Time `json:"restored_at"`
}

// RestoredState is what a closed namespace holds that recovery decides on.
type RestoredState struct {
	Marker    RestoreMarker
	Epoch     uint64            // the namespace's recovery epoch so far
	Counters  map[string]uint64 // lock key → counter
	HighWater map[string]uint64 // lock key → highest mark over its sinks
	Active    []*Record         // active records found (live or expired)
}

// RecoveryPlan is recovery's decision for a closed namespace.
type RecoveryPlan struct {
	// Counters raises each lock key's counter to at least the value given
	// (creating it if absent). A counter is never lowered.
	Counters map[string]uint64
	// Epoch, if nonzero, is recorded as the namespace's new recovery epoch.
	Epoch uint64
	// Floor, if nonzero, becomes the namespace's counter floor: every
	// acquisition, of any identity, known or not, gets a token above it.
	Floor uint64
	// Reason is recorded on every active lease the recovery ends.
	Reason string
}

// Check refuses a plan no backend may apply: a counter of a malformed lock
// key (invalid_lease_request), or a counter or floor past the token limit
// (counter_exhausted). A backend checks it before it changes anything, so
// a refused plan changes nothing.
func (p RecoveryPlan) Check() error {
	for k, v := range p.Counters {
		if err := CheckLockKey(k); err != nil {
			return err
		}
		if v > MaxFencingToken {
			return Errorf(CodeCounterExhausted, "recovery epoch would exceed the fencing token limit")
		}
	}
	if p.Floor > MaxFencingToken {
		return Errorf(CodeCounterExhausted, "recovery epoch would exceed the fencing token limit")
	}
	return nil
}

// RecoveryEnding is how recovery ends one active record.
type RecoveryEnding struct {
	State  State     // StateRevoked or StateExpired
	At     Timestamp // the ended_at to record
	By     string    // RecoveryPrincipal for a revocation, "" for an expiry
	Reason string    // the plan's reason for a revocation
}

// Ending is how recovery ends rec at backend time now, through the
// backend's normal archive path: revoked at now by RecoveryPrincipal with
// the plan's reason if it is still live, else expired at its own
// expires_at (a restored TTL is never resurrected).
func (p RecoveryPlan) Ending(rec *Record, now Timestamp) RecoveryEnding {
	if rec.LiveAt(now) {
		return RecoveryEnding{State: StateRevoked, At: now, By: RecoveryPrincipal, Reason: p.Reason}
	}
	return RecoveryEnding{State: StateExpired, At: rec.ExpiresAt}
}

// RecoveryResult reports what finishing a recovery changed.
type RecoveryResult struct {
	Raised  int      // counters raised or created
	Revoked []string // lease ids of live leases revoked
	Expired []string // lease ids of leases already expired, archived as expired
	At      Timestamp
}

// Note records that leaseID was ended as e.
func (r *RecoveryResult) Note(leaseID string, e RecoveryEnding) {
	if e.State == StateRevoked {
		r.Revoked = append(r.Revoked, leaseID)
	} else {
		r.Expired = append(r.Expired, leaseID)
	}
}

// RecoveryPrincipal is recorded as the ender of leases recovery revokes.
const RecoveryPrincipal = "starlease-recovery"

// ErrNamespaceOpen is a backend's refusal to open a namespace that is not
// closed for recovery: recovery decides only for a namespace no lease
// operation can change meanwhile (a restore or a seal closes it). It is
// the operator's to fix, not the backend's, so it is no *Error.
var ErrNamespaceOpen = errors.New("namespace is open; restore into it or Seal it before recovery")

// ClosedNamespace is a namespace awaiting recovery verification.
//
// Finish applies a plan — raise counters, end every active lease through
// the backend's normal archive path (revoked with the plan's reason if
// live, expired if already expired: a TTL is never resurrected), record
// the epoch and floor — and only then reopens the namespace. A Finish that
// fails leaves the namespace closed, and running it again is safe; it
// still returns what it did change (the leases it ended), so they are
// audited.
type ClosedNamespace interface {
	State(ctx context.Context) (RestoredState, error)
	Finish(ctx context.Context, plan RecoveryPlan) (RecoveryResult, error)
	Close() error
}
