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

// Issue 11 §6: metadata is stored in records and history, so credential
// material is refused there with the same rule that redacts audit events
// (SecretShaped), and so are keys that name a credential.
func TestValidateMetadataRefusesSecrets(t *testing.T) {
	key := "star_sk_v1_01J0000000000000000000000A_" + strings.Repeat("ab", 32)
	refused := map[string]Metadata{
		"password key":           {"password": "hunter2"},
		"db_password key":        {"db_password": "x"},
		"client_secret key":      {"client_secret": "x"},
		"api_key key":            {"api_key": "x"},
		"api-key key":            {"api-key": "x"},
		"apikey key":             {"apikey": "x"},
		"access_token key":       {"access_token": "x"},
		"authorization key":      {"authorization": "x"},
		"x.authorization key":    {"x.authorization": "x"},
		"private_key key":        {"private_key": "x"},
		"bearer value":           {"note": "Bearer abc.def"},
		"bearer lower case":      {"note": "header: bearer abc"},
		"api key value":          {"note": key},
		"api key prefix upper":   {"note": "STAR_SK_V1_X"},
		"bare secret value":      {"note": strings.Repeat("0f", 32)},
		"secret inside value":    {"note": "s=" + strings.Repeat("AB", 32) + ";"},
		"secret-shaped key":      {strings.Repeat("ab", 32): "x"},
		"one bad among good":     {"note": "ok", "job": "build-7", "token": "x"},
		"number under a bad key": {"password": 1234},
	}
	for name, m := range refused {
		t.Run(name, func(t *testing.T) {
			err := ValidateMetadata(m)
			wantErr(t, err, CodeInvalidRequest, "metadata", "")
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(strings.ToLower(err.Error()), "star_sk_v1_0") ||
				strings.Contains(err.Error(), "abc") {
				t.Fatalf("error echoes the value: %v", err)
			}
			raw, _ := json.Marshal(m)
			if _, err := DecodeMetadata(raw); err == nil {
				t.Fatal("DecodeMetadata accepted it")
			}
		})
	}
	for name, m := range map[string]Metadata{
		"63 hex digits":           {"digest_prefix": strings.Repeat("a", 63)},
		"short hex":               {"commit": "0f3a9c1"},
		"word bear":               {"note": "bear market"},
		"value mentioning tokens": {"note": "tokens are not keys"},
		"credential id":           {"owner": "01J0000000000000000000000A"},
	} {
		if err := ValidateMetadata(m); err != nil {
			t.Errorf("%s refused: %v", name, err)
		}
	}
	// An acquire carrying such metadata is refused before anything is
	// stored.
	r := validAcquire()
	r.Metadata = Metadata{"password": "hunter2"}
	_, p, err := PrepareAcquire(r, StoreOptions{})
	wantErr(t, err, CodeInvalidRequest, "metadata", "")
	if p != (Prepared{}) {
		t.Fatalf("refused request prepared %+v", p)
	}
}

// A record stored before metadata was screened stays readable: refusing
// it would make its identity unusable without removing anything.
func TestStoredRecordWithSecretShapedMetadataDecodes(t *testing.T) {
	r := validRecord()
	r.Metadata = Metadata{"password": "old"}
	b, err := r.Encode()
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if _, err := DecodeRecord(b); err != nil {
		t.Fatalf("DecodeRecord: %v", err)
	}
}

func TestSecretShaped(t *testing.T) {
	for v, want := range map[string]bool{
		"":                                    false,
		"example.com":                         false,
		strings.Repeat("a", 63):               false,
		strings.Repeat("a", 64):               true,
		"x" + strings.Repeat("F", 64):         true,
		"star_sk_":                            true,
		"Star_SK_v1":                          true,
		"Bearer x":                            true,
		"bearer":                              false,
		"redacted:" + strings.Repeat("0", 32): false,
	} {
		if got := SecretShaped(v); got != want {
			t.Errorf("SecretShaped(%q) = %v, want %v", v, got, want)
		}
	}
}
