package testenv

import (
	"syscall"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// Kill sends SIGKILL to the server's process group, as a crash would (no
// shutdown, nothing flushed that was not already), and waits for it to
// exit. StartAgain starts it again.
func (s *Starlease) Kill() {
	s.t.Helper()
	select {
	case <-s.exited:
		return
	default:
	}
	// serve runs in its own process group (Setpgid).
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// StartAgain starts the server after Kill (or any exit) with the same data
// directory, pepper file and flags, on a new port (Addr and URL change),
// and waits for GET /readyz 200. Unlike Restart it does not require a clean
// exit of the previous process.
func (s *Starlease) StartAgain() {
	s.t.Helper()
	select {
	case <-s.exited:
	default:
		s.t.Fatal("testenv: StartAgain while the server runs")
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = s.start(s.extraArgs); err == nil {
			return
		}
	}
	s.t.Fatalf("starlease serve did not start again: %v", err)
}

// Retarget points the proxy at upstream (e.g. a server started again on a
// new port), listening on the same address. Connections open through it are
// closed (reset); toxics stay.
func (p *Proxy) Retarget(upstream string) {
	p.t.Helper()
	if err := p.p.Update(&toxiproxy.Proxy{Listen: p.Addr(), Upstream: upstream, Enabled: true}); err != nil {
		p.t.Fatalf("testenv: retarget proxy to %s: %v", upstream, err)
	}
}
