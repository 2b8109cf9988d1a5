package lease

import (
	"strings"
	"testing"
)

// CompactEvidence writes version 2 whenever it can carry the result, and
// what readers rebuild from it is byte for byte the version 1 encoding, so
// replay answers the same from either; metadata values that break line
// formats (newlines, separators, fake lines, quotes, HTML) are carried
// inside the JSON line and come back unchanged.
func TestCompactEvidenceRoundTrip(t *testing.T) {
	metas := []Metadata{nil, {}, {"a": "b", "n": 1.5, "t": true, "z": nil},
		{"nl": "a\nb\r\nc", "lines": "\nlease_01\nev2\nacquire\n", "quote": `"},"state":"released"` + "\n",
			"html": "<script>&amp;</script>", "seps": "\u2028\u2029\u0085", "uni": "ünïcödé 😀", "bs": `\\n \"`}}
	for _, meta := range metas {
		for _, state := range []State{StateActive, StateReleased, StateRevoked, StateExpired} {
			e := validIdem()
			e.Lease.Metadata, e.Lease.State = meta, state
			v1, err := e.Encode()
			if err != nil {
				t.Fatal(err)
			}
			b, err := CompactEvidence(e, e.Lease.Identity())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(b), EvidenceV2Prefix) {
				t.Fatalf("metadata %v, state %s: not version 2: %q", meta, state, b)
			}
			if len(b) >= len(v1)*2/3 {
				t.Errorf("version 2 is %d bytes, version 1 %d: want under two thirds", len(b), len(v1))
			}
			back, ok := ExpandEvidence(string(b), e.Lease.Identity())
			if !ok || back != string(v1) {
				t.Fatalf("metadata %v: rebuilt\n%s\nwant\n%s", meta, back, v1)
			}
			got, err := DecodeIdempotencyRecord([]byte(back))
			if err != nil || got.Lease.FencingToken != e.Lease.FencingToken || got.BackendTime != e.BackendTime || got.Lease.State != state {
				t.Fatalf("decoded %+v, %v", got, err)
			}
		}
	}
}

// What version 2 cannot rebuild exactly is stored in version 1: evidence
// read for another identity than the record's (the tuple is rebuilt from
// the request), and invalid evidence is refused as Encode refuses it.
func TestCompactEvidenceFallsBackOrRefuses(t *testing.T) {
	e := validIdem()
	other := e.Lease.Identity()
	other.TargetID = "target_other"
	b, err := CompactEvidence(e, other)
	v1, _ := e.Encode()
	if err != nil || string(b) != string(v1) {
		t.Fatalf("a foreign identity: %q, %v; want the version 1 encoding", b, err)
	}
	e.Digest = "short"
	if _, err := CompactEvidence(e, e.Lease.Identity()); err == nil {
		t.Fatal("invalid evidence was encoded")
	}
}

// CompactHistory writes version 2 whenever it can carry the entry, and
// DecodeStoredHistory reads back exactly the entry, whatever the reason
// text and metadata hold; a version 1 entry reads as before.
func TestCompactHistoryRoundTrip(t *testing.T) {
	reasons := []string{"", "compromised host", `quote " backslash \ slash / \n \u0000`,
		`","ended_by":"prn_forged"} hv2 `, "ünïcödé 😀 <b>&amp;</b>"}
	metas := []Metadata{nil, {"nl": "a\nb", "quote": `"},"state":"active"`, "html": "<&>"}}
	for _, reason := range reasons {
		for _, meta := range metas {
			for _, state := range []State{StateReleased, StateRevoked, StateExpired} {
				h := validHistory()
				h.Reason, h.Record.Metadata, h.Record.State = reason, meta, state
				if reason == "" {
					h.EndedBy, h.RequestID, h.IncidentID = "", "", ""
				}
				v1, err := h.Encode()
				if err != nil {
					t.Fatal(err)
				}
				b, err := CompactHistory(h)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(string(b), HistoryV2Prefix) || len(b) >= len(v1)*3/4 {
					t.Fatalf("reason %q: not version 2 at under three quarters of %d bytes: %q", reason, len(v1), b)
				}
				for _, stored := range [][]byte{b, v1} {
					got, err := DecodeStoredHistory(stored)
					if err != nil {
						t.Fatalf("reason %q: %v", reason, err)
					}
					if again, _ := got.Encode(); string(again) != string(v1) {
						t.Fatalf("reason %q: read back\n%s\nwant\n%s", reason, again, v1)
					}
				}
			}
		}
	}
}

// A version 2 entry that does not rebuild is corrupt, not a guess.
func TestDecodeStoredHistoryFailsClosed(t *testing.T) {
	b, err := CompactHistory(validHistory())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for name, edit := range map[string]func([]string) []string{
		"token spelled otherwise": func(f []string) []string { f[Hv2Record+5] = "0" + f[Hv2Record+5]; return f },
		"reason not JSON":         func(f []string) []string { f[Hv2Reason] = `"open`; return f },
		"a line missing":          func(f []string) []string { return append(f[:Hv2By:Hv2By], f[Hv2By+1:]...) },
		"quote in the tuple":      func(f []string) []string { f[Hv2Tuple+3] += `"`; return f },
	} {
		bad := strings.Join(edit(append([]string(nil), lines...)), "\n")
		if _, err := DecodeStoredHistory([]byte(bad)); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: %v, want corrupt", name, err)
		}
	}
}
