package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

// result is what one run printed.
type result struct {
	code   int
	stdout string
	stderr string
}

func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// envelope decodes the error envelope: the last line of stderr.
func (r result) envelope(t *testing.T) errorEnvelope {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	var e errorEnvelope
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &e); err != nil {
		t.Fatalf("stderr is not an error envelope: %v\n%s", err, r.stderr)
	}
	if e.Status != "error" || e.Msg != e.Code.Message() {
		t.Fatalf("malformed envelope: %+v", e)
	}
	return e
}

// printedLease is the printed form of a lease result, decoded loosely.
type printedLease struct {
	Code      lease.Code    `json:"code"`
	Replayed  bool          `json:"replayed"`
	RequestID string        `json:"request_id"`
	Lease     *lease.Record `json:"lease"`
	Current   *lease.Record `json:"current"`
}

// ok requires exit status 0 and decodes stdout into v.
func (r result) ok(t *testing.T, v any) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d, want 0\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
}

// refused requires exit status want and an envelope with code.
func (r result) refused(t *testing.T, want int, code lease.Code) errorEnvelope {
	t.Helper()
	if r.code != want {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, want, r.stdout, r.stderr)
	}
	if r.stdout != "" {
		t.Fatalf("stdout on failure: %s", r.stdout)
	}
	e := r.envelope(t)
	if e.Code != code {
		t.Fatalf("code %s, want %s (%+v)", e.Code, code, e)
	}
	return e
}

// fixture is a data directory and one identity.
type fixture struct{ dir string }

func newFixture(t *testing.T) fixture {
	return fixture{filepath.Join(t.TempDir(), "data")}
}

func (f fixture) id(extra ...string) []string {
	return append([]string{"--data-dir", f.dir, "--tenant", "Acme", "--program", "p1", "--namespace", "web",
		"--target", "example.com", "--actor", "scanner"}, extra...)
}

func (f fixture) do(t *testing.T, cmd string, extra ...string) result {
	t.Helper()
	return runCLI(t, append([]string{cmd}, f.id(extra...)...)...)
}

func (f fixture) acquire(t *testing.T, extra ...string) *lease.Record {
	t.Helper()
	var p printedLease
	f.do(t, "acquire", extra...).ok(t, &p)
	if p.Code != lease.CodeAcquired || p.Lease == nil {
		t.Fatalf("acquire printed %+v", p)
	}
	return p.Lease
}

func held(rec *lease.Record) []string {
	return []string{"--lease-id", rec.LeaseID, "--token", itoa(rec.FencingToken)}
}

func itoa(n uint64) string { b, _ := json.Marshal(n); return string(b) }

func TestLifecycle(t *testing.T) {
	f := newFixture(t)
	first := f.acquire(t)
	if first.FencingToken != 1 || first.State != lease.StateActive {
		t.Fatalf("first lease: token %d state %s, want 1 active", first.FencingToken, first.State)
	}
	if first.TenantID != "acme" || first.OwnerPrincipalID != "local-operator" || first.OwnerClientID != localClientID {
		t.Fatalf("identity or owner not as expected: %+v", first)
	}
	if first.Metadata == nil {
		t.Fatalf("metadata printed as null")
	}
	if fi, err := os.Stat(f.dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data dir: %v, mode %v; want 0700", err, fi.Mode())
	}

	e := f.do(t, "acquire").refused(t, exitRefused, lease.CodeConflict)
	if !e.Retryable || e.RetryAfterMs <= 0 || e.RequestID == "" {
		t.Fatalf("conflict envelope: %+v", e)
	}

	var p printedLease
	f.do(t, "inspect").ok(t, &p)
	if p.Code != lease.CodeInspected || p.Lease.LeaseID != first.LeaseID || p.Lease.FencingToken != 1 {
		t.Fatalf("inspect by identity: %+v", p.Lease)
	}
	runCLI(t, "inspect", "--data-dir", f.dir, "--lease-id", first.LeaseID).ok(t, &p)
	if p.Lease.LeaseID != first.LeaseID {
		t.Fatalf("inspect by id: %+v", p.Lease)
	}

	f.do(t, "renew", append(held(first), "--ttl", "45s")...).ok(t, &p)
	if p.Code != lease.CodeRenewed || p.Lease.FencingToken != 1 || p.Lease.TTLMs != 45000 || p.Lease.LeaseID != first.LeaseID {
		t.Fatalf("renew: %+v", p)
	}
	f.do(t, "release", held(first)...).ok(t, &p)
	if p.Code != lease.CodeReleased || p.Lease.State != lease.StateReleased {
		t.Fatalf("release: %+v", p)
	}
	// A stale release of the released lease changes nothing.
	f.do(t, "release", held(first)...).refused(t, exitRefused, lease.CodeLost)
	f.do(t, "inspect").refused(t, exitRefused, lease.CodeNotFound)

	second := f.acquire(t)
	if second.FencingToken != 2 || second.LeaseID == first.LeaseID {
		t.Fatalf("re-acquire: token %d lease %s, want 2 and a new lease id", second.FencingToken, second.LeaseID)
	}

	var h historyResult
	f.do(t, "history").ok(t, &h)
	if len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != first.LeaseID || h.Entries[0].Record.State != lease.StateReleased {
		t.Fatalf("history: %+v", h)
	}
}

// TestBadInputChangesNothing: invalid input exits 2 with invalid_lease_request
// naming the field, and leaves the store as it was.
func TestBadInputChangesNothing(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name  string
		args  []string
		field string
	}{
		{"target with slash", append([]string{"acquire"}, f.id("--target", "a/b")...), "lock_identity.target_id"},
		{"missing data dir", []string{"acquire", "--tenant", "t", "--program", "p", "--namespace", "n", "--target", "x", "--actor", "a"}, "data_dir"},
		{"zero ttl", append([]string{"acquire"}, f.id("--ttl", "0")...), "ttl_ms"},
		{"ttl over lifetime", append([]string{"acquire"}, f.id("--ttl", "10m")...), "ttl_ms"},
		{"empty actor", append([]string{"acquire"}, f.id("--actor", " ")...), "lock_identity.actor_name"},
		{"unconfigured class", append([]string{"acquire"}, f.id("--operation-class", "scrape")...), "lock_identity.operation_class"},
		{"bad class config", append([]string{"acquire"}, f.id("--operation-classes", "Scrape")...), "operation_classes"},
		{"metadata not an object", append([]string{"acquire"}, f.id("--metadata", "[1]")...), "metadata"},
		{"metadata nested", append([]string{"acquire"}, f.id("--metadata", `{"k":{"a":1}}`)...), "metadata.k"},
		{"bad request id", append([]string{"acquire"}, f.id("--request-id", "../x")...), "request_id"},
		{"zero timeout", append([]string{"acquire"}, f.id("--timeout", "0s")...), "timeout"},
		{"renew without lease", append([]string{"renew"}, f.id("--token", "1")...), "lease_id"},
		{"release token zero", append([]string{"release"}, f.id("--lease-id", "lease_x")...), "fencing_token"},
		{"revoke without reason", append([]string{"revoke"}, f.id("--lease-id", "lease_x", "--token", "1")...), "reason"},
		{"inspect both", append([]string{"inspect"}, f.id("--lease-id", "lease_x")...), "lease_id"},
		{"list nothing", []string{"list", "--data-dir", f.dir}, "tenant_id"},
		{"list page size", []string{"list", "--data-dir", f.dir, "--owner", "o", "--page-size", "-1"}, "page_size"},
		{"history page token", append([]string{"history"}, f.id("--page-token", "!!")...), "page_token"},
		{"lookup unknown op", append([]string{"lookup"}, f.id("--op", "steal", "--request-id", "r1")...), "operation"},
		{"commit without sink", append([]string{"authorize-commit"}, f.id("--lease-id", "lease_x", "--token", "1", "--execution", "e")...), "sink"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := runCLI(t, c.args...).refused(t, exitUsage, lease.CodeInvalidRequest)
			if e.Field != c.field || e.Retryable {
				t.Fatalf("field %q retryable %v, want %q and false (%+v)", e.Field, e.Retryable, c.field, e)
			}
		})
	}
	// Bad input is refused before the store is opened: no data dir yet.
	if _, err := os.Stat(f.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bad input created the data directory: %v", err)
	}
	f.do(t, "inspect").refused(t, exitRefused, lease.CodeNotFound)
	if rec := f.acquire(t); rec.FencingToken != 1 {
		t.Fatalf("counter moved: first real acquire got token %d", rec.FencingToken)
	}
}

// TestBadInputOnHeldLease: invalid renew/release/admin requests leave a
// held lease exactly as it was, and the counter where it was.
func TestBadInputOnHeldLease(t *testing.T) {
	f := newFixture(t)
	rec := f.acquire(t)
	for _, args := range [][]string{
		append([]string{"renew"}, f.id(append(held(rec), "--ttl", "-1s")...)...),
		append([]string{"renew"}, f.id(append(held(rec), "--ttl", "0")...)...),
		append([]string{"renew"}, f.id(append(held(rec), "--target", "a*b")...)...),
		append([]string{"release"}, f.id("--lease-id", rec.LeaseID, "--token", "0")...),
		append([]string{"force-release"}, f.id(append(held(rec), "--reason", " ")...)...),
	} {
		runCLI(t, args...).refused(t, exitUsage, lease.CodeInvalidRequest)
	}
	var p printedLease
	f.do(t, "inspect").ok(t, &p)
	if p.Lease.LeaseID != rec.LeaseID || p.Lease.State != lease.StateActive ||
		p.Lease.ExpiresAt != rec.ExpiresAt || p.Lease.RenewedAt != rec.RenewedAt || p.Lease.TTLMs != rec.TTLMs {
		t.Fatalf("lease changed by bad input:\nbefore %+v\nafter  %+v", rec, p.Lease)
	}
	f.do(t, "release", held(rec)...).ok(t, &p)
	if next := f.acquire(t); next.FencingToken != 2 {
		t.Fatalf("token %d, want 2", next.FencingToken)
	}
}

func TestIdempotentAcquireAndLookup(t *testing.T) {
	f := newFixture(t)
	rec := f.acquire(t, "--request-id", "req-1", "--job", "job-1", "--execution", "exec-1")
	var p printedLease
	f.do(t, "acquire", "--request-id", "req-1", "--job", "job-1", "--execution", "exec-1").ok(t, &p)
	if !p.Replayed || p.Lease.LeaseID != rec.LeaseID || p.Lease.FencingToken != rec.FencingToken {
		t.Fatalf("replay: %+v", p)
	}
	// Same request id, different body: idempotency_conflict.
	f.do(t, "acquire", "--request-id", "req-1", "--job", "job-2", "--execution", "exec-1").
		refused(t, exitRefused, lease.CodeIdempotencyConflict)

	f.do(t, "lookup", "--op", "acquire", "--request-id", "req-1").ok(t, &p)
	if p.Lease.LeaseID != rec.LeaseID || p.Current != nil {
		t.Fatalf("lookup: %+v", p)
	}
	f.do(t, "release", held(rec)...).ok(t, &p)
	// The replay of a now-terminal acquire returns the original plus the
	// current state (lookup prints it); the caller holds nothing, so the
	// rerun acquire exits 3 with lease_lost, naming the lease and its state.
	e := f.do(t, "acquire", "--request-id", "req-1", "--job", "job-1", "--execution", "exec-1").
		refused(t, exitRefused, lease.CodeLost)
	if !strings.Contains(e.Reason, "lease_acquired of lease "+rec.LeaseID) || !strings.Contains(e.Reason, "that lease is released now") {
		t.Fatalf("replay after release: %+v", e)
	}
	f.do(t, "lookup", "--op", "acquire", "--request-id", "req-1").ok(t, &p)
	if p.Lease.LeaseID != rec.LeaseID || p.Lease.State != lease.StateActive || p.Current == nil || p.Current.State != lease.StateReleased {
		t.Fatalf("lookup after release: %+v", p)
	}
	f.do(t, "lookup", "--op", "acquire", "--request-id", "nope").refused(t, exitRefused, lease.CodeNotFound)
}

func TestAdminAndCommit(t *testing.T) {
	f := newFixture(t)
	rec := f.acquire(t, "--execution", "exec-1", "--job", "job-1")
	var c commitResult
	write := []string{"--sink", "couchdb", "--execution", "exec-1", "--job", "job-1", "--write-target", "doc-1"}
	f.do(t, "authorize-commit", append(held(rec), append(write, "--commit-id", "c1")...)...).ok(t, &c)
	if c.Code != lease.CodeCommitAuthorized || c.Commit.FencingToken != 1 || c.Commit.Sink != "couchdb" || c.Commit.Target != "doc-1" {
		t.Fatalf("commit: %+v", c)
	}
	// The commit id names that write: for another document it conflicts.
	f.do(t, "authorize-commit", append(held(rec), "--sink", "couchdb", "--execution", "exec-1", "--job", "job-1",
		"--write-target", "doc-2", "--commit-id", "c1")...).refused(t, exitRefused, lease.CodeIdempotencyConflict)
	var p printedLease
	f.do(t, "force-release", append(held(rec), "--reason", "stuck worker")...).ok(t, &p)
	if p.Code != lease.CodeForceReleased || p.Lease.State != lease.StateReleased {
		t.Fatalf("force-release: %+v", p)
	}
	// The former holder can no longer commit.
	f.do(t, "authorize-commit", append(held(rec), append(write, "--commit-id", "c2")...)...).
		refused(t, exitRefused, lease.CodeLost)

	next := f.acquire(t)
	if next.FencingToken != 2 {
		t.Fatalf("token %d, want 2", next.FencingToken)
	}
	f.do(t, "revoke", append(held(next), "--incident", "inc-7")...).ok(t, &p)
	if p.Code != lease.CodeRevoked || p.Lease.State != lease.StateRevoked {
		t.Fatalf("revoke: %+v", p)
	}
	var h historyResult
	f.do(t, "history", "--page-size", "1").ok(t, &h)
	if len(h.Entries) != 1 || h.Entries[0].IncidentID != "inc-7" || h.NextPageToken == "" {
		t.Fatalf("history page 1: %+v", h)
	}
	f.do(t, "history", "--page-size", "1", "--page-token", h.NextPageToken).ok(t, &h)
	if len(h.Entries) != 1 || h.Entries[0].Reason != "stuck worker" {
		t.Fatalf("history page 2: %+v", h)
	}
}

func TestList(t *testing.T) {
	f := newFixture(t)
	a := f.acquire(t)
	b := f.acquire(t, "--target", "example.org")
	var l listResult
	runCLI(t, "list", "--data-dir", f.dir, "--tenant", "acme", "--program", "p1").ok(t, &l)
	if l.Code != lease.CodeListed || len(l.Leases) != 2 || l.Leases[0].LeaseID != a.LeaseID || l.Leases[1].LeaseID != b.LeaseID {
		t.Fatalf("list by program: %+v", l)
	}
	runCLI(t, "list", "--data-dir", f.dir, "--tenant", "acme", "--program", "p1", "--namespace", "web", "--target", "example.org").ok(t, &l)
	if len(l.Leases) != 1 || l.Leases[0].LeaseID != b.LeaseID {
		t.Fatalf("list by target: %+v", l)
	}
	runCLI(t, "list", "--data-dir", f.dir, "--owner", "local-operator", "--page-size", "1").ok(t, &l)
	if len(l.Leases) != 1 || l.Leases[0].LeaseID != a.LeaseID || l.NextPageToken == "" {
		t.Fatalf("list by owner, page 1: %+v", l)
	}
	runCLI(t, "list", "--data-dir", f.dir, "--owner", "local-operator", "--page-size", "1", "--page-token", l.NextPageToken).ok(t, &l)
	if len(l.Leases) != 1 || l.Leases[0].LeaseID != b.LeaseID {
		t.Fatalf("list by owner, page 2: %+v", l)
	}
}

func TestUsageAndVersion(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}, {"acquire", "--no-such-flag"}, {"acquire", "--ttl", "soon"},
		{"inspect", "--data-dir", "d", "extra"}, {"version", "extra"}} {
		r := runCLI(t, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "usage:") || r.stdout != "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and usage", args, r.code, r.stderr)
		}
	}
	if r := runCLI(t, "help"); r.code != 0 || !strings.Contains(r.stdout, "exit status") {
		t.Errorf("help: exit %d, stdout %q", r.code, r.stdout)
	}
	r := runCLI(t, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "starlease ") || !strings.Contains(r.stdout, "go1.") {
		t.Errorf("version: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestExitCodes(t *testing.T) {
	for code, want := range map[lease.Code]int{
		lease.CodeInvalidRequest: 2, lease.CodeConflict: 3, lease.CodeLost: 3, lease.CodeIdempotencyConflict: 3,
		lease.CodeCommitRejected: 3, lease.CodeNotFound: 3, lease.CodeBackendUnavailable: 4,
		lease.CodeOutcomeUnknown: 4, lease.CodeDeadlineExceeded: 4, lease.CodeCorrupt: 4,
		lease.CodeRateLimited: 1, lease.CodeCounterExhausted: 1,
	} {
		if got := exitCode(code); got != want {
			t.Errorf("exitCode(%s) = %d, want %d", code, got, want)
		}
	}
}

func TestSanitizeID(t *testing.T) {
	for in, want := range map[string]string{"Build-Host_01": "build-host_01", "a b/c": "a-b-c", "x..y": "x.y", "h...": "h."} {
		if got := sanitizeID(in); got != want {
			t.Errorf("sanitizeID(%q) = %q, want %q", in, got, want)
		}
	}
	if err := lease.CheckOpaqueID("service_instance_id", defaultInstance()); err != nil {
		t.Errorf("default instance %q: %v", defaultInstance(), err)
	}
}

// TestBinary builds the command and runs it as real processes.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "starlease")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f := fixture{filepath.Join(tmp, "data")}
	runBin := func(args ...string) result {
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("run %v: %v", args, err)
		}
		return result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
	}
	var acq, ins printedLease
	runBin(append([]string{"acquire"}, f.id()...)...).ok(t, &acq)
	if acq.Lease.FencingToken != 1 || acq.Lease.State != lease.StateActive {
		t.Fatalf("acquire: %+v", acq.Lease)
	}
	runBin(append([]string{"inspect"}, f.id()...)...).ok(t, &ins)
	if ins.Lease.LeaseID != acq.Lease.LeaseID {
		t.Fatalf("inspect shows %s, want %s", ins.Lease.LeaseID, acq.Lease.LeaseID)
	}
	runBin(append([]string{"acquire"}, f.id()...)...).refused(t, exitRefused, lease.CodeConflict)
	if r := runBin("version"); r.code != 0 || !strings.HasPrefix(r.stdout, "starlease ") {
		t.Fatalf("version: %+v", r)
	}
}
