package rabbitmq_test

import (
	"context"
	"log"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// A leased actor publishes its result through the fenced outbox; a relay
// moves the outbox to RabbitMQ; a consumer drops duplicates and older
// holders' results. (Compiled, not run: it needs a broker.)
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	store, err := bolt.Open("/var/lib/starlease/lease.db", bolt.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	const broker = "amqp://guest:guest@127.0.0.1:5672/"

	// One relay per outbox, running beside the store.
	relay, err := rabbitmq.NewRelay(store, broker, rabbitmq.RelayOptions{})
	if err != nil {
		log.Fatal(err)
	}
	go relay.Run(ctx)

	spec := executor.Spec{
		Identity: lease.Identity{TenantID: "acme", ProgramID: "recon", TargetNamespace: "web",
			TargetID: "example.com", ActorName: "portscan"},
		ServiceInstanceID: "instance-1", ExecutionID: "exec-42", JobID: "job-7",
		Caller: lease.Caller{PrincipalID: "prn-portscan"},
		TTL:    30 * time.Second,
	}
	err = executor.Run(ctx, store, spec, func(ctx context.Context, l *executor.Lease) error {
		pub := rabbitmq.NewPublisher(store, rabbitmq.WithCaller(spec.Caller))
		// Accepted into the outbox only if the lease is still held, in the
		// same atomic step; lease_lost otherwise. Retry with the same id.
		_, err := pub.Publish(ctx, l.Committer(), "exec-42-result", lease.OutboxMessage{
			Exchange: "starintel.results", RoutingKey: "portscan.result",
			ContentType: "application/json", Body: []byte(`{"open_ports":[22,443]}`)})
		relay.Wake()
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// The consumer side: defence in depth, not the authority.
	conn, err := amqp.Dial(broker)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("portscan-results", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	dedupe := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	for d := range deliveries {
		dec, err := dedupe.Handle(d, func(f rabbitmq.Fence, d amqp.Delivery) error {
			log.Printf("result of %s under token %d: %s", f.ExecutionID, f.FencingToken, d.Body)
			return nil
		})
		if dec.Dropped() {
			log.Printf("dropped %s: %s", d.MessageId, dec.Reason)
		}
		if err != nil {
			log.Print(err)
		}
	}
}
