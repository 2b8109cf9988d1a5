package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// An attack review of the operator surface, against a real server: what
// the CLI tells an operator must be what the server did.

// A release's answer is lost after the server committed it, and the key is
// revoked before the CLI's retry arrives: the retry's 401 says nothing of
// the first attempt, so the CLI reports the outcome unknown (exit 4, with
// the flags to rerun), never invalid_credential as if nothing happened.
func TestOperatorRetryRefusedLeavesOutcomeUnknown(t *testing.T) {
	f := newRemote(t)
	key, credID := f.srv.CreateKey("worker-1", "service_instance", "targets:lease", "tenant:*,program:*")
	workerFile := writeKeyFile(t, key, 0o600)
	proxy := testenv.StartProxy(t, f.srv.Addr())
	mode := func(url string) []string { return []string{"--server", url, "--api-key-file", workerFile} }
	ident := []string{"--tenant", "acme", "--program", "p1", "--namespace", "web", "--target", "example.com", "--actor", "scanner"}
	var p printedLease
	runCLI(t, append(append([]string{"acquire"}, mode(f.url)...), ident...)...).ok(t, &p)

	before := f.opsCount(t, "release")
	proxy.AddToxic("answers-lost", "timeout", testenv.Downstream, map[string]any{"timeout": 0})
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		args := append(append(append([]string{"release"}, mode("http://"+proxy.Addr())...), ident...), leaseFlags(p.Lease)...)
		code := run(append(args, "--timeout", "20s"), &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()
	eventually(t, 10*time.Second, "the server committed the release", func() bool { return f.opsCount(t, "release") > before })
	f.srv.RevokeKey(credID)
	proxy.RemoveToxic("answers-lost")
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the CLI did not finish")
	}
	if got := f.held(t, p.Lease.LeaseID); got.State != lease.StateReleased {
		t.Fatalf("the server holds the lease in state %s, want released", got.State)
	}
	e := r.refused(t, exitBackend, lease.CodeOutcomeUnknown)
	if !strings.Contains(e.Reason, "a retry was refused with invalid_credential") ||
		!strings.Contains(e.Reason, "rerun the same command with --request-id "+e.RequestID) {
		t.Fatalf("reason %q does not say the retry was refused and how to resolve it", e.Reason)
	}
}

// A caller's metadata may hold C1 controls, bidi overrides and DEL, which
// encoding/json writes raw: the CLI's JSON escapes them (and means the
// same), so `starlease inspect` never hands them to the operator's
// terminal.
func TestOperatorOutputEscapesControlAndFormatCharacters(t *testing.T) {
	f := newRemote(t)
	key, _ := f.srv.CreateKey("mallory", "api_client", "targets:lease", "tenant:acme,program:p1")
	mallory, err := client.New(f.srv.URL(), key)
	if err != nil {
		t.Fatal(err)
	}
	payload := "\x1b]0;owned\x07\u009b2J\u009b31mALL CLEAR\u202e\u2028\x7fforged line\U000e0001"
	res, err := mallory.Acquire(context.Background(), client.AcquireRequest{
		LockIdentity: lease.Identity{TenantID: "acme", ProgramID: "p1", TargetNamespace: "web", TargetID: "evil.example", ActorName: "scanner"},
		TTLMs:        60000, ServiceInstanceID: "svc-1", ExecutionID: "exec-1", JobID: "job-1",
		Metadata: map[string]any{"note": payload},
	})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	// The API answers no metadata: the operator reads it locally, with the
	// server stopped (bbolt admits one process).
	if err := f.srv.Stop(); err != nil {
		t.Fatal(err)
	}
	r := f.run(t, "inspect", "--data-dir", f.srv.DataDir(), "--lease-id", res.Lease.LeaseID)
	var printed struct {
		Lease struct {
			Metadata map[string]string `json:"metadata"`
		} `json:"lease"`
	}
	r.ok(t, &printed)
	if got := printed.Lease.Metadata["note"]; got != payload {
		t.Fatalf("metadata note %q, want %q", got, payload)
	}
	for _, c := range []rune{0x1b, 0x07, 0x7f, 0x9b, 0x202e, 0x2028, 0xe0001} {
		if strings.ContainsRune(r.stdout, c) {
			t.Fatalf("%U printed raw:\n%q", c, r.stdout)
		}
	}
}

func TestEscapeControls(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"{\n  \"a\": \"b\"\n}", "{\n  \"a\": \"b\"\n}"},
		{`"é 日本 ok"`, `"é 日本 ok"`},
		{"\"a\u009bb\"", `"a\u009bb"`},
		{"\"\u202eevil\u00ad\x7f\"", `"\u202eevil\u00ad\u007f"`},
		{"\"\U000e0001\"", `"\udb40\udc01"`},
	} {
		got := string(escapeControls([]byte(c.in)))
		if got != c.want {
			t.Errorf("escapeControls(%q) = %q, want %q", c.in, got, c.want)
		}
		var a, b any
		if json.Unmarshal([]byte(c.in), &a) == nil && (json.Unmarshal([]byte(got), &b) != nil || !jsonEqual(a, b)) {
			t.Errorf("escapeControls(%q) = %q does not decode to the same value", c.in, got)
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// Rerunning an acquisition with its request id (how an unknown outcome is
// resolved) replays the first answer; if that lease has ended since, the
// caller holds nothing: exit 3, lease_lost, naming the lease and its state
// now, so `starlease acquire ... && work` stops. A replay of a lease still
// held goes on succeeding (TestRemoteOutcomeUnknownServerKilledAndRestarted).
func TestOperatorReplayedAcquireOfEndedLeaseIsLost(t *testing.T) {
	f := newRemote(t)
	flags := []string{"--request-id", "req-replay-ended-1", "--execution", "exec-r1", "--job", "job-r1", "--ttl", "5s"}
	var first printedLease
	f.do(t, "acquire", flags...).ok(t, &first)
	f.do(t, "force-release", append(leaseFlags(first.Lease), "--reason", "stuck")...).ok(t, &printedLease{})
	now := f.held(t, first.Lease.LeaseID).State

	e := f.do(t, "acquire", flags...).refused(t, exitRefused, lease.CodeLost)
	if !strings.Contains(e.Reason, "lease_acquired of lease "+first.Lease.LeaseID+", token 1") ||
		!strings.Contains(e.Reason, "that lease is "+string(now)+" now") {
		t.Fatalf("reason %q does not name the replayed lease and its state now (%s)", e.Reason, now)
	}
	// Nothing new was acquired: the identity is free, and the next token is 2.
	if next := f.acquire(t); next.FencingToken != 2 {
		t.Fatalf("token %d, want 2", next.FencingToken)
	}
}
