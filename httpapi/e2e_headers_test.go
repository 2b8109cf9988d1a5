package httpapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// TestE2EPublicationHeaders runs "starlease serve --rabbitmq-url-file" on
// bolt against a real broker. Publications with application headers, made
// over HTTP (the Go client's Publisher and the raw outbox object), are
// delivered with exactly those headers plus the fence headers; one without
// headers carries the fence alone. A publication naming a fence header
// (x-starintel-fencing-token, in any case) is refused with a 400 envelope
// naming outbox.headers, and nothing of it is ever delivered.
func TestE2EPublicationHeaders(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	broker := testenv.StartRabbitMQ(t)
	const queue = "headers-e2e"
	broker.DeclareQueues(t, queue)
	rows := newRowRecorder()
	s := startServer(t, bin, rows, "--rabbitmq-url-file", writeURLFile(t, broker.URL()), "--relay-poll-interval", "50ms",
		"--relay-mandatory")
	k := s.createKey("prn-headers", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var (
		mu      sync.Mutex
		headers = map[string]amqp.Table{}
	)
	got := testenv.NewDeliveries(func(m amqp.Delivery) bool {
		mu.Lock()
		headers[m.MessageId] = m.Headers
		mu.Unlock()
		return m.DeliveryMode == amqp.Persistent
	})
	got.Consume(t, broker.URL(), queue)

	// want is what one delivery must carry: its headers and the fence of
	// its accepted commit, nothing else.
	type want struct {
		messageID, lockKey, leaseID, executionID, traceID, commitID string
		token                                                       uint64
		acceptedAt                                                  string
		headers                                                     map[string]string
	}
	var wants []want

	// 1. The Go client's Publisher, over HTTP.
	store := client.NewLeaseStore(s.client(k), k.Principal)
	id := identity(uniqueID("hdr"), "usernamegen")
	acq, err := store.Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: "inst-hdr", TTL: time.Minute,
		ExecutionID: "exec-hdr", JobID: "job-hdr", TraceID: "trace-hdr",
		Mutation: lease.Mutation{RequestID: uniqueID("req"), DeadlineAt: time.Now().Add(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	env := fence.EnvelopeOf(acq.Lease)
	committer := fence.NewCommitter(store, env, lease.Caller{PrincipalID: k.Principal})
	pub := rabbitmq.NewPublisher(store)
	appHeaders := map[string]string{"x-schema": "port-scan/v2", "Tenant-Hint": "a\tb \"é\" <&>", "empty": ""}
	p1, err := pub.Publish(ctx, committer, "with-headers", lease.OutboxMessage{RoutingKey: queue, ContentType: "application/json",
		Body: []byte(`{"open_ports":[22]}`), Headers: appHeaders})
	if err != nil {
		t.Fatalf("publication with headers: %v", err)
	}
	wants = append(wants, want{p1.MessageID, acq.Lease.LockKey, acq.Lease.LeaseID, "exec-hdr", "trace-hdr", "with-headers",
		acq.Lease.FencingToken, p1.Guard.AcceptedAt.String(), appHeaders})
	p2, err := pub.Publish(ctx, committer, "without-headers", lease.OutboxMessage{RoutingKey: queue, Body: []byte("plain")})
	if err != nil {
		t.Fatalf("publication without headers: %v", err)
	}
	wants = append(wants, want{p2.MessageID, acq.Lease.LockKey, acq.Lease.LeaseID, "exec-hdr", "trace-hdr", "without-headers",
		acq.Lease.FencingToken, p2.Guard.AcceptedAt.String(), nil})
	// The Publisher refuses a fence header before sending anything.
	if _, err := pub.Publish(ctx, committer, "forged-local", lease.OutboxMessage{RoutingKey: queue, Body: []byte("x"),
		Headers: map[string]string{rabbitmq.HeaderFencingToken: "999"}}); lease.CodeOf(err) != lease.CodeInvalidRequest {
		t.Fatalf("publication with a fence header through the Publisher: %v", err)
	}

	// 2. The raw outbox object.
	raw := identity(uniqueID("hdr-raw"), "usernamegen")
	a := post(t, s, k, "/acquire", acquireBody(raw, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	_, rawKey, err := lease.CanonicalLockKey(raw, lease.DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	rawHeaders := map[string]string{"x-job-kind": "whois", "X-Trace-Parent": "00-abc-01"}
	commit := map[string]any{"lock_identity": raw, "lease_id": l["lease_id"], "fencing_token": l["fencing_token"],
		"service_instance_id": "inst-raw", "sink": "rabbitmq", "commit_id": "raw-headers", "execution_id": "exec-raw", "job_id": "job-raw",
		"outbox": map[string]any{"routing_key": queue, "content_type": "text/plain",
			"body": base64.StdEncoding.EncodeToString([]byte("raw")), "headers": rawHeaders}}
	c1 := post(t, s, k, "/commits/authorize", commit)
	wantStatus(t, c1, 200, "lease_inspected")
	var answer struct {
		Commit struct {
			LockKey    string `json:"lock_key"`
			Target     string `json:"target"`
			AcceptedAt string `json:"accepted_at"`
		} `json:"commit"`
	}
	if err := json.Unmarshal(c1.Body, &answer); err != nil || answer.Commit.LockKey != rawKey {
		t.Fatalf("raw commit answer: lock_key %q, want %q (%v): %s", answer.Commit.LockKey, rawKey, err, c1.Body)
	}
	wants = append(wants, want{answer.Commit.Target, rawKey, l["lease_id"].(string), "exec-raw", "", "raw-headers",
		num(l["fencing_token"]), answer.Commit.AcceptedAt, rawHeaders})

	// A fence header, in either case, is refused: 400 invalid_lease_request
	// naming outbox.headers, and nothing is appended.
	for i, name := range []string{"x-starintel-fencing-token", "X-StarIntel-Fencing-Token"} {
		forged := with(commit, "commit_id", "forged-"+string(rune('a'+i)), "outbox",
			with(commit["outbox"].(map[string]any), "headers", map[string]any{name: "999999", "x-job-kind": "whois"}))
		r := post(t, s, k, "/commits/authorize", forged)
		var e struct {
			Status        string `json:"status"`
			Code          string `json:"code"`
			Msg           string `json:"msg"`
			Field         string `json:"field"`
			CorrelationID string `json:"correlation_id"`
			Retryable     *bool  `json:"retryable"`
		}
		dec := json.NewDecoder(bytes.NewReader(r.Body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || r.Status != 400 || e.Status != "error" || e.Code != "invalid_lease_request" ||
			e.Field != "outbox.headers" || e.Retryable == nil || *e.Retryable || e.CorrelationID == "" || e.Msg == "" {
			t.Fatalf("publication setting %s: %d %s (%v)", name, r.Status, r.Body, err)
		}
	}

	accepted := []string{}
	for _, w := range wants {
		accepted = append(accepted, w.messageID)
	}
	got.WaitFor(t, accepted, 30*time.Second)
	time.Sleep(500 * time.Millisecond) // a refused publication, had it entered the outbox, would arrive now
	got.Check(t, accepted, nil)

	mu.Lock()
	defer mu.Unlock()
	for _, w := range wants {
		h := headers[w.messageID]
		fenceHeaders := amqp.Table{rabbitmq.HeaderLockKey: w.lockKey, rabbitmq.HeaderLeaseID: w.leaseID,
			rabbitmq.HeaderFencingToken: int64(w.token), rabbitmq.HeaderExecutionID: w.executionID,
			rabbitmq.HeaderAcceptedAt: w.acceptedAt, rabbitmq.HeaderSink: rabbitmq.DefaultSink, rabbitmq.HeaderCommitID: w.commitID}
		if w.traceID != "" {
			fenceHeaders[rabbitmq.HeaderTraceID] = w.traceID
		}
		wantTable := amqp.Table{}
		for name, v := range w.headers {
			wantTable[name] = v
		}
		maps.Copy(wantTable, fenceHeaders)
		if len(h) != len(wantTable) {
			t.Errorf("%s: delivered headers %v, want exactly %v", w.commitID, slices.Sorted(maps.Keys(h)), slices.Sorted(maps.Keys(wantTable)))
		}
		for name, v := range wantTable {
			if h[name] != v {
				t.Errorf("%s: header %s = %#v, want %#v", w.commitID, name, h[name], v)
			}
		}
		if f, err := rabbitmq.FenceOf(amqp.Delivery{MessageId: w.messageID, Headers: h}); err != nil || f.FencingToken != w.token {
			t.Errorf("%s: fence %+v, %v", w.commitID, f, err)
		}
	}
}
