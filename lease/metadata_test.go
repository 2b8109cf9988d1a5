package lease

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestValidateMetadataAccepts(t *testing.T) {
	full := Metadata{}
	for i := 0; i < MaxMetadataKeys; i++ {
		full[fmt.Sprintf("key-%02d", i)] = i
	}
	cases := map[string]Metadata{
		"nil":   nil,
		"empty": {},
		"scalars": {"s": "text", "b": true, "n": nil, "f": 1.5, "i": 3, "i64": int64(-4),
			"u64": uint64(5), "i32": int32(6), "num": json.Number("-1.25e3")},
		"identifier keys":  {"a.b_c:d-e": "x", "caf\u00e9": "y", "0": "z"},
		"32 keys":          full,
		"exactly 4096":     {"k": strings.Repeat("x", 4088)}, // {"k":"..."} = 8 + 4088 bytes
		"unicode value":    {"k": "\u65e5\u672c\u8a9e"},
		"control in value": {"k": "line1\nline2"},
	}
	if b, _ := json.Marshal(cases["exactly 4096"]); len(b) != 4096 {
		t.Fatalf("fixture is %d bytes", len(b))
	}
	for name, m := range cases {
		if err := ValidateMetadata(m); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestValidateMetadataRejects(t *testing.T) {
	tooMany := Metadata{}
	for i := 0; i <= MaxMetadataKeys; i++ {
		tooMany[fmt.Sprintf("key-%02d", i)] = i
	}
	cases := []struct {
		name          string
		m             Metadata
		field, reason string
	}{
		{"33 keys", tooMany, "metadata", "at most 32 keys"},
		{"4097 bytes", Metadata{"k": strings.Repeat("x", 4089)}, "metadata", "at most 4 KiB encoded"},
		{"escaping counts toward size", Metadata{"k": strings.Repeat("<", 700)}, "metadata", "at most 4 KiB encoded"},
		{"uppercase key", Metadata{"Key": "v"}, "metadata", "keys must be canonical identifiers"},
		{"empty key", Metadata{"": "v"}, "metadata", "keys must be canonical identifiers"},
		{"key with space", Metadata{"a b": "v"}, "metadata", "keys must be canonical identifiers"},
		{"key with slash", Metadata{"a/b": "v"}, "metadata", "keys must be canonical identifiers"},
		{"key leading dot", Metadata{".a": "v"}, "metadata", "keys must be canonical identifiers"},
		{"key NFD", Metadata{"cafe\u0301": "v"}, "metadata", "keys must be canonical identifiers"},
		{"key too long", Metadata{strings.Repeat("k", 257): "v"}, "metadata", "keys must be canonical identifiers"},
		{"nested object", Metadata{"k": map[string]any{"a": 1}}, "metadata.k", "values must be scalars"},
		{"nested Metadata", Metadata{"k": Metadata{}}, "metadata.k", "values must be scalars"},
		{"array", Metadata{"k": []any{"a"}}, "metadata.k", "values must be scalars"},
		{"string slice", Metadata{"k": []string{"a"}}, "metadata.k", "values must be scalars"},
		{"struct", Metadata{"k": struct{}{}}, "metadata.k", "values must be scalars"},
		{"NaN", Metadata{"k": math.NaN()}, "metadata.k", "number must be finite"},
		{"+Inf", Metadata{"k": math.Inf(1)}, "metadata.k", "number must be finite"},
		{"-Inf", Metadata{"k": math.Inf(-1)}, "metadata.k", "number must be finite"},
		{"json.Number garbage", Metadata{"k": json.Number("abc")}, "metadata.k", "invalid number"},
		{"json.Number out of range", Metadata{"k": json.Number("1e400")}, "metadata.k", "invalid number"},
		// strconv accepts "NaN"; encoding/json then refuses to encode it.
		{"json.Number NaN", Metadata{"k": json.Number("NaN")}, "metadata", "not encodable"},
		{"json.Number hex", Metadata{"k": json.Number("0x1p4")}, "metadata", "not encodable"},
		{"invalid UTF-8 value", Metadata{"k": "a\xffb"}, "metadata.k", "must be valid UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, ValidateMetadata(tc.m), CodeInvalidRequest, tc.field, tc.reason)
		})
	}
}

func TestDecodeMetadata(t *testing.T) {
	m, err := DecodeMetadata([]byte(`{"b":true,"n":null,"num":1.50,"s":"x","big":12345678901234567890}`))
	if err != nil {
		t.Fatalf("DecodeMetadata: %v", err)
	}
	want := Metadata{"b": true, "n": nil, "num": json.Number("1.50"), "s": "x", "big": json.Number("12345678901234567890")}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %#v, want %#v", m, want)
	}
	if m, err := DecodeMetadata([]byte(" {} \n")); err != nil || m == nil || len(m) != 0 {
		t.Fatalf("empty object: %#v, %v", m, err)
	}
	for _, in := range []string{``, `null`, `[]`, `"x"`, `1`, `{`, `{"a":1} {"b":2}`, `{"a":1} x`, `{"a":}`} {
		m, err := DecodeMetadata([]byte(in))
		if m != nil {
			t.Errorf("DecodeMetadata(%s) returned %#v", in, m)
		}
		wantErr(t, err, CodeInvalidRequest, "metadata", "must be a JSON object")
	}
	// Decoded content is validated.
	_, err = DecodeMetadata([]byte(`{"k":{"a":1}}`))
	wantErr(t, err, CodeInvalidRequest, "metadata.k", "values must be scalars")
	_, err = DecodeMetadata([]byte(`{"k":[1]}`))
	wantErr(t, err, CodeInvalidRequest, "metadata.k", "values must be scalars")
	_, err = DecodeMetadata([]byte(`{"K":1}`))
	wantErr(t, err, CodeInvalidRequest, "metadata", "keys must be canonical identifiers")
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < 33; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	b.WriteString("}")
	_, err = DecodeMetadata([]byte(b.String()))
	wantErr(t, err, CodeInvalidRequest, "metadata", "at most 32 keys")
	_, err = DecodeMetadata([]byte(`{"k":"` + strings.Repeat("x", 4089) + `"}`))
	wantErr(t, err, CodeInvalidRequest, "metadata", "at most 4 KiB encoded")
}

// DecodeMetadata checks for trailing data with Decoder.More, which reports
// false when the next byte is '}' or ']', so those trailing bytes slip through.
func TestDecodeMetadataRejectsTrailingCloser(t *testing.T) {
	var accepted []string
	for _, in := range []string{`{"a":"b"}}`, `{"a":"b"}]`, `{}]]]`} {
		m, err := DecodeMetadata([]byte(in))
		if err == nil {
			accepted = append(accepted, fmt.Sprintf("%s => %v", in, m))
			continue
		}
		wantErr(t, err, CodeInvalidRequest, "metadata", "must be a JSON object")
	}
	if len(accepted) > 0 {
		t.Fatalf("BUG: record.go DecodeMetadata accepts trailing data %q: dec.More() is false before '}' or ']'; "+
			"use strictUnmarshal (dec.Token() == io.EOF) instead", accepted)
	}
}

func TestCanonicalMetadataDigestForm(t *testing.T) {
	if got := string(canonicalMetadata(nil)); got != "{}" {
		t.Fatalf("nil -> %s", got)
	}
	if got := string(canonicalMetadata(Metadata{})); got != "{}" {
		t.Fatalf("empty -> %s", got)
	}
	got := string(canonicalMetadata(Metadata{"z": 1, "a": "x", "m": json.Number("1.0")}))
	if got != `{"a":"x","m":1.0,"z":1}` {
		t.Fatalf("sorted form = %s", got)
	}
}
