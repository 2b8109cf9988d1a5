package redolog

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func payload(i int) []byte { return []byte(fmt.Sprintf("record %d %s", i, strings.Repeat("x", i%37))) }

func mustOpen(t *testing.T, dir string, first uint64, o Options) (*Log, []Record) {
	t.Helper()
	l, recs, err := Open(dir, first, o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, recs
}

func appendN(t *testing.T, l *Log, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		seq, err := l.Append(payload(i))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if seq != uint64(i) {
			t.Fatalf("append %d got seq %d", i, seq)
		}
	}
}

func wantRecords(t *testing.T, recs []Record, from, to int) {
	t.Helper()
	if len(recs) != to-from {
		t.Fatalf("%d records, want %d (%d to %d)", len(recs), to-from, from, to-1)
	}
	for i, r := range recs {
		if r.Seq != uint64(from+i) || string(r.Payload) != string(payload(from+i)) {
			t.Fatalf("record %d: seq %d payload %q, want seq %d", i, r.Seq, r.Payload, from+i)
		}
	}
}

// wantCorrupt requires Open of the log in dir to fail with ErrCorrupt
// (what names the damage); a log that opens anyway is closed.
func wantCorrupt(t *testing.T, dir string, first uint64, o Options, what string) {
	t.Helper()
	l, recs, err := Open(dir, first, o)
	if errors.Is(err, ErrCorrupt) {
		return
	}
	if l != nil {
		l.Close()
	}
	t.Fatalf("open of a log with %s: %d records, err %v; want ErrCorrupt", what, len(recs), err)
}

// Records come back in order across segments, reopening continues the
// sequence, and Drop removes only whole segments below the mark.
func TestRecordsSurviveReopenAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 4096}
	l, recs := mustOpen(t, dir, 10, o)
	if len(recs) != 0 || l.Next() != 10 {
		t.Fatalf("new log: %d records, next %d", len(recs), l.Next())
	}
	appendN(t, l, 10, 200)
	l.Close()
	segs, _ := listSegments(dir)
	if len(segs) < 3 {
		t.Fatalf("%d segments, want several", len(segs))
	}
	l, recs = mustOpen(t, dir, 0, o)
	wantRecords(t, recs, 10, 210)
	appendN(t, l, 210, 5)
	// Records below the mark are in the tree: the segments holding only
	// such records go; the one the mark falls in stays whole.
	if err := l.Drop(segs[1].first + 5); err != nil {
		t.Fatal(err)
	}
	l.Close()
	_, recs = mustOpen(t, dir, 0, o)
	wantRecords(t, recs, int(segs[1].first), 215)
	if _, err := l.Append(nil); err == nil {
		t.Fatal("append to a closed log succeeded")
	}
}

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, err := listSegments(dir)
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v %v", segs, err)
	}
	return segs[len(segs)-1].path
}

func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A torn last record, whichever of its bytes reached the disk, ends the
// log: it is cut off and appends resume in its place.
func TestTornTailIsCutOff(t *testing.T) {
	for _, c := range []struct {
		name string
		tear func(rec []byte) []byte // what of the record reached the disk
	}{
		{"header only", func(rec []byte) []byte { return rec[:headerSize] }},
		{"half", func(rec []byte) []byte { return rec[:len(rec)/2] }},
		{"all but the last byte", func(rec []byte) []byte { return rec[:len(rec)-1] }},
		{"head lost, tail written", func(rec []byte) []byte {
			b := append([]byte(nil), rec...)
			clear(b[:8])
			return b
		}},
		{"a bit flipped", func(rec []byte) []byte {
			b := append([]byte(nil), rec...)
			b[len(b)-1] ^= 1
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
			// The record 21 would have been.
			rec := make([]byte, headerSize+len(payload(21)))
			(&Log{salt: saltOf(t, lastSegment(t, dir))}).encode(rec, 21, payload(21))
			patch(t, lastSegment(t, dir), end, c.tear(rec))
			l, recs := mustOpen(t, dir, 0, o)
			wantRecords(t, recs, 1, 21)
			appendN(t, l, 21, 3)
			l.Close()
			_, recs = mustOpen(t, dir, 0, o)
			wantRecords(t, recs, 1, 24)
		})
	}
}

// Damage to a record that another follows (acknowledged, then), a record
// of an older segment, or a missing segment, fails Open.
func TestDamageFailsOpen(t *testing.T) {
	o := Options{SegmentSize: 4096}
	build := func(t *testing.T) string {
		dir := t.TempDir()
		l, _ := mustOpen(t, dir, 1, o)
		appendN(t, l, 1, 400)
		l.Close()
		if segs, _ := listSegments(dir); len(segs) < 3 {
			t.Fatalf("%d segments, want at least 3", len(segs))
		}
		return dir
	}
	cases := map[string]func(t *testing.T, dir string){
		"a bit of an earlier record in the last segment": func(t *testing.T, dir string) {
			patch(t, lastSegment(t, dir), headerSize+2, []byte{0xff})
		},
		"a record of an older segment": func(t *testing.T, dir string) {
			segs, _ := listSegments(dir)
			patch(t, segs[0].path, 100, []byte{0xff})
		},
		"the tail of an older segment": func(t *testing.T, dir string) {
			segs, _ := listSegments(dir)
			_, end, _, err := readSegment(&segs[0], false)
			if err != nil {
				t.Fatal(err)
			}
			patch(t, segs[0].path, end+3, []byte{0xff, 0xee})
		},
		"a missing middle segment": func(t *testing.T, dir string) {
			segs, _ := listSegments(dir)
			if err := os.Remove(segs[1].path); err != nil {
				t.Fatal(err)
			}
		},
		"a stray segment name": func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "zz"+suffix), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := build(t)
			damage(t, dir)
			wantCorrupt(t, dir, 0, o, name)
		})
	}
}

// Killed (SIGKILL) while appending as fast as it can, a writer's log
// holds every record it reported durable, in order, and takes appends
// again.
func TestKilledWriterKeepsAcknowledgedRecords(t *testing.T) {
	if dir := os.Getenv("REDOLOG_CHILD_DIR"); dir != "" {
		l, _, err := Open(dir, 1, Options{SegmentSize: 1 << 16})
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(2)
		}
		w := bufio.NewWriter(os.Stdout)
		for i := 1; ; i++ {
			if _, err := l.Append(payload(i)); err != nil {
				fmt.Println("append:", err)
				os.Exit(2)
			}
			fmt.Fprintln(w, i)
			w.Flush()
		}
	}
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run", "^TestKilledWriterKeepsAcknowledgedRecords$")
		cmd.Env = append(os.Environ(), "REDOLOG_CHILD_DIR="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		acked := 0
		sc := bufio.NewScanner(out)
		deadline := time.Now().Add(time.Duration(300+200*round) * time.Millisecond)
		for sc.Scan() {
			n, err := strconv.Atoi(sc.Text())
			if err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			acked = n
			if time.Now().After(deadline) {
				break
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		if acked < 10 {
			t.Fatalf("the child acknowledged only %d records", acked)
		}
		l, recs := mustOpen(t, dir, 0, Options{SegmentSize: 1 << 16})
		if len(recs) < acked {
			t.Fatalf("round %d: %d records after the kill, %d were acknowledged", round, len(recs), acked)
		}
		wantRecords(t, recs, 1, len(recs)+1)
		appendN(t, l, len(recs)+1, 2)
	}
}

func saltOf(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 8 {
		t.Fatalf("salt of %s: %v", path, err)
	}
	return b[:8]
}
