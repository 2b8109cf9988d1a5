package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// commitWithHeaders acquires a lease on s and returns a publication commit
// body under it, without headers.
func commitWithHeaders(t *testing.T, s *testServer, target string) map[string]any {
	t.Helper()
	id := map[string]string{}
	for k, v := range httpIdentity {
		id[k] = v
	}
	id["target_id"] = target
	rec, out := s.do(t, "POST", Base+"/acquire", acquireBodyFor(id, "req-"+target))
	if rec.Code != 200 {
		t.Fatalf("acquire: %d %v", rec.Code, out)
	}
	l := out["lease"].(map[string]any)
	return map[string]any{"lock_identity": id, "lease_id": l["lease_id"], "fencing_token": l["fencing_token"],
		"service_instance_id": "inst-1", "sink": "rabbitmq", "commit_id": "c-1", "execution_id": "exec-1", "job_id": "job-1",
		"outbox": map[string]any{"routing_key": "q", "body": base64.StdEncoding.EncodeToString([]byte("hello"))}}
}

// postRaw posts raw JSON and decodes the answer.
func (s *testServer) postRaw(t *testing.T, path string, raw []byte) (int, wire.Error, map[string]any) {
	t.Helper()
	req := httptest.NewRequest("POST", path, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	var e wire.Error
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("answer is not JSON: %q", rec.Body.String())
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &m)
	return rec.Code, e, m
}

// The outbox object's headers decode strictly: a JSON object of string
// values (null is not a string); the store's bounds answer with field
// outbox.headers.
func TestCommitOutboxHeadersDecoding(t *testing.T) {
	s := newTestServer(t)
	body := commitWithHeaders(t, s, "headers.example")
	raw, _ := json.Marshal(body)
	at := bytes.Index(raw, []byte(`"routing_key"`))
	withHeaders := func(headers string) []byte {
		return append(append(append([]byte{}, raw[:at]...), `"headers":`+headers+`,`...), raw[at:]...)
	}
	for name, tc := range map[string]struct{ headers, field string }{
		"number value":          {`{"a":1}`, "outbox.headers"},
		"null value":            {`{"a":null}`, "outbox.headers"},
		"object value":          {`{"a":{"b":"c"}}`, "outbox.headers"},
		"array value":           {`{"a":["b"]}`, "outbox.headers"},
		"bool value":            {`{"a":true}`, "outbox.headers"},
		"headers not an object": {`"a=b"`, "outbox.headers"},
		"headers an array":      {`[["a","b"]]`, "outbox.headers"},
		"reserved name":         {`{"x-starintel-fencing-token":"999"}`, "outbox.headers"},
		"reserved, mixed case":  {`{"X-StarIntel-Fencing-Token":"999"}`, "outbox.headers"},
		"control character":     {`{"a":"b\u0000"}`, "outbox.headers"},
		"duplicate name":        {`{"a":"1","a":"2"}`, "body"},
	} {
		code, e, _ := s.postRaw(t, Base+"/commits/authorize", withHeaders(tc.headers))
		if code != 400 || e.Code != string(lease.CodeInvalidRequest) || e.Field != tc.field {
			t.Errorf("%s: %d %+v", name, code, e)
		}
	}
	// null and {} are no headers: the same commit as none.
	for _, none := range []string{`null`, `{}`} {
		code, e, m := s.postRaw(t, Base+"/commits/authorize", withHeaders(none))
		if code != 200 {
			t.Fatalf("headers %s: %d %+v", none, code, e)
		}
		if none == "{}" && m["replayed"] != true {
			t.Fatalf("{} headers did not replay the null-headers commit: %v", m)
		}
	}
	code, e, _ := s.postRaw(t, Base+"/commits/authorize", withHeaders(`{"a":"b"}`))
	if code != 409 || e.Code != string(lease.CodeIdempotencyConflict) {
		t.Fatalf("other headers under one commit id: %d %+v", code, e)
	}
}

// A commit body with the largest publication and the largest headers fits
// MaxCommitBodyBytes even when the encoder escapes every header byte to
// six (encoding/json writes '<' as \u003c).
func TestCommitBodyLimitFitsMaximalHeaders(t *testing.T) {
	s := newTestServer(t)
	body := commitWithHeaders(t, s, "limit.example")
	headers := map[string]string{}
	for i := range lease.MaxOutboxHeadersBytes / lease.MaxOutboxHeaderValueBytes {
		name := fmt.Sprintf("%03d", i) + strings.Repeat("<", lease.MaxOutboxHeaderNameBytes-3)
		headers[name] = strings.Repeat("<", lease.MaxOutboxHeaderValueBytes-len(name))
	}
	pub := make([]byte, lease.MaxOutboxBody)
	for i := range pub {
		pub[i] = byte(i * 7)
	}
	body["outbox"] = map[string]any{"exchange": strings.Repeat("e", lease.MaxAMQPShortString),
		"routing_key": strings.Repeat("r", lease.MaxAMQPShortString), "content_type": strings.Repeat("<", 128),
		"body": base64.StdEncoding.EncodeToString(pub), "headers": headers}
	body["trace_id"] = strings.Repeat("t", lease.MaxIdentifierBytes)
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) <= 128<<10 || len(raw) > MaxCommitBodyBytes {
		t.Fatalf("test body is %d bytes: it should need more than the old 128 KiB and fit %d", len(raw), MaxCommitBodyBytes)
	}
	code, e, m := s.postRaw(t, Base+"/commits/authorize", raw)
	if code != 200 {
		t.Fatalf("maximal commit body of %d bytes: %d %+v", len(raw), code, e)
	}
	t.Logf("a maximal commit body, headers escaped six-fold, is %d of %d bytes (%v)", len(raw), MaxCommitBodyBytes, m["code"])
}
