package console_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/starintel/starlease/console"
	"github.com/starintel/starlease/internal/testenv"
)

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// TestServeConsoleOverHTTP checks, with plain HTTP against a real
// "starlease serve", that the console is mounted at /console/ with its
// security headers, and that the API around it is unchanged.
func TestServeConsoleOverHTTP(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBinary(t))
	base := srv.URL()

	if want := "operator console: " + base + "/console/\n"; !strings.Contains(string(srv.Stdout()), want) {
		t.Errorf("serve does not print %q:\n%s", want, srv.Stdout())
	}

	for path, ctype := range map[string]string{
		"/console/":            "text/html; charset=utf-8",
		"/console/console.js":  "text/javascript; charset=utf-8",
		"/console/console.css": "text/css; charset=utf-8",
		"/console/favicon.svg": "image/svg+xml",
	} {
		for _, method := range []string{"GET", "HEAD"} {
			req, _ := http.NewRequest(method, base+path, nil)
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ctype {
				t.Errorf("%s %s: %d %q", method, path, resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if (method == "GET") != (len(body) > 0) {
				t.Errorf("%s %s: %d bytes of body", method, path, len(body))
			}
			for k, want := range map[string]string{
				"Content-Security-Policy": console.ContentSecurityPolicy,
				"X-Frame-Options":         "DENY",
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
				"Cache-Control":           "no-store",
			} {
				if got := resp.Header.Values(k); len(got) != 1 || got[0] != want {
					t.Errorf("%s %s: %s = %q, want %q", method, path, k, got, want)
				}
			}
			if resp.Header.Get("Set-Cookie") != "" {
				t.Errorf("%s %s sets a cookie", method, path)
			}
			if path == "/console/" && method == "GET" && !strings.Contains(string(body), `<script type="module" src="console.js"></script>`) {
				t.Errorf("GET /console/ is not the console page")
			}
		}
	}
	if !strings.Contains(console.ContentSecurityPolicy, "script-src 'self';") ||
		strings.Contains(console.ContentSecurityPolicy, "unsafe") {
		t.Errorf("the policy is %q", console.ContentSecurityPolicy)
	}

	resp, err := noRedirect.Get(base + "/console")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "console/" {
		t.Errorf("GET /console: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	// Other paths under /console/ and other methods are the API's unknown
	// route, in its envelope; the API and health answer as before.
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/console/missing.js", 404, "lease_not_found"},
		{"GET", "/console/%63onsole.js", 404, "lease_not_found"},
		{"POST", "/console/", 404, "lease_not_found"},
		{"GET", "/api/v1/target-leases", 401, "invalid_credential"},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, nil)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			Status        string `json:"status"`
			Code          string `json:"code"`
			CorrelationID string `json:"correlation_id"`
		}
		err = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || env.Status != "error" || env.Code != c.code || env.CorrelationID == "" {
			t.Errorf("%s %s: %d %+v (%v), want %d %s", c.method, c.path, resp.StatusCode, env, err, c.status, c.code)
		}
		if resp.Header.Get("Content-Security-Policy") != "" {
			t.Errorf("%s %s: carries the console's headers", c.method, c.path)
		}
	}
	for _, path := range []string{"/readyz", "/healthz", "/api/v1/openapi.json"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
}
