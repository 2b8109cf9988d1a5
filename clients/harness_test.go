package clients_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/internal/testenv"
)

// ClientToolsInstallHint is the command that installs what the client
// suites need besides the servers.
const ClientToolsInstallHint = "apt-get install -y --no-install-recommends python3 python3-pytest python3-pika nim"

// stack is what a client suite runs against: the starlease binary (the
// suite may start its own servers with it), a broker and a CouchDB-protocol
// server.
type stack struct {
	bin    string
	broker *testenv.RabbitMQ
	couch  *testenv.CouchDB
}

// startStack builds starlease and starts a broker and a CouchDB-protocol
// server for t.
func startStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{bin: testenv.BuildStarlease(t)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.couch = testenv.StartCouchDB(t) }() // while the broker boots
	s.broker = testenv.StartRabbitMQ(t)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return s
}

// fencedDB creates database name with the fence installed (by the Go
// couchdb package: the one definition of the fence) and returns it.
func (s *stack) fencedDB(t *testing.T, name string) *couchdb.DB {
	t.Helper()
	db, err := couchdb.New(s.couch.URL(), name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.EnsureDatabase(ctx); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	if err := db.InstallFence(ctx); err != nil {
		t.Fatalf("install the fence in %s: %v", name, err)
	}
	return db
}

// env is the environment every client suite gets: the caller's without
// STARLEASE_* variables, plus where the binary and the servers are
// (STARLEASE_TEST_BIN, _AMQP_URL, _COUCHDB_URL) and extra.
func (s *stack) env(extra ...string) []string {
	env := append(testenv.CleanEnv(), "STARLEASE_TEST_BIN="+s.bin, "STARLEASE_TEST_AMQP_URL="+s.broker.URL(),
		"STARLEASE_TEST_COUCHDB_URL="+s.couch.URL())
	return append(env, extra...)
}

// python returns Debian's python3 with pytest importable (a python3 that
// comes first on PATH but lacks pytest, such as a version manager's, is
// passed over), or fails t with the install command.
func python(t *testing.T) string {
	t.Helper()
	candidates := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	for _, p := range candidates {
		if exec.Command(p, "-c", "import pytest, pika").Run() == nil {
			return p
		}
	}
	t.Fatalf("no python3 with pytest and pika (tried %v; CI=%q); install them with: %s",
		candidates, os.Getenv("CI"), ClientToolsInstallHint)
	return ""
}

// nim returns the Nim compiler or fails t with the install command.
func nim(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("nim")
	if err != nil {
		t.Fatalf("nim not found on PATH (CI=%q); install it with: %s", os.Getenv("CI"), ClientToolsInstallHint)
	}
	return p
}

// runSuite runs a client suite's command in dir with env, streaming its
// output to t.Log line by line, and fails t if it exits non-zero or runs
// past timeout (then its process group is killed).
func runSuite(t *testing.T, dir string, env []string, timeout time.Duration, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.Log(sc.Text())
		}
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not finish within %v", name, strings.Join(args, " "), timeout)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), err)
	}
}
