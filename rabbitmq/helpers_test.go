package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
	"github.com/starintel/starlease/valkey"
)

var (
	actor = lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}
	admin = lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}
)

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// clock is a settable backend clock for the bolt store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// backend opens a fresh, empty lease store with its outbox.
type backend struct {
	name string
	// ttl is the lease TTL the tests acquire with.
	ttl  time.Duration
	open func(t *testing.T) *env
}

// env is one test's lease store, broker and queue.
type env struct {
	t      *testing.T
	store  lease.Store
	outbox lease.Outbox
	now    func() time.Time
	// advance moves backend time forward by d: the bolt store's clock is
	// settable; Valkey's is its own TIME, so the test waits.
	advance func(d time.Duration)
	ttl     time.Duration
	id      lease.Identity
	broker  *testenv.RabbitMQ
	url     string
}

func boltBackend() backend {
	return backend{name: "bolt", ttl: 10 * time.Second, open: func(t *testing.T) *env {
		c := &clock{t: time.Now().Truncate(time.Millisecond)}
		s, err := bolt.Open(filepath.Join(t.TempDir(), "lease.db"), bolt.Options{Now: c.Now, ReapInterval: -1,
			StoreOptions: lease.StoreOptions{Logger: testLogger(t)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return &env{t: t, store: s, outbox: s, now: c.Now, advance: c.Add, ttl: 10 * time.Second}
	}}
}

// valkeyBackend opens stores on one durable test server (appendonly yes,
// appendfsync always; AllowUnverifiedDurability stays false), each in a
// fresh key namespace.
func valkeyBackend(r *testenv.Redis) backend {
	const ttl = 1500 * time.Millisecond
	return backend{name: "valkey", ttl: ttl, open: func(t *testing.T) *env {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: "t" + randomHex(6), ReapInterval: -1,
			StoreOptions: lease.StoreOptions{Logger: testLogger(t)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if h := s.Health(ctx); h.Status != lease.HealthOK {
			t.Fatalf("valkey store health %s: %s", h.Status, h.Reason)
		}
		return &env{t: t, store: s, outbox: s, now: time.Now, advance: time.Sleep, ttl: ttl}
	}}
}

func (b backend) env(t *testing.T, broker *testenv.RabbitMQ) *env {
	e := b.open(t)
	e.broker = broker
	if broker != nil {
		e.url = broker.URL()
	}
	e.id = lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target-" + randomHex(4), ActorName: "usernamegen"}
	return e
}

// far is a deadline relative to backend time that the tests never reach.
func (e *env) far() time.Time { return e.now().Add(time.Hour) }

func (e *env) acquire(instance string) *lease.Record {
	e.t.Helper()
	res, err := e.store.Acquire(context.Background(), lease.AcquireRequest{Identity: e.id,
		ServiceInstanceID: instance, TTL: e.ttl, MaximumLifetime: time.Hour,
		ExecutionID: "exec-" + instance, JobID: "job-1", TraceID: "trace-" + instance,
		Mutation: lease.Mutation{RequestID: "req-" + instance + "-" + randomHex(4), DeadlineAt: e.far(), Caller: actor}})
	if err != nil {
		e.t.Fatalf("acquire as %s: %v", instance, err)
	}
	return res.Lease
}

// expire waits (in backend time) until rec has expired.
func (e *env) expire(rec *lease.Record) {
	e.t.Helper()
	e.advance(rec.ExpiresAt.Time().Sub(e.now()) + 50*time.Millisecond)
}

func (e *env) committer(rec *lease.Record) *fence.Committer {
	return fence.NewCommitter(e.store, fence.EnvelopeOf(rec), actor, fence.WithClock(e.now))
}

func (e *env) publisher(opts ...rabbitmq.PublisherOption) *rabbitmq.Publisher {
	return rabbitmq.NewPublisher(e.store, append([]rabbitmq.PublisherOption{rabbitmq.WithClock(e.now),
		rabbitmq.WithCaller(actor)}, opts...)...)
}

func (e *env) pending() []lease.OutboxEntry {
	e.t.Helper()
	got, err := e.outbox.OutboxPending(context.Background(), 0)
	if err != nil {
		e.t.Fatalf("outbox pending: %v", err)
	}
	return got
}

// pendingOf returns the pending entries of one lease.
func (e *env) pendingOf(leaseID string) []lease.OutboxEntry {
	e.t.Helper()
	var out []lease.OutboxEntry
	for _, en := range e.pending() {
		if en.LeaseID == leaseID {
			out = append(out, en)
		}
	}
	return out
}

// waitOutboxEmpty waits until the relay has removed every entry.
func (e *env) waitOutboxEmpty() {
	e.t.Helper()
	limit := time.Now().Add(20 * time.Second)
	for {
		p := e.pending()
		if len(p) == 0 {
			return
		}
		if time.Now().After(limit) {
			e.t.Fatalf("outbox still holds %d entries", len(p))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relayOptions are quick, for tests.
func relayOptions(t *testing.T) rabbitmq.RelayOptions {
	return rabbitmq.RelayOptions{PollInterval: 20 * time.Millisecond, MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 300 * time.Millisecond, ConfirmTimeout: 5 * time.Second, DialTimeout: 2 * time.Second,
		Logger: testLogger(t)}
}

// runRelay runs r until the test ends and waits for it to stop.
func runRelay(t *testing.T, r *rabbitmq.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != context.Canceled {
				t.Errorf("relay Run returned %v, want context.Canceled", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("relay did not stop within 15s of its context ending")
		}
	})
}

func (e *env) startRelay(opts rabbitmq.RelayOptions) *rabbitmq.Relay {
	e.t.Helper()
	r, err := rabbitmq.NewRelay(e.outbox, e.url, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	runRelay(e.t, r)
	return r
}

// consumer reads one queue with manual acknowledgements.
type consumer struct {
	t          *testing.T
	ch         *amqp.Channel
	queue      string
	deliveries <-chan amqp.Delivery
}

// dialAMQP opens a connection closed at the end of the test.
func dialAMQP(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial broker: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// declareQueue declares a durable queue, bound to exchange (a durable
// direct exchange, declared too) with routingKey unless exchange is empty.
func declareQueue(t *testing.T, url, queue, exchange, routingKey string) {
	t.Helper()
	ch, err := dialAMQP(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	if exchange != "" {
		if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
			t.Fatalf("declare exchange: %v", err)
		}
		if err := ch.QueueBind(queue, routingKey, exchange, false, nil); err != nil {
			t.Fatalf("bind queue: %v", err)
		}
	}
}

func newConsumer(t *testing.T, url, queue string) *consumer {
	t.Helper()
	ch, err := dialAMQP(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	d, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	return &consumer{t: t, ch: ch, queue: queue, deliveries: d}
}

// next returns the next delivery, failing the test after timeout.
func (c *consumer) next(timeout time.Duration) amqp.Delivery {
	c.t.Helper()
	select {
	case d, ok := <-c.deliveries:
		if !ok {
			c.t.Fatal("consumer channel closed")
		}
		return d
	case <-time.After(timeout):
		c.t.Fatalf("no delivery on %s within %v", c.queue, timeout)
	}
	return amqp.Delivery{}
}

// none fails the test if a delivery arrives within d.
func (c *consumer) none(d time.Duration) {
	c.t.Helper()
	select {
	case del, ok := <-c.deliveries:
		if ok {
			c.t.Fatalf("unexpected delivery on %s: message id %q, body %q, headers %v", c.queue, del.MessageId, del.Body, del.Headers)
		}
	case <-time.After(d):
	}
}

// inject publishes straight to a queue, bypassing the outbox, as a stale
// or rogue publisher could.
func inject(t *testing.T, url, queue string, p amqp.Publishing) {
	t.Helper()
	ch, err := dialAMQP(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", queue, false, false, p)
	if err != nil {
		t.Fatalf("inject: %v", err)
	}
	if !dc.Wait() {
		t.Fatal("inject: broker nacked")
	}
}

// testLogger logs to t, at warning level and above.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// forwarder is a TCP forwarder on loopback whose upstream can be changed:
// the relay keeps one URL while the broker behind it goes down and another
// one comes up (the testenv harness cannot restart a broker on its port).
type forwarder struct {
	t  *testing.T
	ln net.Listener

	mu       sync.Mutex
	upstream string
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

func startForwarder(t *testing.T, upstream string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{t: t, ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.stop)
	return f
}

func (f *forwarder) Addr() string { return f.ln.Addr().String() }

// URL is the guest AMQP URL through the forwarder.
func (f *forwarder) URL() string { return "amqp://guest:guest@" + f.Addr() + "/" }

// setUpstream points new connections at addr and resets the open ones.
func (f *forwarder) setUpstream(addr string) {
	f.mu.Lock()
	f.upstream = addr
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		client, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		up := f.upstream
		f.mu.Unlock()
		server, err := net.DialTimeout("tcp", up, time.Second)
		if err != nil {
			client.Close() // the broker is down: the relay sees a refused handshake
			continue
		}
		if !f.track(client) || !f.track(server) {
			client.Close()
			server.Close()
			continue
		}
		f.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer f.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(server, client)
		go pipe(client, server)
	}
}

func (f *forwarder) stop() {
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}
