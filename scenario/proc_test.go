//go:build linux

package scenario

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
)

// debugEnv, if set, makes the test log every actor's stderr (its executor
// and store logs), not only on failure.
const debugEnv = "STARLEASE_SCENARIO_DEBUG"

// actorProc is a running actor process.
type actorProc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	stderr *testenv.Buffer

	exited  chan struct{} // closed once the process has been waited for
	exitErr error
}

// startActor re-executes the test binary as an actor with cfg. The process
// is killed (SIGKILL works on a stopped process too) and waited for in
// t.Cleanup, and gets SIGKILL if the test process dies first.
func startActor(t *testing.T, cfg actorConfig) *actorProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable: %v", err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$") // TestMain runs the actor before any flag matters
	cmd.Env = append(testenv.CleanEnv(), actorEnv+"=1", configEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &actorProc{t: t, name: cfg.Name, cmd: cmd, events: make(chan event, 64), stderr: &testenv.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start actor %s: %v", cfg.Name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Event == "" {
				ev = event{Event: "stdout", Actor: cfg.Name, Error: sc.Text()}
			}
			p.events <- ev
		}
		p.exitErr = cmd.Wait() // after stdout is drained, as exec requires
		close(p.events)
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				t.Errorf("actor %s (pid %d) did not exit after SIGKILL", p.name, p.pid())
			}
		}
		if t.Failed() || os.Getenv(debugEnv) != "" {
			t.Logf("actor %s stderr (tail):\n%s", p.name, tail(p.stderr.String(), 8000))
		}
	})
	return p
}

func (p *actorProc) pid() int { return p.cmd.Process.Pid }

// next returns the actor's next event, which must be of kind want.
func (p *actorProc) next(want string, timeout time.Duration) event {
	p.t.Helper()
	select {
	case ev, ok := <-p.events:
		if !ok {
			p.t.Fatalf("actor %s exited (%v) while the test waited for its %q event", p.name, p.exitErr, want)
		}
		raw, _ := json.Marshal(ev)
		p.t.Logf("actor %s: %s", p.name, raw)
		if ev.Event != want {
			p.t.Fatalf("actor %s: got a %q event, want %q", p.name, ev.Event, want)
		}
		return ev
	case <-time.After(timeout):
		p.t.Fatalf("actor %s: no %q event within %v", p.name, want, timeout)
		return event{}
	}
}

// attempt returns the next event, which must be the attempt named name.
func (p *actorProc) attempt(name string, timeout time.Duration) event {
	p.t.Helper()
	ev := p.next(evAttempt, timeout)
	if ev.Attempt != name {
		p.t.Fatalf("actor %s: attempt %q, want %q", p.name, ev.Attempt, name)
	}
	return ev
}

// send writes one command line to the actor's stdin.
func (p *actorProc) send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatalf("actor %s: write %q to stdin: %v", p.name, line, err)
	}
}

func (p *actorProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := syscall.Kill(p.pid(), sig); err != nil {
		p.t.Fatalf("actor %s: kill -%v %d: %v", p.name, sig, p.pid(), err)
	}
}

// state is the process state letter of /proc/<pid>/stat ("T" stopped,
// "S" sleeping, "R" running, …).
func (p *actorProc) state() string {
	p.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		p.t.Fatalf("actor %s: read /proc stat: %v", p.name, err)
	}
	// pid (comm) state ...; comm may hold spaces, so split after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) == 0 {
		p.t.Fatalf("actor %s: malformed /proc stat %q", p.name, b)
	}
	return f[0]
}

// waitState waits until the process state is want.
func (p *actorProc) waitState(want string, timeout time.Duration) {
	p.t.Helper()
	for end := time.Now().Add(timeout); ; time.Sleep(2 * time.Millisecond) {
		if s := p.state(); s == want {
			return
		} else if time.Now().After(end) {
			p.t.Fatalf("actor %s: process state %q, want %q", p.name, s, want)
		}
	}
}

// wait waits for the actor to exit and requires exit status 0 and no
// further events.
func (p *actorProc) wait(timeout time.Duration) {
	p.t.Helper()
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				<-p.exited
				if p.exitErr != nil {
					p.t.Fatalf("actor %s exited: %v", p.name, p.exitErr)
				}
				return
			}
			raw, _ := json.Marshal(ev)
			p.t.Fatalf("actor %s: unexpected event after done: %s", p.name, raw)
		case <-time.After(timeout):
			p.t.Fatalf("actor %s did not exit within %v", p.name, timeout)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
