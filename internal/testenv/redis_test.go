package testenv

import (
	"bufio"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// roundTrip sends one inline command and returns the first reply line.
func roundTrip(t *testing.T, addr string, lines ...string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(c)
	var last string
	for _, l := range lines {
		if _, err := c.Write([]byte(l + "\r\n")); err != nil {
			t.Fatal(err)
		}
		if last, err = rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		// Skip the bulk payload of a bulk reply.
		if strings.HasPrefix(last, "$") && !strings.HasPrefix(last, "$-1") {
			if last, err = rd.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	return strings.TrimSpace(last)
}

func TestStartRedisIsDurableAndLoopbackOnly(t *testing.T) {
	r := StartRedis(t)
	if host, _, _ := net.SplitHostPort(r.Addr()); host != "127.0.0.1" {
		t.Fatalf("addr %s is not loopback", r.Addr())
	}
	if got := roundTrip(t, r.Addr(), "PING"); got != "+PONG" {
		t.Fatalf("PING: %q", got)
	}
	for k, want := range map[string]string{"appendonly": "yes", "appendfsync": "always", "bind": "127.0.0.1", "save": ""} {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(c)
		c.Write([]byte("CONFIG GET " + k + "\r\n"))
		var lines []string
		for i := 0; i < 5; i++ {
			l, _ := rd.ReadString('\n')
			lines = append(lines, strings.TrimSpace(l))
		}
		c.Close()
		if lines[4] != want {
			t.Fatalf("CONFIG GET %s = %q, want %q", k, lines, want)
		}
	}
}

// Kill9 and Restart keep the port and the AOF: an acknowledged write
// survives a SIGKILL.
func TestKill9RestartKeepsAOF(t *testing.T) {
	r := StartRedis(t)
	addr := r.Addr()
	if got := roundTrip(t, addr, "SET k survived"); got != "+OK" {
		t.Fatalf("SET: %q", got)
	}
	r.Kill9()
	if _, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		t.Fatal("server still answers after Kill9")
	}
	r.Restart()
	if r.Addr() != addr {
		t.Fatalf("restart moved the server from %s to %s", addr, r.Addr())
	}
	if got := roundTrip(t, addr, "GET k"); got != "survived" {
		t.Fatalf("GET after restart: %q", got)
	}
	if _, err := os.Stat(filepath.Join(r.Dir(), "appendonlydir")); err != nil {
		t.Fatalf("no AOF directory: %v", err)
	}
}

func TestPasswordAndACL(t *testing.T) {
	p := StartRedisWith(t, RedisConfig{Password: "s3cret"})
	if got := roundTrip(t, p.Addr(), "PING"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Fatalf("PING without AUTH: %q", got)
	}
	if got := roundTrip(t, p.Addr(), "AUTH s3cret", "PING"); got != "+PONG" {
		t.Fatalf("PING after AUTH: %q", got)
	}
	a := StartRedisWith(t, RedisConfig{ACL: []string{"user default off", "user app on >pw ~app:* +get +set +ping"}})
	if got := roundTrip(t, a.Addr(), "AUTH app pw", "SET app:x 1"); got != "+OK" {
		t.Fatalf("SET in namespace: %q", got)
	}
	if got := roundTrip(t, a.Addr(), "AUTH app pw", "SET other 1"); !strings.HasPrefix(got, "-NOPERM") {
		t.Fatalf("SET outside namespace: %q", got)
	}
}

func TestNonDurableConfig(t *testing.T) {
	r := StartRedisWith(t, RedisConfig{AppendFsync: "everysec"})
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	c.Write([]byte("CONFIG GET appendfsync\r\n"))
	var last string
	for i := 0; i < 5; i++ {
		last, _ = rd.ReadString('\n')
	}
	if strings.TrimSpace(last) != "everysec" {
		t.Fatalf("appendfsync = %q", last)
	}
}

func TestTLS(t *testing.T) {
	r := StartRedisWith(t, RedisConfig{TLS: true})
	c, err := tls.Dial("tcp", r.Addr(), r.ClientTLS())
	if err != nil {
		t.Fatalf("TLS dial with the test CA: %v", err)
	}
	c.Close()
	if _, err := tls.Dial("tcp", r.Addr(), &tls.Config{}); err == nil {
		t.Fatal("TLS dial without the test CA verified")
	}
}
