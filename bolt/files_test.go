package bolt

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// createWithPageSize creates an empty bbolt file at path with ps-byte
// pages, as an older build (4 KiB) or Open (PageSize) would have.
func createWithPageSize(t testing.TB, path string, ps int) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{PageSize: ps})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkConsistent fails t unless bbolt's own check finds db's pages
// sound; what names the moment.
func checkConsistent(t testing.TB, db *bbolt.DB, what string) {
	t.Helper()
	if err := db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: file inconsistent: %v", what, err)
	}
}

// crashChild is this test binary running only the test named test, in a
// process group of its own so that kill reaches all of it; env (to
// path) and env_ROUND (to round) tell it the store file and the round
// (inCrashChild). out is its standard output.
type crashChild struct {
	cmd *exec.Cmd
	out io.Reader
}

func startCrashChild(t *testing.T, test, env, path string, round int) crashChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], fmt.Sprintf("-test.run=^%s$", test), "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+path, fmt.Sprintf("%s_ROUND=%d", env, round))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return crashChild{cmd: cmd, out: out}
}

// kill sends SIGKILL to the child's whole process group.
func (c crashChild) kill() { _ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL) }

// inCrashChild is the child's side of startCrashChild: the store at the
// path env names, opened with a busy reaper, and the round. It skips t in
// a binary that is not such a child (parent names the test that starts
// it); a store that does not open is reported as OPENERR and exit 3. say
// prints one line to the parent in one write, so a line reaches it whole
// or not at all.
func inCrashChild(t *testing.T, env, parent string) (s *Store, round string, say func(format string, a ...any)) {
	path := os.Getenv(env)
	if path == "" {
		t.Skip("child of " + parent)
	}
	s, err := Open(path, Options{ReapInterval: 5 * time.Millisecond, FlushInterval: DefaultFlushInterval})
	if err != nil {
		fmt.Println("OPENERR", err)
		os.Exit(3)
	}
	var mu sync.Mutex
	say = func(format string, a ...any) {
		mu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
		mu.Unlock()
	}
	return s, os.Getenv(env + "_ROUND"), say
}

// inOwnProcess runs the test t names in a child process of this test
// binary (env set to "1" there) and reports whether the caller is that
// child, which then runs the test's body. Outside the child it waits for
// the child and fails t unless the child's test passed. For a test that
// changes what is the whole process's, such as a resource limit: lowered
// in the test binary itself, RLIMIT_FSIZE also stopped the go command's
// test log and any other test's files.
func inOwnProcess(t *testing.T, env string) (child bool) {
	t.Helper()
	if os.Getenv(env) == "1" {
		return true
	}
	cmd := exec.Command(os.Args[0], fmt.Sprintf("-test.run=^%s$", t.Name()), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("the test in its own process failed (%v):\n%s", err, out)
	}
	t.Logf("in its own process:\n%s", out)
	return false
}
