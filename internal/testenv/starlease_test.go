package testenv

import (
	"net/http"
	"os"
	"strings"
	"testing"
)

func TestStarlease(t *testing.T) {
	bin := BuildStarlease(t)
	s := StartStarlease(t, bin)
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") || s.URL() != "http://"+s.Addr() {
		t.Fatalf("URL %q, Addr %q", s.URL(), s.Addr())
	}
	fi, err := os.Stat(s.PepperFile())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("pepper file mode %v", fi.Mode().Perm())
	}
	if b, err := os.ReadFile(s.PepperFile()); err != nil || string(b) != s.Pepper()+"\n" || len(s.Pepper()) != 64 {
		t.Errorf("pepper file %q (%v), Pepper %q", b, err, s.Pepper())
	}
	if fi, err := os.Stat(s.DataDir()); err != nil || !fi.IsDir() {
		t.Errorf("data directory: %v", err)
	}

	key, id := s.CreateKey("prn-testenv", "api_client", "targets:lease", "tenant:t,program:p")
	if m := APIKeyRE.FindStringSubmatch(key); m == nil || m[1] != id {
		t.Fatalf("CreateKey: key %q, id %q", key, id)
	}
	authorized := func(key string) int {
		req, err := http.NewRequest("GET", s.URL()+"/api/v1/target-leases?tenant_id=t&program_id=p", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := authorized(key); code == http.StatusUnauthorized {
		t.Fatalf("a new key is refused: %d", code)
	}
	key2, id2 := s.RotateKey(id)
	if id2 == id || key2 == key {
		t.Fatalf("RotateKey returned the old key")
	}
	if code := authorized(key); code != http.StatusUnauthorized {
		t.Errorf("a rotated-out key answers %d", code)
	}
	s.RevokeKey(id2)
	if code := authorized(key2); code != http.StatusUnauthorized {
		t.Errorf("a revoked key answers %d", code)
	}
	if len(s.Stderr()) == 0 && len(s.Stdout()) == 0 {
		t.Errorf("no server output captured")
	}
	if err := s.Stop(); err != nil {
		t.Errorf("Stop: %v\n%s", err, s.Stderr())
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}
