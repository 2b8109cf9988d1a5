package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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

// TestE2ERelayBrokerOutage runs "starlease serve --rabbitmq-url-file" on
// bolt against a real broker. Publications are made over HTTP; the broker
// is SIGKILLed while the relay drains a backlog, more publications are
// accepted while it is down (and one is refused after revoke), /readyz and
// /metrics show the stale backlog, and once the broker restarts every
// accepted publication is delivered, each message id at least once
// (exactly once after dropping duplicates by message id), with its fence
// headers and persistent delivery, and the refused one never is.
func TestE2ERelayBrokerOutage(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	broker := testenv.StartRabbitMQ(t)
	const queue = "relay-e2e"
	broker.DeclareQueues(t, queue)
	urlFile := writeURLFile(t, broker.URL())
	rows := newRowRecorder()
	s := startServer(t, bin, rows, "--rabbitmq-url-file", urlFile, "--relay-lease-ttl", "3s",
		"--relay-stale-after", "1500ms", "--relay-poll-interval", "50ms", "--relay-mandatory",
		"--principal-rate", "100000") // 3000 publications as fast as they go: the relay is measured, not the rate limit
	k := s.createKey("prn-relay", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
	adm := s.createKey("prn-relay-admin", "administrator", "targets:lease,targets:force-release", "tenant:tenant-a,program:program-a")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	store := client.NewLeaseStore(s.client(k), k.Principal)
	acquire := func(target string) (*lease.Record, *fence.Committer) {
		res, err := store.Acquire(ctx, lease.AcquireRequest{Identity: identity(target, "usernamegen"), ServiceInstanceID: "inst-relay",
			TTL: time.Minute, ExecutionID: "exec-" + target, JobID: "job-" + target,
			Mutation: lease.Mutation{RequestID: uniqueID("req"), DeadlineAt: time.Now().Add(10 * time.Second)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Lease, fence.NewCommitter(store, fence.EnvelopeOf(res.Lease), lease.Caller{PrincipalID: k.Principal})
	}
	_, committer := acquire(uniqueID("relay"))
	pub := rabbitmq.NewPublisher(store)
	var (
		mu       sync.Mutex
		accepted []string
	)
	// publish accepts commits from..to-1, on workers concurrent requests.
	publish := func(from, to, workers int) {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + w; i < to; i += workers {
					p, err := pub.Publish(ctx, committer, fmt.Sprintf("c-%d", i), lease.OutboxMessage{RoutingKey: queue,
						ContentType: "text/plain", Body: []byte(fmt.Sprintf("result %d", i))})
					if err != nil {
						errs <- fmt.Errorf("publication %d: %w", i, err)
						return
					}
					mu.Lock()
					accepted = append(accepted, p.MessageID)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}

	got := newDeliveries()
	stopConsumer := got.consume(t, broker.URL(), queue)
	publish(0, 20, 1)
	got.waitFor(t, accepted, 30*time.Second)
	if st := readyState(t, s.URL()); st.Status != "ok" || st.Components["relay"].Detail["active"] != true {
		t.Fatalf("/readyz with the relay running: %+v", st)
	}

	// Outage 1: the broker is killed; a backlog is accepted meanwhile.
	stopConsumer()
	broker.Kill9()
	start := time.Now()
	publish(20, 3000, 4)
	t.Logf("3000 publications accepted over HTTP in %v while the broker was down", time.Since(start).Round(time.Millisecond))

	// Refused: a revoked holder's publication never enters the outbox.
	rec2, committer2 := acquire(uniqueID("relay-revoked"))
	wantStatus(t, post(t, s, adm, "/"+rec2.LeaseID+"/revoke", map[string]any{"lock_identity": identity(rec2.TargetID, "usernamegen"),
		"fencing_token": rec2.FencingToken, "reason": "test", "request_id": uniqueID("req-rev")}), 200, "lease_revoked")
	refusedID, _ := rabbitmq.MessageID(fence.EnvelopeOf(rec2), rabbitmq.DefaultSink, "refused-1")
	if _, err := pub.Publish(ctx, committer2, "refused-1", lease.OutboxMessage{RoutingKey: queue, Body: []byte("stale")}); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("publication after revoke: %v", err)
	}

	// The stale backlog shows on /readyz (degraded, still 200) and /metrics.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := readyState(t, s.URL())
		rel := st.Components["relay"]
		if st.Code == 200 && st.Status == "degraded" && rel.Status == "degraded" && rel.Detail["backlog"].(float64) >= 2980 {
			t.Logf("/readyz while the broker is down: %s (%v)", st.Reason, rel.Detail)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never showed the stale backlog: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	m := scrape(t, s.URL())
	if m["starlease_relay_backlog_entries"] < 2980 || m["starlease_relay_oldest_pending_age_seconds"] < 1.5 ||
		m["starlease_relay_degraded"] != 1 || m["starlease_relay_active"] != 1 {
		t.Fatalf("relay metrics while the broker is down: %v", m)
	}

	// The broker returns, and is killed again while the relay drains the
	// backlog.
	broker.Restart()
	// A queue declared just before a SIGKILL may not have reached the
	// broker's metadata store; declaring is idempotent, and the relay
	// publishes mandatory, so nothing is dropped as unroutable meanwhile.
	broker.DeclareQueues(t, queue)
	stopConsumer = got.consume(t, broker.URL(), queue)
	for limit := time.Now().Add(60 * time.Second); got.distinct() < 20+200; {
		if time.Now().After(limit) {
			t.Fatalf("only %d deliveries within 60s of the broker's restart", got.distinct())
		}
		time.Sleep(2 * time.Millisecond)
	}
	stopConsumer()
	broker.Kill9()
	mid := got.distinct()
	t.Logf("broker killed mid-backlog: %d of %d publications delivered", mid, len(accepted))
	if mid >= len(accepted) {
		t.Fatal("the backlog drained before the broker was killed: the test did not kill it mid-backlog")
	}
	publish(3000, 3100, 2) // accepted during the second outage

	broker.Restart()
	broker.DeclareQueues(t, queue)
	restarted := time.Now()
	got.consume(t, broker.URL(), queue)
	got.waitFor(t, accepted, 90*time.Second)
	t.Logf("backlog of %d delivered %v after the broker was up again", len(accepted)-mid, time.Since(restarted).Round(time.Millisecond))
	time.Sleep(time.Second) // late duplicates, or a refused publication, would arrive now
	got.check(t, accepted, []string{refusedID})
	deadline = time.Now().Add(20 * time.Second)
	for {
		m = scrape(t, s.URL())
		st := readyState(t, s.URL())
		if m["starlease_relay_backlog_entries"] == 0 && st.Status == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the backlog drained: metrics %v, /readyz %+v", m, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if m["starlease_relay_connects_total"] < 3 || m["starlease_relay_confirmed_total"] < float64(len(accepted)) {
		t.Errorf("relay counters after the outages: %v", m)
	}
	t.Logf("relay counters: %v", m)
}

// writeURLFile writes an AMQP URL to a mode-0600 file.
func writeURLFile(t *testing.T, url string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "rabbitmq-url")
	if err := os.WriteFile(f, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// deliveries records what consumers received, by message id.
type deliveries struct {
	mu    sync.Mutex
	count map[string]int
	bad   []string
}

func newDeliveries() *deliveries { return &deliveries{count: map[string]int{}} }

// consume reads queue into d until the connection ends or stop is called.
// Each delivery is acknowledged after it is recorded, so one the consumer
// never saw (in flight when its connection closed, or the broker died) is
// delivered again rather than lost to the test.
func (d *deliveries) consume(t *testing.T, url, queue string) (stop func()) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			d.mu.Lock()
			d.count[m.MessageId]++
			if m.DeliveryMode != amqp.Persistent || m.Headers[rabbitmq.HeaderFencingToken] == nil ||
				m.Headers[rabbitmq.HeaderLockKey] == nil || m.Headers[rabbitmq.HeaderCommitID] == nil {
				d.bad = append(d.bad, m.MessageId)
			}
			d.mu.Unlock()
			_ = m.Ack(false)
		}
	}()
	stop = func() { _ = conn.Close(); <-done }
	t.Cleanup(stop)
	return stop
}

func (d *deliveries) distinct() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.count) }

// waitFor waits until every id was delivered.
func (d *deliveries) waitFor(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	limit := time.Now().Add(within)
	for {
		d.mu.Lock()
		missing := 0
		for _, id := range ids {
			if d.count[id] == 0 {
				missing++
			}
		}
		d.mu.Unlock()
		if missing == 0 {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("%d of %d publications not delivered within %v", missing, len(ids), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check: every accepted id delivered (duplicates by message id are
// counted and logged: delivery is at-least-once), no refused or unknown
// id, every delivery persistent with its fence headers.
func (d *deliveries) check(t *testing.T, accepted, refused []string) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	want := map[string]bool{}
	for _, id := range accepted {
		want[id] = true
	}
	dups := 0
	for id, n := range d.count {
		if !want[id] {
			t.Errorf("delivered %s, which was never accepted", id)
		}
		dups += n - 1
	}
	for _, id := range refused {
		if d.count[id] > 0 {
			t.Errorf("the refused publication %s was delivered", id)
		}
	}
	for id := range want {
		if d.count[id] == 0 {
			t.Errorf("accepted publication %s never delivered", id)
		}
	}
	if len(d.bad) > 0 {
		t.Errorf("deliveries without persistent mode or fence headers: %v", d.bad)
	}
	t.Logf("%d accepted publications, %d distinct delivered, %d duplicate deliveries (dropped by message id)", len(accepted), len(d.count), dups)
}

// readiness is /readyz's answer.
type readiness struct {
	Code       int
	Status     string `json:"status"`
	Reason     string `json:"reason"`
	Components map[string]struct {
		Status string         `json:"status"`
		Reason string         `json:"reason"`
		Detail map[string]any `json:"detail"`
	} `json:"components"`
}

func readyState(t *testing.T, base string) readiness {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r readiness
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	r.Code = resp.StatusCode
	return r
}

// scrape returns the starlease_relay_* samples of /metrics.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "starlease_relay_") {
			var name string
			var v float64
			if _, err := fmt.Sscanf(line, "%s %g", &name, &v); err == nil {
				out[name] = v
			}
		}
	}
	return out
}
