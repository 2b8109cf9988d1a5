package recovery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// CouchDBPageSize is how many documents CouchDBProof reads per request.
const CouchDBPageSize = 100

// CouchDBSource is one fenced CouchDB database to read downstream marks
// from. It takes the same connection options as couchdb.New (the base URL
// must not carry credentials; Username/Password are sent as HTTP basic
// authentication only when Username is set).
type CouchDBSource struct {
	URL      string
	Database string
	Username string
	Password string
	// Client is the HTTP client; nil means one with couchdb.DefaultTimeout.
	Client *http.Client
}

// Name is the source as recorded in Proof.Sources: base URL and database,
// never credentials.
func (s CouchDBSource) Name() string {
	return "couchdb:" + strings.TrimRight(s.URL, "/") + "/" + s.Database
}

// CouchDBProof reads every non-design document of the fenced database src
// (couchdb.DB.AllDocs: CouchDB's _all_docs, paged) and observes the
// lock_key and fencing_token of each document's starintel_fence in proof:
// the fence makes a document's current fence the highest token accepted
// for it. It first checks that the database carries the fence
// (couchdb.DB.CheckFence): an unfenced database proves nothing. A document
// without a complete, well-formed fence, or with conflicting revisions
// (whose fences are not read), fails the whole proof with lease_corrupt;
// nothing is skipped silently. On success src is appended to
// proof.Sources. CouchDBProof never sets proof.Complete: only the
// operator can assert that every authoritative store was read.
func CouchDBProof(ctx context.Context, src CouchDBSource, proof *Proof) error {
	var opts []couchdb.Option
	if src.Client != nil {
		opts = append(opts, couchdb.WithHTTPClient(src.Client))
	}
	if src.Username != "" {
		opts = append(opts, couchdb.WithBasicAuth(src.Username, src.Password))
	}
	db, err := couchdb.New(src.URL, src.Database, opts...)
	if err != nil {
		return err
	}
	if err := db.CheckFence(ctx); err != nil {
		return err
	}

	marks := map[string]uint64{}
	startKey := ""
	docs := 0
	for {
		rows, err := db.AllDocs(ctx, startKey, CouchDBPageSize)
		if err != nil {
			return allDocsFailure(src, err)
		}
		for _, row := range rows {
			startKey = row.ID
			if strings.HasPrefix(row.ID, "_design/") || strings.HasPrefix(row.ID, "_local/") {
				continue
			}
			g, err := fenceOf(row)
			if err != nil {
				return lease.Errorf(lease.CodeCorrupt, "couchdb %s: document %q: %s; the downstream proof cannot be established", src.Database, row.ID, err)
			}
			marks[g.LockKey] = max(marks[g.LockKey], g.FencingToken)
			docs++
		}
		if len(rows) < CouchDBPageSize {
			break
		}
	}
	for k, t := range marks {
		proof.Observe(k, t)
	}
	proof.Sources = append(proof.Sources, fmt.Sprintf("%s (%d documents, %d lock keys)", src.Name(), docs, len(marks)))
	return nil
}

// allDocsFailure is the error of a failed _all_docs page: lease_corrupt
// if the answer arrived (HTTP 200) but is not a page, else
// backend_unavailable, naming the HTTP status CouchDB answered, if any.
func allDocsFailure(src CouchDBSource, err error) error {
	var ce *couchdb.Error
	errors.As(err, &ce)
	switch {
	case errors.Is(err, couchdb.ErrCorrupt) || (ce != nil && ce.Status == http.StatusOK):
		return lease.Errorf(lease.CodeCorrupt, "couchdb %s: _all_docs answer is malformed", src.Database)
	case ce != nil && ce.Status != 0:
		return lease.Errorf(lease.CodeBackendUnavailable, "couchdb %s: _all_docs answered HTTP %d", src.Database, ce.Status)
	default:
		return lease.Errorf(lease.CodeBackendUnavailable, "couchdb %s could not be reached", src.Database)
	}
}

// fenceOf checks a document's starintel_fence (decoded by couchdb.DB.AllDocs).
func fenceOf(row couchdb.DocRow) (fence.Guard, error) {
	switch {
	case errors.Is(row.Err, couchdb.ErrDocNotObject):
		return fence.Guard{}, errors.New("the document is missing or not a JSON object")
	case len(row.Conflicts) > 0:
		return fence.Guard{}, errors.New("the document has conflicting revisions")
	case errors.Is(row.Err, couchdb.ErrFenceMalformed):
		return fence.Guard{}, errors.New("its " + couchdb.FenceField + " is malformed")
	case errors.Is(row.Err, couchdb.ErrFenceIncomplete): // a whole lock key, a token in range, every field
		return fence.Guard{}, errors.New("its " + couchdb.FenceField + " is incomplete")
	case row.Err != nil:
		return fence.Guard{}, row.Err
	case row.Doc.Fence == nil:
		return fence.Guard{}, errors.New("the document has no " + couchdb.FenceField)
	}
	return *row.Doc.Fence, nil
}
