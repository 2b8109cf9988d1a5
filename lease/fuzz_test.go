package lease

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzNormalizeIdentifier: never panics; a rejection is an invalid_request
// naming the field; an accepted value is a fixed point of normalization,
// valid UTF-8 NFC lower case of 1..256 bytes without forbidden characters.
func FuzzNormalizeIdentifier(f *testing.F) {
	for _, s := range []string{
		"tenant-main", "Target_01", " café ", "cafe\u0301", "\u212Aey", "a..b", "a/b", "a\\b", "*", "[x]", "{x}",
		".a", "-a", ":a", "_a", "a b", "a\tb", "\x00", "\xff", "\u0130", "\u023a", strings.Repeat("a", 256),
		strings.Repeat("a", 257), "\u0085", "\u00a0x", "a\u0301\u0301", "\u1e9e", "ǅ", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		// The fast paths agree with the general rule.
		if utf8.ValidString(raw) && foldIdentifier(raw) != foldUnicode(raw) {
			t.Fatalf("ASCII fold of %q is %q, NFC fold %q", raw, foldIdentifier(raw), foldUnicode(raw))
		}
		if plainASCIIIdentifier(raw) && checkIdentifierRunes("f", raw) != nil {
			t.Fatalf("%q taken as plain but the rule rejects it: %v", raw, checkIdentifierRunes("f", raw))
		}
		parts := []string{"v1", raw, strings.ToUpper(raw)}
		if want, _ := json.Marshal(parts); !bytes.Equal(jsonStringArray(parts), want) {
			t.Fatalf("jsonStringArray(%q) = %s, json.Marshal %s", parts, jsonStringArray(parts), want)
		}
		n, err := NormalizeIdentifier("lock_identity.target_id", raw)
		if err != nil {
			var le *Error
			if !errors.As(err, &le) || le.Code != CodeInvalidRequest || le.Field != "lock_identity.target_id" || le.Reason == "" {
				t.Fatalf("NormalizeIdentifier(%q) error %#v", raw, err)
			}
			if n != "" {
				t.Fatalf("rejected %q but returned %q", raw, n)
			}
			return
		}
		checkNormalizedIdentifier(t, raw, n)
		// Opaque-id rule is at least as strict for ASCII: an accepted
		// lowercase ASCII identifier is also a valid opaque id.
		if isASCII(n) {
			if err := CheckOpaqueID("x", n); err != nil {
				t.Fatalf("%q accepted as identifier but not as opaque id: %v", n, err)
			}
		}
	})
}

// FuzzCanonicalLockKey: an accepted identity's key has the prefix and a
// 43-character base64url SHA-256 suffix, equals the independent derivation,
// and normalizing the normalized identity gives the same identity and key.
func FuzzCanonicalLockKey(f *testing.F) {
	f.Add("tenant-main", "program-a", "starintel-target", "target_01", "usernamegen", "default", "default")
	f.Add("Tenant-Main", "PROGRAM-A", " starintel-target ", "Target_01", "UserNameGen", "", "")
	f.Add("acme", "cafe\u0301", "ns", "t1", "actor", "wf", "fast")
	f.Add("ab", "c", "n", "x", "y", "w", "bulk")
	f.Add("a", "bc", "n", "x", "y", "w", "BULK")
	f.Add("a/b", "p", "n", "x", "y", "w", "default")
	f.Add("t", "p", "n", "x", "y", "\u0085", "default")
	classes, err := NewOperationClasses("fast", "bulk")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tenant, program, ns, target, actor, workflow, class string) {
		raw := Identity{tenant, program, ns, target, actor, workflow, class}
		id, key, err := CanonicalLockKey(raw, classes)
		if err != nil {
			var le *Error
			if !errors.As(err, &le) || le.Code != CodeInvalidRequest || !strings.HasPrefix(le.Field, "lock_identity.") {
				t.Fatalf("CanonicalLockKey(%+v) error %#v", raw, err)
			}
			if key != "" || id != (Identity{}) {
				t.Fatalf("rejected identity returned %+v %q", id, key)
			}
			return
		}
		if !strings.HasPrefix(key, KeyPrefix) {
			t.Fatalf("key %q lacks prefix", key)
		}
		suffix := key[len(KeyPrefix):]
		if len(suffix) != 43 {
			t.Fatalf("suffix %q has %d chars", suffix, len(suffix))
		}
		if sum, err := base64.RawURLEncoding.DecodeString(suffix); err != nil || len(sum) != 32 {
			t.Fatalf("suffix %q is not base64url SHA-256: %v", suffix, err)
		}
		if want := independentKey(t, id); key != want {
			t.Fatalf("key %q, independent %q", key, want)
		}
		if !classes.Contains(id.OperationClass) {
			t.Fatalf("operation_class %q outside the configured set", id.OperationClass)
		}
		for _, v := range []string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass} {
			checkNormalizedIdentifier(t, v, v)
		}
		id2, key2, err := CanonicalLockKey(id, classes)
		if err != nil || id2 != id || key2 != key {
			t.Fatalf("renormalizing %+v gave %+v %q %v; want %q", id, id2, key2, err, key)
		}
		// The strict decoder's canonical-tuple check agrees.
		if f, ok := id.isCanonical(); !ok {
			t.Fatalf("normalized identity not canonical at %s", f)
		}
	})
}

// FuzzDecodeRecord: never panics; rejections are corrupt; an accepted record
// re-encodes, decodes to an equal record, and its lock_key hashes from its tuple.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(goldenRecordJSON))
	f.Add([]byte(strings.Replace(goldenRecordJSON, `"metadata":{}`, `"metadata":{"k":"v","n":1.50,"b":true,"z":null}`, 1)))
	f.Add([]byte(strings.Replace(goldenRecordJSON, `"state":"active"`, `"state":"revoked"`, 1)))
	f.Add([]byte(strings.Replace(goldenRecordJSON, `"record_version":1`, `"record_version":2`, 1)))
	f.Add([]byte(strings.Replace(goldenRecordJSON, `"tenant_id":"tenant-main"`, `"tenant_id":"Tenant-Main"`, 1)))
	f.Add([]byte(goldenRecordJSON + "{}"))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"record_version":1,`))
	f.Add([]byte(strings.Replace(goldenRecordJSON, `"metadata":{}`, `"metadata":{"k":"é","q":"\"<"}`, 1)))
	f.Add([]byte(strings.Replace(goldenRecordJSON, `"2026-08-05T12:00:00.000Z"`, `"2024-02-29T23:59:59.999Z"`, 1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		agreeWithStrict(t, b) // the fast path answers only as the strict one does
		r, err := DecodeRecord(b)
		if err != nil {
			var le *Error
			if !errors.As(err, &le) || le.Code != CodeCorrupt || r != nil {
				t.Fatalf("DecodeRecord error %#v, record %v", err, r)
			}
			return
		}
		if r.LockKey != independentKey(t, r.Identity()) {
			t.Fatalf("accepted lock_key %q does not hash from tuple %+v", r.LockKey, r.Identity())
		}
		if r.RecordVersion != 1 || !r.State.Valid() || r.FencingToken < 1 || r.FencingToken > MaxFencingToken {
			t.Fatalf("accepted out-of-bounds record %+v", r)
		}
		if r.ExpiresAt.UnixMilli() > r.AcquiredAt.UnixMilli()+r.MaximumLifetimeMs || r.RenewedAt.Before(r.AcquiredAt) {
			t.Fatalf("accepted record breaks the lifetime bound: %+v", r)
		}
		enc, err := r.Encode()
		if err != nil {
			t.Fatalf("accepted record does not re-encode: %v", err)
		}
		r2, err := DecodeRecord(enc)
		if err != nil {
			t.Fatalf("re-encoded record rejected: %v\n%s", err, enc)
		}
		if !reflect.DeepEqual(normMeta(r), r2) {
			t.Fatalf("round trip differs:\n%#v\n%#v", r, r2)
		}
		enc2, err := r2.Encode()
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable: %v\n%s\n%s", err, enc, enc2)
		}
	})
}
