package bolt

// Review attack (s39): the flusher deletes the redo segments the tree
// holds without logMu (redolog's Obsolete under it, Remove without it,
// Forget under it again). A crash may cut the deletion after any unlink;
// an unlink may fail; appends rotate segments meanwhile; other flushes
// and Close wait for it.

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// s39SmallSegments makes the redo log's segments small for the test.
func s39SmallSegments(t *testing.T) {
	old := redoSegmentSize
	redoSegmentSize = 16 << 10
	t.Cleanup(func() { redoSegmentSize = old })
}

// s39Applied is the tree's redo mark (the flush's commit is done; called
// in the flush, so no other commit runs).
func s39Applied(t *testing.T, e *engine) uint64 {
	var applied uint64
	if err := e.db.View(func(tx *bbolt.Tx) error {
		applied = binary.BigEndian.Uint64(tx.Bucket(bucketMeta).Get(keyRedoApplied))
		return nil
	}); err != nil {
		t.Error(err)
	}
	return applied
}

// s39CopyStore copies the store file at path and its redo log directory
// to a new directory: what a crash at this instant leaves (the caller
// holds logMu and no commit runs). It returns the copy's path.
func s39CopyStore(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "starlease.db")
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(path, dst)
	if err := os.MkdirAll(RedoLogDir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(RedoLogDir(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			copyFile(filepath.Join(RedoLogDir(path), e.Name()), filepath.Join(RedoLogDir(dst), e.Name()))
		}
	}
	return dst
}

// s39WantDeleted fails t unless every segment of obsolete is gone and,
// with everything acknowledged in the tree, at most the segment taking
// appends (and the one before, if the last record opened it) is left
// beside path.
func s39WantDeleted(t *testing.T, path string, obsolete []string, when string) {
	t.Helper()
	for _, p := range obsolete {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("obsolete segment %s %s: %v; want it deleted", filepath.Base(p), when, err)
		}
	}
	if left := s35eSegments(t, path); len(left) > 2 {
		t.Fatalf("%d redo segments %s, everything flushed: %v", len(left), when, left)
	}
}

// s39CrashReopen crashes s, reopens the store at path, and checks that
// every lease of acked is there with its token.
func s39CrashReopen(t *testing.T, s *Store, path string, acked []engineLease, what string) *Store {
	t.Helper()
	crash(t, s)
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s35eCheckAcked(t, s, acked, what)
	return s
}

// s39HoldDeletion writes a lease (kick) whose batch freezes what the
// tree does not hold and kicks the flusher, and holds that flush just
// before it deletes the obsolete segments. It returns the kick's lease,
// the segments the flush will delete, and release, which lets it go on
// (idempotent; defer it before the store's Close, which waits for it).
func s39HoldDeletion(t *testing.T, s *Store, kick string) (kicked engineLease, obsolete []string, release func()) {
	t.Helper()
	e := s.group.engine
	held, letGo := make(chan struct{}), make(chan struct{})
	var hold, released sync.Once
	e.removeHook = func() {
		hold.Do(func() {
			e.logMu.Lock()
			obsolete = e.log.Obsolete(s39Applied(t, e) + 1)
			e.logMu.Unlock()
			close(held)
			<-letGo
		})
	}
	release = func() { released.Do(func() { close(letGo) }) }
	e.wantFreeze.Store(true)
	kicked = engineAcquire(t, s, kick, 1)[0]
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		release()
		t.Fatal("the flusher did not reach the deletion of obsolete segments")
	}
	return kicked, obsolete, release
}

// s39Flush writes a lease (kick), then has the tree take every write as
// Store.sync does: a batch freezes the layers and kicks the flusher, and
// a flush of our own waits for the flusher's (flushMu) or does it. The
// kick lease is returned.
func s39Flush(t *testing.T, s *Store, kick string) engineLease {
	t.Helper()
	l := engineAcquire(t, s, kick, 1)[0]
	if err := s.sync(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return l
}

// A crash cuts the flusher's deletion of the segments the tree holds
// before its first unlink, after each unlink, or after the last (before
// Forget): the copy of the store at each of those instants opens, with
// every acknowledged lease and its token, and a new acquire of each
// identity gets a greater token.
func TestS39CrashAtEachStepOfTheFlushersDeletion(t *testing.T) {
	s39SmallSegments(t)
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	acked := engineAcquire(t, s, "s39crash", 60)
	if n := len(s35eSegments(t, path)); n < 4 {
		t.Fatalf("%d redo segments after 60 writes: want several", n)
	}
	e := s.group.engine
	var once sync.Once
	var obsolete []string
	var snap string
	e.removeHook = func() {
		once.Do(func() {
			e.logMu.Lock()
			defer e.logMu.Unlock()
			obsolete = e.log.Obsolete(s39Applied(t, e) + 1)
			snap = s39CopyStore(t, path)
		})
	}
	s39Flush(t, s, "s39crash-kick")
	e.removeHook = nil
	if len(obsolete) < 3 {
		t.Fatalf("the flush found %d obsolete segments, want at least 3", len(obsolete))
	}
	for _, p := range obsolete {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("obsolete segment %s after the flush: %v; want it deleted", filepath.Base(p), err)
		}
	}
	for k := 0; k <= len(obsolete); k++ {
		c := s39CopyStore(t, snap)
		for _, p := range obsolete[:k] {
			if err := os.Remove(filepath.Join(RedoLogDir(c), filepath.Base(p))); err != nil {
				t.Fatal(err)
			}
		}
		sc, err := Open(c, Options{ReapInterval: -1, FlushInterval: time.Hour})
		if err != nil {
			t.Fatalf("crash after %d of %d unlinks: reopen: %v", k, len(obsolete), err)
		}
		what := fmt.Sprintf("crash-after-%d-unlinks", k)
		s35eCheckAcked(t, sc, acked, what)
		if err := sc.Close(); err != nil {
			t.Fatal(err)
		}
		if left := s35eSegments(t, c); len(left) != 0 {
			t.Fatalf("%s: %d redo segments after a clean close, want none", what, len(left))
		}
	}
	// The store itself goes on: a crash now loses nothing either.
	more := engineAcquire(t, s, "s39crash-more", 10)
	s = s39CrashReopen(t, s, path, append(acked, more...), "own-crash")
}

// While the flusher's deletion is held: writes rotate several new
// segments in, and a second flush (Store.sync's, a backup's) waits for
// flushMu instead of taking segments off the list under the first. Once
// released, the segments on disk are those from the tree's mark on, the
// second flush deletes the rest it may, and a crash then loses nothing.
func TestS39RotationAndSecondFlushDuringHeldDeletion(t *testing.T) {
	s39SmallSegments(t)
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	acked := engineAcquire(t, s, "s39held", 30)
	e := s.group.engine
	kicked, obsolete, release := s39HoldDeletion(t, s, "s39held-kick")
	defer release()
	acked = append(acked, kicked)
	segsHeld := s35eSegments(t, path)
	// Writes meanwhile: new segments rotate in.
	acked = append(acked, engineAcquire(t, s, "s39held-meanwhile", 30)...)
	segsMore := s35eSegments(t, path)
	if len(segsMore) < len(segsHeld)+2 {
		t.Fatalf("%d segments while held, %d after 30 more writes: want new ones rotated in", len(segsHeld), len(segsMore))
	}
	// A second flush waits for the first.
	e.wantFreeze.Store(true)
	acked = append(acked, engineAcquire(t, s, "s39held-kick2", 1)...)
	second := make(chan error, 1)
	go func() { second <- e.flush() }()
	select {
	case err := <-second:
		t.Fatalf("a second flush ended (%v) while the first held its deletion", err)
	case <-time.After(100 * time.Millisecond):
	}
	for _, p := range obsolete {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("obsolete segment %s before its deletion ran: %v", filepath.Base(p), err)
		}
	}
	release()
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("second flush: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second flush did not end once the first was released")
	}
	e.removeHook = nil
	s39WantDeleted(t, path, obsolete, "after both flushes")
	s = s39CrashReopen(t, s, path, acked, "held-crash")
}

// Close while the flusher's deletion is held: Close waits for it (its
// Reset must not run between the flusher's Obsolete and Forget), ends
// clean, and the log is empty; every acknowledged lease reopens.
func TestS39CloseWaitsForHeldDeletion(t *testing.T) {
	s39SmallSegments(t)
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	acked := engineAcquire(t, s, "s39close", 30)
	e := s.group.engine
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.removeHook = func() {
		once.Do(func() {
			close(held)
			<-release
		})
	}
	e.wantFreeze.Store(true)
	acked = append(acked, engineAcquire(t, s, "s39close-kick", 1)...)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the flusher did not reach the deletion")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		close(release)
		t.Fatalf("Close ended (%v) while the flusher held its deletion", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not end once the deletion was released")
	}
	if left := s35eSegments(t, path); len(left) != 0 {
		t.Fatalf("%d redo segments after a clean close: %v", len(left), left)
	}
	s, err = Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, acked, "after-close")
}

// An unlink that fails part way (the second obsolete segment cannot be
// deleted): the first is gone, the rest stay on the list and on disk,
// writes go on, and the next flush that has writes to take deletes them.
// The log stays whole from its first segment: a crash in between and
// after loses nothing.
func TestS39FailedUnlinkInFlushLeavesTheRestForTheNext(t *testing.T) {
	s39SmallSegments(t)
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	acked := engineAcquire(t, s, "s39unlink", 60)
	e := s.group.engine
	var once sync.Once
	var obsolete []string
	var blocked bool
	e.removeHook = func() {
		once.Do(func() {
			e.logMu.Lock()
			obsolete = e.log.Obsolete(s39Applied(t, e) + 1)
			e.logMu.Unlock()
			if len(obsolete) < 3 {
				return
			}
			// A non-empty directory stands at the second one's path.
			if err := os.Rename(obsolete[1], obsolete[1]+".aside"); err != nil {
				t.Error(err)
				return
			}
			if err := os.MkdirAll(filepath.Join(obsolete[1], "x"), 0o700); err != nil {
				t.Error(err)
				return
			}
			blocked = true
		})
	}
	e.wantFreeze.Store(true)
	acked = append(acked, engineAcquire(t, s, "s39unlink-kick", 1)...)
	// Our flush waits for the flusher's (whose error the flusher keeps
	// to itself) or is the failing one.
	_ = e.flush()
	e.removeHook = nil
	if !blocked {
		t.Fatalf("the flush found %d obsolete segments, want at least 3", len(obsolete))
	}
	if _, err := os.Stat(obsolete[0]); !os.IsNotExist(err) {
		t.Fatalf("first obsolete segment after the failed deletion: %v; want it deleted", err)
	}
	for _, p := range obsolete[2:] {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("obsolete segment %s after the deletion failed before it: %v; want it kept", filepath.Base(p), err)
		}
	}
	h := s.Health(context.Background())
	t.Logf("health after a failed unlink: %s %q", h.Status, h.Reason)
	if h.Status == lease.HealthUnavailable {
		t.Fatalf("health after a failed unlink: %s %q", h.Status, h.Reason)
	}
	// Writes go on while the segment cannot be deleted.
	acked = append(acked, engineAcquire(t, s, "s39unlink-meanwhile", 10)...)
	// A backup's flush meets the same undeletable segment (recorded, not
	// asserted: the tree holds every write, yet the flush reports the
	// failed unlink, as Drop did before the change).
	_, berr := s.Backup(context.Background(), io.Discard)
	t.Logf("backup while a segment cannot be deleted: %v", berr)
	// The obstacle goes; a crash now (the segment back in place) loses
	// nothing.
	if err := os.RemoveAll(obsolete[1]); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(obsolete[1]+".aside", obsolete[1]); err != nil {
		t.Fatal(err)
	}
	e.logMu.Lock()
	c := s39CopyStore(t, path)
	e.logMu.Unlock()
	sc, err := Open(c, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatalf("reopen of a crash after the failed deletion: %v", err)
	}
	s35eCheckAcked(t, sc, acked, "failed-unlink-crash")
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	// The next flush with writes deletes what the failed one left.
	acked = append(acked, s39Flush(t, s, "s39unlink-kick2"))
	s39WantDeleted(t, path, obsolete, "the failed deletion left, after the next flush")
	s = s39CrashReopen(t, s, path, acked, "next-flush-crash")
}

// Writers, the flusher (a short interval), and goroutines flushing as
// Store.sync does, all at once over small segments (run under -race):
// no flush takes a segment off the list under another, and after a
// crash every acknowledged lease is there; a clean close then leaves no
// segment.
func TestS39ConcurrentFlushesAndWrites(t *testing.T) {
	s39SmallSegments(t)
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	e := s.group.engine
	var mu sync.Mutex
	var acked []engineLease
	var writers, flushers sync.WaitGroup
	var stop atomic.Bool
	var flushes, flushErrs atomic.Int64
	for g := range 8 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			ls := engineAcquire(t, s, fmt.Sprintf("s39conc-%d", g), 40)
			mu.Lock()
			acked = append(acked, ls...)
			mu.Unlock()
		}()
	}
	for range 3 {
		flushers.Add(1)
		go func() {
			defer flushers.Done()
			for !stop.Load() {
				e.wantFreeze.Store(true)
				if err := e.flush(); err != nil {
					flushErrs.Add(1)
				}
				flushes.Add(1)
			}
		}()
	}
	writers.Wait()
	stop.Store(true)
	flushers.Wait()
	if flushErrs.Load() != 0 {
		t.Fatalf("%d of %d flushes failed", flushErrs.Load(), flushes.Load())
	}
	crash(t, s)
	s, err = Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s35eCheckPresent(t, s, acked, "concurrent-crash")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left := s35eSegments(t, path); len(left) != 0 {
		t.Fatalf("%d redo segments after a clean close: %v", len(left), left)
	}
	s, err = Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d flushes", flushes.Load())
}

const s39ChildEnv = "STARLEASE_S39_KILL_CHILD"

// TestS39KillChild is the child of TestS39KillDuringSegmentDeletion (in
// any other run it returns at once): small segments (32 KiB: a batch's
// record must fit one) and a 2 ms flush
// interval, so the flusher deletes segments nearly all the time while 8
// writers acquire and release their identity over and over.
func TestS39KillChild(t *testing.T) {
	path := os.Getenv(s39ChildEnv)
	if path == "" {
		return
	}
	redoSegmentSize = 32 << 10
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: 2 * time.Millisecond})
	if err != nil {
		fmt.Println("OPENERR", err)
		os.Exit(3)
	}
	round := os.Getenv(s39ChildEnv + "_ROUND")
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
		mu.Unlock()
	}
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := fmt.Sprintf("s39k-%d", g)
			for k := 0; ; k++ {
				req := acquireReq(fmt.Sprintf("acq-%s-r%s-%d", target, round, k), time.Hour, far)
				req.Identity.TargetID = target
				res, err := s.Acquire(ctx, req)
				if lease.CodeOf(err) == lease.CodeConflict {
					// Left active by the round before the kill.
					cur, ierr := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far})
					if ierr == nil && cur.Lease != nil {
						_, _ = s.Release(ctx, releaseOfLease(engineLease{req, lease.Result{Lease: cur.Lease}}, fmt.Sprintf("relx-%s-r%s-%d", target, round, k)))
					}
					continue
				}
				if err != nil {
					say("ERR %s %v", target, err)
					continue
				}
				say("ACK %s %s %d", target, res.Lease.LeaseID, res.Lease.FencingToken)
				if _, err := s.Release(ctx, releaseOfLease(engineLease{req, res}, fmt.Sprintf("rel-%s-r%s-%d", target, round, k))); err == nil {
					say("REL %s %s", target, res.Lease.LeaseID)
				}
			}
		}()
	}
	wg.Wait()
}

// SIGKILL lands anywhere in the flusher's deletion of segments (between
// unlinks, before the directory fsync, between Remove and Forget) and in
// the redo at open: every reopen succeeds (no gap in the log), the last
// acknowledged lease of each identity is there with its token (released
// if its release was acknowledged), and a new acquire gets a greater
// token.
func TestS39KillDuringSegmentDeletion(t *testing.T) {
	s39SmallSegments(t)
	redoSegmentSize = 32 << 10
	path := filepath.Join(t.TempDir(), "starlease.db")
	maxTok := map[string]uint64{}
	last := map[string]string{} // target → its last acknowledged lease
	released := map[string]bool{}
	for round := range 6 {
		child := startCrashChild(t, "TestS39KillChild", s39ChildEnv, path, round)
		sc := bufio.NewScanner(child.out)
		n, killAt := 0, 150+round*120
		killed := false
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 4 && f[0] == "ACK":
				tok, _ := strconv.ParseUint(f[3], 10, 64)
				if tok <= maxTok[f[1]] {
					t.Errorf("round %d: %s acknowledged token %d after %d", round, f[1], tok, maxTok[f[1]])
				}
				maxTok[f[1]], last[f[1]] = tok, f[2]
				n++
			case len(f) == 3 && f[0] == "REL":
				released[f[2]] = true
			case len(f) > 0 && (f[0] == "OPENERR" || f[0] == "ERR"):
				t.Errorf("round %d child: %s", round, sc.Text())
			}
			if n >= killAt && !killed {
				killed = true
				child.kill()
			}
		}
		_ = child.cmd.Wait()
		if !killed {
			t.Fatalf("round %d: child exited before the kill (%d acks)", round, n)
		}
		s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
		if err != nil {
			t.Fatalf("round %d: reopen after the kill: %v", round, err)
		}
		ctx := context.Background()
		far := time.Now().Add(time.Hour)
		for target, id := range last {
			got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: id, DeadlineAt: far})
			if err != nil || got.Lease == nil {
				t.Fatalf("round %d: acknowledged lease %s of %s LOST: %v", round, id, target, err)
			}
			if got.Lease.FencingToken != maxTok[target] {
				t.Fatalf("round %d: %s token %d, acknowledged %d", round, target, got.Lease.FencingToken, maxTok[target])
			}
			if released[id] && got.Lease.State != lease.StateReleased {
				t.Fatalf("round %d: acknowledged release of %s lost: %s", round, id, got.Lease.State)
			}
			req := acquireReq(fmt.Sprintf("check-%s-%d", target, round), time.Hour, far)
			req.Identity.TargetID = target
			// The identity's active lease: the last acknowledged one, or
			// one acquired after it whose answer the kill cut off.
			if cur, err := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far}); err == nil && cur.Lease != nil && cur.Lease.State == lease.StateActive {
				if cur.Lease.FencingToken < maxTok[target] {
					t.Fatalf("round %d: %s active token %d below acknowledged %d", round, target, cur.Lease.FencingToken, maxTok[target])
				}
				if _, err := s.Release(ctx, releaseOfLease(engineLease{req, lease.Result{Lease: cur.Lease}}, fmt.Sprintf("check-rel-%s-%d", target, round))); err != nil {
					t.Fatalf("round %d: release %s: %v", round, target, err)
				}
			}
			res, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatalf("round %d: acquire %s: %v", round, target, err)
			}
			if res.Lease.FencingToken <= maxTok[target] {
				t.Fatalf("round %d: FENCING TOKEN REUSED for %s: %d after acknowledged %d", round, target, res.Lease.FencingToken, maxTok[target])
			}
			maxTok[target], last[target] = res.Lease.FencingToken, res.Lease.LeaseID
			if _, err := s.Release(ctx, releaseOfLease(engineLease{req, res}, fmt.Sprintf("check-rel2-%s-%d", target, round))); err != nil {
				t.Fatalf("round %d: release %s: %v", round, target, err)
			}
			released[res.Lease.LeaseID] = true
		}
		// Every other round the parent crashes too, leaving its log.
		if round%2 == 0 {
			crash(t, s)
		} else if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: killed after %d acks", round, n)
	}
}
