// Package console is the operator page that starlease serve serves at
// /console/: one HTML page, one JavaScript module and one style sheet,
// embedded in the binary (no build step, nothing fetched from elsewhere at
// run time).
//
// The page is a client of the HTTP API like any other: the operator types
// an API key, which the page keeps in a JavaScript variable only (never in
// the address, a cookie or web storage) and sends as Authorization: Bearer
// with each call to the API of the origin it was loaded from. It adds no
// route and no authority: every call is authenticated, authorized, scoped
// and audited as the same call from any client. The server side here only
// serves the static files, with a strict Content-Security-Policy (no inline
// script or style, no connection but to the page's own origin), framing
// denied, no referrer and no caching.
package console

import (
	"embed"
	"net/http"
	"strconv"
)

// Path is where the console is served.
const Path = "/console/"

// ContentSecurityPolicy is sent with every console file. Only the page's
// own files run or style it, it connects only to its own origin, it cannot
// be framed, and its forms cannot submit anywhere (the page handles them in
// script).
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

//go:embed assets/index.html assets/console.js assets/console.css assets/favicon.svg
var assets embed.FS

type file struct {
	contentType string
	body        []byte
}

// files maps each served path, exactly, to its file.
var files = func() map[string]file {
	load := func(name, contentType string) file {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			panic("console: embedded asset missing: " + name)
		}
		return file{contentType: contentType, body: b}
	}
	return map[string]file{
		Path:                 load("index.html", "text/html; charset=utf-8"),
		Path + "console.js":  load("console.js", "text/javascript; charset=utf-8"),
		Path + "console.css": load("console.css", "text/css; charset=utf-8"),
		Path + "favicon.svg": load("favicon.svg", "image/svg+xml"),
	}
}()

// Mount returns a handler that serves the console's files (GET and HEAD
// of their exact paths) and redirects /console to /console/, and passes
// every other request, unchanged, to api.
func Mount(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			api.ServeHTTP(w, r)
			return
		}
		// The escaped path, exactly: an encoded or unclean spelling of a
		// console path is the API's (its unknown-route 404).
		p := r.URL.EscapedPath()
		if p == "/console" && r.URL.RawQuery == "" {
			setHeaders(w.Header())
			// Relative, so it holds behind a proxy that adds a prefix.
			w.Header().Set("Location", "console/")
			w.WriteHeader(http.StatusMovedPermanently)
			return
		}
		f, ok := files[p]
		if !ok {
			api.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		setHeaders(h)
		h.Set("Content-Type", f.contentType)
		h.Set("Content-Length", strconv.Itoa(len(f.body)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			w.Write(f.body)
		}
	})
}

// setHeaders sets the security headers of every console answer.
func setHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	// The page is tiny: nothing is cached, so no old copy outlives an
	// upgrade and the browser keeps no page that held a key.
	h.Set("Cache-Control", "no-store")
}
