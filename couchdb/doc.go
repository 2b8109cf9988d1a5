// Package couchdb is the fenced CouchDB writer of StarIntel target leases:
// enforcement points 1 (target acceptance and state), 2 (result documents
// of exclusive execution), 4 (scheduler completion/reschedule state) and 5
// (job checkpoint and terminal state) of the fenced-write boundary (package
// fence), and the CouchDB part of point 6 (after force-release or revoke,
// the invalidated lease's commits are rejected).
//
// It speaks CouchDB's HTTP API with net/http only, so it runs unchanged on
// Apache CouchDB and on pouchdb-server (which the tests use).
//
// # A fenced database
//
// InstallFence installs the design document _design/starintel_fence whose
// validate_doc_update (ValidateDocUpdate) makes the whole database fenced:
// every write of every non-design document — create, update, delete, from
// any client, through PUT, POST, DELETE, _bulk_docs or replication — must
// carry a complete, consistent starintel_fence object (the JSON form of fence.Guard:
// lock_key, lease_id, fencing_token, execution_id, job_id, trace_id, sink,
// commit_id, target, payload_sha256, accepted_at) bound to this document
// (target equal to its _id; a typed document's id and lock identity
// matching the fence, a job document's job_id equal to the fence's),
// and is refused (HTTP 403) when the stored document's fence has a
// different lock key, a higher token, or the same token under another
// lease. That is fence.Admit plus the target half of Guard.Authorizes,
// evaluated by CouchDB atomically with the write; the tests run one table
// of cases through both and require the same verdicts. The payload half
// (payload_sha256, the SHA-256 of the body bytes the Writer was given) is
// checked by the Writer before it sends anything: CouchDB's JavaScript has
// no hash function. Keep fenced documents in a database of
// their own: unfenced documents cannot be written there. Design documents
// are not fenced (writing them needs admin rights anyway; an admin can
// remove the fence, which is outside what fencing can defend).
//
// # The write
//
// Writer is a fence.Sink[Doc]. fence.Write authorizes a commit at the
// lease backend (lease_lost if the lease expired, was released,
// force-released or revoked, or a successor acquired) and hands the
// resulting guard to Writer.Commit, which reads the document, then PUTs it
// with the read _rev (none for a create) and the guard as its fence.
// CouchDB decides both conditions at once: the _rev (409 if another write
// came between) and the fence (403 if the token is stale). A holder that
// was authorized and then paused past its expiry while a successor wrote is
// therefore refused by CouchDB itself: a check followed by an unconditional
// write would not be fencing.
//
// # Results
//
// Every error is an *Error: a Kind (ErrFenceRejected, ErrConflict,
// ErrOutcomeUnknown, ErrUnavailable, …) for errors.Is, and the typed
// *lease.Error it maps to for errors.As and lease.CodeOf:
//
//	403 from the fence        ErrFenceRejected   commit_rejected (reported as lease loss by fence.Write)
//	409 stale _rev            ErrConflict        lease_conflict  (not lease loss; re-read, then decide)
//	sent, no answer / 5xx     ErrOutcomeUnknown  lease_outcome_unknown
//	not sent (dial failure)   ErrUnavailable     lease_backend_unavailable
//	401, other 403            ErrAccessDenied    access_denied
//
// Nothing is retried by this package. A 409 is not turned into lease loss:
// the writer cannot tell a successor's write (after which a retry gets 403)
// from a concurrent write of the same lease or an authorized predecessor's
// late write (after which a retry succeeds). A repeated fence.Write with the
// same commit id is always safe: the authorization replays (same guard) and
// the write is conditioned again; if the first attempt did land (an unknown
// outcome), the writer finds its own fence and body on the document and
// reports success without writing again.
//
// # Deletes
//
// The fence refuses every delete of a fenced document, even one carrying a
// valid fence: a DELETE reaches validate_doc_update as {_id, _rev,
// _deleted: true} without the fence, and a re-creation of a deleted
// document is validated against no old document (CouchDB and
// pouchdb-server alike), so a tombstone would drop the token high-water
// mark and let a stale holder re-create the document. Mark a document
// gone with a fenced state instead (for example a terminal status);
// physical removal (purge, compaction of a retired database) is an
// administrator's job outside the fence.
//
// # Limits
//
// The fence is checked for consistency, not authenticity: CouchDB's
// JavaScript has no key to verify it with, so a client with write access
// to the database can fabricate one (a higher commit_seq, any token under a
// made-up lease id) and replace a document, or raise its token so that
// every later holder is refused on it. Fencing defends documents against
// stale holders and unlucky timing among writers that take their guards
// from starlease; who may write at all is CouchDB's access control. Give
// write access to a fenced database only to StarIntel's writers (the
// database's _security members), never to readers or third parties.
//
// The fence protects documents written through validate_doc_update. It
// does not stop a client with admin rights from replacing the design
// document or purging, nor a replication with new_edits=false from adding
// a conflicting revision whose fence the validator checks only against
// that revision's own ancestor; StarIntel writers never do either. Each
// document is bound to the first lock key that wrote it; the typed helpers
// derive every document id from the canonical identity (a job document's
// id is job:<identity>~<job_id>, since a job id is whatever an acquirer
// sent) and check that the guard belongs to that identity before writing,
// and validate_doc_update checks the same id against the lock key it
// recomputes from the document's lock_identity.
//
// # Job documents of the old form
//
// Job documents were once named job:<job_id>, which let a lease of
// another identity that claimed the same job id create a job's document
// first and lock its real holder out. Documents of that form are no longer
// read or written by Jobs, and validate_doc_update refuses every write of
// one, creation included; existing ones stay frozen (readable with DB.Get)
// until an administrator removes them. A job's state is found under the
// identity whose lease runs it: Jobs.Get(ctx, identity, jobID).
package couchdb
