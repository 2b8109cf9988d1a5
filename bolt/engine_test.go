package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/redolog"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// crash leaves s as a killed process would: the reaper and flusher
// stopped, the log and the file closed, nothing flushed.
func crash(t *testing.T, s *Store) {
	t.Helper()
	s.closed.Store(true)
	close(s.stop)
	s.wg.Wait()
	e := s.group.engine
	close(e.stop)
	e.flusherWG.Wait()
	e.logMu.Lock()
	_ = e.log.Close()
	e.logMu.Unlock()
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
}

// treeHasActive reads the file itself (closed store): whether the tree
// holds an active record of target.
func treeHasActive(t *testing.T, path string, id lease.Identity) bool {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, key, err := lease.CanonicalLockKey(id, lease.StoreOptions{}.WithDefaults().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	_ = db.View(func(tx *bbolt.Tx) error {
		found = tx.Bucket(bucketIdent).Get(activeKey(key)) != nil
		return nil
	})
	return found
}

type engineLease struct {
	req lease.AcquireRequest
	res lease.Result
}

func engineAcquire(t testing.TB, s *Store, prefix string, n int) []engineLease {
	t.Helper()
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	var out []engineLease
	for i := 0; i < n; i++ {
		req := acquireReq(fmt.Sprintf("%s-acq-%d", prefix, i), time.Hour, far)
		req.Identity.TargetID = fmt.Sprintf("%s-%d", prefix, i)
		res, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, engineLease{req, res})
	}
	return out
}

func releaseOfLease(l engineLease, id string) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: l.req.Identity, LeaseID: l.res.Lease.LeaseID, FencingToken: l.res.Lease.FencingToken,
		ServiceInstanceID: l.req.ServiceInstanceID, Mutation: lease.Mutation{RequestID: id, DeadlineAt: time.Now().Add(time.Hour), Caller: l.req.Caller}}
}

// Acknowledged writes that only the redo log holds (no flush ran) are all
// there after a crash: active leases, releases, idempotency evidence and
// counters; the next acquire of an identity gets a greater token.
func TestEngineRedoesAcknowledgedWritesAfterCrash(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "crash", 40)
	for i := 0; i < 20; i++ {
		if _, err := s.Release(ctx, releaseOfLease(leases[i], fmt.Sprint("rel-", i))); err != nil {
			t.Fatal(err)
		}
	}
	again, err := s.Acquire(ctx, leases[0].req) // a replay of a released lease's acquire
	if err != nil || !again.Replayed {
		t.Fatalf("replay before the crash: %+v, %v", again, err)
	}
	crash(t, s)
	if treeHasActive(t, path, leases[30].req.Identity) {
		t.Fatal("the tree took the writes before the crash (test setup: nothing may be flushed)")
	}

	s, err = Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatalf("reopen after the crash: %v", err)
	}
	defer s.Close()
	far := time.Now().Add(time.Hour)
	for i, l := range leases {
		got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: far})
		if err != nil {
			t.Fatalf("lease %d lost: %v", i, err)
		}
		want := lease.StateActive
		if i < 20 {
			want = lease.StateReleased
		}
		if got.Lease.State != want || got.Lease.FencingToken != l.res.Lease.FencingToken {
			t.Fatalf("lease %d: %s token %d, want %s token %d", i, got.Lease.State, got.Lease.FencingToken, want, l.res.Lease.FencingToken)
		}
	}
	// Evidence: the acquire's request id replays its own answer.
	rep, err := s.Acquire(ctx, leases[25].req)
	if err != nil || !rep.Replayed || rep.Lease.LeaseID != leases[25].res.Lease.LeaseID {
		t.Fatalf("replay after the crash: %+v, %v", rep, err)
	}
	// Counters: a new lease of a released identity gets token 2.
	req := leases[3].req
	req.RequestID = "crash-after"
	next, err := s.Acquire(ctx, req)
	if err != nil || next.Lease.FencingToken != leases[3].res.Lease.FencingToken+1 {
		t.Fatalf("acquire after the crash: %+v, %v; want token %d", next.Lease, err, leases[3].res.Lease.FencingToken+1)
	}
}

// Close makes the tree hold everything and leaves no record to redo.
func TestEngineCloseFlushesEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "close", 10)
	_, key, err := lease.CanonicalLockKey(leases[9].req.Identity, lease.StoreOptions{}.WithDefaults().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketIdent).Get(activeKey(key)) != nil {
			return errors.New("flushed before close (test setup)")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i, l := range leases {
		if !treeHasActive(t, path, l.req.Identity) {
			t.Fatalf("lease %d is not in the tree after Close", i)
		}
	}
	var applied uint64
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyRedoApplied); len(v) == 8 {
			applied = uint64FromBytes(v)
		}
		return nil
	})
	db.Close()
	log, recs, err := redolog.Open(RedoLogDir(path), applied+1, redolog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	for _, r := range recs {
		if r.Seq > applied {
			t.Fatalf("record %d is not in the tree (applied %d) after Close", r.Seq, applied)
		}
	}
	if applied == 0 {
		t.Fatal("no redo record was applied (test setup)")
	}
}

func uint64FromBytes(v []byte) uint64 {
	var n uint64
	for _, b := range v {
		n = n<<8 | uint64(b)
	}
	return n
}

// Reads see acknowledged writes the tree does not hold yet, and go on
// seeing them across a flush.
func TestEngineReadsSeeUnflushedWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	leases := engineAcquire(t, s, "reads", 5)
	if _, err := s.Release(ctx, releaseOfLease(leases[0], "rel-0")); err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour)
	check := func(when string) {
		t.Helper()
		for i, l := range leases {
			got, err := s.Inspect(ctx, lease.InspectRequest{Identity: l.req.Identity, DeadlineAt: far})
			switch {
			case i == 0 && lease.CodeOf(err) != lease.CodeNotFound:
				t.Fatalf("%s: released lease 0: %+v, %v", when, got.Lease, err)
			case i > 0 && (err != nil || got.Lease.LeaseID != l.res.Lease.LeaseID):
				t.Fatalf("%s: lease %d: %+v, %v", when, i, got.Lease, err)
			}
		}
		page, err := s.List(ctx, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-actor", PageSize: 100, DeadlineAt: far})
		if err != nil || len(page.Leases) != 4 {
			t.Fatalf("%s: list: %d leases, %v; want 4", when, len(page.Leases), err)
		}
		hist, err := s.History(ctx, lease.HistoryRequest{Identity: leases[0].req.Identity, PageSize: 10, DeadlineAt: far})
		if err != nil || len(hist.Entries) != 1 || hist.Entries[0].Record.LeaseID != leases[0].res.Lease.LeaseID {
			t.Fatalf("%s: history: %+v, %v", when, hist, err)
		}
	}
	check("before the flush")
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	check("after the flush")
}

// A redo log beside another store file (restored or swapped by hand) is
// refused, not redone into it.
func TestEngineRefusesTheLogOfAnotherFile(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")
	s, err := Open(a, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	engineAcquire(t, s, "a", 3)
	crash(t, s)
	other, err := Open(b, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(RedoLogDir(b)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(RedoLogDir(a), RedoLogDir(b)); err != nil {
		t.Fatal(err)
	}
	_, err = Open(b, Options{ReapInterval: -1})
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("open beside another file's log: %v, want lease_corrupt", err)
	}
}

// Damage to an acknowledged record (not the last) fails Open closed; the
// store is not opened around it.
func TestEngineDamagedLogFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "damage", 6)
	crash(t, s)
	segs, err := filepath.Glob(filepath.Join(RedoLogDir(path), "*.redo"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v, %v", segs, err)
	}
	raw, err := os.ReadFile(segs[len(segs)-1])
	if err != nil {
		t.Fatal(err)
	}
	// The second record's lease id: flip a byte of it.
	id := []byte(leases[1].res.Lease.LeaseID)
	at := bytes.Index(raw, id)
	if at < 0 {
		t.Fatal("the record is not in the log (test setup)")
	}
	f, err := os.OpenFile(segs[len(segs)-1], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{raw[at+8] ^ 0x01}, int64(at+8)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = Open(path, Options{ReapInterval: -1})
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("open over a damaged record: %v, want lease_corrupt", err)
	}
}

// An append whose outcome is unknown stops every later write in the
// process (the record may be redone at the next Open), reads go on, and
// health says why; after reopening, writes resume and no token repeats.
func TestEngineFailedAppendRefusesLaterWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "fail", 2)
	e := s.group.engine
	e.logMu.Lock()
	_ = e.log.Close() // the next append fails
	e.logMu.Unlock()
	req := acquireReq("fail-late", time.Hour, time.Now().Add(time.Hour))
	req.Identity.TargetID = "fail-late"
	if _, err := s.Acquire(ctx, req); lease.CodeOf(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("acquire whose append failed: %v, want lease_outcome_unknown", err)
	}
	req2 := req
	req2.RequestID, req2.Identity.TargetID = "fail-later", "fail-later"
	if _, err := s.Acquire(ctx, req2); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("a write after a failed append: %v, want lease_backend_unavailable", err)
	}
	if h := s.Health(ctx); h.Status != lease.HealthDegraded {
		t.Fatalf("health %+v, want degraded", h)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{Identity: leases[1].req.Identity, DeadlineAt: time.Now().Add(time.Hour)})
	if err != nil || got.Lease.LeaseID != leases[1].res.Lease.LeaseID {
		t.Fatalf("read after a failed append: %+v, %v", got.Lease, err)
	}
	crash(t, s)
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Acquire(ctx, req2)
	if err != nil || res.Lease.FencingToken != 1 {
		t.Fatalf("acquire after reopening: %+v, %v", res.Lease, err)
	}
	second := leases[1].req
	second.RequestID = "fail-second"
	if _, err := s.Release(ctx, releaseOfLease(leases[1], "fail-rel")); err != nil {
		t.Fatal(err)
	}
	next, err := s.Acquire(ctx, second)
	if err != nil || next.Lease.FencingToken != 2 {
		t.Fatalf("reacquire after reopening: %+v, %v; want token 2", next.Lease, err)
	}
}

// A backup holds every write acknowledged before it began, also those
// only the redo log held.
func TestEngineBackupHoldsUnflushedWrites(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "a.db"), Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	leases := engineAcquire(t, s, "backup", 4)
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	n := NewNamespace(filepath.Join(dir, "restored.db"), Options{ReapInterval: -1})
	if _, err := n.Restore(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	r, err := Open(filepath.Join(dir, "restored.db"), Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i, l := range leases {
		got, err := r.Inspect(ctx, lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: time.Now().Add(time.Hour)})
		if err != nil || got.Lease.FencingToken != l.res.Lease.FencingToken {
			t.Fatalf("restored lease %d: %+v, %v", i, got.Lease, err)
		}
	}
}

// failFlushes makes e's flushes fail (a stand-in for a full disk) while
// the flag it returns, set at first, stays set.
func failFlushes(e *engine) *atomic.Bool {
	var failing atomic.Bool
	failing.Store(true)
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.flushHook = func() error {
		if failing.Load() {
			return errors.New("stand-in for a full disk")
		}
		return nil
	}
	return &failing
}

// A flush that fails keeps the acknowledged writes in the layers and the
// log: reads see them, health is degraded, and past the backlog bound
// writes are refused; once flushes succeed again the tree takes them and
// writes resume.
func TestEngineFailingFlushKeepsWritesAndBoundsTheBacklog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := s.group.engine
	failing := failFlushes(e)
	e.flushMu.Lock()
	e.maxPending = 4 << 10
	e.flushMu.Unlock()
	var leases []engineLease
	far := time.Now().Add(time.Hour)
	refused := false
	for i := 0; i < 200 && !refused; i++ {
		req := acquireReq(fmt.Sprint("backlog-acq-", i), time.Hour, far)
		req.Identity.TargetID = fmt.Sprint("backlog-", i)
		res, err := s.Acquire(ctx, req)
		switch {
		case err == nil:
			leases = append(leases, engineLease{req, res})
		case lease.CodeOf(err) == lease.CodeBackendUnavailable:
			refused = true
		default:
			t.Fatalf("acquire %d: %v", i, err)
		}
		time.Sleep(2 * time.Millisecond) // let a flush be due and fail
	}
	if !refused {
		t.Fatal("writes were never refused while every flush failed past the bound")
	}
	if len(leases) == 0 {
		t.Fatal("no write was acknowledged before the bound (test setup)")
	}
	if h := s.Health(ctx); h.Status == lease.HealthOK {
		t.Fatalf("health %+v while flushes fail", h)
	}
	for i, l := range leases {
		got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: far})
		if err != nil || got.Lease.FencingToken != l.res.Lease.FencingToken {
			t.Fatalf("acknowledged lease %d while flushes fail: %+v, %v", i, got.Lease, err)
		}
	}
	failing.Store(false)
	ok := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		req := acquireReq("backlog-after", time.Hour, far)
		req.Identity.TargetID = "backlog-after"
		if _, err := s.Acquire(ctx, req); err == nil {
			ok = true
			break
		}
	}
	if !ok {
		t.Fatal("writes did not resume once flushes succeeded")
	}
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	for i, l := range leases {
		_, key, err := lease.CanonicalLockKey(l.req.Identity, lease.StoreOptions{}.WithDefaults().OperationClasses)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.db.View(func(tx *bbolt.Tx) error {
			if tx.Bucket(bucketIdent).Get(activeKey(key)) == nil {
				return fmt.Errorf("lease %d is not in the tree after flushes resumed", i)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// A full disk fails the redo append of a write (outcome unknown) and
// refuses the writes after it; once there is room again the same process
// takes writes, the failed record is not redone at the next Open, and no
// token is given twice.
func TestEngineFullDiskAppendRecovers(t *testing.T) {
	ctx := context.Background()
	dir := testenv.Tmpfs(t, 8<<20)
	path := filepath.Join(dir, "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour)
	base := engineAcquire(t, s, "full", 3)
	filler := filepath.Join(dir, "filler")
	testenv.FillDisk(t, filler)
	var unknown []lease.AcquireRequest
	refused := false
	for i := 0; i < 2000 && !refused; i++ {
		req := acquireReq(fmt.Sprint("full-more-", i), time.Hour, far)
		req.Identity.TargetID = fmt.Sprint("full-more-", i)
		req.Metadata = lease.Metadata{"pad": strings.Repeat("zq", 1500)}
		_, err := s.Acquire(ctx, req)
		switch lease.CodeOf(err) {
		case "":
		case lease.CodeOutcomeUnknown:
			unknown = append(unknown, req)
		case lease.CodeBackendUnavailable:
			refused = true
		default:
			t.Fatalf("acquire %d on a full disk: %v", i, err)
		}
	}
	if len(unknown) != 1 || !refused {
		t.Fatalf("on a full disk: %d outcome_unknown answers (want 1), refused %v", len(unknown), refused)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	again := unknown[0]
	res, err := s.Acquire(ctx, again)
	if err != nil || res.Replayed || res.Lease.FencingToken != 1 {
		t.Fatalf("the unknown acquire retried once there is room: %+v, %v", res, err)
	}
	req := base[0].req
	if _, err := s.Release(ctx, releaseOfLease(base[0], "full-rel")); err != nil {
		t.Fatal(err)
	}
	req.RequestID = "full-reacquire"
	next, err := s.Acquire(ctx, req)
	if err != nil || next.Lease.FencingToken != 2 {
		t.Fatalf("reacquire: %+v, %v; want token 2", next.Lease, err)
	}
	crash(t, s)
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Inspect(ctx, lease.InspectRequest{Identity: again.Identity, DeadlineAt: far})
	if err != nil || got.Lease.LeaseID != res.Lease.LeaseID || got.Lease.FencingToken != 1 {
		t.Fatalf("after reopening, the retried acquire: %+v, %v; want %s token 1", got.Lease, err, res.Lease.LeaseID)
	}
	got, err = s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far})
	if err != nil || got.Lease.LeaseID != next.Lease.LeaseID || got.Lease.FencingToken != 2 {
		t.Fatalf("after reopening, the reacquired lease: %+v, %v", got.Lease, err)
	}
}

// The same file under another name that is not a symlink (a hard link,
// or a copy made while it was open) does not find the redo log it was
// written with: Open refuses it rather than miss acknowledged writes,
// while the name it was written by still opens whole.
func TestEngineRefusesAnUncleanFileWithoutItsLog(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, hard := filepath.Join(dir, "a.db"), filepath.Join(dir, "hard.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "hard", 3)
	crash(t, s)
	if err := os.Link(path, hard); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(hard, Options{ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("open of an unclean file by another name: %v, want lease_corrupt", err)
	}
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range leases {
		if _, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	// Closed cleanly, the file needs no log: the other name opens it.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	h, err := Open(hard, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("open of a cleanly closed file by another name: %v", err)
	}
	defer h.Close()
	for i, l := range leases {
		if _, err := h.Inspect(ctx, lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatalf("lease %d by the other name: %v", i, err)
		}
	}
}
