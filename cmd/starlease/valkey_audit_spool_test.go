package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// TestValkeyOutageIsAudited (issue 11 §5): with --backend valkey the audit
// stream lives in Valkey. While Valkey is down every request still gets
// its audit event (lease_backend_unavailable) — spooled durably on the
// server's disk — and when Valkey is back the events reach the stream, in
// the order they were answered, each exactly once, and the spool empties.
func TestValkeyOutageIsAudited(t *testing.T) {
	bin := buildBinary(t)
	tmp := t.TempDir()
	r := testenv.StartRedis(t)
	pepper := filepath.Join(tmp, "pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-valkey-spool-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const prefix = "starlease:spool"
	vflags := []string{"--pepper-file", pepper, "--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-key-prefix", prefix}
	s := startServer(t, bin, filepath.Join(tmp, "data"), vflags...)
	// A well-formed key that was never issued: 401 while Valkey answers,
	// 503 while the credential store cannot.
	key := "star_sk_v1_01M8VRFBG00000000000000000_" + strings.Repeat("0f", 32)
	identity := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
		"target_namespace": "web", "target_id": "example.com", "actor_name": "crawler"}
	body := map[string]any{"lock_identity": identity, "ttl_ms": 30000, "service_instance_id": "inst-1",
		"execution_id": "exec-1", "job_id": "job-1", "request_id": "req-1"}
	send := func(corr string) int {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", s.base+"/api/v1/target-leases/acquire", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Correlation-ID", corr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send("before-outage"); code != 401 {
		t.Fatalf("before the outage: %d, want 401", code)
	}

	r.Kill9()
	var sent []string
	for i := range 5 {
		corr := "outage-" + string(rune('a'+i))
		if code := send(corr); code != 503 {
			t.Fatalf("request %d with Valkey down: %d, want 503", i, code)
		}
		sent = append(sent, corr)
	}
	r.Restart()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vs, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: prefix, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	var stream []audit.Event
	for limit := time.Now().Add(20 * time.Second); ; {
		stream, err = vs.AuditSink(valkey.AuditOptions{}).Read(ctx, audit.Filter{}, audit.MaxReadLimit)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range stream {
			if len(e.CorrelationID) > 7 && e.CorrelationID[:7] == "outage-" {
				n++
			}
		}
		if n >= len(sent) {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("20 s after Valkey came back, %d of the %d outage events had reached the stream", n, len(sent))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var got []string
	for _, e := range stream {
		if len(e.CorrelationID) > 7 && e.CorrelationID[:7] == "outage-" {
			got = append(got, e.CorrelationID)
			if e.ResultCode != lease.CodeBackendUnavailable || e.Decision != audit.DecisionDeny ||
				e.BackendHealth != lease.HealthUnavailable {
				t.Errorf("outage event %+v", e)
			}
		}
	}
	if len(got) != len(sent) {
		t.Fatalf("outage events in the stream %v, want each of %v once", got, sent)
	}
	for i := range sent {
		if got[i] != sent[i] {
			t.Fatalf("outage events in the stream in order %v, want %v", got, sent)
		}
	}
	// The spool is emptied, and a request now goes straight to the stream.
	for limit := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		fi, err := os.Stat(filepath.Join(s.dataDir, auditSpoolFile))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() == 0 {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("spool still holds %d bytes", fi.Size())
		}
	}
	if code := send("after-outage"); code != 401 {
		t.Fatalf("after the outage: %d, want 401", code)
	}
	stream, err = vs.AuditSink(valkey.AuditOptions{}).Read(ctx, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	if last := stream[len(stream)-1]; last.CorrelationID != "after-outage" {
		t.Fatalf("the last event in the stream is %s, want the request after the outage", last.CorrelationID)
	}
	// Every event of the local file is in the stream, once.
	s.stop(t)
	local, err := audit.ReadFile(filepath.Join(s.dataDir, auditFile))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range stream {
		count[e.EventID]++
	}
	for _, e := range local {
		if count[e.EventID] != 1 {
			t.Errorf("event %s (%s) is %d times in the stream, want once", e.EventID, e.CorrelationID, count[e.EventID])
		}
	}
}
