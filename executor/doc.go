// Package executor runs leased work: it acquires a target lease, keeps it
// alive with renewals scheduled before expiry (with a safety margin and
// jitter), hands the work a context that is cancelled — with a cause naming
// why — as soon as the lease can no longer be trusted, gives the work the
// fence.Committer through which every authoritative commit must pass, and
// releases the lease when the work returns, fails or panics.
//
// # Cancellation is advisory; fencing is the authority
//
// A holder can be paused (GC, SIGSTOP, a VM migration, a partition) at any
// point, past its expiry, while a successor acquires. Nothing the executor
// does locally can stop such a holder from running on; what stops its effects
// is the fenced-write boundary: every commit is authorized by the lease
// backend at its linearization point (Lease.Committer, package fence) and the
// write is conditioned on the resulting guard in the downstream store. The
// cancellation is there so well-behaved work stops early and wastes nothing;
// correctness never depends on it.
//
// # Time
//
// Backend time decides. The executor never compares a backend timestamp with
// its own clock: it estimates expiry locally as the local send time of the
// request that produced the lease (or the renewal) plus the duration the
// backend granted (expires_at − renewed_at, both backend times), minus a
// small skew allowance. The send time precedes the backend's decision, so the
// estimate is never later than the truth (up to clock-rate skew, which the
// allowance covers). A renewal reply that arrives after its local deadline
// grants nothing by itself: the executor inspects the lease and continues
// only if the backend shows it active with the renewed expiry.
//
// # Causes
//
// context.Cause of the work context is a *CauseError that matches (with
// errors.Is) exactly one of ErrLeaseExpired, ErrRenewalRejected, ErrLeaseLost,
// ErrBackendUnavailable, ErrReleased, ErrRevoked — and, where the backend
// answered, also carries its *lease.Error (errors.As) — or ErrWorkDone once
// the work has returned, or the parent context's cause.
package executor
