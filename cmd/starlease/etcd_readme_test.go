package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/starintel/starlease/internal/testenv"
)

// readmeShellBlock is the shell block after marker in the README.
func readmeShellBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("README has no %s marker", marker)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatalf("no shell block after the %s marker", marker)
	}
	return block
}

// shellCommands splits a block into its commands: continued lines joined,
// comments and blank lines dropped.
func shellCommands(block string) []string {
	var out []string
	for _, c := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		if c = strings.TrimSpace(c); c != "" && !strings.HasPrefix(c, "#") {
			out = append(out, c)
		}
	}
	return out
}

// shellWords splits command as bash does (the README's quoting).
func shellWords(t *testing.T, command string) []string {
	t.Helper()
	out, err := exec.Command("bash", "-c", `printf '%s\0' `+command).Output()
	if err != nil {
		t.Fatalf("splitting %q: %v", command, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// loopbackPorts returns n free ports of 127.0.0.1.
func loopbackPorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// The README's etcd example runs as written: its member command starts
// three members (on one host: the hosts' addresses become ports of
// 127.0.0.1, /var/lib/etcd a directory each), the least-privilege user is
// set up as its etcdctl commands say (through the same API), and its
// "keys create" and "serve" commands, with the example's endpoints, files
// and binary replaced, create a key and serve leases with it.
func TestReadmeEtcdExample(t *testing.T) {
	bin := starleaseBin(t)
	etcdBin := testenv.BuildEtcd(t)
	tmp := t.TempDir()

	ports := loopbackPorts(t, 6)
	repl := []string{}
	var endpoints []string
	for i := range 3 {
		host := fmt.Sprintf("10.0.0.%d", i+1)
		repl = append(repl, "http://"+host+":2380", fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
		endpoints = append(endpoints, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
	}
	repl = append(repl, `"http://$IP:2379"`, `"http://127.0.0.1:$CLIENT_PORT"`, `"http://$IP:2380"`, `"http://127.0.0.1:$PEER_PORT"`,
		"/var/lib/etcd", `"$DATA_DIR"`)
	member := strings.NewReplacer(repl...).Replace(readmeShellBlock(t, "<!-- etcd-cluster-example"))
	cmds := shellCommands(member)
	if len(cmds) != 1 || !strings.HasPrefix(cmds[0], "etcd ") {
		t.Fatalf("the member block is not one etcd command: %q", cmds)
	}
	for _, left := range []string{"10.0.0.", "$IP", "/var/lib"} {
		if strings.Contains(cmds[0], left) {
			t.Fatalf("the member command still holds %q after substitution: %s", left, cmds[0])
		}
	}
	for _, flag := range []string{"--auto-compaction-mode=periodic", "--auto-compaction-retention=1h", "--quota-backend-bytes="} {
		if !strings.Contains(cmds[0], flag) {
			t.Fatalf("the member command lacks %s", flag)
		}
	}
	script := "exec " + regexp.MustCompile(`^etcd `).ReplaceAllString(cmds[0], etcdBin+" ")
	for i := range 3 {
		cmd := exec.Command("bash", "-c", script)
		log := &testenv.Buffer{}
		cmd.Stdout, cmd.Stderr = log, log
		cmd.Env = append(testenv.CleanEnv(), fmt.Sprintf("NAME=etcd%d", i+1), fmt.Sprintf("CLIENT_PORT=%d", ports[2*i]),
			fmt.Sprintf("PEER_PORT=%d", ports[2*i+1]), "DATA_DIR="+filepath.Join(tmp, fmt.Sprintf("etcd%d", i+1)))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			if t.Failed() {
				tail := log.Bytes()
				t.Logf("etcd%d log tail:\n%s", i+1, tail[max(0, len(tail)-3000):])
			}
		})
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for limit := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		_, err := cli.Put(ctx, "readme-probe", "x")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("the README's three members formed no cluster: %v", err)
		}
	}
	if m, err := cli.MemberList(t.Context()); err != nil || len(m.Members) != 3 {
		t.Fatalf("members: %v %v", m, err)
	}
	if _, err := cli.Delete(t.Context(), "readme-probe"); err != nil {
		t.Fatal(err)
	}

	pwFile := filepath.Join(tmp, "etcd.password")
	if err := os.WriteFile(pwFile, []byte("readme-etcd-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The etcdctl commands of the README, through the API.
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(t.Context(), "root", "readme-root-password"); return err },
		func() error { _, err := cli.UserGrantRole(t.Context(), "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(t.Context(), "starlease"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(t.Context(), "starlease", "starlease/", clientv3.GetPrefixRangeEnd("starlease/"),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(t.Context(), "starlease", "readme-etcd-password"); return err },
		func() error { _, err := cli.UserGrantRole(t.Context(), "starlease", "starlease"); return err },
		func() error { _, err := cli.AuthEnable(t.Context()); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("the README's user setup: %v", err)
		}
	}
	if !strings.Contains(readmeShellBlock(t, "Give starlease a user that can reach its prefix only"),
		"etcdctl role grant-permission starlease --prefix=true readwrite starlease/") {
		t.Fatal("the README's grant is not the one this test makes")
	}

	pepper := filepath.Join(tmp, "starlease.pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-etcd-readme-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(tmp, "data")
	serveBlock := strings.NewReplacer("http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379", strings.Join(endpoints, ","),
		"bin/starlease", bin, "./starlease.pepper", pepper, "./etcd.password", pwFile, "./data", dataDir).
		Replace(readmeShellBlock(t, "<!-- etcd-serve-example"))
	cmds = shellCommands(serveBlock)
	if len(cmds) != 2 {
		t.Fatalf("the serve block has %d commands, want keys create and serve: %q", len(cmds), cmds)
	}
	keysArgs, serveArgs := shellWords(t, cmds[0]), shellWords(t, cmds[1])
	if keysArgs[0] != bin || keysArgs[1] != "keys" || serveArgs[0] != bin || serveArgs[1] != "serve" {
		t.Fatalf("the serve block's commands: %q", cmds)
	}
	keys := exec.Command(keysArgs[0], keysArgs[1:]...)
	keys.Env, keys.Dir = testenv.CleanEnv(), tmp
	out, err := keys.Output()
	if err != nil {
		t.Fatalf("the README's keys create: %v", err)
	}
	var created struct {
		APIKey string `json:"api_key"`
	}
	if err := json.Unmarshal(out, &created); err != nil || testenv.APIKeyRE.FindStringSubmatch(created.APIKey) == nil {
		t.Fatalf("keys create printed no key: %v", err)
	}
	s := startServer(t, bin, dataDir, serveArgs[2:]...)
	identity := map[string]string{"tenant_id": "acme", "program_id": "recon", "target_namespace": "web",
		"target_id": "example.com", "actor_name": "crawler"}
	code, body := s.do(t, created.APIKey, "POST", "/api/v1/target-leases/acquire", map[string]any{"lock_identity": identity,
		"ttl_ms": 30000, "service_instance_id": "inst-1", "execution_id": "exec-1", "job_id": "job-1", "request_id": "req-1"})
	if code != 200 || body["code"] != "lease_acquired" {
		t.Fatalf("acquire: %d %v", code, body)
	}
	held := body["lease"].(map[string]any)
	code, body = s.do(t, created.APIKey, "POST", "/api/v1/target-leases/"+held["lease_id"].(string)+"/release",
		map[string]any{"lock_identity": identity, "fencing_token": held["fencing_token"], "service_instance_id": "inst-1", "request_id": "req-2"})
	if code != 200 || body["code"] != "lease_released" || body["lease"].(map[string]any)["state"] != "released" {
		t.Fatalf("release: %d %v", code, body)
	}
	// Everything is under the documented prefix: the user can reach
	// nothing else.
	root, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		Username: "root", Password: "readme-root-password"})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	all, err := root.Get(t.Context(), "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		if !strings.HasPrefix(string(kv.Key), "starlease/") {
			t.Fatalf("key %q outside the prefix", kv.Key)
		}
	}
	if len(all.Kvs) == 0 {
		t.Fatal("nothing stored")
	}
}
