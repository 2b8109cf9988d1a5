package bolt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/lease"
)

// Review of the close/mutation fence (closeMu): attacks on liveness and on
// what Close acknowledges and keeps.

// s39bWithin fails the test if ch yields nothing within a generous bound
// (a liveness check: a deadlock fails, a slow machine does not).
func s39bWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(90 * time.Second):
		t.Fatalf("%s: no progress in 90 s (deadlock?)", what)
		panic("unreachable")
	}
}

// Close while many writers (pipelined group commit, so batches are run by
// submitters and by handOn's goroutines and appended by complete's),
// backups (sync through the same queue, not under closeMu) and short
// leases for the reaper are in flight: Close ends, every acknowledged
// lease is there after the reopen with its token, and every refusal is
// backend_unavailable, its lease absent.
func TestS39bCloseUnderWritersBackupsAndReaper(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: time.Millisecond, FlushInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const writers = 8
	var (
		mu      sync.Mutex
		acked   []engineLease
		refused []lease.AcquireRequest
		bad     []error
		nAcked  atomic.Int64
		wg      sync.WaitGroup
	)
	far := time.Now().Add(time.Hour)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				ttl := time.Hour
				if i%3 == 2 {
					ttl = time.Millisecond // work for the reaper
				}
				req := acquireReq(fmt.Sprintf("s39b-w%d-acq-%d", w, i), ttl, far)
				req.Identity.TargetID = fmt.Sprintf("s39b-w%d-%d", w, i)
				res, err := s.Acquire(ctx, req)
				mu.Lock()
				switch {
				case err == nil && ttl == time.Hour:
					acked = append(acked, engineLease{req, res})
					nAcked.Add(1)
				case err == nil:
				case lease.CodeOf(err) == lease.CodeBackendUnavailable:
					refused = append(refused, req)
				default:
					bad = append(bad, err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}(w)
	}
	var backupErrs []error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := s.Backup(ctx, io.Discard); err != nil {
				if lease.CodeOf(err) != lease.CodeBackendUnavailable {
					mu.Lock()
					backupErrs = append(backupErrs, err)
					mu.Unlock()
				}
				return
			}
		}
	}()
	for nAcked.Load() < 300 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	if err := s39bWithin(t, closed, "close under load"); err != nil {
		t.Fatalf("close: %v", err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	s39bWithin(t, done, "writers and backups after close")
	if len(bad) > 0 || len(backupErrs) > 0 {
		t.Fatalf("calls racing Close failed with other than backend_unavailable: writes %v, backups %v", bad, backupErrs)
	}
	if len(refused) == 0 {
		t.Fatal("no writer was refused: Close did not end the writers")
	}

	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	s35eCheckPresent(t, s, acked, "s39b-load")
	for _, req := range refused {
		got, err := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far})
		if err == nil && got.Lease != nil {
			t.Errorf("acquire %s was refused but its lease is there after the reopen: %+v", req.RequestID, got.Lease)
		}
	}
	t.Logf("%d acknowledged, %d refused", len(acked), len(refused))
}

// The reaper (tracked by s.wg, which Close waits for after taking closeMu)
// is held inside a mutation when Close is called: Close waits for that
// slice, the reaper's next slice is refused, and Close ends. An acquire
// started while Close waits is either acknowledged and kept, or refused
// and absent.
func TestS39bCloseWaitsForAHeldReaperSlice(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	acked := engineAcquire(t, s, "s39b-reap", 3)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var released atomic.Bool
	s.admittedHook = func() {
		once.Do(func() {
			close(held)
			<-release
		})
	}
	// The reaper as Open starts it, started after the hook is set.
	lease.Reaper{Interval: time.Millisecond, Pass: s.reap, Log: s.log}.Start(&s.wg, s.stop)
	s39bWithin(t, held, "the reaper's mutation")

	closed := make(chan error, 1)
	go func() {
		err := s.Close()
		if !released.Load() {
			err = fmt.Errorf("Close returned while the reaper's mutation was held (err %v)", err)
		}
		closed <- err
	}()
	req := acquireReq("s39b-reap-late", time.Hour, time.Now().Add(time.Hour))
	req.Identity.TargetID = "s39b-reap-late"
	type answer struct {
		res lease.Result
		err error
	}
	late := make(chan answer, 1)
	time.Sleep(50 * time.Millisecond) // let Close reach closeMu (not required)
	go func() {
		res, err := s.Acquire(ctx, req)
		late <- answer{res, err}
	}()
	time.Sleep(200 * time.Millisecond)
	released.Store(true)
	close(release)
	if err := s39bWithin(t, closed, "close with the reaper held"); err != nil {
		t.Fatal(err)
	}
	a := s39bWithin(t, late, "the acquire started during Close")
	if a.err != nil && lease.CodeOf(a.err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire during Close: %v, want success or backend_unavailable", a.err)
	}

	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, acked, "s39b-reap")
	got, err := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: time.Now().Add(time.Hour)})
	switch {
	case a.err == nil && (err != nil || got.Lease == nil || got.Lease.FencingToken != a.res.Lease.FencingToken):
		t.Fatalf("acquire during Close acknowledged (token %d), after the reopen: %+v, %v", a.res.Lease.FencingToken, got.Lease, err)
	case a.err != nil && err == nil && got.Lease != nil:
		t.Fatalf("acquire during Close refused (%v) but its lease is there: %+v", a.err, got.Lease)
	}
}

// A second Close while the first is still closing (here held where the
// engine has flushed and not yet reset the log or closed the file) may not
// return before the store is closed. It found closed set and returned nil
// at once, with the file still open and locked by this process: a caller
// that then opened the file again (Namespace.Close then Open, or
// Closed.Finish's own Close beside a deferred Closed.Close) failed with
// "file locked".
func TestS39bSecondCloseWaitsForTheFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	acked := engineAcquire(t, s, "s39b-twice", 3)
	inClose, release := make(chan struct{}), make(chan struct{})
	s.group.engine.closeHook = func() {
		close(inClose)
		<-release
	}
	first := make(chan error, 1)
	go func() { first <- s.Close() }()
	s39bWithin(t, inClose, "the first Close")

	second := make(chan error, 1)
	go func() { second <- s.Close() }()
	var early bool
	var secondErr, reopenErr error
	select {
	case secondErr = <-second:
		// Returned while the first Close is held: the caller believes the
		// store closed, and opens it again.
		early = true
		var s2 *Store
		if s2, reopenErr = Open(path, Options{ReapInterval: -1}); reopenErr == nil {
			s2.Close()
		}
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := s39bWithin(t, first, "the first Close"); err != nil {
		t.Errorf("first close: %v", err)
	}
	if !early {
		secondErr = s39bWithin(t, second, "the second Close")
	}
	if secondErr != nil {
		t.Errorf("second close: %v", secondErr)
	}
	if early {
		t.Errorf("the second Close returned (%v) while the first was still closing the store; a reopen then: %v", secondErr, reopenErr)
	}
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, acked, "s39b-twice")
}

// The audit store (no redo log; Write holds mu shared around its whole
// transaction, Close takes it alone): writes racing Close are either
// acknowledged and kept, or refused with audit.ErrClosed.
func TestS39bAuditWritesRacingClose(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.db")
	a, err := OpenAudit(path, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	events := freshEvents(4000)
	var (
		mu    sync.Mutex
		acked []string
		bad   []error
		n     atomic.Int64
		wg    sync.WaitGroup
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(events); i += 8 {
				err := a.Write(ctx, events[i])
				mu.Lock()
				switch {
				case err == nil:
					acked = append(acked, events[i].EventID)
					n.Add(1)
				case errors.Is(err, audit.ErrClosed):
				default:
					bad = append(bad, err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}(w)
	}
	for n.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	if err := s39bWithin(t, closed, "audit close"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	s39bWithin(t, done, "audit writers")
	if len(bad) > 0 {
		t.Fatalf("audit writes racing Close: %v", bad)
	}
	a, err = OpenAudit(path, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var keptEvents []audit.Event
	ackedIDs := map[string]bool{}
	for _, id := range acked {
		ackedIDs[id] = true
	}
	for _, e := range events {
		if ackedIDs[e.EventID] {
			keptEvents = append(keptEvents, e)
		}
	}
	holds, err := a.Holds(ctx, linesOf(t, keptEvents...))
	if err != nil || !holds {
		t.Errorf("the reopened store does not hold every acknowledged audit event (%d): %v, %v", len(keptEvents), holds, err)
	}
	count, err := a.Count(ctx)
	if err != nil || count != len(acked) {
		t.Errorf("the store holds %d events (%v), %d were acknowledged", count, err, len(acked))
	}
}

// While Close waits for a mutation in flight (here held past its closed
// check, as a commit behind a stalled disk would be), the store reads as
// closed and a new mutation is refused at once with backend_unavailable.
// With closed set only once every mutation in flight was answered, a new
// one queued on closeMu behind them, its deadline ignored, and Close
// never set closed while one was held: TestReviewCloseWithQueuedCommits
// (a committer held while 30 acquires wait, Close called) never ended.
func TestS39bNewMutationRefusedWhileCloseWaits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	acked := engineAcquire(t, s, "s39b-wait", 2)
	admitted, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.admittedHook = func() {
		once.Do(func() {
			close(admitted)
			<-release
		})
	}
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	req := acquireReq("s39b-wait-held", time.Hour, time.Now().Add(time.Hour))
	req.Identity.TargetID = "s39b-wait-held"
	type answer struct {
		res lease.Result
		err error
	}
	held := make(chan answer, 1)
	go func() {
		res, err := s.Acquire(ctx, req)
		held <- answer{res, err}
	}()
	s39bWithin(t, admitted, "the held acquire")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()

	marked := make(chan struct{})
	go func() {
		for !s.closed.Load() {
			time.Sleep(time.Millisecond)
		}
		close(marked)
	}()
	s39bWithin(t, marked, "Close marking the store closed while a mutation is in flight")
	if h := s.Health(ctx); h.Status != lease.HealthUnavailable {
		t.Errorf("health while Close waits: %+v, want unavailable", h)
	}
	newReq := acquireReq("s39b-wait-new", time.Hour, time.Now().Add(time.Hour))
	newReq.Identity.TargetID = "s39b-wait-new"
	refused := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, newReq)
		refused <- err
	}()
	if err := s39bWithin(t, refused, "a new acquire while Close waits"); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("new acquire while Close waits: %v, want backend_unavailable", err)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a mutation that found the store open was held", err)
	default:
	}
	close(release)
	a := s39bWithin(t, held, "the held acquire")
	if a.err != nil {
		t.Fatalf("held acquire, admitted before Close: %v", a.err)
	}
	if err := s39bWithin(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, append(acked, engineLease{req, a.res}), "s39b-wait")
	got, err := s.Inspect(ctx, lease.InspectRequest{Identity: newReq.Identity, DeadlineAt: time.Now().Add(time.Hour)})
	if err == nil && got.Lease != nil {
		t.Fatalf("the refused acquire's lease is there after the reopen: %+v", got.Lease)
	}
}
