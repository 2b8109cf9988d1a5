package rabbitmq_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

func lockKey(n int) string { return fencetest.LockKey(fmt.Sprint("key-", n)) }

// delivery is a fenced delivery as the relay would publish it.
func delivery(id, key, leaseID string, token any) amqp.Delivery {
	return amqp.Delivery{MessageId: id, Headers: amqp.Table{
		rabbitmq.HeaderLockKey: key, rabbitmq.HeaderLeaseID: leaseID, rabbitmq.HeaderFencingToken: token,
		rabbitmq.HeaderExecutionID: "exec-1", rabbitmq.HeaderAcceptedAt: "2026-08-05T12:00:00.000Z",
	}}
}

func TestDeduperVerdicts(t *testing.T) {
	d := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	k := lockKey(1)
	for i, tc := range []struct {
		del     amqp.Delivery
		want    rabbitmq.Verdict
		highest uint64
	}{
		{delivery("m1", k, "lease-5", int64(5)), rabbitmq.Process, 0},
		{delivery("m1", k, "lease-5", int64(5)), rabbitmq.DropDuplicate, 5},
		{delivery("m2", k, "lease-5", int64(5)), rabbitmq.Process, 5}, // same lease, next publication
		{delivery("m3", k, "lease-4", int64(4)), rabbitmq.DropStaleToken, 5},
		{delivery("m4", k, "lease-x", int64(5)), rabbitmq.DropStaleToken, 5}, // equal token, other lease
		{delivery("m5", k, "lease-7", int32(7)), rabbitmq.Process, 5},        // any integer type
		{delivery("m6", k, "lease-5", int64(5)), rabbitmq.DropStaleToken, 7},
		{delivery("m1", lockKey(2), "lease-1", int64(1)), rabbitmq.Process, 0}, // ids and tokens are per lock key
		{delivery("", k, "lease-9", int64(9)), rabbitmq.DropUnfenced, 0},
		{delivery("m7", "raw-key", "lease-9", int64(9)), rabbitmq.DropUnfenced, 0},
		{delivery("m8", k, "", int64(9)), rabbitmq.DropUnfenced, 0},
		{delivery("m9", k, "lease-9", "9"), rabbitmq.DropUnfenced, 0},
		{delivery("m10", k, "lease-9", int64(0)), rabbitmq.DropUnfenced, 0},
		{delivery("m11", k, "lease-9", int64(lease.MaxFencingToken+1)), rabbitmq.DropUnfenced, 0},
		{amqp.Delivery{MessageId: "m12"}, rabbitmq.DropUnfenced, 0},
	} {
		dec := d.Check(tc.del)
		if dec.Verdict != tc.want || dec.Highest != tc.highest || dec.Reason == "" || dec.Dropped() != (tc.want != rabbitmq.Process) {
			t.Errorf("%d: %+v, want %s (highest %d)", i, dec, tc.want, tc.highest)
		}
		if tc.want == rabbitmq.DropUnfenced && !errors.Is(func() error { _, err := rabbitmq.FenceOf(tc.del); return err }(), rabbitmq.ErrNoFence) {
			t.Errorf("%d: FenceOf does not report ErrNoFence", i)
		}
	}
	if d.Highest(k) != 7 || d.Highest(lockKey(2)) != 1 || d.Highest(lockKey(3)) != 0 {
		t.Fatalf("highest %d %d", d.Highest(k), d.Highest(lockKey(2)))
	}
	bad := delivery("m13", k, "lease-9", int64(9))
	bad.Headers[rabbitmq.HeaderAcceptedAt] = "yesterday"
	if dec := d.Check(bad); dec.Verdict != rabbitmq.DropUnfenced || !strings.Contains(dec.Reason, rabbitmq.HeaderAcceptedAt) {
		t.Fatalf("malformed accepted_at: %+v", dec)
	}
}

// Memory is bounded: a ring of message ids per lock key, an LRU of lock
// keys.
func TestDeduperBounds(t *testing.T) {
	d := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{MaxLockKeys: 2, IDsPerLockKey: 3})
	k := lockKey(1)
	for i := 1; i <= 4; i++ {
		if dec := d.Check(delivery(fmt.Sprint("m", i), k, "lease-1", int64(1))); dec.Verdict != rabbitmq.Process {
			t.Fatalf("m%d: %+v", i, dec)
		}
	}
	// m1 fell out of the ring of 3; m2..m4 are remembered.
	if dec := d.Check(delivery("m1", k, "lease-1", int64(1))); dec.Verdict != rabbitmq.Process {
		t.Fatalf("m1 beyond the window: %+v", dec)
	}
	for _, id := range []string{"m3", "m4", "m1"} {
		if dec := d.Check(delivery(id, k, "lease-1", int64(1))); dec.Verdict != rabbitmq.DropDuplicate {
			t.Fatalf("%s within the window: %+v", id, dec)
		}
	}
	// A third lock key evicts the least recently seen one.
	d.Check(delivery("x", lockKey(2), "lease-1", int64(3)))
	d.Check(delivery("y", k, "lease-1", int64(1))) // k is now the most recent
	d.Check(delivery("z", lockKey(3), "lease-1", int64(9)))
	if d.Len() != 2 || d.Highest(lockKey(2)) != 0 || d.Highest(k) != 1 || d.Highest(lockKey(3)) != 9 {
		t.Fatalf("len %d, highest %d %d %d", d.Len(), d.Highest(k), d.Highest(lockKey(2)), d.Highest(lockKey(3)))
	}
}

// ack records how a delivery was settled.
type ack struct {
	mu     sync.Mutex
	events []string
}

func (a *ack) Ack(tag uint64, multiple bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, fmt.Sprint("ack ", tag))
	return nil
}

func (a *ack) Nack(tag uint64, multiple, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, fmt.Sprint("nack ", tag, " requeue=", requeue))
	return nil
}

func (a *ack) Reject(tag uint64, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, fmt.Sprint("reject ", tag, " requeue=", requeue))
	return nil
}

// Handle acknowledges dropped deliveries without processing them; a failed
// processing is requeued and forgotten, so its redelivery is processed.
func TestDeduperHandle(t *testing.T) {
	d := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	a := &ack{}
	del := func(tag uint64, id string, token int64) amqp.Delivery {
		x := delivery(id, lockKey(1), fmt.Sprint("lease-", token), token)
		x.Acknowledger, x.DeliveryTag = a, tag
		return x
	}
	var processed []string
	fail := errors.New("downstream unavailable")
	failing := true
	process := func(f rabbitmq.Fence, x amqp.Delivery) error {
		if failing {
			return fail
		}
		processed = append(processed, f.MessageID)
		return nil
	}
	if dec, err := d.Handle(del(1, "m1", 5), process); !errors.Is(err, fail) || dec.Verdict != rabbitmq.Process {
		t.Fatalf("failing process: %+v, %v", dec, err)
	}
	failing = false
	if dec, err := d.Handle(del(2, "m1", 5), process); err != nil || dec.Verdict != rabbitmq.Process {
		t.Fatalf("redelivery: %+v, %v", dec, err)
	}
	if dec, err := d.Handle(del(3, "m1", 5), process); err != nil || dec.Verdict != rabbitmq.DropDuplicate {
		t.Fatalf("duplicate: %+v, %v", dec, err)
	}
	if dec, err := d.Handle(del(4, "m0", 4), process); err != nil || dec.Verdict != rabbitmq.DropStaleToken {
		t.Fatalf("stale: %+v, %v", dec, err)
	}
	want := "[nack 1 requeue=true ack 2 ack 3 ack 4]"
	if fmt.Sprint(a.events) != want || fmt.Sprint(processed) != "[m1]" {
		t.Fatalf("settled %v, processed %v", a.events, processed)
	}
}

func TestDeduperConcurrent(t *testing.T) {
	d := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{MaxLockKeys: 4, IDsPerLockKey: 8})
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := map[string]int{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				id := fmt.Sprint("m", i%5)
				dec := d.Check(delivery(id, lockKey(i%3), "lease-1", int64(1)))
				if dec.Verdict == rabbitmq.Process {
					mu.Lock()
					passed[fmt.Sprint(i%3, "/", id)]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for k, n := range passed {
		if n != 1 {
			t.Errorf("%s passed %d times", k, n)
		}
	}
}
