package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
	"github.com/starintel/starlease/valkey"
)

func openValkey(t *testing.T, r *testenv.Redis, prefix string) *valkey.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: prefix, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// valkeyWorld is a live Valkey namespace with its downstream stores: a
// fenced CouchDB database and a RabbitMQ queue fed by the fenced outbox.
type valkeyWorld struct {
	couch  *testenv.CouchDB
	broker *testenv.RabbitMQ
	db     *couchdb.DB
	writer *couchdb.Writer
	queue  string
}

func newValkeyWorld(t *testing.T) *valkeyWorld {
	w := &valkeyWorld{couch: testenv.StartCouchDB(t), broker: testenv.StartRabbitMQ(t), queue: "results"}
	w.db = fencedDB(t, w.couch, "results", true)
	var err error
	if w.writer, err = w.db.Writer("couchdb"); err != nil {
		t.Fatal(err)
	}
	w.broker.DeclareQueues(t, w.queue)
	return w
}

// work acquires target's lease, has CouchDB accept a document and the
// broker a publication under it (both fenced), and releases it unless
// keep. It returns the lease.
func (w *valkeyWorld) work(t *testing.T, s *valkey.Store, target, requestID string, keep bool) *lease.Record {
	rec, _ := w.workWith(t, s, target, requestID, keep)
	return rec
}

// workWith is work that also returns the lease's committer.
func (w *valkeyWorld) workWith(t *testing.T, s *valkey.Store, target, requestID string, keep bool) (*lease.Record, *fence.Committer) {
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
	return l, committer
}

// relay moves s's outbox to the broker and waits until it is empty.
func (w *valkeyWorld) relay(t *testing.T, s *valkey.Store) {
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
func (w *valkeyWorld) proof(t *testing.T) Proof {
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

// The Valkey backend end to end, against real Valkey, CouchDB and
// RabbitMQ servers: a backup, more work accepted downstream, the old backup
// restored into an empty namespace of a new server, then recovery with the
// downstream proof and, separately, without it (the epoch path).
func TestValkeyRestoreEndToEnd(t *testing.T) {
	for _, withProof := range []bool{true, false} {
		t.Run(fmt.Sprintf("proof=%t", withProof), func(t *testing.T) {
			ctx := context.Background()
			w := newValkeyWorld(t)
			live := testenv.StartRedis(t)
			s := openValkey(t, live, "starlease")

			w.work(t, s, "target-a", "a-1", false) // token 1
			stale, staleCommitter := w.workWith(t, s, "target-a", "a-2", true)
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
			w.relay(t, s)
			var backup bytes.Buffer
			if _, err := s.Backup(ctx, &backup); err != nil {
				t.Fatal(err)
			}
			// Work continues after the backup: tokens grow and are
			// accepted downstream, also for an identity the backup never saw.
			rel := release(stale, "rel-stale")
			rel.Identity = stale.Identity()
			if _, err := s.Release(ctx, rel); err != nil {
				t.Fatal(err)
			}
			var after []uint64
			for i := range 3 {
				after = append(after, w.work(t, s, "target-a", fmt.Sprintf("a-after-%d", i), false).FencingToken)
			}
			unseen := w.work(t, s, "target-new", "n-1", false)
			w.relay(t, s)
			maxAfter := slices.Max(after)

			// The live server is lost; the old backup goes to a new one.
			live.Stop()
			fresh := testenv.StartRedis(t)
			r := openValkey(t, fresh, "starlease")
			if _, err := r.Restore(ctx, bytes.NewReader(backup.Bytes())); err != nil {
				t.Fatal(err)
			}
			// (a) the namespace refuses work until verified.
			_, err = r.Acquire(ctx, acquire("refused"))
			if lease.CodeOf(err) != lease.CodeBackendUnavailable {
				t.Fatalf("acquire before verification: %v", err)
			}
			_, err = r.AuthorizeCommit(ctx, staleCommit(stale, "commit-refused"))
			if lease.CodeOf(err) != lease.CodeBackendUnavailable {
				t.Fatalf("commit before verification: %v", err)
			}

			var proof Proof
			if withProof {
				proof = w.proof(t)
				if proof.Marks[stale.LockKey] != maxAfter || proof.Marks[unseen.LockKey] != unseen.FencingToken {
					t.Fatalf("downstream proof %v; want %s=%d", proof.Marks, stale.LockKey, maxAfter)
				}
			}
			ns, err := valkey.NewNamespace(valkey.Options{Addr: fresh.Addr(), KeyPrefix: "starlease", ReapInterval: -1}).OpenClosed(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rec := &audittest.Recorder{}
			rep, err := Verify(ctx, ns, proof, Options{Audit: rec})
			if err != nil {
				t.Fatal(err)
			}
			// Downstream is ahead of the backup either way: the epoch path,
			// from the proof's marks or, without it, from the restored counters.
			wantMax := stale.FencingToken
			if withProof {
				wantMax = maxAfter
				if !slices.Equal(rep.Shortfalls, sortedKeys(stale.LockKey, unseen.LockKey)) {
					t.Fatalf("shortfalls %v", rep.Shortfalls)
				}
			}
			if !rep.Epoch || rep.MaxKnownToken != wantMax || rep.Floor != wantMax+DefaultEpochGap ||
				!slices.Equal(rep.Revoked, []string{stale.LeaseID}) {
				t.Fatalf("report %+v", rep)
			}
			if len(rec.OfType(audit.EventRecoveryVerify)) != 1 || len(rec.OfType(audit.EventRecoveryReopen)) != 1 {
				t.Fatalf("audit events %+v", rec.Events())
			}
			// (c) the stale holder from before the restore cannot commit,
			// and CouchDB refuses its token by itself.
			if _, err := r.AuthorizeCommit(ctx, staleCommit(stale, "commit-stale")); lease.CodeOf(err) != lease.CodeLost {
				t.Fatalf("stale commit: %v", err)
			}
			if err := w.writer.Commit(ctx, staleCommitter.Guard(late), couchdb.Doc{ID: "doc-target-a", Body: staleBody}); lease.CodeOf(err) != lease.CodeCommitRejected {
				t.Fatalf("CouchDB's answer to the stale token: %v", err)
			}
			// (d) a replayed pre-backup request returns its original result.
			replay, err := r.Acquire(ctx, withTarget(acquire("a-2"), "target-a"))
			if err != nil || !replay.Replayed || replay.Lease.LeaseID != stale.LeaseID || replay.Lease.FencingToken != stale.FencingToken {
				t.Fatalf("replay: %+v %v", replay, err)
			}
			// (b) every new token is above every token accepted downstream,
			// and downstream accepts it.
			for _, target := range []string{"target-a", "target-new", "target-other"} {
				got := w.work(t, r, target, "post-"+target, false)
				if got.FencingToken <= maxAfter || got.FencingToken <= unseen.FencingToken || got.FencingToken != rep.Floor+1 {
					t.Fatalf("%s: new token %d; downstream max %d, floor %d", target, got.FencingToken, maxAfter, rep.Floor)
				}
			}
		})
	}
}

// staleCommit is a commit request of the stale holder, on its identity.
func staleCommit(l *lease.Record, id string) lease.CommitRequest {
	c := commit(l, id)
	c.Identity = l.Identity()
	return c
}

func sortedKeys(keys ...string) []string { slices.Sort(keys); return slices.Compact(keys) }

func withTarget(r lease.AcquireRequest, target string) lease.AcquireRequest {
	r.Identity.TargetID = target
	return r
}

// Failover: a replica promoted after the primary issued tokens it never
// replicated (asynchronous replication) would issue them again; Seal and
// the epoch step put every new token above them.
func TestValkeyFailoverEpoch(t *testing.T) {
	ctx := context.Background()
	primary, replica := testenv.StartRedis(t), testenv.StartRedis(t)
	s := openValkey(t, primary, "starlease")
	first, err := s.Acquire(ctx, acquire("before-replication"))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := vk.NewClient(vk.ClientOption{InitAddress: []string{replica.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	host, port := "127.0.0.1", primary.Addr()[len("127.0.0.1:"):]
	p, _ := strconv.ParseInt(port, 10, 64)
	if err := rc.Do(ctx, rc.B().Replicaof().Host(host).Port(p).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	key := lockKeyOf(t, ident.TargetID)
	counter := "starlease:{" + key[len(lease.KeyPrefix):] + "}:counter"
	for limit := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if v, _ := rc.Do(ctx, rc.B().Get().Key(counter).Build()).ToString(); v == "1" {
			break
		}
		if time.Now().After(limit) {
			t.Fatal("the replica never caught up")
		}
	}
	// The link is cut (the primary is about to be lost): what the primary
	// issues now never reaches the replica.
	if err := rc.Do(ctx, rc.B().Replicaof().No().One().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// The primary goes on: the replicated lease ends, its identity and a
	// new one get tokens the replica never sees.
	var lostTokens []uint64
	if _, err := s.Release(ctx, release(first.Lease, "rel-first")); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{ident.TargetID, ident.TargetID, "target-b"} {
		res, err := s.Acquire(ctx, withTarget(acquire("lost-"+strconv.Itoa(len(lostTokens))), target))
		if err != nil {
			t.Fatal(err)
		}
		lostTokens = append(lostTokens, res.Lease.FencingToken)
		rel := release(res.Lease, "rel-lost-"+strconv.Itoa(len(lostTokens)))
		rel.Identity.TargetID = target
		if _, err := s.Release(ctx, rel); err != nil {
			t.Fatal(err)
		}
	}
	primary.Stop()

	// The promoted replica's counter is behind what was issued: without
	// the epoch step it would hand out an issued token again.
	promoted := openValkey(t, replica, "starlease")
	if v, _ := rc.Do(ctx, rc.B().Get().Key(counter).Build()).ToString(); v != "1" {
		t.Fatalf("promoted counter %q, want the replicated 1", v)
	}
	if _, err := promoted.Seal(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := promoted.Acquire(ctx, withTarget(acquire("too-early"), "target-b")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire on a sealed namespace: %v", err)
	}
	ns, err := valkey.NewNamespace(valkey.Options{Addr: replica.Addr(), KeyPrefix: "starlease", ReapInterval: -1}).OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(ctx, ns, Proof{}, Options{EpochGap: 1000})
	if err != nil || !rep.Epoch || rep.Floor != 1+1000 || !slices.Equal(rep.Revoked, []string{first.Lease.LeaseID}) {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	for _, target := range []string{ident.TargetID, "target-b"} {
		res, err := promoted.Acquire(ctx, withTarget(acquire("after-"+target), target))
		if err != nil || res.Lease.FencingToken <= slices.Max(lostTokens) {
			t.Fatalf("%s after failover: %+v %v; tokens issued before %v", target, res.Lease, err, lostTokens)
		}
	}
}

// An active record ahead of its counter (a crafted or damaged namespace)
// counts as a known token: even a complete proof below it takes the epoch
// path, and the record's token is never issued again.
func TestActiveTokenCountsAsKnown(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	s := openValkey(t, r, "starlease")
	held := underLease(t, s, "target-a", "a-1", true, func(*lease.Record, *fence.Committer) {})
	rc, err := vk.NewClient(vk.ClientOption{InitAddress: []string{r.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := s.Seal(ctx); err != nil {
		t.Fatal(err)
	}
	counter := "starlease:{" + held.LockKey[len(lease.KeyPrefix):] + "}:counter"
	if err := rc.Do(ctx, rc.B().Del().Key(counter).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ns, err := valkey.NewNamespace(valkey.Options{Addr: r.Addr(), KeyPrefix: "starlease", ReapInterval: -1}).OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(ctx, ns, Proof{Complete: true, Sources: []string{"test"}}, Options{EpochGap: 10})
	if err != nil || !rep.Epoch || !slices.Equal(rep.Shortfalls, []string{held.LockKey}) || rep.Floor != held.FencingToken+10 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	next := underLease(t, s, "target-a", "a-2", false, func(*lease.Record, *fence.Committer) {})
	if next.FencingToken <= held.FencingToken {
		t.Fatalf("token %d issued again after recovery (held %d)", next.FencingToken, held.FencingToken)
	}
}
