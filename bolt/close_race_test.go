package bolt

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// A mutation that passed Close's check (the store was open) but reaches
// the log only while Close ends the engine must not be acknowledged and
// then lost. Close's last flush finds the tree holding every write, and a
// clean close then resets the redo log: a write appended in between was
// answered, then deleted with the log, and its lease was gone after the
// reopen. Close now waits for every mutation in flight before it closes
// anything, and none starts after.
func TestCloseWaitsForAMutationThatPassedItsCheck(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	acked := engineAcquire(t, s, "before", 3)

	admitted, releaseOp := make(chan struct{}), make(chan struct{})
	s.admittedHook = func() {
		close(admitted)
		<-releaseOp
	}
	req := acquireReq("late-acq", time.Hour, time.Now().Add(time.Hour))
	req.Identity.TargetID = "late"
	var res lease.Result
	opDone := make(chan error, 1)
	go func() {
		var err error
		res, err = s.Acquire(ctx, req)
		opDone <- err
	}()
	select {
	case <-admitted:
	case <-time.After(30 * time.Second):
		t.Fatal("the acquire did not pass the closed check")
	}

	// Close runs while the acquire is held past its check. Once Close has
	// found the tree holding every write, the acquire goes on: that is
	// where it was lost. A Close that waits for the acquire never gets
	// there while it is held; the acquire is let go after a while then.
	var released bool
	release := func() {
		if !released {
			released = true
			close(releaseOp)
		}
	}
	var opErr error
	opSettled := false
	settle := func() {
		if !opSettled {
			opErr, opSettled = <-opDone, true
		}
	}
	reachedClean := make(chan struct{})
	s.group.engine.closeHook = func() {
		close(reachedClean)
		if !released {
			release()
			settle()
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-reachedClean:
		// Close got past its wait with the acquire still held: the
		// acquire ran above, inside Close.
	case <-time.After(500 * time.Millisecond):
		release()
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	settle()

	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("reopen after the close: %v", err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, acked, "after-close")
	if opErr != nil {
		// Refused: then nothing of it may be there.
		got, err := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: time.Now().Add(time.Hour)})
		if err == nil && got.Lease != nil {
			t.Fatalf("the acquire was refused (%v) but its lease is there after the reopen: %+v", opErr, got.Lease)
		}
		t.Fatalf("the acquire admitted before Close was refused (%v): Close must let it finish", opErr)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: res.Lease.LeaseID, DeadlineAt: time.Now().Add(time.Hour)})
	if err != nil || got.Lease == nil || got.Lease.FencingToken != res.Lease.FencingToken {
		t.Fatalf("the acquire was acknowledged (token %d) and is lost after a clean close and reopen: %+v, %v",
			res.Lease.FencingToken, got.Lease, err)
	}
}
