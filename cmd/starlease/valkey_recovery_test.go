package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
	"github.com/starintel/starlease/recovery"
	"github.com/starintel/starlease/valkey"
)

// recoveryWorld is a Valkey lease namespace with its downstream stores, a
// fenced CouchDB database and a RabbitMQ queue, all real servers.
type recoveryWorld struct {
	couch  *testenv.CouchDB
	broker *testenv.RabbitMQ
	writer *couchdb.Writer
	dbName string
	queue  string
	n      int
}

var recoveryCaller = lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}

func recoveryIdentity(target string) lease.Identity {
	return lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: target, ActorName: "usernamegen"}
}

func recoveryAcquire(target, requestID string) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: recoveryIdentity(target), ServiceInstanceID: "instance-1", TTL: time.Hour,
		MaximumLifetime: 2 * time.Hour, ExecutionID: "execution-1", JobID: "job-1",
		Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: time.Now().Add(time.Minute), Caller: recoveryCaller}}
}

func openValkeyStore(t *testing.T, addr string) *valkey.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := valkey.Open(ctx, valkey.Options{Addr: addr, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// work acquires target's lease and has CouchDB accept a document under it;
// with publish, also a publication, relayed to the queue. The lease is
// released unless keep.
func (w *recoveryWorld) work(t *testing.T, s *valkey.Store, target string, keep, publish bool) *lease.Record {
	t.Helper()
	ctx := context.Background()
	w.n++
	req := recoveryAcquire(target, "req-"+itoa(uint64(w.n)))
	res, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c := fence.NewCommitter(s, fence.EnvelopeOf(res.Lease), recoveryCaller)
	body, _ := json.Marshal(map[string]any{"target": target, "n": w.n})
	if _, err := fence.Write(ctx, c, w.writer, "doc-"+itoa(uint64(w.n)), couchdb.Doc{ID: "doc-" + target, Body: body}); err != nil {
		t.Fatal(err)
	}
	if publish {
		pub := rabbitmq.NewPublisher(s, rabbitmq.WithCaller(recoveryCaller))
		if _, err := pub.Publish(ctx, c, "pub-"+itoa(uint64(w.n)), lease.OutboxMessage{RoutingKey: w.queue, Body: body}); err != nil {
			t.Fatal(err)
		}
		relay, err := rabbitmq.NewRelay(s, w.broker.URL(), rabbitmq.RelayOptions{Mandatory: true, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(rctx) }()
		for limit := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if p, err := s.OutboxPending(ctx, 0); err == nil && len(p) == 0 {
				break
			}
			if time.Now().After(limit) {
				t.Fatal("the relay never emptied the outbox")
			}
		}
		stop()
		<-done
	}
	if !keep {
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: req.Identity, LeaseID: res.Lease.LeaseID,
			FencingToken: res.Lease.FencingToken, ServiceInstanceID: "instance-1",
			Mutation: lease.Mutation{RequestID: "rel-" + itoa(uint64(w.n)), DeadlineAt: time.Now().Add(time.Minute), Caller: recoveryCaller}}); err != nil {
			t.Fatal(err)
		}
	}
	return res.Lease
}

// auditTypes lists the recovery events of a namespace's audit stream, as
// type/decision.
func auditTypes(t *testing.T, s *valkey.Store) []string {
	t.Helper()
	events, err := s.AuditSink(valkey.AuditOptions{}).Read(context.Background(), audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events {
		if e.EventType.Recovery() {
			out = append(out, string(e.EventType)+"/"+string(e.Decision))
		}
	}
	return out
}

// The recovery commands on the Valkey backend, against real Valkey,
// CouchDB and RabbitMQ servers: backup, more work accepted downstream,
// restore into a new server's empty namespace, verify-restore with every
// proof source (CouchDB, a RabbitMQ queue, a consumer marks file), and a
// failover seal.
func TestValkeyRecoveryCommands(t *testing.T) {
	ctx := context.Background()
	w := &recoveryWorld{couch: testenv.StartCouchDB(t), broker: testenv.StartRabbitMQ(t), dbName: "results", queue: "results"}
	db, err := couchdb.New(w.couch.URL(), w.dbName)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.InstallFence(ctx); err != nil {
		t.Fatal(err)
	}
	if w.writer, err = db.Writer("couchdb"); err != nil {
		t.Fatal(err)
	}
	w.broker.DeclareQueues(t, w.queue)
	live := testenv.StartRedis(t)
	s := openValkeyStore(t, live.Addr())
	stale := w.work(t, s, "target-a", true, false) // held at backup time

	dir := t.TempDir()
	out := filepath.Join(dir, "valkey.slb")
	var b struct {
		Code     string            `json:"code"`
		Manifest backupfile.Header `json:"manifest"`
	}
	runCLI(t, "backup", "--backend", "valkey", "--valkey-addr", live.Addr(), "--out", out).ok(t, &b)
	if b.Code != "backed_up" || b.Manifest.Backend != "valkey" || b.Manifest.Counts["counter"] != 1 {
		t.Fatalf("backup printed %+v", b)
	}
	runCLI(t, "backup", "--backend", "valkey", "--valkey-addr", live.Addr(), "--out", out).refused(t, exitUsage, lease.CodeInvalidRequest)
	if got := auditTypes(t, s); !slices.Equal(got, []string{"recovery_backup/allow"}) {
		t.Fatalf("audit after the backup: %v", got)
	}

	// Work goes on: CouchDB, the queue and a consumer accept newer tokens.
	if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: recoveryIdentity("target-a"), LeaseID: stale.LeaseID,
		FencingToken: stale.FencingToken, ServiceInstanceID: "instance-1",
		Mutation: lease.Mutation{RequestID: "rel-stale", DeadlineAt: time.Now().Add(time.Minute), Caller: recoveryCaller}}); err != nil {
		t.Fatal(err)
	}
	w.work(t, s, "target-a", false, false)
	queued := w.work(t, s, "target-a", false, true)
	consumed := w.work(t, s, "target-a", false, false)
	marks := filepath.Join(dir, "consumer-marks.json")
	if err := rabbitmq.WriteMarksFile(marks, map[string]uint64{consumed.LockKey: consumed.FencingToken}); err != nil {
		t.Fatal(err)
	}
	if queued.FencingToken <= stale.FencingToken || consumed.FencingToken <= queued.FencingToken {
		t.Fatalf("tokens %d, %d, %d", stale.FencingToken, queued.FencingToken, consumed.FencingToken)
	}

	// Restore into a new server.
	fresh := testenv.StartRedis(t)
	var r struct {
		Code string `json:"code"`
	}
	runCLI(t, "restore", "--backend", "valkey", "--valkey-addr", fresh.Addr(), "--in", out).ok(t, &r)
	if r.Code != "restored_unverified" {
		t.Fatalf("restore printed %+v", r)
	}
	runCLI(t, "restore", "--backend", "valkey", "--valkey-addr", fresh.Addr(), "--in", out).refused(t, exitUsage, lease.CodeInvalidRequest)
	runCLI(t, "restore", "--backend", "bolt", "--data-dir", filepath.Join(dir, "b"), "--in", out).refused(t, exitUsage, lease.CodeInvalidRequest)
	rs := openValkeyStore(t, fresh.Addr())
	if _, err := rs.Acquire(ctx, recoveryAcquire("target-a", "too-early")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire before verification: %v", err)
	}

	urlFile := filepath.Join(dir, "amqp-url")
	if err := os.WriteFile(urlFile, []byte(w.broker.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	verify := []string{"verify-restore", "--backend", "valkey", "--valkey-addr", fresh.Addr(),
		"--couchdb-url", w.couch.URL(), "--couchdb-db", w.dbName, "--rabbitmq-url-file", urlFile,
		"--consumer-marks", marks, "--proof-complete", "--epoch-gap", "1000"}
	// A proof source that fails leaves the namespace closed.
	if res := runCLI(t, append(slices.Clone(verify), "--rabbitmq-queue", "missing")...); res.code == exitOK {
		t.Fatalf("verify-restore with a missing queue: %+v", res)
	}
	runCLI(t, "verify-restore", "--backend", "valkey", "--valkey-addr", fresh.Addr(), "--rabbitmq-queue", "x").
		refused(t, exitUsage, lease.CodeInvalidRequest)
	if _, err := rs.Acquire(ctx, recoveryAcquire("target-a", "too-early")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire after a failed verification: %v", err)
	}
	var v struct {
		Code   string          `json:"code"`
		Report recovery.Report `json:"report"`
	}
	runCLI(t, append(verify, "--rabbitmq-queue", w.queue)...).ok(t, &v)
	if v.Code != "recovered" || !v.Report.Epoch || v.Report.MaxKnownToken != consumed.FencingToken ||
		v.Report.Floor != consumed.FencingToken+1000 || !slices.Equal(v.Report.Revoked, []string{stale.LeaseID}) {
		t.Fatalf("verify-restore printed %+v", v)
	}
	// The failed verification is on record too.
	if got := auditTypes(t, rs); !slices.Equal(got, []string{"recovery_restore/allow", "recovery_reopened/deny",
		"recovery_verify/allow", "recovery_lease_revoked/allow", "recovery_reopened/allow"}) {
		t.Fatalf("audit of the restored namespace: %v", got)
	}
	// New tokens are above every token accepted downstream, and accepted.
	next := w.work(t, rs, "target-a", false, false)
	if next.FencingToken != v.Report.Floor+1 {
		t.Fatalf("token after recovery %d, want %d", next.FencingToken, v.Report.Floor+1)
	}
	// The pre-backup request replays its original result.
	replay, err := rs.Acquire(ctx, recoveryAcquire("target-a", "req-1"))
	if err != nil || !replay.Replayed || replay.Lease.LeaseID != stale.LeaseID {
		t.Fatalf("replay: %+v %v", replay, err)
	}

	// Failover: seal the live namespace, then the epoch step reopens it.
	runCLI(t, "seal", "--backend", "bolt", "--data-dir", dir).refused(t, exitUsage, lease.CodeInvalidRequest)
	var sealed struct {
		Code string `json:"code"`
	}
	runCLI(t, "seal", "--backend", "valkey", "--valkey-addr", live.Addr()).ok(t, &sealed)
	if sealed.Code != "sealed" {
		t.Fatalf("seal printed %+v", sealed)
	}
	if _, err := s.Acquire(ctx, recoveryAcquire("target-a", "sealed")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire on a sealed namespace: %v", err)
	}
	runCLI(t, "verify-restore", "--backend", "valkey", "--valkey-addr", live.Addr()).ok(t, &v)
	if !v.Report.Epoch || v.Report.Floor != consumed.FencingToken+recovery.DefaultEpochGap {
		t.Fatalf("failover verify printed %+v", v)
	}
	// Verification of an open namespace is refused.
	runCLI(t, "verify-restore", "--backend", "valkey", "--valkey-addr", live.Addr()).refused(t, exitUsage, lease.CodeInvalidRequest)
}

// The command line reaches a TLS server with --valkey-tls-ca-file, and
// not without it.
func TestValkeyTLSFlags(t *testing.T) {
	r := testenv.StartRedisWith(t, testenv.RedisConfig{TLS: true})
	var listed struct {
		Credentials []any `json:"credentials"`
	}
	runCLI(t, "keys", "list", "--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-tls-ca-file", r.CAFile()).ok(t, &listed)
	if res := runCLI(t, "keys", "list", "--backend", "valkey", "--valkey-addr", r.Addr()); res.code == exitOK {
		t.Fatalf("keys list over TLS without the CA: %+v", res)
	}
	if res := runCLI(t, "keys", "list", "--backend", "valkey", "--valkey-addr", r.Addr(), "--valkey-tls-ca-file", r.CAFile(),
		"--valkey-tls-server-name", "elsewhere.invalid"); res.code == exitOK {
		t.Fatalf("keys list with a server name the certificate does not hold: %+v", res)
	}
}
