package lease

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// decodeRecordGeneral is the general strict decoder of a record, whatever
// the spelling, with whether b is canonical: what DecodeRecord's
// canonical path must agree with.
func decodeRecordGeneral(b []byte) (*Record, bool, error) {
	var r Record
	canonical, err := decodeValid("record", b, &r, r.validateStored)
	if err != nil {
		return nil, false, err
	}
	return &r, canonical, nil
}

// agreeWithStrict fails unless the fast path's answer for b is the strict
// path's: accepted only if the strict decoder accepts the same bytes and
// returns an equal record, whose canonical encoding is b itself.
func agreeWithStrict(t *testing.T, b []byte) (accepted bool) {
	t.Helper()
	fast, ok := decodeCanonicalRecord(b)
	if !ok {
		if fast != nil {
			t.Fatalf("declined but returned %+v", fast)
		}
		return false
	}
	slow, canonical, err := decodeRecordGeneral(b)
	if err != nil || !canonical {
		t.Fatalf("fast path accepted what the general decoder rejects or finds non-canonical (%v, %v):\n%s", err, canonical, b)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("fast and strict paths differ:\n%#v\n%#v", fast, slow)
	}
	if enc, err := json.Marshal(fast); err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("fast path accepted non-canonical bytes (%v):\n%s\n%s", err, b, enc)
	}
	return true
}

// The fast path takes every record the backends write: canonical
// encodings, with and without metadata, in every state.
func TestCanonicalRecordFastPathTakesEncodedRecords(t *testing.T) {
	metas := []Metadata{{}, {"k": "v"}, {"n": json.Number("1.50"), "b": true, "z": nil, "s": "a<b & \"c\" é"}}
	for _, st := range []State{StateActive, StateExpired, StateReleased, StateRevoked} {
		for _, m := range metas {
			r := validRecord()
			r.State, r.Metadata, r.TraceID = st, m, ""
			b, err := r.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if !agreeWithStrict(t, b) {
				t.Fatalf("fast path declined a canonical record:\n%s", b)
			}
		}
	}
	// Identity components may be non-ASCII letters.
	id, key, err := CanonicalLockKey(Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "café-ünïcödé-日本", ActorName: "usernamegen"}, DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	r := validRecord()
	r.SetIdentity(id)
	r.LockKey = key
	unicodeRecord, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{
		goldenRecordJSON,
		string(unicodeRecord),
		// Strings are canonical as encoding/json writes them: non-ASCII
		// verbatim, quotes escaped; and a state ending inside a value.
		strings.Replace(goldenRecordJSON, `"metadata":{}`, `"metadata":{"k":"é"}`, 1),
		strings.Replace(goldenRecordJSON, `"metadata":{}`, `"metadata":{"k":",\"state\":\"revoked\"}"}`, 1),
	} {
		if !agreeWithStrict(t, []byte(b)) {
			t.Fatalf("fast path declined a canonical record:\n%s", b)
		}
	}
}

// Bytes that are not exactly a valid canonical record are declined and
// refused, with the general decoder's precise reason where it has one.
func TestCanonicalRecordFastPathDeclinesEverythingElse(t *testing.T) {
	g := goldenRecordJSON
	cases := map[string]string{
		"whitespace":           strings.Replace(g, `"lease_id":`, `"lease_id": `, 1),
		"field order":          strings.Replace(strings.Replace(g, `"job_id":"job_01",`, ``, 1), `"request_id"`, `"job_id":"job_01","request_id"`, 1),
		"escaped letter":       strings.Replace(g, `"lease_01"`, `"lease\u005f01"`, 1),
		"raw HTML character":   strings.Replace(g, `"metadata":{}`, `"metadata":{"k":"<"}`, 1),
		"metadata key order":   strings.Replace(g, `"metadata":{}`, `"metadata":{"b":1,"a":2}`, 1),
		"metadata duplicate":   strings.Replace(g, `"metadata":{}`, `"metadata":{"a":1,"a":2}`, 1),
		"metadata null":        strings.Replace(g, `"metadata":{}`, `"metadata":null`, 1),
		"metadata nested":      strings.Replace(g, `"metadata":{}`, `"metadata":{"a":{}}`, 1),
		"leading zero":         strings.Replace(g, `"fencing_token":42`, `"fencing_token":042`, 1),
		"exponent":             strings.Replace(g, `"ttl_ms":30000`, `"ttl_ms":3e4`, 1),
		"negative":             strings.Replace(g, `"ttl_ms":30000`, `"ttl_ms":-30000`, 1),
		"zero token":           strings.Replace(g, `"fencing_token":42`, `"fencing_token":0`, 1),
		"17 digits":            strings.Replace(g, `"fencing_token":42`, `"fencing_token":10000000000000000`, 1),
		"token past 2^53-1":    strings.Replace(g, `"fencing_token":42`, `"fencing_token":9007199254740992`, 1),
		"timestamp without ms": strings.Replace(g, `"2026-08-05T12:00:00.000Z"`, `"2026-08-05T12:00:00Z"`, 1),
		"timestamp offset":     strings.Replace(g, `"2026-08-05T12:00:00.000Z"`, `"2026-08-05T12:00:00.000+00:00"`, 1),
		"day out of range":     strings.Replace(g, `"2026-08-05T12:00:00.000Z"`, `"2026-02-30T12:00:00.000Z"`, 1),
		"unknown state":        strings.Replace(g, `"state":"active"`, `"state":"stolen"`, 1),
		"version 2":            strings.Replace(g, `"record_version":1`, `"record_version":2`, 1),
		"upper-case tuple":     strings.Replace(g, `"tenant_id":"tenant-main"`, `"tenant_id":"Tenant-Main"`, 1),
		"foreign lock key":     strings.Replace(g, `6UMHT_RTst`, `7UMHT_RTst`, 1),
		"trailing data":        g + "{}",
		"trailing space":       g + " ",
		"truncated":            g[:len(g)-1],
		"unknown field":        strings.Replace(g, `"state":"active"}`, `"state":"active","x":1}`, 1),
		"case-variant key":     strings.Replace(g, `"job_id"`, `"Job_id"`, 1),
		"renewed after expiry": strings.Replace(g, `"renewed_at":"2026-08-05T12:00:20.000Z"`, `"renewed_at":"2026-08-05T12:00:51.000Z"`, 1),
		"control character":    strings.Replace(g, `"trace_01"`, "\"trace\x0101\"", 1),
		"empty lease id":       strings.Replace(g, `"lease_id":"lease_01"`, `"lease_id":""`, 1),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if agreeWithStrict(t, []byte(b)) {
				t.Fatalf("fast path accepted:\n%s", b)
			}
			// DecodeRecord refuses it, with the general decoder's reason
			// if it has one.
			got, err := DecodeRecord([]byte(b))
			if got != nil || err == nil {
				t.Fatalf("DecodeRecord accepted %s", b)
			}
			if _, _, strictErr := decodeRecordGeneral([]byte(b)); strictErr != nil && !reflect.DeepEqual(err, strictErr) {
				t.Fatalf("DecodeRecord = %v; the general decoder says %v", err, strictErr)
			}
		})
	}
}

// BenchmarkDecodeRecord compares DecodeRecord (fast path) with the strict
// path alone, on a canonical record with and without metadata.
func BenchmarkDecodeRecord(b *testing.B) {
	for _, meta := range []struct {
		name string
		m    Metadata
	}{{"no-metadata", Metadata{}}, {"metadata", Metadata{"k": "v", "n": json.Number("3")}}} {
		r := validRecord()
		r.Metadata = meta.m
		enc, err := r.Encode()
		if err != nil {
			b.Fatal(err)
		}
		for _, bm := range []struct {
			name   string
			decode func([]byte) (*Record, error)
		}{{"DecodeRecord", DecodeRecord}, {"strict", func(b []byte) (*Record, error) { r, _, err := decodeRecordGeneral(b); return r, err }}} {
			b.Run(meta.name+"/"+bm.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bm.decode(enc); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// The record's timestamp reader accepts exactly what ParseTimestamp
// accepts, with the same instant: every field's edges, every month's last
// days in leap and common years, and random texts in the layout.
func TestCanonicalTimestampAgreesWithParseTimestamp(t *testing.T) {
	check := func(s string) {
		t.Helper()
		p := canonicalReader{b: []byte(`"` + s + `"`)}
		var got Timestamp
		ok := p.ts(&got)
		want, err := ParseTimestamp(s)
		if ok != (err == nil) || (ok && !reflect.DeepEqual(got, want)) {
			t.Fatalf("%q: reader %v %v, ParseTimestamp %v %v", s, ok, got, want, err)
		}
		if ok && p.off != len(p.b) {
			t.Fatalf("%q: reader stopped at %d of %d", s, p.off, len(p.b))
		}
	}
	for _, y := range []string{"0000", "0001", "1900", "1969", "1970", "2000", "2023", "2024", "2100", "9999"} {
		for _, m := range []string{"00", "01", "02", "04", "12", "13", "99"} {
			for _, d := range []string{"00", "01", "28", "29", "30", "31", "32"} {
				for _, hms := range []string{"00:00:00.000", "23:59:59.999", "24:00:00.000", "23:60:00.000", "23:59:60.000", "12:3a:00.000"} {
					check(y + "-" + m + "-" + d + "T" + hms + "Z")
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	digits := "0123456789"
	for range 200000 {
		b := []byte("2026-08-05T12:00:00.000Z")
		for range 1 + rng.IntN(4) {
			i := rng.IntN(len(b))
			switch rng.IntN(8) {
			case 0:
				b[i] = byte(rng.IntN(256))
			default:
				if b[i] >= '0' && b[i] <= '9' {
					b[i] = digits[rng.IntN(10)]
				}
			}
		}
		check(string(b))
	}
	for _, s := range []string{"", "2026-08-05T12:00:00Z", "2026-08-05T12:00:00.000+00:00", "2026-08-05 12:00:00.000Z", "+026-08-05T12:00:00.000Z"} {
		check(s)
	}
}
