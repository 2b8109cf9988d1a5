package redolog

// Review attack (s39) on Drop split into Obsolete, Remove and Forget:
// Remove runs without the caller's lock, concurrently with appends that
// rotate segments; a crash may cut it after any unlink.

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// s39Paths is the paths of segs.
func s39Paths(segs []segment) []string {
	var out []string
	for _, s := range segs {
		out = append(out, s.path)
	}
	return out
}

// s39CopyDir copies the regular files of src into a new directory.
func s39CopyDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "log")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// One goroutine appends (rotating a segment every few records) while
// another deletes the segments below a mark that trails the appends, the
// way the engine does: Obsolete and Forget under the lock appends take,
// Remove without it. Run under -race. At the end the log's list of
// segments is exactly the files on disk, every record from the first
// remaining segment on reads back, and none at or above the last mark
// was deleted.
func TestS39RemoveConcurrentWithRotatingAppends(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 1024}
	l, _ := mustOpen(t, dir, 1, o)
	const n = 3000
	var mu sync.Mutex
	var acked atomic.Int64
	done := make(chan struct{})
	errc := make(chan error, 2)
	go func() {
		defer close(done)
		for i := 1; i <= n; i++ {
			mu.Lock()
			seq, err := l.Append(payload(i))
			mu.Unlock()
			if err != nil || seq != uint64(i) {
				errc <- err
				return
			}
			acked.Store(int64(i))
		}
	}()
	var lastMark uint64
	removed := 0
	var dropErr error
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
		}
		mark := uint64(max(acked.Load()-40, 0)) + 1 // the tree holds records below mark
		mu.Lock()
		paths := l.Obsolete(mark)
		mu.Unlock()
		deleted, err := l.Remove(paths)
		mu.Lock()
		l.Forget(deleted)
		mu.Unlock()
		if err != nil {
			dropErr = err
			break
		}
		removed += len(deleted)
		lastMark = mark
	}
	<-done
	select {
	case err := <-errc:
		t.Fatalf("append: %v", err)
	default:
	}
	if dropErr != nil {
		t.Fatalf("remove: %v", dropErr)
	}
	if removed == 0 {
		t.Fatal("no segment was removed while appending: the attack did not run")
	}
	disk, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s39Paths(l.segs), s39Paths(disk); !slices.Equal(got, want) {
		t.Fatalf("the log lists %v, the directory holds %v", got, want)
	}
	if disk[0].first > lastMark {
		t.Fatalf("first segment starts at %d: records from %d (not below the last mark) were deleted", disk[0].first, lastMark)
	}
	first := int(disk[0].first)
	l.Close()
	_, recs := mustOpen(t, dir, 0, o)
	wantRecords(t, recs, first, n+1)
	t.Logf("%d segments removed while appending; %d left, from record %d", removed, len(disk), first)
}

// A crash cuts Remove after any of its unlinks (they go oldest first), or
// after all of them before Forget: the log reopens each time, without a
// gap, with every record from the mark on. Deleting out of order would
// leave a gap (the reason for the order): that log does not open.
func TestS39CrashAfterEachUnlinkOfRemoveReopens(t *testing.T) {
	dir, o, l, segs := segmentedLog(t, 1024, 300, 6)
	mark := segs[4].first + 1 // the tree holds records below mark
	obsolete := l.Obsolete(mark)
	if want := s39Paths(segs[:4]); !slices.Equal(obsolete, want) {
		t.Fatalf("obsolete below %d: %v, want %v", mark, obsolete, want)
	}
	for k := 0; k <= len(obsolete); k++ {
		c := s39CopyDir(t, dir)
		for _, p := range obsolete[:k] {
			if err := os.Remove(filepath.Join(c, filepath.Base(p))); err != nil {
				t.Fatal(err)
			}
		}
		lc, recs := mustOpen(t, c, mark, o)
		wantRecords(t, recs, int(segs[k].first), 301)
		if lc.Next() != 301 {
			t.Fatalf("crash after %d unlinks: next %d, want 301", k, lc.Next())
		}
		// The reopened log deletes what the crash left of the obsolete
		// segments, and reopens again from the mark's segment.
		if err := lc.Drop(mark); err != nil {
			t.Fatal(err)
		}
		lc.Close()
		_, recs = mustOpen(t, c, mark, o)
		wantRecords(t, recs, int(segs[4].first), 301)
	}
	// Out of order (segment 1 gone, 0 left): a gap.
	c := s39CopyDir(t, dir)
	if err := os.Remove(filepath.Join(c, filepath.Base(segs[1].path))); err != nil {
		t.Fatal(err)
	}
	wantCorrupt(t, c, mark, o, "a segment deleted before an older one")

	// The real Remove and Forget: the list is what the directory holds.
	deleted, err := l.Remove(obsolete)
	if err != nil || len(deleted) != len(obsolete) {
		t.Fatalf("remove: %d, %v", len(deleted), err)
	}
	l.Forget(deleted)
	disk, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s39Paths(l.segs), s39Paths(disk); !slices.Equal(got, want) {
		t.Fatalf("the log lists %v, the directory holds %v", got, want)
	}
}

// Segments rotated in while Remove runs (after Obsolete, before Forget)
// are appended at the list's end: Forget takes off only the oldest ones,
// which Remove deleted, and the new ones stay listed and on disk.
func TestS39RotationBetweenObsoleteAndForgetStays(t *testing.T) {
	dir, o, l, before := segmentedLog(t, 1024, 100, 2)
	mark := before[len(before)-1].first
	obsolete := l.Obsolete(mark)
	if len(obsolete) != len(before)-1 {
		t.Fatalf("obsolete below %d: %d of %d segments", mark, len(obsolete), len(before))
	}
	appendN(t, l, 101, 100) // rotates several segments in
	deleted, err := l.Remove(obsolete)
	if err != nil {
		t.Fatal(err)
	}
	l.Forget(deleted)
	disk, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s39Paths(l.segs), s39Paths(disk); !slices.Equal(got, want) {
		t.Fatalf("the log lists %v, the directory holds %v", got, want)
	}
	if len(disk) < 3 || disk[0].path != before[len(before)-1].path {
		t.Fatalf("after the drop the directory holds %v: want the mark's segment first, then the new ones", s39Paths(disk))
	}
	appendN(t, l, 201, 5)
	l.Close()
	_, recs := mustOpen(t, dir, 0, o)
	wantRecords(t, recs, int(mark), 206)
}
