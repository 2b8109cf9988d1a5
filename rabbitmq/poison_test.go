package rabbitmq_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// TestPoisonEntriesAreDeadLettered: a publication the broker refuses for a
// reason retrying will not cure must not stall the outbox. Any caller
// holding any lease may name any exchange; before this, a publication to a
// missing exchange (the broker closes the channel, 404) stayed at the head
// of the outbox and every later batch, other tenants' included, failed
// behind it. Guaranteed, on both backends: such an entry (404 on publish;
// nacked, or with Mandatory returned, PoisonAttempts times in a row) is
// moved to the outbox's dead letters with its reason, counted, never
// deleted, and the later publications are delivered in order.
func TestPoisonEntriesAreDeadLettered(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	redis := testenv.StartRedis(t)
	for _, b := range []backend{boltBackend(), valkeyBackend(redis)} {
		t.Run(b.name, func(t *testing.T) {
			t.Run("missing_exchange", func(t *testing.T) { missingExchangeIsDeadLettered(t, b.env(t, broker)) })
			t.Run("nacked", func(t *testing.T) { nackedIsDeadLettered(t, b.env(t, broker)) })
			t.Run("mandatory_returned", func(t *testing.T) { returnedIsDeadLettered(t, b.env(t, broker)) })
		})
	}
}

// deliveredInOrder reads want's bodies from cons, in this order, within
// 15 s.
func deliveredInOrder(t *testing.T, e *env, cons *consumer, want ...string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var got []string
	for len(got) < len(want) && time.Now().Before(deadline) {
		select {
		case d := <-cons.deliveries:
			_ = d.Ack(false)
			got = append(got, string(d.Body))
		case <-time.After(200 * time.Millisecond):
		}
	}
	if len(got) < len(want) {
		t.Fatalf("a poison publication blocks the outbox: %d of %d later publications delivered in 15s, %d entries pending",
			len(got), len(want), len(e.pending()))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// wantDeadLetter checks that the outbox holds exactly one dead letter, the
// entry messageID, with a reason containing reason, and nothing pending.
func wantDeadLetter(t *testing.T, e *env, messageID, reason string) {
	t.Helper()
	e.waitOutboxEmpty()
	dl, ok := e.outbox.(lease.OutboxDeadLetters)
	if !ok {
		t.Fatalf("%T keeps no dead letters", e.outbox)
	}
	ctx := context.Background()
	if n, err := dl.OutboxDeadLen(ctx); err != nil || n != 1 {
		t.Fatalf("dead letters: %d %v, want 1", n, err)
	}
	got, err := dl.OutboxDeadLetters(ctx, 0)
	if err != nil || len(got) != 1 {
		t.Fatalf("dead letters %+v %v", got, err)
	}
	if got[0].Entry.MessageID != messageID || !strings.Contains(got[0].Reason, reason) || got[0].DeadAt.IsZero() {
		t.Fatalf("dead letter %s (%q at %v), want %s with %q", got[0].Entry.MessageID, got[0].Reason, got[0].DeadAt, messageID, reason)
	}
	// Dead-lettering is idempotent, and a dead letter is not pending again.
	if err := dl.OutboxDeadLetter(ctx, messageID, "again"); err != nil {
		t.Fatal(err)
	}
	if n, _ := dl.OutboxDeadLen(ctx); n != 1 || len(e.pending()) != 0 {
		t.Fatalf("after a second dead-lettering: %d dead letters, %d pending", n, len(e.pending()))
	}
}

// missingExchangeIsDeadLettered: the poison is the head of the outbox and
// the later publications (another tenant's among them) follow in the same
// batch; the broker's channel close names no publish, so the relay
// publishes the unconfirmed entries one at a time and dead-letters the one
// whose lone publish is refused with 404.
func missingExchangeIsDeadLettered(t *testing.T, e *env) {
	queue := "q.poison." + randomHex(3)
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	ctx := context.Background()

	rec := e.acquire("attacker")
	pub := e.publisher()
	c := e.committer(rec)
	poison, err := pub.Publish(ctx, c, "poison", lease.OutboxMessage{Exchange: "no-such-exchange-" + randomHex(3), RoutingKey: "x", Body: []byte("poison")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := pub.Publish(ctx, c, fmt.Sprintf("good-%d", i), lease.OutboxMessage{RoutingKey: queue, Body: []byte(fmt.Sprintf("good-%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	e.id.TenantID = "tenant-other"
	other := e.acquire("other")
	if _, err := pub.Publish(ctx, e.committer(other), "other-0", lease.OutboxMessage{RoutingKey: queue, Body: []byte("other-0")}); err != nil {
		t.Fatal(err)
	}
	relay := e.startRelay(relayOptions(t))
	deliveredInOrder(t, e, cons, "good-0", "good-1", "other-0")
	wantDeadLetter(t, e, poison.MessageID, "404")
	if st := relay.Stats(); st.DeadLettered != 1 || st.Removed != 3 {
		t.Fatalf("relay stats %+v, want 1 dead-lettered, 3 removed", st)
	}
}

// nackedIsDeadLettered: a queue at its length limit with reject-publish
// nacks every publication to it; after PoisonAttempts nacks in a row the
// entry is dead-lettered and the next one delivered.
func nackedIsDeadLettered(t *testing.T, e *env) {
	full := "q.full." + randomHex(3)
	ch, err := dialAMQP(t, e.url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	inject(t, e.url, full, amqp.Publishing{Body: []byte("filler")})
	queue := "q.after-nack." + randomHex(3)
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	ctx := context.Background()
	rec := e.acquire("writer")
	pub := e.publisher()
	c := e.committer(rec)
	nacked, err := pub.Publish(ctx, c, "to-full", lease.OutboxMessage{RoutingKey: full, Body: []byte("nacked")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, c, "after", lease.OutboxMessage{RoutingKey: queue, Body: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	opts := relayOptions(t)
	opts.PoisonAttempts = 3
	relay := e.startRelay(opts)
	deliveredInOrder(t, e, cons, "after")
	wantDeadLetter(t, e, nacked.MessageID, "nacked by the broker 3 times")
	if st := relay.Stats(); st.DeadLettered != 1 || st.Failed < 3 {
		t.Fatalf("relay stats %+v, want 1 dead-lettered after 3 nacks", st)
	}
}

// returnedIsDeadLettered: with Mandatory, an unroutable publication is
// retried PoisonAttempts times (a queue may be bound meanwhile: see
// mandatoryUnroutableStaysPending), then dead-lettered.
func returnedIsDeadLettered(t *testing.T, e *env) {
	queue := "q.after-return." + randomHex(3)
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	ctx := context.Background()
	rec := e.acquire("writer")
	pub := e.publisher()
	c := e.committer(rec)
	unroutable, err := pub.Publish(ctx, c, "unroutable", lease.OutboxMessage{RoutingKey: "q.nobody." + randomHex(3), Body: []byte("unroutable")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, c, "after", lease.OutboxMessage{RoutingKey: queue, Body: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	opts := relayOptions(t)
	opts.Mandatory = true
	opts.PoisonAttempts = 3
	relay := e.startRelay(opts)
	deliveredInOrder(t, e, cons, "after")
	wantDeadLetter(t, e, unroutable.MessageID, "returned by the broker as unroutable")
	if st := relay.Stats(); st.DeadLettered != 1 {
		t.Fatalf("relay stats %+v, want 1 dead-lettered", st)
	}
}

// TestPoisonBurstKeepsTheLeastBackoff: one caller's run of publications
// the broker refuses (missing exchanges) must not make every later
// publication, other tenants' too, wait ever longer. Each refused entry
// costs the relay one failed round; a round that dead-letters an entry
// made progress, so the next backoff starts again from MinBackoff instead
// of doubling towards MaxBackoff (12 such entries cost a victim 57 s with
// the defaults before). The backoffs Run waits are recorded, not timed.
func TestPoisonBurstKeepsTheLeastBackoff(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	e := boltBackend().env(t, broker)
	queue := "q.burst." + randomHex(3)
	declareQueue(t, e.url, queue, "", "")
	cons := newConsumer(t, e.url, queue)
	ctx := context.Background()
	rec := e.acquire("attacker")
	pub := e.publisher()
	const poison = 6
	for i := 0; i < poison; i++ {
		if _, err := pub.Publish(ctx, e.committer(rec), fmt.Sprintf("poison-%d", i),
			lease.OutboxMessage{Exchange: "no-such-exchange-" + randomHex(3), RoutingKey: "x", Body: []byte("poison")}); err != nil {
			t.Fatal(err)
		}
	}
	e.id.TenantID = "tenant-victim"
	victim := e.acquire("victim")
	if _, err := pub.Publish(ctx, e.committer(victim), "victim-0", lease.OutboxMessage{RoutingKey: queue, Body: []byte("victim-0")}); err != nil {
		t.Fatal(err)
	}

	opts := relayOptions(t)
	opts.MaxBackoff = 10 * time.Second
	r, err := rabbitmq.NewRelay(e.outbox, e.url, opts)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var waits []time.Duration
	rabbitmq.SetOnBackoff(r, func(d time.Duration) {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
	})
	runRelay(t, r)
	deliveredInOrder(t, e, cons, "victim-0")
	e.waitOutboxEmpty()
	if st := r.Stats(); st.DeadLettered != poison || st.Removed != 1 {
		t.Fatalf("relay stats %+v, want %d dead-lettered, 1 removed", st, poison)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) < poison {
		t.Fatalf("backoffs %v: want one failed round per poison entry at least", waits)
	}
	for i, d := range waits {
		if d > opts.MinBackoff {
			t.Fatalf("backoff %d of %v is %v, above MinBackoff %v: the poison entries before it grew the wait for the victim",
				i, waits, d, opts.MinBackoff)
		}
	}
}
