package lease_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

type strictInner struct {
	Name  string          `json:"name"`
	Count int             `json:"count,omitempty"`
	At    lease.Timestamp `json:"at,omitempty"`
}

type strictBase struct {
	ID string `json:"id"`
}

type strictOuter struct {
	strictBase
	Inner  *strictInner           `json:"inner,omitempty"`
	List   []strictInner          `json:"list,omitempty"`
	ByName map[string]strictInner `json:"by_name,omitempty"`
	Raw    json.RawMessage        `json:"raw,omitempty"`
	Flag   bool                   `json:"flag,omitempty"`
	NoTag  string
	//lint:ignore U1000 an unexported field's name is not a member: the test sends it
	private string
}

func TestDecodeStrict(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		err      string // "" accepts
	}{
		{"all members", `{"id":"a","inner":{"name":"n","count":2},"list":[{"name":"x"}],"by_name":{"k":{"name":"y"}},"raw":{"Any":1},"flag":true,"NoTag":"t"}`, ""},
		{"optional members sent with their zero value", `{"id":"a","flag":false,"inner":{"name":"","count":0},"list":[],"raw":null}`, ""},
		{"promoted member of an embedded struct", `{"id":"a"}`, ""},
		{"case variant at the top", `{"ID":"a"}`, `unknown field "ID"`},
		{"case variant of a promoted member", `{"Id":"a"}`, `unknown field "Id"`},
		{"case variant nested", `{"id":"a","inner":{"Name":"n"}}`, `unknown field "inner.Name"`},
		{"case variant in a list element", `{"id":"a","list":[{"name":"x"},{"NAME":"y"}]}`, `unknown field "list.NAME"`},
		{"case variant in a map value", `{"id":"a","by_name":{"k":{"Count":1}}}`, `unknown field "by_name.k.Count"`},
		{"unknown member", `{"id":"a","extra":1}`, "unknown field"},
		{"duplicate key", `{"id":"a","id":"b"}`, "duplicate key"},
		{"duplicate key nested", `{"id":"a","inner":{"name":"n","name":"m"}}`, "duplicate key"},
		{"unexported field's name", `{"id":"a","private":"p"}`, "unknown field"},
		{"trailing data", `{"id":"a"} {}`, "trailing data"},
		{"not UTF-8", "{\"id\":\"\xff\"}", "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v strictOuter
			err := lease.DecodeStrict([]byte(tc.in), &v)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error containing %q", err, tc.err)
			}
			if tc.err == "" && v.ID != "a" {
				t.Fatalf("decoded id %q", v.ID)
			}
		})
	}
}
