package recovery

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// fencedDB creates database name on couch; fenced installs the fence.
func fencedDB(t *testing.T, couch *testenv.CouchDB, name string, fenced bool) *couchdb.DB {
	t.Helper()
	db, err := couchdb.New(couch.URL(), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.EnsureDatabase(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fenced {
		if err := db.InstallFence(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// putRaw writes a document bypassing the fenced writer.
func putRaw(t *testing.T, couch *testenv.CouchDB, db, id string, doc map[string]any) {
	t.Helper()
	if status, _ := testenv.JSONRequest(t, http.MethodPut, couch.URL()+"/"+db+"/"+id, doc); status != http.StatusCreated && status != http.StatusAccepted {
		t.Fatalf("PUT %s: HTTP %d", id, status)
	}
}

func TestCouchDBProofCollectsWrittenTokens(t *testing.T) {
	ctx := context.Background()
	couch := testenv.StartCouchDB(t)
	db := fencedDB(t, couch, "fenced-proof", true)
	w, err := db.Writer("couchdb")
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, filepath.Join(t.TempDir(), "live.db"))

	want := map[string]uint64{}
	n := 0
	// write acquires a lease on target, writes docs under it and releases.
	write := func(target string, docs ...string) {
		t.Helper()
		n++
		l := underLease(t, s, target, fmt.Sprintf("req-%d", n), false, func(_ *lease.Record, c *fence.Committer) {
			for i, doc := range docs {
				body, _ := json.Marshal(map[string]any{"target": target, "n": n})
				if _, err := fence.Write(ctx, c, w, fmt.Sprintf("commit-%d-%d", n, i), couchdb.Doc{ID: doc, Body: body}); err != nil {
					t.Fatalf("write %s: %v", doc, err)
				}
			}
		})
		want[l.LockKey] = l.FencingToken
	}
	write("target-a", "a-1")
	write("target-a", "a-1", "a-2") // token 2 overwrites a-1's fence
	write("target-a", "a-3")        // token 3: the highest for target-a
	write("target-b", "b-1")
	// More documents than one page, under one lease.
	many := make([]string, CouchDBPageSize+5)
	for i := range many {
		many[i] = fmt.Sprintf("c-%03d", i)
	}
	write("target-c", many...)
	if want[lockKeyOf(t, "target-a")] != 3 {
		t.Fatalf("setup: target-a token %d, want 3", want[lockKeyOf(t, "target-a")])
	}

	var proof Proof
	if err := CouchDBProof(ctx, CouchDBSource{URL: couch.URL(), Database: db.Name()}, &proof); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(proof.Marks, want) {
		t.Fatalf("marks %v, want %v", proof.Marks, want)
	}
	if proof.Complete {
		t.Fatal("CouchDBProof must not assert completeness")
	}
	if len(proof.Sources) != 1 || !strings.Contains(proof.Sources[0], db.Name()) ||
		!strings.Contains(proof.Sources[0], fmt.Sprintf("(%d documents, 3 lock keys)", 4+len(many))) {
		t.Fatalf("sources %v", proof.Sources)
	}

	// Marks accumulate across sources, keeping the highest.
	proof.Observe(lockKeyOf(t, "target-b"), 100)
	if err := CouchDBProof(ctx, CouchDBSource{URL: couch.URL() + "/", Database: db.Name()}, &proof); err != nil {
		t.Fatal(err)
	}
	if proof.Marks[lockKeyOf(t, "target-b")] != 100 || len(proof.Sources) != 2 {
		t.Fatalf("second source: %v %v", proof.Marks, proof.Sources)
	}
}

func lockKeyOf(t *testing.T, target string) string {
	t.Helper()
	id := ident
	id.TargetID = target
	_, k, err := lease.CanonicalLockKey(id, lease.DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCouchDBProofFailsClosed(t *testing.T) {
	ctx := context.Background()
	couch := testenv.StartCouchDB(t)
	goodFence := map[string]any{"lock_key": fencetest.LockKey("k1"), "lease_id": "l1", "fencing_token": 7, "execution_id": "e1",
		"sink": "couchdb", "commit_id": "c1", "accepted_at": lease.At(time.Now()).String()}
	bad := func(mut func(f map[string]any)) map[string]any {
		f := maps.Clone(goodFence)
		mut(f)
		return map[string]any{"x": 1, couchdb.FenceField: f}
	}
	cases := map[string]map[string]any{
		"no fence":        {"x": 1},
		"null fence":      {"x": 1, couchdb.FenceField: nil},
		"fence not obj":   {"x": 1, couchdb.FenceField: "k1:7"},
		"token as string": bad(func(f map[string]any) { f["fencing_token"] = "7" }),
		"token negative":  bad(func(f map[string]any) { f["fencing_token"] = -7 }),
		"token zero":      bad(func(f map[string]any) { f["fencing_token"] = 0 }),
		"no lock key":     bad(func(f map[string]any) { delete(f, "lock_key") }),
		"no commit id":    bad(func(f map[string]any) { delete(f, "commit_id") }),
		"bad accepted_at": bad(func(f map[string]any) { f["accepted_at"] = "yesterday" }),
	}
	i := 0
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			i++
			dbName := fmt.Sprintf("bad-%d", i)
			// Written before the fence was installed: the validator would
			// refuse it otherwise.
			fencedDB(t, couch, dbName, false)
			putRaw(t, couch, dbName, "good", map[string]any{"x": 0, couchdb.FenceField: goodFence})
			putRaw(t, couch, dbName, "bad", doc)
			fencedDB(t, couch, dbName, true)
			var proof Proof
			err := CouchDBProof(ctx, CouchDBSource{URL: couch.URL(), Database: dbName}, &proof)
			if lease.CodeOf(err) != lease.CodeCorrupt || !strings.Contains(err.Error(), `"bad"`) {
				t.Fatalf("err %v (%s), want lease_corrupt naming the document", err, lease.CodeOf(err))
			}
			if len(proof.Marks) != 0 || len(proof.Sources) != 0 {
				t.Fatalf("a failed proof recorded %v %v", proof.Marks, proof.Sources)
			}
		})
	}

	// The same documents are accepted when well formed (control).
	fencedDB(t, couch, "control", false)
	putRaw(t, couch, "control", "good", map[string]any{"x": 0, couchdb.FenceField: goodFence})
	fencedDB(t, couch, "control", true)
	var proof Proof
	if err := CouchDBProof(ctx, CouchDBSource{URL: couch.URL(), Database: "control"}, &proof); err != nil || proof.Marks[fencetest.LockKey("k1")] != 7 {
		t.Fatalf("control: %v %v", err, proof.Marks)
	}

	// An unfenced database proves nothing.
	fencedDB(t, couch, "unfenced", false)
	if err := CouchDBProof(ctx, CouchDBSource{URL: couch.URL(), Database: "unfenced"}, &proof); err == nil {
		t.Fatal("an unfenced database was accepted as proof")
	}
	// A missing database, an unreachable server.
	if err := CouchDBProof(ctx, CouchDBSource{URL: couch.URL(), Database: "missing"}, &proof); err == nil {
		t.Fatal("a missing database was accepted as proof")
	}
	if err := CouchDBProof(ctx, CouchDBSource{URL: "http://127.0.0.1:1", Database: "x"}, &proof); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("unreachable: %v", err)
	}
	if len(proof.Sources) != 1 {
		t.Fatalf("sources %v", proof.Sources)
	}
}
