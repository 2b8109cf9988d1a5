package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PouchDBServerVersion is the pinned pouchdb-server release, a server of
// CouchDB's HTTP API (validate_doc_update, 409 on a stale _rev, 403 on a
// rejected update). Code under test speaks the CouchDB API only, so it
// runs on Apache CouchDB unchanged.
const PouchDBServerVersion = "4.2.0"

// PouchDBServerEnv names the environment variable that, if set, is the
// path of the pouchdb-server executable to use.
const PouchDBServerEnv = "STARLEASE_POUCHDB_SERVER"

// PouchDBCacheEnv names the environment variable that overrides the cache
// directory .ci/install-servers.sh installs npm packages under (default
// DefaultPouchDBCacheDir).
const PouchDBCacheEnv = "STARLEASE_CACHE_DIR"

// DefaultPouchDBCacheDir is where .ci/install-servers.sh installs
// pouchdb-server by default, outside the repository so reruns are fast:
// the executable is DefaultPouchDBCacheDir/pouchdb-server-4.2.0/node_modules/.bin/pouchdb-server.
const DefaultPouchDBCacheDir = "/var/cache/starlease"

// CouchDBInstallHint is the command that installs pouchdb-server.
const CouchDBInstallHint = "bash .ci/install-servers.sh (installs pouchdb-server " + PouchDBServerVersion +
	" under " + DefaultPouchDBCacheDir + ", or $" + PouchDBCacheEnv + "; or point $" + PouchDBServerEnv + " at a pouchdb-server executable)"

// PouchDBServerPath finds the pouchdb-server executable: $STARLEASE_POUCHDB_SERVER
// if set, else the install script's cache path ($STARLEASE_CACHE_DIR or
// /var/cache/starlease, then pouchdb-server-4.2.0/node_modules/.bin/pouchdb-server).
func PouchDBServerPath() (string, error) {
	if p := os.Getenv(PouchDBServerEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s=%s: %w", PouchDBServerEnv, p, err)
		}
		return p, nil
	}
	cache := os.Getenv(PouchDBCacheEnv)
	if cache == "" {
		cache = DefaultPouchDBCacheDir
	}
	p := filepath.Join(cache, "pouchdb-server-"+PouchDBServerVersion, "node_modules", ".bin", "pouchdb-server")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("$%s is not set and %s: %w", PouchDBServerEnv, p, err)
	}
	return p, nil
}

// CouchDB is a running pouchdb-server: in memory, on 127.0.0.1, without
// admins (every request is allowed, as on a CouchDB in "admin party").
type CouchDB struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartCouchDB starts an in-memory pouchdb-server for t and waits until
// GET / answers JSON. It is stopped (its process group killed and waited
// for) when t's cleanup runs.
func StartCouchDB(t testing.TB) *CouchDB {
	t.Helper()
	bin, err := PouchDBServerPath()
	if err != nil {
		// Never a skip: a run without the server must fail loudly,
		// inside CI (CI=true) and out.
		t.Fatalf("testenv: pouchdb-server not found (%v; CI=%q); install it with: %s",
			err, os.Getenv("CI"), CouchDBInstallHint)
	}
	c := &CouchDB{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(c.Stop)
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testenv: no free loopback port: %v", err)
		}
		c.port = port
		start := time.Now()
		if lastErr = c.start(); lastErr == nil {
			t.Logf("testenv: pouchdb-server on %s ready in %v", c.URL(), time.Since(start).Round(time.Millisecond))
			return c
		}
		c.kill()
	}
	t.Fatalf("testenv: pouchdb-server did not start: %v", lastErr)
	return nil
}

func (c *CouchDB) start() error {
	out, err := os.OpenFile(filepath.Join(c.dir, "pouchdb-server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	// Everything it writes (config.json, log.txt, the unused database
	// dir) goes to the temp dir: cwd, --config and --dir all point there.
	cmd := exec.Command(c.bin,
		"--in-memory",
		"--host", "127.0.0.1",
		"--port", strconv.Itoa(c.port),
		"--config", filepath.Join(c.dir, "config.json"),
		"--dir", filepath.Join(c.dir, "data"),
		"--no-color",
	)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group, killed whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := os.MkdirAll(filepath.Join(c.dir, "data"), 0o700); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()

	client := &http.Client{Timeout: 2 * time.Second}
	limit := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("pouchdb-server exited during start: %s", c.logTail())
		default:
		}
		err := c.welcome(client)
		if err == nil {
			return nil
		}
		if time.Now().After(limit) {
			return fmt.Errorf("GET %s did not answer JSON within 30s (last: %v): %s", c.URL(), err, c.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// welcome checks that GET / answers 200 with a JSON object.
func (c *CouchDB) welcome(client *http.Client) error {
	resp, err := client.Get(c.URL() + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return err
	}
	var v map[string]any
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &v) != nil {
		return fmt.Errorf("GET /: %s %q", resp.Status, body)
	}
	return nil
}

func (c *CouchDB) logTail() string {
	b, err := os.ReadFile(filepath.Join(c.dir, "pouchdb-server.out"))
	if err != nil {
		return "(no log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// URL is the server's base URL, http://127.0.0.1:PORT, without a trailing
// slash.
func (c *CouchDB) URL() string { return "http://" + c.Addr() }

// Addr is the server's host:port on 127.0.0.1.
func (c *CouchDB) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)) }

// Dir is the server's temp dir (its cwd: config.json, log.txt, output).
func (c *CouchDB) Dir() string { return c.dir }

// Pid is the server's pid (its process group); 0 when not running.
func (c *CouchDB) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

func (c *CouchDB) kill() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	c.mu.Unlock()
	if cmd != nil {
		killGroup(c.t, "pouchdb-server", cmd.Process.Pid, done)
	}
}

// Stop kills the server's process group and waits until it is gone; the
// in-memory databases are lost. t.Cleanup calls it; calling it again is a
// no-op.
func (c *CouchDB) Stop() { c.kill() }

// JSONRequest sends one request with body (nil for none) as JSON to url,
// bypassing any client package, and returns the reply's status and bytes.
// Tests use it to reach a server directly.
func JSONRequest(t testing.TB, method, url string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, raw
}
