package lease

import (
	"math/rand"
	"strings"
	"testing"
)

// ATTACK (property): random metadata strings and keys built from the bytes
// and runes that matter to a line format or to JSON (newline, CR, NUL,
// quote, backslash, braces, U+2028/2029/0085, "ev2", invalid UTF-8). For
// every record CompactEvidence either stores version 1 as Encode writes
// it, or version 2 whose expansion for the record's identity is exactly
// Encode's bytes; and the version 2 read for any other identity never
// decodes (it must not answer another identity's request). Regression
// test: the attack did not break the code.
func TestReviewEv2CompactEvidenceProperty(t *testing.T) {
	rng := rand.New(rand.NewSource(20261204))
	atoms := []string{"\n", "\r", "\x00", `"`, `\`, "{", "}", ",", ":", "\u2028", "\u2029", "\u0085", "ev2", "\xff",
		"a", "Z", "é", "😀", " ", "\t", "null", "lease_", "<", ">", "&"}
	word := func() string {
		var b strings.Builder
		for n := rng.Intn(8); n >= 0; n-- {
			b.WriteString(atoms[rng.Intn(len(atoms))])
		}
		return b.String()
	}
	keys := []string{"note", "k2", "é", "x.y", "a-b"}
	v2s := 0
	for i := 0; i < 3000; i++ {
		e := validIdem()
		m := Metadata{}
		for n := rng.Intn(4); n > 0; n-- {
			m[keys[rng.Intn(len(keys))]] = word()
		}
		e.Lease.Metadata = m
		v1, err := e.Encode()
		if err != nil {
			continue // Encode refuses it; CompactEvidence must too
		}
		id := e.Lease.Identity()
		b, err := CompactEvidence(e, id)
		if err != nil {
			t.Fatalf("metadata %q: %v", m, err)
		}
		if !strings.HasPrefix(string(b), EvidenceV2Prefix) {
			if string(b) != string(v1) {
				t.Fatalf("metadata %q: neither version 2 nor Encode's bytes: %q", m, b)
			}
			continue
		}
		v2s++
		back, ok := ExpandEvidence(string(b), id)
		if !ok || back != string(v1) {
			t.Fatalf("metadata %q: rebuilt %q, want %q", m, back, v1)
		}
		other := id
		other.TargetID = "target-other"
		if back, ok := ExpandEvidence(string(b), other); ok {
			if _, err := DecodeIdempotencyRecord([]byte(back)); err == nil {
				t.Fatalf("metadata %q: version 2 decodes for another identity", m)
			}
		}
	}
	if v2s == 0 {
		t.Fatal("no record was stored in version 2")
	}
	t.Logf("%d of 3000 stored in version 2", v2s)
}
