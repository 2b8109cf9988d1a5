package bolt

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// redoSegments counts the redo log's segment files beside the store file
// at path.
func redoSegments(t *testing.T, path string) int {
	t.Helper()
	entries, err := os.ReadDir(RedoLogDir(path))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".redo") {
			n++
		}
	}
	return n
}

// The flusher deletes the redo segments the tree holds without the log's
// lock: a write is appended and answered while their deletion is held.
// (An unlink of a preallocated segment under write load took 42 ms, and
// every append waited behind it.) Once the flush ends they are gone, and
// every write, the one made meanwhile too, survives a reopen.
func TestEngineAppendsWhileObsoleteSegmentsAreDeleted(t *testing.T) {
	old := redoSegmentSize
	redoSegmentSize = 16 << 10
	t.Cleanup(func() { redoSegmentSize = old })
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	far := time.Now().Add(time.Hour)
	tokens := map[string]uint64{}
	acquire := func(target string) error {
		req := acquireReq("req-"+target, time.Minute, far)
		req.Identity.TargetID = target
		res, err := s.Acquire(ctx, req)
		if err == nil {
			tokens[res.Lease.LeaseID] = res.Lease.FencingToken
		}
		return err
	}
	for i := range 30 {
		if err := acquire("filler-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)); err != nil {
			t.Fatal(err)
		}
	}
	before := redoSegments(t, path)
	if before < 3 {
		t.Fatalf("%d redo segments after 30 writes: want several for the flush to delete", before)
	}

	e := s.group.engine
	held, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	e.removeHook = func() {
		first.Do(func() {
			close(held)
			<-release
		})
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	// The next batch freezes what the tree does not hold and kicks the
	// flusher, which stops before deleting the segments.
	e.wantFreeze.Store(true)
	if err := acquire("kick"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the flusher did not reach the deletion of obsolete segments")
	}
	done := make(chan error, 1)
	go func() {
		req := acquireReq("req-meanwhile", time.Minute, far)
		req.Identity.TargetID = "meanwhile"
		res, err := s.Acquire(ctx, req)
		if err == nil {
			tokens[res.Lease.LeaseID] = res.Lease.FencingToken
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write while obsolete segments are deleted: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a write waited for the flusher's deletion of obsolete redo segments")
	}
	released = true
	close(release)
	// A flush of our own waits for the flusher's to end.
	if err := e.flush(); err != nil {
		t.Fatal(err)
	}
	if after := redoSegments(t, path); after >= before || after > 2 {
		t.Fatalf("%d redo segments before the flush, %d after: the ones the tree holds must go", before, after)
	}
	e.removeHook = nil
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	redoSegmentSize = old
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 32 {
		t.Fatalf("%d leases acquired, want 32", len(tokens))
	}
	for id, token := range tokens {
		got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: id, DeadlineAt: far})
		if err != nil || got.Lease == nil || got.Lease.FencingToken != token {
			t.Fatalf("lease %s after reopen: %+v, %v; want token %d", id, got.Lease, err, token)
		}
	}
}
