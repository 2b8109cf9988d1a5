package redolog

// Review s34: attacks on the redo log, each asserting what a caller
// observes (records read back, sequence numbers, errors).

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// s34Recs is recs as "seq:payload" strings.
func s34Recs(recs []Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprintf("%d:%s", r.Seq, r.Payload))
	}
	return out
}

func s34Append(t *testing.T, l *Log, want uint64, p []byte) {
	t.Helper()
	seq, err := l.Append(p)
	if err != nil || seq != want {
		t.Fatalf("append of %d bytes: seq %d err %v, want seq %d", len(p), seq, err, want)
	}
}

func s34Segments(t *testing.T, dir string) []segment {
	t.Helper()
	segs, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	return segs
}

func s34Record(seq uint64, p []byte) []byte {
	rec := make([]byte, headerSize+len(p))
	(&Log{}).encode(rec, seq, p)
	return rec
}

// A record that exactly fills what is left of a segment stays in it; one
// byte more goes to a new segment; a record exactly a segment long fills
// one alone; one byte over is ErrTooLarge, which leaves the log usable
// and takes no sequence number.
func TestReviewS34SegmentBoundaries(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 256}
	l, _ := mustOpen(t, dir, 1, o)
	s34Append(t, l, 1, bytes.Repeat([]byte("a"), 100))                  // 116 bytes
	s34Append(t, l, 2, bytes.Repeat([]byte("b"), 256-segHeader-116-16)) // exactly the rest
	if n := len(s34Segments(t, dir)); n != 1 {
		t.Fatalf("%d segments after filling the first exactly, want 1", n)
	}
	s34Append(t, l, 3, nil)                                              // a new segment
	s34Append(t, l, 4, bytes.Repeat([]byte("c"), 256-segHeader-16-16+1)) // one byte too many for the rest
	if n := len(s34Segments(t, dir)); n != 3 {
		t.Fatalf("%d segments, want 3", n)
	}
	s34Append(t, l, 5, bytes.Repeat([]byte("d"), 256-segHeader-16)) // a whole segment
	if _, err := l.Append(bytes.Repeat([]byte("e"), 256-segHeader-16+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a record one byte over a segment: %v, want ErrTooLarge", err)
	}
	s34Append(t, l, 6, []byte("after too large"))
	l.Close()
	_, recs := mustOpen(t, dir, 1, o)
	if len(recs) != 6 {
		t.Fatalf("%d records, want 6", len(recs))
	}
	for i, r := range recs {
		if r.Seq != uint64(i+1) {
			t.Fatalf("record %d has seq %d", i, r.Seq)
		}
	}
	if len(recs[1].Payload) != 256-segHeader-116-16 || len(recs[4].Payload) != 256-segHeader-16 || string(recs[5].Payload) != "after too large" {
		t.Fatalf("payload sizes %d %d %q", len(recs[1].Payload), len(recs[4].Payload), recs[5].Payload)
	}
	segs := s34Segments(t, dir)
	want := []uint64{1, 3, 4, 5, 6}
	if len(segs) != len(want) {
		t.Fatalf("segments %+v, want firsts %v", segs, want)
	}
	for i, s := range segs {
		if s.first != want[i] {
			t.Fatalf("segment %d starts at %d, want %d", i, s.first, want[i])
		}
	}
}

// Empty payloads, at seq 0, in the middle and at the end, read back as
// records with empty payloads; none reads as the end of the log.
func TestReviewS34EmptyPayloads(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 128}
	l, _ := mustOpen(t, dir, 0, o)
	s34Append(t, l, 0, nil)
	s34Append(t, l, 1, []byte{})
	s34Append(t, l, 2, []byte("x"))
	for i := uint64(3); i < 20; i++ { // several segments of empty records
		s34Append(t, l, i, nil)
	}
	s34Append(t, l, 20, make([]byte, 40)) // a payload of zeros
	s34Append(t, l, 21, nil)
	l.Close()
	l, recs := mustOpen(t, dir, 0, o)
	if len(recs) != 22 || l.Next() != 22 {
		t.Fatalf("%d records, next %d, want 22 and 22", len(recs), l.Next())
	}
	for i, r := range recs {
		wantLen := 0
		switch i {
		case 2:
			wantLen = 1
		case 20:
			wantLen = 40
		}
		if r.Seq != uint64(i) || len(r.Payload) != wantLen {
			t.Fatalf("record %d: seq %d, %d bytes, want %d", i, r.Seq, len(r.Payload), wantLen)
		}
	}
	// The zero-payload record 0 alone in a log.
	dir2 := t.TempDir()
	l2, _ := mustOpen(t, dir2, 0, o)
	s34Append(t, l2, 0, nil)
	l2.Close()
	_, recs = mustOpen(t, dir2, 5, o)
	if len(recs) != 1 || recs[0].Seq != 0 {
		t.Fatalf("a log of one empty record 0 read back as %q", s34Recs(recs))
	}
}

func s34Build(t *testing.T, dir string, o Options, first, n int) {
	t.Helper()
	l, _, err := Open(dir, uint64(first), o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	appendN(t, l, first, n)
}

// Segments shorter than their preallocated size: the last one cut after
// its records reads whole and takes appends; cut inside its last record,
// it loses that record (documented: no log can tell it from a torn
// write); an older one cut anywhere in its records fails Open.
func TestReviewS34TruncatedSegments(t *testing.T) {
	o := Options{SegmentSize: 4096}
	ends := func(t *testing.T, s segment) []int64 { // record end offsets
		t.Helper()
		data, err := os.ReadFile(s.path)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for off, seq := int64(segHeader), s.first; ; seq++ {
			_, size, ok := parseRecord(data[:8], data[off:], seq, seq)
			if !ok {
				return out
			}
			off += size
			out = append(out, off)
		}
	}
	t.Run("last, after its records", func(t *testing.T) {
		dir := t.TempDir()
		s34Build(t, dir, o, 1, 100)
		segs := s34Segments(t, dir)
		last := segs[len(segs)-1]
		e := ends(t, last)
		if err := os.Truncate(last.path, e[len(e)-1]); err != nil {
			t.Fatal(err)
		}
		l, recs := mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 101)
		appendN(t, l, 101, 60) // grows the short file, then new segments
		l.Close()
		l, recs = mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 161)
		l.Close()
	})
	t.Run("last, inside its last record", func(t *testing.T) {
		dir := t.TempDir()
		s34Build(t, dir, o, 1, 100)
		segs := s34Segments(t, dir)
		last := segs[len(segs)-1]
		e := ends(t, last)
		if len(e) < 2 {
			t.Fatal("last segment holds fewer than 2 records")
		}
		if err := os.Truncate(last.path, e[len(e)-1]-3); err != nil {
			t.Fatal(err)
		}
		l, recs := mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 100)
		appendN(t, l, 100, 5)
		l.Close()
		_, recs = mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 105)
	})
	for _, c := range []struct {
		name string
		cut  func(e []int64) int64
	}{
		{"older, inside a record", func(e []int64) int64 { return e[len(e)-2] + 5 }},
		{"older, at a record boundary", func(e []int64) int64 { return e[len(e)-2] }},
		{"older, to nothing", func(e []int64) int64 { return 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s34Build(t, dir, o, 1, 400)
			segs := s34Segments(t, dir)
			if len(segs) < 3 {
				t.Fatal("want 3 segments")
			}
			if err := os.Truncate(segs[1].path, c.cut(ends(t, segs[1]))); err != nil {
				t.Fatal(err)
			}
			wantCorrupt(t, dir, 1, o, "an older segment cut "+c.name)
		})
	}
}

// A bit flip in a length field that makes it claim a huge length: in the
// last record of the log it reads as a torn write (documented); before
// another record, or in an older segment, it fails Open.
func TestReviewS34LengthFieldClaimsHugeLength(t *testing.T) {
	o := Options{SegmentSize: 4096}
	recStarts := func(t *testing.T, path string) []int64 {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		segs, _ := listSegments(filepath.Dir(path))
		first := uint64(0)
		for _, sg := range segs {
			if sg.path == path {
				first = sg.first
			}
		}
		for off, seq := int64(segHeader), first; ; seq++ {
			_, size, ok := parseRecord(data[:8], data[off:], seq, seq)
			if !ok {
				return out
			}
			out = append(out, off)
			off += size
		}
	}
	t.Run("the last record", func(t *testing.T) {
		dir := t.TempDir()
		s34Build(t, dir, o, 1, 100)
		last := lastSegment(t, dir)
		st := recStarts(t, last)
		patch(t, last, st[len(st)-1], []byte{0x80})
		l, recs := mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 100)
		appendN(t, l, 100, 3)
		l.Close()
		l, recs = mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 103)
		l.Close()
		_, recs = mustOpen(t, dir, 1, o)
		wantRecords(t, recs, 1, 103)
	})
	t.Run("a record before the last", func(t *testing.T) {
		dir := t.TempDir()
		s34Build(t, dir, o, 1, 100)
		last := lastSegment(t, dir)
		st := recStarts(t, last)
		patch(t, last, st[len(st)-2], []byte{0x80})
		wantCorrupt(t, dir, 1, o, "a length claiming too much "+t.Name())
	})
	t.Run("the last record of an older segment", func(t *testing.T) {
		dir := t.TempDir()
		s34Build(t, dir, o, 1, 100)
		segs := s34Segments(t, dir)
		st := recStarts(t, segs[0].path)
		patch(t, segs[0].path, st[len(st)-1], []byte{0x80})
		wantCorrupt(t, dir, 1, o, "a length claiming too much "+t.Name())
	})
	t.Run("zeroed headers then a valid record", func(t *testing.T) {
		dir := t.TempDir()
		s34Build(t, dir, o, 1, 100)
		last := lastSegment(t, dir)
		st := recStarts(t, last)
		patch(t, last, st[1], make([]byte, headerSize))
		wantCorrupt(t, dir, 1, o, "a length claiming too much "+t.Name())
	})
}

// A torn tail survives any number of reopens without appends, then
// appends resume where the last good record ended.
func TestReviewS34ReopenTwiceAfterTornTail(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 1 << 12}
	l, _ := mustOpen(t, dir, 7, o)
	appendN(t, l, 7, 10)
	end := l.off
	l.Close()
	rec := s34Record(17, payload(17))
	rec[len(rec)-1] ^= 0xff
	patch(t, lastSegment(t, dir), end, rec)
	for i := 0; i < 3; i++ {
		l, recs := mustOpen(t, dir, 0, o)
		wantRecords(t, recs, 7, 17)
		if l.Next() != 17 {
			t.Fatalf("reopen %d: next %d", i, l.Next())
		}
		l.Close()
	}
	l, _ = mustOpen(t, dir, 0, o)
	appendN(t, l, 17, 4)
	l.Close()
	_, recs := mustOpen(t, dir, 0, o)
	wantRecords(t, recs, 7, 21)
}

// Drop at marks below, on and between segment starts keeps exactly the
// segments holding a record at or above the mark, and never the last.
func TestReviewS34DropMarks(t *testing.T) {
	o := Options{SegmentSize: 1024}
	dir := t.TempDir()
	s34Build(t, dir, o, 1, 120)
	all := s34Segments(t, dir)
	if len(all) < 5 {
		t.Fatalf("%d segments, want at least 5", len(all))
	}
	firstKept := func(upTo uint64) uint64 {
		f := all[0].first
		for i := 1; i < len(all); i++ {
			if all[i].first <= upTo {
				f = all[i].first
			}
		}
		return f
	}
	for _, upTo := range []uint64{0, 1, all[1].first - 1, all[1].first, all[1].first + 1, all[3].first + 2, 120, 121, 1 << 40} {
		d := t.TempDir()
		for _, s := range all {
			data, err := os.ReadFile(s.path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, filepath.Base(s.path)), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		l, _ := mustOpen(t, d, 1, o)
		if err := l.Drop(upTo); err != nil {
			t.Fatal(err)
		}
		l.Close()
		l, recs := mustOpen(t, d, 1, o)
		from := int(firstKept(upTo))
		wantRecords(t, recs, from, 121)
		if len(recs) > 0 && recs[0].Seq > upTo && upTo >= 1 {
			t.Fatalf("Drop(%d) dropped record %d", upTo, recs[0].Seq-1)
		}
		appendN(t, l, 121, 2)
		l.Close()
		_, recs = mustOpen(t, d, 1, o)
		wantRecords(t, recs, from, 123)
	}
}

// A log whose first record is after Open's first: its records come back
// from where they start (documented: the caller checks they start where
// its tree ends), and appends continue after them.
func TestReviewS34OpenFirstBelowTheLog(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 1024}
	s34Build(t, dir, o, 10, 5)
	for _, first := range []uint64{0, 9, 10, 12, 50} {
		l, recs := mustOpen(t, dir, first, o)
		wantRecords(t, recs, 10, 15)
		if l.Next() != 15 {
			t.Fatalf("Open(first %d): next %d, want 15", first, l.Next())
		}
		l.Close()
	}
}

// DEFECT (if it fails): "An empty log's first record will have sequence
// number first." A log that holds no record, but whose empty segment an
// earlier Open created, ignores first: its next record gets the number
// that earlier Open was given.
func TestReviewS34EmptyLogTakesFirst(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 1024}
	l, _ := mustOpen(t, dir, 5, o)
	l.Close()
	l, recs := mustOpen(t, dir, 100, o)
	if len(recs) != 0 {
		t.Fatalf("%d records in an empty log", len(recs))
	}
	if l.Next() != 100 {
		t.Fatalf("empty log opened with first 100: next record will be %d", l.Next())
	}
}

// A failed append (its file closed underneath) refuses every later
// append with ErrFailed, even one that would start a new segment; a
// reopen reads back the acknowledged records and appends again.
func TestReviewS34FailedAppendRefusesMore(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 512}
	l, _ := mustOpen(t, dir, 1, o)
	appendN(t, l, 1, 5)
	l.f.Close() // underneath the log
	if _, err := l.Append(payload(6)); err == nil {
		t.Fatal("append to a closed file succeeded")
	}
	for _, p := range [][]byte{payload(6), nil, bytes.Repeat([]byte("x"), 400)} {
		if _, err := l.Append(p); !errors.Is(err, ErrFailed) {
			t.Fatalf("append of %d bytes after a failure: %v, want ErrFailed", len(p), err)
		}
	}
	if n := len(s34Segments(t, dir)); n != 1 {
		t.Fatalf("%d segments after refused appends, want 1", n)
	}
	l, recs := mustOpen(t, dir, 1, o)
	wantRecords(t, recs, 1, 6)
	appendN(t, l, 6, 3)
}

// DEFECT (if it fails): an append after Close must fail (the log's own
// test asserts it for a record that fits). A record that needs a new
// segment instead opens one and succeeds, leaking its file.
func TestReviewS34AppendAfterCloseAtSegmentEnd(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 256}
	l, _ := mustOpen(t, dir, 1, o)
	s34Append(t, l, 1, bytes.Repeat([]byte("a"), 200))
	l.Close()
	if seq, err := l.Append(bytes.Repeat([]byte("b"), 100)); err == nil {
		t.Fatalf("append after Close succeeded as record %d (segments now %d)", seq, len(s34Segments(t, dir)))
	}
}

// Files that are not segments are left alone; a stray segment-like file
// out of sequence fails Open rather than be replayed around.
func TestReviewS34StrayFiles(t *testing.T) {
	o := Options{SegmentSize: 1024}
	dir := t.TempDir()
	s34Build(t, dir, o, 1, 30)
	for _, name := range []string{"README", "0000000000000001.redo.tmp", "0000000000000001.redo~", "LOCK"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("junk junk junk junk"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	l, recs := mustOpen(t, dir, 1, o)
	wantRecords(t, recs, 1, 31)
	appendN(t, l, 31, 2)
	l.Close()
	// An empty segment file named after the end of the log, and one
	// before its start: both are out of sequence.
	for _, first := range []uint64{1 << 20, 0} {
		d := t.TempDir()
		s34Build(t, d, o, 1, 30)
		name := filepath.Join(d, fmt.Sprintf("%016x%s", first, suffix))
		if err := os.WriteFile(name, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		wantCorrupt(t, d, 1, o, fmt.Sprintf("a stray segment %x", first))
	}
}

// DEFECT (if it fails): a torn last record is cut off whatever its bytes.
// But Open decides torn-vs-damaged by searching every later offset for
// any bytes that check as a record, and a payload can hold such bytes (a
// client's value that is itself an encoded record, with an unkeyed
// CRC): the torn tail then reads as damage and the log cannot be opened.
func TestReviewS34TornRecordHoldingARecord(t *testing.T) {
	for _, c := range []struct {
		name string
		tear func(rec []byte) []byte
	}{
		{"all but the last byte", func(rec []byte) []byte { return rec[:len(rec)-1] }},
		{"head lost, tail written", func(rec []byte) []byte {
			b := append([]byte(nil), rec...)
			clear(b[:8])
			return b
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			o := Options{SegmentSize: 1 << 16}
			l, _ := mustOpen(t, dir, 1, o)
			appendN(t, l, 1, 20)
			end := l.off
			l.Close()
			// Record 21's payload: a value that happens to be an encoded
			// record, in the middle of other bytes.
			value := append(append([]byte("value:"), s34Record(77, []byte("hello"))...), []byte(":end")...)
			patch(t, lastSegment(t, dir), end, c.tear(s34Record(21, value)))
			l, recs, err := Open(dir, 0, o)
			if err != nil {
				t.Fatalf("Open after a torn write of record 21: %v; want records 1..20", err)
			}
			defer l.Close()
			wantRecords(t, recs, 1, 21)
		})
	}
}

// DEFECT (if it fails): Open of a log whose last record is torn should
// take about as long as reading it. The torn-vs-damaged search parses a
// record at every later offset, and each parse checksums as many bytes
// as the length field read there claims, up to the rest of the segment:
// about 0.5 MiB per offset in a default (64 MiB) segment for random bytes,
// so quadratic in the torn record's size. A torn 1 MiB record of random
// (compressed, encrypted) bytes keeps Open busy for about a minute here
// (16 KiB: 1.3 s, 64 KiB: 4.4 s); the same record of text opens at once.
// Open runs in a child process, killed at the deadline.
func TestReviewS34TornTailOpenTime(t *testing.T) {
	const deadline = 5 * time.Second
	o := Options{} // DefaultSegmentSize
	if dir := os.Getenv("REVIEW_S34_OPEN_DIR"); dir != "" {
		l, recs, err := Open(dir, 0, o)
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(2)
		}
		l.Close()
		fmt.Println("records", len(recs))
		os.Exit(0)
	}
	build := func(t *testing.T, p []byte) string {
		dir := t.TempDir()
		l, _ := mustOpen(t, dir, 1, o)
		appendN(t, l, 1, 3)
		end := l.off
		l.Close()
		rec := s34Record(4, p)
		rec[5] ^= 0xff // the checksum: torn
		patch(t, lastSegment(t, dir), end, rec)
		return dir
	}
	openTime := func(t *testing.T, dir string) (time.Duration, string) {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestReviewS34TornTailOpenTime$")
		cmd.Env = append(os.Environ(), "REVIEW_S34_OPEN_DIR="+dir)
		var out bytes.Buffer
		cmd.Stdout = &out
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
			return time.Since(start), strings.TrimSpace(out.String())
		case <-time.After(deadline):
			_ = cmd.Process.Kill()
			<-done
			return time.Since(start), "killed at the deadline"
		}
	}
	d, out := openTime(t, build(t, bytes.Repeat([]byte("text "), (1<<20)/5)))
	if out != "records 3" || d >= deadline {
		t.Fatalf("control (a torn 1 MiB record of text): %s after %v", out, d)
	}
	random := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(34, 34))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	d, out = openTime(t, build(t, random))
	if out != "records 3" || d >= deadline {
		t.Fatalf("a torn 1 MiB record of random bytes: Open %s after %v (the same size of text opened at once)", out, d.Round(time.Millisecond))
	}
}
