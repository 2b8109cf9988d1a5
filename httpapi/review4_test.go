package httpapi

// Review 4 (HTTP perf branch) attacks on the strict decoder's fast path
// (canonicalJSON, a60f559): a body that is exactly json.Marshal of what it
// decoded to skips lease.DecodeStrict. Each test compares decodeBody with
// the full strict path it replaced, on bodies built to be canonical yet
// ambiguous, or to mean something else.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// review4Full is decodeBodyLimit as it was before the fast path: decode,
// then always lease.DecodeStrict.
func review4Full(b []byte, v any) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing")
	}
	return lease.DecodeStrict(b, v)
}

func review4Decode(b []byte, v any) error {
	r := httptest.NewRequest("POST", Base+"/acquire", bytes.NewReader(b))
	r.Header.Set("Content-Type", "application/json")
	return decodeBodyLimit(r, v, 1<<20)
}

// review4Compare checks decodeBody against the full strict path on body for
// a fresh value of v's type: same verdict, same decoded value.
func review4Compare(t *testing.T, name string, body []byte, proto any) (accepted bool) {
	t.Helper()
	typ := reflect.TypeOf(proto)
	got := reflect.New(typ).Interface()
	want := reflect.New(typ).Interface()
	gerr := review4Decode(body, got)
	werr := review4Full(body, want)
	if (gerr == nil) != (werr == nil) {
		t.Errorf("%s %T %q: decodeBody %v, full strict path %v", name, proto, body, gerr, werr)
		return gerr == nil
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Errorf("%s %T %q: decodeBody gave %+v, full strict path %+v", name, proto, body, got, want)
	}
	return gerr == nil
}

var review4ID = lease.Identity{TenantID: "t", ProgramID: "p", TargetNamespace: "n", TargetID: "x", ActorName: "a",
	WorkflowName: "w", OperationClass: "o"}

// review4Bodies is one filled value of every request body type.
func review4Bodies() []any {
	id := review4ID
	return []any{
		wire.AcquireRequest{LockIdentity: &id, TTLMs: 30000, MaximumLifetimeMs: 60000, ServiceInstanceID: "i",
			ExecutionID: "e", JobID: "j", TraceID: "tr", RequestID: "r", DeadlineAt: "2026-01-01T00:00:00Z", WaitMs: 5},
		wire.RenewRequest{LockIdentity: &id, FencingToken: 7, ServiceInstanceID: "i", TTLMs: 1000, RequestID: "r",
			DeadlineAt: "2026-01-01T00:00:00Z"},
		wire.ReleaseRequest{LockIdentity: &id, FencingToken: 7, ServiceInstanceID: "i", RequestID: "r",
			DeadlineAt: "2026-01-01T00:00:00Z"},
		wire.AdminRequest{LockIdentity: &id, FencingToken: 7, Reason: "why", IncidentID: "inc", RequestID: "r",
			DeadlineAt: "2026-01-01T00:00:00Z"},
		wire.InspectRequest{LockIdentity: &id},
		wire.CommitRequest{LockIdentity: &id, LeaseID: "l", FencingToken: 7, ServiceInstanceID: "i", Sink: "s",
			CommitID: "c", ExecutionID: "e", JobID: "j", TraceID: "tr", Target: "x", PayloadSHA256: strings.Repeat("a", 64),
			Outbox: &wire.Outbox{Exchange: "ex", RoutingKey: "rk", ContentType: "text/plain", Body: "aGk="}},
	}
}

// review4Mutations returns bodies derived from the canonical body s: each
// key spelled another way (case variant, Unicode fold, escaped), each key
// duplicated (first or last wins), unknown members, nulls, numbers written
// another way, escapes, whitespace and trailing data.
func review4Mutations(s string) map[string]string {
	out := map[string]string{"canonical": s, "canonical+nl": s + "\n", "canonical+2nl": s + "\n\n",
		"canonical+crlf": s + "\r\n", "bom": "\ufeff" + s, "trailing {}": s + "{}", "trailing null": s + "null",
		"null": "null", "empty object": "{}", "array": "[" + s + "]"}
	var tree map[string]any
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	dec.Decode(&tree)
	var keys []string
	var walk func(m map[string]any)
	walk = func(m map[string]any) {
		for k, v := range m {
			keys = append(keys, k)
			if mm, ok := v.(map[string]any); ok {
				walk(mm)
			}
		}
	}
	walk(tree)
	for _, k := range keys {
		q := `"` + k + `":`
		i := strings.Index(s, q)
		if i < 0 {
			continue
		}
		// The member's value: up to the next top-level ',' or '}'.
		rest := s[i+len(q):]
		var raw json.RawMessage
		d := json.NewDecoder(strings.NewReader(rest))
		if d.Decode(&raw) != nil {
			continue
		}
		val := string(raw)
		member := q + val
		up := strings.ToUpper(k[:1]) + k[1:]
		out["case "+k] = strings.Replace(s, q, `"`+up+`":`, 1)
		out["upper "+k] = strings.Replace(s, q, `"`+strings.ToUpper(k)+`":`, 1)
		if strings.Contains(k, "s") {
			out["long-s "+k] = strings.Replace(s, q, `"`+strings.Replace(k, "s", "ſ", 1)+`":`, 1)
		}
		if strings.Contains(k, "k") {
			out["kelvin "+k] = strings.Replace(s, q, `"`+strings.Replace(k, "k", "\u212a", 1)+`":`, 1)
		}
		out["escaped key "+k] = strings.Replace(s, q, `"\u00`+fmt.Sprintf("%02x", k[0])+k[1:]+`":`, 1)
		out["dup same "+k] = strings.Replace(s, member, member+","+member, 1)
		out["dup null first "+k] = strings.Replace(s, member, q+"null,"+member, 1)
		out["dup null last "+k] = strings.Replace(s, member, member+","+q+"null", 1)
		out["dup case "+k] = strings.Replace(s, member, member+`,"`+up+`":`+val, 1)
		out["null "+k] = strings.Replace(s, member, q+"null", 1)
		out["unknown after "+k] = strings.Replace(s, member, member+`,"`+k+`_x":1`, 1)
		if val[0] == '"' {
			out["escaped value "+k] = strings.Replace(s, member, q+`"\u00`+fmt.Sprintf("%02x", val[1])+val[2:], 1)
			out["html value "+k] = strings.Replace(s, member, q+`"\u003c`+val[1:], 1)
			out["raw lt value "+k] = strings.Replace(s, member, q+`"<`+val[1:], 1)
			out["u2028 value "+k] = strings.Replace(s, member, q+`"\u2028`+val[1:], 1)
			out["lone surrogate "+k] = strings.Replace(s, member, q+`"\ud800`+val[1:], 1)
			out["fffd value "+k] = strings.Replace(s, member, q+"\"\ufffd"+val[1:], 1)
		} else if val[0] >= '0' && val[0] <= '9' {
			out["float "+k] = strings.Replace(s, member, q+val+".0", 1)
			out["exp "+k] = strings.Replace(s, member, q+val+"e0", 1)
			out["neg zero "+k] = strings.Replace(s, member, q+"-0", 1)
			out["big "+k] = strings.Replace(s, member, q+"18446744073709551616", 1)
			out["string num "+k] = strings.Replace(s, member, q+`"`+val+`"`, 1)
		}
	}
	return out
}

// HELD. On every request body type and every mutation above, the fast path
// decides and decodes exactly as the full strict path: a body that is its
// own re-encoding cannot hold a duplicate, case-variant, folded or escaped
// key, and whatever else the fast path accepts means what it meant.
func TestReview4FastPathMatchesFullStrict(t *testing.T) {
	for _, proto := range review4Bodies() {
		b, err := json.Marshal(proto)
		if err != nil {
			t.Fatal(err)
		}
		ms := review4Mutations(string(b))
		for name, body := range ms {
			review4Compare(t, name, []byte(body), proto)
		}
		// The canonical body is accepted (and through the fast path).
		v := reflect.New(reflect.TypeOf(proto)).Interface()
		if err := review4Decode(b, v); err != nil || !lease.IsOwnEncoding(b, v) {
			t.Errorf("%T: the canonical body is refused (%v) or not canonical", proto, err)
		}
		// Every duplicate- or case-variant-key mutation is refused.
		for name, body := range ms {
			if strings.HasPrefix(name, "dup ") || strings.HasPrefix(name, "case ") || strings.HasPrefix(name, "upper ") ||
				strings.HasPrefix(name, "long-s ") || strings.HasPrefix(name, "kelvin ") {
				v := reflect.New(reflect.TypeOf(proto)).Interface()
				if review4Decode([]byte(body), v) == nil {
					t.Errorf("%T %s: accepted %q", proto, name, body)
				}
			}
		}
	}
}

// HELD. Raw members (acquire metadata, publication headers) in an otherwise
// canonical body: duplicate keys inside them, a raw member that is JSON
// null, an empty headers object, a header whose value is itself an object
// with duplicate keys — each decides as the full strict path does, and
// duplicates are refused.
func TestReview4RawMembersTakeFullPath(t *testing.T) {
	id := review4ID
	for meta, ok := range map[string]bool{
		`{"k":1,"k":2}`: false, `{"k":{"a":1,"a":2}}`: false, `{"k":[{"a":1,"a":2}]}`: false,
		`{"K":1,"k":2}`: true, `null`: true, `{}`: true, `{"a":"\u003c"}`: true,
	} {
		b, _ := json.Marshal(wire.AcquireRequest{LockIdentity: &id, TTLMs: 1000, ServiceInstanceID: "i", ExecutionID: "e",
			JobID: "j", RequestID: "r", Metadata: json.RawMessage(meta)})
		if got := review4Compare(t, "metadata "+meta, b, wire.AcquireRequest{}); got != ok {
			t.Errorf("metadata %s: accepted %v, want %v", meta, got, ok)
		}
	}
	for hdr, ok := range map[string]bool{
		`{"h":"a","h":"b"}`: false, `{"h":{"x":1,"x":2}}`: false, `{}`: true, `{"h":"a"}`: true,
	} {
		body := fmt.Sprintf(`{"lock_identity":{"tenant_id":"t","program_id":"p","target_namespace":"n","target_id":"x","actor_name":"a","workflow_name":"w","operation_class":"o"},"lease_id":"l","fencing_token":7,"service_instance_id":"i","sink":"s","commit_id":"c","execution_id":"e","job_id":"j","outbox":{"exchange":"ex","routing_key":"rk","body":"aGk=","headers":%s}}`, hdr)
		if got := review4Compare(t, "headers "+hdr, []byte(body), wire.CommitRequest{}); got != ok {
			t.Errorf("headers %s: accepted %v, want %v", hdr, got, ok)
		}
	}
	// A canonical body whose metadata is then omitted by a duplicate
	// "metadata":null... is still a duplicate key.
	b, _ := json.Marshal(wire.AcquireRequest{LockIdentity: &id, TTLMs: 1000, ServiceInstanceID: "i", ExecutionID: "e",
		JobID: "j", RequestID: "r", Metadata: json.RawMessage(`{"k":1}`)})
	dup := strings.Replace(string(b), `"metadata":{"k":1}`, `"metadata":{"k":1},"metadata":{"k":2}`, 1)
	if review4Compare(t, "dup metadata", []byte(dup), wire.AcquireRequest{}) {
		t.Error("a duplicate metadata member was accepted")
	}
}

// HELD. Over HTTP, on each route, a body built to be json.Marshal's output
// but carrying a duplicate or case-variant key is 400 invalid_lease_request with
// no mutation: the acquire that would win by the last duplicate never
// happens. (A key written with JSON escapes, "\u006aob_id", is the key
// job_id itself, not a variant, and both paths accept it.)
func TestReview4AmbiguousBodiesOverHTTP(t *testing.T) {
	s := newTestServer(t)
	post := func(path, body string) (int, map[string]any) {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var out map[string]any
		json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out
	}
	ident := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "web",
		TargetID: "example.com", ActorName: "crawler"}
	acq, _ := json.Marshal(wire.AcquireRequest{LockIdentity: &ident, TTLMs: 30000, ServiceInstanceID: "inst-1",
		ExecutionID: "exec-1", JobID: "job-1", RequestID: "req-amb"})
	for name, body := range map[string]string{
		"dup target":   strings.Replace(string(acq), `"target_id":"example.com"`, `"target_id":"other.com","target_id":"example.com"`, 1),
		"dup ttl":      strings.Replace(string(acq), `"ttl_ms":30000`, `"ttl_ms":1,"ttl_ms":30000`, 1),
		"case request": strings.Replace(string(acq), `"request_id"`, `"Request_id"`, 1),
	} {
		if code, out := post(Base+"/acquire", body); code != 400 || out["code"] != "invalid_lease_request" {
			t.Errorf("acquire %s: %d %v", name, code, out)
		}
	}
	code, out := post(Base+"/acquire", string(acq))
	if code != 200 || out["code"] != "lease_acquired" {
		t.Fatalf("canonical acquire: %d %v", code, out)
	}
	l := out["lease"].(map[string]any)
	if l["fencing_token"].(float64) != 1 {
		t.Fatalf("an ambiguous acquire mutated the store: fencing token %v", l["fencing_token"])
	}
	leaseID := l["lease_id"].(string)
	ren, _ := json.Marshal(wire.RenewRequest{LockIdentity: &ident, FencingToken: 1, ServiceInstanceID: "inst-1", RequestID: "req-ren"})
	rel, _ := json.Marshal(wire.ReleaseRequest{LockIdentity: &ident, FencingToken: 1, ServiceInstanceID: "inst-1", RequestID: "req-rel"})
	for name, tc := range map[string]struct{ path, body string }{
		"renew dup token":     {Base + "/" + leaseID + "/renew", strings.Replace(string(ren), `"fencing_token":1`, `"fencing_token":2,"fencing_token":1`, 1)},
		"renew case token":    {Base + "/" + leaseID + "/renew", strings.Replace(string(ren), `"fencing_token"`, `"Fencing_token"`, 1)},
		"release dup token":   {Base + "/" + leaseID + "/release", strings.Replace(string(rel), `"fencing_token":1`, `"fencing_token":2,"fencing_token":1`, 1)},
		"release dup ident":   {Base + "/" + leaseID + "/release", strings.Replace(string(rel), `"lock_identity":`, `"lock_identity":null,"lock_identity":`, 1)},
		"inspect case tenant": {Base + "/inspect", `{"lock_identity":{"Tenant_id":"tenant-main","program_id":"program-a","target_namespace":"web","target_id":"example.com","actor_name":"crawler","workflow_name":"","operation_class":""}}`},
	} {
		if code, out := post(tc.path, tc.body); code != 400 || out["code"] != "invalid_lease_request" {
			t.Errorf("%s: %d %v", name, code, out)
		}
	}
	// The lease is untouched: a canonical renew with token 1 still renews.
	if code, out := post(Base+"/"+leaseID+"/renew", string(ren)); code != 200 || out["code"] != "lease_renewed" {
		t.Fatalf("canonical renew after ambiguous ones: %d %v", code, out)
	}
}

// FuzzReview4FastPath: decodeBody agrees with the full strict path on any
// body, for the acquire and commit bodies (the seeds are the mutations).
func FuzzReview4FastPath(f *testing.F) {
	for _, proto := range review4Bodies() {
		b, _ := json.Marshal(proto)
		for _, m := range review4Mutations(string(b)) {
			f.Add([]byte(m))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, proto := range []any{wire.AcquireRequest{}, wire.RenewRequest{}, wire.AdminRequest{}, wire.CommitRequest{}} {
			review4Compare(t, "fuzz", body, proto)
		}
	})
}
