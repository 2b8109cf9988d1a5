package main

// Written by an outside security review of the remote CLI. The tests
// noted "found by review" failed on the first version; the others record
// attacks that held up.

import (
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// review16Key is a well-formed API key (format only; no server knows it).
const review16Key = "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ0_" +
	"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// authRecorder is a plain HTTP server that records every Authorization
// header it receives and answers 404 with a non-envelope body.
type authRecorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func newAuthRecorder(t *testing.T) *authRecorder {
	t.Helper()
	a := &authRecorder{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.seen = append(a.seen, r.Method+" "+r.URL.Path+" Authorization="+r.Header.Get("Authorization"))
		a.mu.Unlock()
		http.NotFound(w, r)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// neverReached checks that the redirect target got no request at all,
// and that the CLI said why it stopped.
func (a *authRecorder) neverReached(t *testing.T, cliOutput string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.seen {
		t.Errorf("the redirect was followed: %s", strings.Replace(s, review16Key, "<the API key>", 1))
	}
	if !strings.Contains(cliOutput, "redirect") {
		t.Errorf("the CLI did not say it refused a redirect: %s", cliOutput)
	}
}

// redirectFollowed checks the setup: a client that follows redirects from
// front does reach the recorder.
func redirectFollowed(t *testing.T, front string, hc *http.Client, a *authRecorder) {
	t.Helper()
	resp, err := hc.Get(front + "/probe")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) != 1 {
		t.Fatalf("setup: a following client reached the target %d times", len(a.seen))
	}
	a.seen = nil
}

// redirector answers every request with a 307 to target + the same path.
func redirector(target string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target+r.URL.Path, http.StatusTemporaryRedirect)
	})
}

// Found by review (high): the remote CLI's HTTP client follows redirects with the
// default policy, and net/http keeps Authorization on a redirect whose
// host name matches (the port and scheme are not compared): a --server
// that answers 307 to another port of the same host name gets the bearer
// key forwarded to whatever listens there. (A subdomain of the server's
// host name gets it too.) A remote command should never follow a redirect.
func TestReview16RedirectToOtherPortCarriesBearer(t *testing.T) {
	other := newAuthRecorder(t)                            // http://127.0.0.1:B
	front := httptest.NewServer(redirector(other.srv.URL)) // http://127.0.0.1:A
	t.Cleanup(front.Close)
	keyFile := writeKeyFile(t, review16Key, 0o600)
	r := runCLI(t, "inspect", "--server", front.URL, "--api-key-file", keyFile, "--timeout", "2s",
		"--tenant", "acme", "--program", "recon", "--namespace", "web", "--target", "example.net", "--actor", "crawler")
	t.Logf("exit %d, stderr: %s", r.code, strings.TrimSpace(r.stderr))
	if r.code == 0 {
		t.Fatal("the CLI succeeded against a redirect")
	}
	other.neverReached(t, r.stderr)
	redirectFollowed(t, front.URL, http.DefaultClient, other)
}

// Found by review (high): the same over TLS: an https --server redirecting to
// http:// on the same host name downgrades the bearer key to clear text
// (net/http strips Authorization only when the host name changes). Run
// as a subprocess so that SSL_CERT_FILE makes the test server's
// certificate trusted.
func TestReview16RedirectHTTPSToHTTPDowngradesBearer(t *testing.T) {
	bin := starleaseBin(t)
	other := newAuthRecorder(t) // plain http://127.0.0.1:B
	front := httptest.NewTLSServer(redirector(other.srv.URL))
	t.Cleanup(front.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	cert := front.Certificate()
	if _, err := x509.ParseCertificate(cert.Raw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := writeKeyFile(t, review16Key, 0o600)
	cmd := exec.Command(bin, "inspect", "--server", front.URL, "--api-key-file", keyFile, "--timeout", "3s",
		"--tenant", "acme", "--program", "recon", "--namespace", "web", "--target", "example.net", "--actor", "crawler")
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+ca, "SSL_CERT_DIR="+t.TempDir())
	out, _ := cmd.CombinedOutput()
	t.Logf("CLI: %s", strings.TrimSpace(string(out)))
	if !strings.HasPrefix(front.URL, "https://") || !strings.HasPrefix(other.srv.URL, "http://") {
		t.Fatal("setup: want https front, http target")
	}
	other.neverReached(t, string(out))
	redirectFollowed(t, front.URL, front.Client(), other)
}

// fakeAPI answers GET list with body and any other request with a 404
// envelope.
func fakeAPI(t *testing.T, status int, body string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

// Found by review (low): list --output table quotes every cell (control
// characters, escapes) but prints the server's next_page_token raw after
// "next_page_token: ": a token holding terminal escape sequences (OSC to
// retitle the window or write the clipboard, CSI to clear the screen or
// move the cursor) reaches the operator's terminal. JSON output escapes it;
// the table should print it with cell() (or refuse a token that is not
// base64url, which every token the service hands out is).
func TestReview16TableNextPageTokenEscapeSequences(t *testing.T) {
	srv := fakeAPI(t, http.StatusOK, `{"status":"success","code":"lease_listed","correlation_id":"c1","leases":[],`+
		`"next_page_token":"\u001b]52;c;cm0gLXJmIH4K\u0007\u001b[2J\u001b[1;1Hall clear"}`)
	keyFile := writeKeyFile(t, review16Key, 0o600)
	r := runCLI(t, "list", "--server", srv.URL, "--api-key-file", keyFile, "--timeout", "2s",
		"--tenant", "acme", "--program", "recon", "--output", "table")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if strings.ContainsAny(r.stdout, "\x1b\x07") {
		t.Errorf("table output carries raw terminal control characters from the server: %q", r.stdout)
	}
}

// Found by review (low): the README says the key "appears in no output or error",
// but the CLI prints a server envelope's msg verbatim as the error's
// reason: a server (or anything answering in its place with a well-formed
// envelope, e.g. a debugging echo handler) that reflects the request's
// Authorization header puts the key on stderr, and so in CI logs. The CLI
// knows its key and could redact it from anything it prints.
func TestReview16EchoedKeyReachesStderr(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		msg := "cannot parse header Authorization: " + r.Header.Get("Authorization")
		w.Write([]byte(`{"status":"error","code":"invalid_lease_request","msg":"` + msg +
			`","field":"authorization","correlation_id":"c1","retryable":false}`))
	}))
	t.Cleanup(srv.Close)
	keyFile := writeKeyFile(t, review16Key, 0o600)
	r := runCLI(t, "inspect", "--server", srv.URL, "--api-key-file", keyFile, "--timeout", "2s",
		"--tenant", "acme", "--program", "recon", "--namespace", "web", "--target", "example.net", "--actor", "crawler")
	if strings.Contains(r.stdout+r.stderr, review16Key) {
		t.Errorf("the API key shows on stderr: %s", strings.ReplaceAll(r.stderr, review16Key, "<the API key>"))
	}
}

// Held up: key file checks (the CLI refuses each with field api_key_file and
// without the content in the error).
func TestReview16KeyFileChecksHold(t *testing.T) {
	dir := t.TempDir()
	group := writeKeyFile(t, review16Key, 0o640)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(group, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := exec.Command("mkfifo", "-m", "600", fifo).Run(); err != nil {
		t.Skip("mkfifo:", err)
	}
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, []byte(strings.Repeat(review16Key, 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	bom := filepath.Join(dir, "bom")
	if err := os.WriteFile(bom, []byte("\ufeff"+review16Key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	space := filepath.Join(dir, "space")
	if err := os.WriteFile(space, []byte(review16Key+" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"group": group, "symlink to group-readable": link, "fifo": fifo,
		"directory": dir, "huge": huge, "bom": bom, "trailing space": space, "/dev/zero": "/dev/zero"} {
		t.Run(name, func(t *testing.T) {
			done := make(chan result, 1)
			go func() {
				done <- runCLI(t, "inspect", "--server", "http://127.0.0.1:1", "--api-key-file", path, "--timeout", "1s",
					"--tenant", "acme", "--program", "recon", "--namespace", "web", "--target", "example.net", "--actor", "crawler")
			}()
			select {
			case r := <-done:
				if r.code != exitUsage || !strings.Contains(r.stderr, `"field":"api_key_file"`) {
					t.Errorf("exit %d: %s", r.code, r.stderr)
				}
				if strings.Contains(r.stderr, "0123456789abcdef") {
					t.Errorf("error shows key material: %s", r.stderr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the CLI hangs on this key file")
			}
		})
	}
}
