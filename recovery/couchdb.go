package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
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
// (CouchDB's _all_docs?include_docs=true, paged) and observes the
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
	client := src.Client
	if client == nil {
		client = &http.Client{Timeout: couchdb.DefaultTimeout}
	}
	base, _ := url.Parse(src.URL) // valid: couchdb.New accepted it
	base.Path = strings.TrimRight(base.Path, "/") + "/" + src.Database + "/_all_docs"
	base.RawPath = ""

	marks := map[string]uint64{}
	startKey := ""
	docs := 0
	for {
		q := url.Values{"include_docs": {"true"}, "conflicts": {"true"}, "limit": {strconv.Itoa(CouchDBPageSize)}}
		if startKey != "" {
			k, _ := json.Marshal(startKey)
			q.Set("startkey", string(k))
			q.Set("skip", "1")
		}
		u := *base
		u.RawQuery = q.Encode()
		rows, err := allDocsPage(ctx, client, src, u.String())
		if err != nil {
			return err
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

type allDocsRow struct {
	ID  string          `json:"id"`
	Doc json.RawMessage `json:"doc"`
}

// allDocsPage reads one page of _all_docs.
func allDocsPage(ctx context.Context, client *http.Client, src CouchDBSource, target string) ([]allDocsRow, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, lease.Errorf(lease.CodeInvalidRequest, "cannot build the _all_docs request")
	}
	req.Header.Set("Accept", "application/json")
	if src.Username != "" {
		req.SetBasicAuth(src.Username, src.Password)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "couchdb %s could not be reached", src.Database)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "couchdb %s: _all_docs answered HTTP %d", src.Database, resp.StatusCode)
	}
	var page struct {
		Rows *[]allDocsRow `json:"rows"`
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, int64(CouchDBPageSize+1)*couchdb.MaxDocumentBytes))
	if err := dec.Decode(&page); err != nil || page.Rows == nil {
		return nil, lease.Errorf(lease.CodeCorrupt, "couchdb %s: _all_docs answer is malformed", src.Database)
	}
	return *page.Rows, nil
}

// fenceOf decodes and checks a document's starintel_fence.
func fenceOf(row allDocsRow) (fence.Guard, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(row.Doc, &doc); err != nil || doc == nil {
		return fence.Guard{}, errors.New("the document is missing or not a JSON object")
	}
	if c, ok := doc["_conflicts"]; ok && string(c) != "[]" && string(c) != "null" {
		return fence.Guard{}, errors.New("the document has conflicting revisions")
	}
	raw, ok := doc[couchdb.FenceField]
	if !ok || string(raw) == "null" {
		return fence.Guard{}, errors.New("the document has no " + couchdb.FenceField)
	}
	var g fence.Guard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&g); err != nil {
		return fence.Guard{}, errors.New("its " + couchdb.FenceField + " is malformed")
	}
	if g.Validate() != nil { // a whole lock key, a token in range, every field
		return fence.Guard{}, errors.New("its " + couchdb.FenceField + " is incomplete")
	}
	return g, nil
}
