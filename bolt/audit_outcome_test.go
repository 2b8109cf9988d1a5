package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/audit/audittest"
)

// Concurrent writers report their outcomes after their transactions, in
// any order. A success reported late must not hide a later transaction's
// failure from Check (readiness would say the audit copy works while its
// last write failed), and a failure reported late must not outlive a later
// success.
func TestAuditSinkOutcomeFollowsTransactionOrder(t *testing.T) {
	s, err := OpenAudit(filepath.Join(t.TempDir(), "audit.db"), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(context.Background(), audittest.AcquireEvent(time.Now())); err != nil {
		t.Fatal(err)
	}
	first := s.ran.Load()
	if first == 0 {
		t.Fatal("a committed write was not numbered")
	}
	diskFull := errors.New("no space left on device")

	// Transaction first+2 failed, and its writer reported first; the
	// writer of first+1 (committed) reports after it.
	s.setOutcome(first+2, diskFull)
	s.setOutcome(first+1, nil)
	if !errors.Is(s.failed, diskFull) {
		t.Fatalf("a late success hid the later failure: failed = %v", s.failed)
	}
	// The reverse: first+4 committed, first+3's failure arrives late.
	s.setOutcome(first+4, nil)
	s.setOutcome(first+3, diskFull)
	if s.failed != nil {
		t.Fatalf("a late failure outlived the later success: failed = %v", s.failed)
	}

	// A real write after a recorded failure is newer, and clears it.
	s.setOutcome(s.ran.Add(1), diskFull)
	if err := s.Write(context.Background(), audittest.AcquireEvent(time.Now())); err != nil {
		t.Fatal(err)
	}
	if s.failed != nil {
		t.Fatalf("a committed write did not clear an older failure: %v", s.failed)
	}
}
