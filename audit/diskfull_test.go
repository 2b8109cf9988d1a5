package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
)

// Issue 11 §5, for real: the audit file on a tmpfs that fills up. A write
// that does not fit fails and leaves no partial line; once space is freed
// the same sink writes again, on a line boundary; the file always reads
// strictly.
func TestFileSinkDiskFullRecovers(t *testing.T) {
	dir := testenv.Tmpfs(t, 256<<10)
	path := filepath.Join(dir, "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	at := t0
	next := func() Event { at = at.Add(time.Millisecond); return revokeEvent(at) }
	var written int
	for range 3 {
		if err := s.Write(ctx, next()); err != nil {
			t.Fatal(err)
		}
		written++
	}
	filler := filepath.Join(dir, "filler")
	testenv.FillDisk(t, filler)
	// Free a little less than one event, so the next write is torn by the
	// kernel (a short write), not refused whole.
	line, _ := Marshal(next())
	if err := os.Truncate(filler, mustSize(t, filler)-int64(len(line)/2)); err != nil {
		t.Fatal(err)
	}
	var failed int
	for range 5 {
		err := s.Write(ctx, next())
		if err == nil {
			written++
			continue
		}
		failed++
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("disk full: %v, want ENOSPC", err)
		}
	}
	if failed == 0 {
		t.Fatal("no write failed on a full disk")
	}
	assertWhole(t, path, written)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Write(ctx, next()); err != nil {
			t.Fatalf("after space was freed: %v", err)
		}
		written++
	}
	assertWhole(t, path, written)
}

func mustSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// assertWhole checks path holds exactly n whole events, every line ending
// in a newline.
func assertWhole(t *testing.T, path string, n int) {
	t.Helper()
	evs, err := ReadFile(path)
	if err != nil {
		raw, _ := os.ReadFile(path)
		tail := raw[max(len(raw)-80, 0):]
		t.Fatalf("audit file does not read strictly: %v (tail %q)", err, tail)
	}
	if len(evs) != n {
		t.Fatalf("%d events in the file, want %d", len(evs), n)
	}
}

// A torn tail left by a crash in the middle of a write is quarantined at
// open, so the next append starts on a line boundary.
func TestOpenFileRepairsTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, _ := Marshal(acquireEvent(t0))
	b, _ := Marshal(revokeEvent(t0.Add(time.Second)))
	torn := b[:len(b)/2]
	if err := os.WriteFile(path, append(append(append([]byte(nil), a...), '\n'), torn...), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.TornBytes() != int64(len(torn)) {
		t.Fatalf("TornBytes %d, want %d", s.TornBytes(), len(torn))
	}
	if err := s.Write(context.Background(), acquireEvent(t0.Add(2*time.Second))); err != nil {
		t.Fatal(err)
	}
	s.Close()
	assertWhole(t, path, 2)
	q, err := os.ReadFile(path + ".torn")
	if err != nil || !bytes.Contains(q, torn) {
		t.Fatalf("torn tail not quarantined in %s.torn: %v, %q", path, err, q)
	}
}

// faultyFile injects faults into a FileSink's file: a write that stores
// only its first half and fails, a failing fsync, a failing truncate.
type faultyFile struct {
	*os.File
	tornWrite, failSync, failTruncate bool
}

func (f *faultyFile) Write(b []byte) (int, error) {
	if f.tornWrite {
		n, _ := f.File.Write(b[:len(b)/2])
		return n, syscall.EIO
	}
	return f.File.Write(b)
}

func (f *faultyFile) Sync() error {
	if f.failSync {
		return syscall.EIO
	}
	return f.File.Sync()
}

func (f *faultyFile) Truncate(n int64) error {
	if f.failTruncate {
		return syscall.EIO
	}
	return f.File.Truncate(n)
}

// Every kind of failure leaves the file whole, and the sink writes again
// once the fault clears, without a reopen.
func TestFileSinkFaultsLeaveWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ff := &faultyFile{File: s.f.(*os.File)}
	s.f = ff
	ctx := context.Background()
	at := t0
	next := func() Event { at = at.Add(time.Millisecond); return acquireEvent(at) }
	written := 0
	write := func(wantErr bool) {
		t.Helper()
		err := s.Write(ctx, next())
		if (err != nil) != wantErr {
			t.Fatalf("write: %v, want error %v", err, wantErr)
		}
		if err == nil {
			written++
		}
	}
	write(false)

	ff.tornWrite = true // half a line reaches the file, then EIO
	write(true)
	assertWhole(t, path, written)
	if s.failed == nil {
		t.Fatal("a failed write is not recorded for Check")
	}
	ff.tornWrite = false
	write(false)
	if s.failed != nil {
		t.Fatal("a successful write did not clear the failure")
	}

	ff.failSync = true // the line reached the page cache, fsync failed: it must go
	write(true)
	assertWhole(t, path, written)
	ff.failSync = false
	write(false)

	ff.tornWrite, ff.failTruncate = true, true // the torn half cannot be cut at once
	write(true)
	ff.tornWrite = false
	write(true) // still cannot truncate: nothing is appended after the torn half
	ff.failTruncate = false
	write(false) // cuts the torn half first, then appends
	assertWhole(t, path, written)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after recovery: %v", err)
	}
}

// Check reports a failure while the disk stays full and clears it once
// there is room again, with no event written in between.
func TestFileSinkCheckProbes(t *testing.T) {
	dir := testenv.Tmpfs(t, 256<<10)
	path := filepath.Join(dir, "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check of a fresh sink: %v", err)
	}
	filler := filepath.Join(dir, "filler")
	testenv.FillDisk(t, filler)
	if err := s.Write(ctx, acquireEvent(t0)); err == nil {
		t.Fatal("write on a full disk succeeded")
	}
	err = s.Check(ctx)
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Check on a full disk: %v, want ENOSPC", err)
	}
	if bytes.Contains([]byte(err.Error()), []byte(dir)) {
		t.Fatalf("Check's reason shows the path: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after space was freed: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("Check left files behind: %v", entries)
	}
}

// A second sink on the same file is refused: truncating back after a
// failure is safe only for the one writer.
func TestOpenFileIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFile(path); err == nil {
		t.Fatal("a second writer opened the audit file")
	}
	s.Close()
	s2, err := OpenFile(path)
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	s2.Close()
}

// TestFileSinkExternalTruncateThenFaultLeavesNoNULs guarantees that the sink
// never truncates the file up to a size it remembers: after the file was cut
// from outside (logrotate copytruncate), a failed fsync is cut back to the
// real end of the file, not extended with NUL bytes, and the file stays
// readable.
func TestFileSinkExternalTruncateThenFaultLeavesNoNULs(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 20; i++ {
		if err := s.Write(ctx, acquireEvent(t0.Add(time.Duration(i)*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Truncate(path, 0); err != nil { // copytruncate
		t.Fatal(err)
	}
	ff := &faultyFile{File: s.f.(*os.File)}
	s.f = ff
	ff.failSync = true
	_ = s.Write(ctx, acquireEvent(t0.Add(time.Second)))
	ff.failSync = false
	if err := s.Write(ctx, acquireEvent(t0.Add(2*time.Second))); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err != nil {
		data, _ := os.ReadFile(path)
		t.Fatalf("after an external truncate and one failed fsync the audit file is unreadable (%d bytes, %d NULs): %v",
			len(data), bytes.Count(data, []byte{0}), err)
	}
	// The event whose fsync failed was cut back; only the later one stays.
	if got, _ := ReadFile(path); len(got) != 1 || !got[0].Timestamp.Time().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("the file holds %d events, want only the one written after the fault", len(got))
	}
}
