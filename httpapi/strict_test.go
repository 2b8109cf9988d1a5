package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

func TestCanonicalJSON(t *testing.T) {
	id := lease.Identity{TenantID: "t", ProgramID: "p", TargetNamespace: "n", TargetID: "x", ActorName: "a"}
	rel := wire.ReleaseRequest{LockIdentity: &id, FencingToken: 3, ServiceInstanceID: "i", RequestID: "r"}
	b, _ := json.Marshal(rel)
	for _, tc := range []struct {
		body string
		want bool
	}{
		{string(b), true},
		{string(b) + "\n", true},
		{string(b) + " ", false},
		{" " + string(b), false},
		{strings.Replace(string(b), `"request_id"`, `"Request_ID"`, 1), false},
	} {
		var got wire.ReleaseRequest
		if err := json.Unmarshal([]byte(tc.body), &got); err != nil {
			t.Fatal(err)
		}
		if lease.IsOwnEncoding([]byte(tc.body), &got) != tc.want {
			t.Errorf("IsOwnEncoding(%q) = %v, want %v", tc.body, !tc.want, tc.want)
		}
	}
	// A raw member re-encodes as it came: never canonical when present.
	acq := wire.AcquireRequest{LockIdentity: &id, TTLMs: 1000, ServiceInstanceID: "i", ExecutionID: "e", JobID: "j",
		RequestID: "r", Metadata: json.RawMessage(`{"k":1,"k":2}`)}
	b, _ = json.Marshal(acq)
	var got wire.AcquireRequest
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if lease.IsOwnEncoding(b, &got) {
		t.Error("a body with a raw member was taken as canonical")
	}
	got.Metadata = nil
	acq.Metadata = nil
	b, _ = json.Marshal(acq)
	if !lease.IsOwnEncoding(b, &got) {
		t.Error("an acquire body without metadata is not canonical")
	}
}

// Duplicate keys inside a raw member of an otherwise canonical body are
// still refused (the strict decoder's parse is not skipped for it).
func TestDecodeBodyRawDuplicates(t *testing.T) {
	id := lease.Identity{TenantID: "t", ProgramID: "p", TargetNamespace: "n", TargetID: "x", ActorName: "a"}
	for meta, ok := range map[string]bool{`{"k":1,"k":2}`: false, `{"k":1,"l":2}`: true} {
		b, _ := json.Marshal(wire.AcquireRequest{LockIdentity: &id, TTLMs: 1000, ServiceInstanceID: "i", ExecutionID: "e",
			JobID: "j", RequestID: "r", Metadata: json.RawMessage(meta)})
		r := httptest.NewRequest("POST", Base+"/acquire", strings.NewReader(string(b)))
		r.Header.Set("Content-Type", "application/json")
		var v wire.AcquireRequest
		if err := decodeBody(r, &v); (err == nil) != ok {
			t.Errorf("metadata %s: %v", meta, err)
		}
	}
}
