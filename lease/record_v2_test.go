package lease

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// Random records, hostile metadata and identities included, through
// CompactRecord and DecodeStoredRecord: whatever Encode accepts reads back
// as exactly its version 1 encoding, whatever it refuses CompactRecord
// refuses, and an rv2 record has its facts on their own lines (no
// metadata shifted one).
func TestCompactRecordRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(20261204))
	var v2, v1only, refused int
	for i := 0; i < 20000; i++ {
		rec := rhEntry(r).Record
		v1, encErr := rec.Encode()
		b, err := CompactRecord(rec)
		if encErr != nil {
			refused++
			if err == nil {
				t.Fatalf("record Encode refuses (%v) was compacted: %q", encErr, b)
			}
			continue
		}
		if err != nil {
			t.Fatalf("CompactRecord refused a record Encode takes: %v", err)
		}
		got, err := DecodeStoredRecord(b)
		if err != nil {
			t.Fatalf("stored %q does not read back: %v", b, err)
		}
		if again, _ := got.Encode(); !bytes.Equal(again, v1) {
			t.Fatalf("read back\n%s\nwant\n%s", again, v1)
		}
		if again, _ := CompactRecord(got); !bytes.Equal(again, b) {
			t.Fatalf("re-compacted\n%q\nstored\n%q", again, b)
		}
		if !bytes.HasPrefix(b, []byte(RecordV2Prefix)) {
			v1only++
			if !bytes.Equal(b, v1) {
				t.Fatalf("fallback is not version 1: %q", b)
			}
			continue
		}
		v2++
		lines := strings.Split(string(b), "\n")
		if len(lines) != Rv2Lines || lines[Rv2Tuple+3] != rec.TargetID || lines[Rv2Record] != rec.LeaseID ||
			lines[Rv2Record+5] != fmt.Sprint(rec.FencingToken) || lines[Rv2Record+15] != string(rec.State) {
			t.Fatalf("lines shifted (%d lines): %q", len(lines), b)
		}
		if len(b) >= len(v1) {
			t.Fatalf("version 2 (%d bytes) is not smaller than version 1 (%d)", len(b), len(v1))
		}
	}
	t.Logf("%d version 2, %d version 1 fallbacks, %d refused", v2, v1only, refused)
	// (A record Encode takes always fits version 2 today: identifiers
	// and tuples are plain text, metadata one JSON object; the version 1
	// fallback is for anything that someday does not.)
	if v2 == 0 || refused == 0 {
		t.Fatalf("the grid does not cover both outcomes: %d v2, %d refused", v2, refused)
	}
}

// Corrupt rv2 records: one that decodes must be the one canonical rv2
// spelling of what it decodes to, so nothing was guessed; everything else
// is corrupt.
func TestDecodeStoredRecordFailsClosed(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	var seeds [][]byte
	for _, edit := range []func(*Record){
		func(*Record) {},
		func(rec *Record) { rec.Metadata = Metadata{"n": 1.5, "s": "x"}; rec.TraceID = "" },
		func(rec *Record) { rec.State = StateExpired },
	} {
		rec := validRecord()
		edit(rec)
		b, err := CompactRecord(rec)
		if err != nil || !bytes.HasPrefix(b, []byte(RecordV2Prefix)) {
			t.Fatalf("seed: %q, %v", b, err)
		}
		seeds = append(seeds, b)
	}
	c := spellings[*Record]{decode: DecodeStoredRecord, compact: CompactRecord}
	for _, seed := range seeds {
		muts := rhMutations(seed, r)
		muts = append(muts, []byte("rv2"), []byte("rv2\n"), []byte("RV2\n"+string(seed[4:])), []byte("rv2\r\n"+string(seed[4:])))
		for _, m := range muts {
			c.check(t, m)
		}
	}
	t.Logf("%d mutations accepted (each canonical), %d refused", c.accepted, c.refused)
	if c.refused == 0 {
		t.Fatal("no mutation was refused")
	}
}

// An rv2 record whose hash tag is another identity's (a record moved or
// spliced) is corrupt: the tag must be the tuple's lock key.
func TestCompactRecordForeignTag(t *testing.T) {
	rec := validRecord()
	b, err := CompactRecord(rec)
	if err != nil || !bytes.HasPrefix(b, []byte(RecordV2Prefix)) {
		t.Fatalf("%q, %v", b, err)
	}
	other := contractIdentity()
	other.TargetID = "another-target"
	otherTag, _ := strings.CutPrefix(other.lockKeyOfCanonical(), KeyPrefix)
	lines := strings.Split(string(b), "\n")
	lines[Rv2Tag] = otherTag
	if _, err := DecodeStoredRecord([]byte(strings.Join(lines, "\n"))); CodeOf(err) != CodeCorrupt {
		t.Fatalf("foreign tag: %v, want corrupt", err)
	}
	// And a version 1 record still reads as it did.
	v1, _ := rec.Encode()
	got, err := DecodeStoredRecord(v1)
	if err != nil || got.LeaseID != rec.LeaseID {
		t.Fatalf("version 1: %v", err)
	}
}
