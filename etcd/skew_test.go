package etcd

import (
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// stallClock is a server clock, offset from the real one, whose next
// reading can be stalled: the operation that takes it holds the time it
// read while the test acts through another server, as a server that is
// slow between deciding and committing does.
type stallClock struct {
	offset time.Duration

	mu      sync.Mutex
	armed   bool
	reached chan struct{}
	release chan struct{}
}

func (c *stallClock) now() time.Time {
	v := time.Now().Add(c.offset)
	c.mu.Lock()
	armed := c.armed
	c.armed = false
	reached, release := c.reached, c.release
	c.mu.Unlock()
	if armed {
		close(reached)
		<-release
	}
	return v
}

// arm stalls the next reading: reached is closed once it is taken; the
// reading returns when release is closed.
func (c *stallClock) arm() (reached <-chan struct{}, release chan<- struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.reached, c.release = true, make(chan struct{}), make(chan struct{})
	return c.reached, c.release
}

// TestBackendTimeFollowsLinearization checks that backend time never runs
// against the order in which the cluster linearized two operations on one
// identity: an operation that saw the state before another one's commit
// cannot report a later backend time than that commit's decision. Server A
// reads the identity and takes its time, then stalls before committing (its
// clock is held); server B answers meanwhile from the state before A's
// commit. B's answer is linearized first, so A's decision, which commits
// after, must carry a backend time no earlier than B's.
func TestBackendTimeFollowsLinearization(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	prefix := randomPrefix()
	clk := &stallClock{}
	a := open(t, c, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions(), ReapInterval: -1, Now: clk.now})
	b := open(t, c, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions(), ReapInterval: -1})
	owner, other := newActor("actor"), newActor("actor")

	t.Run("inspect_not_found_then_acquire", func(t *testing.T) {
		id := freshIdentity()
		reached, release := clk.arm()
		type answer struct {
			res lease.Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := a.Acquire(bg, owner.acquire(id, time.Minute))
			done <- answer{res, err}
		}()
		<-reached
		time.Sleep(5 * time.Millisecond)
		_, err := b.Inspect(bg, other.inspect(id))
		seen := refused(t, "inspect through B while A's acquire is in flight", err, lease.CodeNotFound)
		close(release)
		got := <-done
		rec := must(t, "acquire through A", got.res, got.err, lease.CodeAcquired)
		if rec.AcquiredAt.Time().Before(seen.BackendTime) {
			t.Errorf("B answered lease_not_found at backend time %s from the state before A's acquire committed, "+
				"yet A's lease was acquired_at %s, %v earlier: backend time runs against linearization order",
				seen.BackendTime.Format(time.RFC3339Nano), rec.AcquiredAt.Time().Format(time.RFC3339Nano),
				seen.BackendTime.Sub(rec.AcquiredAt.Time()))
		}
	})

	t.Run("conflict_then_release", func(t *testing.T) {
		id := freshIdentity()
		res, err := a.Acquire(bg, owner.acquire(id, time.Minute))
		rec := must(t, "acquire through A", res, err, lease.CodeAcquired)
		reached, release := clk.arm()
		type answer struct {
			res lease.Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := a.Release(bg, owner.release(rec))
			done <- answer{res, err}
		}()
		<-reached
		time.Sleep(5 * time.Millisecond)
		_, err = b.Acquire(bg, other.acquire(id, time.Minute))
		seen := refused(t, "acquire through B while A's release is in flight", err, lease.CodeConflict)
		close(release)
		got := <-done
		must(t, "release through A", got.res, got.err, lease.CodeReleased)
		if got.res.BackendTime.Time().Before(seen.BackendTime) {
			t.Errorf("B answered lease_conflict (the lease live) at backend time %s from the state before A's release "+
				"committed, yet A released it at %s, %v earlier: backend time runs against linearization order",
				seen.BackendTime.Format(time.RFC3339Nano), got.res.BackendTime.Time().Format(time.RFC3339Nano),
				seen.BackendTime.Sub(got.res.BackendTime.Time()))
		}
	})
}
