//go:build linux

package scenario

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/couchdb"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
	"github.com/starintel/starlease/valkey"
)

const (
	// leaseTTL is the actors' lease TTL.
	leaseTTL = 1500 * time.Millisecond
	// step bounds each expected actor event.
	step = 20 * time.Second
	// quiet is how long the consumer waits to be sure nothing more arrives.
	quiet = 2 * time.Second
)

// TestTwoActorsStaleHolderCannotCommit is the two-actor scenario of the
// fenced-write boundary, with two real actor processes on one target, one
// shared Valkey lease backend (redis-server, durable AOF), a CouchDB
// (pouchdb-server) and a RabbitMQ broker:
//
//  1. actor A acquires the target's lease (and, while it holds it,
//     authorizes one CouchDB commit whose write it keeps for later: a
//     holder that checked, then paused before writing);
//  2. A is paused with SIGSTOP; the test waits until the backend itself
//     reports A's lease expired;
//  3. actor B acquires the same target (token A+1), writes its CouchDB
//     result and publishes into the fenced outbox — both accepted — and
//     exits, releasing its lease;
//  4. A resumes (SIGCONT) and tries to write the CouchDB result and to
//     publish: both are rejected with lease_lost at the backend; the write
//     it authorized before the pause is refused by CouchDB itself
//     (validate_doc_update, 403: commit_rejected); A's work context has been
//     cancelled with a lease-loss cause;
//  5. the outbox holds B's publication only; a relay (in this process)
//     publishes it with confirms and a consumer receives exactly one message,
//     B's, with B's fence headers, and nothing else; the outbox is then
//     empty; the CouchDB document holds B's content and B's fence, at its
//     first revision.
//
// Every expectation about A and B is checked against what the actors and
// the servers report, not against constants.
func TestTwoActorsStaleHolderCannotCommit(t *testing.T) {
	began := time.Now()
	redis := testenv.StartRedis(t)
	couch := testenv.StartCouchDB(t)
	broker := testenv.StartRabbitMQ(t)
	serversUp := time.Now()
	t.Logf("servers: redis %s, couchdb %s, rabbitmq %s (started in %v)", redis.Addr(), couch.URL(), broker.Addr(),
		serversUp.Sub(began).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := randomHex(4)

	// The test's own view of the lease backend: same server, same key
	// namespace as the actors. It observes leases and is the relay's outbox.
	keyPrefix := "scenario-" + suffix
	observer, err := valkey.Open(ctx, valkey.Options{Addr: redis.Addr(), KeyPrefix: keyPrefix, ReapInterval: -1,
		StoreOptions: lease.StoreOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}})
	if err != nil {
		t.Fatalf("valkey.Open: %v", err)
	}
	t.Cleanup(func() { observer.Close() })
	if h := observer.Health(ctx); h.Status != lease.HealthOK {
		t.Fatalf("valkey store health %s: %s", h.Status, h.Reason)
	}

	// The fenced database.
	db, err := couchdb.New(couch.URL(), "scenario-"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.EnsureDatabase(ctx); err != nil {
		t.Fatalf("EnsureDatabase: %v", err)
	}
	if err := db.InstallFence(ctx); err != nil {
		t.Fatalf("InstallFence: %v", err)
	}
	const couchSink, resultName = "couchdb", "ports"
	writer, err := db.Writer(couchSink)
	if err != nil {
		t.Fatal(err)
	}
	results := couchdb.NewResults(writer)

	// The queue, on the default exchange.
	queue := "scenario.results." + suffix
	conn, err := amqp.Dial(broker.URL())
	if err != nil {
		t.Fatalf("amqp dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare queue: %v", err)
	}

	id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target-" + suffix, ActorName: "portscan"}
	cfgFor := func(name string) actorConfig {
		return actorConfig{Name: name, RedisAddr: redis.Addr(), KeyPrefix: keyPrefix, CouchURL: couch.URL(),
			CouchDB: db.Name(), CouchSink: couchSink, ResultName: resultName, Queue: queue, Identity: id,
			TTLMs: leaseTTL.Milliseconds()}
	}

	// 1. Actor A holds the lease, with one CouchDB commit authorized and
	// not yet written.
	cfgA := cfgFor("a")
	cfgA.PreAuthorize = true
	a := startActor(t, cfgA)
	aPre := a.attempt(attemptPreAuthorize, step)
	if !aPre.OK || aPre.Guard == nil {
		t.Fatalf("A could not authorize while holding the lease: %s", aPre.Error)
	}
	aHold := a.next(evHolding, step)
	if aHold.FencingToken < 1 || aHold.LeaseID == "" || aPre.Guard.LeaseID != aHold.LeaseID || aPre.Guard.FencingToken != aHold.FencingToken {
		t.Fatalf("A's holding line %+v does not match its authorization %+v", aHold, *aPre.Guard)
	}

	// 2. Pause A past its TTL.
	a.signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	a.waitState("T", 5*time.Second)
	t.Logf("A (pid %d) stopped (state T) %v after it reported holding lease %s (token %d)", a.pid(),
		stoppedAt.Sub(serversUp).Round(time.Millisecond), aHold.LeaseID, aHold.FencingToken)
	aRec := waitExpired(t, observer, aHold.LeaseID, leaseTTL+10*time.Second)
	expiredSeen := time.Now()
	if aRec.FencingToken != aHold.FencingToken || aRec.LockKey != aHold.LockKey {
		t.Fatalf("backend record of A's lease %+v does not match A's holding line", aRec)
	}
	t.Logf("backend reports A's lease %s: expires_at %s; seen %v after SIGSTOP", aRec.State, aRec.ExpiresAt,
		expiredSeen.Sub(stoppedAt).Round(time.Millisecond))
	if s := a.state(); s != "T" {
		t.Fatalf("A is no longer stopped (state %q)", s)
	}

	// 3. Actor B acquires the same target and commits.
	b := startActor(t, cfgFor("b"))
	bHold := b.next(evHolding, step)
	if bHold.LockKey != aHold.LockKey {
		t.Fatalf("B holds lock key %s, A held %s", bHold.LockKey, aHold.LockKey)
	}
	if bHold.FencingToken != aHold.FencingToken+1 || bHold.LeaseID == aHold.LeaseID {
		t.Fatalf("B holds lease %s token %d; A held %s token %d: want token A+1 and a new lease",
			bHold.LeaseID, bHold.FencingToken, aHold.LeaseID, aHold.FencingToken)
	}
	b.send("write")
	bCouch := b.attempt(attemptCouch, step)
	if !bCouch.OK || bCouch.Guard == nil || bCouch.Guard.LeaseID != bHold.LeaseID || bCouch.Guard.FencingToken != bHold.FencingToken {
		t.Fatalf("B's CouchDB write: %+v", bCouch)
	}
	bPub := b.attempt(attemptPublish, step)
	if !bPub.OK || bPub.MessageID == "" || bPub.Guard == nil || bPub.Guard.LeaseID != bHold.LeaseID || bPub.Guard.FencingToken != bHold.FencingToken {
		t.Fatalf("B's publication: %+v", bPub)
	}
	if bc := b.next(evCause, step); bc.Cause != "" {
		t.Fatalf("B's work context was cancelled while it held the lease: %s", bc.Cause)
	}
	if bd := b.next(evDone, step); bd.RunError != "" {
		t.Fatalf("B's executor.Run: %s", bd.RunError)
	}
	b.wait(step)
	bRec := inspect(t, observer, bHold.LeaseID)
	if bRec.State != lease.StateReleased {
		t.Fatalf("B's lease after B exited: %s, want released", bRec.State)
	}
	bDone := time.Now()
	t.Logf("B acquired token %d, committed, released (lease %s) and exited %v after it was started; A still stopped: %v",
		bHold.FencingToken, bRec.State, bDone.Sub(expiredSeen).Round(time.Millisecond), a.state() == "T")

	// 4. A resumes and tries to commit.
	a.signal(syscall.SIGCONT)
	resumedAt := time.Now()
	a.send("write")
	aCouch := a.attempt(attemptCouch, step)
	if aCouch.OK || aCouch.Code != lease.CodeLost {
		t.Fatalf("A's CouchDB write after resuming: ok=%v code=%q (%s), want lease_lost", aCouch.OK, aCouch.Code, aCouch.Error)
	}
	if aCouch.CouchKind != "" || aCouch.Guard != nil {
		t.Fatalf("A's CouchDB write reached CouchDB (kind %q): the backend must refuse it first", aCouch.CouchKind)
	}
	aPub := a.attempt(attemptPublish, step)
	if aPub.OK || aPub.Code != lease.CodeLost {
		t.Fatalf("A's publication after resuming: ok=%v code=%q (%s), want lease_lost", aPub.OK, aPub.Code, aPub.Error)
	}
	aStale := a.attempt(attemptStaleGuard, step)
	if aStale.OK || aStale.Code != lease.CodeCommitRejected || aStale.CouchKind != "ErrFenceRejected" ||
		!strings.Contains(aStale.Error, "HTTP 403") {
		t.Fatalf("A's write with the guard authorized before the pause: ok=%v code=%q kind=%q (%s), want CouchDB's 403 commit_rejected",
			aStale.OK, aStale.Code, aStale.CouchKind, aStale.Error)
	}
	aCause := a.next(evCause, step)
	if !aCause.LeaseLoss || aCause.Cause == "" || aCause.Sentinel == "ErrWorkDone" || aCause.Sentinel == "other" {
		t.Fatalf("A's work context: cause %q (sentinel %s, lease loss %v), want a lease-loss cause",
			aCause.Cause, aCause.Sentinel, aCause.LeaseLoss)
	}
	if aDone := a.next(evDone, step); aDone.RunError != "" {
		t.Logf("A's executor.Run returned: %s", aDone.RunError)
	}
	a.wait(step)
	aExited := time.Now()
	t.Logf("A resumed; its commits were refused and it exited %v after SIGCONT; work context cause: %s [%s]",
		aExited.Sub(resumedAt).Round(time.Millisecond), aCause.Cause, aCause.Sentinel)
	if rec := inspect(t, observer, aHold.LeaseID); rec.State != lease.StateExpired {
		t.Fatalf("A's lease at the end: %s, want expired", rec.State)
	}

	// 5a. The CouchDB document: B's content, B's fence, first revision.
	docID, err := db.ResultID(id, resultName)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := db.Get(ctx, docID)
	if err != nil {
		t.Fatalf("read back %s: %v", docID, err)
	}
	if !strings.HasPrefix(stored.Rev, "1-") {
		t.Fatalf("document %s is at revision %s: more than one write landed", docID, stored.Rev)
	}
	res, g, err := results.Get(ctx, id, resultName)
	if err != nil {
		t.Fatalf("results.Get: %v", err)
	}
	if g == nil || !sameGuard(*g, *bCouch.Guard) {
		t.Fatalf("stored fence %+v, want B's guard %+v", g, *bCouch.Guard)
	}
	if !jsonEqual(res.Data, bCouch.Body) {
		t.Fatalf("stored result data %s, want B's %s", res.Data, bCouch.Body)
	}
	if jsonEqual(res.Data, aCouch.Body) {
		t.Fatal("A's content is in the document")
	}
	t.Logf("CouchDB %s rev %s: data %s; fence lease %s token %d commit %s", docID, stored.Rev, res.Data,
		g.LeaseID, g.FencingToken, g.CommitID)

	// 5b. The outbox holds B's publication only.
	pending, err := observer.OutboxPending(ctx, 0)
	if err != nil {
		t.Fatalf("OutboxPending: %v", err)
	}
	if len(pending) != 1 {
		t.Fatalf("outbox holds %d entries before the relay, want 1 (B's): %+v", len(pending), pending)
	}
	if e := pending[0]; e.MessageID != bPub.MessageID || e.LeaseID != bHold.LeaseID || e.FencingToken != bHold.FencingToken ||
		e.LockKey != bHold.LockKey || !bytes.Equal(e.Message.Body, bPub.Body) {
		t.Fatalf("outbox entry %+v is not B's publication %+v", e, bPub)
	}
	t.Logf("outbox before the relay: 1 entry, %s (lease %s, token %d)", pending[0].MessageID, pending[0].LeaseID, pending[0].FencingToken)

	// 5c. Relay and consume.
	if err := ch.Qos(16, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "scenario-consumer", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	relay, err := rabbitmq.NewRelay(observer, broker.URL(), rabbitmq.RelayOptions{Mandatory: true,
		PollInterval: 20 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 300 * time.Millisecond,
		ConfirmTimeout: 5 * time.Second, DialTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	relayStart := time.Now()
	go func() { relayDone <- relay.Run(relayCtx) }()
	relayStopped := false
	stop := func() {
		if relayStopped {
			return
		}
		relayStopped = true
		stopRelay()
		select {
		case err := <-relayDone:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("relay.Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("the relay did not stop")
		}
	}
	t.Cleanup(stop)

	dedupe := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{})
	var got []rabbitmq.Fence
	var bodies [][]byte
	consume := func(d amqp.Delivery) {
		t.Helper()
		dec, err := dedupe.Handle(d, func(f rabbitmq.Fence, d amqp.Delivery) error {
			got = append(got, f)
			bodies = append(bodies, d.Body)
			return nil
		})
		if err != nil {
			t.Fatalf("consumer: %v", err)
		}
		t.Logf("consumer: delivery %s token %d lease %s redelivered=%v persistent=%v: %s (%s)", d.MessageId,
			dec.Fence.FencingToken, dec.Fence.LeaseID, d.Redelivered, d.DeliveryMode == amqp.Persistent, dec.Verdict, d.Body)
		if dec.Dropped() {
			t.Fatalf("consumer dropped a delivery: %s", dec.Reason)
		}
		if d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" {
			t.Fatalf("delivery mode %d, content type %q", d.DeliveryMode, d.ContentType)
		}
	}
	select {
	case d, ok := <-deliveries:
		if !ok {
			t.Fatal("the consumer's channel closed")
		}
		consume(d)
	case <-time.After(step):
		t.Fatalf("no delivery within %v of starting the relay (relay stats %+v)", step, relay.Stats())
	}
	firstAt := time.Now()
	for quietEnd := time.After(quiet); ; {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatal("the consumer's channel closed")
			}
			consume(d)
			continue
		case <-quietEnd:
		}
		break
	}
	if len(got) != 1 {
		t.Fatalf("the consumer received %d messages, want exactly 1 (B's)", len(got))
	}
	f := got[0]
	if f.MessageID != bPub.MessageID || f.LockKey != bHold.LockKey || f.LeaseID != bHold.LeaseID ||
		f.FencingToken != bHold.FencingToken || f.ExecutionID != bHold.ExecutionID || f.CommitID != bPub.CommitID ||
		f.Sink != bPub.Guard.Sink || !f.AcceptedAt.Time().Equal(bPub.Guard.AcceptedAt.Time()) {
		t.Fatalf("delivery fence %+v, want B's publication (guard %+v, message id %s)", f, *bPub.Guard, bPub.MessageID)
	}
	if !bytes.Equal(bodies[0], bPub.Body) {
		t.Fatalf("delivery body %s, want B's %s", bodies[0], bPub.Body)
	}
	if f.LeaseID == aHold.LeaseID || f.FencingToken == aHold.FencingToken {
		t.Fatal("the delivery carries A's fence")
	}

	// 5d. Nothing is left in the outbox.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p, err := observer.OutboxPending(ctx, 0)
		if err != nil {
			t.Fatalf("OutboxPending: %v", err)
		}
		if len(p) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("outbox still holds %d entries after the relay ran (stats %+v)", len(p), relay.Stats())
		}
	}
	stop()
	st := relay.Stats()
	if st.Confirmed != 1 || st.Removed != 1 || st.Failed != 0 {
		t.Fatalf("relay stats %+v, want 1 confirmed, 1 removed, 0 failed", st)
	}
	if p, err := observer.OutboxPending(ctx, 0); err != nil || len(p) != 0 {
		t.Fatalf("outbox after the relay stopped: %d entries (%v)", len(p), err)
	}
	t.Logf("relay: %+v; first delivery %v after the relay started; nothing else in %v; outbox empty",
		st, firstAt.Sub(relayStart).Round(time.Millisecond), quiet)
	t.Logf("timings: servers %v; SIGSTOP→expired at backend %v; B start→exit %v; SIGCONT→A exit %v; relay→delivery %v; total %v",
		serversUp.Sub(began).Round(time.Millisecond), expiredSeen.Sub(stoppedAt).Round(time.Millisecond),
		bDone.Sub(expiredSeen).Round(time.Millisecond), aExited.Sub(resumedAt).Round(time.Millisecond),
		firstAt.Sub(relayStart).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// inspect reads a lease by id at the backend.
func inspect(t *testing.T, s *valkey.Store, leaseID string) *lease.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: leaseID, DeadlineAt: time.Now().Add(5 * time.Second)})
	if err != nil {
		t.Fatalf("inspect %s: %v", leaseID, err)
	}
	if res.Lease == nil || res.Lease.LeaseID != leaseID {
		t.Fatalf("inspect %s returned %+v", leaseID, res.Lease)
	}
	return res.Lease
}

// waitExpired polls the backend until it reports the lease expired (by its
// own time) and returns the record.
func waitExpired(t *testing.T, s *valkey.Store, leaseID string, limit time.Duration) *lease.Record {
	t.Helper()
	for end := time.Now().Add(limit); ; time.Sleep(25 * time.Millisecond) {
		rec := inspect(t, s, leaseID)
		switch rec.State {
		case lease.StateExpired:
			return rec
		case lease.StateActive:
		default:
			t.Fatalf("lease %s is %s at the backend, want active then expired", leaseID, rec.State)
		}
		if time.Now().After(end) {
			t.Fatalf("lease %s still active at the backend after %v (expires_at %s)", leaseID, limit, rec.ExpiresAt)
		}
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func sameGuard(a, b fence.Guard) bool {
	return a.LockKey == b.LockKey && a.LeaseID == b.LeaseID && a.FencingToken == b.FencingToken &&
		a.ExecutionID == b.ExecutionID && a.TraceID == b.TraceID && a.Sink == b.Sink &&
		a.CommitID == b.CommitID && a.AcceptedAt.Time().Equal(b.AcceptedAt.Time())
}
