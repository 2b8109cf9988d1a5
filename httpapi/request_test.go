package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/starintel/starlease/wire"
)

// A Content-Length net/http did not parse never reaches a route: over
// HTTP/1 net/http refuses it itself (TestRawRequestsGetTheEnvelope), but
// a handler called otherwise (HTTP/2 leaves the header and reads 0, a
// request built in-process) answers the envelope.
func TestInvalidContentLengthReachingTheHandler(t *testing.T) {
	s := newTestServer(t)
	body := `{"lock_identity":{"tenant_id":"t","program_id":"p","target_namespace":"n","target_id":"x","actor_name":"a"}}`
	n := strconv.Itoa(len(body))
	for name, set := range map[string]struct {
		length int64
		header []string
	}{
		"negative length":          {-5, nil},
		"negative header":          {0, []string{"-5"}},
		"header not a number":      {0, []string{"5x"}},
		"header with a sign":       {int64(len(body)), []string{"+" + n}},
		"two headers":              {int64(len(body)), []string{n, n}},
		"header and length differ": {int64(len(body)), []string{"3"}},
	} {
		req := httptest.NewRequest("POST", Base+"/inspect", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = set.length
		for _, v := range set.header {
			req.Header.Add("Content-Length", v)
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var out wire.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 400 || out.Code != "invalid_lease_request" ||
			out.Field != "Content-Length" || out.CorrelationID == "" || rec.Header().Get("X-Correlation-ID") != out.CorrelationID {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body)
		}
	}
	// The same request with a valid length (or none, as HTTP/1 chunked
	// leaves it) is served.
	for _, header := range [][]string{{n}, nil} {
		req := httptest.NewRequest("POST", Base+"/inspect", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Content-Type", "application/json")
		for _, v := range header {
			req.Header.Add("Content-Length", v)
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 404 {
			t.Errorf("Content-Length %v: %d %s, want the inspect's 404", header, rec.Code, rec.Body)
		}
	}
}
