package lease

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestRecordEncodeGolden(t *testing.T) {
	b, err := validRecord().Encode()
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if string(b) != goldenRecordJSON {
		t.Fatalf("Encode =\n%s\nwant\n%s", b, goldenRecordJSON)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r := validRecord()
	r.Metadata = Metadata{
		"note":      "hello <world> & \u00e9",
		"count":     json.Number("7"),
		"ratio":     json.Number("1.50"),
		"big":       json.Number("12345678901234567890"),
		"flag":      true,
		"off":       false,
		"nothing":   nil,
		"caf\u00e9": "x",
	}
	r.State = StateReleased
	b, err := r.Encode()
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	got, err := DecodeRecord(b)
	if err != nil {
		t.Fatalf("DecodeRecord: %v", err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip differs:\n got %#v\nwant %#v", got, r)
	}
	b2, err := got.Encode()
	if err != nil || !bytes.Equal(b, b2) {
		t.Fatalf("re-encoding differs: %v\n%s\n%s", err, b, b2)
	}
	if !strings.Contains(string(b), `"ratio":1.50`) {
		t.Fatalf("numbers must be kept as written: %s", b)
	}

	// The golden JSON decodes to exactly validRecord().
	g, err := DecodeRecord([]byte(goldenRecordJSON))
	if err != nil {
		t.Fatalf("DecodeRecord(golden): %v", err)
	}
	if !reflect.DeepEqual(g, validRecord()) {
		t.Fatalf("golden decodes to %#v", g)
	}
	if g.AcquiredAt.String() != "2026-08-05T12:00:00.000Z" || g.AcquiredAt.UnixMilli() != msAcquired {
		t.Fatalf("acquired_at = %s (%d)", g.AcquiredAt, g.AcquiredAt.UnixMilli())
	}
}

func TestRecordEncodeNilMetadataIsEmptyObject(t *testing.T) {
	r := validRecord()
	r.Metadata = nil
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != goldenRecordJSON {
		t.Fatalf("nil metadata encodes as\n%s", b)
	}
	if r.Metadata != nil {
		t.Fatal("Encode mutated the receiver")
	}
}

func TestRecordEncodeValidates(t *testing.T) {
	r := validRecord()
	r.State = "paused"
	_, err := r.Encode()
	wantErr(t, err, CodeInvalidRequest, "state", "unknown state")

	r = validRecord()
	r.TenantID = "Tenant-Main"
	_, err = r.Encode()
	wantErr(t, err, CodeInvalidRequest, "tenant_id", "stored tuple is not canonical")

	r = validRecord()
	r.LockKey = KeyPrefix + "x"
	_, err = r.Encode()
	wantErr(t, err, CodeInvalidRequest, "lock_key", "stored tuple does not hash to lock_key")
}

func TestTimestampFormat(t *testing.T) {
	ts := At(time.Date(2026, 8, 5, 13, 0, 0, 123_987_654, time.FixedZone("CET", 3600)))
	if got := ts.String(); got != "2026-08-05T12:00:00.123Z" {
		t.Fatalf("String = %q", got)
	}
	b, err := json.Marshal(ts)
	if err != nil || string(b) != `"2026-08-05T12:00:00.123Z"` {
		t.Fatalf("MarshalJSON = %s, %v", b, err)
	}
	if got := UnixMilli(msAcquired).String(); got != "2026-08-05T12:00:00.000Z" {
		t.Fatalf("UnixMilli(...).String() = %q", got)
	}
	if got := UnixMilli(msAcquired).Add(1500 * time.Microsecond).String(); got != "2026-08-05T12:00:00.001Z" {
		t.Fatalf("Add truncates to the millisecond: got %q", got)
	}
	if !UnixMilli(1).Before(UnixMilli(2)) || UnixMilli(2).Before(UnixMilli(2)) {
		t.Fatal("Before")
	}
	if _, err := json.Marshal(Timestamp{}); err == nil {
		t.Fatal("zero timestamp must not encode")
	}
	if !(Timestamp{}).IsZero() || UnixMilli(msAcquired).IsZero() {
		t.Fatal("IsZero")
	}
	if At(UnixMilli(msAcquired).Time()) != UnixMilli(msAcquired) {
		t.Fatal("At(Time()) is not the identity")
	}
}

func TestParseTimestamp(t *testing.T) {
	ok, err := ParseTimestamp("2026-08-05T12:00:00.000Z")
	if err != nil || ok.UnixMilli() != msAcquired || ok.Time().Location() != time.UTC {
		t.Fatalf("ParseTimestamp = %v (%v), %v", ok, ok.Time().Location(), err)
	}
	if got, err := ParseTimestamp("2026-08-05T12:00:00.999Z"); err != nil || got.UnixMilli() != msAcquired+999 {
		t.Fatalf("millis: %v %v", got, err)
	}
	for _, s := range []string{
		"2026-08-05T12:00:00.000+00:00",
		"2026-08-05T13:00:00.000+01:00",
		"2026-08-05T12:00:00.000-00:00",
		"2026-08-05T12:00:00Z",        // missing millis
		"2026-08-05T12:00:00.0Z",      // one digit
		"2026-08-05T12:00:00.00Z",     // two digits
		"2026-08-05T12:00:00.000000Z", // micros
		"2026-08-05T12:00:00.000000000Z",
		"2026-08-05T12:00:00.000z",
		"2026-08-05 12:00:00.000Z",
		"2026-08-05t12:00:00.000Z",
		"2026-08-05T12:00:00.000",
		"2026-08-05T12:00:00,000Z",
		"2026-8-5T12:00:00.000Z",
		"2026-02-30T12:00:00.000Z",
		"2026-08-05T24:00:00.000Z",
		"2026-08-05T23:59:60.000Z",
		" 2026-08-05T12:00:00.000Z",
		"2026-08-05T12:00:00.000Z ",
		"",
		"1785931200000",
	} {
		if got, err := ParseTimestamp(s); err == nil {
			t.Errorf("ParseTimestamp(%q) accepted as %s", s, got)
		} else if err.Error() != "timestamp must be RFC 3339 UTC with milliseconds" {
			t.Errorf("ParseTimestamp(%q) error %q", s, err)
		}
	}
	var ts Timestamp
	for _, in := range []string{`1785931200000`, `null`, `"2026-08-05T12:00:00Z"`, `true`} {
		if err := json.Unmarshal([]byte(in), &ts); err == nil {
			t.Errorf("UnmarshalJSON(%s) accepted", in)
		}
	}
	if err := json.Unmarshal([]byte(`"2026-08-05T12:00:20.000Z"`), &ts); err != nil || ts.UnixMilli() != msRenewed {
		t.Fatalf("UnmarshalJSON: %v %v", ts, err)
	}
}

func TestStates(t *testing.T) {
	for _, s := range []State{StateActive, StateExpired, StateReleased, StateRevoked} {
		if !s.Valid() {
			t.Errorf("%q not valid", s)
		}
	}
	if string(StateActive) != "active" || string(StateExpired) != "expired" || string(StateReleased) != "released" || string(StateRevoked) != "revoked" {
		t.Fatal("state wire values changed")
	}
	for _, s := range []State{"", "Active", "locked", "mutex", "force_released"} {
		if s.Valid() {
			t.Errorf("%q valid", s)
		}
	}
	if StateActive.Terminal() || !StateExpired.Terminal() || !StateReleased.Terminal() || !StateRevoked.Terminal() || State("x").Terminal() {
		t.Fatal("Terminal")
	}
}

func TestRecordLiveAtAndObservedAt(t *testing.T) {
	r := validRecord()
	if !r.LiveAt(UnixMilli(msExpires - 1)) {
		t.Fatal("live one millisecond before expiry")
	}
	if r.LiveAt(UnixMilli(msExpires)) || r.LiveAt(UnixMilli(msExpires+1)) {
		t.Fatal("live at or after expires_at")
	}
	if o := r.ObservedAt(UnixMilli(msExpires - 1)); o.State != StateActive {
		t.Fatalf("observed before expiry = %s", o.State)
	}
	o := r.ObservedAt(UnixMilli(msExpires))
	if o.State != StateExpired {
		t.Fatalf("observed at expires_at = %s, want expired", o.State)
	}
	if r.State != StateActive {
		t.Fatal("ObservedAt mutated the receiver")
	}
	rel := validRecord()
	rel.State = StateReleased
	if rel.LiveAt(UnixMilli(msAcquired)) {
		t.Fatal("released record is live")
	}
	if got := rel.ObservedAt(UnixMilli(msExpires + 1)).State; got != StateReleased {
		t.Fatalf("terminal state rewritten to %s", got)
	}
}

func TestRecordCloneIsDeep(t *testing.T) {
	var nilRec *Record
	if nilRec.Clone() != nil {
		t.Fatal("nil clone")
	}
	r := validRecord()
	r.Metadata = Metadata{"k": "v"}
	c := r.Clone()
	c.Metadata["k"] = "changed"
	c.LeaseID = "other"
	if r.Metadata["k"] != "v" || r.LeaseID != "lease_01" {
		t.Fatal("Clone shares state with the original")
	}
	if r.Identity() != contractIdentity() {
		t.Fatalf("Identity = %+v", r.Identity())
	}
}

type recordCase struct {
	name   string
	mut    func(m map[string]any)
	reason string
}

func TestDecodeRecordFailsClosed(t *testing.T) {
	hashOf := func(id Identity) string { return independentKey(t, id) }
	upper := contractIdentity()
	upper.TenantID = "Tenant-Main"
	bigMeta := map[string]any{}
	for i := 0; i < 33; i++ {
		bigMeta[fmt.Sprintf("k%02d", i)] = i
	}
	cases := []recordCase{
		{"unknown top-level field", func(m map[string]any) { m["owner"] = "x" }, `record: malformed: unknown field "owner"`},
		{"record_version 2", func(m map[string]any) { m["record_version"] = 2 }, "record: unsupported record version"},
		{"record_version 0", func(m map[string]any) { m["record_version"] = 0 }, "record: unsupported record version"},
		{"record_version missing", func(m map[string]any) { delete(m, "record_version") }, "record: unsupported record version"},
		{"record_version string", func(m map[string]any) { m["record_version"] = "1" }, "record: malformed: wrong type for record_version"},
		{"lock_key of another tuple", func(m map[string]any) { m["tenant_id"] = "tenant-other" }, "record: stored tuple does not hash to lock_key"},
		{"lock_key tampered", func(m map[string]any) { m["lock_key"] = KeyPrefix + strings.Repeat("A", 43) }, "record: stored tuple does not hash to lock_key"},
		{"lock_key missing", func(m map[string]any) { delete(m, "lock_key") }, "record: stored tuple does not hash to lock_key"},
		{"non-canonical tuple uppercase", func(m map[string]any) { m["tenant_id"] = "Tenant-Main" }, "record: stored tuple is not canonical"},
		{"non-canonical tuple uppercase hashed", func(m map[string]any) {
			m["tenant_id"] = "Tenant-Main"
			m["lock_key"] = hashOf(upper)
		}, "record: stored tuple is not canonical"},
		{"non-canonical tuple NFD", func(m map[string]any) { m["target_id"] = "cafe\u0301" }, "record: stored tuple is not canonical"},
		{"non-canonical tuple padded", func(m map[string]any) { m["actor_name"] = " usernamegen" }, "record: stored tuple is not canonical"},
		{"empty workflow is not defaulted in records", func(m map[string]any) { m["workflow_name"] = "" }, "record: stored tuple is not canonical"},
		{"tuple with path", func(m map[string]any) { m["target_namespace"] = "a/b" }, "record: stored tuple is not canonical"},
		{"bad state", func(m map[string]any) { m["state"] = "locked" }, "record: unknown state"},
		{"uppercase state", func(m map[string]any) { m["state"] = "ACTIVE" }, "record: unknown state"},
		{"state missing", func(m map[string]any) { delete(m, "state") }, "record: unknown state"},
		{"fencing_token 0", func(m map[string]any) { m["fencing_token"] = 0 }, "record: out of range"},
		{"fencing_token 2^53", func(m map[string]any) { m["fencing_token"] = json.Number("9007199254740992") }, "record: out of range"},
		{"fencing_token 2^64", func(m map[string]any) { m["fencing_token"] = json.Number("18446744073709551616") }, "record: malformed: wrong type for fencing_token"},
		{"fencing_token negative", func(m map[string]any) { m["fencing_token"] = -1 }, "record: malformed: wrong type for fencing_token"},
		{"fencing_token fractional", func(m map[string]any) { m["fencing_token"] = 1.5 }, "record: malformed: wrong type for fencing_token"},
		{"fencing_token string", func(m map[string]any) { m["fencing_token"] = "42" }, "record: malformed: wrong type for fencing_token"},
		{"ttl_ms 0", func(m map[string]any) { m["ttl_ms"] = 0 }, "record: out of range"},
		{"ttl_ms over MaxTTL", func(m map[string]any) { m["ttl_ms"] = MaxTTL.Milliseconds() + 1 }, "record: out of range"},
		{"maximum_lifetime_ms 0", func(m map[string]any) { m["maximum_lifetime_ms"] = 0 }, "record: out of range"},
		{"maximum_lifetime_ms over MaxLifetime", func(m map[string]any) { m["maximum_lifetime_ms"] = MaxLifetime.Milliseconds() + 1 }, "record: out of range"},
		{"expires_at beyond acquired_at+maximum_lifetime_ms", func(m map[string]any) {
			m["renewed_at"] = "2026-08-05T12:04:50.000Z"
			m["expires_at"] = "2026-08-05T12:05:00.001Z" // acquired + 300000ms + 1ms
		}, "record: exceeds acquired_at + maximum_lifetime_ms"},
		{"expires_at beyond renewed_at+ttl_ms", func(m map[string]any) { m["expires_at"] = "2026-08-05T12:00:50.001Z" }, "record: exceeds renewed_at + ttl_ms"},
		{"renewed_at before acquired_at", func(m map[string]any) { m["renewed_at"] = "2026-08-05T11:59:59.999Z" }, "record: must lie in [acquired_at, expires_at)"},
		{"renewed_at equals expires_at", func(m map[string]any) { m["renewed_at"] = "2026-08-05T12:00:50.000Z" }, "record: must lie in [acquired_at, expires_at)"},
		{"expires_at missing", func(m map[string]any) { delete(m, "expires_at") }, "record: must be a time between 1970 and 9999"},
		{"acquired_at with offset", func(m map[string]any) { m["acquired_at"] = "2026-08-05T12:00:00.000+00:00" }, "record: malformed: invalid JSON"},
		{"acquired_at without millis", func(m map[string]any) { m["acquired_at"] = "2026-08-05T12:00:00Z" }, "record: malformed: invalid JSON"},
		{"acquired_at as number", func(m map[string]any) { m["acquired_at"] = msAcquired }, "record: malformed: invalid JSON"},
		{"lease_id missing", func(m map[string]any) { delete(m, "lease_id") }, "record: must not be empty"},
		{"lease_id with slash", func(m map[string]any) { m["lease_id"] = "lease/01" }, "record: may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"owner_principal_id empty", func(m map[string]any) { m["owner_principal_id"] = "" }, "record: must not be empty"},
		{"request_id too long", func(m map[string]any) { m["request_id"] = strings.Repeat("r", 257) }, "record: must be at most 256 bytes"},
		{"trace_id invalid", func(m map[string]any) { m["trace_id"] = "trace 01" }, "record: may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"job_id with dotdot", func(m map[string]any) { m["job_id"] = "job..1" }, "record: must not contain .."},
		{"metadata nested object", func(m map[string]any) { m["metadata"] = map[string]any{"k": map[string]any{"a": 1}} }, "record: values must be scalars"},
		{"metadata array value", func(m map[string]any) { m["metadata"] = map[string]any{"k": []any{1, 2}} }, "record: values must be scalars"},
		{"metadata 33 keys", func(m map[string]any) { m["metadata"] = bigMeta }, "record: at most 32 keys"},
		{"metadata over 4096 bytes", func(m map[string]any) { m["metadata"] = map[string]any{"k": strings.Repeat("x", 4089)} }, "record: at most 4 KiB encoded"},
		{"metadata non-canonical key", func(m map[string]any) { m["metadata"] = map[string]any{"Key": "v"} }, "record: keys must be canonical identifiers"},
		{"metadata is an array", func(m map[string]any) { m["metadata"] = []any{} }, "record: malformed: wrong type for metadata"},
		{"metadata huge number", func(m map[string]any) { m["metadata"] = map[string]any{"k": json.Number("1e400")} }, "record: invalid number"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := recordMap(t)
			tc.mut(m)
			b := mustJSON(t, m)
			r, err := DecodeRecord(b)
			if r != nil {
				t.Errorf("corrupt record returned %+v", r)
			}
			wantCorrupt(t, err, tc.reason)
		})
	}
}

func TestDecodeRecordRawInputsFailClosed(t *testing.T) {
	g := goldenRecordJSON
	cases := []struct{ name, in, reason string }{
		{"trailing object", g + `{}`, "record: trailing data"},
		{"trailing garbage", g + `x`, "record: trailing data"},
		{"trailing brace", g + `}`, "record: trailing data"},
		{"two records", g + "\n" + g, "record: trailing data"},
		{"truncated", g[:len(g)-1], "record: malformed: invalid JSON"},
		{"malformed", `{"record_version":1,`, "record: malformed: invalid JSON"},
		{"syntax error", `{"record_version" 1}`, "record: malformed: syntax error at offset 19"},
		{"empty input", ``, "record: malformed: invalid JSON"},
		{"array", `[]`, "record: malformed: wrong type for "},
		{"string", `"x"`, "record: malformed: wrong type for "},
		// Which check fires first on an empty record is not part of the contract.
		{"null", `null`, ""},
		{"empty object", `{}`, ""},
		{"invalid utf8 in tuple", strings.Replace(g, `"target_01"`, "\"target_\xff\"", 1), "record: malformed: not valid UTF-8"},
		{"invalid utf8 in metadata", strings.Replace(g, `"metadata":{}`, "\"metadata\":{\"k\":\"\xff\"}", 1), "record: malformed: not valid UTF-8"},
		// A valid record spelled other than Record.Encode writes it: no
		// writer produces these bytes, so they are not trusted either.
		{"trailing whitespace", g + " \n\t", "record: not in canonical form"},
		{"whitespace between fields", strings.Replace(g, `,"lease_id"`, `, "lease_id"`, 1), "record: not in canonical form"},
		{"fields in another order", string(mustJSON(t, recordMap(t))), "record: not in canonical form"},
		{"escaped letter", strings.Replace(g, `"lease_01"`, `"lease\u005f01"`, 1), "record: not in canonical form"},
		{"unescaped HTML character", strings.Replace(g, `"metadata":{}`, `"metadata":{"k":"<"}`, 1), "record: not in canonical form"},
		{"null for the trace id", strings.Replace(g, `"trace_id":"trace_01"`, `"trace_id":null`, 1), "record: not in canonical form"},
		{"trace id omitted", strings.Replace(g, `"trace_id":"trace_01",`, ``, 1), "record: not in canonical form"},
		{"lone surrogate in metadata", strings.Replace(g, `"metadata":{}`, `"metadata":{"k":"\ud800"}`, 1), "record: not in canonical form"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeRecord([]byte(tc.in))
			if r != nil {
				t.Errorf("returned %+v", r)
			}
			wantCorrupt(t, err, tc.reason)
		})
	}
}

// canonicalJSON is m as Record.Encode writes it: the record's fields in
// their order, whatever m's.
func canonicalJSON(t *testing.T, m map[string]any) []byte {
	t.Helper()
	var r Record
	if err := json.Unmarshal(mustJSON(t, m), &r); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	b, err := json.Marshal(&r)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

// Boundary values the decoder must accept.
func TestDecodeRecordAcceptsBounds(t *testing.T) {
	cases := []struct {
		name string
		mut  func(m map[string]any)
	}{
		{"fencing_token 1", func(m map[string]any) { m["fencing_token"] = 1 }},
		{"fencing_token 2^53-1", func(m map[string]any) { m["fencing_token"] = json.Number("9007199254740991") }},
		{"expires exactly at max lifetime", func(m map[string]any) {
			m["renewed_at"] = "2026-08-05T12:04:30.000Z"
			m["expires_at"] = "2026-08-05T12:05:00.000Z"
		}},
		{"renewed equals acquired", func(m map[string]any) {
			m["renewed_at"] = "2026-08-05T12:00:00.000Z"
			m["expires_at"] = "2026-08-05T12:00:30.000Z"
		}},
		{"trace_id empty", func(m map[string]any) { m["trace_id"] = "" }},
		{"terminal states", func(m map[string]any) { m["state"] = "revoked" }},
		{"ttl_ms MaxTTL", func(m map[string]any) { m["ttl_ms"] = MaxTTL.Milliseconds() }},
		{"32 metadata keys, scalars", func(m map[string]any) {
			md := map[string]any{}
			for i := 0; i < 32; i++ {
				md[fmt.Sprintf("k%02d", i)] = []any{"s", 1.25, true, nil}[i%4]
			}
			m["metadata"] = md
		}},
		{"metadata exactly 4096 bytes", func(m map[string]any) { m["metadata"] = map[string]any{"k": strings.Repeat("x", 4088)} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := recordMap(t)
			tc.mut(m)
			r, err := DecodeRecord(canonicalJSON(t, m))
			if err != nil {
				t.Fatalf("DecodeRecord: %v", err)
			}
			b, err := r.Encode()
			if err != nil {
				t.Fatalf("re-Encode: %v", err)
			}
			r2, err := DecodeRecord(b)
			if err != nil || !reflect.DeepEqual(normMeta(r), r2) {
				t.Fatalf("re-decode: %v\n%#v\n%#v", err, r, r2)
			}
		})
	}
}

// The contract: "unknown top-level fields fail closed". encoding/json matches
// field names case-insensitively and lets a repeated key overwrite an earlier
// one, so these must be rejected explicitly.
func TestDecodeRecordRejectsCaseVariantAndDuplicateKeys(t *testing.T) {
	g := goldenRecordJSON
	cases := []struct{ name, in string }{
		{"case-variant field name", strings.Replace(g, `"lock_key"`, `"LOCK_KEY"`, 1)},
		{"case-variant state", strings.Replace(g, `"state":"active"`, `"State":"active"`, 1)},
		{"duplicate state, last wins", strings.Replace(g, `"state":"active"`, `"state":"active","state":"released"`, 1)},
		{"duplicate fencing_token", strings.Replace(g, `"fencing_token":42`, `"fencing_token":42,"fencing_token":43`, 1)},
	}
	var accepted []string
	for _, tc := range cases {
		if _, err := DecodeRecord([]byte(tc.in)); err == nil {
			accepted = append(accepted, tc.name)
		} else {
			wantErr(t, err, CodeCorrupt, "", "")
		}
	}
	if len(accepted) > 0 {
		t.Fatalf("BUG: record.go strictUnmarshal/DecodeRecord accepts %v: encoding/json matches keys "+
			"case-insensitively and keeps the last duplicate, so a record readers disagree on decodes as valid", accepted)
	}
}

// metadata is a JSON object in record v1; null or an absent member is a
// fault at rest (encoding always writes an object).
func TestDecodeRecordMetadataNullOrMissing(t *testing.T) {
	for _, name := range []string{"null", "missing"} {
		m := recordMap(t)
		if name == "null" {
			m["metadata"] = nil
		} else {
			delete(m, "metadata")
		}
		r, err := DecodeRecord(mustJSON(t, m))
		if r != nil {
			t.Errorf("%s metadata: returned %+v", name, r)
		}
		wantCorrupt(t, err, "record: must be a JSON object")
	}
	// The same rule holds for records nested in stored evidence.
	e := validIdem()
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	_, err = DecodeIdempotencyRecord([]byte(strings.Replace(string(b), `"metadata":{}`, `"metadata":null`, 1)))
	wantCorrupt(t, err, "idempotency: must be a JSON object")
	h := validHistory()
	b, err = h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	_, err = DecodeHistoryEntry([]byte(strings.Replace(string(b), `"metadata":{}`, `"metadata":null`, 1)))
	wantCorrupt(t, err, "history: must be a JSON object")
}

func TestCheckOpaqueID(t *testing.T) {
	for _, ok := range []string{"a", "Z", "9", "lease_01HXYZ", "A.b_c:d-E", strings.Repeat("k", 256), "a-"} {
		if err := CheckOpaqueID("lease_id", ok); err != nil {
			t.Errorf("CheckOpaqueID(%q): %v", ok, err)
		}
	}
	cases := []struct{ in, reason string }{
		{"", "must not be empty"},
		{strings.Repeat("k", 257), "must be at most 256 bytes"},
		{"a\xffb", "must be valid UTF-8"},
		{"a..b", "must not contain .."},
		{"_a", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{".a", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"a b", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"a/b", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"caf\u00e9", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"a\x00", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		{"a*", "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"},
		// A whole API key fits the charset; no opaque id may carry one.
		{"star_sk_v1_01J00000000000000000000000_" + strings.Repeat("ab", 32), "must not hold an API key (star_sk_)"},
		{"req-STAR_SK_v1_x", "must not hold an API key (star_sk_)"},
	}
	for _, tc := range cases {
		wantErr(t, CheckOpaqueID("job_id", tc.in), CodeInvalidRequest, "job_id", tc.reason)
	}
	// Opaque ids keep case.
	if CheckOpaqueID("x", "ABC") != nil {
		t.Fatal("uppercase opaque id rejected")
	}
}

// appendTimestamp writes exactly what time.Time.AppendFormat writes for
// the timestamp layout, across years, zones and sub-millisecond parts.
func TestAppendTimestampMatchesAppendFormat(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	zones := []*time.Location{time.UTC, time.FixedZone("east", 14*3600), time.FixedZone("west", -12*3600-1800)}
	edges := []time.Time{time.Unix(0, 0), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), {}}
	for i := 0; i < 200000; i++ {
		var tm time.Time
		if i < len(edges) {
			tm = edges[i]
		} else {
			tm = time.Unix(r.Int63n(500_000_000_000)-200_000_000_000, r.Int63n(1e9)).In(zones[r.Intn(len(zones))])
		}
		if got, want := string(appendTimestamp([]byte("x"), tm)), string(tm.AppendFormat([]byte("x"), timestampLayout)); got != want {
			t.Fatalf("%v: %q, want %q", tm, got, want)
		}
	}
}

// TestOpaqueIDFastPath: the one-pass check accepts exactly the ids the
// rules one by one accept, over every string of up to 5 bytes from an
// alphabet of each rule's edge bytes, and over ids around an API key's
// prefix and the length bound.
func TestOpaqueIDFastPath(t *testing.T) {
	check := func(v string) {
		t.Helper()
		fast, slow := opaqueIDOK(v), opaqueIDFault("x", v) == nil
		if fast != slow {
			t.Fatalf("%q: one pass says %v, the rules one by one %v", v, fast, slow)
		}
		if got := CheckOpaqueID("x", v); (got == nil) != slow {
			t.Fatalf("%q: CheckOpaqueID %v, the rules one by one say valid=%v", v, got, slow)
		}
	}
	alphabet := []string{"a", "Z", "9", ".", "_", ":", "-", " ", "/", "\xff", "\u00e9", "\u212a", "\x00"}
	var walk func(prefix string, n int)
	walk = func(prefix string, n int) {
		check(prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			walk(prefix+c, n-1)
		}
	}
	walk("", 5)
	for _, v := range []string{
		"star_sk_", "Star_SK_x", "xstar_sk_", "a.star_sk_1", "star_sk", "star_s_k_", "stars_sk_", "star__sk_",
		"sta_sk_", "star_sk:", "star-sk_", "a_star_sk_", "STAR_SK_", "st\u212ar_sk_", "star_s\u212a_",
		"a.b", "a..", "a.-.", "lease_01HXYZ", "req-STAR_SK_v1_x",
		strings.Repeat("k", 256), strings.Repeat("k", 257), strings.Repeat("a.", 128), strings.Repeat("a_", 129),
	} {
		check(v)
	}
}
