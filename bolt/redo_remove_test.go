package bolt

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// The flusher deletes the redo segments the tree holds without the log's
// lock: a write is appended and answered while their deletion is held.
// (An unlink of a preallocated segment under write load took 42 ms, and
// every append waited behind it.) Once the flush ends they are gone, and
// every write, the one made meanwhile too, survives a crash.
func TestEngineAppendsWhileObsoleteSegmentsAreDeleted(t *testing.T) {
	s39SmallSegments(t)
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	acked := engineAcquire(t, s, "filler", 45)
	if n := len(s35eSegments(t, path)); n < 3 {
		t.Fatalf("%d redo segments after 45 writes: want several for the flush to delete", n)
	}

	e := s.group.engine
	kicked, obsolete, release := s39HoldDeletion(t, s, "kick")
	defer release()
	acked = append(acked, kicked)
	req := acquireReq("meanwhile-acq", time.Hour, time.Now().Add(time.Hour))
	req.Identity.TargetID = "meanwhile"
	done := make(chan error, 1)
	var res lease.Result
	go func() {
		var err error
		res, err = s.Acquire(context.Background(), req)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a write while obsolete segments are deleted: %v", err)
		}
		acked = append(acked, engineLease{req, res})
	case <-time.After(30 * time.Second):
		t.Fatal("a write waited for the flusher's deletion of obsolete redo segments")
	}
	release()
	// A flush of our own waits for the flusher's to end.
	if err := e.flush(); err != nil {
		t.Fatal(err)
	}
	e.removeHook = nil
	if len(obsolete) < 2 {
		t.Fatalf("the flush found %d obsolete segments, want several", len(obsolete))
	}
	s39WantDeleted(t, path, obsolete, "after the flush")
	s = s39CrashReopen(t, s, path, acked, "after-held-deletion")
}
