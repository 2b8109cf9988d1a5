package couchdb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// clock is a settable backend clock for the lease store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var (
	actor = lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}
	admin = lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}
)

const ttl = 10 * time.Second

// sinkName is the sink name every writer in these tests uses.
const sinkName = "couchdb"

// env is one test's lease store (bolt, in t.TempDir) and fenced database
// (on a real pouchdb-server).
type env struct {
	t     *testing.T
	store *bolt.Store
	clock *clock
	couch *testenv.CouchDB
	db    *couchdb.DB
	w     *couchdb.Writer
	seq   atomic.Int64
}

var dbSeq atomic.Int64

// newEnv opens a bolt store and a new fenced database on couch.
func newEnv(t *testing.T, couch *testenv.CouchDB, opts ...couchdb.Option) *env {
	t.Helper()
	c := &clock{t: time.Now().Truncate(time.Millisecond)}
	s, err := bolt.Open(filepath.Join(t.TempDir(), "lease.db"), bolt.Options{Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e := &env{t: t, store: s, clock: c, couch: couch}
	e.db = e.openDB(fmt.Sprintf("fenced-%d", dbSeq.Add(1)), opts...)
	ctx := context.Background()
	if err := e.db.EnsureDatabase(ctx); err != nil {
		t.Fatalf("EnsureDatabase: %v", err)
	}
	if err := e.db.InstallFence(ctx); err != nil {
		t.Fatalf("InstallFence: %v", err)
	}
	if e.w, err = e.db.Writer(sinkName); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) openDB(name string, opts ...couchdb.Option) *couchdb.DB {
	e.t.Helper()
	db, err := couchdb.New(e.couch.URL(), name, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	return db
}

// far is a deadline the tests never reach (backend time is settable).
func (e *env) far() time.Time { return e.clock.Now().Add(time.Hour) }

func (e *env) acquire(id lease.Identity, instance string) *lease.Record {
	e.t.Helper()
	n := e.seq.Add(1)
	res, err := e.store.Acquire(context.Background(), lease.AcquireRequest{Identity: id,
		ServiceInstanceID: instance, TTL: ttl, MaximumLifetime: time.Hour,
		ExecutionID: fmt.Sprintf("exec-%s-%d", instance, n), JobID: "job-1", TraceID: fmt.Sprintf("trace-%d", n),
		Mutation: lease.Mutation{RequestID: fmt.Sprintf("req-%d", n), DeadlineAt: e.far(), Caller: actor}})
	if err != nil {
		e.t.Fatalf("acquire: %v", err)
	}
	return res.Lease
}

func (e *env) committer(rec *lease.Record, opts ...fence.Option) *fence.Committer {
	opts = append([]fence.Option{fence.WithClock(e.clock.Now), fence.WithBackoff(time.Millisecond)}, opts...)
	return fence.NewCommitter(e.store, fence.EnvelopeOf(rec), actor, opts...)
}

// adminEnd force-releases or revokes rec.
func (e *env) adminEnd(op lease.Op, id lease.Identity, rec *lease.Record) {
	e.t.Helper()
	req := lease.AdminRequest{Identity: id, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		Reason: "incident drill", Mutation: lease.Mutation{RequestID: fmt.Sprintf("req-admin-%d", e.seq.Add(1)),
			DeadlineAt: e.far(), Caller: admin}}
	var err error
	if op == lease.OpRevoke {
		_, err = e.store.Revoke(context.Background(), req)
	} else {
		_, err = e.store.ForceRelease(context.Background(), req)
	}
	if err != nil {
		e.t.Fatalf("%s: %v", op, err)
	}
}

func code(err error) lease.Code { return lease.CodeOf(err) }

// raw sends one JSON request to the server, bypassing the package.
func raw(t *testing.T, method, url string, body any) (int, map[string]any) {
	t.Helper()
	status, b := testenv.JSONRequest(t, method, url, body)
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		t.Fatalf("%s %s: %d %q is not JSON", method, url, status, b)
	}
	v, ok := x.(map[string]any)
	if !ok {
		// A list (_bulk_docs) or a scalar (_config).
		v = map[string]any{"list": x}
	}
	return status, v
}

// docURL is the raw URL of a document of e's database.
func (e *env) docURL(id string) string {
	return e.couch.URL() + "/" + e.db.Name() + "/" + url.PathEscape(id)
}

// rawDoc reads a document as a JSON object; code 404 if absent.
func (e *env) rawDoc(id string) (int, map[string]any) {
	e.t.Helper()
	return raw(e.t, http.MethodGet, e.docURL(id), nil)
}

// guardJSON is g as the JSON object stored in a document.
func guardJSON(t *testing.T, g fence.Guard) map[string]any {
	t.Helper()
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// countingTransport counts requests by method and can run a hook before
// (and fail after) forwarding a PUT.
type countingTransport struct {
	base http.RoundTripper

	mu     sync.Mutex
	counts map[string]int
	// beforePut runs before a PUT is forwarded (once per PUT).
	beforePut func(req *http.Request)
	// afterPut, if set, replaces the answer of a forwarded PUT with an error.
	afterPut error
	// failPut, if set, fails a PUT without forwarding it.
	failPut error
	// hangAfterPut makes a forwarded PUT's answer never arrive: the
	// transport waits for the request's context to end (a client timeout).
	hangAfterPut bool
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	c.counts[req.Method]++
	before, after, fail, hang := c.beforePut, c.afterPut, c.failPut, c.hangAfterPut
	c.mu.Unlock()
	if req.Method == http.MethodPut {
		if fail != nil {
			return nil, fail
		}
		if before != nil {
			before(req)
		}
	}
	base := c.base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err == nil && req.Method == http.MethodPut && (after != nil || hang) {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if hang {
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
		return nil, after
	}
	return resp, err
}

func (c *countingTransport) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[method]
}
