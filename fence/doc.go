// Package fence is the fenced-write boundary of StarIntel target leases: the
// envelope every authoritative commit carries, the commit authorization at
// the lease backend's linearization point, and the guard a downstream writer
// conditions its write on. It is backend-neutral: anything with an
// AuthorizeCommit method (a lease.Store, the HTTP client) authorizes.
//
// # The boundary
//
// A commit is any authoritative mutation or externally visible effect of
// leased work: a CouchDB target or result document, a RabbitMQ publication
// of an exclusive result, scheduler completion state, a job checkpoint. Every
// commit passes two checks, and only together are they fencing:
//
//  1. Authorization. Committer.Authorize asks the lease backend, at its
//     linearization point and by backend time, whether the exact lease (lock
//     key, lease id, owner, service instance, fencing token) is still active
//     and unexpired and whether the token is not below the highest token the
//     sink has already accepted. A holder whose lease expired, was released,
//     force-released or revoked gets lease_lost; a lower token gets
//     commit_rejected. Authorization is idempotent by commit id, so an
//     outcome_unknown is retried with the same commit id.
//
//  2. The conditional write. The writer then makes the write conditional on
//     the Guard the authorization returned: the stored object records the
//     guard (lock key, lease id, token, execution, job, trace, the write it
//     was issued for, accepted_at), and the store itself refuses, atomically
//     with the write, a missing guard, a guard issued for another write, a
//     guard for a different lock key, or a token lower than the one it
//     already holds (Guard.Authorizes and Admit are that rule). For CouchDB this is a
//     validate_doc_update function plus the document _rev; for RabbitMQ a
//     fenced outbox written in the same atomic operation as the check.
//
// # One authorization, one write
//
// An authorization authorizes exactly one write. The commit request names
// it (Binding: the object the write changes in its sink, and the SHA-256 of
// what it writes there, as Sink.Bind computes it) and carries the lease's
// execution and job, which the backend compares with the lease. The commit
// id's idempotency digest covers all of it, so a replayed commit id returns
// the original authorization for that same write only, and is
// idempotency_conflict for any other, even after the lease ended. The guard
// carries the binding and the job; every sink checks it at its own
// linearization point (Guard.Authorizes beside Admit), so a guard is never
// usable for another document, body, job or message. A write authorized
// while the lease was live may still be made after the lease ended (the
// contract lets a commit linearized in time finish); a successor's higher
// token on the same object refuses it.
//
// A check followed by an unconditional write is not fencing: between the
// authorization and the write the holder can pause (GC, SIGSTOP, a slow
// network) past its expiry while a successor acquires and writes; only a
// store that compares tokens at write time rejects the stale write. Sink
// implementations MUST condition their write on the Guard; a Sink that
// writes unconditionally must not claim stale-holder exclusion.
//
// Cancellation of the holder's work (package executor) is advisory; this
// boundary is the authority.
package fence
