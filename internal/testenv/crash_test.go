package testenv

import (
	"net/http"
	"testing"
	"time"
)

// Kill crashes the server; StartAgain brings it back on its data directory
// (a key created before still works) on a new port; Retarget points a
// proxy at it.
func TestKillStartAgainRetarget(t *testing.T) {
	s := StartStarlease(t, BuildStarlease(t))
	key, _ := s.CreateKey("prn-crash", "api_client", "targets:lease", "tenant:t,program:p")
	p := StartProxy(t, s.Addr())
	status := func(base, key string) int {
		c := &http.Client{Timeout: 2 * time.Second}
		req, err := http.NewRequest("GET", base+"/api/v1/target-leases?tenant_id=t&program_id=p", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("http://"+p.Addr(), key); got != http.StatusOK {
		t.Fatalf("through the proxy: %d", got)
	}
	old := s.Addr()
	s.Kill()
	if err := s.Stop(); err == nil {
		t.Fatal("a killed server reports a clean exit")
	}
	if got := status("http://"+p.Addr(), key); got != 0 {
		t.Fatalf("killed server answered %d", got)
	}
	s.StartAgain()
	if s.Addr() == old {
		t.Logf("started again on the same port %s", old)
	}
	p.Retarget(s.Addr())
	if got := status("http://"+p.Addr(), key); got != http.StatusOK {
		t.Fatalf("after StartAgain and Retarget: %d", got)
	}
}
