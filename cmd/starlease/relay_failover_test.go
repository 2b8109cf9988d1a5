package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// TestValkeyRelayFailover runs two "serve --backend valkey
// --rabbitmq-url-file" processes on one Valkey and one broker. Exactly one
// relay holds the outbox lease and publishes (the other never does while
// the first lives); after the holder is killed with SIGKILL, the other
// takes the lease over within the TTL (plus the standby's acquire retry
// step) and publishes everything accepted meanwhile; every accepted
// publication is delivered.
func TestValkeyRelayFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts servers")
	}
	const ttl = 3 * time.Second
	bin := buildBinary(t)
	tmp := t.TempDir()
	r := testenv.StartRedis(t)
	broker := testenv.StartRabbitMQ(t)
	const queue = "relay-failover"
	broker.DeclareQueues(t, queue)
	urlFile := filepath.Join(tmp, "rabbitmq-url")
	if err := os.WriteFile(urlFile, []byte(broker.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pepper := filepath.Join(tmp, "pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-relay-failover\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vflags := []string{"--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-key-prefix", "starlease:relay"}
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, append([]string{"keys", "create", "--pepper-file", pepper, "--principal", "prn-actor", "--class", "api_client",
		"--capabilities", "targets:lease", "--scope", "tenant:*,program:*"}, vflags...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("keys create: %v\n%s", err, errb.String())
	}
	var created map[string]any
	if err := json.Unmarshal(out.Bytes(), &created); err != nil {
		t.Fatal(err)
	}
	key, _ := created["api_key"].(string)

	args := append([]string{"--pepper-file", pepper, "--rabbitmq-url-file", urlFile, "--relay-lease-ttl", ttl.String(),
		"--relay-poll-interval", "50ms"}, vflags...)
	s1 := startServer(t, bin, filepath.Join(tmp, "one"), args...)
	waitActive(t, s1, 10*time.Second)
	s2 := startServer(t, bin, filepath.Join(tmp, "two"), args...)

	// Sample both servers' relay state throughout: never both active.
	var both atomic.Int32
	var s1dead atomic.Bool
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			a2 := relayMetrics(s2)["starlease_relay_active"] == 1
			if !s1dead.Load() && a2 && relayMetrics(s1)["starlease_relay_active"] == 1 {
				both.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(s2.base, key)
	if err != nil {
		t.Fatal(err)
	}
	store := client.NewLeaseStore(c, "prn-actor")
	res, err := store.Acquire(ctx, lease.AcquireRequest{Identity: lease.Identity{TenantID: "tenant-main", ProgramID: "program-a",
		TargetNamespace: "web", TargetID: "example.com", ActorName: "crawler"}, ServiceInstanceID: "inst-1", TTL: time.Minute,
		ExecutionID: "exec-1", JobID: "job-1", Mutation: lease.Mutation{RequestID: "req-failover-1", DeadlineAt: time.Now().Add(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	committer := fence.NewCommitter(store, fence.EnvelopeOf(res.Lease), lease.Caller{PrincipalID: "prn-actor"})
	pub := rabbitmq.NewPublisher(store)
	var accepted []string
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			p, err := pub.Publish(ctx, committer, fmt.Sprintf("c-%d", i), lease.OutboxMessage{RoutingKey: queue, Body: []byte(fmt.Sprintf("r%d", i))})
			if err != nil {
				t.Fatalf("publication %d: %v", i, err)
			}
			accepted = append(accepted, p.MessageID)
		}
	}
	got := testenv.NewDeliveries(nil)
	got.Consume(t, broker.URL(), queue)
	publish(0, 100)
	got.WaitFor(t, accepted, 30*time.Second)
	// The deliveries can arrive before the relay has counted their
	// confirms, so wait for the count to settle rather than read it once.
	for limit := time.Now().Add(10 * time.Second); ; {
		m1, m2 := relayMetrics(s1), relayMetrics(s2)
		if m1["starlease_relay_active"] == 1 && m2["starlease_relay_active"] == 0 && m2["starlease_relay_confirmed_total"] == 0 &&
			m1["starlease_relay_confirmed_total"] >= 100 {
			break
		}
		if m2["starlease_relay_confirmed_total"] != 0 || time.Now().After(limit) {
			t.Fatalf("before the kill: server 1 %v, server 2 %v; want exactly server 1 publishing", m1, m2)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// SIGKILL the holder: its lease stays until it expires.
	s1dead.Store(true)
	killed := time.Now()
	if err := s1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-s1.done
	publish(100, 150) // accepted while no relay holds the lease
	waitActive(t, s2, 2*ttl+5*time.Second)
	takeover := time.Since(killed)
	got.WaitFor(t, accepted, 30*time.Second)
	delivered := time.Since(killed)
	t.Logf("server 2's relay took over %v after server 1 was killed (lease TTL %v); the backlog was delivered after %v",
		takeover.Round(time.Millisecond), ttl, delivered.Round(time.Millisecond))
	// Within the TTL the dead holder last renewed at (renewals come every
	// TTL/2 at most), plus the standby's acquire retry (≤ 1 s) and slack
	// for a loaded machine.
	if takeover > ttl+2*time.Second {
		t.Errorf("takeover took %v, more than the TTL %v plus 2s", takeover, ttl)
	}
	if n := both.Load(); n > 0 {
		t.Errorf("both relays reported active in %d samples", n)
	}
	got.Check(t, accepted, nil)
	// The confirms settle just after the deliveries.
	for limit := time.Now().Add(10 * time.Second); ; {
		m := relayMetrics(s2)
		if m["starlease_relay_removed_total"] >= 50 && m["starlease_relay_backlog_entries"] == 0 && m["starlease_relay_lease_terms_total"] == 1 {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("server 2 after the takeover: %v", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitActive waits until s's relay holds the outbox lease.
func waitActive(t *testing.T, s *server, within time.Duration) {
	t.Helper()
	for limit := time.Now().Add(within); ; {
		if relayMetrics(s)["starlease_relay_active"] == 1 {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("the relay of %s did not become active within %v:\n%s", s.base, within, s.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relayMetrics returns the starlease_relay_* samples of s's /metrics
// (empty if it does not answer).
func relayMetrics(s *server) map[string]float64 {
	m, err := testenv.Metrics(s.base, "starlease_relay_")
	if err != nil {
		return map[string]float64{}
	}
	return m
}
