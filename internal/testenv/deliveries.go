package testenv

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Deliveries records what a test's consumers received from a queue, by
// message id: delivery is at-least-once, so duplicates are counted, not
// failures.
type Deliveries struct {
	ok func(amqp.Delivery) bool

	mu    sync.Mutex
	count map[string]int
	bad   []string
}

// NewDeliveries returns an empty record. ok, if not nil, must hold for
// every delivery (Check reports those it refused).
func NewDeliveries(ok func(amqp.Delivery) bool) *Deliveries {
	return &Deliveries{ok: ok, count: map[string]int{}}
}

// Consume reads queue into d until its connection ends, stop is called or
// the test ends. Each delivery is acknowledged after it is recorded, so one
// the consumer never saw (in flight when its connection closed, or the
// broker died) is delivered again rather than lost to the test.
func (d *Deliveries) Consume(t testing.TB, url, queue string) (stop func()) {
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
			if d.ok != nil && !d.ok(m) {
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

// Distinct is how many distinct message ids were delivered.
func (d *Deliveries) Distinct() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.count) }

// WaitFor waits until every id was delivered, or fails the test.
func (d *Deliveries) WaitFor(t testing.TB, ids []string, within time.Duration) {
	t.Helper()
	for limit := time.Now().Add(within); ; {
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
		time.Sleep(20 * time.Millisecond)
	}
}

// Check requires that every accepted id was delivered, that no refused or
// unknown id was, and that ok held for every delivery; duplicates are
// logged.
func (d *Deliveries) Check(t testing.TB, accepted, refused []string) {
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
		t.Errorf("deliveries the test refused: %v", d.bad)
	}
	t.Logf("%d accepted publications, %d distinct delivered, %d duplicate deliveries (dropped by message id)",
		len(want), len(d.count), dups)
}

// Metrics returns the samples of base's /metrics whose names start with
// prefix.
func Metrics(base, prefix string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			var name string
			var v float64
			if _, err := fmt.Sscanf(line, "%s %g", &name, &v); err == nil {
				out[name] = v
			}
		}
	}
	return out, nil
}
