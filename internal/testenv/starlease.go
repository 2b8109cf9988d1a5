package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BuildStarlease builds cmd/starlease into a temporary directory of t and
// returns the binary's path. The Go build cache makes repeated builds fast.
func BuildStarlease(t testing.TB) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "starlease")
	cmd := exec.Command(goTool, "build", "-o", bin, "github.com/starintel/starlease/cmd/starlease")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/starlease: %v\n%s", err, out)
	}
	return bin
}

// CleanEnv is the environment without STARLEASE_* variables, so the flags
// given to a starlease process are its whole configuration.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STARLEASE_") {
			env = append(env, kv)
		}
	}
	return env
}

// Buffer collects a process's output; it is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// Bytes returns a copy of what was written so far.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.b.Bytes())
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Starlease is a running "starlease serve" process.
type Starlease struct {
	t          testing.TB
	bin        string
	dataDir    string
	pepperFile string
	pepper     string
	addr       string
	// backendArgs are the serve flags that name the backend; the keys
	// command needs them too, since the credentials live in the backend.
	backendArgs []string
	extraArgs   []string

	stdout, stderr *Buffer
	cmd            *exec.Cmd
	exited         chan struct{}
	exitErr        error

	mu         sync.Mutex
	principals map[string]string // credential id → principal, of keys created here
}

// StartStarlease starts "bin serve" on a free 127.0.0.1 port with a new
// data directory (or the one extraArgs name with --data-dir) and a new
// pepper file (mode 0600), plus extraArgs, and
// waits for GET /readyz 200. The server is stopped with SIGTERM (SIGKILL
// after 15 s) and waited for in t.Cleanup, which also logs the tail of its
// stderr if t failed.
func StartStarlease(t testing.TB, bin string, extraArgs ...string) *Starlease {
	t.Helper()
	dir := t.TempDir()
	s := &Starlease{t: t, bin: bin, dataDir: filepath.Join(dir, "data"), pepperFile: filepath.Join(dir, "pepper"),
		extraArgs: extraArgs, principals: map[string]string{}}
	for i := 0; i+1 < len(extraArgs); i += 2 {
		if extraArgs[i] == "--data-dir" { // e.g. on a tmpfs; the keys commands need it too
			s.dataDir = extraArgs[i+1]
		}
		if extraArgs[i] == "--backend" || strings.HasPrefix(extraArgs[i], "--valkey-") {
			s.backendArgs = append(s.backendArgs, extraArgs[i], extraArgs[i+1])
		}
	}
	s.pepper = randomHex(32)
	if err := os.WriteFile(s.pepperFile, []byte(s.pepper+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before serve binds it
		if lastErr = s.start(extraArgs); lastErr == nil {
			t.Cleanup(func() {
				if t.Failed() {
					tail := s.stderr.Bytes()
					if len(tail) > 6000 {
						tail = tail[len(tail)-6000:]
					}
					t.Logf("starlease serve stderr (tail):\n%s", tail)
				}
				_ = s.Stop()
			})
			return s
		}
	}
	t.Fatalf("starlease serve did not start: %v", lastErr)
	return nil
}

func (s *Starlease) start(extra []string) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	args := append([]string{"serve", "--data-dir", s.dataDir, "--pepper-file", s.pepperFile, "--listen", s.addr}, extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Env = CleanEnv()
	s.stdout, s.stderr = &Buffer{}, &Buffer{}
	cmd.Stdout, cmd.Stderr = s.stdout, s.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.exited, s.exitErr = cmd, make(chan struct{}), nil
	go func() { s.exitErr = cmd.Wait(); close(s.exited) }()
	for limit := time.Now().Add(15 * time.Second); ; time.Sleep(25 * time.Millisecond) {
		select {
		case <-s.exited:
			return fmt.Errorf("exited during start (%v): %s", s.exitErr, s.stderr.Bytes())
		default:
		}
		if resp, err := http.Get(s.URL() + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(limit) {
			_ = s.Stop()
			return fmt.Errorf("GET /readyz not 200 within 15 s: %s", s.stderr.Bytes())
		}
	}
}

// Stop sends SIGTERM and waits for the server to exit (SIGKILL after
// 15 s). It returns nil exactly when the process exited with status 0 —
// by itself after SIGTERM, or before Stop was called. Stop may be called
// more than once; later calls return the same result.
func (s *Starlease) Stop() error {
	select {
	case <-s.exited:
		return s.exitErr
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	return s.exitErr
}

// Restart stops the server (SIGTERM) and starts it again with the same
// data directory, pepper file and flags, on a new port. The stopped
// process must have exited cleanly.
func (s *Starlease) Restart() {
	s.t.Helper()
	if err := s.Stop(); err != nil {
		s.t.Fatalf("starlease serve did not stop cleanly: %v", err)
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = s.start(s.extraArgs); err == nil {
			return
		}
	}
	s.t.Fatalf("starlease serve did not restart: %v", err)
}

// URL is the server's base URL, "http://127.0.0.1:port".
func (s *Starlease) URL() string { return "http://" + s.addr }

// Addr is the server's listen address, "127.0.0.1:port".
func (s *Starlease) Addr() string { return s.addr }

// DataDir is the server's data directory.
func (s *Starlease) DataDir() string { return s.dataDir }

// Pid is the process id of the server last started.
func (s *Starlease) Pid() int { return s.cmd.Process.Pid }

// PepperFile is the path of the server's pepper file.
func (s *Starlease) PepperFile() string { return s.pepperFile }

// Pepper is the content of the pepper file (64 hex characters).
func (s *Starlease) Pepper() string { return s.pepper }

// Stdout is what the server has written to stdout so far.
func (s *Starlease) Stdout() []byte { return s.stdout.Bytes() }

// Stderr is what the server has written to stderr so far.
func (s *Starlease) Stderr() []byte { return s.stderr.Bytes() }

// RunCLI runs the starlease binary with args (and a clean environment) and
// returns its stdout; a non-zero exit fails the test.
func (s *Starlease) RunCLI(args ...string) []byte {
	s.t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = CleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("starlease %s: %v\n%s", args[0], err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// APIKeyRE matches an API key; the groups are the credential id and the
// secret.
var APIKeyRE = regexp.MustCompile(`^star_sk_v1_([0-9A-HJKMNP-TV-Z]{26})_([0-9a-f]{64})$`)

// CreateKey runs "starlease keys create" against the server's credentials
// (its data directory and backend flags) while it runs, checks what it
// printed, and returns the API key and its credential id. extra is added
// to the command line (e.g. "--ttl", "1h").
func (s *Starlease) CreateKey(principal, class, caps, scope string, extra ...string) (apiKey, credentialID string) {
	s.t.Helper()
	args := append([]string{"keys", "create", "--data-dir", s.dataDir, "--pepper-file", s.pepperFile,
		"--principal", principal, "--class", class, "--capabilities", caps, "--scope", scope}, s.backendArgs...)
	args = append(args, extra...)
	out := s.RunCLI(args...)
	var got struct {
		APIKey     string `json:"api_key"`
		Credential struct {
			CredentialID string `json:"credential_id"`
			PrincipalID  string `json:"principal_id"`
			Class        string `json:"class"`
		} `json:"credential"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		s.t.Fatalf("keys create output does not decode: %v", err)
	}
	m := APIKeyRE.FindStringSubmatch(got.APIKey)
	if m == nil || m[1] != got.Credential.CredentialID || got.Credential.PrincipalID != principal || got.Credential.Class != class {
		s.t.Fatalf("keys create printed an unexpected key or credential (principal %q class %q id %q)",
			got.Credential.PrincipalID, got.Credential.Class, got.Credential.CredentialID)
	}
	s.mu.Lock()
	s.principals[m[1]] = principal
	s.mu.Unlock()
	return got.APIKey, m[1]
}

// RevokeKey runs "starlease keys revoke" for credential id.
func (s *Starlease) RevokeKey(id string) {
	s.t.Helper()
	s.RunCLI(append([]string{"keys", "revoke", "--data-dir", s.dataDir, "--id", id}, s.backendArgs...)...)
}

// RotateKey runs "starlease keys rotate" for credential id, checks that it
// revoked id and issued a key for the same principal (when id was created
// by CreateKey or RotateKey), and returns the new key and credential id.
func (s *Starlease) RotateKey(id string) (apiKey, credentialID string) {
	s.t.Helper()
	out := s.RunCLI(append([]string{"keys", "rotate", "--data-dir", s.dataDir, "--pepper-file", s.pepperFile, "--id", id}, s.backendArgs...)...)
	var got struct {
		APIKey     string `json:"api_key"`
		Credential struct {
			CredentialID string `json:"credential_id"`
			PrincipalID  string `json:"principal_id"`
		} `json:"credential"`
		Revoked string `json:"revoked"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		s.t.Fatalf("keys rotate output does not decode: %v", err)
	}
	s.mu.Lock()
	principal, known := s.principals[id]
	s.mu.Unlock()
	m := APIKeyRE.FindStringSubmatch(got.APIKey)
	if m == nil || m[1] != got.Credential.CredentialID || got.Revoked != id || (known && got.Credential.PrincipalID != principal) {
		s.t.Fatalf("keys rotate printed an unexpected key or credential (id %q, revoked %q)", got.Credential.CredentialID, got.Revoked)
	}
	s.mu.Lock()
	s.principals[m[1]] = got.Credential.PrincipalID
	s.mu.Unlock()
	return got.APIKey, m[1]
}
