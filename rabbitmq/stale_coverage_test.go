package rabbitmq_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// TestStaleHolderAtTheRabbitOutbox is the stale-holder property of issue
// 11 §7 at the Rabbit outbox (enforcement point 3), on bolt and on Valkey
// (a durable redis-server) with a real broker: a holder publishes one
// message, then its lease ends (revoke, force-release, release, expiry,
// supersession), and it tries every write path it still has — a new commit
// id, its commit id replayed for another body, routing key or content type,
// its commit id replayed as a plain (non-publication) commit for a
// document, a new commit id on another sink. Every attempt is refused with
// the code the contract gives it; the exact replay of the publication is
// answered from its evidence and appends nothing. The outbox then holds
// only the publication made while the lease was live (and a successor's),
// and the broker delivers exactly those, with their fences.
func TestStaleHolderAtTheRabbitOutbox(t *testing.T) {
	broker := testenv.StartRabbitMQ(t)
	redis := testenv.StartRedis(t)
	for _, b := range []backend{boltBackend(), valkeyBackend(redis)} {
		t.Run(b.name, func(t *testing.T) {
			for _, end := range []string{"revoke", "force_release", "release", "expiry", "supersession"} {
				t.Run(end, func(t *testing.T) {
					e := b.env(t, broker)
					staleHolderAtOutbox(t, e, fmt.Sprintf("q.stale.%s.%s.%s", b.name, end, randomHex(3)), end)
				})
			}
		})
	}
}

func staleHolderAtOutbox(t *testing.T, e *env, queue, end string) {
	ctx := context.Background()
	declareQueue(t, e.url, queue, "", "")
	msg := func(body string) lease.OutboxMessage {
		return lease.OutboxMessage{RoutingKey: queue, ContentType: "text/plain", Body: []byte(body)}
	}
	holder := e.acquire("instance-a")
	ca := e.committer(holder)
	pub := e.publisher(rabbitmq.WithAttempts(1))
	before, err := pub.Publish(ctx, ca, "a-1", msg("a: before"))
	if err != nil || before.Replayed {
		t.Fatalf("the holder's publication: %+v %v", before, err)
	}

	var successor *lease.Record
	var succPub rabbitmq.Publication
	switch end {
	case "revoke", "force_release":
		req := lease.AdminRequest{Identity: e.id, LeaseID: holder.LeaseID, FencingToken: holder.FencingToken,
			Reason: "stale-holder property", Mutation: lease.Mutation{RequestID: "req-admin-" + randomHex(4), DeadlineAt: e.far(), Caller: admin}}
		if end == "revoke" {
			_, err = e.store.Revoke(ctx, req)
		} else {
			_, err = e.store.ForceRelease(ctx, req)
		}
	case "release":
		_, err = e.store.Release(ctx, lease.ReleaseRequest{Identity: e.id, LeaseID: holder.LeaseID, FencingToken: holder.FencingToken,
			ServiceInstanceID: holder.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "req-rel-" + randomHex(4), DeadlineAt: e.far(), Caller: actor}})
	case "expiry", "supersession":
		e.expire(holder)
	}
	if err != nil {
		t.Fatalf("%s: %v", end, err)
	}
	if end == "supersession" {
		successor = e.acquire("instance-b")
		if successor.FencingToken <= holder.FencingToken {
			t.Fatalf("successor token %d not above %d", successor.FencingToken, holder.FencingToken)
		}
		if succPub, err = e.publisher().Publish(ctx, e.committer(successor), "b-1", msg("b: successor")); err != nil {
			t.Fatalf("the successor's publication: %v", err)
		}
	}

	lostOrRejected := []lease.Code{lease.CodeLost, lease.CodeCommitRejected}
	conflict := []lease.Code{lease.CodeIdempotencyConflict}
	want := func(what string, err error, codes []lease.Code) {
		t.Helper()
		if !slices.Contains(codes, lease.CodeOf(err)) {
			t.Errorf("%s after %s: %v, want one of %v", what, end, err, codes)
		}
	}
	_, err = pub.Publish(ctx, ca, "a-new", msg("a: after the end"))
	want("a new commit id", err, lostOrRejected)
	_, err = e.publisher(rabbitmq.WithAttempts(1), rabbitmq.WithSink("rabbitmq-other")).Publish(ctx, ca, "a-1", msg("a: before"))
	want("its commit id on another sink", err, lostOrRejected)
	_, err = pub.Publish(ctx, ca, "a-1", msg("a: before, changed"))
	want("its commit id, another body", err, conflict)
	other := msg("a: before")
	other.RoutingKey = queue + ".other"
	_, err = pub.Publish(ctx, ca, "a-1", other)
	want("its commit id, another routing key", err, conflict)
	other = msg("a: before")
	other.ContentType = "application/json"
	_, err = pub.Publish(ctx, ca, "a-1", other)
	want("its commit id, another content type", err, conflict)
	// The publication's commit id replayed as a plain commit of a document
	// (no outbox): the authorization was for the message, not for this.
	req := ca.Envelope().CommitRequest(rabbitmq.DefaultSink, "a-1", fence.Binding{Target: "doc-x",
		PayloadSHA256: lease.PayloadSHA256([]byte("a: before"))}, e.far(), actor)
	_, err = e.store.AuthorizeCommit(ctx, req)
	want("its commit id as a plain commit of a document", err, conflict)
	// The exact publication replays from its evidence and adds nothing.
	again, err := pub.Publish(ctx, ca, "a-1", msg("a: before"))
	if err != nil || !again.Replayed || again.MessageID != before.MessageID || again.Guard != before.Guard {
		t.Errorf("the exact replay after %s: %+v %v, want the original publication replayed", end, again, err)
	}

	// Read back: the outbox holds the holder's one publication (and the
	// successor's), nothing else.
	wantIDs := []string{before.MessageID}
	if successor != nil {
		wantIDs = append(wantIDs, succPub.MessageID)
	}
	var pending []string
	for _, en := range e.pending() {
		pending = append(pending, en.MessageID)
		if en.MessageID == before.MessageID && (string(en.Message.Body) != "a: before" || en.LeaseID != holder.LeaseID ||
			en.FencingToken != holder.FencingToken) {
			t.Errorf("the holder's entry changed: %+v", en)
		}
	}
	slices.Sort(pending)
	sortedWant := slices.Sorted(slices.Values(wantIDs))
	if !slices.Equal(pending, sortedWant) {
		t.Fatalf("after %s the outbox holds %v, want %v", end, pending, sortedWant)
	}

	// And the broker delivers exactly those.
	cons := newConsumer(t, e.url, queue)
	e.startRelay(relayOptions(t))
	got := map[string]string{}
	for range wantIDs {
		d := cons.next(arrive)
		got[d.MessageId] = string(d.Body)
		f, err := rabbitmq.FenceOf(d)
		switch {
		case err != nil:
			t.Errorf("delivery %q without a fence: %v", d.Body, err)
		case d.MessageId == before.MessageID && (f.LeaseID != holder.LeaseID || f.FencingToken != holder.FencingToken):
			t.Errorf("the holder's delivery carries fence %+v", f)
		case successor != nil && d.MessageId == succPub.MessageID && (f.LeaseID != successor.LeaseID || f.FencingToken != successor.FencingToken):
			t.Errorf("the successor's delivery carries fence %+v", f)
		}
		d.Ack(false)
	}
	cons.none(quiet)
	e.waitOutboxEmpty()
	if got[before.MessageID] != "a: before" || (successor != nil && got[succPub.MessageID] != "b: successor") || len(got) != len(wantIDs) {
		t.Errorf("delivered %v", got)
	}
}
