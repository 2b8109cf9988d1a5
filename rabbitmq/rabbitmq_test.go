package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

const (
	exchange = "starintel.results"
	// quiet is how long a consumer waits to be sure nothing (more) arrives.
	quiet = 500 * time.Millisecond
	// arrive bounds the wait for an expected delivery.
	arrive = 15 * time.Second
)

// TestRabbitMQ runs every scenario against one real broker, once per lease
// backend (bolt, and Valkey on a durable redis-server), each scenario with
// its own store and queue.
func TestRabbitMQ(t *testing.T) {
	t.Parallel()
	broker := testenv.StartRabbitMQ(t)
	redis := testenv.StartRedis(t)
	for _, b := range []backend{boltBackend(), valkeyBackend(redis)} {
		t.Run(b.name, func(t *testing.T) {
			for _, sc := range []struct {
				name string
				run  func(t *testing.T, e *env, queue string)
			}{
				{"holder_publication_flows", holderPublicationFlows},
				{"expired_holder_publishes_nothing", expiredHolderPublishesNothing},
				{"lower_token_after_successor", lowerTokenAfterSuccessor},
				{"duplicate_delivery_processed_once", duplicateDeliveryProcessedOnce},
				{"revoke_and_force_release_reject", adminInvalidationRejects},
				{"mandatory_unroutable_stays_pending", mandatoryUnroutableStaysPending},
			} {
				t.Run(sc.name, func(t *testing.T) {
					e := b.env(t, broker)
					queue := fmt.Sprintf("q.%s.%s.%s", b.name, sc.name, randomHex(3))
					sc.run(t, e, queue)
				})
			}
		})
	}
}

// wantFence checks a delivery's message id, properties and fence headers
// against the accepted publication.
func wantFence(t *testing.T, d amqp.Delivery, rec *lease.Record, pub rabbitmq.Publication, msg lease.OutboxMessage) {
	t.Helper()
	if d.MessageId != pub.MessageID || d.MessageId == "" {
		t.Errorf("message id %q, want %q", d.MessageId, pub.MessageID)
	}
	if !bytes.Equal(d.Body, msg.Body) || d.ContentType != msg.ContentType {
		t.Errorf("body %q (%s), want %q (%s)", d.Body, d.ContentType, msg.Body, msg.ContentType)
	}
	if d.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want persistent", d.DeliveryMode)
	}
	if d.Exchange != msg.Exchange || d.RoutingKey != msg.RoutingKey {
		t.Errorf("exchange/routing key %q/%q, want %q/%q", d.Exchange, d.RoutingKey, msg.Exchange, msg.RoutingKey)
	}
	wantHeaders := amqp.Table{
		rabbitmq.HeaderLockKey:      rec.LockKey,
		rabbitmq.HeaderLeaseID:      rec.LeaseID,
		rabbitmq.HeaderFencingToken: int64(rec.FencingToken),
		rabbitmq.HeaderExecutionID:  rec.ExecutionID,
		rabbitmq.HeaderTraceID:      rec.TraceID,
		rabbitmq.HeaderAcceptedAt:   pub.Guard.AcceptedAt.String(),
		rabbitmq.HeaderSink:         rabbitmq.DefaultSink,
		rabbitmq.HeaderCommitID:     pub.Guard.CommitID,
	}
	if fmt.Sprint(d.Headers) != fmt.Sprint(wantHeaders) {
		t.Errorf("headers\n got  %v\n want %v", d.Headers, wantHeaders)
	}
	if v, ok := d.Headers[rabbitmq.HeaderFencingToken].(int64); !ok || v != int64(rec.FencingToken) {
		t.Errorf("fencing token header %T %v, want int64 %d", d.Headers[rabbitmq.HeaderFencingToken], d.Headers[rabbitmq.HeaderFencingToken], rec.FencingToken)
	}
	f, err := rabbitmq.FenceOf(d)
	want := rabbitmq.Fence{MessageID: pub.MessageID, LockKey: rec.LockKey, LeaseID: rec.LeaseID,
		FencingToken: rec.FencingToken, ExecutionID: rec.ExecutionID, TraceID: rec.TraceID,
		AcceptedAt: pub.Guard.AcceptedAt, Sink: rabbitmq.DefaultSink, CommitID: pub.Guard.CommitID}
	if err != nil || f != want {
		t.Errorf("FenceOf: %+v, %v\n want %+v", f, err, want)
	}
}

// (a) A holder's publication flows Publish → outbox → relay → queue: the
// consumer receives it exactly once, with its body, stable message id and
// fence headers, and the outbox is empty afterwards.
func holderPublicationFlows(t *testing.T, e *env, queue string) {
	ctx := context.Background()
	msg := lease.OutboxMessage{Exchange: exchange, RoutingKey: queue, ContentType: "application/json",
		Body: []byte(`{"open_ports":[22,443]}`)}
	declareQueue(t, e.url, queue, exchange, queue)
	rec := e.acquire("instance-a")
	c := e.committer(rec)
	pub := e.publisher()
	p, err := pub.Publish(ctx, c, "exec-a-result", msg)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if p.Replayed || p.Guard.LeaseID != rec.LeaseID || p.Guard.FencingToken != rec.FencingToken || p.Guard.LockKey != rec.LockKey {
		t.Fatalf("publication %+v", p)
	}
	if id, err := rabbitmq.MessageID(c.Envelope(), "", "exec-a-result"); err != nil || id != p.MessageID {
		t.Fatalf("MessageID = %q, %v; Publish said %q", id, err, p.MessageID)
	}
	// The publication is in the outbox, with the lease check's fence.
	got := e.pending()
	if len(got) != 1 || got[0].MessageID != p.MessageID || got[0].FencingToken != rec.FencingToken ||
		got[0].LeaseID != rec.LeaseID || got[0].AcceptedAt != p.Guard.AcceptedAt || !bytes.Equal(got[0].Message.Body, msg.Body) {
		t.Fatalf("outbox %+v, publication %+v", got, p)
	}
	// A retry with the same commit id replays and appends nothing; the same
	// id with another message is refused.
	again, err := pub.Publish(ctx, c, "exec-a-result", msg)
	if err != nil || !again.Replayed || again.MessageID != p.MessageID || again.Guard != p.Guard {
		t.Fatalf("retry: %+v, %v", again, err)
	}
	other := msg
	other.Body = []byte(`{"other":1}`)
	if _, err := pub.Publish(ctx, c, "exec-a-result", other); lease.CodeOf(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("same commit id, other message: %v", err)
	}
	if n := len(e.pending()); n != 1 {
		t.Fatalf("outbox holds %d entries after retries, want 1", n)
	}

	cons := newConsumer(t, e.url, queue)
	relay := e.startRelay(relayOptions(t))
	d := cons.next(arrive)
	wantFence(t, d, rec, p, msg)
	dedupe := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	var processed []string
	if dec, err := dedupe.Handle(d, func(f rabbitmq.Fence, d amqp.Delivery) error {
		processed = append(processed, string(d.Body))
		return nil
	}); err != nil || dec.Verdict != rabbitmq.Process {
		t.Fatalf("deduper: %+v, %v", dec, err)
	}
	cons.none(quiet)
	e.waitOutboxEmpty()
	if len(processed) != 1 || processed[0] != string(msg.Body) {
		t.Fatalf("processed %q", processed)
	}
	if s := relay.Stats(); s.Confirmed != 1 || s.Removed != 1 || s.Failed != 0 || s.Connects != 1 {
		t.Fatalf("relay stats %+v", s)
	}
}

// (b) An expired holder's Publish is lease_lost and nothing of it reaches
// the queue, while the successor's message arrives.
func expiredHolderPublishesNothing(t *testing.T, e *env, queue string) {
	ctx := context.Background()
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	e.startRelay(relayOptions(t))

	first := e.acquire("instance-a")
	a := e.committer(first)
	var loss fencetest.LossRecorder
	pubA := e.publisher(rabbitmq.WithLossHandler(loss.Handler))
	e.expire(first)
	msgA := lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte("late result from a")}
	if _, err := pubA.Publish(ctx, a, "a-result", msgA); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("expired holder's publish: %v, want lease_lost", err)
	}
	if got := loss.Seen(); len(got) != 1 || got[0] != lease.CodeLost {
		t.Fatalf("loss handler saw %v", got)
	}
	if n := len(e.pending()); n != 0 {
		t.Fatalf("an expired holder's publication entered the outbox (%d entries)", n)
	}
	cons.none(quiet) // the relay runs: still nothing

	second := e.acquire("instance-b")
	if second.FencingToken <= first.FencingToken {
		t.Fatalf("successor token %d not above %d", second.FencingToken, first.FencingToken)
	}
	b := e.committer(second)
	msgB := lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte("result from b")}
	pb, err := e.publisher().Publish(ctx, b, "b-result", msgB)
	if err != nil {
		t.Fatalf("successor's publish: %v", err)
	}
	d := cons.next(arrive)
	if d.MessageId != pb.MessageID || string(d.Body) != "result from b" {
		t.Fatalf("received %q (%s), want the successor's", d.Body, d.MessageId)
	}
	if f, err := rabbitmq.FenceOf(d); err != nil || f.FencingToken != second.FencingToken || f.LeaseID != second.LeaseID {
		t.Fatalf("fence %+v, %v", f, err)
	}
	d.Ack(false)
	cons.none(quiet)
	e.waitOutboxEmpty()
}

// (c) A lower token after a successor acquired is rejected at Publish; a
// delivery with that lower token injected straight into the queue (a stale
// publisher bypassing the outbox) is dropped by the consumer's Deduper.
func lowerTokenAfterSuccessor(t *testing.T, e *env, queue string) {
	ctx := context.Background()
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	e.startRelay(relayOptions(t))
	dedupe := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	var processed []string
	consume := func(want rabbitmq.Verdict) rabbitmq.Decision {
		t.Helper()
		d := cons.next(arrive)
		dec, err := dedupe.Handle(d, func(f rabbitmq.Fence, d amqp.Delivery) error {
			processed = append(processed, string(d.Body))
			return nil
		})
		if err != nil || dec.Verdict != want {
			t.Fatalf("delivery %q: %s (%s), %v; want %s", d.Body, dec.Verdict, dec.Reason, err, want)
		}
		return dec
	}

	first := e.acquire("instance-a")
	a := e.committer(first)
	msg := func(body string) lease.OutboxMessage {
		return lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte(body)}
	}
	pa, err := e.publisher().Publish(ctx, a, "a-1", msg("a: first result"))
	if err != nil {
		t.Fatal(err)
	}
	consume(rabbitmq.Process)

	e.expire(first)
	second := e.acquire("instance-b")
	if _, err := e.publisher().Publish(ctx, e.committer(second), "b-1", msg("b: result")); err != nil {
		t.Fatal(err)
	}
	consume(rabbitmq.Process)

	// The holder with the lower token publishes after the successor: the
	// lease check refuses it (its lease is gone: lease_lost; were it still
	// held, the sink's high-water mark would answer commit_rejected).
	if _, err := e.publisher().Publish(ctx, a, "a-2", msg("a: stale result")); lease.CodeOf(err) != lease.CodeLost &&
		lease.CodeOf(err) != lease.CodeCommitRejected {
		t.Fatalf("lower-token publish: %v, want lease_lost or commit_rejected", err)
	}
	if got := e.pendingOf(first.LeaseID); len(got) != 0 {
		t.Fatalf("a lower-token publication entered the outbox: %+v", got)
	}
	cons.none(quiet)

	// A stale publisher bypasses the outbox and publishes to the queue
	// with its old, once valid fence and a fresh message id.
	stale := amqp.Publishing{MessageId: "msg_forged_" + randomHex(4), DeliveryMode: amqp.Persistent,
		ContentType: "text/plain", Body: []byte("a: injected stale result"),
		Headers: amqp.Table{rabbitmq.HeaderLockKey: first.LockKey, rabbitmq.HeaderLeaseID: first.LeaseID,
			rabbitmq.HeaderFencingToken: int64(first.FencingToken), rabbitmq.HeaderExecutionID: first.ExecutionID,
			rabbitmq.HeaderAcceptedAt: pa.Guard.AcceptedAt.String()}}
	inject(t, e.url, queue, stale)
	dec := consume(rabbitmq.DropStaleToken)
	if dec.Highest != second.FencingToken || dec.Fence.FencingToken != first.FencingToken {
		t.Fatalf("stale decision %+v", dec)
	}
	// Replaying the very message the relay published for a (same message
	// id, same fence) is a duplicate.
	inject(t, e.url, queue, amqp.Publishing{MessageId: pa.MessageID, Body: []byte("a: replayed"), Headers: stale.Headers})
	consume(rabbitmq.DropDuplicate)
	// A delivery without a fence is dropped too.
	inject(t, e.url, queue, amqp.Publishing{MessageId: "msg_unfenced", Body: []byte("no fence")})
	consume(rabbitmq.DropUnfenced)

	want := []string{"a: first result", "b: result"}
	if fmt.Sprint(processed) != fmt.Sprint(want) {
		t.Fatalf("processed %q, want %q", processed, want)
	}
	cons.none(quiet)
}

// (d) The relay publishes an entry and "crashes" before OutboxDone; the
// next relay publishes it again with the same message id; the consumer
// processes it once.
func duplicateDeliveryProcessedOnce(t *testing.T, e *env, queue string) {
	ctx := context.Background()
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	rec := e.acquire("instance-a")
	msg := lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte("exactly once")}
	p, err := e.publisher().Publish(ctx, e.committer(rec), "a-1", msg)
	if err != nil {
		t.Fatal(err)
	}

	crashing, err := rabbitmq.NewRelay(e.outbox, e.url, relayOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	errCrash := errors.New("simulated crash between the broker's ack and OutboxDone")
	var hooked []string
	rabbitmq.SetBeforeDone(crashing, func(en lease.OutboxEntry) error {
		hooked = append(hooked, en.MessageID)
		return errCrash
	})
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := crashing.Run(runCtx); !errors.Is(err, errCrash) {
		t.Fatalf("crashing relay returned %v", err)
	}
	if len(hooked) != 1 || hooked[0] != p.MessageID {
		t.Fatalf("hook saw %v", hooked)
	}
	if s := crashing.Stats(); s.Confirmed != 1 || s.Removed != 0 {
		t.Fatalf("crashing relay stats %+v", s)
	}
	if got := e.pending(); len(got) != 1 || got[0].MessageID != p.MessageID {
		t.Fatalf("after the crash the outbox holds %+v, want the entry", got)
	}

	relay := e.startRelay(relayOptions(t))
	e.waitOutboxEmpty()
	dedupe := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	processed := 0
	var verdicts []rabbitmq.Verdict
	for range 2 {
		d := cons.next(arrive)
		if d.MessageId != p.MessageID {
			t.Fatalf("message id %q, want %q", d.MessageId, p.MessageID)
		}
		dec, err := dedupe.Handle(d, func(rabbitmq.Fence, amqp.Delivery) error { processed++; return nil })
		if err != nil {
			t.Fatal(err)
		}
		verdicts = append(verdicts, dec.Verdict)
	}
	cons.none(quiet)
	if processed != 1 || verdicts[0] != rabbitmq.Process || verdicts[1] != rabbitmq.DropDuplicate {
		t.Fatalf("processed %d times, verdicts %v", processed, verdicts)
	}
	if s := relay.Stats(); s.Confirmed != 1 || s.Removed != 1 {
		t.Fatalf("second relay stats %+v", s)
	}
}

// (e) After Revoke or ForceRelease returns, the holder's Publish is
// rejected (enforcement point 6); only what it published before arrives.
func adminInvalidationRejects(t *testing.T, e *env, queue string) {
	ctx := context.Background()
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	e.startRelay(relayOptions(t))
	for i, op := range []lease.Op{lease.OpRevoke, lease.OpForceRelease} {
		rec := e.acquire(fmt.Sprintf("instance-%d", i))
		c := e.committer(rec)
		msg := func(body string) lease.OutboxMessage {
			return lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte(body)}
		}
		before, err := e.publisher().Publish(ctx, c, string(op)+"-before", msg(string(op)+": before"))
		if err != nil {
			t.Fatal(err)
		}
		d := cons.next(arrive)
		if d.MessageId != before.MessageID {
			t.Fatalf("%s: received %q", op, d.Body)
		}
		d.Ack(false)
		req := lease.AdminRequest{Identity: e.id, LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
			Reason: "incident drill", Mutation: lease.Mutation{RequestID: "req-admin-" + randomHex(4), DeadlineAt: e.far(), Caller: admin}}
		if op == lease.OpRevoke {
			_, err = e.store.Revoke(ctx, req)
		} else {
			_, err = e.store.ForceRelease(ctx, req)
		}
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		var loss fencetest.LossRecorder
		if _, err := e.publisher(rabbitmq.WithLossHandler(loss.Handler)).Publish(ctx, c, string(op)+"-after", msg(string(op)+": after")); lease.CodeOf(err) != lease.CodeLost {
			t.Fatalf("publish after %s: %v, want lease_lost", op, err)
		}
		if got := loss.Seen(); len(got) != 1 || got[0] != lease.CodeLost {
			t.Fatalf("loss handler after %s saw %v", op, got)
		}
		// The commit id authorized before the invalidation publishes
		// nothing new: for another message (body, routing key, content
		// type) it is idempotency_conflict; for the same one a replay that
		// appends nothing.
		for _, changed := range []lease.OutboxMessage{msg(string(op) + ": after, replayed"),
			{RoutingKey: queue + ".other", ContentType: "text/plain", Body: []byte(string(op) + ": before")},
			{RoutingKey: queue, ContentType: "application/json", Body: []byte(string(op) + ": before")}} {
			if _, err := e.publisher().Publish(ctx, c, string(op)+"-before", changed); lease.CodeOf(err) != lease.CodeIdempotencyConflict {
				t.Fatalf("replayed commit id after %s with another message: %v, want idempotency_conflict", op, err)
			}
		}
		if again, err := e.publisher().Publish(ctx, c, string(op)+"-before", msg(string(op)+": before")); err != nil ||
			!again.Replayed || again.MessageID != before.MessageID {
			t.Fatalf("replay after %s: %+v %v", op, again, err)
		}
		if got := e.pendingOf(rec.LeaseID); len(got) > 1 || (len(got) == 1 && got[0].MessageID != before.MessageID) {
			t.Fatalf("after %s the outbox holds %+v", op, got)
		}
		cons.none(quiet)
	}
}

// With Mandatory, a publication the broker cannot route is returned and
// stays in the outbox until a queue is bound; then it is delivered.
func mandatoryUnroutableStaysPending(t *testing.T, e *env, queue string) {
	ctx := context.Background()
	declareQueue(t, e.url, queue, exchange, "bound."+queue) // the exchange exists, the key is not bound yet
	rec := e.acquire("instance-a")
	msg := lease.OutboxMessage{Exchange: exchange, RoutingKey: queue, ContentType: "text/plain", Body: []byte("unroutable for now")}
	p, err := e.publisher().Publish(ctx, e.committer(rec), "a-1", msg)
	if err != nil {
		t.Fatal(err)
	}
	opts := relayOptions(t)
	opts.Mandatory = true
	relay := e.startRelay(opts)
	limit := time.Now().Add(arrive)
	for relay.Stats().Failed < 2 {
		if time.Now().After(limit) {
			t.Fatalf("relay stats %+v: no returned publication", relay.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.pending(); len(got) != 1 || got[0].MessageID != p.MessageID {
		t.Fatalf("a returned publication left the outbox: %+v", got)
	}
	cons := newConsumer(t, e.url, queue)
	declareQueue(t, e.url, queue, exchange, queue)
	d := cons.next(arrive)
	wantFence(t, d, rec, p, msg)
	e.waitOutboxEmpty()
	cons.none(quiet)
}

// (f) The broker goes down while entries are pending: they stay in the
// outbox while the relay retries, and are delivered, in order, once a
// broker is back. The testenv harness cannot restart a broker on the same
// port, so the relay's one URL points at a TCP forwarder, which is
// switched to a second broker (empty, so the queue is declared again).
func TestRelaySurvivesBrokerOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first := testenv.StartRabbitMQ(t)
	fw := startForwarder(t, first.Addr())
	e := boltBackend().env(t, nil)
	e.url = fw.URL()
	queue := "q.outage." + randomHex(3)
	declareQueue(t, first.URL(), queue, "", "")
	cons := newConsumer(t, first.URL(), queue)
	relay := e.startRelay(relayOptions(t))

	rec := e.acquire("instance-a")
	c := e.committer(rec)
	pub := e.publisher()
	msg := func(body string) lease.OutboxMessage {
		return lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte(body)}
	}
	if _, err := pub.Publish(ctx, c, "r-1", msg("result 1")); err != nil {
		t.Fatal(err)
	}
	if d := cons.next(arrive); string(d.Body) != "result 1" {
		t.Fatalf("received %q", d.Body)
	}
	e.waitOutboxEmpty()

	first.Stop() // the broker is down, the relay's connection with it
	var ids []string
	for i := 2; i <= 4; i++ {
		p, err := pub.Publish(ctx, c, fmt.Sprintf("r-%d", i), msg(fmt.Sprintf("result %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.MessageID)
	}
	connects := relay.Stats().Connects
	time.Sleep(2 * time.Second) // the relay retries meanwhile
	if got := e.pending(); len(got) != 3 {
		t.Fatalf("while the broker is down the outbox holds %d entries, want 3", len(got))
	}
	if s := relay.Stats(); s.Connects != connects || s.Removed != 1 {
		t.Fatalf("relay stats while the broker is down: %+v", s)
	}

	second := testenv.StartRabbitMQ(t)
	declareQueue(t, second.URL(), queue, "", "")
	cons2 := newConsumer(t, second.URL(), queue)
	fw.setUpstream(second.Addr())
	for i, id := range ids {
		d := cons2.next(arrive)
		if d.MessageId != id || string(d.Body) != fmt.Sprintf("result %d", i+2) {
			t.Fatalf("delivery %d: %q (%s), want %s", i, d.Body, d.MessageId, id)
		}
		d.Ack(false)
	}
	e.waitOutboxEmpty()
	cons2.none(quiet)
	if s := relay.Stats(); s.Connects < connects+1 || s.Removed != 4 {
		t.Fatalf("relay stats after the broker is back: %+v", s)
	}
}

// The relay refuses a second concurrent Run and a bad URL, and never
// echoes the URL's password.
func TestRelayConfig(t *testing.T) {
	if _, err := rabbitmq.NewRelay(nil, "amqp://guest:guest@127.0.0.1:1/", rabbitmq.RelayOptions{}); err == nil {
		t.Fatal("nil outbox accepted")
	}
	e := boltBackend().env(t, nil)
	if _, err := rabbitmq.NewRelay(e.outbox, "http://user:s3cret@host/", rabbitmq.RelayOptions{}); err == nil ||
		bytes.Contains([]byte(err.Error()), []byte("s3cret")) {
		t.Fatalf("bad URL: %v", err)
	}
	// A broker that is not there: Run keeps retrying until its context ends.
	r, err := rabbitmq.NewRelay(e.outbox, "amqp://guest:s3cret@127.0.0.1:1/", rabbitmq.RelayOptions{
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(50 * time.Millisecond)
	if err := r.Run(ctx); err == nil || err == context.DeadlineExceeded {
		t.Fatalf("second Run: %v", err)
	}
	if err := <-done; err != context.DeadlineExceeded {
		t.Fatalf("Run returned %v", err)
	}
	if s := r.Stats(); s.Connects != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A Publish whose envelope is malformed is invalid before any backend call;
// outcome_unknown is retried with the same commit id.
func TestPublishRetriesWithTheSameCommitID(t *testing.T) {
	e := boltBackend().env(t, nil)
	rec := e.acquire("instance-a")
	f := &flaky{Authorizer: e.store, n: 2}
	pub := rabbitmq.NewPublisher(f, rabbitmq.WithClock(e.now), rabbitmq.WithBackoff(time.Millisecond))
	msg := lease.OutboxMessage{RoutingKey: "q", Body: []byte("x")}
	p, err := pub.Publish(context.Background(), e.committer(rec), "c-1", msg)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(f.ids) != "[c-1 c-1 c-1]" || !p.Replayed {
		t.Fatalf("commit ids sent %v, publication %+v", f.ids, p)
	}
	for _, r := range f.reqs {
		if r.Outbox == nil || string(r.Outbox.Body) != "x" || r.Caller.PrincipalID != actor.PrincipalID {
			t.Fatalf("request %+v", r)
		}
	}
	if got := e.pending(); len(got) != 1 || got[0].MessageID != p.MessageID {
		t.Fatalf("outbox %+v", got)
	}
	// Never resolved: outcome_unknown after the bounded attempts.
	g := &flaky{Authorizer: e.store, n: 100}
	pub = rabbitmq.NewPublisher(g, rabbitmq.WithClock(e.now), rabbitmq.WithBackoff(time.Millisecond), rabbitmq.WithAttempts(3))
	if _, err := pub.Publish(context.Background(), e.committer(rec), "c-2", msg); lease.CodeOf(err) != lease.CodeOutcomeUnknown || len(g.ids) != 3 {
		t.Fatalf("unresolved: %v after %d attempts", err, len(g.ids))
	}
	// A malformed envelope never reaches the backend.
	h := &flaky{Authorizer: e.store}
	bad := fence.NewCommitter(h, fence.Envelope{}, actor)
	if _, err := rabbitmq.NewPublisher(h).Publish(context.Background(), bad, "c-3", msg); lease.CodeOf(err) != lease.CodeInvalidRequest || len(h.ids) != 0 {
		t.Fatalf("malformed envelope: %v, %d calls", err, len(h.ids))
	}
}

// flaky forwards to the store, then (for the first n calls) drops the answer
// and reports outcome_unknown, as a timeout after submission would.
type flaky struct {
	fence.Authorizer
	mu   sync.Mutex
	n    int
	ids  []string
	reqs []lease.CommitRequest
}

func (f *flaky) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	res, err := f.Authorizer.AuthorizeCommit(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids = append(f.ids, req.CommitID)
	f.reqs = append(f.reqs, req)
	if len(f.ids) <= f.n {
		return lease.CommitResult{}, &lease.Error{Code: lease.CodeOutcomeUnknown, Reason: "timeout after submission"}
	}
	return res, err
}
