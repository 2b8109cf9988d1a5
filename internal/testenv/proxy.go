package testenv

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Stream is the direction a toxic acts on, seen from the client:
// Upstream is client → server (requests), Downstream is server → client
// (replies).
type Stream string

// The two directions of a proxied connection.
const (
	Upstream   Stream = "upstream"
	Downstream Stream = "downstream"
)

// lingerToxic is the name of the dormant toxic every proxy carries; see
// StartProxy.
const lingerToxic = "testenv_linger"

// Proxy is a fault-injecting TCP proxy on 127.0.0.1 in front of one
// upstream address: toxiproxy (github.com/Shopify/toxiproxy/v2) embedded as
// a library, with no HTTP API and no logging. It is stopped in t.Cleanup.
//
// Toxics apply to connections already open and to new ones. Every close
// the proxy makes is a reset (TCP RST), not an orderly FIN: StartProxy
// installs a dormant reset_peer toxic (toxicity 0, so it never fires),
// which makes toxiproxy set SO_LINGER 0 on both ends of every connection
// it accepts afterwards.
type Proxy struct {
	t testing.TB
	p *toxiproxy.Proxy

	mu    sync.Mutex
	added map[string]bool
}

// StartProxy starts a proxy on a random loopback port to upstream.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	tp := toxiproxy.NewProxy(srv, "testenv_"+strings.ReplaceAll(t.Name(), "/", "_"), "127.0.0.1:0", upstream)
	if err := tp.Start(); err != nil {
		t.Fatalf("testenv: start proxy: %v", err)
	}
	p := &Proxy{t: t, p: tp, added: map[string]bool{}}
	t.Cleanup(p.Stop)
	p.add(lingerToxic, "reset_peer", Upstream, 0, map[string]any{"timeout": 0})
	return p
}

// Addr is the proxy's listening host:port.
func (p *Proxy) Addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// AddToxic adds a toxic (toxiproxy's type names: "latency", "timeout",
// "reset_peer", "limit_data", "slicer", "bandwidth", "slow_close") on one
// direction, always firing, with its attributes, e.g.
// AddToxic("lag", "latency", Downstream, map[string]any{"latency": 500}).
// It takes effect on open connections at once.
func (p *Proxy) AddToxic(name, kind string, dir Stream, attrs map[string]any) {
	p.t.Helper()
	p.add(name, kind, dir, 1, attrs)
}

func (p *Proxy) add(name, kind string, dir Stream, toxicity float32, attrs map[string]any) {
	p.t.Helper()
	body, err := json.Marshal(map[string]any{"name": name, "type": kind, "stream": string(dir),
		"toxicity": toxicity, "attributes": attrs})
	if err != nil {
		p.t.Fatalf("testenv: toxic %s: %v", name, err)
	}
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		p.t.Fatalf("testenv: add toxic %s: %v", name, err)
	}
	p.mu.Lock()
	p.added[name] = true
	p.mu.Unlock()
}

// RemoveToxic removes a toxic added by AddToxic. Data a latency toxic
// holds is delivered at once; a timeout toxic closes the connections it
// held (toxiproxy's cleanup), as a partition that heals by reset would.
func (p *Proxy) RemoveToxic(name string) {
	p.t.Helper()
	if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		p.t.Fatalf("testenv: remove toxic %s: %v", name, err)
	}
	p.mu.Lock()
	delete(p.added, name)
	p.mu.Unlock()
}

// Clear removes every toxic added by AddToxic.
func (p *Proxy) Clear() {
	p.t.Helper()
	p.mu.Lock()
	names := make([]string, 0, len(p.added))
	for n := range p.added {
		if n != lingerToxic {
			names = append(names, n)
		}
	}
	p.mu.Unlock()
	for _, n := range names {
		p.RemoveToxic(n)
	}
}

// Cut closes (resets) every proxied connection and stops listening, so new
// connections are refused: the server is unreachable, as if down.
func (p *Proxy) Cut() { p.p.Stop() }

// Restore listens again on the same address after Cut.
func (p *Proxy) Restore() {
	p.t.Helper()
	// Another listener may have taken the port meanwhile: reported as a
	// test environment failure.
	if err := p.p.Start(); err != nil {
		p.t.Fatalf("testenv: restore proxy on %s: %v", p.Addr(), err)
	}
}

// Stop stops the proxy and closes its connections. t.Cleanup calls it.
func (p *Proxy) Stop() { p.p.Stop() }
