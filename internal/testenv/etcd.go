package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The etcd server the tests start is built from go.etcd.io/etcd/server/v3
// (internal/etcdserver calls its etcdmain) at the version go.mod pins, the
// same release as the go.etcd.io/etcd/client/v3 the code uses: one version
// for server and client, and no system package to install.

// Raft timing of test clusters: short, so elections take well under a
// second, yet long enough that a busy CI machine does not see spurious
// elections.
const (
	EtcdHeartbeat       = 50 * time.Millisecond
	EtcdElectionTimeout = 500 * time.Millisecond
)

// etcdStartTimeout bounds a cluster's start: every member up and one
// leader that all of them follow.
const etcdStartTimeout = 30 * time.Second

// BuildEtcd builds internal/etcdserver (etcd's server at the pinned
// version) and returns the binary's path. The binary is built once per
// machine and version: into a directory under the system temp dir named
// after the etcd server module's version and the Go toolchain, written
// under a temporary name and renamed into place, so concurrent test
// binaries share it and none sees a half-written file.
func BuildEtcd(t testing.TB) string {
	t.Helper()
	etcdBuild.Do(func() { etcdBin, etcdBuildErr = buildEtcd(t) })
	if etcdBuildErr != nil {
		t.Fatalf("go build ./internal/etcdserver: %v", etcdBuildErr)
	}
	return etcdBin
}

var (
	etcdBuild    sync.Once
	etcdBin      string
	etcdBuildErr error
)

func buildEtcd(t testing.TB) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go"
	}
	version := "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "go.etcd.io/etcd/server/v3" {
				version = d.Version
			}
		}
	}
	dir := filepath.Join(os.TempDir(), "starlease-etcd-"+version+"-"+runtime.Version())
	bin := filepath.Join(dir, "etcd")
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() && version != "unknown" {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "etcd."+randomHex(6))
	start := time.Now()
	cmd := exec.Command(goTool, "build", "-o", tmp, "github.com/starintel/starlease/internal/etcdserver")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("%v\n%s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	t.Logf("testenv: built etcd server in %v", time.Since(start).Round(10*time.Millisecond))
	return bin, nil
}

// EtcdCluster is a running multi-member etcd cluster on 127.0.0.1: one
// process per member, each with its own data dir in a t.TempDir() and its
// own client and peer ports. Every member is killed and waited for in
// t.Cleanup.
type EtcdCluster struct {
	t       testing.TB
	bin     string
	token   string
	members []*EtcdMember
	peers   *peerNet
	proxies []*peerProxy
}

// EtcdMember is one member of an EtcdCluster.
type EtcdMember struct {
	t          testing.TB
	bin        string
	name       string
	dir        string // data dir is dir/data, log is dir/etcd.log
	clientPort int
	peerPort   int // etcd listens here
	proxyPort  int // and advertises this: its peerProxy
	args       []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

// StartEtcdCluster starts an n-member cluster (--initial-cluster-state new,
// a unique --initial-cluster-token) and waits until every member is up and
// follows one leader.
func StartEtcdCluster(t testing.TB, n int) *EtcdCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartEtcdCluster(%d)", n)
	}
	bin := BuildEtcd(t)
	var lastErr error
	// A free port may be taken before a member binds it: start afresh
	// (new ports, dirs and token) a few times before giving up.
	for attempt := 0; attempt < 3; attempt++ {
		c, err := startEtcdCluster(t, bin, n)
		if err == nil {
			return c
		}
		lastErr = err
		t.Logf("testenv: etcd cluster attempt %d: %v", attempt+1, err)
	}
	t.Fatalf("testenv: etcd cluster did not start: %v", lastErr)
	return nil
}

func startEtcdCluster(t testing.TB, bin string, n int) (*EtcdCluster, error) {
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, fmt.Errorf("no free loopback ports: %v", err)
	}
	c := &EtcdCluster{t: t, bin: bin, token: "testenv-" + randomHex(8)}
	var initial []string
	for i := 0; i < n; i++ {
		m := &EtcdMember{t: t, bin: bin, name: fmt.Sprintf("m%d", i), dir: t.TempDir(),
			clientPort: ports[3*i], peerPort: ports[3*i+1], proxyPort: ports[3*i+2]}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.PeerURL())
	}
	for _, m := range c.members {
		m.args = []string{
			"--name", m.name,
			"--data-dir", filepath.Join(m.dir, "data"),
			"--listen-client-urls", m.ClientURL(),
			"--advertise-client-urls", m.ClientURL(),
			"--listen-peer-urls", m.listenPeerURL(),
			"--initial-advertise-peer-urls", m.PeerURL(),
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", c.token,
			"--heartbeat-interval", strconv.Itoa(int(EtcdHeartbeat / time.Millisecond)),
			"--election-timeout", strconv.Itoa(int(EtcdElectionTimeout / time.Millisecond)),
			"--log-level", "info",
			"--log-outputs", filepath.Join(m.dir, "etcd.log"),
		}
	}
	c.peers = newPeerNet(t, n, func(i int) int { return c.members[i].Pid() })
	t.Cleanup(c.Stop)
	for i, m := range c.members {
		p, err := c.peers.listen(i, net.JoinHostPort("127.0.0.1", strconv.Itoa(m.proxyPort)),
			net.JoinHostPort("127.0.0.1", strconv.Itoa(m.peerPort)))
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("peer proxy of %s: %v", m.name, err)
		}
		c.proxies = append(c.proxies, p)
	}
	for _, m := range c.members {
		if err := m.start(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	start := time.Now()
	if _, err := c.waitLeader(etcdStartTimeout); err != nil {
		c.Stop()
		return nil, err
	}
	t.Logf("testenv: etcd cluster of %d (%s) has a leader %v after the last start",
		n, strings.Join(c.Endpoints(), " "), time.Since(start).Round(10*time.Millisecond))
	return c, nil
}

// Endpoints are the members' client URLs (http://127.0.0.1:PORT).
func (c *EtcdCluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.ClientURL())
	}
	return eps
}

// Size is the number of members.
func (c *EtcdCluster) Size() int { return len(c.members) }

// Member is member i (0-based).
func (c *EtcdCluster) Member(i int) *EtcdMember { return c.members[i] }

// Stop kills every member and waits for them, and closes the peer
// proxies. t.Cleanup calls it.
func (c *EtcdCluster) Stop() {
	for _, m := range c.members {
		m.kill()
	}
	for _, p := range c.proxies {
		p.close()
	}
	if c.peers != nil {
		c.peers.closeAll()
	}
}

// Isolate cuts member i off from the other members in both directions (a
// network partition of one): its open peer connections are reset and new
// ones refused, while it keeps running and serving its client port. Heal
// ends it.
func (c *EtcdCluster) Isolate(i int) { c.peers.isolate(i) }

// Heal lets member i reach the other members again.
func (c *EtcdCluster) Heal(i int) { c.peers.heal(i) }

// Client returns a v3 client on the given members' endpoints (all if none
// are given), closed in t.Cleanup. Its dial timeout is 2 s; requests
// block until their context ends.
func (c *EtcdCluster) Client(members ...int) *clientv3.Client {
	c.t.Helper()
	var eps []string
	if len(members) == 0 {
		eps = c.Endpoints()
	}
	for _, i := range members {
		eps = append(eps, c.members[i].ClientURL())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatalf("testenv: etcd client for %v: %v", eps, err)
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// memberStatus is what one member says about itself.
type memberStatus struct {
	id, leader, term uint64
	err              error
}

// statuses asks every running, unpaused member for its status (Status RPC,
// answered locally, without quorum), each within timeout.
func (c *EtcdCluster) statuses(timeout time.Duration) []memberStatus {
	out := make([]memberStatus, len(c.members))
	var wg sync.WaitGroup
	for i, m := range c.members {
		if !m.Running() || m.Paused() {
			out[i].err = errors.New("not running")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = m.status(timeout)
		}()
	}
	wg.Wait()
	return out
}

// Leader returns the index of the leader: the member that says it leads,
// in the highest term any member reports, and whom a majority of the
// cluster (itself included) names as leader. It returns -1 if there is
// none (no quorum, an election under way).
func (c *EtcdCluster) Leader() int {
	st := c.statuses(time.Second)
	var maxTerm uint64
	for _, s := range st {
		if s.err == nil && s.term > maxTerm {
			maxTerm = s.term
		}
	}
	for i, s := range st {
		if s.err != nil || s.leader == 0 || s.leader != s.id || s.term != maxTerm {
			continue
		}
		votes := 0
		for _, o := range st {
			if o.err == nil && o.leader == s.id {
				votes++
			}
		}
		if votes > len(c.members)/2 {
			return i
		}
	}
	return -1
}

// WaitLeader waits up to timeout for a leader (see Leader) and returns its
// index and how long it took; it fails the test if none comes.
func (c *EtcdCluster) WaitLeader(timeout time.Duration) (int, time.Duration) {
	c.t.Helper()
	start := time.Now()
	i, err := c.waitLeader(timeout)
	if err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
	return i, time.Since(start)
}

func (c *EtcdCluster) waitLeader(timeout time.Duration) (int, error) {
	limit := time.Now().Add(timeout)
	for {
		for _, m := range c.members {
			if m.crashed() {
				return -1, fmt.Errorf("etcd %s exited: %s", m.name, m.LogTail())
			}
		}
		if i := c.Leader(); i >= 0 {
			return i, nil
		}
		if time.Now().After(limit) {
			var b strings.Builder
			for i, s := range c.statuses(time.Second) {
				fmt.Fprintf(&b, "\n%s: id %x leader %x term %d err %v", c.members[i].name, s.id, s.leader, s.term, s.err)
			}
			return -1, fmt.Errorf("no etcd leader within %v:%s", timeout, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Name is the member's --name (m0, m1, ...).
func (m *EtcdMember) Name() string { return m.name }

// ClientURL is the member's client URL on 127.0.0.1.
func (m *EtcdMember) ClientURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort))
}

// PeerURL is the member's advertised peer URL on 127.0.0.1: its peer
// proxy's, which the other members dial (see EtcdCluster.Isolate).
func (m *EtcdMember) PeerURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.proxyPort))
}

func (m *EtcdMember) listenPeerURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.peerPort))
}

// Dir holds the member's data dir (Dir()/data) and log (Dir()/etcd.log).
func (m *EtcdMember) Dir() string { return m.dir }

// Pid is the member's process id, 0 if it is not running.
func (m *EtcdMember) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Running reports whether the member's process was started and has not
// been killed, stopped or exited.
func (m *EtcdMember) Running() bool {
	m.mu.Lock()
	cmd := m.cmd
	m.mu.Unlock()
	return cmd != nil && !m.exited()
}

// Paused reports whether the member is stopped by Pause.
func (m *EtcdMember) Paused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused
}

// crashed reports whether the member exited by itself: it was started and
// not killed or stopped, yet its process is gone.
func (m *EtcdMember) crashed() bool {
	m.mu.Lock()
	cmd := m.cmd
	m.mu.Unlock()
	return cmd != nil && m.exited()
}

func (m *EtcdMember) exited() bool {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func (m *EtcdMember) status(timeout time.Duration) memberStatus {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL()}, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return memberStatus{err: err}
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := cli.Status(ctx, m.ClientURL())
	if err != nil {
		return memberStatus{err: err}
	}
	return memberStatus{id: r.Header.MemberId, leader: r.Leader, term: r.RaftTerm}
}

// start launches the member and waits until its client port accepts
// connections (etcd binds it before it has joined; whether it serves
// requests depends on the cluster having a leader).
func (m *EtcdMember) start() error {
	cmd := exec.Command(m.bin, m.args...)
	cmd.Dir = m.dir
	cmd.Env = os.Environ()
	// Own process group: a terminal's signals are not the test's business.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done, m.paused = cmd, done, false
	m.mu.Unlock()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort))
	limit := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("etcd %s exited during start: %s", m.name, m.LogTail())
		default:
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(limit) {
			m.kill()
			return fmt.Errorf("etcd %s did not listen on %s within 20s: %s", m.name, addr, m.LogTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LogTail is the end of the member's log.
func (m *EtcdMember) LogTail() string {
	b, err := os.ReadFile(filepath.Join(m.dir, "etcd.log"))
	if err != nil {
		return "(no log)"
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// kill SIGKILLs the member (paused or not) and waits for it; no-op if it
// is not running.
func (m *EtcdMember) kill() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd, m.paused = nil, false
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	killGroup(m.t, "etcd "+m.name, cmd.Process.Pid, done)
}

// Kill SIGKILLs the member, as a crash would, and waits for it to exit.
func (m *EtcdMember) Kill() { m.t.Helper(); m.kill() }

// Stop shuts the member down with SIGTERM (SIGKILL after 10 s) and waits
// for it to exit.
func (m *EtcdMember) Stop() {
	m.t.Helper()
	m.mu.Lock()
	cmd, done, paused := m.cmd, m.done, m.paused
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	if paused {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		m.t.Logf("testenv: etcd %s ignored SIGTERM for 10s; killing it", m.name)
	}
	m.kill()
}

// Pause stops the member with SIGSTOP: it neither sends nor answers
// anything, and its connections stay open. Resume continues it.
func (m *EtcdMember) Pause() { m.t.Helper(); m.signal(syscall.SIGSTOP, true) }

// Resume continues a member stopped by Pause (SIGCONT).
func (m *EtcdMember) Resume() { m.t.Helper(); m.signal(syscall.SIGCONT, false) }

func (m *EtcdMember) signal(sig syscall.Signal, paused bool) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		m.t.Fatalf("testenv: signal %v to etcd %s, which is not running", sig, m.name)
	}
	if err := syscall.Kill(-m.cmd.Process.Pid, sig); err != nil {
		m.t.Fatalf("testenv: signal %v to etcd %s: %v", sig, m.name, err)
	}
	m.paused = paused
}

// Restart starts the member again (killing it first if it still runs)
// with the same name, data dir and ports, and waits until it listens. It
// does not wait for a leader: with quorum lost there is none
// (EtcdCluster.WaitLeader waits for one).
func (m *EtcdMember) Restart() {
	m.t.Helper()
	m.kill()
	if err := m.start(); err != nil {
		m.kill()
		m.t.Fatalf("testenv: restart etcd %s: %v", m.name, err)
	}
}
