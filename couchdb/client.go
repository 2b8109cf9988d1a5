package couchdb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// Limits.
const (
	// DefaultTimeout bounds each request of the default HTTP client. A
	// context deadline, if earlier, wins.
	DefaultTimeout = 30 * time.Second
	// MaxDocumentBytes bounds a document this package writes or reads.
	MaxDocumentBytes = 4 << 20
	// MaxDocIDBytes bounds a document id.
	MaxDocIDBytes = 2048
)

// dbNameRule is CouchDB's database name rule.
var dbNameRule = regexp.MustCompile(`^[a-z][a-z0-9_$()+/-]*$`)

// Option configures a DB.
type Option func(*DB)

// WithHTTPClient sets the HTTP client (transport, TLS, proxies, timeouts).
// nil means a client with DefaultTimeout. The client must not follow
// redirects for writes it cannot repeat safely; net/http's default policy
// does not re-send a PUT body on a redirect it cannot rewind, and CouchDB
// does not redirect document requests.
func WithHTTPClient(c *http.Client) Option { return func(db *DB) { db.client = c } }

// WithBasicAuth sends user and password as HTTP basic authentication on
// every request. They are kept only for the Authorization header: no error
// text, log line or URL this package builds contains them.
func WithBasicAuth(user, password string) Option {
	return func(db *DB) { db.user, db.password, db.auth = user, password, true }
}

// WithOperationClasses sets the closed set of operation classes the typed
// helpers normalize identities with; it must match the lease store's.
// Default: lease.DefaultOperationClasses().
func WithOperationClasses(c lease.OperationClasses) Option {
	return func(db *DB) { db.classes = c }
}

// DB is one CouchDB database reached over CouchDB's HTTP API with net/http
// only, so it runs unchanged on Apache CouchDB and on pouchdb-server. It is
// safe for concurrent use.
type DB struct {
	base     *url.URL
	name     string
	client   *http.Client
	auth     bool
	user     string
	password string
	classes  lease.OperationClasses

	// fenceOK records that CheckFence found the fence installed.
	fenceOK atomic.Bool
}

// New returns the database db of the CouchDB server at baseURL
// ("https://couch.example:6984", a path prefix is kept). baseURL must not
// carry credentials (use WithBasicAuth). db must follow CouchDB's database
// name rule. New does not contact the server.
func New(baseURL, db string, opts ...Option) (*DB, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, newError(ErrInvalid, "new", "", "base URL must be an absolute http or https URL")
	}
	if u.User != nil {
		return nil, newError(ErrInvalid, "new", "", "base URL must not carry credentials; use WithBasicAuth")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, newError(ErrInvalid, "new", "", "base URL must not have a query or fragment")
	}
	if len(db) > 238 || !dbNameRule.MatchString(db) {
		return nil, newError(ErrInvalid, "new", "", "database name does not follow CouchDB's rule")
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	d := &DB{base: u, name: db, classes: lease.DefaultOperationClasses()}
	for _, o := range opts {
		o(d)
	}
	if d.client == nil {
		d.client = &http.Client{Timeout: DefaultTimeout}
	}
	return d, nil
}

// Name returns the database name.
func (db *DB) Name() string { return db.name }

// reply is one HTTP answer.
type reply struct {
	status int
	body   []byte
	// couchError and reason are CouchDB's error members, if any.
	couchError string
	reason     string
}

// url builds the URL of a path below the database: each segment escaped.
func (db *DB) url(segments ...string) string {
	u := *db.base
	esc := []string{u.EscapedPath(), url.PathEscape(db.name)}
	raw := []string{u.Path, db.name}
	for _, s := range segments {
		esc = append(esc, url.PathEscape(s))
		raw = append(raw, s)
	}
	u.Path = strings.Join(raw, "/")
	u.RawPath = strings.Join(esc, "/")
	return u.String()
}

// docURL is the URL of a document; a design document keeps its "_design/"
// segment unescaped, as CouchDB expects.
func (db *DB) docURL(id string) string {
	if name, ok := strings.CutPrefix(id, "_design/"); ok {
		return db.url("_design", name)
	}
	return db.url(id)
}

// do sends one request whose answer is at most one document
// (MaxDocumentBytes). A transport error is returned as is; the caller
// classifies it (see sentNothing).
func (db *DB) do(ctx context.Context, method, target string, body []byte) (reply, error) {
	return db.doMax(ctx, method, target, body, MaxDocumentBytes)
}

// doMax is do for an answer of at most max bytes; a longer one is an error
// (with the reply's status).
func (db *DB) doMax(ctx context.Context, method, target string, body []byte, max int64) (reply, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		// pouchdb-server stores an empty document when a PUT has no JSON
		// content type; CouchDB needs it for some endpoints too.
		req.Header.Set("Content-Type", "application/json")
	}
	if db.auth {
		req.SetBasicAuth(db.user, db.password)
	}
	resp, err := db.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	r := reply{status: resp.StatusCode}
	r.body, err = io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err == nil && int64(len(r.body)) > max {
		err = errors.New("reply exceeds the document size limit")
	}
	if resp.StatusCode >= 400 {
		var e struct {
			Error  string `json:"error"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal(r.body, &e) == nil {
			r.couchError, r.reason = e.Error, e.Reason
		}
	}
	return r, err
}

// sentNothing reports whether a failed request provably never reached the
// server: before (the context's error when the request was about to be
// sent) is set, or the connection could not be made (dial or DNS failure).
// Any other failure of a write is an unknown outcome.
func sentNothing(before, err error) bool {
	if before != nil {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// readFailure types a failed read (nothing was written).
func readFailure(op, docID string, r reply, err error) *Error {
	if err != nil {
		e := newError(ErrUnavailable, op, docID, "couchdb could not be reached")
		e.Err = err
		e.Status = r.status
		return e
	}
	e := statusError(op, docID, r)
	if e.Kind == ErrOutcomeUnknown {
		// A read changes nothing: a server error is unavailability.
		e.Kind, e.Lease = ErrUnavailable, &lease.Error{Code: lease.CodeBackendUnavailable, Reason: "couchdb answered with a server error"}
	}
	return e
}

// statusError types a non-success answer.
func statusError(op, docID string, r reply) *Error {
	var e *Error
	switch {
	case r.status == http.StatusForbidden && strings.HasPrefix(r.reason, fenceReasonPrefix):
		reason := strings.TrimPrefix(r.reason, fenceReasonPrefix)
		switch {
		case reason == laterCommitReason:
			// Not a loss: a later commit of the same lease holds the
			// document (a concurrent write of the holder's own).
			e = newError(ErrConflict, op, docID, reason)
		case !fenceReasons[reason]:
			e = newError(ErrFenceRejected, op, docID, "the fence refused the write")
		default:
			e = newError(ErrFenceRejected, op, docID, reason)
		}
	case r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		e = newError(ErrAccessDenied, op, docID, "couchdb refused the credentials or the operation")
	case r.status == http.StatusConflict:
		e = newError(ErrConflict, op, docID, "document revision conflict: another write changed it since it was read")
	case r.status == http.StatusNotFound:
		e = newError(ErrNotFound, op, docID, "not found")
	case r.status == http.StatusBadRequest || r.status == http.StatusRequestEntityTooLarge ||
		r.status == http.StatusUnsupportedMediaType:
		e = newError(ErrInvalid, op, docID, "couchdb refused the request as malformed")
	case r.status >= 500:
		e = newError(ErrOutcomeUnknown, op, docID, "couchdb answered with a server error")
	default:
		e = newError(ErrUnavailable, op, docID, fmt.Sprintf("unexpected HTTP status %d", r.status))
	}
	e.Status, e.CouchError = r.status, r.couchError
	return e
}

// EnsureDatabase creates the database unless it exists (201 created, 412
// already there).
func (db *DB) EnsureDatabase(ctx context.Context) error {
	const op = "ensure_database"
	before := ctx.Err()
	r, err := db.do(ctx, http.MethodPut, db.url(), nil)
	if err != nil {
		kind := ErrOutcomeUnknown
		if sentNothing(before, err) {
			kind = ErrUnavailable
		}
		e := newError(kind, op, "", "couchdb could not be reached")
		e.Err = err
		return e
	}
	switch r.status {
	case http.StatusCreated, http.StatusAccepted, http.StatusPreconditionFailed:
		return nil
	}
	return statusError(op, "", r)
}

// designDoc is the fence design document.
type designDoc struct {
	ID                string `json:"_id"`
	Rev               string `json:"_rev,omitempty"`
	Language          string `json:"language"`
	ValidateDocUpdate string `json:"validate_doc_update"`
}

// readDesign reads the fence design document; found is false on 404.
func (db *DB) readDesign(ctx context.Context, op string) (d designDoc, found bool, err error) {
	r, terr := db.do(ctx, http.MethodGet, db.docURL(FenceDesignDocID), nil)
	if terr != nil || (r.status != http.StatusOK && r.status != http.StatusNotFound) {
		return designDoc{}, false, readFailure(op, FenceDesignDocID, r, terr)
	}
	if r.status == http.StatusNotFound {
		return designDoc{}, false, nil
	}
	if err := json.Unmarshal(r.body, &d); err != nil {
		return designDoc{}, false, newError(ErrCorrupt, op, FenceDesignDocID, "the design document is not JSON")
	}
	return d, true, nil
}

// current reports whether d is the fence this package installs.
func (d designDoc) current() bool {
	return d.ValidateDocUpdate == ValidateDocUpdate && (d.Language == "" || d.Language == "javascript")
}

// InstallFence installs or updates the design document FenceDesignDocID
// whose validate_doc_update is ValidateDocUpdate. It writes only when the
// stored function differs, so it is cheap to call at every start. A
// concurrent installer's 409 is retried (a bounded number of times, by
// re-reading): installing the same constant twice is harmless. Writing a
// design document needs CouchDB admin rights.
func (db *DB) InstallFence(ctx context.Context) error {
	const op = "install_fence"
	for attempt := 0; ; attempt++ {
		d, found, err := db.readDesign(ctx, op)
		if err != nil {
			return err
		}
		if found && d.current() {
			db.fenceOK.Store(true)
			return nil
		}
		body, _ := json.Marshal(designDoc{ID: FenceDesignDocID, Rev: d.Rev, Language: "javascript",
			ValidateDocUpdate: ValidateDocUpdate})
		before := ctx.Err()
		r, terr := db.do(ctx, http.MethodPut, db.docURL(FenceDesignDocID), body)
		if terr != nil {
			kind := ErrOutcomeUnknown
			if sentNothing(before, terr) {
				kind = ErrUnavailable
			}
			e := newError(kind, op, FenceDesignDocID, "couchdb could not be reached")
			e.Err = terr
			return e
		}
		switch {
		case r.status == http.StatusCreated || r.status == http.StatusAccepted:
			db.fenceOK.Store(true)
			return nil
		case r.status == http.StatusConflict && attempt < 3:
			continue
		}
		return statusError(op, FenceDesignDocID, r)
	}
}

// CheckFence verifies that the database's fence design document is
// installed with exactly ValidateDocUpdate; ErrFenceMissing otherwise. A
// Writer calls it before its first write (and again after a failure), so it
// never writes to a database without the downstream guard.
func (db *DB) CheckFence(ctx context.Context) error {
	const op = "check_fence"
	d, found, err := db.readDesign(ctx, op)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			// The database itself is missing.
			return newError(ErrFenceMissing, op, FenceDesignDocID, "the database does not exist")
		}
		return err
	}
	if !found || !d.current() {
		db.fenceOK.Store(false)
		return newError(ErrFenceMissing, op, FenceDesignDocID, "the fence design document is not installed; run InstallFence")
	}
	db.fenceOK.Store(true)
	return nil
}

// Stored is a document as CouchDB holds it.
type Stored struct {
	ID  string
	Rev string
	// Body is the document without its "_" members and without the fence.
	Body json.RawMessage
	// Fence is the guard of the write that produced this revision; nil if
	// the document has none.
	Fence *fence.Guard
}

// Get reads a document. A missing (or deleted) document is ErrNotFound; a
// document whose fence cannot be decoded is ErrCorrupt.
func (db *DB) Get(ctx context.Context, id string) (Stored, error) {
	const op = "get"
	if err := checkDocID(id); err != nil {
		return Stored{}, wrapLease(ErrInvalid, op, "", err)
	}
	s, found, err := db.get(ctx, op, id)
	if err != nil {
		return Stored{}, err
	}
	if !found {
		return Stored{}, newError(ErrNotFound, op, id, "document not found")
	}
	return s, nil
}

// get reads a document; found is false on 404.
func (db *DB) get(ctx context.Context, op, id string) (Stored, bool, error) {
	r, terr := db.do(ctx, http.MethodGet, db.docURL(id), nil)
	if terr == nil && r.status == http.StatusNotFound && r.reason != "no_db_file" && r.reason != "Database does not exist." {
		return Stored{}, false, nil
	}
	if terr != nil || r.status != http.StatusOK {
		return Stored{}, false, readFailure(op, id, r, terr)
	}
	s, err := decodeStored(r.body)
	if err != nil {
		return Stored{}, false, newError(ErrCorrupt, op, id, err.Error())
	}
	return s, true, nil
}

// MaxAllDocsLimit bounds the documents one AllDocs page asks for.
const MaxAllDocsLimit = 1000

// DocRow is one document of an AllDocs page.
type DocRow struct {
	// ID is the document id.
	ID string
	// Doc is the document's current revision, decoded as Get decodes it;
	// the zero Stored when Err is set.
	Doc Stored
	// Conflicts are the revisions in conflict with the current one
	// (CouchDB's _conflicts), none when there are none.
	Conflicts []string
	// Err is why the document does not decode, nil if it does:
	// ErrDocNotObject (missing, or not a JSON object), ErrFenceMalformed,
	// ErrFenceIncomplete, or another reason (no _id, no _rev, a malformed
	// _conflicts). The page is still read: the caller decides.
	Err error
}

// AllDocs reads one page of the database's documents (design documents
// included) in id order: CouchDB's _all_docs with the documents and their
// conflicting revisions, up to limit (1 to MaxAllDocsLimit) rows. The
// first page starts at the first document (startKey empty); the next
// starts after the previous page's last id, passed as startKey (CouchDB
// starts at startKey and skips that row). A page shorter than limit is the
// last. Failures are *Error values of op "all_docs", classified as for
// Get; an answer that is not an _all_docs page is ErrCorrupt.
func (db *DB) AllDocs(ctx context.Context, startKey string, limit int) ([]DocRow, error) {
	const op = "all_docs"
	if limit < 1 || limit > MaxAllDocsLimit {
		return nil, newError(ErrInvalid, op, "", fmt.Sprintf("limit must be 1 to %d", MaxAllDocsLimit))
	}
	q := url.Values{"include_docs": {"true"}, "conflicts": {"true"}, "limit": {strconv.Itoa(limit)}}
	if startKey != "" {
		k, _ := json.Marshal(startKey)
		q.Set("startkey", string(k))
		q.Set("skip", "1")
	}
	// One more document's worth of room than the page holds: the
	// envelope and the rows' ids and revisions.
	r, terr := db.doMax(ctx, http.MethodGet, db.url("_all_docs")+"?"+q.Encode(), nil, int64(limit+1)*MaxDocumentBytes)
	if terr != nil || r.status != http.StatusOK {
		return nil, readFailure(op, "", r, terr)
	}
	var page struct {
		Rows *[]struct {
			ID  string          `json:"id"`
			Doc json.RawMessage `json:"doc"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(r.body, &page); err != nil || page.Rows == nil {
		return nil, newError(ErrCorrupt, op, "", "the _all_docs answer is malformed")
	}
	rows := make([]DocRow, 0, len(*page.Rows))
	for _, row := range *page.Rows {
		rows = append(rows, decodeRow(row.ID, row.Doc))
	}
	return rows, nil
}

// decodeRow decodes one document of an _all_docs page.
func decodeRow(id string, raw json.RawMessage) DocRow {
	row := DocRow{ID: id}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		row.Err = ErrDocNotObject
		return row
	}
	if c, ok := m["_conflicts"]; ok && string(c) != "null" {
		if err := json.Unmarshal(c, &row.Conflicts); err != nil {
			row.Err = errors.New("the stored _conflicts is malformed")
			return row
		}
	}
	row.Doc, row.Err = storedOf(m)
	return row
}

// decodeStored splits a document into its revision, body and fence.
func decodeStored(raw []byte) (Stored, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return Stored{}, ErrDocNotObject
	}
	return storedOf(m)
}

// storedOf is decodeStored of a document's members.
func storedOf(m map[string]json.RawMessage) (Stored, error) {
	var s Stored
	if err := json.Unmarshal(m["_id"], &s.ID); err != nil {
		return Stored{}, errors.New("the stored document has no _id")
	}
	if err := json.Unmarshal(m["_rev"], &s.Rev); err != nil {
		return Stored{}, errors.New("the stored document has no _rev")
	}
	if f, ok := m[FenceField]; ok && string(f) != "null" {
		var g fence.Guard
		if err := json.Unmarshal(f, &g); err != nil {
			return Stored{}, ErrFenceMalformed
		}
		if g.Validate() != nil {
			return Stored{}, ErrFenceIncomplete
		}
		s.Fence = &g
	}
	body := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		if !strings.HasPrefix(k, "_") && k != FenceField {
			body[k] = v
		}
	}
	s.Body, _ = json.Marshal(body)
	return s, nil
}

// checkDocID validates a document id this package writes or reads: not
// empty, bounded, valid UTF-8 without control characters, and not one of
// CouchDB's reserved "_" ids.
func checkDocID(id string) *lease.Error {
	switch {
	case id == "":
		return lease.Invalid("doc_id", "must not be empty")
	case len(id) > MaxDocIDBytes:
		return lease.Invalid("doc_id", "is too long")
	case !utf8.ValidString(id):
		return lease.Invalid("doc_id", "must be valid UTF-8")
	case strings.HasPrefix(id, "_"):
		return lease.Invalid("doc_id", "must not start with _")
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return lease.Invalid("doc_id", "must not contain control characters")
		}
	}
	return nil
}
