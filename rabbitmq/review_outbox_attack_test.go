package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// Adopted from a review of the outbox command. End to end with a running
// relay: a publication to a missing exchange is
// dead-lettered; its lease is then revoked; the exchange is declared and
// the operator requeues it. The relay publishes it exactly once, with its
// original message id and fence headers (the revoked lease's id and
// token: consumers' fencing decides), and the outbox ends empty.
func TestRequeuedDeadLetterIsPublishedOnceWithItsFence(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	redis := testenv.StartRedis(t)
	for _, b := range []backend{boltBackend(), valkeyBackend(redis)} {
		t.Run(b.name, func(t *testing.T) {
			e := b.env(t, broker)
			ctx := context.Background()
			exchange, queue := "ex.requeue."+randomHex(3), "q.requeue."+randomHex(3)
			declareQueue(t, e.url, queue, "", "")
			cons := newConsumer(t, e.url, queue)
			rec := e.acquire("worker")
			c := e.committer(rec)
			pub := e.publisher()
			poison, err := pub.Publish(ctx, c, "late", lease.OutboxMessage{Exchange: exchange, RoutingKey: "rk", Body: []byte("late")})
			if err != nil {
				t.Fatal(err)
			}
			e.startRelay(relayOptions(t))
			wantDeadLetter(t, e, poison.MessageID, "404")
			if _, err := e.store.Revoke(ctx, lease.AdminRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
				Reason: "compromised", Mutation: lease.Mutation{RequestID: "req-revoke-" + randomHex(3), DeadlineAt: e.far(),
					Caller: lease.Caller{PrincipalID: "prn-admin"}}}); err != nil {
				t.Fatalf("revoke: %v", err)
			}
			declareQueue(t, e.url, queue, exchange, "rk")
			admin := e.outbox.(lease.OutboxDeadLetterAdmin)
			// Requeued while the relay polls, and again: only the first
			// finds the dead letter.
			ok := 0
			for range 3 {
				if _, err := admin.OutboxRequeueDeadLetter(ctx, poison.MessageID); err == nil {
					ok++
				}
			}
			if ok != 1 {
				t.Fatalf("%d requeues succeeded", ok)
			}
			d := cons.next(15 * time.Second)
			_ = d.Ack(false)
			if d.MessageId != poison.MessageID || string(d.Body) != "late" ||
				fmt.Sprint(d.Headers[rabbitmq.HeaderLeaseID]) != rec.LeaseID ||
				fmt.Sprint(d.Headers[rabbitmq.HeaderFencingToken]) != fmt.Sprint(rec.FencingToken) {
				t.Fatalf("delivered %q %q headers %v", d.MessageId, d.Body, d.Headers)
			}
			cons.none(1500 * time.Millisecond)
			e.waitOutboxEmpty()
			if n, err := admin.OutboxDeadLen(ctx); err != nil || n != 0 {
				t.Fatalf("dead letters %d %v", n, err)
			}
			if u, err := e.outbox.(lease.OutboxMeter).OutboxUsage(ctx); err != nil || u.Pending != 0 || u.Bytes != 0 {
				t.Fatalf("usage %+v %v", u, err)
			}
		})
	}
}
