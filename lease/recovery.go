package lease

import (
	"context"
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

// RecoveryResult reports what finishing a recovery changed.
type RecoveryResult struct {
	Raised  int      // counters raised or created
	Revoked []string // lease ids of live leases revoked
	Expired []string // lease ids of leases already expired, archived as expired
	At      Timestamp
}

// RecoveryPrincipal is recorded as the ender of leases recovery revokes.
const RecoveryPrincipal = "starlease-recovery"

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
