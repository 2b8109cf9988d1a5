package lease

import (
	"reflect"
	"strconv"
	"testing"
)

// The record memo answers exactly as its decoder, hands out copies and
// stays bounded.
func TestRecordMemo(t *testing.T) {
	rec := validRecord()
	rec.Metadata = Metadata{"k": "v"}
	raw, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	mm := NewRecordMemo(DecodeRecord)
	want, _ := DecodeRecord(raw)
	first, err := mm.Decode(raw)
	if err != nil || !reflect.DeepEqual(first, want) {
		t.Fatalf("first decode: %v %+v", err, first)
	}
	first.Metadata["k"] = "changed"
	first.State = StateReleased
	second, err := mm.Decode(raw)
	if err != nil || !reflect.DeepEqual(second, want) {
		t.Fatalf("a hit differs from DecodeRecord (or a caller's change leaked): %v %+v", err, second)
	}
	bad := append(append([]byte{}, raw...), 'x')
	for i := 0; i < 2; i++ {
		if _, err := mm.Decode(bad); CodeOf(err) != CodeCorrupt {
			t.Fatalf("trailing data: %v", err)
		}
	}
	for i := 0; i < RecordMemoMax+10; i++ {
		c := rec.Clone()
		c.FencingToken = uint64(i + 1)
		b, err := c.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := mm.Decode(b); err != nil || got.FencingToken != uint64(i+1) {
			t.Fatalf("record %s: %v", strconv.Itoa(i), err)
		}
	}
	if n := mm.Len(); n > RecordMemoMax {
		t.Fatalf("memo holds %d entries, bound %d", n, RecordMemoMax)
	}
}

// A memo answers with its own decoder only: one of DecodeRecord refuses a
// version 2 record (the Valkey adapter stores version 1 alone), one of
// DecodeStoredRecord reads it.
func TestRecordMemoKeepsItsDecoder(t *testing.T) {
	rec := validRecord()
	v2, err := CompactRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewRecordMemo(DecodeRecord).Decode(v2); CodeOf(err) != CodeCorrupt {
		t.Fatalf("version 1 memo: %v, want corrupt", err)
	}
	got, err := NewRecordMemo(DecodeStoredRecord).Decode(v2)
	if err != nil || got.LeaseID != rec.LeaseID {
		t.Fatalf("stored-record memo: %v", err)
	}
}
