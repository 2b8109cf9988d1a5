package recovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// amqpChannel opens a channel on its own connection, closed with the test.
func amqpChannel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial broker: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// waitReady waits until queue holds n ready messages: a channel close
// returns its unacknowledged messages asynchronously.
func waitReady(t *testing.T, url, queue string, n int) {
	t.Helper()
	ch := amqpChannel(t, url)
	defer ch.Close()
	limit := time.Now().Add(15 * time.Second)
	for {
		st, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspect %s: %v", queue, err)
		}
		if st.Messages == n {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("queue %s holds %d ready messages, want %d", queue, st.Messages, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drain takes every message of queue, acknowledging each, and returns them
// in queue order.
func drain(t *testing.T, url, queue string) []amqp.Delivery {
	t.Helper()
	ch := amqpChannel(t, url)
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
}

func messageIDs(ds []amqp.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.MessageId
	}
	return ids
}

// TestRabbitMQProofCollectsPublishedTokens publishes through the real path
// (lease, Publisher, outbox, Relay) and checks that the proof holds the
// highest token per lock key, and that the queues still hold every message,
// in order, afterwards.
func TestRabbitMQProofCollectsPublishedTokens(t *testing.T) {
	ctx := context.Background()
	broker := testenv.StartRabbitMQ(t)
	q1, q2 := "results.one", "results.two"
	broker.DeclareQueues(t, q1, q2)
	s := open(t, filepath.Join(t.TempDir(), "live.db"))
	pub := rabbitmq.NewPublisher(s, rabbitmq.WithCaller(caller))

	want := map[string]uint64{}   // over both queues
	wantQ1 := map[string]uint64{} // q1 alone
	order := map[string][]string{}
	n := 0
	// publish acquires a lease on target, publishes one message per queue
	// named under it and releases.
	publish := func(target string, queues ...string) {
		t.Helper()
		n++
		l := underLease(t, s, target, fmt.Sprintf("req-%d", n), false, func(l *lease.Record, c *fence.Committer) {
			for i, q := range queues {
				p, err := pub.Publish(ctx, c, fmt.Sprintf("commit-%d-%d", n, i), lease.OutboxMessage{RoutingKey: q,
					ContentType: "application/json", Body: []byte(fmt.Sprintf(`{"target":%q,"n":%d}`, target, n))})
				if err != nil {
					t.Fatalf("publish to %s: %v", q, err)
				}
				order[q] = append(order[q], p.MessageID)
				if q == q1 {
					wantQ1[l.LockKey] = l.FencingToken
				}
			}
		})
		want[l.LockKey] = l.FencingToken
	}
	publish("target-a", q1)         // token 1
	publish("target-b", q1, q2)     // token 1
	publish("target-a", q1, q1, q2) // token 2: the highest of target-a in q1
	publish("target-a", q2)         // token 3: the highest of target-a
	publish("target-c", q2, q2)
	if want[lockKeyOf(t, "target-a")] != 3 || wantQ1[lockKeyOf(t, "target-a")] != 2 || len(want) != 3 {
		t.Fatalf("setup: marks %v, q1 marks %v", want, wantQ1)
	}

	// The relay moves the outbox to the broker; Mandatory keeps an
	// unroutable entry instead of dropping it.
	relay, err := rabbitmq.NewRelay(s, broker.URL(), rabbitmq.RelayOptions{Mandatory: true, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	limit := time.Now().Add(20 * time.Second)
	for {
		p, err := s.OutboxPending(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 0 {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("outbox still holds %d entries", len(p))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("relay: %v", err)
	}
	waitReady(t, broker.URL(), q1, len(order[q1]))
	waitReady(t, broker.URL(), q2, len(order[q2]))

	var proof Proof
	if err := RabbitMQProof(ctx, broker.URL(), []string{q1, q2}, &proof); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(proof.Marks, want) {
		t.Fatalf("marks %v, want %v", proof.Marks, want)
	}
	if proof.Complete {
		t.Fatal("RabbitMQProof must not assert completeness")
	}
	wantSources := []string{
		fmt.Sprintf("rabbitmq:amqp://%s vhost / queue %s (4 messages, 2 lock keys)", broker.Addr(), q1),
		fmt.Sprintf("rabbitmq:amqp://%s vhost / queue %s (5 messages, 3 lock keys)", broker.Addr(), q2),
	}
	if !slices.Equal(proof.Sources, wantSources) {
		t.Fatalf("sources %q, want %q", proof.Sources, wantSources)
	}

	// Reading again (one queue) finds the same messages: nothing was
	// taken.
	waitReady(t, broker.URL(), q1, len(order[q1]))
	var again Proof
	if err := RabbitMQProof(ctx, broker.URL(), []string{q1}, &again); err != nil || !maps.Equal(again.Marks, wantQ1) {
		t.Fatalf("second read of %s: %v, %v; want %v", q1, again.Marks, err, wantQ1)
	}

	// Every message is back in its queue, in publication order, with its
	// body and fence.
	for _, q := range []string{q1, q2} {
		waitReady(t, broker.URL(), q, len(order[q]))
		got := drain(t, broker.URL(), q)
		if ids := messageIDs(got); !slices.Equal(ids, order[q]) {
			t.Fatalf("%s after the proof holds\n %v\nwant\n %v", q, ids, order[q])
		}
		for _, d := range got {
			if _, err := rabbitmq.FenceOf(d); err != nil || !d.Redelivered || !strings.Contains(string(d.Body), `"target"`) {
				t.Fatalf("%s: message %s came back changed: fence %v, redelivered %v, body %q", q, d.MessageId, err, d.Redelivered, d.Body)
			}
		}
	}
}

// fenced is a publication with the relay's fence headers.
func fenced(id, lockKey string, token any) amqp.Publishing {
	return amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id), Headers: amqp.Table{
		rabbitmq.HeaderLockKey: lockKey, rabbitmq.HeaderLeaseID: "lease-1", rabbitmq.HeaderFencingToken: token,
		rabbitmq.HeaderExecutionID: "exec-1", rabbitmq.HeaderAcceptedAt: lease.At(time.Now()).String(),
		rabbitmq.HeaderSink: rabbitmq.DefaultSink, rabbitmq.HeaderCommitID: "commit-" + id,
	}}
}

// inject publishes straight to a queue, with confirms, as a rogue or
// broken publisher could.
func inject(t *testing.T, url, queue string, ps ...amqp.Publishing) {
	t.Helper()
	ch := amqpChannel(t, url)
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, p)
		if err != nil || !dc.Wait() {
			t.Fatalf("inject into %s: %v", queue, err)
		}
	}
}

func TestRabbitMQProofFailsClosed(t *testing.T) {
	ctx := context.Background()
	broker := testenv.StartRabbitMQ(t)
	key := lockKeyOf(t, "target-a")
	good := fenced("good", key, int64(7))
	without := func(h string) amqp.Publishing {
		p := fenced("bad", key, int64(9))
		p.Headers = maps.Clone(p.Headers)
		delete(p.Headers, h)
		return p
	}
	noID := fenced("bad", key, int64(9))
	noID.MessageId = ""
	cases := map[string]amqp.Publishing{
		"no headers":      {MessageId: "bad", Body: []byte("x")},
		"no message id":   noID,
		"no lock key":     without(rabbitmq.HeaderLockKey),
		"no lease id":     without(rabbitmq.HeaderLeaseID),
		"no token":        without(rabbitmq.HeaderFencingToken),
		"token as string": fenced("bad", key, "9"),
		"token zero":      fenced("bad", key, int64(0)),
		"token negative":  fenced("bad", key, int64(-9)),
		"token above max": fenced("bad", key, int64(lease.MaxFencingToken+1)),
		"token as float":  fenced("bad", key, 9.0),
		"prefix-only key": fenced("bad", lease.KeyPrefix+"k1", int64(9)),
		"raw lock key":    fenced("bad", "target-a", int64(9)),
		"bad accepted_at": func() amqp.Publishing {
			p := fenced("bad", key, int64(9))
			p.Headers[rabbitmq.HeaderAcceptedAt] = "yesterday"
			return p
		}(),
		"lock key integer": func() amqp.Publishing {
			p := fenced("bad", key, int64(9))
			p.Headers[rabbitmq.HeaderLockKey] = int64(1)
			return p
		}(),
	}
	i := 0
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			i++
			q := fmt.Sprintf("bad-%d", i)
			broker.DeclareQueues(t, q)
			inject(t, broker.URL(), q, good, bad)
			var proof Proof
			err := RabbitMQProof(ctx, broker.URL(), []string{q}, &proof)
			if lease.CodeOf(err) != lease.CodeCorrupt || !strings.Contains(err.Error(), fmt.Sprintf("queue %q: message 2", q)) {
				t.Fatalf("err %v (%s), want lease_corrupt naming the queue and message", err, lease.CodeOf(err))
			}
			if len(proof.Marks) != 0 || len(proof.Sources) != 0 {
				t.Fatalf("a failed proof recorded %v %v", proof.Marks, proof.Sources)
			}
			// A failed proof takes nothing either.
			waitReady(t, broker.URL(), q, 2)
			if ids := messageIDs(drain(t, broker.URL(), q)); !slices.Equal(ids, []string{"good", bad.MessageId}) {
				t.Fatalf("queue holds %q after a failed proof", ids)
			}
		})
	}

	// The good message alone is accepted (control), and an empty queue
	// proves nothing but is no error.
	broker.DeclareQueues(t, "control", "empty")
	inject(t, broker.URL(), "control", good)
	var proof Proof
	if err := RabbitMQProof(ctx, broker.URL(), []string{"control", "empty"}, &proof); err != nil ||
		!maps.Equal(proof.Marks, map[string]uint64{key: 7}) || len(proof.Sources) != 2 ||
		!strings.HasSuffix(proof.Sources[1], "queue empty (0 messages, 0 lock keys)") {
		t.Fatalf("control: %v, %v %q", err, proof.Marks, proof.Sources)
	}

	// A missing queue fails the whole proof, even after a good queue.
	var missing Proof
	err := RabbitMQProof(ctx, broker.URL(), []string{"control", "missing"}, &missing)
	if lease.CodeOf(err) != lease.CodeInvalidRequest || !strings.Contains(err.Error(), `"missing" does not exist`) ||
		len(missing.Marks) != 0 || len(missing.Sources) != 0 {
		t.Fatalf("missing queue: %v (%s), recorded %v %v", err, lease.CodeOf(err), missing.Marks, missing.Sources)
	}
	waitReady(t, broker.URL(), "control", 1)

	// No queue, an empty or repeated name, a bad URL, an unreachable broker.
	for name, queues := range map[string][]string{"none": nil, "empty name": {""}, "twice": {"control", "control"}} {
		if err := RabbitMQProof(ctx, broker.URL(), queues, &missing); lease.CodeOf(err) != lease.CodeInvalidRequest {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := RabbitMQProof(ctx, "http://guest:s3cret@"+broker.Addr()+"/", []string{"control"}, &missing); lease.CodeOf(err) != lease.CodeInvalidRequest ||
		strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL: %v", err)
	}
	if err := RabbitMQProof(ctx, "amqp://guest:s3cret@127.0.0.1:1/", []string{"control"}, &missing); lease.CodeOf(err) != lease.CodeBackendUnavailable ||
		strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unreachable: %v", err)
	}
	if len(missing.Marks) != 0 || len(missing.Sources) != 0 {
		t.Fatalf("failed proofs recorded %v %v", missing.Marks, missing.Sources)
	}
}

// TestMarksFileProof reads a consumer record written from a Deduper that
// consumed real deliveries, and refuses malformed or missing records.
func TestMarksFileProof(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	a, b := lockKeyOf(t, "target-a"), lockKeyOf(t, "target-b")
	broker.DeclareQueues(t, "consumer")
	inject(t, broker.URL(), "consumer", fenced("m1", a, int64(3)), fenced("m2", a, int64(5)),
		fenced("m3", b, int64(2)), fenced("m2", a, int64(5)), fenced("m4", a, int64(4)))

	// A consumer: every delivery through its Deduper, then its marks saved.
	d := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	var processed []string
	for _, del := range drain(t, broker.URL(), "consumer") {
		if dec := d.Check(del); !dec.Dropped() {
			processed = append(processed, del.MessageId)
		}
	}
	if !slices.Equal(processed, []string{"m1", "m2", "m3"}) {
		t.Fatalf("processed %v", processed)
	}
	path := filepath.Join(t.TempDir(), "consumer.marks")
	if err := rabbitmq.WriteMarksFile(path, d.Marks()); err != nil {
		t.Fatal(err)
	}

	var proof Proof
	proof.Observe(b, 10) // from another source: stays the higher
	if err := MarksFileProof(path, &proof); err != nil {
		t.Fatal(err)
	}
	if want := map[string]uint64{a: 5, b: 10}; !maps.Equal(proof.Marks, want) {
		t.Fatalf("marks %v, want %v", proof.Marks, want)
	}
	if want := []string{"rabbitmq-consumer-marks:" + path + " (2 lock keys)"}; !slices.Equal(proof.Sources, want) || proof.Complete {
		t.Fatalf("sources %q, complete %v", proof.Sources, proof.Complete)
	}

	// A malformed record is lease_corrupt and keeps its typed cause; a
	// missing one is backend_unavailable; neither records anything.
	bad := filepath.Join(t.TempDir(), "bad.marks")
	if err := os.WriteFile(bad, []byte(fmt.Sprintf(`{%q:5,%q:"2"}`, a, b)), 0o600); err != nil {
		t.Fatal(err)
	}
	var failed Proof
	err := MarksFileProof(bad, &failed)
	var me *rabbitmq.MarksError
	if lease.CodeOf(err) != lease.CodeCorrupt || !errors.As(err, &me) || me.LockKey != b {
		t.Fatalf("malformed record: %v (%s)", err, lease.CodeOf(err))
	}
	err = MarksFileProof(filepath.Join(t.TempDir(), "missing.marks"), &failed)
	if lease.CodeOf(err) != lease.CodeBackendUnavailable || errors.Is(err, rabbitmq.ErrMalformedMarks) {
		t.Fatalf("missing record: %v (%s)", err, lease.CodeOf(err))
	}
	if len(failed.Marks) != 0 || len(failed.Sources) != 0 {
		t.Fatalf("failed proofs recorded %v %v", failed.Marks, failed.Sources)
	}
}
