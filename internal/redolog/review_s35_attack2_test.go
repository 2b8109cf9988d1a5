package redolog

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// s35a2Seg is the only segment file of dir.
func s35a2Seg(t *testing.T, dir string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+suffix))
	if err != nil || len(m) != 1 {
		t.Fatalf("segments %v, %v", m, err)
	}
	return m[0]
}

// FINDING candidate. A torn last record: the record's header straddles a
// 512-byte sector boundary (offset 504), and the sector holding its
// length and checksum did not reach the disk while the next sector (its
// seq and payload) did. The record was never acknowledged: the log must
// read it as a torn tail. followedByNext, which checks no salt, reads
// the zero length as an empty record and the first 16 payload bytes as
// "the frame numbered next+1", and fails Open with ErrCorrupt. The salt
// was meant to keep payload bytes from ever reading as a record.
func TestS35A2TornHeaderPayloadLooksLikeNextFrame(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, 1, Options{SegmentSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	// Record 1: 16 + 472 bytes, so record 2 starts at 16+488 = 504.
	if _, err := l.Append(make([]byte, 472)); err != nil {
		t.Fatal(err)
	}
	if l.off != 504 {
		t.Fatalf("record 2 at %d", l.off)
	}
	// Record 2's payload: its first 16 bytes are a frame header (length
	// 0, seq 3) -- caller data the salt is meant to make harmless.
	p := make([]byte, 64)
	binary.BigEndian.PutUint64(p[8:], 3)
	for i := 16; i < len(p); i++ {
		p[i] = 'v'
	}
	if _, err := l.Append(p); err != nil {
		t.Fatal(err)
	}
	l.Close()
	// The torn write: sector 0's new bytes [504, 512) (length, checksum)
	// did not land; sector 1 ([512, ...): seq, payload) did.
	patch(t, s35a2Seg(t, dir), 504, make([]byte, 8))
	l, recs, err := Open(dir, 1, Options{SegmentSize: 1 << 16})
	if err != nil {
		t.Fatalf("open after a torn last record: %v (false corruption: the log, and the store, no longer open)", err)
	}
	defer l.Close()
	if len(recs) != 1 || recs[0].Seq != 1 {
		t.Fatalf("records %v, want just record 1", recs)
	}
	if seq, err := l.Append([]byte("after")); err != nil || seq != 2 {
		t.Fatalf("append after the torn tail: %d, %v", seq, err)
	}
}

// A failed append whose bytes did reach the file (write done, fdatasync
// failed): Recover zeroes them durably, the next append takes the same
// number, and after reopening only the new record is there -- never the
// failed one.
func TestS35A2RecoverAfterWriteLandedFsyncFailed(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 1 << 16}
	l, _, err := Open(dir, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append([]byte("one")); err != nil {
		t.Fatal(err)
	}
	// Append of record 2 whose write landed but whose fdatasync failed.
	big := make([]byte, 300)
	for i := range big {
		big[i] = 'F'
	}
	rec := make([]byte, headerSize+len(big))
	l.encode(rec, 2, big)
	if _, err := l.f.WriteAt(rec, l.off); err != nil {
		t.Fatal(err)
	}
	l.failed, l.failedEnd = errors.New("injected fdatasync failure"), l.off+int64(len(rec))
	if _, err := l.Append([]byte("refused")); !errors.Is(err, ErrFailed) {
		t.Fatalf("append after failure: %v", err)
	}
	if err := l.Recover(); err != nil {
		t.Fatal(err)
	}
	if seq, err := l.Append([]byte("two")); err != nil || seq != 2 {
		t.Fatalf("append after Recover: %d, %v", seq, err)
	}
	l.Close()
	l, recs, err := Open(dir, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if len(recs) != 2 || string(recs[1].Payload) != "two" {
		t.Fatalf("records after reopen: %d %v", len(recs), recs)
	}
	// Nothing of the failed record is left past the new one.
	data, err := os.ReadFile(s35a2Seg(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	for i := l.off; i < int64(len(data)); i++ {
		if data[i] != 0 {
			t.Fatalf("byte %d of the failed record survived Recover: %q", i, data[i])
		}
	}
}

// An unfinished newest segment named past where the previous one ends
// is out of sequence (ErrCorrupt), not silently removed; one named
// exactly there is removed and the previous segment takes appends,
// which survive the next Open.
func TestS35A2UnfinishedNewestSegmentNaming(t *testing.T) {
	o := Options{SegmentSize: 4096}
	build := func(t *testing.T) string {
		dir := t.TempDir()
		l, _, err := Open(dir, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if _, err := l.Append(make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()
		return dir
	}
	for _, tc := range []struct {
		name    string
		first   uint64
		content []byte
		corrupt bool
	}{
		{"empty-at-end", 4, nil, false},
		{"zero-salt-at-end", 4, make([]byte, 4096), false},
		{"short-at-end", 4, []byte{1, 2, 3}, false},
		{"empty-past-end", 5, nil, true},
		{"zero-salt-past-end", 6, make([]byte, 4096), true},
		{"empty-before-end", 3, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := build(t)
			p := filepath.Join(dir, segName(tc.first))
			if err := os.WriteFile(p, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			l, recs, err := Open(dir, 1, o)
			if tc.corrupt {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("open: %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil || len(recs) != 3 {
				t.Fatalf("open: %d records, %v", len(recs), err)
			}
			for i := 0; i < 3; i++ {
				if seq, err := l.Append(make([]byte, 1000)); err != nil || seq != uint64(4+i) {
					t.Fatalf("append: %d %v", seq, err)
				}
			}
			l.Close()
			l, recs, err = Open(dir, 1, o)
			if err != nil || len(recs) != 6 {
				t.Fatalf("reopen: %d records, %v", len(recs), err)
			}
			l.Close()
		})
	}
}

func segName(first uint64) string {
	b := make([]byte, 0, 32)
	const hex = "0123456789abcdef"
	for i := 60; i >= 0; i -= 4 {
		b = append(b, hex[(first>>uint(i))&0xf])
	}
	return string(b) + suffix
}
