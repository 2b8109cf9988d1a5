package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// peerNet carries an EtcdCluster's peer traffic: every member advertises
// the address of its own peerProxy, which forwards to the member's real
// peer port, so a member dials the proxy of the member it talks to. Each
// proxy finds which member dialed a connection by the process that owns
// the other end (Linux: /proc/net/tcp and /proc/PID/fd), so it can cut one
// member's links in both directions, which a plain TCP proxy in front of
// each member cannot: raft messages from B to A also flow on a stream A
// dialed to B, and lease renewals a follower forwards to the leader carry
// no sender header.
type peerNet struct {
	t     testing.TB
	pidOf func(member int) int // 0 if not running
	n     int

	mu       sync.Mutex
	isolated map[int]bool
	conns    map[*peerConn]bool
}

type peerConn struct {
	from, to   int // member indexes; from is -1 if unknown
	down, upst net.Conn
}

type peerProxy struct {
	net    *peerNet
	to     int
	l      net.Listener
	target string
}

func newPeerNet(t testing.TB, n int, pidOf func(int) int) *peerNet {
	return &peerNet{t: t, n: n, pidOf: pidOf, isolated: map[int]bool{}, conns: map[*peerConn]bool{}}
}

// listen starts member to's proxy on addr, forwarding to target.
func (n *peerNet) listen(to int, addr, target string) (*peerProxy, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &peerProxy{net: n, to: to, l: l, target: target}
	go p.serve()
	return p, nil
}

func (p *peerProxy) close() { _ = p.l.Close() }

func (p *peerProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

// socketInode returns the inode of the TCP socket bound to
// 127.0.0.1:localPort and connected to 127.0.0.1:remotePort, or "".
func socketInode(localPort, remotePort int) string {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return ""
	}
	local := fmt.Sprintf("0100007F:%04X", localPort)
	remote := fmt.Sprintf("0100007F:%04X", remotePort)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 10 && f[1] == local && f[2] == remote {
			return f[9]
		}
	}
	return ""
}

// ownsSocket reports whether process pid has socket inode open.
func ownsSocket(pid int, inode string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := "socket:[" + inode + "]"
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
			return true
		}
	}
	return false
}

// dialer returns the member that dialed c, or -1 if none is found.
func (n *peerNet) dialer(c net.Conn) int {
	la, lok := c.LocalAddr().(*net.TCPAddr)
	ra, rok := c.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return -1
	}
	inode := socketInode(ra.Port, la.Port)
	if inode == "" || inode == "0" {
		return -1
	}
	for i := 0; i < n.n; i++ {
		if pid := n.pidOf(i); pid > 0 && ownsSocket(pid, inode) {
			return i
		}
	}
	return -1
}

// blocked reports whether a connection from member from (-1: not known)
// to member to is cut. With any member isolated, a connection whose
// dialer is not known is cut too: it might be the isolated member's.
func (n *peerNet) blocked(from, to int) bool {
	if from < 0 {
		return len(n.isolated) > 0
	}
	return n.isolated[from] || n.isolated[to]
}

func (p *peerProxy) handle(down net.Conn) {
	n := p.net
	from := n.dialer(down)
	n.mu.Lock()
	if n.blocked(from, p.to) {
		n.mu.Unlock()
		_ = down.Close()
		return
	}
	n.mu.Unlock()

	upst, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		_ = down.Close()
		return
	}
	pc := &peerConn{from: from, to: p.to, down: down, upst: upst}
	n.mu.Lock()
	// Isolated meanwhile: Isolate closed the connections it saw.
	if n.blocked(from, p.to) {
		n.mu.Unlock()
		pc.close()
		return
	}
	n.conns[pc] = true
	n.mu.Unlock()

	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(upst, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, upst); done <- struct{}{} }()
	<-done
	pc.close()
	<-done
	n.mu.Lock()
	delete(n.conns, pc)
	n.mu.Unlock()
}

func (pc *peerConn) close() {
	_ = pc.down.Close()
	_ = pc.upst.Close()
}

// isolate cuts member i off from every other member in both directions:
// open peer connections to or from it are closed and new ones refused.
func (n *peerNet) isolate(i int) {
	n.mu.Lock()
	n.isolated[i] = true
	var cut []*peerConn
	for pc := range n.conns {
		// Unknown dialers too: they might be i's.
		if pc.to == i || pc.from == i || pc.from < 0 {
			cut = append(cut, pc)
		}
	}
	n.mu.Unlock()
	for _, pc := range cut {
		pc.close()
	}
}

// heal lets member i's peer connections through again.
func (n *peerNet) heal(i int) {
	n.mu.Lock()
	delete(n.isolated, i)
	n.mu.Unlock()
}

// dialers counts the open peer connections whose dialing member is known
// and those whose is not.
func (n *peerNet) dialers() (known, unknown int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for pc := range n.conns {
		if pc.from < 0 {
			unknown++
		} else {
			known++
		}
	}
	return known, unknown
}

// closeAll resets every open peer connection.
func (n *peerNet) closeAll() {
	n.mu.Lock()
	var all []*peerConn
	for pc := range n.conns {
		all = append(all, pc)
	}
	n.mu.Unlock()
	for _, pc := range all {
		pc.close()
	}
}
