package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitMQBinary is the Debian package's start script for the broker. It is
// the script the package's /usr/sbin/rabbitmq-server wrapper runs; calling
// it directly skips that wrapper's "su rabbitmq" and its fixed /var/lib and
// /var/log paths, so the broker runs as the test's user with everything in
// a temp dir.
const RabbitMQBinary = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// EPMDBinary is Erlang's port mapper daemon (package erlang-base). Each
// broker gets its own, on a private port bound to loopback.
const EPMDBinary = "/usr/bin/epmd"

// RabbitMQInstallHint is the command that installs the broker.
const RabbitMQInstallHint = "bash .ci/install-servers.sh (or: apt-get install -y --no-install-recommends rabbitmq-server)"

// rabbitStartTimeout bounds a broker's start; it takes about 6-9 s here.
const rabbitStartTimeout = 60 * time.Second

// RabbitMQ is a running test broker: its own node, its own epmd, AMQP and
// Erlang distribution on 127.0.0.1 only, all state in a t.TempDir().
// The default user guest/guest works, since guest may connect from
// loopback only (loopback_users.guest = true, the default).
type RabbitMQ struct {
	t    testing.TB
	bin  string
	epmd string
	dir  string
	node string

	amqpPort, distPort, epmdPort int

	mu       sync.Mutex
	cmd      *exec.Cmd // the rabbitmq-server script; beam.smp is its child, in its process group
	done     chan struct{}
	epmdCmd  *exec.Cmd
	epmdDone chan struct{}
}

// StartRabbitMQ starts a broker for t and waits until it completes an AMQP
// handshake as guest. It is stopped (broker and its epmd killed, and waited
// for) when t's cleanup runs.
func StartRabbitMQ(t testing.TB) *RabbitMQ {
	t.Helper()
	bin, err := findBinary(RabbitMQBinary, "")
	if err != nil {
		// Never a skip: a run without the broker must fail loudly,
		// inside CI (CI=true) and out.
		t.Fatalf("testenv: rabbitmq-server not found at %s (CI=%q); install it with: %s",
			RabbitMQBinary, os.Getenv("CI"), RabbitMQInstallHint)
	}
	epmd, err := findBinary(EPMDBinary, "epmd")
	if err != nil {
		t.Fatalf("testenv: epmd not found at %s or on PATH (CI=%q); install it with: %s",
			EPMDBinary, os.Getenv("CI"), RabbitMQInstallHint)
	}
	r := &RabbitMQ{t: t, bin: bin, epmd: epmd, dir: t.TempDir()}
	r.node = "starlease-" + randomHex(6) + "@localhost"
	t.Cleanup(r.Stop)
	var lastErr error
	// Free ports found by binding :0 may be taken before the broker binds
	// them; try fresh ports a few times.
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatalf("testenv: no free loopback port: %v", err)
		}
		r.amqpPort, r.distPort, r.epmdPort = ports[0], ports[1], ports[2]
		start := time.Now()
		if lastErr = r.start(); lastErr == nil {
			t.Logf("testenv: rabbitmq %s on %s ready in %v", r.node, r.Addr(), time.Since(start).Round(10*time.Millisecond))
			return r
		}
		r.kill()
	}
	t.Fatalf("testenv: rabbitmq-server did not start: %v", lastErr)
	return nil
}

// findBinary returns path if it exists, else name looked up on PATH (if
// name is not empty).
func findBinary(path, name string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	} else if name == "" {
		return "", err
	}
	return exec.LookPath(name)
}

// freePorts returns n distinct free loopback ports, holding all of them
// open until it has them all, so that they differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// env is the broker's environment: the test's, minus any RABBITMQ_* or
// ERL_* of the caller's, plus everything pointed into r.dir.
func (r *RabbitMQ) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RABBITMQ_") || strings.HasPrefix(kv, "ERL_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	// Erlang distribution (and the CLI tools, should a test run
	// rabbitmqctl with this environment) on loopback only.
	loopbackDist := "-kernel inet_dist_use_interface {127,0,0,1}"
	return append(env,
		// The Erlang cookie goes to $HOME/.erlang.cookie.
		"HOME="+filepath.Join(r.dir, "home"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT="+strconv.Itoa(r.epmdPort),
		// Empty, so /etc/rabbitmq/rabbitmq-env.conf is not read.
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(r.dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r.dir, "rabbitmq.conf"),
		// An empty directory, so /etc/rabbitmq/conf.d is not read.
		"RABBITMQ_CONFIG_FILES="+filepath.Join(r.dir, "conf.d"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(r.dir, "advanced.config"),
		// "[]." : no plugins (no management or prometheus listeners).
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.dir, "enabled_plugins"),
		"RABBITMQ_NODENAME="+r.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(r.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.dir, "log"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+loopbackDist,
		"RABBITMQ_CTL_ERL_ARGS="+loopbackDist,
	)
}

func (r *RabbitMQ) writeFiles() error {
	for _, d := range []string{"home", "conf.d", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), 0o700); err != nil {
			return err
		}
	}
	conf := strings.Join([]string{
		"listeners.tcp.default = 127.0.0.1:" + strconv.Itoa(r.amqpPort),
		"loopback_users.guest = true",
		"log.console = false",
		"log.file.level = info",
	}, "\n") + "\n"
	files := map[string]string{
		"rabbitmq-env.conf": "",
		"rabbitmq.conf":     conf,
		"enabled_plugins":   "[].\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// start launches epmd, then the broker, and waits for an AMQP handshake.
func (r *RabbitMQ) start() error {
	if err := r.writeFiles(); err != nil {
		return fmt.Errorf("write broker files: %w", err)
	}
	if err := r.startEPMD(); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(r.dir, "rabbitmq-server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(r.bin)
	cmd.Dir = r.dir
	cmd.Env = r.env()
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group: the script, beam.smp and its helpers
	// (erl_child_setup, inet_gethost, the disk monitor's sh) are killed
	// together.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()

	limit := time.Now().Add(rabbitStartTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("rabbitmq-server exited during start: %s", r.logTail())
		default:
		}
		if err := r.handshake(); err == nil {
			return nil
		} else if time.Now().After(limit) {
			return fmt.Errorf("no AMQP handshake on %s within %v (last: %v): %s", r.Addr(), rabbitStartTimeout, err, r.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startEPMD starts this broker's own epmd in the foreground (so it is our
// child and its pid is known) and waits until it accepts connections.
func (r *RabbitMQ) startEPMD() error {
	log, err := os.OpenFile(filepath.Join(r.dir, "epmd.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(r.epmd, "-port", strconv.Itoa(r.epmdPort), "-address", "127.0.0.1")
	cmd.Dir = r.dir
	cmd.Env = r.env()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start epmd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.epmdCmd, r.epmdDone = cmd, done
	r.mu.Unlock()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.epmdPort))
	limit := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(r.dir, "epmd.out"))
			return fmt.Errorf("epmd exited during start: %s", b)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(limit) {
			return fmt.Errorf("epmd did not listen on %s within 10s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handshake opens and closes one AMQP connection as guest.
func (r *RabbitMQ) handshake() error {
	c, err := amqp.DialConfig(r.URL(), amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			return net.DialTimeout(network, addr, 2*time.Second)
		},
	})
	if err != nil {
		return err
	}
	return c.Close()
}

func (r *RabbitMQ) logTail() string {
	var b strings.Builder
	for _, f := range []string{"rabbitmq-server.out", filepath.Join("log", r.node+".log")} {
		data, err := os.ReadFile(filepath.Join(r.dir, f))
		if err != nil {
			continue
		}
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "\n--- %s:\n%s", f, data)
	}
	if b.Len() == 0 {
		return "(no log)"
	}
	return b.String()
}

// URL is the AMQP URL for guest on this broker's default vhost.
func (r *RabbitMQ) URL() string {
	return (&url.URL{Scheme: "amqp", User: url.UserPassword("guest", "guest"), Host: r.Addr(), Path: "/"}).String()
}

// Addr is the AMQP listener's host:port on 127.0.0.1.
func (r *RabbitMQ) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.amqpPort)) }

// Node is the broker's Erlang node name (name@localhost).
func (r *RabbitMQ) Node() string { return r.node }

// Dir is the broker's temp dir (config, mnesia/, log/, home/).
func (r *RabbitMQ) Dir() string { return r.dir }

// Pids are the pids of the broker's start script (its process group
// leader) and of its epmd; 0 when not running.
func (r *RabbitMQ) Pids() (broker, epmd int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		broker = r.cmd.Process.Pid
	}
	if r.epmdCmd != nil {
		epmd = r.epmdCmd.Process.Pid
	}
	return broker, epmd
}

// kill SIGKILLs the broker's process group and then its epmd, and waits
// until all of them are gone. No-op for what is not running.
func (r *RabbitMQ) kill() {
	r.mu.Lock()
	cmd, done, ecmd, edone := r.cmd, r.done, r.epmdCmd, r.epmdDone
	r.cmd, r.epmdCmd = nil, nil
	r.mu.Unlock()
	if cmd != nil {
		// The data dir is thrown away, so there is nothing a graceful
		// shutdown (about 2.5 s) would save.
		killGroup(r.t, "rabbitmq-server", cmd.Process.Pid, done)
	}
	if ecmd != nil {
		killGroup(r.t, "epmd", ecmd.Process.Pid, edone)
	}
}

// killGroup SIGKILLs the process group pgid, waits for its leader (done is
// closed when it has been reaped) and then until no live process of the
// group is left. beam.smp's helpers (erl_child_setup, inet_gethost) are
// reparented to init when beam dies; they count as gone once they are
// zombies, since init may take a second or two to reap them.
func killGroup(t testing.TB, what string, pgid int, done <-chan struct{}) {
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Logf("testenv: kill %s group %d: %v", what, pgid, err)
	}
	<-done
	limit := time.Now().Add(10 * time.Second)
	for {
		live := liveGroupMembers(pgid)
		if len(live) == 0 {
			return
		}
		if time.Now().After(limit) {
			t.Errorf("testenv: processes %v of %s group %d still alive 10s after SIGKILL", live, what, pgid)
			return
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		time.Sleep(20 * time.Millisecond)
	}
}

// liveGroupMembers returns the pids of the processes in process group pgid
// that are not zombies (Linux: from /proc/PID/stat).
func liveGroupMembers(pgid int) []int {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil // fast path: no process at all, not even a zombie
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var live []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may contain spaces and ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			live = append(live, pid)
		}
	}
	return live
}

// Stop kills the broker and its epmd and waits until they are gone.
// t.Cleanup calls it; calling it again is a no-op.
func (r *RabbitMQ) Stop() { r.kill() }

// Kill9 SIGKILLs the broker (a crash: nothing is flushed beyond what the
// broker had made durable) and its epmd, and waits until they are gone.
func (r *RabbitMQ) Kill9() { r.kill() }

// Restart starts a killed or stopped broker again: the same node, data
// directory (durable queues and persistent messages it had confirmed
// survive) and ports. It fails the test if the broker does not come up.
func (r *RabbitMQ) Restart() {
	r.t.Helper()
	r.kill()
	start := time.Now()
	if err := r.start(); err != nil {
		r.kill()
		r.t.Fatalf("testenv: rabbitmq-server did not restart: %v", err)
	}
	r.t.Logf("testenv: rabbitmq %s on %s restarted in %v", r.node, r.Addr(), time.Since(start).Round(10*time.Millisecond))
}

// DeclareQueues declares durable queues on the broker's default exchange
// (each bound by its own name).
func (r *RabbitMQ) DeclareQueues(t testing.TB, queues ...string) {
	t.Helper()
	conn, err := amqp.Dial(r.URL())
	if err != nil {
		t.Fatalf("testenv: rabbitmq: dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("testenv: rabbitmq: channel: %v", err)
	}
	defer ch.Close()
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatalf("testenv: rabbitmq: declare %s: %v", q, err)
		}
	}
}
