package rabbitmq_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// relayCaller is the relay's owner in these tests.
var relayCaller = lease.Caller{PrincipalID: "starlease-relay", ClientID: "relay", CredentialID: "relay-internal"}

// TestLeasedRelay: a LeasedRelay publishes only while it holds the outbox
// lease. While another holder has it, accepted publications wait in the
// outbox; once that holder releases, the relay takes the lease and
// delivers them; after its lease is revoked it starts a new term (a new
// lease, a higher token) and goes on.
func TestLeasedRelay(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	e := boltBackend().env(t, broker)
	queue := "q.leased." + randomHex(3)
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	ctx := context.Background()
	relayID := rabbitmq.RelayIdentity("bolt")

	// Another server's relay holds the outbox lease.
	other, err := e.store.Acquire(ctx, lease.AcquireRequest{Identity: relayID, ServiceInstanceID: "other-server", TTL: time.Minute,
		MaximumLifetime: time.Hour, ExecutionID: "exec-other", JobID: "job-other",
		Mutation: lease.Mutation{RequestID: "req-other", DeadlineAt: e.far(), Caller: relayCaller}})
	if err != nil {
		t.Fatal(err)
	}
	lr, err := rabbitmq.NewLeasedRelay(e.store, e.outbox, e.url, rabbitmq.LeasedRelayOptions{Identity: relayID, Caller: relayCaller,
		ServiceInstanceID: "this-server", TTL: 2 * time.Second, MonitorInterval: 50 * time.Millisecond, Relay: relayOptionsLeased(t)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lr.Run(rctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("leased relay did not stop")
		}
	}()

	rec := e.acquire("actor")
	c := e.committer(rec)
	pub := e.publisher()
	msg := func(i int) lease.OutboxMessage {
		return lease.OutboxMessage{RoutingKey: queue, Body: []byte(fmt.Sprintf("r%d", i))}
	}
	for i := 0; i < 3; i++ {
		if _, err := pub.Publish(ctx, c, fmt.Sprintf("c-%d", i), msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	cons.none(time.Second)
	if st := lr.Status(); st.Active || st.Stats.Confirmed != 0 || st.Backlog != 3 {
		t.Fatalf("status while another relay holds the lease: %+v", st)
	}

	// The other relay releases: this one takes over and publishes.
	if _, err := e.store.Release(ctx, lease.ReleaseRequest{Identity: relayID, LeaseID: other.Lease.LeaseID, FencingToken: other.Lease.FencingToken,
		ServiceInstanceID: "other-server", Mutation: lease.Mutation{RequestID: "req-other-rel", DeadlineAt: e.far(), Caller: relayCaller}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		d := cons.next(10 * time.Second)
		_ = d.Ack(false)
	}
	e.waitOutboxEmpty()
	st := lr.Status()
	if !st.Active || st.Terms != 1 {
		t.Fatalf("status after the takeover: %+v", st)
	}

	// Revoked: the relay's term ends and it acquires a new lease.
	cur, err := e.store.Inspect(ctx, lease.InspectRequest{Identity: relayID, DeadlineAt: e.far(), Caller: admin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Revoke(ctx, lease.AdminRequest{Identity: relayID, LeaseID: cur.Lease.LeaseID, FencingToken: cur.Lease.FencingToken,
		Reason: "test", Mutation: lease.Mutation{RequestID: "req-revoke-relay", DeadlineAt: e.far(), Caller: admin}}); err != nil {
		t.Fatal(err)
	}
	for limit := time.Now().Add(10 * time.Second); lr.Status().Terms < 2; {
		if time.Now().After(limit) {
			t.Fatalf("no new term after revoke: %+v", lr.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := pub.Publish(ctx, c, "c-after", msg(99)); err != nil {
		t.Fatal(err)
	}
	// A batch whose confirms came later than ConfirmTimeout (a loaded
	// broker) is published again: delivery is at least once, so copies of
	// r0..r2 may come first; nothing else may.
	for {
		d := cons.next(10 * time.Second)
		_ = d.Ack(false)
		if string(d.Body) == "r99" {
			break
		}
		if b := string(d.Body); b != "r0" && b != "r1" && b != "r2" {
			t.Fatalf("after the new term: %q", d.Body)
		}
		t.Logf("a redelivered copy of %q before r99 (its confirm came late)", d.Body)
	}
	now, err := e.store.Inspect(ctx, lease.InspectRequest{Identity: relayID, DeadlineAt: e.far(), Caller: admin})
	if err != nil || now.Lease.FencingToken <= cur.Lease.FencingToken {
		t.Fatalf("relay lease after revoke: %+v, %v", now.Lease, err)
	}
}

func relayOptionsLeased(t *testing.T) rabbitmq.RelayOptions {
	o := relayOptions(t)
	o.ConfirmTimeout = 400 * time.Millisecond
	return o
}

// TestRelayThroughput measures how fast a relay drains a backlog with
// publisher confirms (persistent messages, a durable queue, batches of
// DefaultBatchSize, each entry removed from the outbox after its ack), on
// each backend. It logs msgs/s; STARLEASE_RELAY_BENCH_N sets the backlog
// (default 3000).
func TestRelayThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	n := 3000
	if v := os.Getenv("STARLEASE_RELAY_BENCH_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	broker := testenv.StartRabbitMQ(t)
	redis := testenv.StartRedis(t)
	for _, b := range []backend{boltBackend(), valkeyBackend(redis)} {
		t.Run(b.name, func(t *testing.T) {
			e := b.env(t, broker)
			queue := "q.throughput." + b.name + "." + randomHex(3)
			declareQueue(t, e.url, queue, "", "")
			e.ttl = 5 * time.Minute // filling the outbox outlasts the valkey tests' short TTL
			rec := e.acquire("bench")
			c := e.committer(rec)
			pub := e.publisher()
			body := make([]byte, 512)
			for i := 0; i < n; i++ {
				if _, err := pub.Publish(context.Background(), c, fmt.Sprintf("c-%d", i), lease.OutboxMessage{RoutingKey: queue, Body: body}); err != nil {
					t.Fatal(err)
				}
			}
			counter := e.outbox.(interface {
				OutboxLen(context.Context) (int64, error)
			})
			start := time.Now()
			o := relayOptions(t)
			r, err := rabbitmq.NewRelay(e.outbox, e.url, o)
			if err != nil {
				t.Fatal(err)
			}
			runRelay(t, r)
			for {
				left, err := counter.OutboxLen(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if left == 0 {
					break
				}
				if time.Since(start) > 2*time.Minute {
					t.Fatalf("%d entries left after 2 minutes", left)
				}
				time.Sleep(5 * time.Millisecond)
			}
			took := time.Since(start)
			time.Sleep(50 * time.Millisecond) // the last removal's counter
			if st := r.Stats(); st.Removed != uint64(n) || st.Failed != 0 {
				t.Errorf("removed %d, want %d (stats %+v)", st.Removed, n, st)
			}
			t.Logf("relay throughput with confirms (%s outbox, %d × 512 B persistent, batch %d): %d msgs in %v = %.0f msgs/s",
				b.name, n, rabbitmq.DefaultBatchSize, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
		})
	}
}
