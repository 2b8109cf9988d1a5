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
