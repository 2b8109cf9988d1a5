package bolt

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Backup, restore and recovery (which revokes the restored active lease
// through archive, trimming history to a cap of 1): every acquisition of
// the identity replays and looks up exactly, on the closed restored file
// (lookups) and after recovery (replays and lookups).
func TestS40bRestoreAndRecoveryKeepReplaysExact(t *testing.T) {
	forEachByRef(t, testS40bRestoreAndRecoveryKeepReplaysExact)
}

func testS40bRestoreAndRecoveryKeepReplaysExact(t *testing.T, byRef string) {
	ctx := context.Background()
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	o := Options{StoreOptions: so, Now: c.Now, ReapInterval: -1}
	s, err := Open(filepath.Join(dir, "a.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	s.schema10Writes = byRef == "ev3"
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lives := refLives(t, s, c, "restored", 0, 2, far)
	req := acquireReq("acq-live", time.Hour, far)
	req.Identity.TargetID = "restored"
	live, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	all := append(lives, refLife{req: req, acq: live})
	if got, rel := lives[1].storedVersion(t, s, far), lives[1].storedReleaseVersion(t, s, far); got != byRef || rel != byRef {
		t.Fatalf("evidence before the backup: acquisition %s, release %s; want %s", got, rel, byRef)
	}
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	s.Close()
	target := filepath.Join(dir, "b.db")
	ns := NewNamespace(target, o)
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	r, err := ns.OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := r.(*Closed).s
	if v := storedSchema(t, closed.db); v != schemaVersion {
		t.Fatalf("restored file's schema %q, want %q", v, schemaVersion)
	}
	if got := lives[1].storedVersion(t, closed, far); got != byRef {
		t.Fatalf("restored evidence %s, want %s as backed up", got, byRef)
	}
	for _, l := range all {
		got, err := closed.LookupRequest(ctx, l.lookup(far))
		if err != nil || encoded(t, got.Lease) != encoded(t, l.acq.Lease) {
			t.Fatalf("lookup on the restored file of %s: %v", l.req.RequestID, err)
		}
	}
	c.Add(time.Minute)
	if _, err := r.Finish(ctx, lease.RecoveryPlan{Epoch: 1, Floor: 100, Reason: "review"}); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(target, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for _, l := range all {
		l.answersExactly(t, s2, far)
	}
	// And once more after the revoked lease's history entry is trimmed
	// (cap 1) by two more leases.
	more := refLives(t, s2, c, "restored", 10, 2, far)
	if got := (refLife{req: req, acq: live}).storedVersion(t, s2, far); got != "ev2" {
		t.Fatalf("the recovered lease's acquisition evidence after its history went: %s, want ev2", got)
	}
	for _, l := range append(all, more...) {
		l.answersExactly(t, s2, far)
	}
}
