package clients_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
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

// TestPythonLockKey checks the Python client's lock-key function (which it
// uses only to check the server's commit answers) against the Go one, on
// identities with non-ASCII letters and the defaulted fields.
func TestPythonLockKey(t *testing.T) {
	py := python(t)
	ids := []lease.Identity{
		{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "web", TargetID: "example.com", ActorName: "crawler"},
		{TenantID: "ténant", ProgramID: "prögram:x", TargetNamespace: "名前空間", TargetID: "δ.example_1", ActorName: "fediwatch",
			WorkflowName: "nightly", OperationClass: "default"},
	}
	for _, raw := range ids {
		id, want, err := lease.CanonicalLockKey(raw, lease.DefaultOperationClasses())
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(id)
		cmd := exec.Command(py, "-c", `import json, sys
from starlease import LockIdentity
print(LockIdentity.from_wire(json.loads(sys.argv[1])).lock_key())`, string(js))
		cmd.Dir, cmd.Env = "python", append(testenv.CleanEnv(), "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("identity %s: python lock key %s, Go %s", js, got, want)
		}
	}
}
