// Package testenv starts real servers for tests: each on 127.0.0.1 only, on
// a random free port, with its data in a t.TempDir(), stopped in t.Cleanup.
//
// A missing server binary fails the test with the install hint; it never
// skips, so CI (CI=true) cannot go green by running nothing.
package testenv

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RedisBinary is where the Debian package installs redis-server, which
// speaks Valkey's protocol (Valkey itself is not packaged for this Debian).
const RedisBinary = "/usr/bin/redis-server"

// RedisInstallHint is the command that installs the server.
const RedisInstallHint = "apt-get install -y redis-server"

// RedisConfig configures a test server. The zero value is the durable
// configuration the Valkey adapter requires: AOF on, fsync on every write,
// no RDB snapshots.
type RedisConfig struct {
	// AppendFsync overrides "always" (e.g. "everysec" to test that the
	// adapter refuses a server that may lose acknowledged writes).
	AppendFsync string
	// NoAppendOnly turns the AOF off.
	NoAppendOnly bool
	// Password, if set, is required of the default user (requirepass).
	Password string
	// ACL lines go to an aclfile in the data dir, e.g.
	// "user starlease on >secret ~starlease:* +fcall" or
	// "user default off". With ACL set, Password is ignored.
	ACL []string
	// TLS serves TLS only (no plain port), with a server certificate for
	// 127.0.0.1 signed by a throwaway CA; ClientTLS trusts that CA.
	TLS bool
	// Extra lines are appended to the configuration file verbatim.
	Extra []string
}

// Redis is a running test server.
type Redis struct {
	t    testing.TB
	bin  string
	dir  string
	conf string
	port int
	cfg  RedisConfig
	ca   *testCA

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// StartRedis starts a durable redis-server for t (see RedisConfig).
func StartRedis(t testing.TB) *Redis { t.Helper(); return StartRedisWith(t, RedisConfig{}) }

// StartRedisWith starts a redis-server configured by cfg. It is stopped
// (killed and waited for) when t's cleanup runs.
func StartRedisWith(t testing.TB, cfg RedisConfig) *Redis {
	t.Helper()
	bin := RedisBinary
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("redis-server")
		if lerr != nil {
			// Never a skip: a run without the server must fail loudly,
			// inside CI (CI=true) and out.
			t.Fatalf("testenv: redis-server not found at %s or on PATH (CI=%q); install it with: %s",
				RedisBinary, os.Getenv("CI"), RedisInstallHint)
		}
		bin = p
	}
	r := &Redis{t: t, bin: bin, dir: t.TempDir(), cfg: cfg}
	r.conf = filepath.Join(r.dir, "redis.conf")
	t.Cleanup(r.Stop)
	if cfg.TLS {
		ca, err := newTestCA(r.dir)
		if err != nil {
			t.Fatalf("testenv: make a test CA: %v", err)
		}
		r.ca = ca
	}
	var lastErr error
	// A free port found by binding :0 may be taken before the server binds
	// it; try a few ports before giving up.
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testenv: no free loopback port: %v", err)
		}
		r.port = port
		if err := r.writeConfig(); err != nil {
			t.Fatalf("testenv: write redis.conf: %v", err)
		}
		if lastErr = r.start(); lastErr == nil {
			return r
		}
	}
	t.Fatalf("testenv: redis-server did not start: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (r *Redis) writeConfig() error {
	fsync, aof := "always", "yes"
	if r.cfg.AppendFsync != "" {
		fsync = r.cfg.AppendFsync
	}
	if r.cfg.NoAppendOnly {
		aof = "no"
	}
	lines := []string{
		"bind 127.0.0.1",
		// Loopback only, so protected mode has nothing to protect; turning
		// it off keeps a passwordless default user usable.
		"protected-mode no",
		"daemonize no",
		"dir " + r.dir,
		"logfile " + filepath.Join(r.dir, "redis.log"),
		"appendonly " + aof,
		"appendfsync " + fsync,
		`save ""`,
	}
	if r.ca != nil {
		lines = append(lines, "port 0", "tls-port "+strconv.Itoa(r.port), "tls-cert-file "+r.ca.certFile,
			"tls-key-file "+r.ca.keyFile, "tls-ca-cert-file "+r.ca.caFile, "tls-auth-clients no")
	} else {
		lines = append(lines, "port "+strconv.Itoa(r.port))
	}
	switch {
	case len(r.cfg.ACL) > 0:
		acl := filepath.Join(r.dir, "users.acl")
		if err := os.WriteFile(acl, []byte(strings.Join(r.cfg.ACL, "\n")+"\n"), 0o600); err != nil {
			return err
		}
		lines = append(lines, "aclfile "+acl)
	case r.cfg.Password != "":
		lines = append(lines, "requirepass "+r.cfg.Password)
	}
	lines = append(lines, r.cfg.Extra...)
	return os.WriteFile(r.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// start launches the server on r's config and waits until it answers.
func (r *Redis) start() error {
	cmd := exec.Command(r.bin, r.conf)
	cmd.Dir = r.dir
	// Own process group: a terminal's signals are not the test's business.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()

	limit := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited during start: %s", r.logTail())
		default:
		}
		if r.ready() {
			return nil
		}
		if time.Now().After(limit) {
			r.kill()
			return fmt.Errorf("redis-server did not answer PING within 20s: %s", r.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ready reports whether the server answers PING with anything but
// -LOADING (a password-protected server answering -NOAUTH is up).
func (r *Redis) ready() bool {
	var c net.Conn
	var err error
	if r.ca != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", r.Addr(), r.ClientTLS())
	} else {
		c, err = net.DialTimeout("tcp", r.Addr(), time.Second)
	}
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return false
	}
	return strings.HasPrefix(line, "+PONG") || (strings.HasPrefix(line, "-") && !strings.HasPrefix(line, "-LOADING"))
}

func (r *Redis) logTail() string {
	b, err := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	if err != nil {
		return "(no log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Addr is the server's host:port on 127.0.0.1.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Dir is the server's data directory (AOF, log, config).
func (r *Redis) Dir() string { return r.dir }

// Pid is the server's process id, 0 if it is not running.
func (r *Redis) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Password is the configured requirepass, if any.
func (r *Redis) Password() string { return r.cfg.Password }

// kill sends SIGKILL and waits for the process; no-op if not running.
func (r *Redis) kill() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		r.t.Logf("testenv: kill redis-server: %v", err)
	}
	<-done
}

// Kill9 kills the server with SIGKILL, as a crash would: no shutdown, no
// final fsync beyond what appendfsync already did.
func (r *Redis) Kill9() { r.t.Helper(); r.kill() }

// Restart starts the server again on the same port, data dir and AOF
// (killing it first if it is still running) and waits until it answers.
func (r *Redis) Restart() {
	r.t.Helper()
	r.kill()
	if err := r.start(); err != nil {
		r.t.Fatalf("testenv: restart redis-server: %v", err)
	}
}

// Stop kills the server and waits for it. t.Cleanup calls it.
func (r *Redis) Stop() { r.kill() }

// DocumentedACL reads the least-privilege ACL rule documented in the Go
// file docFile (the valkey package's doc.go): the comment line starting
// "user starlease on >PASSWORD" and the "+command" lines after it, joined,
// with PASSWORD replaced. Tests run servers with exactly what the
// documentation tells operators.
func DocumentedACL(t testing.TB, docFile, password string) string {
	t.Helper()
	src, err := os.ReadFile(docFile)
	if err != nil {
		t.Fatal(err)
	}
	var rule []string
	for _, line := range strings.Split(string(src), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(line, "//"))
		switch {
		case strings.HasPrefix(line, "user starlease on >PASSWORD"):
			rule = append(rule, line)
		case len(rule) > 0 && strings.HasPrefix(line, "+"):
			rule = append(rule, line)
		case len(rule) > 0:
			return strings.Replace(strings.Join(rule, " "), "PASSWORD", password, 1)
		}
	}
	t.Fatalf("testenv: %s documents no ACL rule", docFile)
	return ""
}
