package couchdb_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// AllDocs pages through a database in id order and decodes each document
// as Get does, reporting a document it cannot decode in its row.
func TestAllDocs(t *testing.T) {
	ctx := context.Background()
	couch := testenv.StartCouchDB(t)
	e := &env{t: t, couch: couch}
	e.db = e.openDB("all-docs")
	if err := e.db.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	good := map[string]any{"lock_key": fencetest.LockKey("k1"), "lease_id": "l1", "fencing_token": 7, "execution_id": "e1",
		"sink": sinkName, "commit_id": "c1", "accepted_at": lease.At(time.Now()).String()}
	incomplete := map[string]any{"lock_key": fencetest.LockKey("k1"), "fencing_token": 7}
	for id, doc := range map[string]map[string]any{
		"a": {"x": 1},
		"b": {"x": 2, couchdb.FenceField: "k1:7"},
		"c": {"x": 3, couchdb.FenceField: incomplete},
		"d": {"x": 4, couchdb.FenceField: good},
	} {
		if status, _ := raw(t, http.MethodPut, e.docURL(id), doc); status != http.StatusCreated {
			t.Fatalf("PUT %s: HTTP %d", id, status)
		}
	}

	var rows []couchdb.DocRow
	var pages []int
	for start := ""; ; {
		page, err := e.db.AllDocs(ctx, start, 2)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, len(page))
		rows = append(rows, page...)
		if len(page) < 2 {
			break
		}
		start = page[len(page)-1].ID
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	if !slices.Equal(ids, []string{"a", "b", "c", "d"}) || !slices.Equal(pages, []int{2, 2, 0}) {
		t.Fatalf("ids %v in pages %v, want a b c d in 2 2 0", ids, pages)
	}
	if r := rows[0]; r.Err != nil || r.Doc.Fence != nil || r.Doc.ID != "a" || r.Doc.Rev == "" || string(r.Doc.Body) != `{"x":1}` || len(r.Conflicts) != 0 {
		t.Fatalf("unfenced document: %+v", r)
	}
	if !errors.Is(rows[1].Err, couchdb.ErrFenceMalformed) || !errors.Is(rows[2].Err, couchdb.ErrFenceIncomplete) {
		t.Fatalf("malformed and incomplete fences: %v, %v", rows[1].Err, rows[2].Err)
	}
	if r := rows[3]; r.Err != nil || r.Doc.Fence == nil || r.Doc.Fence.FencingToken != 7 {
		t.Fatalf("fenced document: %+v", r)
	}
	// The same decoding as Get.
	if got, err := e.db.Get(ctx, "d"); err != nil || got.Rev != rows[3].Doc.Rev || *got.Fence != *rows[3].Doc.Fence {
		t.Fatalf("Get %+v %v, AllDocs %+v", got, err, rows[3].Doc)
	}

	for _, limit := range []int{0, couchdb.MaxAllDocsLimit + 1} {
		if _, err := e.db.AllDocs(ctx, "", limit); !errors.Is(err, couchdb.ErrInvalid) {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	var ce *couchdb.Error
	if _, err := e.openDB("missing").AllDocs(ctx, "", 2); !errors.Is(err, couchdb.ErrNotFound) || !errors.As(err, &ce) ||
		ce.Op != "all_docs" || ce.Status != http.StatusNotFound {
		t.Fatalf("missing database: %v", err)
	}
	down, err := couchdb.New("http://127.0.0.1:1", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := down.AllDocs(ctx, "", 2); !errors.Is(err, couchdb.ErrUnavailable) || !errors.As(err, &ce) || ce.Status != 0 {
		t.Fatalf("unreachable: %v", err)
	}
}
