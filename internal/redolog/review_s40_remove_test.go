package redolog

import (
	"errors"
	"os"
	"sync"
	"testing"
)

// The states a crash can leave when a Remove's unlinks were not made
// durable (its directory fsync failed or never ran, and with this commit
// no empty Remove syncs for it unless removedUnsynced): the obsolete
// segments come back. Those of the last Remove only: any later directory
// fsync (a Remove with deletions, newSegment, Reset) makes earlier
// unlinks durable. With unlinks in order the ones back are a suffix of
// that Remove's list (the oldest ones gone durably first is impossible on
// a journalling file system, which commits them in order). Open must
// read on from the tree's mark in each.
func TestS40ResurrectedObsoleteSegmentsReopen(t *testing.T) {
	for back := 1; back <= 3; back++ {
		dir, o, l, segs := segmentedLog(t, 4096, 400, 5)
		upTo := segs[3].first
		saved := map[string][]byte{}
		for _, p := range l.Obsolete(upTo) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			saved[p] = b
		}
		if err := l.Drop(upTo); err != nil {
			t.Fatal(err)
		}
		// An empty Remove now: it must not need to sync.
		if _, err := l.Remove(nil); err != nil {
			t.Fatal(err)
		}
		l.Close()
		for _, s := range segs[3-back : 3] {
			if err := os.WriteFile(s.path, saved[s.path], 0o600); err != nil {
				t.Fatal(err)
			}
		}
		l2, recs, err := Open(dir, upTo, o)
		if err != nil {
			t.Fatalf("%d obsolete segments back: Open: %v", back, err)
		}
		wantRecords(t, recs, int(segs[3-back].first), 401)
		// The next Drop takes them again, and appends go on.
		if err := l2.Drop(upTo); err != nil {
			t.Fatal(err)
		}
		appendN(t, l2, 401, 20)
		l2.Close()
		_, recs = mustOpen(t, dir, upTo, o)
		wantRecords(t, recs, int(upTo), 421)
	}
}

// Not this commit's: unlinks of one Remove made durable out of order (a
// file system that does not journal the directory in order) leave a gap
// before the segments the tree needs, and Open refuses the log. Logged
// only, to document the window the directory fsync closes.
func TestS40OutOfOrderUnlinksLeaveAGap(t *testing.T) {
	dir, o, l, segs := segmentedLog(t, 4096, 400, 5)
	upTo := segs[3].first
	b0, err := os.ReadFile(segs[0].path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Drop(upTo); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := os.WriteFile(segs[0].path, b0, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(dir, upTo, o); errors.Is(err, ErrCorrupt) {
		t.Logf("segment 0 back without 1 and 2 (pre-existing window, before the fsync): %v", err)
	}
}

// A segment with no record that Open deletes is not synced by Open; the
// store's first Drop used to sync it at every open (Remove(nil)), and no
// longer does. Back after a crash it is deleted again, and a log that
// appended in between synced the directory in newSegment.
func TestS40RecordlessSegmentDeletedByOpenComesBack(t *testing.T) {
	dir, o := t.TempDir(), Options{SegmentSize: 4096}
	l, _ := mustOpen(t, dir, 50, o)
	appendN(t, l, 50, 1)
	l.Close()
	p := lastSegment(t, dir)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Make it hold no record: only its salt (a crash before record 50).
	clear(b[segHeader:])
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var fail bool
	calls := countSyncDir(t, &fail)
	l, recs := mustOpen(t, dir, 50, o)
	if len(recs) != 0 {
		t.Fatalf("recs %v", recs)
	}
	if err := l.Drop(50); err != nil {
		t.Fatal(err)
	}
	t.Logf("directory syncs by Remove after Open deleted a recordless segment: %d", *calls)
	l.Close()
	// Crash: the unlink was not durable, the segment is back.
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	l, recs = mustOpen(t, dir, 50, o)
	if len(recs) != 0 || l.Next() != 50 {
		t.Fatalf("after the recordless segment came back: %d recs, next %d", len(recs), l.Next())
	}
	appendN(t, l, 50, 10)
	l.Close()
	_, recs = mustOpen(t, dir, 50, o)
	wantRecords(t, recs, 50, 60)
}

// Remove (empty and not) runs while another goroutine appends, as the
// store's flusher does; run with -race.
func TestS40RemoveConcurrentWithAppend(t *testing.T) {
	_, _, l, _ := segmentedLog(t, 4096, 10, 1)
	var wg sync.WaitGroup
	var mu sync.Mutex // the store's logMu: Obsolete/Forget vs Append
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 11; i <= 3000; i++ {
			mu.Lock()
			appendN(t, l, i, 1)
			mu.Unlock()
		}
		close(done)
	}()
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
		}
		mu.Lock()
		obs := l.Obsolete(l.Next() - 5)
		mu.Unlock()
		deleted, err := l.Remove(obs)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		l.Forget(deleted)
		mu.Unlock()
		if _, err := l.Remove(nil); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}
