package testenv

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// echoServer answers every byte it reads with the same byte.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echoTrip writes msg and reads len(msg) bytes back within d.
func echoTrip(c net.Conn, msg string, d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	n, err := io.ReadFull(c, buf)
	return string(buf[:n]), err
}

func TestProxy(t *testing.T) {
	p := StartProxy(t, echoServer(t))

	c := dial(t, p)
	if got, err := echoTrip(c, "hello", time.Second); err != nil || got != "hello" {
		t.Fatalf("pass-through: %q %v", got, err)
	}

	// Latency on replies, on an open connection.
	p.AddToxic("lag", "latency", Downstream, map[string]any{"latency": 150})
	start := time.Now()
	if got, err := echoTrip(c, "slow", time.Second); err != nil || got != "slow" {
		t.Fatalf("latency: %q %v", got, err)
	}
	if d := time.Since(start); d < 140*time.Millisecond {
		t.Fatalf("latency toxic: reply after %v", d)
	}
	p.RemoveToxic("lag")

	// A black hole: nothing comes back, nothing is closed.
	p.AddToxic("hole", "timeout", Upstream, map[string]any{"timeout": 0})
	if _, err := echoTrip(c, "lost", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("black hole: %v, want a timeout", err)
	}
	p.RemoveToxic("hole") // closes the connections it held

	// A reply cut short, then a reset.
	c = dial(t, p)
	p.AddToxic("cut", "limit_data", Downstream, map[string]any{"bytes": 3})
	got, err := echoTrip(c, "abcdef", time.Second)
	if got != "abc" || err == nil || isTimeout(err) {
		t.Fatalf("limit_data: %q %v", got, err)
	}
	p.RemoveToxic("cut")

	// A reset once the reply arrives: the client sees ECONNRESET, not EOF.
	c = dial(t, p)
	if _, err := echoTrip(c, "warm", time.Second); err != nil {
		t.Fatal(err)
	}
	p.AddToxic("rst", "reset_peer", Downstream, map[string]any{"timeout": 0})
	if _, err := echoTrip(c, "x", time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reset_peer: %v, want ECONNRESET", err)
	}
	p.Clear()

	// Cut: open connections reset, new ones refused; Restore heals.
	c = dial(t, p)
	if _, err := echoTrip(c, "up", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := echoTrip(c, "down", time.Second); err == nil || isTimeout(err) {
		t.Fatalf("after Cut: %v, want a closed connection", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after Cut: %v, want refused", err)
	}
	p.Restore()
	if got, err := echoTrip(dial(t, p), "again", time.Second); err != nil || got != "again" {
		t.Fatalf("after Restore: %q %v", got, err)
	}
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
