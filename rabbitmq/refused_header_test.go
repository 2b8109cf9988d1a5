package rabbitmq_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// CC and BCC are routing headers the broker interprets (sender-selected
// distribution): a publication naming them could reach queues its exchange
// and routing key do not, and a value that is not an array makes the broker
// close the channel. They are refused at commit; an entry the broker still
// refuses that way is dead-lettered.
func TestRoutingHeaders(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	t.Run("refused_at_commit", func(t *testing.T) { routingHeadersAreRefusedAtCommit(t, broker) })
	t.Run("precondition_failed_is_dead_lettered", func(t *testing.T) { preconditionFailedEntryIsDeadLettered(t, broker) })
}

// A commit naming CC or BCC, in any case, is refused and changes nothing.
func routingHeadersAreRefusedAtCommit(t *testing.T, broker *testenv.RabbitMQ) {
	e := boltBackend().env(t, broker)
	c := e.committer(e.acquire("cc"))
	for _, name := range []string{"CC", "cc", "BCC", "Bcc"} {
		_, err := e.publisher().Publish(context.Background(), c, "c-"+name, lease.OutboxMessage{RoutingKey: "q",
			Body: []byte("x"), Headers: map[string]string{name: "other-queue"}})
		if lease.CodeOf(err) != lease.CodeInvalidRequest || lease.AsError(err).Field != "outbox.headers" {
			t.Fatalf("header %s: %v, want invalid_lease_request on outbox.headers", name, err)
		}
	}
	if n := len(e.pending()); n != 0 {
		t.Fatalf("%d entries pending after refused commits", n)
	}
}

// An entry the broker refuses with 406 PRECONDITION_FAILED when published
// (here a CC header that is not an array, as an outbox written before such
// headers were refused could hold) is dead-lettered, so it cannot hold back
// the publications accepted after it.
func preconditionFailedEntryIsDeadLettered(t *testing.T, broker *testenv.RabbitMQ) {
	queue := "q.precondition." + randomHex(3)
	declareQueue(t, broker.URL(), queue, "", "")
	cons := newConsumer(t, broker.URL(), queue)
	at := lease.At(time.Now())
	entry := func(id, body string, headers map[string]string) lease.OutboxEntry {
		return lease.OutboxEntry{MessageID: id, LockKey: lease.KeyPrefix + strings.Repeat("A", 43), LeaseID: "lease_1",
			FencingToken: 1, ExecutionID: "exec-1", Sink: rabbitmq.DefaultSink, CommitID: id, AcceptedAt: at,
			Message: lease.OutboxMessage{RoutingKey: queue, Body: []byte(body), Headers: headers}}
	}
	out := &memOutbox{pending: []lease.OutboxEntry{
		entry("msg_poison", "poison", map[string]string{"CC": "not-an-array"}),
		entry("msg_after", "after", nil),
	}}
	r, err := rabbitmq.NewRelay(out, broker.URL(), relayOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	if d := cons.next(15 * time.Second); string(d.Body) != "after" || d.MessageId != "msg_after" {
		t.Fatalf("delivered %q (%s), want the entry after the refused one", d.Body, d.MessageId)
	}
	for limit := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		dead, pending := out.snapshot()
		if len(dead) == 1 && len(pending) == 0 {
			if dead[0].Entry.MessageID != "msg_poison" || !strings.Contains(dead[0].Reason, "406") {
				t.Fatalf("dead letter %s with reason %q", dead[0].Entry.MessageID, dead[0].Reason)
			}
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("dead letters %v, pending %d", dead, len(pending))
		}
	}
}

// memOutbox is an outbox with dead letters in memory: entries no backend
// would accept any more can be put in it.
type memOutbox struct {
	mu      sync.Mutex
	pending []lease.OutboxEntry
	dead    []lease.DeadLetter
}

func (o *memOutbox) OutboxPending(_ context.Context, limit int) ([]lease.OutboxEntry, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]lease.OutboxEntry(nil), o.pending[:min(limit, len(o.pending))]...), nil
}

func (o *memOutbox) OutboxDone(_ context.Context, id string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.remove(id)
	return nil
}

func (o *memOutbox) OutboxDeadLetter(_ context.Context, id, reason string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e, ok := o.remove(id); ok {
		o.dead = append(o.dead, lease.DeadLetter{Entry: e, Reason: reason})
	}
	return nil
}

func (o *memOutbox) OutboxDeadLetters(_ context.Context, limit int) ([]lease.DeadLetter, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]lease.DeadLetter(nil), o.dead[:min(limit, len(o.dead))]...), nil
}

func (o *memOutbox) OutboxDeadLen(context.Context) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return int64(len(o.dead)), nil
}

func (o *memOutbox) remove(id string) (lease.OutboxEntry, bool) {
	for i, e := range o.pending {
		if e.MessageID == id {
			o.pending = append(o.pending[:i], o.pending[i+1:]...)
			return e, true
		}
	}
	return lease.OutboxEntry{}, false
}

func (o *memOutbox) snapshot() ([]lease.DeadLetter, []lease.OutboxEntry) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]lease.DeadLetter(nil), o.dead...), append([]lease.OutboxEntry(nil), o.pending...)
}
