package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// Review of the two-deep write pipeline (a59261d, cf9f152): a batch k is
// held before its redo append (appendHook) while batch k+1 has run its
// functions over k's writes and waits for k.
//
// s38Pipe lines the two up with real store operations: the first write's
// clock reading (Options.Now) waits until a second write is queued, so
// the engine hands k to complete in a goroutine (a write waits) and k+1
// runs over it at once.
type s38Pipe struct {
	s   *Store
	clk *clock
	// gate, when set, makes the next clock reading wait for a queued
	// write; afterGate then runs (e.g. moves the clock on for k+1).
	gate      atomic.Bool
	gated     chan struct{}
	afterGate func()
	// holdNext holds the next append (its batch id goes to held) until
	// release is sent; onOther runs before every other append.
	holdNext atomic.Bool
	held     chan int
	release  chan struct{}
	mu       sync.Mutex
	onOther  func(id int)
}

func s38Open(t *testing.T, path string, interval time.Duration) *s38Pipe {
	t.Helper()
	p := &s38Pipe{clk: &clock{t: time.Now()}, gated: make(chan struct{}, 1), held: make(chan int, 1),
		release: make(chan struct{})}
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: interval, Now: p.now})
	if err != nil {
		t.Fatal(err)
	}
	p.s = s
	s.group.engine.appendHook = p.hook
	return p
}

func (p *s38Pipe) now() time.Time {
	t := p.clk.Now()
	if p.gate.CompareAndSwap(true, false) {
		p.gated <- struct{}{}
		for p.s.group.queue.Queued() < 1 {
			time.Sleep(time.Millisecond)
		}
		if p.afterGate != nil {
			p.afterGate()
		}
	}
	return t
}

func (p *s38Pipe) hook(id int) {
	if p.holdNext.CompareAndSwap(true, false) {
		p.held <- id
		<-p.release
		return
	}
	p.mu.Lock()
	f := p.onOther
	p.mu.Unlock()
	if f != nil {
		f(id)
	}
}

func (p *s38Pipe) setOnOther(f func(int)) {
	p.mu.Lock()
	p.onOther = f
	p.mu.Unlock()
}

// lineUp runs first as batch k, held before its append, and second as
// batch k+1 over it; it returns once k+1 has run its functions (and
// waits for k). The errors arrive on the channels once answered.
func (p *s38Pipe) lineUp(t *testing.T, first, second func() error) (k int, firstErr, secondErr chan error) {
	return p.lineUpWait(t, true, first, second)
}

// lineUpWait is lineUp; without waitApplied it returns once k is held.
func (p *s38Pipe) lineUpWait(t *testing.T, waitApplied bool, first, second func() error) (k int, firstErr, secondErr chan error) {
	t.Helper()
	firstErr, secondErr = make(chan error, 1), make(chan error, 1)
	p.holdNext.Store(true)
	p.gate.Store(true)
	go func() { firstErr <- first() }()
	select {
	case <-p.gated:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never read its clock")
	}
	go func() { secondErr <- second() }()
	select {
	case k = <-p.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch never reached its append")
	}
	e := p.s.group.engine
	deadline := time.Now().Add(10 * time.Second)
	for waitApplied {
		e.topMu.Lock()
		applied := e.applied
		e.topMu.Unlock()
		if applied > k {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second batch never ran over held batch %d (applied %d)", k, applied)
		}
		time.Sleep(time.Millisecond)
	}
	return k, firstErr, secondErr
}

func s38Wait(t *testing.T, ch chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer", what)
		return nil
	}
}

func s38Ident(target string) lease.Identity {
	id := testIdentity
	id.TargetID = target
	return id
}

func s38Acquire(target, reqID, instance string) lease.AcquireRequest {
	req := acquireReq(reqID, time.Hour, s35Far)
	req.Identity = s38Ident(target)
	req.ServiceInstanceID = instance
	req.Metadata = lease.Metadata{"pad": strings.Repeat("zq", 1500)}
	return req
}

func s38Lookup(op lease.Op, target, reqID string) lease.LookupRequest {
	return lease.LookupRequest{Op: op, Identity: s38Ident(target), PrincipalID: "prn-actor", RequestID: reqID, DeadlineAt: s35Far}
}

// s38BackendTime is a read's backend time, from its result or its error.
func s38BackendTime(t *testing.T, res lease.Result, err error) int64 {
	t.Helper()
	if err != nil {
		var le *lease.Error
		if !errors.As(err, &le) {
			t.Fatalf("read error without backend time: %v", err)
		}
		return le.BackendTime.UnixMilli()
	}
	return res.BackendTime.UnixMilli()
}

// s38ExpectHolder checks that target's active lease is want (id and
// token), and that a lookup of each missing request finds nothing.
func s38ExpectHolder(t *testing.T, s *Store, target string, want *lease.Record, what string) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Inspect(ctx, lease.InspectRequest{Identity: s38Ident(target), DeadlineAt: s35Far})
	if err != nil || res.Lease == nil || res.Lease.LeaseID != want.LeaseID || res.Lease.FencingToken != want.FencingToken ||
		res.Lease.State != lease.StateActive {
		t.Fatalf("%s: %s holds %+v, %v; want %s token %d active", what, target, res.Lease, err, want.LeaseID, want.FencingToken)
	}
	list, err := s.List(ctx, lease.ListRequest{By: lease.ListByTarget, TenantID: testIdentity.TenantID, ProgramID: testIdentity.ProgramID,
		TargetNamespace: testIdentity.TargetNamespace, TargetID: target, PageSize: 10, DeadlineAt: s35Far})
	if err != nil || len(list.Leases) != 1 || list.Leases[0].LeaseID != want.LeaseID {
		t.Fatalf("%s: list of %s: %v, %v; want only %s", what, target, list.Leases, err, want.LeaseID)
	}
}

func s38ExpectNoRequest(t *testing.T, s *Store, op lease.Op, target, reqID, what string) {
	t.Helper()
	if r, err := s.LookupRequest(context.Background(), s38Lookup(op, target, reqID)); code(err) != lease.CodeNotFound {
		t.Fatalf("%s: request %s (%s) must have no result: %+v, %v", what, reqID, op, r, err)
	}
}

func s38NotInHistory(t *testing.T, s *Store, target, leaseID, what string) {
	t.Helper()
	h, err := s.History(context.Background(), lease.HistoryRequest{Identity: s38Ident(target), PageSize: 100, DeadlineAt: s35Far})
	if err != nil && code(err) != lease.CodeNotFound {
		t.Fatalf("%s: history: %v", what, err)
	}
	for _, e := range h.Entries {
		if e.Record.LeaseID == leaseID {
			t.Fatalf("%s: history of %s holds %s (%s)", what, target, leaseID, e.Record.State)
		}
	}
}

// 1. A batch held before its append: no read sees it (Inspect, List,
// History, LookupRequest, by identity and by lease id), and a read that
// does not see it reports a backend time no later than its time, even
// though the batch after it (k+1, over it) read a later time. After the
// release both are seen, and survive a crash.
//
// Checked against: complete publishing before the append (the reads see
// the release); readTx bounding by the newest pending batch (the old
// single pendingTx: the read reports k+1's time, 5 s after k's).
func TestS38HeldBatchInvisibleAndReadTimeBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	p := s38Open(t, path, time.Hour)
	s := p.s
	l0, err := s.Acquire(ctx, s38Acquire("held", "held-acq-0", "inst-0"))
	if err != nil {
		t.Fatal(err)
	}
	p.clk.Add(time.Second)
	kMs := p.clk.Now().UnixMilli()
	p.afterGate = func() { p.clk.Add(5 * time.Second) } // k+1 reads a later time than k
	relReq := releaseOfLease(engineLease{s38Acquire("held", "held-acq-0", "inst-0"), l0}, "held-rel-0")
	var relRes, acqRes lease.Result
	_, relErr, acqErr := p.lineUp(t,
		func() error { var err error; relRes, err = s.Release(ctx, relReq); return err },
		func() error {
			var err error
			acqRes, err = s.Acquire(ctx, s38Acquire("held", "held-acq-1", "inst-1"))
			return err
		})
	p.clk.Add(20 * time.Second) // reads now are well past both batches' times
	// Concurrent readers, several rounds, while k is held.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				res, err := s.Inspect(ctx, lease.InspectRequest{Identity: s38Ident("held"), DeadlineAt: s35Far})
				switch {
				case err != nil || res.Lease == nil || res.Lease.LeaseID != l0.Lease.LeaseID || res.Lease.State != lease.StateActive:
					errs <- fmt.Errorf("inspect while held: %+v, %v (the held release is visible)", res.Lease, err)
					return
				case res.BackendTime.UnixMilli() > kMs:
					errs <- fmt.Errorf("inspect while held reports %d, after the held batch's time %d (its state is the one before)",
						res.BackendTime.UnixMilli(), kMs)
					return
				}
				byID, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l0.Lease.LeaseID, DeadlineAt: s35Far})
				if err != nil || byID.Lease.State != lease.StateActive {
					errs <- fmt.Errorf("inspect by id while held: %+v, %v", byID.Lease, err)
					return
				}
				r, err := s.LookupRequest(ctx, s38Lookup(lease.OpRelease, "held", "held-rel-0"))
				if code(err) != lease.CodeNotFound {
					errs <- fmt.Errorf("lookup of the held release: %+v, %v", r, err)
					return
				}
				if bt := s38BackendTime(t, r, err); bt > kMs {
					errs <- fmt.Errorf("lookup while held reports %d, after the held batch's %d", bt, kMs)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s38ExpectHolder(t, s, "held", l0.Lease, "while held")
	s38ExpectNoRequest(t, s, lease.OpAcquire, "held", "held-acq-1", "while held")
	s38NotInHistory(t, s, "held", l0.Lease.LeaseID, "while held")
	h, err := s.History(ctx, lease.HistoryRequest{Identity: s38Ident("held"), PageSize: 10, DeadlineAt: s35Far})
	if err == nil && h.BackendTime.UnixMilli() > kMs {
		t.Fatalf("history while held reports %d, after the held batch's %d", h.BackendTime.UnixMilli(), kMs)
	}
	select {
	case err := <-relErr:
		t.Fatalf("the held release was answered before its append: %v", err)
	case err := <-acqErr:
		t.Fatalf("the batch over the held one was answered before it: %v", err)
	default:
	}
	p.release <- struct{}{}
	if err := s38Wait(t, relErr, "release"); err != nil {
		t.Fatal(err)
	}
	if err := s38Wait(t, acqErr, "acquire"); err != nil {
		t.Fatal(err)
	}
	if acqRes.Lease.FencingToken != l0.Lease.FencingToken+1 || relRes.Lease.State != lease.StateReleased {
		t.Fatalf("after release: release %+v, acquire token %d", relRes.Lease, acqRes.Lease.FencingToken)
	}
	s38ExpectHolder(t, s, "held", acqRes.Lease, "after release")
	res, err := s.Inspect(ctx, lease.InspectRequest{Identity: s38Ident("held"), DeadlineAt: s35Far})
	if err != nil || res.BackendTime.UnixMilli() < acqRes.BackendTime.UnixMilli() {
		t.Fatalf("a read after both answers reports %v before the acquire's %v (%v)", res.BackendTime, acqRes.BackendTime, err)
	}
	crash(t, s)
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s38ExpectHolder(t, s, "held", acqRes.Lease, "after crash")
	if r, err := s.LookupRequest(ctx, s38Lookup(lease.OpRelease, "held", "held-rel-0")); err != nil || r.Lease.LeaseID != l0.Lease.LeaseID {
		t.Fatalf("after crash, the release's evidence: %+v, %v", r, err)
	}
}

// 2 and 4. The held batch's append fails on a full disk (a real ENOSPC
// of a tmpfs) while the batch after it has run over its writes and a
// third write is queued: the held write is outcome_unknown, the one over
// it refused, neither visible then or after recovery, a flush, or a
// crash and reopen; Health is called all along (its recover races the
// failing append, the rollback and the filler's removal); writes resume;
// retries of both requests then run fresh, and no token is given twice.
//
// Checked against: run no longer rolling back prev after its own
// rollback; the two rollbacks in the wrong order (prev first: the
// release's delete comes back from k+1's undo).
func TestS38FailedAppendUnderPipelinedBatch(t *testing.T) {
	ctx := context.Background()
	dir := testenv.Tmpfs(t, 8<<20)
	path := filepath.Join(dir, "starlease.db")
	filler := filepath.Join(dir, "filler")
	p := s38Open(t, path, time.Hour)
	s := p.s
	e := s.group.engine
	// k+1's append (when k's succeeded) first frees the disk.
	p.setOnOther(func(int) { _ = os.Remove(filler) })
	cur, err := s.Acquire(ctx, s38Acquire("full", "full-acq-0", "inst-0"))
	if err != nil {
		t.Fatal(err)
	}
	curReq := s38Acquire("full", "full-acq-0", "inst-0")
	given := map[uint64]string{cur.Lease.FencingToken: cur.Lease.LeaseID}
	var extra []lease.AcquireRequest // the queued third writes acknowledged
	failedRound := -1
	var relReq lease.ReleaseRequest
	var nextReq lease.AcquireRequest
	for r := 1; r < 40 && failedRound < 0; r++ {
		relReq = releaseOfLease(engineLease{curReq, cur}, fmt.Sprint("full-rel-", r))
		nextReq = s38Acquire("full", fmt.Sprint("full-acq-", r), fmt.Sprint("inst-", r))
		var nextRes lease.Result
		_, relErr, acqErr := p.lineUp(t,
			func() error { _, err := s.Release(ctx, relReq); return err },
			func() error { var err error; nextRes, err = s.Acquire(ctx, nextReq); return err })
		// A third write, queued behind k+1.
		thirdReq := s38Acquire(fmt.Sprint("third-", r), fmt.Sprint("third-acq-", r), "inst-x")
		thirdErr := make(chan error, 1)
		go func() { _, err := s.Acquire(ctx, thirdReq); thirdErr <- err }()
		for s.group.queue.Queued() < 1 {
			time.Sleep(time.Millisecond)
		}
		s38ExpectHolder(t, s, "full", cur.Lease, fmt.Sprint("round ", r, " while held"))
		// Health all along; the filler goes as soon as the engine failed.
		stop := make(chan struct{})
		var hw sync.WaitGroup
		for g := 0; g < 3; g++ {
			hw.Add(1)
			go func() {
				defer hw.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = s.Health(ctx)
				}
			}()
		}
		hw.Add(1)
		go func() {
			defer hw.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				e.mu.Lock()
				failed := e.failed != nil
				e.mu.Unlock()
				if failed {
					_ = os.Remove(filler)
					return
				}
				time.Sleep(50 * time.Microsecond)
			}
		}()
		testenv.FillDisk(t, filler)
		p.release <- struct{}{}
		errRel := s38Wait(t, relErr, "release")
		errAcq := s38Wait(t, acqErr, "acquire")
		errThird := s38Wait(t, thirdErr, "third")
		close(stop)
		hw.Wait()
		_ = os.Remove(filler)
		switch code(errThird) {
		case "":
			extra = append(extra, thirdReq)
		case lease.CodeBackendUnavailable:
			s38ExpectNoRequest(t, s, lease.OpAcquire, thirdReq.Identity.TargetID, thirdReq.RequestID, "the refused third write")
		default:
			t.Fatalf("round %d: the third write: %v", r, errThird)
		}
		switch {
		case errRel == nil && errAcq == nil:
			given[nextRes.Lease.FencingToken] = nextRes.Lease.LeaseID
			cur, curReq = nextRes, nextReq
			continue
		case code(errRel) == lease.CodeOutcomeUnknown && code(errAcq) == lease.CodeBackendUnavailable:
			failedRound = r
		default:
			t.Fatalf("round %d: release %v, acquire over it %v; want both answered, or outcome_unknown and refused", r, errRel, errAcq)
		}
	}
	if failedRound < 0 {
		t.Fatal("no append failed on the full disk")
	}
	t.Logf("the held append failed in round %d", failedRound)
	what := "after the failed append"
	s38ExpectHolder(t, s, "full", cur.Lease, what)
	s38NotInHistory(t, s, "full", cur.Lease.LeaseID, what)
	s38ExpectNoRequest(t, s, lease.OpRelease, "full", relReq.RequestID, what)
	s38ExpectNoRequest(t, s, lease.OpAcquire, "full", nextReq.RequestID, what)
	// The disk has room: writes resume (Health recovers the log).
	deadline := time.Now().Add(10 * time.Second)
	for s.Health(ctx).Status != lease.HealthOK {
		if time.Now().After(deadline) {
			t.Fatalf("the store does not recover: %+v", s.Health(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	s38ExpectHolder(t, s, "full", cur.Lease, "after recovery")
	// The refused acquire retried: the lease is still held.
	if _, err := s.Acquire(ctx, nextReq); code(err) != lease.CodeConflict {
		t.Fatalf("the refused acquire retried while the release is undone: %v; want conflict", err)
	}
	// The outcome-unknown release retried runs fresh.
	rel, err := s.Release(ctx, relReq)
	if err != nil || rel.Replayed || rel.Lease.LeaseID != cur.Lease.LeaseID || rel.Lease.State != lease.StateReleased {
		t.Fatalf("the unknown release retried: %+v, %v", rel, err)
	}
	nextReq.RequestID += "-again"
	next, err := s.Acquire(ctx, nextReq)
	if err != nil || next.Lease.FencingToken <= cur.Lease.FencingToken {
		t.Fatalf("acquire after the retried release: %+v, %v; want a token above %d", next.Lease, err, cur.Lease.FencingToken)
	}
	if prev, ok := given[next.Lease.FencingToken]; ok {
		t.Fatalf("token %d given twice (%s, %s)", next.Lease.FencingToken, prev, next.Lease.LeaseID)
	}
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	s38ExpectHolder(t, s, "full", next.Lease, "after a flush")
	crash(t, s)
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s38ExpectHolder(t, s, "full", next.Lease, "after crash and reopen")
	if r, err := s.LookupRequest(ctx, s38Lookup(lease.OpRelease, "full", relReq.RequestID)); err != nil || r.Lease.LeaseID != cur.Lease.LeaseID {
		t.Fatalf("after reopen, the retried release: %+v, %v", r, err)
	}
	for _, req := range extra {
		if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: s35Far}); err != nil {
			t.Fatalf("acknowledged queued acquire %s lost: %v", req.RequestID, err)
		}
	}
	// The next token continues above every one given.
	if _, err := s.Release(ctx, releaseOfLease(engineLease{nextReq, next}, "full-final-rel")); err != nil {
		t.Fatal(err)
	}
	nextReq.RequestID = "full-final-acq"
	last, err := s.Acquire(ctx, nextReq)
	if err != nil || last.Lease.FencingToken <= next.Lease.FencingToken {
		t.Fatalf("after reopen: %+v, %v; want a token above %d", last.Lease, err, next.Lease.FencingToken)
	}
}

// s38TreeActive reads the tree itself (not the layers): target's active
// record.
func s38TreeActive(t *testing.T, s *Store, target string) []byte {
	t.Helper()
	_, key, err := lease.CanonicalLockKey(s38Ident(target), lease.StoreOptions{}.WithDefaults().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	return storedActive(t, s, key)
}

// 4. A freeze asked for (sync) while a batch is held: the freeze waits
// for the append, so the tree never takes the held write (nor do readers
// see it through the tree); backup and close, called while it is held,
// wait and then hold every acknowledged write.
//
// Checked against: the freeze at the start of run without drain() (the
// flush writes the held release into the tree).
func TestS38FreezeWaitsForHeldBatch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	p := s38Open(t, path, time.Hour)
	s := p.s
	e := s.group.engine
	l0, err := s.Acquire(ctx, s38Acquire("frz", "frz-acq-0", "inst-0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	before := s38TreeActive(t, s, "frz")
	if before == nil {
		t.Fatal("the synced acquire is not in the tree")
	}
	// k+1's run begins with a freeze due.
	p.afterGate = func() { e.wantFreeze.Store(true) }
	relReq := releaseOfLease(engineLease{s38Acquire("frz", "frz-acq-0", "inst-0"), l0}, "frz-rel-0")
	var acq lease.Result
	// k+1 waits for k before its freeze (it runs nothing over k).
	_, relErr, acqErr := p.lineUpWait(t, false,
		func() error { _, err := s.Release(ctx, relReq); return err },
		func() error {
			var err error
			acq, err = s.Acquire(ctx, s38Acquire("frz", "frz-acq-1", "inst-1"))
			return err
		})
	syncErr := make(chan error, 1)
	go func() { syncErr <- s.sync() }()
	var backup bytes.Buffer
	backupErr := make(chan error, 1)
	go func() { _, err := s.Backup(ctx, &backup); backupErr <- err }()
	time.Sleep(300 * time.Millisecond) // a flush, if the freeze took the held batch, has run
	if got := s38TreeActive(t, s, "frz"); !bytes.Equal(got, before) {
		t.Fatalf("the tree took the held batch's release before its record was durable (active now %q)", got)
	}
	s38ExpectHolder(t, s, "frz", l0.Lease, "while held, a freeze asked for")
	select {
	case err := <-syncErr:
		t.Fatalf("sync returned while a batch is held: %v", err)
	default:
	}
	closeErr := make(chan error, 1)
	go func() { closeErr <- s.Close() }()
	time.Sleep(50 * time.Millisecond)
	p.release <- struct{}{}
	for _, c := range []struct {
		ch   chan error
		what string
	}{{relErr, "release"}, {acqErr, "acquire"}, {syncErr, "sync"}, {backupErr, "backup"}, {closeErr, "close"}} {
		if err := s38Wait(t, c.ch, c.what); err != nil && !(c.what == "backup" && code(err) == lease.CodeBackendUnavailable) {
			t.Fatalf("%s: %v", c.what, err)
		}
	}
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s38ExpectHolder(t, s, "frz", acq.Lease, "after close")
	if r, err := s.LookupRequest(ctx, s38Lookup(lease.OpRelease, "frz", "frz-rel-0")); err != nil || r.Lease.LeaseID != l0.Lease.LeaseID {
		t.Fatalf("after close, the release: %+v, %v", r, err)
	}
}

// 2b. The batch over a failing one wrote nothing (a write function that
// writes nothing): complete undoes the failed batch itself (e.applied
// stays at k), the empty batch is refused, and nothing of the failed
// batch remains.
func TestS38FailedAppendUnderEmptyBatch(t *testing.T) { s38FailedAppend(t, true) }

// 2c. The held batch fails with nothing after it (complete runs inline):
// complete alone undoes it; the next write after recovery must not
// publish its writes.
//
// Checked against: complete never rolling back (the next write shows
// the failed release).
func TestS38FailedAppendAlone(t *testing.T) { s38FailedAppend(t, false) }

func s38FailedAppend(t *testing.T, withEmpty bool) {
	ctx := context.Background()
	dir := testenv.Tmpfs(t, 8<<20)
	path := filepath.Join(dir, "starlease.db")
	filler := filepath.Join(dir, "filler")
	p := s38Open(t, path, time.Hour)
	s := p.s
	p.setOnOther(func(int) { _ = os.Remove(filler) })
	cur, err := s.Acquire(ctx, s38Acquire("empty", "empty-acq-0", "inst-0"))
	if err != nil {
		t.Fatal(err)
	}
	curReq := s38Acquire("empty", "empty-acq-0", "inst-0")
	for r := 1; r < 40; r++ {
		relReq := releaseOfLease(engineLease{curReq, cur}, fmt.Sprint("empty-rel-", r))
		relErr, syncErr := make(chan error, 1), make(chan error, 1)
		p.holdNext.Store(true)
		p.gate.Store(withEmpty)
		go func() { _, err := s.Release(ctx, relReq); relErr <- err }()
		if withEmpty {
			<-p.gated
			go func() { syncErr <- s.group.update(func(*layered.View) error { return nil }) }()
		} else {
			syncErr <- errEngineFailed
		}
		<-p.held
		// The empty batch runs over the held one (it has nothing to
		// append, so e.applied stays at k) and waits for it.
		for s.group.queue.Queued() > 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		testenv.FillDisk(t, filler)
		p.release <- struct{}{}
		errRel := s38Wait(t, relErr, "release")
		errSync := s38Wait(t, syncErr, "sync")
		_ = os.Remove(filler)
		if errRel == nil {
			// Next round: acquire again.
			if errSync != nil && withEmpty {
				t.Fatalf("round %d: empty batch after a durable release: %v", r, errSync)
			}
			curReq = s38Acquire("empty", fmt.Sprint("empty-acq-", r), "inst-0")
			if cur, err = s.Acquire(ctx, curReq); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if code(errRel) != lease.CodeOutcomeUnknown || !errors.Is(errSync, errEngineFailed) {
			t.Fatalf("round %d: release %v, empty batch %v; want outcome_unknown and refused", r, errRel, errSync)
		}
		s38ExpectHolder(t, s, "empty", cur.Lease, "after the failed append")
		s38ExpectNoRequest(t, s, lease.OpRelease, "empty", relReq.RequestID, "after the failed append")
		for s.Health(ctx).Status != lease.HealthOK {
			time.Sleep(10 * time.Millisecond)
		}
		// A write after recovery publishes top as it is.
		if _, err := s.Acquire(ctx, s38Acquire("empty-other", fmt.Sprint("empty-other-", r), "inst-o")); err != nil {
			t.Fatal(err)
		}
		s38ExpectHolder(t, s, "empty", cur.Lease, "after recovery and a write")
		if err := s.sync(); err != nil {
			t.Fatal(err)
		}
		s38ExpectHolder(t, s, "empty", cur.Lease, "after recovery and a flush")
		crash(t, s)
		s, err = Open(path, Options{ReapInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s38ExpectHolder(t, s, "empty", cur.Lease, "after reopen")
		s38ExpectNoRequest(t, s, lease.OpRelease, "empty", relReq.RequestID, "after reopen")
		t.Logf("failed in round %d", r)
		return
	}
	t.Fatal("no append failed on the full disk")
}
