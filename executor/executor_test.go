package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

// Renewals keep a job running for many TTLs; the token never changes; the
// lease is released at the end with a request id of its own.
func TestRenewalsKeepALongJobAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		sink := fencetest.NewMemorySink("progress")
		var (
			token   uint64
			leaseID string
			workCtx context.Context
		)
		start := time.Now()
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			workCtx, token, leaseID = ctx, l.FencingToken(), l.LeaseID()
			for i := range 10 {
				time.Sleep(2 * time.Second)
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("cancelled at step %d: %w", i, context.Cause(ctx))
				}
				if l.FencingToken() != token || l.LeaseID() != leaseID {
					return fmt.Errorf("lease changed under the work: %+v", l.Record())
				}
				if _, err := fence.Write(ctx, l.Committer(), sink, fmt.Sprintf("step-%d", i),
					fencetest.Doc{ID: "progress", Body: fmt.Sprint(i)}); err != nil {
					return err
				}
			}
			cur := inspectByID(t, store, leaseID)
			if cur.State != lease.StateActive || cur.FencingToken != token {
				return fmt.Errorf("lease at the end of the work: %+v", cur)
			}
			if l.Renewals() < 9 {
				return fmt.Errorf("%d renewals in 20 s with a 3 s TTL", l.Renewals())
			}
			if got := l.Envelope().ExpiresAt; got != cur.ExpiresAt {
				return fmt.Errorf("envelope expires_at %s, backend %s", got, cur.ExpiresAt)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 20*time.Second {
			t.Fatalf("work ran %s", d)
		}
		if c := context.Cause(workCtx); c != ErrWorkDone {
			t.Fatalf("cause after return: %v", c)
		}
		if got := inspectByID(t, store, leaseID); got.State != lease.StateReleased {
			t.Fatalf("after Run the lease is %s", got.State)
		}
		doc, _ := sink.Get("progress")
		if doc.Body != "9" || doc.Rev != 10 || doc.Guard.FencingToken != token {
			t.Fatalf("sink holds %+v", doc)
		}
		// One acquire, one release, each with its own request id; renewal
		// rounds use fresh ids.
		if len(sp.acquires) != 1 || len(sp.releases) != 1 || sp.releases[0].RequestID == sp.acquires[0].RequestID {
			t.Fatalf("acquires %d releases %d", len(sp.acquires), len(sp.releases))
		}
		seen := map[string]bool{sp.acquires[0].RequestID: true, sp.releases[0].RequestID: true}
		for _, r := range sp.renews {
			if seen[r.RequestID] || r.FencingToken != token {
				t.Fatalf("renewal %+v reuses a request id or changes the token", r)
			}
			seen[r.RequestID] = true
		}
	})
}

// A second executor on the same identity gets lease_conflict and its work
// never runs; with a bounded wait it takes over once the first releases.
func TestSecondExecutorConflicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		var firstToken uint64
		done := make(chan error, 1)
		err := Run(context.Background(), store, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			firstToken = l.FencingToken()
			err := Run(ctx, store, specFor(t, "instance-b"), func(context.Context, *Lease) error {
				t.Error("the second executor's work ran")
				return nil
			})
			if code(err) != lease.CodeConflict {
				return fmt.Errorf("second executor: %v, want lease_conflict", err)
			}

			waiting := specFor(t, "instance-c")
			waiting.AcquireWait = 10 * time.Second
			go func() {
				done <- Run(context.Background(), store, waiting, func(ctx context.Context, l2 *Lease) error {
					if l2.FencingToken() <= firstToken {
						return fmt.Errorf("successor token %d", l2.FencingToken())
					}
					return nil
				})
			}()
			time.Sleep(4 * time.Second) // the first keeps renewing; the waiter keeps waiting
			select {
			case err := <-done:
				return fmt.Errorf("the waiter finished while the first held the lease: %v", err)
			default:
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("waiting executor: %v", err)
		}
	})
}

// The first holder's process "pauses" (its renewal loop and its work are
// frozen) past expiry; a second executor acquires and commits. When the
// first resumes, its work context is cancelled with ErrLeaseExpired, its
// commit through the Committer is rejected as lease_lost, the write it had
// authorized before the pause is refused by the sink, and the sink holds
// only accepted writes.
func TestPausedHolderIsFencedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sink := fencetest.NewMemorySink("target-state")

		var paused atomic.Bool
		resume := make(chan struct{})
		specA := specFor(t, "instance-a")
		specA.hooks = &hooks{wake: func() {
			if paused.Load() {
				<-resume
			}
		}}
		started, workResume := make(chan struct{}), make(chan struct{})
		type outcome struct {
			writeErr, replayErr, cause error
			guard                      fence.Guard
		}
		resA := make(chan outcome, 1)
		runErr := make(chan error, 1)
		go func() {
			runErr <- Run(context.Background(), store, specA, func(ctx context.Context, l *Lease) error {
				var o outcome
				var err error
				o.guard, err = fence.Write(ctx, l.Committer(), sink, "a-1", fencetest.Doc{ID: "target", Body: "from a"})
				if err != nil {
					return err
				}
				close(started)
				<-workResume // the process is stopped here
				// A worker that ignores the advisory cancellation: fencing
				// must stop it anyway.
				detached := context.WithoutCancel(ctx)
				_, o.writeErr = fence.Write(detached, l.Committer(), sink, "a-2", fencetest.Doc{ID: "target", Body: "late from a"})
				o.replayErr = sink.Commit(detached, o.guard, fencetest.Doc{ID: "target", Body: "replayed by a"})
				_, o.cause = causeOfCtx(ctx)
				resA <- o
				return nil
			})
		}()
		<-started
		paused.Store(true)
		time.Sleep(ttl + time.Second) // past A's expiry; A's loop is frozen, so nothing cancels A

		var gB fence.Guard
		err := Run(context.Background(), store, specFor(t, "instance-b"), func(ctx context.Context, l *Lease) error {
			var err error
			gB, err = fence.Write(ctx, l.Committer(), sink, "b-1", fencetest.Doc{ID: "target", Body: "from b"})
			return err
		})
		if err != nil {
			t.Fatalf("successor: %v", err)
		}

		close(resume)
		close(workResume)
		o := <-resA
		if err := <-runErr; err != nil {
			t.Fatalf("first Run: %v", err)
		}
		if code(o.writeErr) != lease.CodeLost {
			t.Fatalf("stale holder's commit: %v, want lease_lost", o.writeErr)
		}
		if code(o.replayErr) != lease.CodeCommitRejected {
			t.Fatalf("stale holder's pre-pause guard: %v, want commit_rejected", o.replayErr)
		}
		if !errors.Is(o.cause, ErrLeaseExpired) || !LeaseLoss(o.cause) {
			t.Fatalf("cause %v, want ErrLeaseExpired", o.cause)
		}
		if gB.FencingToken <= o.guard.FencingToken {
			t.Fatalf("tokens a=%d b=%d", o.guard.FencingToken, gB.FencingToken)
		}
		want := []fencetest.Stored{{ID: "target", Body: "from b", Guard: gB, Rev: 2}}
		if got := sink.Docs(); !reflect.DeepEqual(got, want) {
			t.Fatalf("sink holds %+v, want %+v", got, want)
		}
		acc := sink.Accepted()
		if len(acc) != 2 || acc[0].Guard != o.guard || acc[1].Guard != gB {
			t.Fatalf("accepted %+v", acc)
		}
	})
}

// An administrator's revoke reaches the work at the next renewal as
// ErrRevoked, before the lease would have expired; the work's returned
// cancellation carries the cause; no release is sent for a revoked lease.
func TestRevokeReachesWorkAtNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		var cause error
		var cancelledAt, revokedAt, expiry time.Time
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			expiry = l.LocalExpiry()
			time.Sleep(500 * time.Millisecond)
			if _, err := store.Revoke(context.Background(), adminRequest(l.Record())); err != nil {
				return err
			}
			revokedAt = time.Now()
			cancelledAt, cause = causeOfCtx(ctx)
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrRevoked) {
			t.Fatalf("Run: %v", err)
		}
		var ce *CauseError
		var le *lease.Error
		if !errors.As(cause, &ce) || ce.Reason != ErrRevoked || ce.State != lease.StateRevoked ||
			!errors.As(cause, &le) || le.Code != lease.CodeLost {
			t.Fatalf("cause %#v", cause)
		}
		if renews, _, _ := sp.counts(); renews != 1 || !cancelledAt.After(revokedAt) || !cancelledAt.Before(expiry) {
			t.Fatalf("cancelled at %s (revoked %s, expiry %s) after %d renewals", cancelledAt, revokedAt, expiry, renews)
		}
		if _, releases, _ := sp.counts(); releases != 0 {
			t.Fatalf("%d releases of a revoked lease", releases)
		}
	})
}

// A commit right after a revoke or force-release is lease_lost and cancels
// the work at once, with the administrative cause.
func TestAdminInvalidationDetectedOnCommit(t *testing.T) {
	for _, tc := range []struct {
		op    lease.Op
		cause error
		state lease.State
	}{{lease.OpRevoke, ErrRevoked, lease.StateRevoked}, {lease.OpForceRelease, ErrReleased, lease.StateReleased}} {
		t.Run(string(tc.op), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := openStore(t, bolt.Options{})
				sink := fencetest.NewMemorySink("results")
				sp := &spy{LeaseAPI: store}
				err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
					time.Sleep(500 * time.Millisecond)
					var err error
					if tc.op == lease.OpRevoke {
						_, err = store.Revoke(context.Background(), adminRequest(l.Record()))
					} else {
						_, err = store.ForceRelease(context.Background(), adminRequest(l.Record()))
					}
					if err != nil {
						return err
					}
					at := time.Now()
					if _, err := fence.Write(ctx, l.Committer(), sink, "c-1", fencetest.Doc{ID: "r", Body: "x"}); code(err) != lease.CodeLost {
						return fmt.Errorf("commit after %s: %v", tc.op, err)
					}
					// Cancelled by the commit itself: no time has passed, no renewal ran.
					if ctx.Err() == nil || !time.Now().Equal(at) {
						return fmt.Errorf("not cancelled by the commit")
					}
					var ce *CauseError
					if c := context.Cause(ctx); !errors.Is(c, tc.cause) || !errors.As(c, &ce) || ce.State != tc.state {
						return fmt.Errorf("cause %v", c)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if renews, releases, _ := sp.counts(); renews != 0 || releases != 0 {
					t.Fatalf("renews %d releases %d", renews, releases)
				}
				if len(sink.Docs()) != 0 {
					t.Fatalf("sink %+v", sink.Docs())
				}
			})
		})
	}
}

// Renewals that fail with backend_unavailable are retried with the same
// request id until half the margin is left; the work is then cancelled with
// ErrBackendUnavailable while the lease is still active at the backend.
func TestBackendUnavailableCancelsBeforeExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store, renew: func(context.Context, lease.RenewRequest, int) (lease.Result, error) {
			return lease.Result{}, &lease.Error{Code: lease.CodeBackendUnavailable, Reason: "connection refused"}
		}}
		var cause error
		var cancelledAt time.Time
		var atCancel *lease.Record
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			cancelledAt, cause = causeOfCtx(ctx)
			atCancel = inspectByID(t, store, l.LeaseID())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var le *lease.Error
		if !errors.Is(cause, ErrBackendUnavailable) || !errors.As(cause, &le) || le.Code != lease.CodeBackendUnavailable {
			t.Fatalf("cause %v", cause)
		}
		if atCancel.State != lease.StateActive || !cancelledAt.Before(atCancel.ExpiresAt.Time()) {
			t.Fatalf("cancelled at %s; backend lease %s expires %s", cancelledAt, atCancel.State, atCancel.ExpiresAt)
		}
		// margin 1 s: give up at expiry − 0.5 s, which is before the backend's expiry.
		if left := atCancel.ExpiresAt.Time().Sub(cancelledAt); left < 500*time.Millisecond {
			t.Fatalf("only %s left at cancellation", left)
		}
		if len(sp.renews) < 3 {
			t.Fatalf("%d renewal attempts", len(sp.renews))
		}
		for _, r := range sp.renews {
			if r.RequestID != sp.renews[0].RequestID {
				t.Fatalf("retries of one renewal used request ids %s and %s", sp.renews[0].RequestID, r.RequestID)
			}
		}
		// The lease was still active: the executor released it.
		if got := inspectByID(t, store, atCancel.LeaseID); got.State != lease.StateReleased {
			t.Fatalf("after Run: %s", got.State)
		}
	})
}

// delayedRenew forwards the renewal, then holds the reply back (ignoring the
// context, as a reply already on the wire would be) for delay; during the
// delay it runs meanwhile.
func delayedRenew(store lease.Store, which int, delay time.Duration, meanwhile func()) func(context.Context, lease.RenewRequest, int) (lease.Result, error) {
	return func(ctx context.Context, req lease.RenewRequest, n int) (lease.Result, error) {
		res, err := store.Renew(ctx, req)
		if n == which {
			if meanwhile != nil {
				meanwhile()
			}
			time.Sleep(delay)
		}
		return res, err
	}
}

// A renewal reply that arrives after its local deadline grants nothing by
// itself: the executor inspects; the lease is active with the renewed
// expiry, so the work continues.
func TestLateRenewalReplyIsConfirmedByInspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		// Renewal at expiry−1 s with deadline +0.25 s (the call timeout);
		// the reply comes at +0.4 s, before the give-up time (+0.5 s).
		sp.renew = delayedRenew(store, 1, 400*time.Millisecond, nil)
		var token uint64
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			token = l.FencingToken()
			time.Sleep(8 * time.Second)
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if l.FencingToken() != token || l.Renewals() < 3 {
				return fmt.Errorf("token %d renewals %d", l.FencingToken(), l.Renewals())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, inspects := sp.counts(); inspects != 1 {
			t.Fatalf("%d inspections, want 1 (the late reply)", inspects)
		}
	})
}

// A late renewal reply whose lease was revoked meanwhile: the inspection
// shows it revoked and the work is cancelled with ErrRevoked.
func TestLateRenewalReplyNotConfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		var rec atomic.Pointer[lease.Record]
		sp.renew = delayedRenew(store, 1, 400*time.Millisecond, func() {
			if _, err := store.Revoke(context.Background(), adminRequest(rec.Load())); err != nil {
				t.Errorf("revoke: %v", err)
			}
		})
		var cause error
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			rec.Store(l.Record())
			_, cause = causeOfCtx(ctx)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var ce *CauseError
		if !errors.Is(cause, ErrRevoked) || !errors.As(cause, &ce) || ce.State != lease.StateRevoked {
			t.Fatalf("cause %v", cause)
		}
		if _, releases, inspects := sp.counts(); inspects != 1 || releases != 0 {
			t.Fatalf("inspects %d releases %d", inspects, releases)
		}
	})
}

// A panicking work function still releases its lease (with a new request
// id), and the panic reaches the caller unchanged.
func TestReleaseOnPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		var leaseID string
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v", r)
				}
			}()
			_ = Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
				leaseID = l.LeaseID()
				panic("boom")
			})
			t.Fatal("Run returned")
		}()
		if got := inspectByID(t, store, leaseID); got.State != lease.StateReleased {
			t.Fatalf("after panic the lease is %s", got.State)
		}
		if len(sp.releases) != 1 || sp.releases[0].RequestID == sp.acquires[0].RequestID {
			t.Fatalf("releases %+v", sp.releases)
		}
	})
}

func TestReleaseOnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		boom := errors.New("boom")
		var leaseID string
		err := Run(context.Background(), store, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			leaseID = l.LeaseID()
			return boom
		})
		if err != boom {
			t.Fatalf("Run: %v", err)
		}
		if got := inspectByID(t, store, leaseID); got.State != lease.StateReleased {
			t.Fatalf("after error the lease is %s", got.State)
		}
	})
}

// A cancelled parent context cancels the work and the lease is still
// released.
func TestParentCancelReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		var leaseID string
		err := Run(ctx, store, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			leaseID = l.LeaseID()
			time.AfterFunc(time.Second, cancel)
			<-ctx.Done()
			if LeaseLoss(context.Cause(ctx)) {
				return fmt.Errorf("parent cancel reported as lease loss: %v", context.Cause(ctx))
			}
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
		if got := inspectByID(t, store, leaseID); got.State != lease.StateReleased {
			t.Fatalf("lease is %s", got.State)
		}
	})
}

// At the maximum lifetime renewals cannot extend the lease; the executor
// cancels at the local estimate, before the backend's expiry.
func TestMaximumLifetimeExpiresLocally(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		spec := specFor(t, "instance-a")
		spec.MaxLifetime = 5 * time.Second
		var cause error
		var cancelledAt time.Time
		var rec *lease.Record
		err := Run(context.Background(), store, spec, func(ctx context.Context, l *Lease) error {
			cancelledAt, cause = causeOfCtx(ctx)
			rec = inspectByID(t, store, l.LeaseID())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var ce *CauseError
		if !errors.Is(cause, ErrLeaseExpired) || !errors.As(cause, &ce) || ce.Detail != "maximum lifetime reached" {
			t.Fatalf("cause %v", cause)
		}
		limit := rec.AcquiredAt.Time().Add(spec.MaxLifetime)
		if rec.ExpiresAt.Time() != limit || rec.State != lease.StateActive || !cancelledAt.Before(limit) {
			t.Fatalf("cancelled %s, lease %s expires %s (limit %s)", cancelledAt, rec.State, rec.ExpiresAt, limit)
		}
	})
}

// A renewal whose reply is lost (outcome unknown) is retried with the same
// request id; the retry replays the stored result and the local estimate
// starts from the first attempt's send time.
func TestOutcomeUnknownRenewalReplays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		var sendOfFirst time.Time
		sp.renew = func(ctx context.Context, req lease.RenewRequest, n int) (lease.Result, error) {
			res, err := store.Renew(ctx, req)
			if n == 1 {
				sendOfFirst = time.Now()
				time.Sleep(100 * time.Millisecond)
				return lease.Result{}, &lease.Error{Code: lease.CodeOutcomeUnknown, Reason: "timeout after submission"}
			}
			if n == 2 && (!res.Replayed || req.RequestID != sp.renews[0].RequestID) {
				t.Errorf("retry: replayed %v, request ids %s %s", res.Replayed, req.RequestID, sp.renews[0].RequestID)
			}
			return res, err
		}
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			for l.Renewals() == 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			r := l.Record()
			want := sendOfFirst.Add(r.ExpiresAt.Time().Sub(r.RenewedAt.Time()) - l.tm.skew)
			if got := l.LocalExpiry(); !got.Equal(want) {
				return fmt.Errorf("local expiry %s, want %s", got, want)
			}
			return context.Cause(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// manualClock is an injected Clock that moves only when the test says.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	at      time.Time
	c       chan time.Time
	stopped bool
}

func (t *manualTimer) C() <-chan time.Time { return t.c }
func (t *manualTimer) Stop() bool          { t.stopped = true; return true }

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *manualClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- c.now
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.c <- c.now
		} else {
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
}

// The schedule follows an injected clock: with the store on the same clock,
// the lease lives as long as the test advances it and renewals succeed, and
// is cancelled before its backend expiry once they fail.
func TestInjectedClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Behind the bubble's clock: bolt takes the earlier of a request's
		// deadline_at (injected clock) and its context deadline (bubble).
		clk := &manualClock{now: time.Now().Add(-time.Hour)}
		store := openStore(t, bolt.Options{Now: clk.Now})
		var failing atomic.Bool
		sp := &spy{LeaseAPI: store, renew: func(ctx context.Context, req lease.RenewRequest, _ int) (lease.Result, error) {
			if failing.Load() {
				return lease.Result{}, &lease.Error{Code: lease.CodeBackendUnavailable}
			}
			return store.Renew(ctx, req)
		}}
		spec := specFor(t, "instance-a")
		spec.Clock = clk
		ready := make(chan *Lease)
		type result struct {
			cause error
			at    time.Time
		}
		out := make(chan result, 1)
		go Run(context.Background(), sp, spec, func(ctx context.Context, l *Lease) error {
			ready <- l
			<-ctx.Done()
			out <- result{context.Cause(ctx), clk.Now()}
			return nil
		})
		l := <-ready
		for range 100 { // 10 s of injected time
			clk.Advance(100 * time.Millisecond)
			synctest.Wait()
		}
		if l.Renewals() < 4 {
			t.Fatalf("%d renewals in 10 s", l.Renewals())
		}
		failing.Store(true)
		var r result
		for r.cause == nil {
			clk.Advance(10 * time.Millisecond)
			synctest.Wait()
			select {
			case r = <-out:
			default:
			}
		}
		rec := inspectByID(t, store, l.LeaseID())
		if !errors.Is(r.cause, ErrBackendUnavailable) || !r.at.Before(rec.ExpiresAt.Time()) {
			t.Fatalf("cause %v at %s, backend expiry %s", r.cause, r.at, rec.ExpiresAt)
		}
		synctest.Wait()
	})
}

// A renewal refused with lease_lost cancels the work with
// ErrRenewalRejected carrying the backend's answer; no release follows.
func TestRenewalRejected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store, renew: func(context.Context, lease.RenewRequest, int) (lease.Result, error) {
			return lease.Result{}, &lease.Error{Code: lease.CodeLost, Reason: "the lease is not held"}
		}}
		var cause error
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			_, cause = causeOfCtx(ctx)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var le *lease.Error
		if !errors.Is(cause, ErrRenewalRejected) || !errors.As(cause, &le) || le.Code != lease.CodeLost {
			t.Fatalf("cause %v", cause)
		}
		if renews, releases, inspects := sp.counts(); renews != 1 || releases != 0 || inspects != 1 {
			t.Fatalf("renews %d releases %d inspects %d", renews, releases, inspects)
		}
	})
}

// An acquisition whose reply is lost is resolved by resending the same
// request id: the executor gets the original lease, and no second token is
// allocated.
func TestAcquireOutcomeUnknownResolvedByRequestID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		sp.acquire = func(ctx context.Context, req lease.AcquireRequest, n int) (lease.Result, error) {
			res, err := store.Acquire(ctx, req)
			if n == 1 {
				return lease.Result{}, &lease.Error{Code: lease.CodeOutcomeUnknown, Reason: "timeout after submission"}
			}
			return res, err
		}
		err := Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			if l.FencingToken() != 1 {
				return fmt.Errorf("token %d", l.FencingToken())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(sp.acquires) != 2 || sp.acquires[0].RequestID != sp.acquires[1].RequestID {
			t.Fatalf("acquires %+v", sp.acquires)
		}
		next, err := store.Acquire(context.Background(), lease.AcquireRequest{Identity: identity, ServiceInstanceID: "i",
			TTL: ttl, MaximumLifetime: time.Hour, ExecutionID: "e", JobID: "j",
			Mutation: lease.Mutation{RequestID: "req-next", DeadlineAt: time.Now().Add(time.Minute), Caller: actor}})
		if err != nil || next.Lease.FencingToken != 2 {
			t.Fatalf("next acquisition: %v %+v", err, next.Lease)
		}
	})
}

// The executor's log names the lease's identity: a target id of 64 hex
// digits (possible credential material, by audit's rule) is written in its
// redacted form to the caller's own logger, never as given.
func TestLogScreensASecretShapedTargetID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out strings.Builder
		spec := specFor(t, "instance-a")
		spec.Identity.TargetID = strings.Repeat("0123456789abcdef", 4)
		spec.Logger = slog.New(slog.NewJSONHandler(&out, nil))
		store := openStore(t, bolt.Options{})
		var leaseID string
		if err := Run(context.Background(), store, spec, func(ctx context.Context, l *Lease) error {
			leaseID = l.LeaseID()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		logged := out.String()
		if strings.Contains(strings.ToLower(logged), spec.Identity.TargetID) {
			t.Fatalf("the executor's log holds the target id as given:\n%s", logged)
		}
		var acquired map[string]any
		for _, line := range strings.Split(logged, "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "lease acquired" {
				acquired = m
			}
		}
		if acquired == nil || acquired["target_id"] != "redacted" || acquired["tenant_id"] != spec.Identity.TenantID {
			t.Fatalf("lease acquired line %v, want the identity with target_id redacted:\n%s", acquired, logged)
		}
		if got := inspectByID(t, store, leaseID); got.TargetID != spec.Identity.TargetID {
			t.Fatalf("the lease's record names target %q, want it as given (only the log screens)", got.TargetID)
		}
	})
}
