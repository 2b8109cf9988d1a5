package couchdb

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// Doc is one fenced document write.
type Doc struct {
	// ID is the document id. Derive it from trusted, canonical values (the
	// typed helpers do); never from raw input.
	ID string
	// Body is the document content: a JSON object without "_" members
	// (CouchDB's) and without FenceField (the writer's).
	Body json.RawMessage
}

// Writer is the fenced CouchDB writer: a fence.Sink[Doc]. Its Commit writes
// a document conditioned on the commit's guard, in CouchDB, atomically:
// the document carries the guard as its starintel_fence, the PUT is
// conditioned on the revision the writer read, and the database's
// validate_doc_update (ValidateDocUpdate) refuses the write unless
// fence.Admit(stored fence, guard) holds.
//
// It is safe for concurrent use. It never retries a write.
type Writer struct {
	db   *DB
	name string
}

var _ fence.Sink[Doc] = (*Writer)(nil)

// Writer returns the fenced writer of this database under sink name (a
// canonical identifier, e.g. "couchdb"): the name commits are authorized
// for, and which the lease backend keeps the token high-water mark under.
// Writers of one database may share a name (one high-water mark for all
// their documents) or not.
func (db *DB) Writer(sink string) (*Writer, error) {
	n, err := lease.NormalizeIdentifier("sink", sink)
	if err != nil || n != sink {
		return nil, newError(ErrInvalid, "writer", "", "sink name must be a canonical identifier")
	}
	return &Writer{db: db, name: sink}, nil
}

// DB returns the writer's database.
func (w *Writer) DB() *DB { return w.db }

// Name returns the sink name commits are authorized for.
func (w *Writer) Name() string { return w.name }

// Bind names the write of doc: its document id and the SHA-256 of the
// body bytes as given (Doc.Body), which is what a guard for it carries.
// The ids of the typed documents (target:, result:, schedule:, job:) are
// refused: those are written only through their typed sinks, which bind
// them to the lease's identity and job.
func (w *Writer) Bind(doc Doc) (fence.Binding, error) {
	if err := checkUntypedDocID(doc.ID); err != nil {
		return fence.Binding{}, wrapLease(ErrInvalid, "bind", "", err)
	}
	return w.bind(doc)
}

func (w *Writer) bind(doc Doc) (fence.Binding, error) {
	if err := checkDocID(doc.ID); err != nil {
		return fence.Binding{}, wrapLease(ErrInvalid, "bind", "", err)
	}
	return fence.Binding{Target: doc.ID, PayloadSHA256: lease.PayloadSHA256(doc.Body)}, nil
}

// typedPrefixes are the ids of the typed documents (points.go).
var typedPrefixes = []string{"target:", "result:", "schedule:", "job:"}

func checkUntypedDocID(id string) *lease.Error {
	for _, p := range typedPrefixes {
		if strings.HasPrefix(id, p) {
			return lease.Invalid("doc_id", "a typed document ("+p+"…) is written through its typed sink")
		}
	}
	return nil
}

// Commit writes doc conditioned on g:
//
//  1. g must be a complete guard authorized for this sink and for exactly
//     this write, doc's id and body (Bind; else ErrFenceRejected, before
//     anything is sent: the writer never writes without a guard, and never
//     with a guard issued for another document or body);
//  2. the database must have the fence installed (checked once, then
//     cached; ErrFenceMissing otherwise);
//  3. the current document is read (404: it is created);
//  4. if it already carries exactly g and the same body, the write already
//     happened (a repeated fence.Write after an unknown outcome): success,
//     nothing is sent; the same g with another body is idempotency_conflict;
//  5. the document is PUT with the read _rev (none for a create), the body
//     and g as its starintel_fence.
//
// Results: nil when CouchDB accepted the write (201/202); ErrFenceRejected
// (commit_rejected) when validate_doc_update refused it (403: a lower token,
// another lease at the same token, another lock key); ErrConflict
// (lease_conflict) on 409; ErrOutcomeUnknown when the PUT may have been
// applied but no answer came; ErrUnavailable when nothing was sent. Errors
// are *Error; none is retried here.
func (w *Writer) Commit(ctx context.Context, g fence.Guard, doc Doc) error {
	if err := checkUntypedDocID(doc.ID); err != nil {
		return wrapLease(ErrInvalid, "commit", "", err)
	}
	return w.commit(ctx, g, doc)
}

func (w *Writer) commit(ctx context.Context, g fence.Guard, doc Doc) error {
	const op = "commit"
	if err := g.Validate(); err != nil {
		return wrapLease(ErrFenceRejected, op, doc.ID, lease.AsError(err))
	}
	if g.Sink != w.name {
		return newError(ErrFenceRejected, op, doc.ID, "the guard was authorized for another sink")
	}
	bound, err := w.bind(doc)
	if err != nil {
		return err
	}
	fields, berr := bodyFields(doc.Body)
	if berr != nil {
		return wrapLease(ErrInvalid, op, doc.ID, berr)
	}
	if err := g.Authorizes(bound); err != nil {
		return wrapLease(ErrFenceRejected, op, doc.ID, lease.AsError(err))
	}
	if !w.db.fenceOK.Load() {
		if err := w.db.CheckFence(ctx); err != nil {
			return err
		}
	}

	cur, found, err := w.db.get(ctx, op, doc.ID)
	if err != nil {
		return err
	}
	if found && cur.Fence != nil && sameGuard(*cur.Fence, g) {
		if sameBody(cur.Body, fields) {
			return nil
		}
		return wrapLease(ErrInvalid, op, doc.ID, &lease.Error{Code: lease.CodeIdempotencyConflict,
			Reason: "the commit id was already used for another body"})
	}

	out := make(map[string]json.RawMessage, len(fields)+3)
	for k, v := range fields {
		out[k] = v
	}
	out["_id"], _ = json.Marshal(doc.ID)
	if found {
		out["_rev"], _ = json.Marshal(cur.Rev)
	}
	if out[FenceField], err = json.Marshal(g); err != nil {
		return newError(ErrFenceRejected, op, doc.ID, "the guard cannot be encoded")
	}
	body, err := json.Marshal(out)
	if err != nil {
		return newError(ErrInvalid, op, doc.ID, "the document cannot be encoded")
	}
	if len(body) > MaxDocumentBytes {
		return newError(ErrInvalid, op, doc.ID, "the document exceeds the size limit")
	}

	before := ctx.Err()
	r, terr := w.db.do(ctx, http.MethodPut, w.db.docURL(doc.ID), body)
	if terr != nil {
		if r.status == http.StatusCreated || r.status == http.StatusAccepted {
			// The answer's status arrived; only its body was cut short.
			return nil
		}
		if r.status == 0 {
			kind, reason := ErrOutcomeUnknown, "the write was sent and no answer came; repeat it with the same commit id"
			if sentNothing(before, terr) {
				kind, reason = ErrUnavailable, "couchdb could not be reached; nothing was written"
			}
			e := newError(kind, op, doc.ID, reason)
			e.Err = terr
			return e
		}
	}
	switch r.status {
	case http.StatusCreated, http.StatusAccepted:
		return nil
	case http.StatusNotFound:
		// PUT answers 404 only when the database is missing.
		e := newError(ErrUnavailable, op, doc.ID, "the database does not exist; nothing was written")
		e.Status, e.CouchError = r.status, r.couchError
		return e
	}
	return statusError(op, doc.ID, r)
}

// bodyFields decodes a document body: a JSON object without reserved
// members. A nil body is the empty object.
func bodyFields(body json.RawMessage) (map[string]json.RawMessage, *lease.Error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return map[string]json.RawMessage{}, nil
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || fields == nil || dec.More() {
		return nil, lease.Invalid("body", "must be a JSON object")
	}
	for k := range fields {
		if strings.HasPrefix(k, "_") || k == FenceField {
			return nil, lease.Invalid("body", "must not hold _ members or "+FenceField)
		}
	}
	return fields, nil
}

// sameGuard reports whether a stored fence is exactly g.
func sameGuard(a, b fence.Guard) bool {
	return a.LockKey == b.LockKey && a.LeaseID == b.LeaseID && a.FencingToken == b.FencingToken &&
		a.ExecutionID == b.ExecutionID && a.JobID == b.JobID && a.TraceID == b.TraceID && a.Sink == b.Sink &&
		a.CommitID == b.CommitID && a.Target == b.Target && a.PayloadSHA256 == b.PayloadSHA256 &&
		a.CommitSeq == b.CommitSeq && a.AcceptedAt.Time().Equal(b.AcceptedAt.Time())
}

// sameBody compares a stored body with the fields of a write as JSON
// values.
func sameBody(stored json.RawMessage, fields map[string]json.RawMessage) bool {
	b, err := json.Marshal(fields)
	if err != nil {
		return false
	}
	var x, y any
	if json.Unmarshal(stored, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
