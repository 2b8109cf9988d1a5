package bolt

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// A new store file gets PageSize pages; a file created with 4 KiB pages
// (every file of earlier builds) keeps them, and its leases, counters and
// evidence work on across reopens.
func TestPageSizeOfNewAndOlderFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	fresh := filepath.Join(dir, "new.db")
	s, err := Open(fresh, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.db.Info().PageSize; got != PageSize {
		t.Fatalf("a new file has %d-byte pages, want %d", got, PageSize)
	}
	s.Close()

	old := filepath.Join(dir, "old.db")
	createWithPageSize(t, old, 4096)
	far := time.Now().Add(time.Hour)
	var first lease.Result
	for round := 0; round < 2; round++ {
		s, err := Open(old, Options{ReapInterval: -1})
		if err != nil {
			t.Fatalf("open a 4 KiB-page file (round %d): %v", round, err)
		}
		if got := s.db.Info().PageSize; got != 4096 {
			t.Fatalf("round %d: the older file has %d-byte pages, want 4096 kept", round, got)
		}
		switch round {
		case 0:
			if first, err = s.Acquire(ctx, acquireReq("req-old-1", time.Minute, far)); err != nil {
				t.Fatalf("acquire: %v", err)
			}
		case 1:
			again, err := s.Acquire(ctx, acquireReq("req-old-1", time.Minute, far))
			if err != nil || !again.Replayed || again.Lease.LeaseID != first.Lease.LeaseID || again.Lease.FencingToken != first.Lease.FencingToken {
				t.Fatalf("replay after reopen: %+v, %v; want the original lease %s token %d", again, err, first.Lease.LeaseID, first.Lease.FencingToken)
			}
			if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: testIdentity, LeaseID: first.Lease.LeaseID, FencingToken: first.Lease.FencingToken,
				ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: "rel-old-1", DeadlineAt: far, Caller: acquireReq("", 0, far).Caller}}); err != nil {
				t.Fatalf("release: %v", err)
			}
			next, err := s.Acquire(ctx, acquireReq("req-old-2", time.Minute, far))
			if err != nil || next.Lease.FencingToken != first.Lease.FencingToken+1 {
				t.Fatalf("acquire after release: %+v, %v; want token %d", next, err, first.Lease.FencingToken+1)
			}
		}
		s.Close()
	}
}
