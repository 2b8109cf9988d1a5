package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// agreeHistoryWithStrict fails unless the history fast path's answer for b
// is the strict path's: accepted only if the general decoder accepts the
// same bytes as canonical and returns an equal entry that encodes to b.
func agreeHistoryWithStrict(t *testing.T, b []byte) (accepted bool) {
	t.Helper()
	fast, ok := decodeCanonicalHistory(b)
	if !ok {
		if fast != nil {
			t.Fatalf("declined but returned %+v", fast)
		}
		return false
	}
	var slow HistoryEntry
	canonical, err := decodeValid("history", b, &slow, func() error { return slow.validate(true) })
	if err != nil || !canonical {
		t.Fatalf("fast path accepted what the general decoder rejects or finds non-canonical (%v, %v):\n%s", err, canonical, b)
	}
	if !reflect.DeepEqual(fast, &slow) {
		t.Fatalf("fast and strict paths differ:\n%#v\n%#v", fast, &slow)
	}
	if enc, err := json.Marshal(fast); err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("fast path accepted non-canonical bytes (%v):\n%s\n%s", err, b, enc)
	}
	return true
}

func goldenHistory(t testing.TB, mutate func(*HistoryEntry)) string {
	t.Helper()
	r := validRecord()
	r.State = StateReleased
	h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: r, EndedAt: r.RenewedAt.Add(1000)}
	if mutate != nil {
		mutate(h)
	}
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The fast path takes every entry the backends write, including metadata
// that spells the entry's own member names.
func TestCanonicalHistoryFastPathTakesEncodedEntries(t *testing.T) {
	for name, mutate := range map[string]func(*HistoryEntry){
		"bare": nil,
		"all": func(h *HistoryEntry) {
			h.EndedBy, h.RequestID, h.Reason, h.IncidentID = "prn_admin", "req_9", "stop now, é", "inc-1"
		},
		"revoked":  func(h *HistoryEntry) { h.Record.State, h.Reason = StateRevoked, "r" },
		"expired":  func(h *HistoryEntry) { h.Record.State = StateExpired },
		"metadata": func(h *HistoryEntry) { h.Record.Metadata = Metadata{"a": 1.5, "ended_at": "2026-08-05T12:00:00.000Z"} },
	} {
		b := goldenHistory(t, mutate)
		if !agreeHistoryWithStrict(t, []byte(b)) {
			t.Fatalf("%s: fast path declined a canonical entry:\n%s", name, b)
		}
	}
	// A string that needs escaping is left to the general decoder, which
	// reads the same entry.
	for _, reason := range []string{`said "stop" <now> & é`, `,"ended_at":"2026-08-05T12:00:00.000Z"`} {
		b := goldenHistory(t, func(h *HistoryEntry) { h.Reason = reason })
		agreeHistoryWithStrict(t, []byte(b))
		if h, err := DecodeHistoryEntry([]byte(b)); err != nil || h.Reason != reason {
			t.Fatalf("DecodeHistoryEntry(%s) = %v, %v", b, h, err)
		}
	}
}

// Bytes that are not exactly a valid canonical entry are declined, and
// DecodeHistoryEntry refuses them as corrupt.
func TestCanonicalHistoryFastPathDeclinesEverythingElse(t *testing.T) {
	g := goldenHistory(t, func(h *HistoryEntry) { h.EndedBy, h.RequestID = "prn_admin", "req_9" })
	cases := map[string]string{
		"empty member present": strings.Replace(g, `}`, `,"reason":""}`, 1),
		"member order":         strings.Replace(g, `,"ended_by":"prn_admin","request_id":"req_9"`, `,"request_id":"req_9","ended_by":"prn_admin"`, 1),
		"whitespace":           strings.Replace(g, `,"ended_at":`, `, "ended_at":`, 1),
		"trailing data":        g + " ",
		"truncated":            g[:len(g)-1],
		"unknown member":       strings.TrimSuffix(g, "}") + `,"x":1}`,
		"version 2":            strings.Replace(g, `{"history_version":1`, `{"history_version":2`, 1),
		"active record":        strings.Replace(g, `"state":"released"`, `"state":"active"`, 1),
		"no ended_at":          g[:strings.LastIndex(g, `,"ended_at":`)] + "}",
		"bad ended_by":         strings.Replace(g, `"ended_by":"prn_admin"`, `"ended_by":"prn admin"`, 1),
		"escaped letter":       strings.Replace(g, `"req_9"`, `"req\u005f9"`, 1),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if agreeHistoryWithStrict(t, []byte(b)) {
				t.Fatalf("fast path accepted:\n%s", b)
			}
			h, err := DecodeHistoryEntry([]byte(b))
			var le *Error
			if h != nil || !errors.As(err, &le) || le.Code != CodeCorrupt {
				t.Fatalf("DecodeHistoryEntry = %v, %v; want corrupt", h, err)
			}
		})
	}
}

// FuzzDecodeHistoryEntry: the fast path answers only as the strict one
// does, for any bytes.
func FuzzDecodeHistoryEntry(f *testing.F) {
	f.Add([]byte(goldenHistory(f, nil)))
	f.Add([]byte(goldenHistory(f, func(h *HistoryEntry) { h.EndedBy, h.RequestID, h.Reason, h.IncidentID = "a", "b", "c", "d" })))
	f.Add([]byte(goldenHistory(f, func(h *HistoryEntry) { h.Record.Metadata = Metadata{"a": 1.0, "ended_at": "x"} })))
	f.Add([]byte(`{"history_version":1,"record":null,"ended_at":"2026-08-05T12:00:00.000Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		agreeHistoryWithStrict(t, b)
		h, err := DecodeHistoryEntry(b)
		if err != nil {
			var le *Error
			if !errors.As(err, &le) || le.Code != CodeCorrupt || h != nil {
				t.Fatalf("DecodeHistoryEntry error %#v, entry %v", err, h)
			}
			return
		}
		enc, err := h.Encode()
		if err != nil || !bytes.Equal(normHistory(t, enc), normHistory(t, b)) && !bytes.Equal(enc, b) {
			t.Fatalf("accepted entry does not re-encode to itself: %v\n%s\n%s", err, b, enc)
		}
	})
}

// normHistory re-encodes b through the general decoder (metadata numbers
// may be spelled differently before canonicalization).
func normHistory(t *testing.T, b []byte) []byte {
	var h HistoryEntry
	if err := json.Unmarshal(b, &h); err != nil {
		return b
	}
	out, _ := json.Marshal(&h)
	return out
}
