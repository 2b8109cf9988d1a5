package clients_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
)

// TestPythonClient runs the Python client's pytest suite
// (clients/python/tests) against real servers: the suite starts its own
// starlease serve processes with the binary built here, and uses the broker
// and the fenced CouchDB databases started here.
func TestPythonClient(t *testing.T) {
	py := python(t)
	s := startStack(t)
	dbs := []string{"py_fenced", "py_actor"}
	for _, name := range dbs {
		s.fencedDB(t, name)
	}
	args := []string{"-m", "pytest", "-p", "no:cacheprovider", "-q"}
	if testing.Verbose() {
		args = append(args, "-v")
	}
	runSuite(t, "python", s.env("STARLEASE_TEST_FENCED_DBS="+strings.Join(dbs, ","), "PYTHONDONTWRITEBYTECODE=1"),
		10*time.Minute, py, args...)
}

// TestPythonFenceDigest checks that the Python writer's record of the fence
// it requires is the fence the Go package installs: the two never drift.
func TestPythonFenceDigest(t *testing.T) {
	src, err := os.ReadFile("python/starlease/couch.py")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^FENCE_SHA256 = "([0-9a-f]{64})"$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("python/starlease/couch.py has no FENCE_SHA256")
	}
	sum := sha256.Sum256([]byte(couchdb.ValidateDocUpdate))
	if want := hex.EncodeToString(sum[:]); string(m[1]) != want {
		t.Fatalf("FENCE_SHA256 is %s; the Go fence's SHA-256 is %s: update the Python client with the fence", m[1], want)
	}
}
