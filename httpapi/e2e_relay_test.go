package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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

	got := testenv.NewDeliveries(func(m amqp.Delivery) bool {
		// persistent, with its fence headers
		return m.DeliveryMode == amqp.Persistent && m.Headers[rabbitmq.HeaderFencingToken] != nil &&
			m.Headers[rabbitmq.HeaderLockKey] != nil && m.Headers[rabbitmq.HeaderCommitID] != nil
	})
	stopConsumer := got.Consume(t, broker.URL(), queue)
	publish(0, 20, 1)
	got.WaitFor(t, accepted, 30*time.Second)
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
	stopConsumer = got.Consume(t, broker.URL(), queue)
	for limit := time.Now().Add(60 * time.Second); got.Distinct() < 20+200; {
		if time.Now().After(limit) {
			t.Fatalf("only %d deliveries within 60s of the broker's restart", got.Distinct())
		}
		time.Sleep(2 * time.Millisecond)
	}
	stopConsumer()
	broker.Kill9()
	mid := got.Distinct()
	t.Logf("broker killed mid-backlog: %d of %d publications delivered", mid, len(accepted))
	if mid >= len(accepted) {
		t.Fatal("the backlog drained before the broker was killed: the test did not kill it mid-backlog")
	}
	publish(3000, 3100, 2) // accepted during the second outage

	broker.Restart()
	broker.DeclareQueues(t, queue)
	restarted := time.Now()
	got.Consume(t, broker.URL(), queue)
	got.WaitFor(t, accepted, 90*time.Second)
	t.Logf("backlog of %d delivered %v after the broker was up again", len(accepted)-mid, time.Since(restarted).Round(time.Millisecond))
	time.Sleep(time.Second) // late duplicates, or a refused publication, would arrive now
	got.Check(t, accepted, []string{refusedID})
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
	m, err := testenv.Metrics(base, "starlease_relay_")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
