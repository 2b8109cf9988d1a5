package audit

import "time"

// Read bounds of the sinks that can be read back (bolt.AuditSink,
// valkey.AuditSink): a Read returns at most MaxReadLimit events, and
// DefaultReadLimit when no limit is asked for.
const (
	DefaultReadLimit = 100
	MaxReadLimit     = 1000
)

// ReadLimit is the number of events a Read asked for limit events returns
// at most: DefaultReadLimit for a limit of zero or less, else the limit,
// capped at MaxReadLimit.
func ReadLimit(limit int) int {
	if limit <= 0 {
		return DefaultReadLimit
	}
	return min(limit, MaxReadLimit)
}

// Filter selects stored events; zero fields match everything.
type Filter struct {
	EventType EventType
	TenantID  string
	ProgramID string
	LeaseID   string
	// Since keeps events whose event id time is at or after Since (NewEvent
	// gives the id and the timestamp the same instant).
	Since time.Time
	// After keeps events whose id sorts after After: pass the last id of
	// one page to read the next.
	After string
}

// Matches reports whether e has f's event type, tenant, program and lease
// id (each only when set in f). Since and After are positions in a sink's
// order, which each sink applies as it reads: Matches does not look at
// them.
func (f Filter) Matches(e *Event) bool {
	return (f.EventType == "" || e.EventType == f.EventType) &&
		(f.TenantID == "" || e.TenantID == f.TenantID) &&
		(f.ProgramID == "" || e.ProgramID == f.ProgramID) &&
		(f.LeaseID == "" || e.LeaseID == f.LeaseID)
}
