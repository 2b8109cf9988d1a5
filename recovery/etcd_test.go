package recovery

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

func etcdPrefix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "r" + hex.EncodeToString(b[:])
}

func etcdOptions(c *testenv.EtcdCluster, prefix string) etcd.Options {
	return etcd.Options{Endpoints: c.Endpoints(), KeyPrefix: prefix, ReapInterval: -1}
}

func openEtcd(t *testing.T, c *testenv.EtcdCluster, prefix string) *etcd.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcd.Open(ctx, etcdOptions(c, prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// etcdWorld is the downstream of an etcd lease namespace: a fenced CouchDB
// database and a RabbitMQ queue fed by the namespace's fenced outbox.
type etcdWorld struct {
	couch  *testenv.CouchDB
	broker *testenv.RabbitMQ
	db     *couchdb.DB
	writer *couchdb.Writer
	queue  string
}

// work acquires target's lease on s, has CouchDB accept a document and the
// broker a publication under it (both fenced, the publication relayed from
// s's outbox), and releases it unless keep.
func (w *etcdWorld) work(t *testing.T, s *etcd.Store, target, requestID string, keep bool) (*lease.Record, *fence.Committer) {
	t.Helper()
	var committer *fence.Committer
	l := underLease(t, s, target, requestID, keep, func(l *lease.Record, c *fence.Committer) {
		ctx := context.Background()
		committer = c
		body, _ := json.Marshal(map[string]any{"target": target, "token": l.FencingToken})
		if _, err := fence.Write(ctx, c, w.writer, "doc-"+requestID, couchdb.Doc{ID: "doc-" + target, Body: body}); err != nil {
			t.Fatalf("fenced write for %s: %v", target, err)
		}
		pub := rabbitmq.NewPublisher(s, rabbitmq.WithCaller(caller))
		if _, err := pub.Publish(ctx, c, "pub-"+requestID, lease.OutboxMessage{RoutingKey: w.queue, ContentType: "application/json", Body: body}); err != nil {
			t.Fatalf("fenced publication for %s: %v", target, err)
		}
	})
	w.relay(t, s)
	return l, committer
}

// relay moves s's outbox to the broker and waits until it is empty.
func (w *etcdWorld) relay(t *testing.T, s *etcd.Store) {
	t.Helper()
	r, err := rabbitmq.NewRelay(s, w.broker.URL(), rabbitmq.RelayOptions{Mandatory: true, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { stop(); <-done }()
	for limit := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p, err := s.OutboxPending(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 0 {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("outbox still holds %d entries", len(p))
		}
	}
}

// proof reads the downstream marks (complete: CouchDB and the queue are
// every downstream store of this world).
func (w *etcdWorld) proof(t *testing.T) Proof {
	t.Helper()
	p := Proof{Complete: true}
	if err := CouchDBProof(context.Background(), CouchDBSource{URL: w.couch.URL(), Database: w.db.Name()}, &p); err != nil {
		t.Fatal(err)
	}
	if err := RabbitMQProof(context.Background(), w.broker.URL(), []string{w.queue}, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// The etcd backend through recovery, on a real three-member cluster with
// real CouchDB and RabbitMQ servers downstream: restores verified with and
// without the downstream proof, a complete proof that keeps the counters,
// a prefix sealed after it came back behind, and the recovery commands of
// a Site.
func TestEtcdRecovery(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	w := &etcdWorld{couch: testenv.StartCouchDB(t), broker: testenv.StartRabbitMQ(t)}
	for _, withProof := range []bool{true, false} {
		t.Run(fmt.Sprintf("RestoreEndToEnd/proof=%t", withProof), func(t *testing.T) {
			w.db = fencedDB(t, w.couch, "etcd-"+etcdPrefix(), true)
			var err error
			if w.writer, err = w.db.Writer("couchdb"); err != nil {
				t.Fatal(err)
			}
			w.queue = "results-" + strconv.FormatBool(withProof)
			w.broker.DeclareQueues(t, w.queue)
			testEtcdRestoreEndToEnd(t, c, w, withProof)
		})
	}
	t.Run("CompleteProofKeepsCounters", func(t *testing.T) { testEtcdCompleteProof(t, c) })
	t.Run("SealedBehindTakesTheEpochStep", func(t *testing.T) { testEtcdSealEpoch(t, c) })
	t.Run("Site", func(t *testing.T) { testEtcdSite(t, c) })
}

// A backup, more work accepted downstream, the old backup restored into an
// empty prefix, then recovery with the downstream proof or without it (the
// epoch path): either way every new token is above every token issued
// before the backup and after it, and downstream accepts it.
func testEtcdRestoreEndToEnd(t *testing.T, c *testenv.EtcdCluster, w *etcdWorld, withProof bool) {
	ctx := context.Background()
	s := openEtcd(t, c, etcdPrefix())
	w.work(t, s, "target-a", "a-1", false) // token 1
	stale, staleCommitter := w.work(t, s, "target-a", "a-2", true)
	// Authorized while valid, used only after the restore.
	staleBody, _ := json.Marshal(map[string]any{"target": "target-a", "stale": true})
	staleWrite, err := w.writer.Bind(couchdb.Doc{ID: "doc-target-a", Body: staleBody})
	if err != nil {
		t.Fatal(err)
	}
	late, err := staleCommitter.Authorize(ctx, "couchdb", "late-a-2", staleWrite)
	if err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if _, err := s.Backup(ctx, &backup); err != nil {
		t.Fatal(err)
	}
	rel := release(stale, "rel-stale")
	rel.Identity = stale.Identity()
	if _, err := s.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	var after []uint64
	for i := range 3 {
		l, _ := w.work(t, s, "target-a", fmt.Sprintf("a-after-%d", i), false)
		after = append(after, l.FencingToken)
	}
	unseen, _ := w.work(t, s, "target-new", "n-1", false)
	maxAfter := slices.Max(after)

	restored := etcdPrefix()
	if _, err := etcd.NewNamespace(etcdOptions(c, restored)).Restore(ctx, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	r := openEtcd(t, c, restored)
	if _, err := r.Acquire(ctx, acquire("refused")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire before verification: %v", err)
	}
	if _, err := r.AuthorizeCommit(ctx, staleCommit(stale, "commit-refused")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("commit before verification: %v", err)
	}
	var proof Proof
	if withProof {
		proof = w.proof(t)
		if proof.Marks[stale.LockKey] != maxAfter || proof.Marks[unseen.LockKey] != unseen.FencingToken {
			t.Fatalf("downstream proof %v; want %s=%d", proof.Marks, stale.LockKey, maxAfter)
		}
	}
	ns, err := etcd.NewNamespace(etcdOptions(c, restored)).OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := &audittest.Recorder{}
	rep, err := Verify(ctx, ns, proof, Options{Audit: rec})
	if err != nil {
		t.Fatal(err)
	}
	wantMax := stale.FencingToken
	if withProof {
		wantMax = maxAfter
		if !slices.Equal(rep.Shortfalls, sortedKeys(stale.LockKey, unseen.LockKey)) {
			t.Fatalf("shortfalls %v", rep.Shortfalls)
		}
	}
	if !rep.Epoch || rep.MaxKnownToken != wantMax || rep.Floor != wantMax+DefaultEpochGap || rep.EpochNumber != 1 ||
		!slices.Equal(rep.Revoked, []string{stale.LeaseID}) {
		t.Fatalf("report %+v", rep)
	}
	if len(rec.OfType(audit.EventRecoveryVerify)) != 1 || len(rec.OfType(audit.EventRecoveryRevoke)) != 1 ||
		len(rec.OfType(audit.EventRecoveryReopen)) != 1 {
		t.Fatalf("audit events %+v", rec.Events())
	}
	// The stale holder from before the restore cannot commit, and CouchDB
	// refuses its token by itself.
	if _, err := r.AuthorizeCommit(ctx, staleCommit(stale, "commit-stale")); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("stale commit: %v", err)
	}
	if err := w.writer.Commit(ctx, staleCommitter.Guard(late), couchdb.Doc{ID: "doc-target-a", Body: staleBody}); lease.CodeOf(err) != lease.CodeCommitRejected {
		t.Fatalf("CouchDB's answer to the stale token: %v", err)
	}
	// A replayed pre-backup request returns its original result.
	replay, err := r.Acquire(ctx, withTarget(acquire("a-2"), "target-a"))
	if err != nil || !replay.Replayed || replay.Lease.LeaseID != stale.LeaseID || replay.Lease.FencingToken != stale.FencingToken {
		t.Fatalf("replay: %+v %v", replay, err)
	}
	// Every new token is above every token issued before the backup and
	// after it, and downstream accepts it (work fails otherwise).
	for _, target := range []string{"target-a", "target-new", "target-other"} {
		got, _ := w.work(t, r, target, "post-"+target, false)
		if got.FencingToken <= maxAfter || got.FencingToken <= unseen.FencingToken || got.FencingToken != rep.Floor+1 {
			t.Fatalf("%s: new token %d; downstream max %d, floor %d", target, got.FencingToken, maxAfter, rep.Floor)
		}
	}
}

// With a complete proof that no downstream store is ahead of the backup,
// recovery keeps the restored counters (no epoch): the next token follows
// the last one issued, and the held lease is still ended.
func testEtcdCompleteProof(t *testing.T, c *testenv.EtcdCluster) {
	ctx := context.Background()
	s := openEtcd(t, c, etcdPrefix())
	var held *lease.Record
	for i := range 3 {
		held = underLease(t, s, "target-a", fmt.Sprintf("a-%d", i), i == 2, func(*lease.Record, *fence.Committer) {})
	}
	var backup bytes.Buffer
	if _, err := s.Backup(ctx, &backup); err != nil {
		t.Fatal(err)
	}
	restored := etcdPrefix()
	if _, err := etcd.NewNamespace(etcdOptions(c, restored)).Restore(ctx, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	ns, err := etcd.NewNamespace(etcdOptions(c, restored)).OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proof := Proof{Complete: true, Sources: []string{"test"}, Marks: map[string]uint64{held.LockKey: held.FencingToken}}
	rep, err := Verify(ctx, ns, proof, Options{Audit: &audittest.Recorder{}})
	if err != nil || rep.Epoch || rep.Raised != 0 || rep.MaxKnownToken != 3 || !slices.Equal(rep.Revoked, []string{held.LeaseID}) {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	next := underLease(t, openEtcd(t, c, restored), "target-a", "a-next", false, func(*lease.Record, *fence.Committer) {})
	if next.FencingToken != held.FencingToken+1 {
		t.Fatalf("token after recovery %d, want %d", next.FencingToken, held.FencingToken+1)
	}
}

// copyPrefix copies every key of prefix from, as it was at revision rev,
// under prefix to: a namespace as it comes back from an etcd snapshot (or
// a mirror promoted after its source was lost), behind what was issued.
func copyPrefix(t *testing.T, cli *clientv3.Client, from, to string, rev int64) {
	t.Helper()
	r, err := cli.Get(context.Background(), from+"/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	for group := range slices.Chunk(r.Kvs, 100) {
		var ops []clientv3.Op
		for _, kv := range group {
			ops = append(ops, clientv3.OpPut(to+"/"+string(kv.Key[len(from)+1:]), string(kv.Value)))
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// A prefix that comes back behind what its cluster issued (from an etcd
// snapshot, here a copy at an earlier revision) would issue those tokens
// again; Seal and the epoch step put every new token above them.
func testEtcdSealEpoch(t *testing.T, c *testenv.EtcdCluster) {
	ctx := context.Background()
	live := etcdPrefix()
	s := openEtcd(t, c, live)
	first, err := s.Acquire(ctx, acquire("before-snapshot"))
	if err != nil {
		t.Fatal(err)
	}
	cli := c.Client()
	snap, err := cli.Get(ctx, live+"/meta/schema")
	if err != nil {
		t.Fatal(err)
	}
	var lost []uint64
	if _, err := s.Release(ctx, release(first.Lease, "rel-first")); err != nil {
		t.Fatal(err)
	}
	for i, target := range []string{ident.TargetID, ident.TargetID, "target-b"} {
		l := underLease(t, s, target, "lost-"+strconv.Itoa(i), false, func(*lease.Record, *fence.Committer) {})
		lost = append(lost, l.FencingToken)
	}
	back := etcdPrefix()
	copyPrefix(t, cli, live, back, snap.Header.Revision)
	promoted := openEtcd(t, c, back)
	if sealed, err := etcd.NewNamespace(etcdOptions(c, back)).Seal(ctx); err != nil || !sealed {
		t.Fatalf("seal: %t %v", sealed, err)
	}
	if _, err := promoted.Acquire(ctx, withTarget(acquire("too-early"), "target-b")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire on a sealed prefix: %v", err)
	}
	ns, err := etcd.NewNamespace(etcdOptions(c, back)).OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(ctx, ns, Proof{}, Options{EpochGap: 1000})
	if err != nil || !rep.Epoch || rep.Floor != 1+1000 || !slices.Equal(rep.Revoked, []string{first.Lease.LeaseID}) {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	for _, target := range []string{ident.TargetID, "target-b"} {
		res, err := promoted.Acquire(ctx, withTarget(acquire("after-"+target), target))
		if err != nil || res.Lease.FencingToken <= slices.Max(lost) || res.Lease.FencingToken <= first.Lease.FencingToken {
			t.Fatalf("%s after the epoch step: %+v %v; tokens issued before %v", target, res.Lease, err, lost)
		}
	}
}

// etcdSite is an etcd prefix as the recovery commands reach it: its
// steps are audited in its own audit stream.
func etcdSite(c *testenv.EtcdCluster, prefix string) *Site {
	return &Site{Backend: etcd.NewNamespace(etcdOptions(c, prefix)), Field: "etcd_key_prefix"}
}

// recoveryEvents lists the recovery events of prefix's audit stream, in
// append order.
func recoveryEvents(t *testing.T, s *etcd.Store) []audit.EventType {
	t.Helper()
	events, err := s.AuditSink(etcd.AuditOptions{}).Read(context.Background(), audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	var types []audit.EventType
	for _, e := range events {
		if e.EventType.Recovery() {
			types = append(types, e.EventType)
		}
	}
	return types
}

// An etcd site's backup, restore, seal and verification, each one call:
// the refusals name the site's field, and every step is audited in the
// prefix's own stream (a step on a closed prefix included).
func testEtcdSite(t *testing.T, c *testenv.EtcdCluster) {
	ctx := context.Background()
	dir := t.TempDir()
	out := filepath.Join(dir, "backup.slb")
	if _, err := etcdSite(c, etcdPrefix()).Backup(ctx, out); lease.AsError(err).Field != "etcd_key_prefix" {
		t.Fatalf("backup of a prefix without a store: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused backup left %s: %v", out, err)
	}
	live := etcdPrefix()
	liveStore := openEtcd(t, c, live)
	held := underLease(t, liveStore, "target-1", "req-1", true, func(*lease.Record, *fence.Committer) {})
	src := etcdSite(c, live)
	m, err := src.Backup(ctx, out)
	if err != nil || m.Backend != "etcd" || len(m.Sections) != 0 || m.Counts["counter"] != 1 {
		t.Fatalf("backup: %+v %v", m, err)
	}
	if _, err := src.Backup(ctx, out); lease.AsError(err).Field != "out" {
		t.Fatalf("backup over an existing file: %v", err)
	}
	if _, err := src.Restore(ctx, out); lease.AsError(err).Field != "etcd_key_prefix" {
		t.Fatalf("restore over a live prefix: %v", err)
	}

	if got := recoveryEvents(t, liveStore); !slices.Equal(got, []audit.EventType{audit.EventRecoveryBackup}) {
		t.Fatalf("audit of the live prefix: %v", got)
	}
	restored := etcdPrefix()
	dst := etcdSite(c, restored)
	if r, err := dst.Restore(ctx, out); err != nil || r.PayloadSHA256 != m.PayloadSHA256 {
		t.Fatalf("restore: %+v %v", r, err)
	}
	if sealed, err := etcdSite(c, restored).Seal(ctx); err != nil || sealed {
		t.Fatalf("seal of a restored prefix: %t %v", sealed, err)
	}
	rep, proof, err := etcdSite(c, restored).Verify(ctx, Sources{}, Options{EpochGap: 10})
	if err != nil || !rep.Epoch || proof.Complete || rep.Floor != held.FencingToken+10 || !slices.Equal(rep.Revoked, []string{held.LeaseID}) {
		t.Fatalf("verify: %+v %+v %v", rep, proof, err)
	}
	if _, _, err := etcdSite(c, restored).Verify(ctx, Sources{}, Options{}); lease.AsError(err).Field != "backend" {
		t.Fatalf("verify of an open prefix: %v", err)
	}
	rs := openEtcd(t, c, restored)
	if got := recoveryEvents(t, rs); !slices.Equal(got, []audit.EventType{audit.EventRecoveryRestore, audit.EventRecoveryRestore,
		audit.EventRecoveryVerify, audit.EventRecoveryRevoke, audit.EventRecoveryReopen}) {
		t.Fatalf("audit of the restored prefix: %v", got)
	}
	next := underLease(t, rs, "target-1", "req-next", false, func(*lease.Record, *fence.Committer) {})
	if next.FencingToken != rep.Floor+1 {
		t.Fatalf("token after recovery %d, want %d", next.FencingToken, rep.Floor+1)
	}
}
