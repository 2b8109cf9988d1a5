package httpapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/httpapi"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// TestE2EFencedPublication: a publication made over HTTP (the Go client's
// LeaseStore under rabbitmq.Publisher, and the raw outbox object) enters
// the bolt backend's outbox in the commit's atomic step; a replay is
// idempotent, a changed publication under the same commit id is
// idempotency_conflict, and after revoke the holder's publication is
// refused and nothing of it enters the outbox. The outbox is read back
// from the store file once the server has stopped (bbolt admits one
// process per file).
func TestE2EFencedPublication(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	rows := newRowRecorder()
	s := startServer(t, bin, rows)
	k := s.createKey("prn-pub", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
	adm := s.createKey("prn-pub-admin", "administrator", "targets:lease,targets:force-release", "tenant:tenant-a,program:program-a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// 1. Through the Go client: executor-style lease, rabbitmq.Publisher.
	store := client.NewLeaseStore(s.client(k), k.Principal)
	id := identity(uniqueID("pub"), "usernamegen")
	acq, err := store.Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: "inst-pub", TTL: 30 * time.Second,
		ExecutionID: "exec-pub", JobID: "job-pub", Mutation: lease.Mutation{RequestID: uniqueID("req"), DeadlineAt: time.Now().Add(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	committer := fence.NewCommitter(store, fence.EnvelopeOf(acq.Lease), lease.Caller{PrincipalID: k.Principal})
	var lost *lease.Error
	pub := rabbitmq.NewPublisher(store, rabbitmq.WithLossHandler(func(e *lease.Error) { lost = e }))
	msg := lease.OutboxMessage{Exchange: "documents", RoutingKey: "documents.ingest.person", ContentType: "application/json",
		Body: []byte(`{"dtype":"person","fname":"ada"}`)}
	p1, err := pub.Publish(ctx, committer, "commit-1", msg)
	if err != nil {
		t.Fatalf("publish over HTTP: %v", err)
	}
	want, err := rabbitmq.MessageID(fence.EnvelopeOf(acq.Lease), rabbitmq.DefaultSink, "commit-1")
	if err != nil || p1.MessageID != want || p1.Replayed || p1.Guard.PayloadSHA256 != sha256hex(msg.Body) {
		t.Fatalf("publication %+v (want message id %s, %v)", p1, want, err)
	}
	// Replay: the same commit id and message is the original acceptance.
	p1r, err := pub.Publish(ctx, committer, "commit-1", msg)
	if err != nil || !p1r.Replayed || p1r.MessageID != p1.MessageID || p1r.Guard.CommitSeq != p1.Guard.CommitSeq {
		t.Fatalf("replayed publication %+v, %v", p1r, err)
	}
	// A changed publication under the same commit id: body, routing key.
	for _, changed := range []lease.OutboxMessage{
		{Exchange: msg.Exchange, RoutingKey: msg.RoutingKey, ContentType: msg.ContentType, Body: []byte(`{"dtype":"person","fname":"eve"}`)},
		{Exchange: msg.Exchange, RoutingKey: "documents.ingest.other", ContentType: msg.ContentType, Body: msg.Body},
	} {
		if _, err := pub.Publish(ctx, committer, "commit-1", changed); lease.CodeOf(err) != lease.CodeIdempotencyConflict {
			t.Fatalf("changed publication under one commit id: %v", err)
		}
	}
	// A binary body at the bound (64 KiB): the commit route's body limit
	// takes its base64 form.
	big := bytes.Repeat([]byte{0x00, 0xff, 0x7f, 0x80}, lease.MaxOutboxBody/4)
	p2, err := pub.Publish(ctx, committer, "commit-2", lease.OutboxMessage{RoutingKey: "documents.big", Body: big})
	if err != nil {
		t.Fatalf("64 KiB publication: %v", err)
	}

	// The executor over HTTP: its lease's committer publishes.
	var p3 rabbitmq.Publication
	err = executor.Run(ctx, store, executor.Spec{Identity: identity(uniqueID("pub-exec"), "usernamegen"), ServiceInstanceID: "inst-exec",
		ExecutionID: "exec-x", JobID: "job-x", Caller: lease.Caller{PrincipalID: k.Principal}, TTL: 10 * time.Second},
		func(ctx context.Context, l *executor.Lease) error {
			var err error
			p3, err = pub.Publish(ctx, l.Committer(), "exec-commit", lease.OutboxMessage{RoutingKey: "documents.exec", Body: []byte("from the executor")})
			return err
		})
	if err != nil || p3.MessageID == "" {
		t.Fatalf("executor publication over HTTP: %+v, %v", p3, err)
	}

	// 2. Raw wire: the outbox object, its refusals and replays.
	raw := identity(uniqueID("pub-raw"), "usernamegen")
	a := post(t, s, k, "/acquire", acquireBody(raw, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	commit := map[string]any{"lock_identity": raw, "lease_id": l["lease_id"], "fencing_token": l["fencing_token"],
		"service_instance_id": "inst-raw", "sink": "rabbitmq", "commit_id": "raw-1", "execution_id": "exec-raw", "job_id": "job-raw",
		"outbox": map[string]any{"exchange": "", "routing_key": "q-raw", "content_type": "text/plain",
			"body": base64.StdEncoding.EncodeToString([]byte("hello"))}}
	c1 := post(t, s, k, "/commits/authorize", commit)
	wantStatus(t, c1, 200, "lease_inspected")
	cm, _ := c1.JSON["commit"].(map[string]any)
	rawID, _ := cm["target"].(string)
	if !strings.HasPrefix(rawID, "msg_") || cm["payload_sha256"] != sha256hex([]byte("hello")) {
		t.Fatalf("raw publication answer %s", c1.Body)
	}
	if r := post(t, s, k, "/commits/authorize", commit); r.Status != 200 || r.JSON["replayed"] != true {
		t.Fatalf("raw replay %d %s", r.Status, r.Body)
	}
	outboxWith := func(kv ...any) map[string]any {
		return with(commit, "outbox", with(commit["outbox"].(map[string]any), kv...))
	}
	wantStatus(t, post(t, s, k, "/commits/authorize", outboxWith("body", base64.StdEncoding.EncodeToString([]byte("hullo")))), 409, "idempotency_conflict")
	wantStatus(t, post(t, s, k, "/commits/authorize", outboxWith("content_type", "text/html")), 409, "idempotency_conflict")
	wantStatus(t, post(t, s, k, "/commits/authorize", outboxWith("exchange", "documents")), 409, "idempotency_conflict")
	for name, body := range map[string]map[string]any{
		"target beside outbox":  with(commit, "commit_id", "raw-2", "target", "doc-1"),
		"digest beside outbox":  with(commit, "commit_id", "raw-2", "payload_sha256", sha256hex([]byte("hello"))),
		"unpadded base64":       with(outboxWith("body", "aGVsbG8"), "commit_id", "raw-2"),
		"base64 with a newline": with(outboxWith("body", "aGVs\nbG8="), "commit_id", "raw-2"),
		"url-safe base64":       with(outboxWith("body", "-_8="), "commit_id", "raw-2"),
		"body over 64 KiB":      with(outboxWith("body", base64.StdEncoding.EncodeToString(make([]byte, lease.MaxOutboxBody+1))), "commit_id", "raw-2"),
		"unknown outbox field":  with(outboxWith("priority", 5), "commit_id", "raw-2"),
		"non-string header":     with(outboxWith("headers", map[string]any{"x-n": 5}), "commit_id", "raw-2"),
		"no routing key":        with(outboxWith("routing_key", ""), "commit_id", "raw-2"),
	} {
		r := post(t, s, k, "/commits/authorize", body)
		if r.Status != 400 || r.code() != "invalid_lease_request" {
			t.Errorf("%s: %d %s", name, r.Status, r.Body)
		}
	}
	// The commit route's body stays bounded; other routes keep 64 KiB.
	huge := with(commit, "commit_id", "raw-3", "trace_id", strings.Repeat("a", httpapi.MaxCommitBodyBytes))
	if r := post(t, s, k, "/commits/authorize", huge); r.Status != 400 || !bytes.Contains(r.Body, []byte(strconv.Itoa(httpapi.MaxCommitBodyBytes))) {
		t.Fatalf("oversized commit body: %d %s", r.Status, r.Body)
	}
	if r := post(t, s, k, "/acquire", with(acquireBody(raw, uniqueID("req")), "trace_id", strings.Repeat("a", 70<<10))); r.Status != 400 || !bytes.Contains(r.Body, []byte("65536")) {
		t.Fatalf("oversized acquire body: %d %s", r.Status, r.Body)
	}

	// 3. After revoke, the holder's publication is refused (lease_lost)
	// and never enters the outbox; the accepted one's replay still
	// answers for its own message.
	rev := post(t, s, adm, "/"+acq.Lease.LeaseID+"/revoke", map[string]any{"lock_identity": id,
		"fencing_token": acq.Lease.FencingToken, "reason": "test revoke", "request_id": uniqueID("req-rev")})
	wantStatus(t, rev, 200, "lease_revoked")
	if _, err := pub.Publish(ctx, committer, "commit-3", lease.OutboxMessage{RoutingKey: "documents.refused", Body: []byte("stale")}); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("publication after revoke: %v", err)
	}
	if lost == nil || lost.Code != lease.CodeLost {
		t.Fatalf("the loss handler saw %v", lost)
	}

	// Read the outbox back from the store file.
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	bs, err := bolt.Open(filepath.Join(s.DataDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	pending, err := bs.OutboxPending(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range pending {
		got = append(got, e.MessageID)
		switch e.MessageID {
		case p1.MessageID:
			if e.Message.RoutingKey != msg.RoutingKey || !bytes.Equal(e.Message.Body, msg.Body) || e.Message.Exchange != "documents" ||
				e.Message.ContentType != "application/json" || e.FencingToken != acq.Lease.FencingToken || e.CommitID != "commit-1" {
				t.Errorf("outbox entry %+v", e)
			}
		case p2.MessageID:
			if !bytes.Equal(e.Message.Body, big) {
				t.Error("the 64 KiB body did not survive the round trip")
			}
		case p3.MessageID:
			if string(e.Message.Body) != "from the executor" || e.ExecutionID != "exec-x" {
				t.Errorf("executor outbox entry %+v", e)
			}
		case rawID:
			if string(e.Message.Body) != "hello" || e.Message.RoutingKey != "q-raw" || e.Message.ContentType != "text/plain" {
				t.Errorf("raw outbox entry %+v", e)
			}
		default:
			t.Errorf("unexpected outbox entry %s (%s)", e.MessageID, e.Message.RoutingKey)
		}
	}
	if len(pending) != 4 {
		t.Fatalf("outbox holds %v, want exactly the four accepted publications", got)
	}
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
