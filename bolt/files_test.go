package bolt

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"

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
// process group of its own so that kill reaches all of it, with env
// added; out is its standard output.
type crashChild struct {
	cmd *exec.Cmd
	out io.Reader
}

func startCrashChild(t *testing.T, test string, env ...string) crashChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], fmt.Sprintf("-test.run=^%s$", test), "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
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
