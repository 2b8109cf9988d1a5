package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// The remote CLI runs against a real "starlease serve" process (bolt, the
// embedded default). Every test compares what the CLI printed with what
// the server holds, read directly over the HTTP API with the same key.

// built is the starlease binary, built once for the package's tests.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func starleaseBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and runs starlease serve")
	}
	built.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = "/usr/local/go/bin/go"
		}
		if built.dir, built.err = os.MkdirTemp("", "starlease-cli-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "starlease")
		if out, err := exec.Command(goTool, "build", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// TestMain keeps the tests hermetic: remote mode's environment variables
// of the developer's shell would turn local-mode tests remote.
func TestMain(m *testing.M) {
	os.Unsetenv(envServer)
	os.Unsetenv(envAPIKeyFile)
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// remoteFixture is a running server, an administrator key in a 0600 file,
// and a direct API client with the same key.
type remoteFixture struct {
	srv     *testenv.Starlease
	key     string
	keyFile string
	api     *client.Client
	// url is where the CLI is pointed (the server, or a proxy before it).
	url string
}

const adminCaps = "targets:lease,targets:read,targets:force-release,audit:read"

func newRemote(t *testing.T, serveArgs ...string) *remoteFixture {
	t.Helper()
	srv := testenv.StartStarlease(t, starleaseBin(t), serveArgs...)
	key, _ := srv.CreateKey("ops-admin", "administrator", adminCaps, "tenant:*,program:*")
	api, err := client.New(srv.URL(), key)
	if err != nil {
		t.Fatal(err)
	}
	return &remoteFixture{srv: srv, key: key, keyFile: writeKeyFile(t, key, 0o600), api: api, url: srv.URL()}
}

func writeKeyFile(t *testing.T, key string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "api.key")
	if err := os.WriteFile(p, []byte(key+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *remoteFixture) mode() []string {
	return []string{"--server", f.url, "--api-key-file", f.keyFile}
}

// id is the mode flags, an identity and extra.
func (f *remoteFixture) id(extra ...string) []string {
	return append(append(f.mode(), "--tenant", "Acme", "--program", "p1", "--namespace", "web",
		"--target", "example.com", "--actor", "scanner"), extra...)
}

// run runs the CLI in process and checks that the key shows nowhere.
func (f *remoteFixture) run(t *testing.T, args ...string) result {
	t.Helper()
	r := runCLI(t, args...)
	f.noKey(t, r.stdout+r.stderr)
	return r
}

func (f *remoteFixture) do(t *testing.T, cmd string, extra ...string) result {
	t.Helper()
	return f.run(t, append([]string{cmd}, f.id(extra...)...)...)
}

func (f *remoteFixture) noKey(t *testing.T, out string) {
	t.Helper()
	secret := testenv.APIKeyRE.FindStringSubmatch(f.key)[2]
	if strings.Contains(out, f.key) || strings.Contains(out, secret) {
		t.Fatalf("the API key shows in the output:\n%s", out)
	}
}

func (f *remoteFixture) acquire(t *testing.T, extra ...string) *lease.Record {
	t.Helper()
	var p printedLease
	f.do(t, "acquire", extra...).ok(t, &p)
	if p.Code != lease.CodeAcquired || p.Lease == nil || p.Replayed || p.RequestID == "" {
		t.Fatalf("acquire printed %+v", p)
	}
	f.matches(t, p.Lease)
	return p.Lease
}

// held reads a lease by id from the server.
func (f *remoteFixture) held(t *testing.T, leaseID string) client.Lease {
	t.Helper()
	res, err := f.api.Get(context.Background(), leaseID)
	if err != nil {
		t.Fatalf("GET lease %s: %v", leaseID, err)
	}
	return res.Lease
}

// matches requires the printed record to be the lease the server holds.
func (f *remoteFixture) matches(t *testing.T, rec *lease.Record) {
	t.Helper()
	sameLease(t, rec, f.held(t, rec.LeaseID))
}

// sameLease compares a printed record with the server's lease.
func sameLease(t *testing.T, rec *lease.Record, l client.Lease) {
	t.Helper()
	if rec.LeaseID != l.LeaseID || rec.FencingToken != l.FencingToken || rec.State != l.State || rec.TTLMs != l.TTLMs ||
		!rec.AcquiredAt.Time().Equal(l.AcquiredAt) || !rec.RenewedAt.Time().Equal(l.RenewedAt) ||
		!rec.ExpiresAt.Time().Equal(l.ExpiresAt) || rec.Identity() != l.LockIdentity || rec.LockKey == "" ||
		rec.RecordVersion != lease.RecordVersion {
		t.Fatalf("printed lease differs from the server's:\nprinted %+v\nserver  %+v", rec, l)
	}
}

func leaseFlags(rec *lease.Record) []string {
	return []string{"--lease-id", rec.LeaseID, "--token", itoa(rec.FencingToken)}
}

// The motivation: while serve holds the bolt file, local mode cannot open
// it, and says to use remote mode; remote mode works.
func TestRemoteLeaseLifecycle(t *testing.T) {
	f := newRemote(t)
	local := runCLI(t, append([]string{"inspect", "--data-dir", f.srv.DataDir()}, f.id()[4:]...)...)
	if e := local.refused(t, exitBackend, lease.CodeBackendUnavailable); !strings.Contains(e.Reason, "--server URL") {
		t.Fatalf("local mode on the server's data dir: %+v", e)
	}

	first := f.acquire(t, "--ttl", "20s")
	if first.FencingToken != 1 || first.TenantID != "acme" || first.TTLMs != 20000 || first.MaximumLifetimeMs != 300000 ||
		first.ServiceInstanceID != defaultInstance() || first.OwnerPrincipalID != "" || first.Metadata == nil {
		t.Fatalf("first lease: %+v", first)
	}
	e := f.do(t, "acquire").refused(t, exitRefused, lease.CodeConflict)
	if !e.Retryable || e.RequestID == "" || e.RetryAfterMs <= 0 {
		t.Fatalf("conflict envelope: %+v", e)
	}
	if l := f.held(t, first.LeaseID); l.FencingToken != 1 || l.State != lease.StateActive {
		t.Fatalf("the conflict changed the lease: %+v", l)
	}

	var p printedLease
	f.do(t, "inspect").ok(t, &p)
	if p.Code != lease.CodeInspected || p.Lease.LeaseID != first.LeaseID || p.Replayed {
		t.Fatalf("inspect by identity: %+v", p)
	}
	f.matches(t, p.Lease)
	f.run(t, append([]string{"inspect"}, append(f.mode(), "--lease-id", first.LeaseID)...)...).ok(t, &p)
	if p.Lease.LeaseID != first.LeaseID {
		t.Fatalf("inspect by id: %+v", p)
	}
	f.matches(t, p.Lease)

	f.do(t, "renew", append(leaseFlags(first), "--ttl", "45s")...).ok(t, &p)
	if p.Code != lease.CodeRenewed || p.Lease.TTLMs != 45000 || p.Lease.FencingToken != 1 || p.RequestID == "" {
		t.Fatalf("renew: %+v", p)
	}
	f.matches(t, p.Lease)
	if got := f.held(t, first.LeaseID); got.TTLMs != 45000 || !got.RenewedAt.After(first.RenewedAt.Time().Add(-time.Millisecond)) {
		t.Fatalf("server after renew: %+v", got)
	}
	// Only the holder's instance renews.
	f.do(t, "renew", append(leaseFlags(first), "--instance", "someone-else")...).refused(t, exitRefused, lease.CodeLost)

	f.do(t, "release", leaseFlags(first)...).ok(t, &p)
	if p.Code != lease.CodeReleased || p.Lease.State != lease.StateReleased {
		t.Fatalf("release: %+v", p)
	}
	f.matches(t, p.Lease)
	f.do(t, "release", leaseFlags(first)...).refused(t, exitRefused, lease.CodeLost)
	f.do(t, "inspect").refused(t, exitRefused, lease.CodeNotFound)

	second := f.acquire(t)
	if second.FencingToken != 2 || second.LeaseID == first.LeaseID {
		t.Fatalf("re-acquire: %+v", second)
	}
}

// A request id given (or printed) is the idempotency key: the same command
// replays the stored result, a changed body is idempotency_conflict; a
// commit id likewise.
func TestRemoteIdempotencyAndCommit(t *testing.T) {
	f := newRemote(t)
	ids := []string{"--request-id", "req-remote-1", "--execution", "exec-1", "--job", "job-1"}
	rec := f.acquire(t, ids...)
	var p printedLease
	f.do(t, "acquire", ids...).ok(t, &p)
	if !p.Replayed || p.Lease.LeaseID != rec.LeaseID || p.Lease.FencingToken != rec.FencingToken || p.RequestID != "req-remote-1" {
		t.Fatalf("replay: %+v", p)
	}
	f.matches(t, p.Lease)
	f.do(t, "acquire", "--request-id", "req-remote-1", "--execution", "exec-1", "--job", "job-2").
		refused(t, exitRefused, lease.CodeIdempotencyConflict)

	write := append(leaseFlags(rec), "--sink", "couchdb", "--execution", "exec-1", "--job", "job-1", "--write-target", "doc-1",
		"--commit-id", "commit-1")
	var c commitResult
	f.do(t, "authorize-commit", write...).ok(t, &c)
	if c.Code != lease.CodeCommitAuthorized || c.Replayed || c.Commit.LeaseID != rec.LeaseID || c.Commit.FencingToken != 1 ||
		c.Commit.Sink != "couchdb" || c.Commit.Target != "doc-1" || c.Commit.CommitID != "commit-1" || c.Commit.Seq < 1 {
		t.Fatalf("commit: %+v", c)
	}
	// The server's record of the commit, read back by sending the same
	// commit directly: it replays the accepted one.
	held, err := f.api.AuthorizeCommit(context.Background(), client.CommitRequest{LockIdentity: rec.Identity(),
		LeaseID: rec.LeaseID, FencingToken: 1, ServiceInstanceID: defaultInstance(), Sink: "couchdb", CommitID: "commit-1",
		ExecutionID: "exec-1", JobID: "job-1", Target: "doc-1"})
	if err != nil || !held.Replayed || held.Commit.CommitSeq != c.Commit.Seq || !held.Commit.AcceptedAt.Equal(c.Commit.AcceptedAt.Time()) {
		t.Fatalf("server's commit: %+v, %v; printed %+v", held, err, c.Commit)
	}
	f.do(t, "authorize-commit", append(write[:len(write)-1], "commit-1")...).ok(t, &c)
	if !c.Replayed {
		t.Fatalf("commit replay: %+v", c)
	}
	// The commit id names that write: for another document it conflicts.
	f.do(t, "authorize-commit", append(leaseFlags(rec), "--sink", "couchdb", "--execution", "exec-1", "--job", "job-1",
		"--write-target", "doc-2", "--commit-id", "commit-1")...).refused(t, exitRefused, lease.CodeIdempotencyConflict)
}

// force-release with a reason, revoke with an incident, history by
// identity (needs an active lease remotely) and by any lease id, paged.
func TestRemoteAdminAndHistory(t *testing.T) {
	f := newRemote(t)
	rec := f.acquire(t, "--execution", "exec-1", "--job", "job-1")
	var p printedLease
	f.do(t, "force-release", append(leaseFlags(rec), "--reason", "stuck worker")...).ok(t, &p)
	if p.Code != lease.CodeForceReleased || p.Lease.State != lease.StateReleased || p.Lease.LeaseID != rec.LeaseID || p.RequestID == "" {
		t.Fatalf("force-release: %+v", p)
	}
	f.matches(t, p.Lease)
	// The former holder can no longer commit.
	f.do(t, "authorize-commit", append(leaseFlags(rec), "--sink", "couchdb", "--execution", "exec-1", "--job", "job-1",
		"--write-target", "doc-1")...).refused(t, exitRefused, lease.CodeLost)
	e := f.do(t, "history").refused(t, exitRefused, lease.CodeNotFound)
	if !strings.Contains(e.Reason, "--lease-id") {
		t.Fatalf("history of an identity without an active lease: %+v", e)
	}

	next := f.acquire(t)
	f.do(t, "revoke", append(leaseFlags(next), "--incident", "inc-7")...).ok(t, &p)
	if p.Code != lease.CodeRevoked || p.Lease.State != lease.StateRevoked {
		t.Fatalf("revoke: %+v", p)
	}
	f.matches(t, p.Lease)
	third := f.acquire(t)
	if third.FencingToken != 3 {
		t.Fatalf("token %d, want 3", third.FencingToken)
	}

	server, err := f.api.History(context.Background(), third.LeaseID, 0, "")
	if err != nil || len(server.History) != 2 {
		t.Fatalf("server history: %+v, %v", server, err)
	}
	var h historyResult
	f.do(t, "history").ok(t, &h)
	if h.Code != lease.CodeHistory || len(h.Entries) != 2 || h.NextPageToken != "" {
		t.Fatalf("history by identity: %+v", h)
	}
	for i, want := range server.History {
		got := h.Entries[i]
		sameLease(t, got.Record, want.Lease)
		if !got.EndedAt.Time().Equal(want.EndedAt) || got.Reason != want.Reason || got.IncidentID != want.IncidentID {
			t.Fatalf("entry %d: %+v, server %+v", i, got, want)
		}
	}
	if h.Entries[0].IncidentID != "inc-7" || h.Entries[1].Reason != "stuck worker" {
		t.Fatalf("history, newest first: %+v", h.Entries)
	}
	// By the id of an ended lease, one page at a time.
	byID := append(f.mode(), "--lease-id", rec.LeaseID, "--page-size", "1")
	f.run(t, append([]string{"history"}, byID...)...).ok(t, &h)
	if len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != next.LeaseID || h.NextPageToken == "" {
		t.Fatalf("history page 1: %+v", h)
	}
	f.run(t, append([]string{"history"}, append(byID, "--page-token", h.NextPageToken)...)...).ok(t, &h)
	if len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != rec.LeaseID || h.Entries[0].Reason != "stuck worker" {
		t.Fatalf("history page 2: %+v", h)
	}
	f.run(t, append([]string{"history"}, f.id("--lease-id", rec.LeaseID)...)...).refused(t, exitUsage, lease.CodeInvalidRequest)
}

// list by program, by target and by owner (the key's principal), paged
// with the server's tokens.
func TestRemoteList(t *testing.T) {
	f := newRemote(t)
	a := f.acquire(t)
	b := f.acquire(t, "--target", "example.org")
	var l listResult
	f.run(t, append([]string{"list"}, append(f.mode(), "--tenant", "acme", "--program", "p1")...)...).ok(t, &l)
	server, err := f.api.List(context.Background(), client.ListRequest{TenantID: "acme", ProgramID: "p1"})
	if err != nil || l.Code != lease.CodeListed || len(l.Leases) != 2 || len(server.Leases) != 2 || l.NextPageToken != "" {
		t.Fatalf("list by program: %+v; server %+v, %v", l, server, err)
	}
	for i := range l.Leases {
		sameLease(t, l.Leases[i], server.Leases[i])
	}
	f.run(t, append([]string{"list"}, append(f.mode(), "--tenant", "acme", "--program", "p1", "--namespace", "web",
		"--target", "example.org")...)...).ok(t, &l)
	if len(l.Leases) != 1 || l.Leases[0].LeaseID != b.LeaseID {
		t.Fatalf("list by target: %+v", l)
	}
	f.matches(t, l.Leases[0])
	seen := map[string]bool{}
	owner := append(f.mode(), "--owner", "ops-admin", "--page-size", "1")
	f.run(t, append([]string{"list"}, owner...)...).ok(t, &l)
	if len(l.Leases) != 1 || l.NextPageToken == "" {
		t.Fatalf("list by owner, page 1: %+v", l)
	}
	seen[l.Leases[0].LeaseID] = true
	f.run(t, append([]string{"list"}, append(owner, "--page-token", l.NextPageToken)...)...).ok(t, &l)
	if len(l.Leases) != 1 {
		t.Fatalf("list by owner, page 2: %+v", l)
	}
	seen[l.Leases[0].LeaseID] = true
	if !seen[a.LeaseID] || !seen[b.LeaseID] {
		t.Fatalf("pages by owner missed a lease: %v", seen)
	}
	f.run(t, append([]string{"list"}, append(f.mode(), "--tenant", "acme", "--program", "p1", "--page-token", "forged")...)...).
		refused(t, exitUsage, lease.CodeInvalidRequest)
}

// lookup has no HTTP route: remote lookup is a typed usage error, and it
// sends nothing (the server given does not even exist).
func TestRemoteLookupRefused(t *testing.T) {
	keyFile := writeKeyFile(t, "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ0_"+strings.Repeat("ab", 32), 0o600)
	r := runCLI(t, "lookup", "--server", "http://127.0.0.1:1", "--api-key-file", keyFile, "--tenant", "t", "--program", "p",
		"--namespace", "n", "--target", "x", "--actor", "a", "--op", "acquire", "--request-id", "req-1")
	e := r.refused(t, exitUsage, lease.CodeInvalidRequest)
	if e.Field != "server" || !strings.Contains(e.Reason, "no request-id lookup") || !strings.Contains(e.Reason, "--request-id") {
		t.Fatalf("remote lookup: %+v", e)
	}
}

// The mode flags and their environment variables; the key file is checked
// like the pepper, and the key shows in no output.
func TestRemoteFlagsAndKeyFile(t *testing.T) {
	f := newRemote(t)
	rec := f.acquire(t)
	ident := f.id()[4:]
	inspect := func(args ...string) result {
		return f.run(t, append([]string{"inspect"}, append(args, ident...)...)...)
	}

	t.Setenv(envServer, f.url)
	t.Setenv(envAPIKeyFile, f.keyFile)
	var p printedLease
	inspect().ok(t, &p)
	if p.Lease.LeaseID != rec.LeaseID {
		t.Fatalf("inspect through the environment: %+v", p)
	}
	// A flag wins over its variable.
	t.Setenv(envServer, "http://127.0.0.1:1")
	inspect("--server", f.url).ok(t, &p)
	t.Setenv(envAPIKeyFile, filepath.Join(t.TempDir(), "missing"))
	inspect("--server", f.url, "--api-key-file", f.keyFile).ok(t, &p)
	// --data-dir on the command line wins over STARLEASE_SERVER too.
	t.Setenv(envServer, f.url)
	local := t.TempDir()
	if e := inspect("--data-dir", local).refused(t, exitRefused, lease.CodeNotFound); e.Code != lease.CodeNotFound {
		t.Fatalf("local mode beside the variable: %+v", e)
	}
	if _, err := os.Stat(filepath.Join(local, storeFile)); err != nil {
		t.Fatalf("local mode did not open its store: %v", err)
	}
	// An empty variable is unset: local mode.
	t.Setenv(envServer, "")
	if e := inspect().refused(t, exitUsage, lease.CodeInvalidRequest); e.Field != "data_dir" {
		t.Fatalf("no mode: %+v", e)
	}
	t.Setenv(envAPIKeyFile, "")

	wrongKey := writeKeyFile(t, "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ0_"+strings.Repeat("cd", 32), 0o600)
	for name, c := range map[string]struct {
		args  []string
		exit  int
		code  lease.Code
		field string
	}{
		"both modes":         {[]string{"--server", f.url, "--api-key-file", f.keyFile, "--data-dir", t.TempDir()}, exitUsage, lease.CodeInvalidRequest, "server"},
		"no key file":        {[]string{"--server", f.url}, exitUsage, lease.CodeInvalidRequest, "api_key_file"},
		"key file w/o mode":  {[]string{"--data-dir", t.TempDir(), "--api-key-file", f.keyFile}, exitUsage, lease.CodeInvalidRequest, "api_key_file"},
		"group readable":     {[]string{"--server", f.url, "--api-key-file", writeKeyFile(t, f.key, 0o640)}, exitUsage, lease.CodeInvalidRequest, "api_key_file"},
		"world readable":     {[]string{"--server", f.url, "--api-key-file", writeKeyFile(t, f.key, 0o644)}, exitUsage, lease.CodeInvalidRequest, "api_key_file"},
		"missing key file":   {[]string{"--server", f.url, "--api-key-file", filepath.Join(t.TempDir(), "nope")}, exitUsage, lease.CodeInvalidRequest, "api_key_file"},
		"two-line key file":  {[]string{"--server", f.url, "--api-key-file", writeKeyFile(t, f.key+"\n"+f.key, 0o600)}, exitUsage, lease.CodeInvalidRequest, "api_key_file"},
		"principal remotely": {[]string{"--server", f.url, "--api-key-file", f.keyFile, "--principal", "mallory"}, exitUsage, lease.CodeInvalidRequest, "principal"},
		"not http":           {[]string{"--server", "ftp://127.0.0.1", "--api-key-file", f.keyFile}, exitUsage, lease.CodeInvalidRequest, "server"},
		"url with user":      {[]string{"--server", "http://u:p@127.0.0.1:1", "--api-key-file", f.keyFile}, exitUsage, lease.CodeInvalidRequest, "server"},
		"unknown key":        {[]string{"--server", f.url, "--api-key-file", wrongKey}, exitOther, lease.CodeInvalidCredential, ""},
		"server down":        {[]string{"--server", "http://127.0.0.1:1", "--api-key-file", f.keyFile}, exitBackend, lease.CodeBackendUnavailable, ""},
	} {
		t.Run(name, func(t *testing.T) {
			e := inspect(c.args...).refused(t, c.exit, c.code)
			if e.Field != c.field {
				t.Fatalf("field %q, want %q (%+v)", e.Field, c.field, e)
			}
		})
	}
	// Remote mode validates the operation class against the server's set,
	// not the CLI's default: an unconfigured class is the server's refusal.
	e := f.do(t, "acquire", "--operation-class", "scrape").refused(t, exitUsage, lease.CodeInvalidRequest)
	if e.Field != "lock_identity.operation_class" {
		t.Fatalf("unconfigured class: %+v", e)
	}
}
