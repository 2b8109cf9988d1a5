package etcd

import (
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
	"github.com/starintel/starlease/lease/leasetest/race"
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

// backendTimeFollowsLinearization checks that backend time never runs
// against the order in which the cluster linearized two operations on one
// identity: an operation that saw the state before another one's commit
// cannot report a later backend time than that commit's decision. Server A
// reads the identity and takes its time, then stalls before committing (its
// clock is held); server B answers meanwhile from the state before A's
// commit. B's answer is linearized first, so A's decision, which commits
// after, must carry a backend time no earlier than B's.
func backendTimeFollowsLinearization(t *testing.T, c *testenv.EtcdCluster) {
	prefix := randomPrefix()
	clk := &stallClock{}
	// No clock guard on A: its beats would read (and stall on) the clock.
	a := open(t, c, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions(), ReapInterval: -1, Now: clk.now, MaxClockSkew: -1})
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
			res, err := a.Acquire(bgCtx, owner.acquire(id, time.Minute))
			done <- answer{res, err}
		}()
		<-reached
		time.Sleep(5 * time.Millisecond)
		_, err := b.Inspect(bgCtx, other.inspect(id))
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
		res, err := a.Acquire(bgCtx, owner.acquire(id, time.Minute))
		rec := must(t, "acquire through A", res, err, lease.CodeAcquired)
		reached, release := clk.arm()
		type answer struct {
			res lease.Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := a.Release(bgCtx, owner.release(rec))
			done <- answer{res, err}
		}()
		<-reached
		time.Sleep(5 * time.Millisecond)
		_, err = b.Acquire(bgCtx, other.acquire(id, time.Minute))
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

// skewed is a clock offset from the real one.
func skewed(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

// skew is how far the two servers' clocks are off, one ahead, one behind.
const skew = 3 * time.Second

// skewedClocksRace runs the race suite's traffic through two stores on
// cluster c whose clocks are 3 s ahead and 3 s behind the real one (6 s
// apart): backend time is per identity, so the linearizability check and
// the invariants must find nothing, and every acknowledged success reads
// back.
func skewedClocksRace(t *testing.T, c *testenv.EtcdCluster) {
	stores := failoverStores(t, c, 2, 5*time.Second, skewed(skew), skewed(-skew))
	opts := race.Options{Workers: 8, Identities: 3, TTL: 800 * time.Millisecond, Duration: 5 * time.Second,
		CallTimeout: 10 * time.Second, ResolveByLookup: true, Seed: seed()}
	h := race.RecordStores(bgCtx, asStores(stores), opts)
	checkRun(t, "skew", h, opts)
	readBack(t, "skew", stores, h)
}

// skewedClocksExpiredStaysExpired checks, step by step, that a lease
// seen expired through the server whose clock runs ahead (fast, +3 s) can
// never be renewed, committed or released through the server whose clock
// runs behind (slow, -3 s), though by the slow clock it has time left, and
// that tokens strictly increase whichever server grants them.
func skewedClocksExpiredStaysExpired(t *testing.T, c *testenv.EtcdCluster) {
	stores := failoverStores(t, c, 2, 5*time.Second, skewed(skew), skewed(-skew))
	fast, slow := stores[0], stores[1]
	owner, other := newActor("actor"), newActor("actor")
	id := freshIdentity()
	tokens := map[lease.Identity][]uint64{}
	lastAcquired := map[lease.Identity]time.Time{}
	// granted checks a new lease of its identity against the earlier ones.
	granted := func(rec *lease.Record) {
		t.Helper()
		id := rec.Identity()
		if n := len(tokens[id]); n > 0 && rec.FencingToken <= tokens[id][n-1] {
			t.Errorf("token %d is not above the previous token %d", rec.FencingToken, tokens[id][n-1])
		}
		if rec.AcquiredAt.Time().Before(lastAcquired[id]) {
			t.Errorf("acquired_at %s is before the previous acquisition's %s", rec.AcquiredAt.Time(), lastAcquired[id])
		}
		tokens[id], lastAcquired[id] = append(tokens[id], rec.FencingToken), rec.AcquiredAt.Time()
	}
	acquire := func(s *Store, id lease.Identity, ttl time.Duration) *lease.Record {
		t.Helper()
		res, err := s.Acquire(bgCtx, owner.acquire(id, ttl))
		rec := must(t, "acquire", res, err, lease.CodeAcquired)
		granted(rec)
		return rec
	}
	// afterExpiry asserts that nothing through the slow server brings rec
	// back: renew, commit and release are lease_lost, inspect shows it
	// expired, another acquisition succeeds with a greater token.
	afterExpiry := func(how string, rec *lease.Record) {
		t.Helper()
		_, err := slow.Renew(bgCtx, owner.renew(rec))
		refused(t, "renew through the slow server after "+how, err, lease.CodeLost)
		_, err = slow.AuthorizeCommit(bgCtx, owner.commit(rec, "couchdb"))
		refused(t, "commit through the slow server after "+how, err, lease.CodeLost)
		_, err = slow.Release(bgCtx, owner.release(rec))
		refused(t, "release through the slow server after "+how, err, lease.CodeLost)
		res, err := slow.Inspect(bgCtx, lease.InspectRequest{LeaseID: rec.LeaseID, DeadlineAt: time.Now().Add(10 * time.Second), Caller: owner.caller})
		if err != nil || res.Lease.State != lease.StateExpired {
			t.Errorf("inspect through the slow server after %s: %v %+v, want the lease expired", how, err, res.Lease)
		}
	}

	// 1. Acquired through the slow server with a 4 s TTL: by the slow
	// clock it has 4 s, by the fast one it is already over. The fast
	// server's inspect says expired; from then on it stays expired.
	rec := acquire(slow, id, 4*time.Second)
	res, err := fast.Inspect(bgCtx, owner.inspect(id))
	if err != nil || res.Lease.LeaseID != rec.LeaseID || res.Lease.State != lease.StateExpired {
		t.Fatalf("inspect through the fast server: %v %+v, want lease %s expired", err, res.Lease, rec.LeaseID)
	}
	afterExpiry("the fast server's inspect said expired", rec)

	// 2. Acquired through the fast server with a 1 s TTL. Through the
	// slow server it is live (renewed once, with a 1 s TTL); after 1.2 s
	// the fast server's renewal is lease_lost, and from then on the slow
	// server cannot touch it, though by its clock 5 s remain.
	rec = acquire(fast, id, time.Second)
	r := owner.renew(rec)
	r.TTL = time.Second
	res, err = slow.Renew(bgCtx, r)
	rec = must(t, "renew through the slow server while live", res, err, lease.CodeRenewed)
	time.Sleep(time.Until(rec.ExpiresAt.Time().Add(-skew + 200*time.Millisecond)))
	_, err = fast.Renew(bgCtx, owner.renew(rec))
	refused(t, "renew through the fast server past expires_at", err, lease.CodeLost)
	afterExpiry("the fast server's renewal was lease_lost", rec)

	// 3. The same through a commit: the fast server's commit past expiry
	// is lease_lost, then the slow server's commit too.
	rec = acquire(fast, id, time.Second)
	time.Sleep(time.Until(rec.ExpiresAt.Time().Add(-skew + 200*time.Millisecond)))
	_, err = fast.AuthorizeCommit(bgCtx, owner.commit(rec, "rabbitmq"))
	refused(t, "commit through the fast server past expires_at", err, lease.CodeLost)
	afterExpiry("the fast server's commit was lease_lost", rec)

	// 4. On an identity no server touched yet, a lease acquired through
	// the slow server (its TTL leaves the slow clock 5.7 s and ends 0.3 s
	// before the fast clock's now): another owner's acquisition conflicts
	// through the slow server, by whose clock it is live, and succeeds
	// through the fast one, by whose clock it is over; the slow server
	// then sees the successor, and the old lease stays lost.
	id2 := freshIdentity()
	rec = acquire(slow, id2, 2*skew-300*time.Millisecond)
	_, err = slow.Acquire(bgCtx, other.acquire(id2, time.Minute))
	refused(t, "another owner's acquisition through the slow server while live by its clock", err, lease.CodeConflict)
	res, err = fast.Acquire(bgCtx, other.acquire(id2, time.Minute))
	succ := must(t, "another owner's acquisition through the fast server, past expires_at by its clock", res, err, lease.CodeAcquired)
	granted(succ)
	afterExpiry("a successor was acquired through the fast server", rec)
	res, err = slow.Inspect(bgCtx, owner.inspect(id2))
	if err != nil || res.Lease.LeaseID != succ.LeaseID || res.Lease.State != lease.StateActive {
		t.Errorf("inspect through the slow server: %v %+v, want the successor %s active", err, res.Lease, succ.LeaseID)
	}
	t.Logf("skew: tokens in order of acquisition: first identity %v, second %v", tokens[id], tokens[id2])
}
