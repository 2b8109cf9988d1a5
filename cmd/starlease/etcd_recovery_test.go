package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
	"github.com/starintel/starlease/recovery"
)

func etcdRecPrefix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "cli" + hex.EncodeToString(b[:])
}

// etcdRecWorld is an etcd cluster holding lease prefixes and a fenced
// CouchDB database downstream of them, all real servers.
type etcdRecWorld struct {
	c      *testenv.EtcdCluster
	writer *couchdb.Writer
	n      int
}

func (w *etcdRecWorld) open(t *testing.T, prefix string) *etcd.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcd.Open(ctx, etcd.Options{Endpoints: w.c.Endpoints(), KeyPrefix: prefix, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// cmd is the command line of recovery command name on prefix.
func (w *etcdRecWorld) cmd(name, prefix string, more ...string) []string {
	return append([]string{name, "--backend", "etcd", "--etcd-endpoints", strings.Join(w.c.Endpoints(), ","),
		"--etcd-key-prefix", prefix}, more...)
}

// work acquires target's lease on s and has CouchDB accept a document
// under it; the lease is released unless keep.
func (w *etcdRecWorld) work(t *testing.T, s *etcd.Store, target string, keep bool) *lease.Record {
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
	if !keep {
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: req.Identity, LeaseID: res.Lease.LeaseID,
			FencingToken: res.Lease.FencingToken, ServiceInstanceID: "instance-1",
			Mutation: lease.Mutation{RequestID: "rel-" + itoa(uint64(w.n)), DeadlineAt: time.Now().Add(time.Minute), Caller: recoveryCaller}}); err != nil {
			t.Fatal(err)
		}
	}
	return res.Lease
}

// The recovery commands on the etcd backend, against a real three-member
// cluster and a real CouchDB: backup while the prefix is live, more work
// accepted downstream, restore into an empty prefix, verify-restore with
// the downstream proof (a CouchDB database and a consumer marks file),
// and a seal of the live prefix followed by the epoch step.
func TestEtcdRecoveryCommands(t *testing.T) {
	ctx := context.Background()
	w := &etcdRecWorld{c: testenv.StartEtcdCluster(t, 3)}
	couch := testenv.StartCouchDB(t)
	db, err := couchdb.New(couch.URL(), "results")
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
	dir := t.TempDir()
	live := etcdRecPrefix()
	s := w.open(t, live)
	stale := w.work(t, s, "target-a", true) // held at backup time

	out := filepath.Join(dir, "etcd.slb")
	var b struct {
		Code     string            `json:"code"`
		Manifest backupfile.Header `json:"manifest"`
	}
	runCLI(t, w.cmd("backup", live, "--out", out)...).ok(t, &b)
	if b.Code != "backed_up" || b.Manifest.Backend != "etcd" || b.Manifest.Counts["counter"] != 1 || b.Manifest.Counts["active"] != 1 {
		t.Fatalf("backup printed %+v", b)
	}
	runCLI(t, w.cmd("backup", live, "--out", out)...).refused(t, exitUsage, lease.CodeInvalidRequest)
	// A mistyped prefix holds no store: refused, and nothing created there.
	if e := runCLI(t, w.cmd("backup", etcdRecPrefix(), "--out", filepath.Join(dir, "none.slb"))...).
		refused(t, exitUsage, lease.CodeInvalidRequest); e.Field != "etcd_key_prefix" {
		t.Fatalf("backup of a prefix without a store: %+v", e)
	}
	if got := etcdRecAudit(t, s); !slices.Equal(got, []string{"recovery_backup/allow"}) {
		t.Fatalf("audit after the backup: %v", got)
	}

	// Work goes on: CouchDB and a consumer accept newer tokens.
	if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: recoveryIdentity("target-a"), LeaseID: stale.LeaseID,
		FencingToken: stale.FencingToken, ServiceInstanceID: "instance-1",
		Mutation: lease.Mutation{RequestID: "rel-stale", DeadlineAt: time.Now().Add(time.Minute), Caller: recoveryCaller}}); err != nil {
		t.Fatal(err)
	}
	w.work(t, s, "target-a", false)
	consumed := w.work(t, s, "target-a", false)
	marks := filepath.Join(dir, "consumer-marks.json")
	if err := rabbitmq.WriteMarksFile(marks, map[string]uint64{consumed.LockKey: consumed.FencingToken}); err != nil {
		t.Fatal(err)
	}

	// Restore into an empty prefix.
	fresh := etcdRecPrefix()
	var r struct {
		Code string `json:"code"`
		Next string `json:"next"`
	}
	runCLI(t, w.cmd("restore", fresh, "--in", out)...).ok(t, &r)
	if r.Code != "restored_unverified" || !strings.Contains(r.Next, "--etcd-key-prefix "+fresh) {
		t.Fatalf("restore printed %+v", r)
	}
	runCLI(t, w.cmd("restore", fresh, "--in", out)...).refused(t, exitUsage, lease.CodeInvalidRequest)
	runCLI(t, w.cmd("restore", live, "--in", out)...).refused(t, exitUsage, lease.CodeInvalidRequest)
	runCLI(t, "restore", "--backend", "bolt", "--data-dir", filepath.Join(dir, "b"), "--in", out).refused(t, exitUsage, lease.CodeInvalidRequest)
	rs := w.open(t, fresh)
	if _, err := rs.Acquire(ctx, recoveryAcquire("target-a", "too-early")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire before verification: %v", err)
	}

	verify := w.cmd("verify-restore", fresh, "--couchdb-url", couch.URL(), "--couchdb-db", "results",
		"--consumer-marks", marks, "--proof-complete", "--epoch-gap", "1000")
	// A proof source that fails leaves the prefix closed.
	if res := runCLI(t, append(slices.Clone(verify), "--couchdb-db", "missing")...); res.code == exitOK {
		t.Fatalf("verify-restore with a missing database: %+v", res)
	}
	if _, err := rs.Acquire(ctx, recoveryAcquire("target-a", "too-early")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire after a failed verification: %v", err)
	}
	var v struct {
		Code   string          `json:"code"`
		Report recovery.Report `json:"report"`
	}
	runCLI(t, verify...).ok(t, &v)
	if v.Code != "recovered" || !v.Report.Epoch || v.Report.MaxKnownToken != consumed.FencingToken ||
		v.Report.Floor != consumed.FencingToken+1000 || !slices.Equal(v.Report.Revoked, []string{stale.LeaseID}) {
		t.Fatalf("verify-restore printed %+v", v)
	}
	if got := etcdRecAudit(t, rs); !slices.Equal(got, []string{"recovery_restore/allow", "recovery_reopened/deny",
		"recovery_verify/allow", "recovery_lease_revoked/allow", "recovery_reopened/allow"}) {
		t.Fatalf("audit of the restored prefix: %v", got)
	}
	// New tokens are above every token issued before and after the backup,
	// and CouchDB accepts them.
	next := w.work(t, rs, "target-a", false)
	if next.FencingToken != v.Report.Floor+1 {
		t.Fatalf("token after recovery %d, want %d", next.FencingToken, v.Report.Floor+1)
	}
	replay, err := rs.Acquire(ctx, recoveryAcquire("target-a", "req-1"))
	if err != nil || !replay.Replayed || replay.Lease.LeaseID != stale.LeaseID {
		t.Fatalf("replay: %+v %v", replay, err)
	}

	// Seal the live prefix (as after its cluster came back from a
	// snapshot); the epoch step reopens it.
	var sealed struct {
		Code string `json:"code"`
	}
	runCLI(t, w.cmd("seal", live)...).ok(t, &sealed)
	if sealed.Code != "sealed" {
		t.Fatalf("seal printed %+v", sealed)
	}
	runCLI(t, w.cmd("seal", live)...).ok(t, &sealed)
	if sealed.Code != "already_closed" {
		t.Fatalf("second seal printed %+v", sealed)
	}
	if _, err := s.Acquire(ctx, recoveryAcquire("target-a", "sealed")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire on a sealed prefix: %v", err)
	}
	runCLI(t, w.cmd("verify-restore", live)...).ok(t, &v)
	if !v.Report.Epoch || v.Report.Floor != consumed.FencingToken+recovery.DefaultEpochGap {
		t.Fatalf("verify after the seal printed %+v", v)
	}
	after := w.work(t, s, "target-a", false)
	if after.FencingToken != v.Report.Floor+1 {
		t.Fatalf("token after the epoch step %d, want %d", after.FencingToken, v.Report.Floor+1)
	}
	// Verification of an open prefix is refused.
	runCLI(t, w.cmd("verify-restore", live)...).refused(t, exitUsage, lease.CodeInvalidRequest)
}

// etcdRecAudit lists the recovery events of the prefix's audit stream, in
// append order, as type/decision.
func etcdRecAudit(t *testing.T, s *etcd.Store) []string {
	t.Helper()
	events, err := s.AuditSink(etcd.AuditOptions{}).Read(context.Background(), audit.Filter{}, audit.MaxReadLimit)
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
