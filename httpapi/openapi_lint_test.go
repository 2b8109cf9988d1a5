package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
)

// RedoclyVersion is the pinned @redocly/cli release .ci/install-servers.sh
// installs (npm, into the cache outside the repository).
const RedoclyVersion = "2.77.0"

// RedoclyEnv names the environment variable that, if set, is the path of
// the redocly executable (.ci/run sets it); otherwise it is found where
// the install script puts it.
const RedoclyEnv = "STARLEASE_REDOCLY"

// redoclyPath finds the linter: $STARLEASE_REDOCLY, else
// $STARLEASE_CACHE_DIR (or /var/cache/starlease)/redocly-cli-VERSION.
// Missing, the test fails: a lint that did not run must not pass.
func redoclyPath(t *testing.T) string {
	t.Helper()
	const hint = "install it with: sudo bash .ci/install-servers.sh (or point $" + RedoclyEnv + " at a redocly " + RedoclyVersion + ")"
	if p := os.Getenv(RedoclyEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("$%s=%s: %v; %s", RedoclyEnv, p, err, hint)
		}
		return p
	}
	cache := os.Getenv(testenv.PouchDBCacheEnv)
	if cache == "" {
		cache = testenv.DefaultPouchDBCacheDir
	}
	p := filepath.Join(cache, "redocly-cli-"+RedoclyVersion, "node_modules", ".bin", "redocly")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the OpenAPI linter is missing: $%s is not set and %v; %s", RedoclyEnv, err, hint)
	}
	return p
}

type lintProblem struct {
	RuleID   string `json:"ruleId"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
	Location []struct {
		Pointer string `json:"pointer"`
	} `json:"location"`
}

func (p lintProblem) String() string {
	at := ""
	if len(p.Location) > 0 {
		at = p.Location[0].Pointer
	}
	return fmt.Sprintf("%s %s at %s: %s", p.Severity, p.RuleID, at, p.Message)
}

// lint runs redocly lint on doc with redocly.yaml (the recommended
// ruleset, built in) and returns every problem, warnings included. It
// never reaches the network: telemetry and the update check are off, and
// as root it runs in a network namespace of its own, where a rule set
// that had to be fetched would fail the lint.
func lint(t *testing.T, bin string, doc []byte) []lintProblem {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "openapi.json"), doc, 0o644); err != nil {
		t.Fatal(err)
	}
	config, err := filepath.Abs("redocly.yaml")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{bin, "lint", "--config", config, "--format", "json", "openapi.json"}
	if offline() {
		args = append([]string{"unshare", "--net"}, args...)
	} else {
		t.Log("running redocly without a network namespace of its own (needs root and unshare)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "DO_NOT_TRACK=1",
		"HOME="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var out struct {
		Totals *struct {
			Errors, Warnings int
		} `json:"totals"`
		Version  string        `json:"version"`
		Problems []lintProblem `json:"problems"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || out.Totals == nil {
		t.Fatalf("redocly lint (%v) did not report: %v\nstdout: %s\nstderr: %s", runErr, err, stdout.Bytes(), stderr.Bytes())
	}
	if out.Version != RedoclyVersion {
		t.Fatalf("redocly %s ran, want the pinned %s", out.Version, RedoclyVersion)
	}
	// The exit status and the report must agree: a failing lint exits 1.
	if failed := out.Totals.Errors > 0; failed != (runErr != nil) {
		t.Fatalf("redocly lint exit %v with %d errors\nstderr: %s", runErr, out.Totals.Errors, stderr.Bytes())
	}
	if len(out.Problems) != out.Totals.Errors+out.Totals.Warnings {
		t.Fatalf("redocly lint listed %d problems for %d errors and %d warnings", len(out.Problems), out.Totals.Errors, out.Totals.Warnings)
	}
	return out.Problems
}

// offline reports whether a command can be run without any network, in
// a new network namespace (root, and a kernel and sandbox that allow it).
func offline() bool {
	if os.Geteuid() != 0 {
		return false
	}
	_, err := exec.LookPath("unshare")
	return err == nil && exec.Command("unshare", "--net", "true").Run() == nil
}

// The OpenAPI document passes @redocly/cli lint with the recommended
// ruleset: no error and no warning.
func TestOpenAPILint(t *testing.T) {
	bin := redoclyPath(t)
	if problems := lint(t, bin, openAPIDocument); len(problems) > 0 {
		var lines []string
		for _, p := range problems {
			lines = append(lines, p.String())
		}
		t.Fatalf("redocly lint found %d problems in openapi.json:\n  %s", len(problems), strings.Join(lines, "\n  "))
	}
	// The lint can fail: the document as it was (no servers, operations
	// without security) is refused, for those reasons.
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc, "servers")
	healthz := doc["paths"].(map[string]any)["/healthz"].(map[string]any)["get"].(map[string]any)
	delete(healthz, "security")
	broken, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]bool{}
	for _, p := range lint(t, bin, broken) {
		if p.Severity == "error" {
			rules[p.RuleID] = true
		}
	}
	if !rules["no-empty-servers"] || !rules["security-defined"] {
		t.Fatalf("linting a document without servers and with an operation without security: errors %v", rules)
	}
}
