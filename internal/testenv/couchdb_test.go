package testenv

import (
	"encoding/json"
	"net"
	"strconv"
	"testing"
	"time"
)

// fenceValidate is a validate_doc_update of the kind the fenced CouchDB
// writer relies on: a write must carry a token no lower than the stored
// document's, else it is rejected with {forbidden: ...} (HTTP 403).
const fenceValidate = `function (newDoc, oldDoc, userCtx, secObj) {
  if (newDoc._id.indexOf('_design/') === 0) { return; }
  if (typeof newDoc.token !== 'number') {
    throw({forbidden: 'missing fencing token'});
  }
  if (oldDoc && !oldDoc._deleted && newDoc.token < oldDoc.token) {
    throw({forbidden: 'stale fencing token ' + newDoc.token + ' < ' + oldDoc.token});
  }
}`

type couchReply struct {
	OK     bool   `json:"ok"`
	ID     string `json:"id"`
	Rev    string `json:"rev"`
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

// couchDo sends one JSON request and decodes the reply, a JSON object.
func couchDo(t *testing.T, method, url string, body any) (int, map[string]any) {
	t.Helper()
	code, raw := JSONRequest(t, method, url, body)
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: %d: not a JSON object: %q", method, url, code, raw)
	}
	return code, v
}

func reply(v map[string]any) couchReply {
	b, _ := json.Marshal(v)
	var r couchReply
	_ = json.Unmarshal(b, &r)
	return r
}

func TestCouchDB(t *testing.T) {
	c := StartCouchDB(t)
	db := c.URL() + "/fenced"

	// GET / is the welcome object; pouchdb-server calls itself so.
	if code, v := couchDo(t, "GET", c.URL()+"/", nil); code != 200 || v["version"] == nil {
		t.Fatalf("GET /: %d %v", code, v)
	}

	// Create a database (no admin needed).
	if code, v := couchDo(t, "PUT", db, nil); code != 201 || v["ok"] != true {
		t.Fatalf("create database: %d %v", code, v)
	}
	if code, v := couchDo(t, "PUT", db, nil); code != 412 {
		t.Fatalf("create database twice: %d %v, want 412", code, v)
	}

	// Install the fence.
	code, v := couchDo(t, "PUT", db+"/_design/fence", map[string]any{"validate_doc_update": fenceValidate})
	if code != 201 {
		t.Fatalf("PUT design doc: %d %v", code, v)
	}

	// First write, token 5.
	code, v = couchDo(t, "PUT", db+"/job", map[string]any{"token": 5, "by": "holder-5"})
	if code != 201 {
		t.Fatalf("first write: %d %v", code, v)
	}
	rev1 := reply(v).Rev

	// validate_doc_update throwing {forbidden} answers 403.
	code, v = couchDo(t, "PUT", db+"/job", map[string]any{"_rev": rev1, "token": 3, "by": "holder-3"})
	if r := reply(v); code != 403 || r.Error != "forbidden" || r.Reason != "stale fencing token 3 < 5" {
		t.Fatalf("write with a lower token: %d %v, want 403 forbidden", code, v)
	}
	code, v = couchDo(t, "PUT", db+"/other", map[string]any{"by": "nobody"})
	if r := reply(v); code != 403 || r.Error != "forbidden" {
		t.Fatalf("write without a token: %d %v, want 403 forbidden", code, v)
	}
	// _bulk_docs runs the same validation (201 overall, per-doc error).
	code, raw := JSONRequest(t, "POST", db+"/_bulk_docs", map[string]any{
		"docs": []any{map[string]any{"_id": "job", "_rev": rev1, "token": 4}},
	})
	var bulk []couchReply
	if err := json.Unmarshal(raw, &bulk); err != nil || code != 201 || len(bulk) != 1 || bulk[0].Error != "forbidden" {
		t.Fatalf("_bulk_docs with a lower token: %d %s, want 201 with a forbidden per-doc error", code, raw)
	}

	// A higher token with the current _rev is accepted.
	code, v = couchDo(t, "PUT", db+"/job", map[string]any{"_rev": rev1, "token": 7, "by": "holder-7"})
	if code != 201 {
		t.Fatalf("write with a higher token: %d %v", code, v)
	}
	rev2 := reply(v).Rev

	// A stale _rev answers 409, whatever the token.
	code, v = couchDo(t, "PUT", db+"/job", map[string]any{"_rev": rev1, "token": 9, "by": "holder-9"})
	if r := reply(v); code != 409 || r.Error != "conflict" {
		t.Fatalf("write with a stale _rev: %d %v, want 409 conflict", code, v)
	}
	// So does a create of an existing document without _rev.
	code, v = couchDo(t, "PUT", db+"/job", map[string]any{"token": 9, "by": "holder-9"})
	if code != 409 {
		t.Fatalf("write without _rev over an existing doc: %d %v, want 409", code, v)
	}

	// Read back: only the accepted writes.
	code, v = couchDo(t, "GET", db+"/job", nil)
	if code != 200 || v["_rev"] != rev2 || v["token"] != float64(7) || v["by"] != "holder-7" {
		t.Fatalf("read back: %d %v, want rev %s token 7 by holder-7", code, v, rev2)
	}
	if code, v := couchDo(t, "GET", db+"/other", nil); code != 404 {
		t.Fatalf("rejected doc: %d %v, want 404", code, v)
	}

	// Stop kills it and no process of its group is left.
	pid := c.Pid()
	c.Stop()
	if live := liveGroupMembers(pid); len(live) != 0 {
		t.Fatalf("after Stop, pouchdb-server group %d has live processes %v", pid, live)
	}
	if conn, err := net.DialTimeout("tcp", c.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatalf("after Stop, %s still accepts connections", c.Addr())
	}
	if got := pgrep(t, "--port "+strconv.Itoa(c.port)+" "); len(got) != 0 {
		t.Fatalf("after Stop: %v", got)
	}
}
