package service

// Review of audit.Multi turning a sink's panic into audit.ErrSinkPanicked:
// what the service does with it, and the Spool deadlock the first version
// of that change caused (fixed: the Spool recovers its backend's panic
// itself, so its lock is released).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

type reviewFuncSink func(context.Context, audit.Event) error

func (f reviewFuncSink) Write(ctx context.Context, e audit.Event) error { return f(ctx, e) }
func (f reviewFuncSink) Close() error                                   { return nil }

var errOrdinary = errors.New("ordinary sink failure")

// Every subset of 4 sinks panicking (with several panic kinds), one more
// sink failing ordinarily and one slow sink: Multi waits for all, reports
// ErrSinkPanicked iff some sink panicked, keeps the ordinary error, and
// never quotes the panic value.
func TestReviewMultiEveryPanicSubset(t *testing.T) {
	panics := []func(){
		func() { panic("secret-ish value") },
		func() { panic(nil) },                                             // Go >= 1.21: *runtime.PanicNilError
		func() { _ = strings.Repeat("secret-ish", 1)[len(t.Name())+10:] }, // a runtime error: slice bounds out of range
		func() { panic(fmt.Errorf("wrapped secret-ish: %w", audit.ErrClosed)) },
	}
	ev := audittest.AcquireEvent(time.Now())
	for mask := 0; mask < 1<<4; mask++ {
		var wrote, slowDone atomic.Int32
		var sinks []audit.Sink
		for i := 0; i < 4; i++ {
			sinks = append(sinks, reviewFuncSink(func(context.Context, audit.Event) error {
				if mask&(1<<i) != 0 {
					panics[(i+mask)%len(panics)]()
				}
				wrote.Add(1)
				return nil
			}))
		}
		sinks = append(sinks, reviewFuncSink(func(context.Context, audit.Event) error { return errOrdinary }))
		sinks = append(sinks, reviewFuncSink(func(context.Context, audit.Event) error {
			time.Sleep(20 * time.Millisecond)
			slowDone.Store(1)
			return nil
		}))
		// Rotate so every position (first: caller's goroutine) is covered.
		for rot := range sinks {
			rs := append(append([]audit.Sink(nil), sinks[rot:]...), sinks[:rot]...)
			wrote.Store(0)
			slowDone.Store(0)
			err := audit.Multi(rs...).Write(context.Background(), ev)
			if got, want := errors.Is(err, audit.ErrSinkPanicked), mask != 0; got != want {
				t.Fatalf("mask %04b rot %d: ErrSinkPanicked=%v, err %v", mask, rot, got, err)
			}
			if !errors.Is(err, errOrdinary) {
				t.Fatalf("mask %04b rot %d: the ordinary error is lost: %v", mask, rot, err)
			}
			if errors.Is(err, audit.ErrClosed) || strings.Contains(err.Error(), "secret-ish") {
				t.Fatalf("mask %04b rot %d: the panic value leaks: %v", mask, rot, err)
			}
			if slowDone.Load() != 1 {
				t.Fatalf("mask %04b rot %d: Multi returned before the slow sink", mask, rot)
			}
			nonPanicking := 4
			for m := mask; m != 0; m &= m - 1 {
				nonPanicking--
			}
			if int(wrote.Load()) != nonPanicking {
				t.Fatalf("mask %04b rot %d: %d sinks wrote, want %d", mask, rot, wrote.Load(), nonPanicking)
			}
		}
	}
}

// panicAfter accepts n writes, then panics on every write.
type panicAfter struct {
	audittest.Recorder
	ok atomic.Int64
}

func (s *panicAfter) Write(ctx context.Context, e audit.Event) error {
	if s.ok.Add(-1) < 0 {
		panic("sink bug quoting " + e.Reason)
	}
	return s.Recorder.Write(ctx, e)
}

func reviewAdminSetup(t *testing.T, okWrites int64, backendFirst bool) (*Service, lease.Store, *panicAfter, auth.Principal, auth.Principal) {
	t.Helper()
	bad := &panicAfter{}
	bad.ok.Store(okWrites)
	sinks := []audit.Sink{&audittest.Recorder{}, bad}
	if backendFirst {
		sinks[0], sinks[1] = sinks[1], sinks[0]
	}
	// As cmd/starlease/serve.go builds it.
	sink := audit.NewLimiter(audit.Multi(sinks...), audit.LimiterOptions{FlushInterval: -1})
	s, store := newService(t, sink, Config{})
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	admin := principal(t, "prn-admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease, auth.CapRead)
	return s, store, bad, holder, admin
}

// A panic in the attempt's audit refuses force-release/revoke with the
// lease untouched; a panic in the result's audit reports outcome_unknown.
// Both sink positions.
func TestReviewMultiAdminPanicNeverSucceeds(t *testing.T) {
	ctx := context.Background()
	for _, first := range []bool{false, true} {
		for _, revoke := range []bool{false, true} {
			run := func(s *Service, c Call, in AdminInput) (lease.Result, error) {
				if revoke {
					return s.Revoke(ctx, c, in)
				}
				return s.ForceRelease(ctx, c, in)
			}
			// Attempt's audit panics.
			s, store, _, holder, admin := reviewAdminSetup(t, 1, first)
			got, err := s.Acquire(ctx, call(holder), acquireInput(target))
			if err != nil {
				t.Fatal(err)
			}
			in := AdminInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, Reason: "secret-ish reason"}
			_, err = run(s, call(admin), in)
			if code(err) != lease.CodeBackendUnavailable || strings.Contains(err.Error(), "secret-ish") {
				t.Fatalf("first=%v revoke=%v: attempt audit panicked: %v", first, revoke, err)
			}
			now, err := store.Inspect(ctx, lease.InspectRequest{Identity: target, DeadlineAt: time.Now().Add(time.Second)})
			if err != nil || now.Lease.State != lease.StateActive {
				t.Fatalf("first=%v revoke=%v: lease must be untouched: %v %+v", first, revoke, err, now.Lease)
			}
			// Result's audit panics.
			s, store, _, holder, admin = reviewAdminSetup(t, 2, first)
			got, err = s.Acquire(ctx, call(holder), acquireInput(target))
			if err != nil {
				t.Fatal(err)
			}
			in.LeaseID, in.FencingToken = got.Lease.LeaseID, got.Lease.FencingToken
			res, err := run(s, call(admin), in)
			if code(err) != lease.CodeOutcomeUnknown || res.Lease != nil {
				t.Fatalf("first=%v revoke=%v: result audit panicked: %v %+v", first, revoke, err, res)
			}
			_ = store
		}
	}
}

// An ordinary operation whose audit panics keeps its outcome (as for any
// other audit failure: logged), and no panic escapes.
func TestReviewMultiOrdinaryOpPanicLikeAnyFailure(t *testing.T) {
	ctx := context.Background()
	s, _, _, holder, _ := reviewAdminSetup(t, 0, true)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil || got.Lease == nil {
		t.Fatalf("acquire with a panicking audit sink: %v", err)
	}
	if _, err := s.Inspect(ctx, call(holder), InspectInput{Identity: target}); err != nil {
		t.Fatalf("inspect: %v", err)
	}
}

// reviewPanicBackend panics on Write while panics is set (no OnceWriter).
type reviewPanicBackend struct{ panics atomic.Bool }

func (b *reviewPanicBackend) Write(context.Context, audit.Event) error {
	if b.panics.Load() {
		panic("backend bug")
	}
	return nil
}
func (b *reviewPanicBackend) Close() error { return nil }

// Spool.Write calls its backend under a read lock: a backend panic
// recovered only by Multi leaked that lock, and every later audit write
// (and Close) blocked forever, past AuditTimeout. The Spool now treats a
// panicking backend as a failed one: the event is spooled, the lock freed.
func TestReviewMultiSpoolBackendPanicDoesNotHang(t *testing.T) {
	backend := &reviewPanicBackend{}
	backend.panics.Store(true)
	sp, err := audit.OpenSpool(filepath.Join(t.TempDir(), "spool"), backend, audit.SpoolOptions{RetryInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := audit.Multi(&audittest.Recorder{}, sp)
	if err := m.Write(context.Background(), audittest.AcquireEvent(time.Now())); err != nil {
		t.Fatalf("first write, spooled while the backend panics: %v", err)
	}
	backend.panics.Store(false) // the backend is fine again
	time.Sleep(50 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), AuditTimeout)
		defer cancel()
		done <- m.Write(ctx, audittest.AcquireEvent(time.Now()))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("second write: %v", err)
		}
	case <-time.After(2 * AuditTimeout):
		t.Fatal("after one recovered backend panic, the next audit write hangs past AuditTimeout (Spool RWMutex read lock leaked)")
	}
}
