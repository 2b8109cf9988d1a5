package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// A renewal's answer says the caller holds the lease too: rerun with its
// request id after the lease ended (released locally, force-released on a
// server), it is lease_lost, not "renewed".
func TestOperatorReplayedRenewOfEndedLeaseIsLost(t *testing.T) {
	f := newFixture(t)
	rec := f.acquire(t)
	var p printedLease
	f.do(t, "renew", append(held(rec), "--request-id", "ren-1")...).ok(t, &p)
	f.do(t, "release", held(rec)...).ok(t, &printedLease{})
	e := f.do(t, "renew", append(held(rec), "--request-id", "ren-1")...).refused(t, exitRefused, lease.CodeLost)
	if !strings.Contains(e.Reason, "lease_renewed of lease "+rec.LeaseID) || !strings.Contains(e.Reason, "that lease is released now") {
		t.Fatalf("reason %q", e.Reason)
	}

	r := newRemote(t)
	held := r.acquire(t)
	r.do(t, "renew", append(leaseFlags(held), "--request-id", "ren-r1")...).ok(t, &p)
	r.do(t, "force-release", append(leaseFlags(held), "--reason", "stuck")...).ok(t, &printedLease{})
	e = r.do(t, "renew", append(leaseFlags(held), "--request-id", "ren-r1")...).refused(t, exitRefused, lease.CodeLost)
	if !strings.Contains(e.Reason, "lease_renewed of lease "+held.LeaseID) {
		t.Fatalf("remote reason %q", e.Reason)
	}
}

// A credential's label is the operator's text, but the store that holds it
// may be shared (Valkey, etcd): `keys` prints it escaped like every result.
func TestOperatorKeysOutputEscapesFormatCharacters(t *testing.T) {
	f := newFixture(t)
	pepper := filepath.Join(t.TempDir(), "pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-label-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	label := "ops\u202eevil\u2066x"
	var created, listed bytes.Buffer
	if code := run([]string{"keys", "create", "--data-dir", f.dir, "--pepper-file", pepper, "--principal", "prn-worker",
		"--class", "api_client", "--capabilities", "targets:lease", "--scope", "tenant:*,program:*", "--label", label},
		&created, &bytes.Buffer{}); code != 0 {
		t.Fatalf("keys create: exit %d", code)
	}
	if code := run([]string{"keys", "list", "--data-dir", f.dir}, &listed, &bytes.Buffer{}); code != 0 {
		t.Fatalf("keys list: exit %d", code)
	}
	for _, out := range []string{created.String(), listed.String()} {
		if strings.ContainsRune(out, 0x202e) || strings.ContainsRune(out, 0x2066) || !strings.Contains(out, `ops\u202eevil\u2066x`) {
			t.Fatalf("label not escaped:\n%q", out)
		}
	}
}

// Random strings of every class escapeControls handles, invalid UTF-8 and
// text that already reads as an escape: the output is valid JSON of the
// same meaning, with no control or format character left raw but the
// indentation's line breaks.
func TestEscapeControlsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	pool := []rune{0, 1, '\n', '\t', '"', '\\', 0x7f, 0x80, 0x85, 0x9b, 0x9f, 0xa0, 0xad, 0x200b, 0x200e, 0x202e, 0x2028, 0x2029,
		0x2066, 0xfeff, 0xfff9, 0x1d173, 0xe0001, 0xe007f, 'a', 'é', '<', '&', 0x10ffff, 0xfffd, 0x61c, 0x180e}
	for i := 0; i < 20000; i++ {
		var sb strings.Builder
		for j := rng.Intn(12); j > 0; j-- {
			if rng.Intn(10) == 0 {
				sb.WriteByte(byte(rng.Intn(256)))
			} else {
				sb.WriteRune(pool[rng.Intn(len(pool))])
			}
		}
		s := sb.String()
		b, err := json.MarshalIndent(map[string]any{"k": s, "n": []string{s, `\u009b` + s}}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		out := escapeControls(b)
		var a, c any
		if err := json.Unmarshal(out, &c); err != nil || json.Unmarshal(b, &a) != nil || !jsonEqual(a, c) || !utf8.Valid(out) {
			t.Fatalf("%q: escaped %q does not decode to the same value (%v)", s, out, err)
		}
		for _, r := range string(out) {
			if r != '\n' && lease.IsControlOrFormat(r) {
				t.Fatalf("%U left raw in %q", r, out)
			}
		}
	}
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

// rawCall sends one API request with key and returns status and envelope
// (without the correlation id, which differs per request).
func rawCall(t *testing.T, base, key, method, path, body string) (int, string) {
	t.Helper()
	var b any
	if body != "" {
		b = json.RawMessage(body)
	}
	status, m := apiCall(t, base, key, method, "/api/v1/target-leases"+path, b)
	delete(m, "correlation_id")
	out, _ := json.Marshal(m)
	return status, string(out)
}

// A key scoped to tenant a probes lease ids of tenant b: every answer must
// be the one a lease id that does not exist gets, or the API is an oracle
// for other tenants' lease ids (and their state).
func TestOperatorAttackOutOfScopeLeaseIDOracle(t *testing.T) {
	f := newRemote(t)
	base := f.srv.URL()
	victimKey, _ := f.srv.CreateKey("victim", "service_instance", "targets:lease", "tenant:b,program:p1")
	vf := writeKeyFile(t, victimKey, 0o600)
	var p printedLease
	runCLI(t, "acquire", "--server", base, "--api-key-file", vf, "--tenant", "b", "--program", "p1", "--namespace", "web",
		"--target", "t.example", "--actor", "scanner", "--ttl", "60s").ok(t, &p)
	victim := p.Lease
	// An ended lease of tenant b too.
	runCLI(t, "acquire", "--server", base, "--api-key-file", vf, "--tenant", "b", "--program", "p1", "--namespace", "web",
		"--target", "t2.example", "--actor", "scanner", "--ttl", "60s").ok(t, &p)
	ended := p.Lease
	runCLI(t, append([]string{"release", "--server", base, "--api-key-file", vf, "--tenant", "b", "--program", "p1", "--namespace", "web",
		"--target", "t2.example", "--actor", "scanner"}, leaseFlags(ended)...)...).ok(t, &p)

	ghost := "lease_01ARZ3NDEKTSV4RRFFQ69G5FAV"
	for _, k := range []struct{ name, caps, class string }{
		{"reader", "targets:read,audit:read", "api_client"},
		{"holder", "targets:lease", "api_client"},
		{"admin", "targets:lease,targets:read,targets:force-release,audit:read", "administrator"},
	} {
		key, _ := f.srv.CreateKey("probe-"+k.name, k.class, k.caps, "tenant:a,program:p1")
		for _, c := range []struct{ method, suffix, body string }{
			{"GET", "", ""},
			{"GET", "/history", ""},
			{"DELETE", "", `{"lock_identity":{"tenant_id":"a","program_id":"p1","target_namespace":"web","target_id":"t.example","actor_name":"scanner"},"fencing_token":1,"request_id":"probe-del-1","service_instance_id":"x"}`},
			{"POST", "/renew", `{"lock_identity":{"tenant_id":"a","program_id":"p1","target_namespace":"web","target_id":"t.example","actor_name":"scanner"},"fencing_token":1,"request_id":"probe-renew-1","service_instance_id":"x"}`},
			{"POST", "/force-release", `{"lock_identity":{"tenant_id":"a","program_id":"p1","target_namespace":"web","target_id":"t.example","actor_name":"scanner"},"fencing_token":1,"request_id":"probe-fr-1","reason":"probe"}`},
		} {
			answers := map[string]string{}
			for name, id := range map[string]string{"victim": victim.LeaseID, "ended": ended.LeaseID, "ghost": ghost} {
				body := strings.ReplaceAll(c.body, "probe-", "probe-"+name+"-")
				st, env := rawCall(t, base, key, c.method, "/"+id+c.suffix, body)
				answers[name] = fmt.Sprintf("%d %s", st, env)
			}
			if answers["victim"] != answers["ghost"] || answers["ended"] != answers["ghost"] {
				t.Errorf("%s %s%s: out-of-scope ids answer differently from a missing one:\n victim %s\n ended  %s\n ghost  %s",
					k.name, c.method, c.suffix, answers["victim"], answers["ended"], answers["ghost"])
			} else {
				t.Logf("%s %s%s: %s", k.name, c.method, c.suffix, answers["ghost"])
			}
		}
	}
}

// Every way a key fails is the same 401 (body, WWW-Authenticate,
// Cache-Control), on the console's sign-in probe and on an admin route.
func TestOperatorAttackUniform401(t *testing.T) {
	f := newRemote(t)
	base := f.srv.URL()
	revoked, revokedID := f.srv.CreateKey("gone", "api_client", "targets:lease", "tenant:*,program:*")
	f.srv.RevokeKey(revokedID)
	expiring, _ := f.srv.CreateKey("short", "api_client", "targets:lease", "tenant:*,program:*", "--ttl", "1s")
	time.Sleep(1500 * time.Millisecond)
	good := testenv.APIKeyRE.FindStringSubmatch(f.key)
	wrongSecret := "star_sk_v1_" + good[1] + "_" + strings.Repeat("0", 64)
	unknownID := "star_sk_v1_01ARZ3NDEKTSV4RRFFQ69G5FAV_" + good[2]
	upper := "star_sk_v1_" + good[1] + "_" + strings.ToUpper(good[2])
	cases := map[string][]string{
		"revoked": {"Bearer " + revoked}, "expired": {"Bearer " + expiring}, "wrong-secret": {"Bearer " + wrongSecret},
		"unknown-id": {"Bearer " + unknownID}, "garbage": {"Bearer x"}, "none": nil, "two-headers": {"Bearer " + f.key, "Bearer " + f.key},
		"comma-joined": {"Bearer " + f.key + ", Bearer " + f.key}, "upper-hex": {"Bearer " + upper}, "no-scheme": {f.key},
		"v2": {"Bearer " + strings.Replace(f.key, "_v1_", "_v2_", 1)}, "extra-suffix": {"Bearer " + f.key + "_x"},
	}
	for _, path := range []string{"", "/lease_x/force-release"} {
		method := "GET"
		if path != "" {
			method = "POST"
		}
		first := ""
		for name, vals := range cases {
			req, _ := http.NewRequest(method, base+"/api/v1/target-leases"+path, nil)
			for _, v := range vals {
				req.Header.Add("Authorization", v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&m)
			resp.Body.Close()
			delete(m, "correlation_id")
			b, _ := json.Marshal(m)
			got := fmt.Sprintf("%d %s www=%q cc=%q", resp.StatusCode, b, resp.Header.Values("WWW-Authenticate"), resp.Header.Values("Cache-Control"))
			t.Logf("%s %s %s: %s", method, path, name, got)
			if first == "" {
				first = got
			}
			if got != first || resp.StatusCode != 401 {
				t.Errorf("%s %s %s: %s, differs from %s", method, path, name, got, first)
			}
		}
	}
}
