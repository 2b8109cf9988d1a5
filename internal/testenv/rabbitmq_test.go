package testenv

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRabbitMQ(t *testing.T) {
	r := StartRabbitMQ(t)
	if !strings.HasPrefix(r.URL(), "amqp://guest:guest@127.0.0.1:") {
		t.Fatalf("URL = %q", r.URL())
	}

	conn, err := amqp.Dial(r.URL())
	if err != nil {
		t.Fatalf("dial %s: %v", r.URL(), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm mode: %v", err)
	}
	q, err := ch.QueueDeclare("testenv", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("declare queue: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := "hello from testenv " + randomHex(4)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, true, false, amqp.Publishing{
		ContentType:  "text/plain",
		DeliveryMode: amqp.Persistent,
		Body:         []byte(body),
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publisher confirm: ack=%v err=%v", ok, err)
	}

	msgs, err := ch.ConsumeWithContext(ctx, q.Name, "testenv", false, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	select {
	case m := <-msgs:
		if string(m.Body) != body {
			t.Fatalf("consumed %q, want %q", m.Body, body)
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no message consumed within 10s")
	}
	conn.Close()

	// Only loopback listeners, and no process left after Stop.
	assertLoopbackOnly(t, r)
	broker, epmd := r.Pids()
	if broker == 0 || epmd == 0 {
		t.Fatalf("pids: broker %d, epmd %d", broker, epmd)
	}
	if got := pgrep(t, r.Dir()); len(got) == 0 {
		t.Fatalf("pgrep -f %s found no broker process before Stop", r.Dir())
	}
	stopStart := time.Now()
	r.Stop()
	t.Logf("stopped broker and epmd in %v", time.Since(stopStart).Round(time.Millisecond))
	for _, pat := range []string{r.Dir(), "-port " + strconv.Itoa(r.epmdPort) + " "} {
		if got := pgrep(t, pat); len(got) != 0 {
			t.Errorf("after Stop, pgrep -f %q: %v", pat, got)
		}
	}
	for _, pgid := range []int{broker, epmd} {
		if live := liveGroupMembers(pgid); len(live) != 0 {
			t.Errorf("after Stop, process group %d has live processes %v", pgid, live)
		}
	}
	// No port check here: once freed, a random port may at once belong to
	// another test's server; the process checks above are what matters.
	r.Stop() // idempotent
}

// assertLoopbackOnly checks that every port the broker and its epmd are
// meant to listen on refuses connections on a non-loopback address of this
// machine (if it has one).
func assertLoopbackOnly(t *testing.T, r *RabbitMQ) {
	t.Helper()
	ip := nonLoopbackIP()
	if ip == nil {
		t.Log("no non-loopback address to check listeners against")
		return
	}
	for _, port := range []int{r.amqpPort, r.distPort, r.epmdPort} {
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("broker reachable on %s, want loopback only", addr)
		}
	}
}

func nonLoopbackIP() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	return nil
}

// pgrep returns the "pid cmdline" lines of processes whose command line
// matches pattern (an extended regular expression;
// the paths and flags used here match themselves). Zombies have no command line, so only
// live processes count.
func pgrep(t *testing.T, pattern string) []string {
	t.Helper()
	out, err := exec.Command("pgrep", "-a", "-f", "--", pattern).Output()
	if err != nil {
		// Exit status 1: nothing matched.
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
			return nil
		}
		t.Fatalf("pgrep: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// pgrep itself is not ours; our own pid neither.
		if f := strings.Fields(l); len(f) > 0 && f[0] != strconv.Itoa(os.Getpid()) {
			lines = append(lines, l)
		}
	}
	return lines
}
