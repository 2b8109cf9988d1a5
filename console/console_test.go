package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// api stands in for the API handler: it answers 418 with the path it got.
var api = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Api", "yes")
	w.WriteHeader(http.StatusTeapot)
	io.WriteString(w, r.Method+" "+r.URL.EscapedPath())
})

func serve(method, target string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	Mount(api).ServeHTTP(w, httptest.NewRequest(method, target, nil))
	return w
}

// securityHeaders are the headers every console answer carries.
var securityHeaders = map[string]string{
	"Content-Security-Policy":      "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Frame-Options":              "DENY",
	"X-Content-Type-Options":       "nosniff",
	"Referrer-Policy":              "no-referrer",
	"Cache-Control":                "no-store",
	"Cross-Origin-Opener-Policy":   "same-origin",
	"Cross-Origin-Resource-Policy": "same-origin",
}

func checkSecurityHeaders(t *testing.T, what string, h http.Header) {
	t.Helper()
	for k, want := range securityHeaders {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %s = %q, want %q", what, k, got, want)
		}
	}
}

func TestMountServesAssetsWithHeaders(t *testing.T) {
	for path, ctype := range map[string]string{
		"/console/":            "text/html; charset=utf-8",
		"/console/console.js":  "text/javascript; charset=utf-8",
		"/console/console.css": "text/css; charset=utf-8",
		"/console/favicon.svg": "image/svg+xml",
	} {
		w := serve("GET", path)
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != ctype || w.Body.Len() == 0 {
			t.Errorf("GET %s: %d %q, %d bytes", path, w.Code, w.Header().Get("Content-Type"), w.Body.Len())
		}
		if want := string(files[path].body); w.Body.String() != want {
			t.Errorf("GET %s: body is not the embedded file", path)
		}
		checkSecurityHeaders(t, "GET "+path, w.Header())
		h := serve("HEAD", path)
		if h.Code != http.StatusOK || h.Body.Len() != 0 || h.Header().Get("Content-Length") != w.Header().Get("Content-Length") {
			t.Errorf("HEAD %s: %d, %d bytes, Content-Length %q", path, h.Code, h.Body.Len(), h.Header().Get("Content-Length"))
		}
		checkSecurityHeaders(t, "HEAD "+path, h.Header())
	}
}

func TestMountRedirectsBarePath(t *testing.T) {
	w := serve("GET", "/console")
	if w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "console/" {
		t.Errorf("GET /console: %d Location %q", w.Code, w.Header().Get("Location"))
	}
	checkSecurityHeaders(t, "GET /console", w.Header())
}

// Everything but GET and HEAD of the exact console paths is the API's.
func TestMountPassesEverythingElseToTheAPI(t *testing.T) {
	for _, c := range []struct{ method, target string }{
		{"POST", "/console/"},
		{"PUT", "/console/console.js"},
		{"DELETE", "/console"},
		{"GET", "/console/missing.js"},
		{"GET", "/console/assets/console.js"},
		{"GET", "/console/%63onsole.js"},
		{"GET", "/console//"},
		{"GET", "/console/../readyz"},
		{"GET", "/console?x=1"},
		{"GET", "/consoles/"},
		{"GET", "/api/v1/target-leases"},
		{"GET", "/readyz"},
	} {
		w := serve(c.method, c.target)
		if w.Code != http.StatusTeapot || w.Header().Get("X-Api") != "yes" {
			t.Errorf("%s %s: %d, not passed to the API", c.method, c.target, w.Code)
		}
		if w.Header().Get("Content-Security-Policy") != "" {
			t.Errorf("%s %s: console headers on an API answer", c.method, c.target)
		}
	}
}

func asset(t *testing.T, name string) string {
	t.Helper()
	b, err := assets.ReadFile("assets/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The page holds no inline script or style, no handler attribute and no
// address of another origin: the policy would refuse them, and they must
// not be needed.
func TestPageHasNoInlineCodeOrOtherOrigin(t *testing.T) {
	html := asset(t, "index.html")
	scripts := regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`).FindAllStringSubmatch(html, -1)
	if len(scripts) != 1 {
		t.Fatalf("%d script elements, want the one module", len(scripts))
	}
	if strings.TrimSpace(scripts[0][2]) != "" || !strings.Contains(scripts[0][1], `type="module"`) ||
		!strings.Contains(scripts[0][1], `src="console.js"`) {
		t.Errorf("the script element is %q", scripts[0][0])
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<style\b`),
		regexp.MustCompile(`(?i)\sstyle\s*=`),
		regexp.MustCompile(`(?i)\son[a-z]+\s*=`),
		regexp.MustCompile(`(?i)javascript:`),
		regexp.MustCompile(`(?i)(src|href|action)\s*=\s*"(https?:|//|data:)`),
		regexp.MustCompile(`(?i)https?://`),
	} {
		if m := bad.FindString(html); m != "" {
			t.Errorf("index.html holds %q", m)
		}
	}
	css := asset(t, "console.css")
	for _, bad := range []string{"@import", "url(", "http:", "https:", "@font-face"} {
		if strings.Contains(css, bad) {
			t.Errorf("console.css holds %q", bad)
		}
	}
}

// The script renders with textContent, keeps the key out of every store,
// and calls only relative addresses of its own origin.
func TestScriptRules(t *testing.T) {
	js := asset(t, "console.js")
	for _, bad := range []string{
		"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
		"localStorage", "sessionStorage", "indexedDB", "document.cookie", "caches.", "history.pushState",
		"history.replaceState", "location.hash", "location.search", "://", "import(", "XMLHttpRequest",
		"sendBeacon", "WebSocket", "postMessage", "console.log",
	} {
		if strings.Contains(js, bad) {
			t.Errorf("console.js uses %q", bad)
		}
	}
	if n := strings.Count(js, "fetch("); n != 1 {
		t.Errorf("console.js calls fetch in %d places, want the one in call()", n)
	}
	for _, want := range []string{"mode: 'same-origin'", "credentials: 'omit'", "redirect: 'error'", "'Authorization', 'Bearer ' + apiKey"} {
		if !strings.Contains(js, want) {
			t.Errorf("console.js lacks %q", want)
		}
	}
}

// Every control has a label, and the key field has no name (a form
// submitted without the script sends nothing) and no autocomplete.
func TestEveryControlIsLabelled(t *testing.T) {
	html := asset(t, "index.html")
	labels := map[string]bool{}
	for _, m := range regexp.MustCompile(`<label for="([^"]+)"`).FindAllStringSubmatch(html, -1) {
		labels[m[1]] = true
	}
	controls := regexp.MustCompile(`<(input|select|textarea)\b[^>]*>`).FindAllString(html, -1)
	if len(controls) < 10 {
		t.Fatalf("found %d controls", len(controls))
	}
	id := regexp.MustCompile(`\bid="([^"]+)"`)
	for _, c := range controls {
		m := id.FindStringSubmatch(c)
		if m == nil || !labels[m[1]] {
			t.Errorf("control without a label: %s", c)
		}
	}
	for _, b := range regexp.MustCompile(`(?s)<button\b[^>]*>(.*?)</button>`).FindAllStringSubmatch(html, -1) {
		if strings.TrimSpace(b[1]) == "" {
			t.Errorf("button without text: %s", b[0])
		}
	}
	key := regexp.MustCompile(`<input id="key"[^>]*>`).FindString(html)
	if key == "" || strings.Contains(key, "name=") || !strings.Contains(key, `type="password"`) || !strings.Contains(key, `autocomplete="off"`) {
		t.Errorf("the key field is %q", key)
	}
}
