package httpapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// TestE2EOutboxBoundAndExchanges runs "starlease serve" (bolt) with its
// relay against a real broker, --publish-exchanges "(default), results"
// and --outbox-max-pending 3, and makes every publication over the raw
// wire:
//   - publications to the default exchange and to results are accepted
//     and delivered; one naming documents (which the broker would route
//     to the same queue) is refused 403 access_denied before anything is
//     stored: its envelope says why and names neither the allowed
//     exchanges nor a secret, the outbox does not grow, it is never
//     delivered, and its commit id stays unused (the same id naming an
//     allowed exchange is a first acceptance);
//   - while the broker is down the outbox fills to its bound and the next
//     publication is refused 503 lease_backend_unavailable, retryable, with
//     nothing appended; a commit without a publication still succeeds;
//     /readyz stays 200 with the outbox degraded, /metrics shows it full;
//   - once the broker is back and the relay drained the outbox, the
//     refused publication retried with the same commit id is accepted (not
//     a replay), and every accepted publication is delivered.
func TestE2EOutboxBoundAndExchanges(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	broker := testenv.StartRabbitMQ(t)
	const queue = "bounds-e2e"
	bindExchanges(t, broker, queue, "results", "documents")
	urlFile := writeURLFile(t, broker.URL())
	rows := newRowRecorder()
	s := startServer(t, bin, rows, "--rabbitmq-url-file", urlFile, "--relay-lease-ttl", "3s", "--relay-poll-interval", "50ms",
		"--outbox-max-pending", "3", "--publish-exchanges", "(default), results")
	k := s.createKey("prn-bounds", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	store := client.NewLeaseStore(s.client(k), k.Principal)
	id := identity(uniqueID("bounds"), "usernamegen")
	acq, err := store.Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: "inst-bounds", TTL: 2 * time.Minute,
		ExecutionID: "exec-bounds", JobID: "job-bounds", Mutation: lease.Mutation{RequestID: uniqueID("req"), DeadlineAt: time.Now().Add(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	rec := acq.Lease
	messageID := func(commitID string) string {
		t.Helper()
		m, err := rabbitmq.MessageID(fence.EnvelopeOf(rec), rabbitmq.DefaultSink, commitID)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	commit := func(commitID, exchange, routingKey string) map[string]any {
		return map[string]any{"lock_identity": id, "lease_id": rec.LeaseID, "fencing_token": rec.FencingToken,
			"service_instance_id": "inst-bounds", "sink": rabbitmq.DefaultSink, "commit_id": commitID,
			"execution_id": "exec-bounds", "job_id": "job-bounds",
			"outbox": map[string]any{"exchange": exchange, "routing_key": routingKey, "content_type": "text/plain",
				"body": base64.StdEncoding.EncodeToString([]byte("result of " + commitID))}}
	}
	var accepted []string
	accept := func(body map[string]any) {
		t.Helper()
		r := post(t, s, k, "/commits/authorize", body)
		wantStatus(t, r, 200, "lease_inspected")
		if r.JSON["replayed"] == true {
			t.Fatalf("a first acceptance answered as a replay: %s", r.Body)
		}
		m, _ := r.JSON["commit"].(map[string]any)
		accepted = append(accepted, m["target"].(string))
	}
	metrics := func() map[string]float64 {
		t.Helper()
		m, err := testenv.Metrics(s.URL(), "starlease_outbox_")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	waitDrained := func() {
		t.Helper()
		for limit := time.Now().Add(60 * time.Second); metrics()["starlease_outbox_pending_entries"] != 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(limit) {
				t.Fatalf("the relay did not drain the outbox: %v", metrics())
			}
		}
	}
	got := testenv.NewDeliveries(nil)
	stopConsumer := got.Consume(t, broker.URL(), queue)

	// 1. The exchanges callers may publish to.
	accept(commit("c-default", "", queue))
	accept(commit("c-results", "results", queue))
	got.WaitFor(t, accepted, 30*time.Second)
	waitDrained()
	refused := post(t, s, k, "/commits/authorize", commit("c-documents", "documents", queue))
	wantStatus(t, refused, 403, "access_denied")
	var env struct {
		Code      string `json:"code"`
		Msg       string `json:"msg"`
		Retryable bool   `json:"retryable"`
	}
	if err := json.Unmarshal(refused.Body, &env); err != nil {
		t.Fatal(err)
	}
	if env.Code != "access_denied" || env.Retryable || env.Msg != "Access denied: outbox.exchange is not an exchange this server publishes to" {
		t.Fatalf("refusal envelope %s", refused.Body)
	}
	u, _ := url.Parse(broker.URL())
	pw, _ := u.User.Password()
	for _, secret := range []string{"results", "(default)", pw, u.User.Username(), k.Secret} {
		if secret != "" && bytes.Contains(refused.Body, []byte(secret)) {
			t.Fatalf("the refusal shows %q: %s", secret, refused.Body)
		}
	}
	if m := metrics(); m["starlease_outbox_pending_entries"] != 0 || m["starlease_outbox_pending_bytes"] != 0 {
		t.Fatalf("a refused publication entered the outbox: %v", m)
	}
	refusedID := messageID("c-documents-never")
	wantStatus(t, post(t, s, k, "/commits/authorize", commit("c-documents-never", "documents", "elsewhere")), 403, "access_denied")
	// The refusal stored nothing under its commit id.
	accept(commit("c-documents", "", queue))
	got.WaitFor(t, accepted, 30*time.Second)
	waitDrained()

	// 2. The outbox's bound, while the broker is down.
	stopConsumer()
	broker.Kill9()
	for _, c := range []string{"c-1", "c-2", "c-3"} {
		accept(commit(c, "", queue))
	}
	full := post(t, s, k, "/commits/authorize", commit("c-4", "", queue))
	wantStatus(t, full, 503, "lease_backend_unavailable")
	if full.JSON["retryable"] != true || full.JSON["retry_after_ms"] != float64(lease.OutboxFullRetryAfter.Milliseconds()) ||
		full.Header.Get("Retry-After") != "1" || !strings.Contains(full.str("msg"), "the outbox is full") {
		t.Fatalf("full outbox envelope %v %s", full.Header, full.Body)
	}
	t.Logf("full outbox: %s", full.Body)
	m := metrics()
	if m["starlease_outbox_pending_entries"] != 3 || m["starlease_outbox_max_pending_entries"] != 3 || m["starlease_outbox_fill_ratio"] != 1 ||
		m["starlease_outbox_max_bytes"] != lease.DefaultOutboxMaxBytes || m["starlease_outbox_pending_bytes"] != float64(3*len("result of c-1")) {
		t.Fatalf("outbox metrics when full: %v", m)
	}
	st := readyState(t, s.URL())
	if ob := st.Components["outbox"]; st.Code != 200 || st.Status != "degraded" || ob.Status != "degraded" ||
		!strings.Contains(ob.Reason, "full") || ob.Detail["pending"] != float64(3) || ob.Detail["max_pending"] != float64(3) {
		t.Fatalf("/readyz with a full outbox: %+v", st)
	}
	// A commit without a publication is not the outbox's.
	doc := post(t, s, k, "/commits/authorize", with(commit("c-doc", "", queue), "outbox", nil, "sink", "couchdb",
		"target", "doc-1", "payload_sha256", sha256hex([]byte("doc"))))
	wantStatus(t, doc, 200, "lease_inspected")
	if m := metrics(); m["starlease_outbox_pending_entries"] != 3 {
		t.Fatalf("outbox after refusals: %v", m)
	}

	// 3. The broker returns: the relay drains, the refused publication
	// fits under the same commit id, everything accepted is delivered.
	broker.Restart()
	bindExchanges(t, broker, queue, "results", "documents")
	got.Consume(t, broker.URL(), queue)
	waitDrained()
	if st := readyState(t, s.URL()); st.Components["outbox"].Status != "ok" {
		t.Fatalf("/readyz after the outbox drained: %+v", st)
	}
	accept(commit("c-4", "", queue))
	got.WaitFor(t, accepted, 60*time.Second)
	time.Sleep(500 * time.Millisecond) // a refused publication would arrive now
	got.Check(t, accepted, []string{refusedID})
}

// bindExchanges declares the durable queue and, for each name, a fanout
// exchange routing every publication to it.
func bindExchanges(t *testing.T, broker *testenv.RabbitMQ, queue string, exchanges ...string) {
	t.Helper()
	broker.DeclareQueues(t, queue)
	conn, err := amqp.Dial(broker.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDeclare(x, "fanout", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(queue, "", x, false, nil); err != nil {
			t.Fatal(err)
		}
	}
}
