package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// Outcome-unknown resolution: the server decides a mutation but its answer
// never reaches the CLI. The CLI sends the same request id with the same
// body again until it is answered (the server replays the stored result)
// or its --timeout passes; then it exits 4 with lease_outcome_unknown, the
// request id, and the flags that resolve it when the same command is run
// again with them.

// opsCount is the server's count of decided operations op (any code), read
// from GET /metrics: it moves once the server has answered.
func (f *remoteFixture) opsCount(t *testing.T, op string) float64 {
	t.Helper()
	resp, err := http.Get(f.srv.URL() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	var n float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "starlease_operations_total{") && strings.Contains(line, `operation="`+op+`"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metrics line %q", line)
			}
			n += v
		}
	}
	return n
}

// eventually polls cond every 20 ms for up to limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// answerLost runs the CLI in process with args (pointed at proxy) while
// the proxy drops every answer; once the server has decided op, the held
// connection is reset (the answer is lost for good) and the proxy heals, so
// the CLI's retry reaches the server.
func (f *remoteFixture) answerLost(t *testing.T, proxy *testenv.Proxy, op string, args ...string) result {
	t.Helper()
	before := f.opsCount(t, op)
	proxy.AddToxic("answers-lost", "timeout", testenv.Downstream, map[string]any{"timeout": 0})
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()
	eventually(t, 10*time.Second, op+" decided by the server", func() bool { return f.opsCount(t, op) > before })
	proxy.RemoveToxic("answers-lost") // resets the connection that waits for the answer
	select {
	case r := <-done:
		f.noKey(t, r.stdout+r.stderr)
		if f.opsCount(t, op) < before+2 {
			t.Fatalf("%s: the CLI did not send the request again", op)
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the CLI did not finish", op)
		return result{}
	}
}

// Every mutation whose answer is lost is resolved by the CLI's retry: the
// server replays the stored result, and nothing happens twice.
func TestRemoteOutcomeUnknownEveryMutation(t *testing.T) {
	f := newRemote(t)
	proxy := testenv.StartProxy(t, f.srv.Addr())
	direct := f.url
	viaProxy := func(cmd string, extra ...string) []string {
		f.url = "http://" + proxy.Addr()
		defer func() { f.url = direct }()
		return append([]string{cmd}, f.id(append(extra, "--timeout", "20s")...)...)
	}
	replayed := func(t *testing.T, r result, code lease.Code) *lease.Record {
		t.Helper()
		var p printedLease
		r.ok(t, &p)
		if p.Code != code || !p.Replayed || p.RequestID == "" {
			t.Fatalf("want the replayed %s: %+v", code, p)
		}
		f.matches(t, p.Lease)
		return p.Lease
	}

	rec := replayed(t, f.answerLost(t, proxy, "acquire", viaProxy("acquire", "--execution", "exec-1", "--job", "job-1")...), lease.CodeAcquired)
	if rec.FencingToken != 1 {
		t.Fatalf("token %d: the retry acquired again", rec.FencingToken)
	}
	r := replayed(t, f.answerLost(t, proxy, "renew", viaProxy("renew", append(leaseFlags(rec), "--ttl", "45s")...)...), lease.CodeRenewed)
	if r.TTLMs != 45000 {
		t.Fatalf("renew: %+v", r)
	}

	res := f.answerLost(t, proxy, "authorize_commit", viaProxy("authorize-commit", append(leaseFlags(rec), "--sink", "couchdb",
		"--execution", "exec-1", "--job", "job-1", "--write-target", "doc-1", "--commit-id", "commit-lost-1")...)...)
	var c commitResult
	res.ok(t, &c)
	server, err := f.api.AuthorizeCommit(context.Background(), client.CommitRequest{LockIdentity: rec.Identity(),
		LeaseID: rec.LeaseID, FencingToken: 1, ServiceInstanceID: defaultInstance(), Sink: "couchdb", CommitID: "commit-lost-1",
		ExecutionID: "exec-1", JobID: "job-1", Target: "doc-1"})
	if !c.Replayed || err != nil || !server.Replayed || server.Commit.CommitSeq != c.Commit.Seq || c.Commit.Seq != 1 {
		t.Fatalf("commit: printed %+v; server %+v, %v", c, server, err)
	}

	if r := replayed(t, f.answerLost(t, proxy, "release", viaProxy("release", leaseFlags(rec)...)...), lease.CodeReleased); r.State != lease.StateReleased {
		t.Fatalf("release: %+v", r)
	}
	next := f.acquire(t)
	if next.FencingToken != 2 {
		t.Fatalf("token %d after one acquisition and its retry, want 2", next.FencingToken)
	}
	if r := replayed(t, f.answerLost(t, proxy, "force_release", viaProxy("force-release", append(leaseFlags(next), "--reason", "stuck")...)...),
		lease.CodeForceReleased); r.State != lease.StateReleased {
		t.Fatalf("force-release: %+v", r)
	}
	third := f.acquire(t)
	if r := replayed(t, f.answerLost(t, proxy, "revoke", viaProxy("revoke", append(leaseFlags(third), "--incident", "inc-1")...)...),
		lease.CodeRevoked); r.State != lease.StateRevoked {
		t.Fatalf("revoke: %+v", r)
	}
}

// cliProcess is the starlease binary running one command.
type cliProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *testenv.Buffer
	exited         chan struct{} // closed when the process has exited
	err            error         // Wait's error, set before exited closes
}

func startCLI(t *testing.T, env []string, args ...string) *cliProcess {
	t.Helper()
	p := &cliProcess{cmd: exec.Command(starleaseBin(t), args...), stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{},
		exited: make(chan struct{})}
	p.cmd.Env = append(testenv.CleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

func (p *cliProcess) wait(t *testing.T, limit time.Duration) result {
	t.Helper()
	select {
	case <-p.exited:
		var ee *exec.ExitError
		if p.err != nil && !errors.As(p.err, &ee) {
			t.Fatalf("CLI: %v", p.err)
		}
		return result{p.cmd.ProcessState.ExitCode(), p.stdout.String(), p.stderr.String()}
	case <-time.After(limit):
		t.Fatalf("the CLI did not finish within %v; stderr: %s", limit, p.stderr.String())
		return result{}
	}
}

// psView is what ps (and anyone on the host) can read of a process: its
// command line and environment.
func psView(t *testing.T, pid int) string {
	t.Helper()
	var b strings.Builder
	for _, f := range []string{"cmdline", "environ"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			t.Fatalf("read /proc/%d/%s: %v", pid, f, err)
		}
		b.Write(bytes.ReplaceAll(data, []byte{0}, []byte{' '}))
	}
	return b.String()
}

// crashMidRequest points the CLI at a proxy that drops the server's
// answers, starts the acquisition as a process, waits until the server has
// committed it (read directly), checks that ps shows no key, and kills the
// server with SIGKILL before any answer got out. It returns the CLI
// process, the proxy and the lease the server committed.
func crashMidRequest(t *testing.T, f *remoteFixture, timeout string) (*cliProcess, *testenv.Proxy, client.Lease) {
	t.Helper()
	proxy := testenv.StartProxy(t, f.srv.Addr())
	proxy.AddToxic("answers-lost", "timeout", testenv.Downstream, map[string]any{"timeout": 0})
	f.url = "http://" + proxy.Addr()
	// The mode comes from the environment here, as an operator sets it.
	cli := startCLI(t, []string{envServer + "=" + f.url, envAPIKeyFile + "=" + f.keyFile},
		append([]string{"acquire"}, f.id("--timeout", timeout)[4:]...)...)
	var held client.Lease
	eventually(t, 10*time.Second, "the acquisition committed", func() bool {
		res, err := f.api.Inspect(context.Background(), lease.Identity{TenantID: "acme", ProgramID: "p1",
			TargetNamespace: "web", TargetID: "example.com", ActorName: "scanner"})
		if err == nil {
			held = res.Lease
		}
		return err == nil
	})
	f.noKey(t, psView(t, cli.cmd.Process.Pid))
	f.srv.Kill()
	proxy.RemoveToxic("answers-lost")
	return cli, proxy, held
}

// The server is killed between committing the acquisition and answering;
// started again (same data directory) within the CLI's --timeout, it
// answers the CLI's retry with the stored result: the same lease and
// token, replayed, and no second acquisition.
func TestRemoteOutcomeUnknownServerKilledAndRestarted(t *testing.T) {
	f := newRemote(t)
	cli, proxy, held := crashMidRequest(t, f, "25s")
	time.Sleep(500 * time.Millisecond) // the CLI retries against a dead server meanwhile
	f.srv.StartAgain()
	proxy.Retarget(f.srv.Addr())
	api, err := client.New(f.srv.URL(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	f.api = api

	r := cli.wait(t, 40*time.Second)
	var p printedLease
	r.ok(t, &p)
	f.noKey(t, r.stdout+r.stderr)
	if p.Code != lease.CodeAcquired || !p.Replayed || p.Lease.LeaseID != held.LeaseID || p.Lease.FencingToken != 1 ||
		!strings.HasPrefix(p.RequestID, "req_") {
		t.Fatalf("after the restart: %+v (server holds %+v)", p, held)
	}
	f.matches(t, p.Lease)
	// Exactly one acquisition happened: the next one conflicts, and after a
	// release the token is 2.
	f.url = f.srv.URL()
	f.do(t, "acquire").refused(t, exitRefused, lease.CodeConflict)
	f.do(t, "release", leaseFlags(p.Lease)...).ok(t, &printedLease{})
	if next := f.acquire(t); next.FencingToken != 2 {
		t.Fatalf("token %d, want 2", next.FencingToken)
	}
}

// The server is killed mid-request and stays down past the CLI's
// --timeout: exit 4, lease_outcome_unknown, the request id, and the flags
// to rerun with. Once the server is back, the same command with those flags
// resolves it (the stored result, replayed); without the generated
// execution and job ids the body differs and the server refuses it.
func TestRemoteOutcomeUnknownRerunWithRequestID(t *testing.T) {
	f := newRemote(t)
	cli, _, held := crashMidRequest(t, f, "3s")
	r := cli.wait(t, 30*time.Second)
	f.noKey(t, r.stdout+r.stderr)
	e := r.refused(t, exitBackend, lease.CodeOutcomeUnknown)
	if !e.Retryable || !strings.HasPrefix(e.RequestID, "req_") {
		t.Fatalf("envelope: %+v", e)
	}
	_, hint, ok := strings.Cut(e.Reason, "rerun the same command with ")
	hint, ok2 := strings.CutSuffix(hint, " to resolve it")
	rerun := strings.Fields(hint)
	if !ok || !ok2 || len(rerun) != 6 || rerun[0] != "--request-id" || rerun[1] != e.RequestID ||
		rerun[2] != "--execution" || rerun[4] != "--job" {
		t.Fatalf("reason %q names no rerun flags", e.Reason)
	}
	var attempts int
	if _, err := fmt.Sscanf(e.Reason[strings.Index(e.Reason, "(")+1:], "%d attempts", &attempts); err != nil || attempts < 2 {
		t.Fatalf("reason %q: %d attempts (%v), want retries", e.Reason, attempts, err)
	}

	f.srv.StartAgain()
	f.url = f.srv.URL()
	api, err := client.New(f.srv.URL(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	f.api = api
	f.do(t, "acquire", rerun[:2]...).refused(t, exitRefused, lease.CodeIdempotencyConflict)
	var p printedLease
	f.do(t, "acquire", rerun...).ok(t, &p)
	if p.Code != lease.CodeAcquired || !p.Replayed || p.RequestID != e.RequestID || p.Lease.LeaseID != held.LeaseID ||
		p.Lease.FencingToken != held.FencingToken || p.Lease.ExecutionID != rerun[3] || p.Lease.JobID != rerun[5] {
		t.Fatalf("rerun: %+v (server holds %+v)", p, held)
	}
	f.matches(t, p.Lease)
}
