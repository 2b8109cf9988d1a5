package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
)

// The OpenAPI document and the real routes agree: every route is
// documented with its method, and every documented operation is served
// (a request reaches a handler: it is not the catch-all's route 404 and
// not a 405).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	s := &Server{}
	served := map[string]bool{}
	for _, rt := range s.routes() {
		key := strings.Replace(rt.pattern, "/{$}", "", 1)
		served[key] = true
		if !documented[key] {
			t.Errorf("route %q is not in the OpenAPI document", rt.pattern)
		}
	}
	for _, fixed := range []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /api/v1/openapi.json"} {
		served[fixed] = true
	}
	var missing []string
	for op := range documented {
		if !served[op] {
			missing = append(missing, op)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("documented but not served: %v", missing)
	}
	// Each documented lease operation reaches a handler on a real mux: an
	// unauthenticated request gets the 401 envelope, never 404 or 405.
	srv := newTestServer(t)
	for op := range documented {
		method, path, _ := strings.Cut(op, " ")
		if !strings.HasPrefix(path, Base) {
			continue
		}
		path = strings.ReplaceAll(path, "{lease_id}", "lease_01TEST")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader("{}")))
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s %s: status %d, want 401 from the lease handler", method, path, rec.Code)
		}
	}
}
