package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// readmeExample is the shell block after the remote-cli-example marker in
// the README.
func readmeExample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- remote-cli-example")
	if !ok {
		t.Fatal("README has no remote-cli-example marker")
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatal("no shell block after the remote-cli-example marker")
	}
	return block
}

// The README's operator example runs as written against a real server,
// with the quick start's paths and address replaced by the test server's:
// it creates a 0600 key file, inspects, lists as a table, force-releases
// with a reason and shows the history; the server then holds the lease
// released with that reason.
func TestReadmeRemoteExample(t *testing.T) {
	bin := starleaseBin(t)
	srv := testenv.StartStarlease(t, bin)
	dir := t.TempDir()
	script := strings.NewReplacer("bin/starlease", bin, "http://127.0.0.1:8080", srv.URL(),
		"./data", srv.DataDir(), "./starlease.pepper", srv.PepperFile()).Replace(readmeExample(t))
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = testenv.CleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("the README example failed: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	keyFile := filepath.Join(dir, "ops-admin.key")
	fi, err := os.Stat(keyFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v", err, fi.Mode())
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	k := strings.TrimSpace(string(key))
	if testenv.APIKeyRE.FindStringSubmatch(k) == nil {
		t.Fatalf("the key file holds no key")
	}
	if strings.Contains(out.String()+errb.String(), testenv.APIKeyRE.FindStringSubmatch(k)[2]) {
		t.Fatal("the example printed the key")
	}
	// Three tables (inspect, list, history) with the documented headers.
	text := out.String()
	headers := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "TENANT" || f[0] == "ENDED_AT") {
			headers[strings.Join(f, " ")]++
		}
	}
	if headers[strings.Join(leaseColumns, " ")] != 2 || headers[strings.Join(historyColumns, " ")] != 1 ||
		!strings.Contains(text, `"worker stuck on a dead host"`) {
		t.Fatalf("the example's output:\n%s", text)
	}

	api, err := client.New(srv.URL(), k)
	if err != nil {
		t.Fatal(err)
	}
	var p printedLease
	// The force-release's JSON is the one object in the output.
	start := strings.Index(text, "{\n")
	end := strings.Index(text, "\n}\n")
	r := result{0, text[start : end+3], ""}
	r.ok(t, &p)
	if p.Code != lease.CodeForceReleased || p.Lease == nil {
		t.Fatalf("force-release printed %+v", p)
	}
	released := p.Lease
	sameLease(t, released, func() client.Lease {
		res, err := api.Get(context.Background(), released.LeaseID)
		if err != nil {
			t.Fatal(err)
		}
		return res.Lease
	}())
	h, err := api.History(context.Background(), released.LeaseID, 0, "")
	if err != nil || len(h.History) != 1 || h.History[0].Reason != "worker stuck on a dead host" || h.History[0].State != lease.StateReleased {
		t.Fatalf("server history: %+v, %v", h, err)
	}
}
