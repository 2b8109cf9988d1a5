package redolog

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// segmentedLog opens a log of segSize-byte segments in a new directory
// and appends records 1 to n; it fails t unless they fill at least
// minSegs segments, which it returns (oldest first) with the log.
func segmentedLog(t *testing.T, segSize int64, n, minSegs int) (dir string, o Options, l *Log, segs []segment) {
	t.Helper()
	dir, o = t.TempDir(), Options{SegmentSize: segSize}
	l, _ = mustOpen(t, dir, 1, o)
	appendN(t, l, 1, n)
	segs, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) < minSegs {
		t.Fatalf("%d segments after %d records, want at least %d", len(segs), n, minSegs)
	}
	return dir, o, l, segs
}

// A deletion that fails part way (Remove) takes off the log only the
// segments it deleted, the oldest: the log on disk stays whole from its
// first segment (it reopens with every record from there on), and the
// next Drop deletes the rest.
func TestRemoveFailingPartWayKeepsTheRestForTheNextDrop(t *testing.T) {
	dir, o, l, segs := segmentedLog(t, 4096, 400, 4)
	upTo := segs[3].first // segments 0, 1 and 2 are obsolete
	obsolete := l.Obsolete(upTo)
	if len(obsolete) != 3 || obsolete[0] != segs[0].path || obsolete[2] != segs[2].path {
		t.Fatalf("obsolete below %d: %v; want the first three of %d segments", upTo, obsolete, len(segs))
	}
	// Segment 1 cannot be deleted: a non-empty directory stands at its
	// path (root may delete any file, so no permission stands in).
	aside := segs[1].path + ".aside"
	if err := os.Rename(segs[1].path, aside); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(segs[1].path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	deleted, err := l.Remove(obsolete)
	if err == nil || len(deleted) != 1 || deleted[0] != segs[0].path {
		t.Fatalf("Remove with segment 1 undeletable: deleted %v, err %v; want segment 0 and an error", deleted, err)
	}
	l.Forget(deleted)
	if _, err := os.Stat(segs[0].path); !os.IsNotExist(err) {
		t.Fatalf("segment 0 after Remove: %v; want it deleted", err)
	}
	if err := os.RemoveAll(segs[1].path); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(aside, segs[1].path); err != nil {
		t.Fatal(err)
	}
	// Appends go on, and the log on disk reopens from segment 1.
	appendN(t, l, 401, 3)
	l.Close()
	l, recs := mustOpen(t, dir, 0, o)
	wantRecords(t, recs, int(segs[1].first), 404)
	if got := l.Obsolete(upTo); len(got) != 2 || got[0] != segs[1].path {
		t.Fatalf("obsolete below %d after reopen: %v; want segments 1 and 2", upTo, got)
	}
	if err := l.Drop(upTo); err != nil {
		t.Fatal(err)
	}
	l.Close()
	_, recs = mustOpen(t, dir, 0, o)
	wantRecords(t, recs, int(upTo), 404)
}

// Without reopening, the segments a failed Remove left are the first the
// next Drop deletes.
func TestDropAfterAFailedRemoveDeletesWhatItLeft(t *testing.T) {
	dir, o, l, segs := segmentedLog(t, 4096, 400, 4)
	if err := os.Rename(segs[0].path, segs[0].path+".aside"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(segs[0].path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	deleted, err := l.Remove(l.Obsolete(segs[2].first))
	if err == nil || len(deleted) != 0 {
		t.Fatalf("Remove with segment 0 undeletable: deleted %v, err %v; want none and an error", deleted, err)
	}
	l.Forget(deleted)
	if err := os.RemoveAll(segs[0].path); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(segs[0].path+".aside", segs[0].path); err != nil {
		t.Fatal(err)
	}
	if err := l.Drop(segs[3].first); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := os.Stat(segs[i].path); !os.IsNotExist(err) {
			t.Fatalf("segment %d after the next Drop: %v; want it deleted", i, err)
		}
	}
	l.Close()
	_, recs := mustOpen(t, dir, 0, o)
	wantRecords(t, recs, int(segs[3].first), 401)
}

// Forget takes off only leading segments that are the ones deleted, in
// order: given paths that are not the log's oldest segments, it keeps
// every segment.
func TestForgetTakesOffOnlyTheDeletedOldestSegments(t *testing.T) {
	_, _, l, segs := segmentedLog(t, 4096, 400, 4)
	defer l.Close()
	upTo := segs[len(segs)-1].first
	l.Forget([]string{segs[1].path, segs[2].path}) // not the oldest
	if got := l.Obsolete(upTo); len(got) != len(segs)-1 || got[0] != segs[0].path {
		t.Fatalf("after Forget of segments 1 and 2: obsolete %v; want all %d but the last", got, len(segs)-1)
	}
	l.Forget([]string{segs[0].path, segs[2].path}) // the oldest, then not the next
	if got := l.Obsolete(upTo); len(got) != len(segs)-2 || got[0] != segs[1].path {
		t.Fatalf("after Forget of segments 0 and 2: obsolete %v; want from segment 1 on", got)
	}
}

// countSyncDir makes syncDir count its calls and fail while *fail is set,
// until the test ends.
func countSyncDir(t *testing.T, fail *bool) *int {
	t.Helper()
	calls := new(int)
	orig := syncDir
	syncDir = func(dir string) error {
		*calls++
		if *fail {
			return errors.New("injected directory fsync failure")
		}
		return orig(dir)
	}
	t.Cleanup(func() { syncDir = orig })
	return calls
}

// Remove syncs the log's directory after it deleted segments, and with
// nothing to delete only while an earlier deletion may not be durable:
// its directory fsync failed, or an unlink failed after others were done.
func TestRemoveSyncsTheDirectoryOnlyAfterDeletions(t *testing.T) {
	_, _, l, segs := segmentedLog(t, 4096, 600, 6)
	var fail bool
	calls := countSyncDir(t, &fail)
	remove := func(paths []string, wantDeleted int, wantErr bool, wantCalls int, what string) {
		t.Helper()
		deleted, err := l.Remove(paths)
		if len(deleted) != wantDeleted || (err != nil) != wantErr || *calls != wantCalls {
			t.Fatalf("%s: deleted %d, err %v, %d directory syncs in all; want %d deleted, error %v, %d syncs",
				what, len(deleted), err, *calls, wantDeleted, wantErr, wantCalls)
		}
		l.Forget(deleted)
	}
	remove(nil, 0, false, 0, "nothing to delete on a new log")
	remove(l.Obsolete(segs[1].first), 1, false, 1, "segment 0")
	remove(nil, 0, false, 1, "nothing to delete after a synced deletion")

	fail = true
	remove(l.Obsolete(segs[2].first), 1, true, 2, "segment 1, its directory fsync failing")
	fail = false
	remove(nil, 0, false, 3, "nothing to delete after a failed directory fsync")
	remove(nil, 0, false, 3, "nothing to delete once that fsync is done")

	// Segment 3 cannot be deleted: a non-empty directory stands at its
	// path. Segment 2 is deleted before it, with no fsync after.
	if err := os.Rename(segs[3].path, segs[3].path+".aside"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(segs[3].path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	remove(l.Obsolete(segs[4].first), 1, true, 3, "segments 2 and 3, segment 3 undeletable")
	remove(nil, 0, false, 4, "nothing to delete after an unlink failed part way")
	remove(nil, 0, false, 4, "nothing to delete once that is synced")
	if err := os.RemoveAll(segs[3].path); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(segs[3].path+".aside", segs[3].path); err != nil {
		t.Fatal(err)
	}
	remove(l.Obsolete(segs[4].first), 1, false, 5, "segment 3 once deletable")
}
