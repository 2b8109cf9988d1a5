package couchdb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/starintel/starlease/lease"
)

// Kinds of failure. Every error this package returns is an *Error whose
// Kind is one of these; errors.Is(err, ErrConflict) and the like select on
// it, and errors.As(err, &leaseErr) (or lease.CodeOf) gives the typed lease
// result it maps to.
var (
	// ErrFenceRejected: the fence refused the write — CouchDB's
	// validate_doc_update answered 403 with one of its reasons, or the
	// writer refused a guard that is incomplete or for another sink.
	// Code commit_rejected, which fence.Write reports to the committer's
	// loss handler. Never retried: the holder has lost the document.
	ErrFenceRejected = errors.New("couchdb: the fence rejected the write")
	// ErrConflict: a stale _rev (HTTP 409). Another write changed the
	// document between this writer's read and its write. Code
	// lease_conflict, not commit_rejected: the writer cannot tell a
	// successor's write from a concurrent write of the same lease (or an
	// authorized predecessor's late write), so it does not claim lease
	// loss. It is never retried by this package: the caller re-reads and
	// decides; repeating fence.Write with the same commit id is safe
	// (authorization replays, the write is conditioned again).
	ErrConflict = errors.New("couchdb: revision conflict")
	// ErrNotFound: the document (or the database) does not exist. Code
	// lease_not_found.
	ErrNotFound = errors.New("couchdb: not found")
	// ErrUnavailable: CouchDB could not be reached or could not answer
	// safely; nothing was written. Code lease_backend_unavailable.
	ErrUnavailable = errors.New("couchdb: unavailable")
	// ErrOutcomeUnknown: a write was (or may have been) sent and no
	// reliable answer came back (a timeout, a reset, a 5xx). Code
	// lease_outcome_unknown. Resolve by repeating fence.Write with the same
	// commit id: the writer finds its own fence on the document and
	// reports success without writing again.
	ErrOutcomeUnknown = errors.New("couchdb: outcome unknown")
	// ErrAccessDenied: CouchDB refused the credentials (401) or the
	// operation (403 not from the fence). Code access_denied.
	ErrAccessDenied = errors.New("couchdb: access denied")
	// ErrInvalid: the request is malformed (bad id, body or identity), or
	// CouchDB answered 400/413. Code invalid_lease_request (or
	// idempotency_conflict for a commit id reused with another body).
	ErrInvalid = errors.New("couchdb: invalid request")
	// ErrFenceMissing: the database has no (or another) fence design
	// document; the writer refuses to write without the downstream guard.
	// Code lease_backend_unavailable. Run InstallFence.
	ErrFenceMissing = errors.New("couchdb: fence design document not installed")
	// ErrCorrupt: a stored document or reply cannot be decoded (for
	// example a malformed stored fence). Code lease_corrupt.
	ErrCorrupt = errors.New("couchdb: corrupt document")
)

// Reasons a stored document does not decode: Get reports them as
// ErrCorrupt with the same text, and an AllDocs row carries them in
// DocRow.Err (errors.Is selects on them).
var (
	ErrDocNotObject    = errors.New("the stored document is not a JSON object")
	ErrFenceMalformed  = errors.New("the stored fence is malformed")
	ErrFenceIncomplete = errors.New("the stored fence is incomplete")
)

// Error is the typed failure of a CouchDB operation. Its text never holds
// credentials: they travel only in the Authorization header.
type Error struct {
	// Kind is one of the Err* sentinels above.
	Kind error
	// Op names the operation: "commit", "get", "all_docs",
	// "ensure_database", "install_fence", "check_fence".
	Op string
	// DocID is the document concerned, if any.
	DocID string
	// Status is the HTTP status CouchDB answered, 0 if none arrived.
	Status int
	// CouchError is CouchDB's "error" member ("forbidden", "conflict", …).
	CouchError string
	// Lease is the typed lease result this failure maps to.
	Lease *lease.Error
	// Err is the transport error, if any.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("couchdb: ")
	b.WriteString(e.Op)
	if e.DocID != "" {
		fmt.Fprintf(&b, " %q", e.DocID)
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.Status)
		if e.CouchError != "" {
			fmt.Fprintf(&b, " %s", e.CouchError)
		}
	}
	if e.Lease != nil {
		fmt.Fprintf(&b, ": %s", e.Lease.Error())
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap exposes the kind, the lease error and the transport error to
// errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 3)
	for _, err := range []error{e.Kind, e.Lease, e.Err} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// codeOfKind is the lease code each kind maps to by default.
var codeOfKind = map[error]lease.Code{
	ErrFenceRejected:  lease.CodeCommitRejected,
	ErrConflict:       lease.CodeConflict,
	ErrNotFound:       lease.CodeNotFound,
	ErrUnavailable:    lease.CodeBackendUnavailable,
	ErrOutcomeUnknown: lease.CodeOutcomeUnknown,
	ErrAccessDenied:   lease.CodeAccessDenied,
	ErrInvalid:        lease.CodeInvalidRequest,
	ErrFenceMissing:   lease.CodeBackendUnavailable,
	ErrCorrupt:        lease.CodeCorrupt,
}

// newError builds an *Error of kind with a lease error of the kind's code
// and reason.
func newError(kind error, op, docID, reason string) *Error {
	return &Error{Kind: kind, Op: op, DocID: docID, Lease: &lease.Error{Code: codeOfKind[kind], Reason: reason}}
}

// wrapLease builds an *Error of kind carrying le as its lease result.
func wrapLease(kind error, op, docID string, le *lease.Error) *Error {
	return &Error{Kind: kind, Op: op, DocID: docID, Lease: le}
}
