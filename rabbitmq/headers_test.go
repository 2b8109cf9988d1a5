package rabbitmq_test

import (
	"reflect"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// Every fence header is under the prefix the store reserves, so no
// application header can be named like one.
func TestFenceHeadersAreReserved(t *testing.T) {
	for _, h := range []string{rabbitmq.HeaderLockKey, rabbitmq.HeaderLeaseID, rabbitmq.HeaderFencingToken, rabbitmq.HeaderExecutionID,
		rabbitmq.HeaderTraceID, rabbitmq.HeaderAcceptedAt, rabbitmq.HeaderSink, rabbitmq.HeaderCommitID} {
		if !strings.HasPrefix(h, lease.ReservedHeaderPrefix) {
			t.Errorf("fence header %s is not under %s", h, lease.ReservedHeaderPrefix)
		}
	}
}

// The relay publishes an entry's application headers as strings beside
// the fence headers, and the fence wins over an entry that (bypassing the
// store's checks) names a fence header itself.
func TestPublishingHeaders(t *testing.T) {
	id := lease.Identity{TenantID: "t", ProgramID: "p", TargetNamespace: "ns", TargetID: "x", ActorName: "a"}
	_, key, err := lease.CanonicalLockKey(id, lease.DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	e := lease.OutboxEntry{MessageID: "msg_1", LockKey: key, LeaseID: "lease_01", FencingToken: 42, ExecutionID: "exec-1",
		Sink: "rabbitmq", CommitID: "c-1", AcceptedAt: lease.UnixMilli(1_700_000_000_000),
		Message: lease.OutboxMessage{RoutingKey: "q", Body: []byte("x"), Headers: map[string]string{"x-schema": "v2", "Note": "a\tb"}}}
	fence := amqp.Table{rabbitmq.HeaderLockKey: key, rabbitmq.HeaderLeaseID: "lease_01", rabbitmq.HeaderFencingToken: int64(42),
		rabbitmq.HeaderExecutionID: "exec-1", rabbitmq.HeaderAcceptedAt: "2023-11-14T22:13:20.000Z", rabbitmq.HeaderSink: "rabbitmq",
		rabbitmq.HeaderCommitID: "c-1"}
	want := amqp.Table{"x-schema": "v2", "Note": "a\tb"}
	for k, v := range fence {
		want[k] = v
	}
	if got := rabbitmq.Publishing(e).Headers; !reflect.DeepEqual(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	if err := rabbitmq.Publishing(e).Headers.Validate(); err != nil {
		t.Fatalf("not a valid AMQP table: %v", err)
	}
	// Without headers the table is exactly the fence, as before.
	plain := e
	plain.Message.Headers = nil
	if got := rabbitmq.Publishing(plain).Headers; !reflect.DeepEqual(got, fence) {
		t.Fatalf("header-less entry: %v, want %v", got, fence)
	}
	forged := e
	forged.Message.Headers = map[string]string{rabbitmq.HeaderFencingToken: "999", rabbitmq.HeaderLeaseID: "lease_forged",
		rabbitmq.HeaderTraceID: "trace-forged"}
	got := rabbitmq.Publishing(forged).Headers
	if !reflect.DeepEqual(got, fence) {
		t.Fatalf("forged fence headers survived: %v", got)
	}
	f, err := rabbitmq.FenceOf(amqp.Delivery{MessageId: "msg_1", Headers: got})
	if err != nil || f.FencingToken != 42 || f.LeaseID != "lease_01" || f.TraceID != "" {
		t.Fatalf("fence %+v, %v", f, err)
	}
}
