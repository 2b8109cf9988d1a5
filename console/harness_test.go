package console_test

// The browser harness of the console tests: a starlease binary built once,
// Debian's chromium started headless with a temporary profile, one tab per
// test with every request, exception and Content-Security-Policy violation
// of its page recorded, and a screenshot of the page when the test fails.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/starintel/starlease/internal/testenv"
)

// ---- the starlease binary, built once per test binary ----------------------

var build struct {
	once sync.Once
	dir  string
	bin  string
	out  []byte
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// starleaseBinary builds cmd/starlease once for all the tests of the package.
func starleaseBinary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "starlease-console-bin")
		if build.err != nil {
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = "/usr/local/go/bin/go"
		}
		build.bin = filepath.Join(build.dir, "starlease")
		cmd := exec.Command(goTool, "build", "-o", build.bin, "github.com/starintel/starlease/cmd/starlease")
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("go build ./cmd/starlease: %v\n%s", build.err, build.out)
	}
	return build.bin
}

// ---- the browser -------------------------------------------------------------

// browser is one headless chromium for a test and its subtests.
type browser struct {
	ctx     context.Context // the browser's root context; tabs derive from it
	profile string          // its --user-data-dir, unique to it
	output  *testenv.Buffer // what chromium printed
}

// startBrowser starts chromium headless with a new profile directory and
// temp directory under t's temp dir. In t's cleanup the browser is closed, then every process
// still running with that profile (chromium's zygote, GPU and renderer
// children: they carry the flag) is killed, by pid, before the directory
// is removed.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	bin := testenv.FindChromium(t)
	dir := t.TempDir()
	b := &browser{profile: filepath.Join(dir, "profile"), output: &testenv.Buffer{}}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(b.profile),
		chromedp.Headless,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1024),
		chromedp.CombinedOutput(b.output),
		// Its temporary files (the singleton socket, shared memory) go
		// under the test's temp dir too, removed with it.
		chromedp.Env("TMPDIR=" + tmp),
		// Nothing of the browser's own (updates, sync, safe browsing,
		// metrics) goes anywhere while it runs.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-client-side-phishing-detection", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter"),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.Flag("use-mock-keychain", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-background-timer-throttling", true),
	}
	if os.Geteuid() == 0 {
		// Chromium refuses to start as root with its sandbox (CI runs as
		// root in a container); as any other user the sandbox stays on.
		opts = append(opts, chromedp.NoSandbox)
	} else {
		opts = append(opts, chromedp.Flag("no-sandbox", false))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		// Close the browser gracefully (it ends its own children), within
		// 10 s; then the allocator kills it if it still runs, and waits.
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		if err := chromedp.Cancel(cctx); err != nil {
			t.Logf("closing chromium: %v", err)
		}
		ccancel()
		cancel()
		cancelAlloc()
		killProfileProcesses(b.profile)
		if t.Failed() {
			t.Logf("chromium output (tail):\n%s", tail(b.output.String(), 4000))
		}
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser (its life is ctx's)
		t.Fatalf("chromium %s did not start: %v\n%s", bin, err, tail(b.output.String(), 4000))
	}
	b.ctx = ctx
	return b
}

// killProfileProcesses kills, by pid, the processes whose command line has
// --user-data-dir=dir: the chromium this test started and its children,
// none other (the directory is this test's own).
func killProfileProcesses(dir string) {
	want := []byte("--user-data-dir=" + dir)
	for pass := 0; pass < 3; pass++ {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		found := 0
		for _, e := range entries {
			var pid int
			if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
				continue
			}
			cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil {
				continue
			}
			for _, arg := range bytes.Split(cmdline, []byte{0}) {
				if bytes.Equal(arg, want) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					found++
					break
				}
			}
		}
		if found == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// ---- a tab -------------------------------------------------------------------

// request is one request the page made.
type request struct {
	Method, URL, Type string
}

// tab is one browser tab of a test, with what its page did.
type tab struct {
	t      *testing.T
	ctx    context.Context
	origin string // the server's origin, "http://127.0.0.1:port"

	mu         sync.Mutex
	requests   []request
	headers    []map[string]string // of each request, by index
	exceptions []string
	logErrors  []string
}

// cspRecorder runs before any script of every document of the tab: it keeps
// the page's Content-Security-Policy violations where the test reads them.
// (Injected by the debugger, it is not itself subject to the policy.)
const cspRecorder = `window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI);
});`

// newTab opens a tab of b for t, recording its page's requests,
// exceptions and log errors. When t fails, the cleanup saves a screenshot
// of the page first (see saveScreenshot), then closes the tab.
func newTab(t *testing.T, b *browser, origin string) *tab {
	t.Helper()
	tb := &tab{t: t, origin: origin}
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithListener(tb.listen))
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // opens the tab (its life is ctx's)
		t.Fatalf("open a tab: %v", err)
	}
	tb.ctx = ctx
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument,
		page.AddScriptToEvaluateOnNewDocumentParams{Source: cspRecorder}); err != nil {
		t.Fatalf("install the CSP violation recorder: %v", err)
	}
	// Registered after cancel, so it runs before it: the page is still there.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if path, err := saveScreenshot(tb.ctx, screenshotDir(), t.Name()); err != nil {
			t.Logf("screenshot of the failing page: not saved: %v", err)
		} else {
			t.Logf("screenshot of the failing page: %s", path)
		}
		text, _ := runWithTimeout(tb.ctx, 5*time.Second, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
		t.Logf("page text at failure:\n%s", tail(text, 3000))
		t.Logf("requests of the page:\n%s", tb.requestLog())
	})
	return tb
}

func (tb *tab) listen(ev any) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		if e.Request != nil {
			tb.requests = append(tb.requests, request{Method: e.Request.Method, URL: e.Request.URL, Type: string(e.Type)})
			h := map[string]string{}
			for k, v := range e.Request.Headers {
				h[http.CanonicalHeaderKey(k)] = fmt.Sprint(v)
			}
			tb.headers = append(tb.headers, h)
		}
	case *runtime.EventExceptionThrown:
		if e.ExceptionDetails != nil {
			msg := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil && e.ExceptionDetails.Exception.Description != "" {
				msg += ": " + e.ExceptionDetails.Exception.Description
			}
			tb.exceptions = append(tb.exceptions, msg)
		}
	case *cdplog.EventEntryAdded:
		// Refused loads and policy violations; a failed API answer (a
		// 401, a 403) is logged as a network error, which is expected.
		if e.Entry != nil && e.Entry.Level == cdplog.EntryLevelError && e.Entry.Source != cdplog.EntrySourceNetwork {
			tb.logErrors = append(tb.logErrors, string(e.Entry.Source)+": "+e.Entry.Text)
		}
	}
}

func (tb *tab) requestsSoFar() []request {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]request(nil), tb.requests...)
}

func (tb *tab) requestLog() string {
	var s strings.Builder
	for _, r := range tb.requestsSoFar() {
		fmt.Fprintf(&s, "  %s %s (%s)\n", r.Method, r.URL, r.Type)
	}
	return s.String()
}

// sameOrigin reports whether raw is a URL of origin (scheme, host and
// port all equal).
func sameOrigin(raw, origin string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	o, err := url.Parse(origin)
	if err != nil {
		return false
	}
	return u.Scheme == o.Scheme && u.Host == o.Host && u.User == nil
}

// checkPage fails the test if the page made any request outside its own
// origin, or none to the API, threw an exception, logged a refused load
// or violated its Content-Security-Policy.
func (tb *tab) checkPage() {
	tb.t.Helper()
	reqs := tb.requestsSoFar()
	api := 0
	for _, r := range reqs {
		if !sameOrigin(r.URL, tb.origin) {
			tb.t.Errorf("the page requested %s %s (%s), outside its origin %s", r.Method, r.URL, r.Type, tb.origin)
		}
		if strings.HasPrefix(r.URL, tb.origin+"/api/") {
			api++
		}
	}
	if len(reqs) == 0 || api == 0 {
		tb.t.Errorf("recorded %d requests, %d to the API: the recorder saw nothing", len(reqs), api)
	}
	tb.mu.Lock()
	exceptions, logErrors := append([]string(nil), tb.exceptions...), append([]string(nil), tb.logErrors...)
	tb.mu.Unlock()
	for _, e := range exceptions {
		tb.t.Errorf("the page threw: %s", e)
	}
	for _, e := range logErrors {
		tb.t.Errorf("the page logged an error: %s", e)
	}
	violations := evalT[[]string](tb, `window.__cspViolations || []`)
	for _, v := range violations {
		tb.t.Errorf("Content-Security-Policy violation: %s", v)
	}
}

// ---- actions ---------------------------------------------------------------

const actionTimeout = 30 * time.Second

func runWithTimeout[T any](ctx context.Context, d time.Duration, a chromedp.Action[T]) (T, error) {
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return chromedp.Run(c, a)
}

// do runs steps in the tab, failing the test with what at the first error.
func (tb *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	c, cancel := context.WithTimeout(tb.ctx, actionTimeout)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		tb.t.Fatalf("%s: %v", what, err)
	}
}

// evalT evaluates expr in the page and decodes its value.
func evalT[T any](tb *tab, expr string) T {
	tb.t.Helper()
	v, err := runWithTimeout(tb.ctx, actionTimeout, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// apiAction runs steps that make the page call the API, and waits until
// it has made at least one call more and has none in flight: <main> is
// aria-busy from a call's start until the page has rendered the last
// answer of the chain of calls the action started.
func (tb *tab) apiAction(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	before := tb.apiRequests()
	tb.do(what, steps...)
	for deadline := time.Now().Add(20 * time.Second); tb.apiRequests() == before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.t.Fatalf("%s: the page made no API request", what)
		}
	}
	tb.waitIdle()
}

func (tb *tab) apiRequests() int {
	n := 0
	for _, r := range tb.requestsSoFar() {
		if strings.HasPrefix(r.URL, tb.origin+"/api/") {
			n++
		}
	}
	return n
}

// waitIdle waits until the page has no API request in flight.
func (tb *tab) waitIdle() {
	tb.t.Helper()
	tb.waitFor("no request in flight", `document.querySelector('main').getAttribute('aria-busy') === 'false'`)
}

// waitFor waits until the JavaScript expression expr is truthy.
func (tb *tab) waitFor(what, expr string) {
	tb.t.Helper()
	_, err := runWithTimeout(tb.ctx, actionTimeout, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		tb.t.Fatalf("waiting for %s (%s): %v", what, expr, err)
	}
}

// text is the textContent of the first element sel selects ("" if none).
func (tb *tab) text(sel string) string {
	tb.t.Helper()
	return evalT[string](tb, fmt.Sprintf(`(function(){ const e = document.querySelector(%s); return e ? e.textContent : ''; })()`, jsString(sel)))
}

// visible reports whether the element with id is rendered (not hidden).
func (tb *tab) visible(id string) bool {
	tb.t.Helper()
	return evalT[bool](tb, fmt.Sprintf(`(function(){ const e = document.getElementById(%s); return !!e && e.getClientRects().length > 0; })()`, jsString(id)))
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// open loads the console.
func (tb *tab) open() {
	tb.t.Helper()
	tb.do("open the console", chromedp.Navigate(tb.origin+"/console/"), chromedp.WaitVisible(chromedp.ID("key")))
	tb.waitFor("the readiness report", `document.getElementById('ready-status').textContent !== 'unknown'`)
}

// signIn types key and presses Enter, and waits for the session.
func (tb *tab) signIn(key string) {
	tb.t.Helper()
	tb.apiAction("sign in", chromedp.SendKeys(chromedp.ID("key"), key+"\r"))
	tb.do("sign in", chromedp.WaitVisible(chromedp.ID("leases")))
}

// list lists by program (tenant, program) with the page size.
func (tb *tab) listProgram(tenant, program string, pageSize int) {
	tb.t.Helper()
	tb.apiAction("list by program",
		chromedp.Click(chromedp.ID("by-program")),
		chromedp.SetValue(chromedp.ID("f-tenant"), tenant),
		chromedp.SetValue(chromedp.ID("f-program"), program),
		chromedp.SetValue(chromedp.ID("f-page-size"), fmt.Sprint(pageSize)),
		chromedp.Click(chromedp.ID("list-button")))
	tb.waitListed()
}

func (tb *tab) listOwner(owner string) {
	tb.t.Helper()
	tb.apiAction("list by owner",
		chromedp.Click(chromedp.ID("by-owner")),
		chromedp.SetValue(chromedp.ID("f-owner"), owner),
		chromedp.Click(chromedp.ID("list-button")))
	tb.waitListed()
}

// waitListed checks that the list answer is shown: a status or an error.
func (tb *tab) waitListed() {
	tb.t.Helper()
	tb.waitFor("the list answer", `(function(){
	  const s = document.getElementById('list-status').textContent;
	  return (s !== '' && s !== 'Loading…') || document.querySelector('#messages .envelope') !== null; })()`)
}

// leaseIDs are the lease ids of the rows shown.
func (tb *tab) leaseIDs() []string {
	tb.t.Helper()
	return evalT[[]string](tb, `Array.from(document.querySelectorAll('#lease-rows tr'), r => r.dataset.leaseId)`)
}

// envelope is the error the page shows in container (#messages or
// #admin-messages): HTTP status, code, message and correlation id.
type shownError struct {
	Status, Code, Msg, Correlation string
	Count                          int
}

func (tb *tab) shownError(container string) shownError {
	tb.t.Helper()
	return evalT[shownError](tb, fmt.Sprintf(`(function(){
	  const c = document.querySelector(%s);
	  const get = (cls) => { const e = c.querySelector('.' + cls); return e ? e.textContent : ''; };
	  return {Status: get('envelope-status'), Code: get('envelope-code'), Msg: get('envelope-msg'),
	          Correlation: get('envelope-correlation'), Count: c.querySelectorAll('.envelope').length};
	})()`, jsString(container)))
}

// ---- screenshots -------------------------------------------------------------

// screenshotDir is where failing tests leave their screenshots:
// $STARLEASE_SCREENSHOT_DIR, else starlease-console-screenshots in the
// system's temp directory. It outlives the test run.
func screenshotDir() string {
	if d := os.Getenv("STARLEASE_SCREENSHOT_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "starlease-console-screenshots")
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// saveScreenshot writes a PNG of the whole page of ctx's tab to dir, named
// after the test, and returns its path.
func saveScreenshot(ctx context.Context, dir, testName string) (string, error) {
	buf, err := runWithTimeout(ctx, 10*time.Second, chromedp.FullScreenshot(100))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := unsafeName.ReplaceAllString(testName, "_") + "-" + time.Now().UTC().Format("20060102T150405") + ".png"
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, buf, 0o644)
}

// ---- the API, as a client outside the browser --------------------------------

// apiCall makes one API request with key and decodes the JSON answer.
func apiCall(t *testing.T, base, key, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: answer does not decode: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// acquire acquires a lease on target (namespace "host") in tenant/program
// with key, for five minutes, and returns its lease id.
func acquire(t *testing.T, base, key, tenant, program, target string) string {
	t.Helper()
	id := map[string]string{"tenant_id": tenant, "program_id": program, "target_namespace": "host",
		"target_id": target, "actor_name": "scanner", "workflow_name": "default", "operation_class": "default"}
	status, out := apiCall(t, base, key, "POST", "/api/v1/target-leases/acquire", map[string]any{
		"lock_identity": id, "ttl_ms": 300000, "service_instance_id": "inst-1", "execution_id": "exec-" + target,
		"job_id": "job-" + target, "request_id": "acq-" + program + "-" + target})
	if status != 200 || out["code"] != "lease_acquired" {
		t.Fatalf("acquire %s/%s/%s: %d %v", tenant, program, target, status, out)
	}
	return out["lease"].(map[string]any)["lease_id"].(string)
}

// auditEvents are the events of the server's audit.jsonl.
func auditEvents(t *testing.T, dataDir string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var ev map[string]any
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("audit.jsonl line does not decode: %v", err)
		}
		out = append(out, ev)
	}
	return out
}
