package lease

// Review attacks on the hand-written appenders (record_encode.go) and the
// history fast path (record_canonical.go decodeCanonicalHistory).

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// Metadata values encoding/json treats specially: floats at the edges of
// its two formats, json.Number (written verbatim), json.RawMessage
// (compacted, HTML-escaped), nested maps and Metadata, keys that need
// escaping or spell the entry's own member names. The appenders must write
// json.Marshal's bytes, or fail when it fails.
func TestReviewAppendersMatchJSONOnAdversarialMetadata(t *testing.T) {
	values := []any{
		1e21, 1e20, 1e-6, 1e-7, math.Copysign(0, -1), math.MaxFloat64, math.SmallestNonzeroFloat64, float32(0.1), float32(1e21),
		json.Number("1E+400"), json.Number("-0.0e-0"), json.Number("123456789012345678901234567890"), json.Number("01"),
		json.Number(""), json.RawMessage(` { "a" : [1, 2 ,"<&>"] } `), json.RawMessage(`"\u2028"`), json.RawMessage(`bad`),
		Metadata(nil), Metadata{}, map[string]any{"z": 1, "a": "\u2029"}, []any{1, "x"}, int64(math.MinInt64),
		uint64(math.MaxUint64), true, nil, "\xff", "\u2028<script>&", `,"ended_at":"2026-08-05T12:00:00.000Z"`,
		`"},"state":"active"}`, strings.Repeat("\x7f", 3), math.NaN(), math.Inf(1),
	}
	keys := []string{"a", `,"ended_at":"`, "<k>", "\xfe", "\u2028", "state", "", `"`}
	for i, v := range values {
		for _, k := range keys {
			r := validRecord()
			r.Metadata = Metadata{k: v, "ended_at": "2026-08-05T12:00:00.000Z", "zz": 1}
			want, werr := json.Marshal(r)
			got, gerr := appendRecord(nil, r)
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("value %d (%#v), key %q: json error %v, appender error %v", i, v, k, werr, gerr)
			}
			if werr == nil && !bytes.Equal(got, want) {
				t.Fatalf("value %d (%#v), key %q differs:\n got %s\nwant %s", i, v, k, got, want)
			}
			r.State = StateReleased
			h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: r, EndedAt: r.RenewedAt.Add(1000), Reason: k}
			want, werr = json.Marshal(h)
			got, gerr = appendHistoryEntry(nil, h)
			if (werr == nil) != (gerr == nil) || werr == nil && !bytes.Equal(got, want) {
				t.Fatalf("history, value %d (%#v), key %q: (%v, %v)\n got %s\nwant %s", i, v, k, werr, gerr, got, want)
			}
			// Whatever the bytes, the fast path agrees with the strict
			// decoder on them.
			if werr == nil {
				agreeHistoryWithStrict(t, got)
				agreeWithStrict(t, mustAppendRecord(t, r))
			}
		}
	}
}

func mustAppendRecord(t *testing.T, r *Record) []byte {
	t.Helper()
	b, err := appendRecord(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Crafted entries around the fast path's cut (the last `,"ended_at":"`):
// metadata or a reason that spells it, an entry whose real ended_at is
// missing, moved or repeated, optional members empty, escaped, repeated or
// out of order, a record that is not the entry's first member. The fast
// path must decline or agree with the strict decoder.
func TestReviewHistoryFastPathCutAttacks(t *testing.T) {
	base := goldenHistory(t, func(h *HistoryEntry) {
		h.Record.Metadata = Metadata{"a": 1, "ended_at": "2026-08-05T12:00:00.000Z"}
		h.EndedBy, h.RequestID, h.Reason, h.IncidentID = "prn_admin", "req_9", "why", "inc-1"
	})
	i := strings.LastIndex(base, `,"ended_at":"`)
	head, tail := base[:i], base[i:] // head: the entry up to its ended_at
	rec := strings.TrimPrefix(head, `{"history_version":1,"record":`)
	endedAt := tail[len(`,"ended_at":`) : len(`,"ended_at":`)+len(`"2026-08-05T12:00:00.000Z"`)]
	inputs := []string{
		base,
		head + `}`, // no ended_at at all: only the metadata's
		head + `,"ended_at":` + endedAt + `,"ended_at":` + endedAt + `}`,
		head + `,"ended_at":` + endedAt + `,"ended_by":""}`,
		head + `,"ended_at":` + endedAt + `,"ended_by":"prn\u005fadmin"}`,
		head + `,"ended_at":` + endedAt + `,"reason":"r","ended_by":"prn_admin"}`,
		head + `,"ended_at":` + endedAt + `,"reason":"r","reason":"r"}`,
		head + `,"ended_at":` + endedAt + `,"reason":"\",\"ended_at\":\"2026-08-05T12:00:00.000Z"}`,
		head + `,"ended_at":` + endedAt + `,"Reason":"r"}`,
		head + `,"ended_at":` + endedAt + `} `,
		head + `,"ended_at":` + endedAt + `,"incident_id":null}`,
		`{"record":` + rec + `,"history_version":1,"ended_at":` + endedAt + `}`,
		`{"history_version":1,"ended_at":` + endedAt + `,"record":` + rec + `}`,
		`{"history_version":1,"record":` + rec + `,"ended_at":` + endedAt + `,"record":` + rec + `,"ended_at":` + endedAt + `}`,
		`{"history_version":1,"record":{"record":1},"ended_at":` + endedAt + `}`,
		`{"history_version":01,"record":` + rec + `,"ended_at":` + endedAt + `}`,
		strings.Replace(base, `"state":"released"`, `"state":"active"`, 1),
		strings.Replace(base, `"ended_at":"2026`, `"ended_at":"+2026`, 1),
		strings.Replace(base, `"metadata":{"a":1,`, `"metadata":{"a":1.0,`, 1),
		strings.Replace(base, `"metadata":{"a":1,`, `"metadata":{"a":1e0,`, 1),
		strings.Replace(base, `"metadata":{"a":1,`, `"metadata":{"a":1,"a":1,`, 1),
		strings.Replace(base, `"metadata":{"a":1,`, `"metadata":{"a":1,"A":1,`, 1),
	}
	for n, in := range inputs {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("input %d panicked: %v\n%s", n, p, in)
				}
			}()
			agreeHistoryWithStrict(t, []byte(in))
			if h, err := DecodeHistoryEntry([]byte(in)); err == nil {
				if enc, err := h.Encode(); err != nil || string(enc) != in {
					t.Fatalf("input %d decoded but is not its entry's encoding:\n%s\n%s", n, in, enc)
				}
			}
		}()
	}
}
