package httpapi_test

import (
	"bytes"
	"encoding/base64"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/internal/testenv"
)

// An attack review of fenced publication over HTTP, with the relay and a
// real broker: what is refused is never delivered, what is accepted is
// delivered once.

// TestPublicationAttackStaleReplayForgedHeaders: over HTTP with the relay
// running, an old holder's replays, changed replays, forged fence headers,
// a successor reusing the commit id and a secret-shaped commit id; every
// accepted publication is delivered, nothing refused ever is, and the
// secret-shaped commit id appears in no log or audit line of the server.
func TestPublicationAttackStaleReplayForgedHeaders(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	broker := testenv.StartRabbitMQ(t)
	const queue = "replay-q"
	broker.DeclareQueues(t, queue)
	rows := newRowRecorder()
	s := startServer(t, bin, rows, "--rabbitmq-url-file", writeURLFile(t, broker.URL()), "--relay-poll-interval", "50ms",
		"--publish-exchanges", "(default)")
	k := s.createKey("prn-rp", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
	adm := s.createKey("prn-rp-admin", "administrator", "targets:lease,targets:force-release", "tenant:tenant-a,program:program-a")
	var bodies sync.Map
	got := testenv.NewDeliveries(func(m amqp.Delivery) bool { bodies.Store(m.MessageId, string(m.Body)); return true })
	got.Consume(t, broker.URL(), queue)

	id := identity(uniqueID("rp"), "usernamegen")
	a := post(t, s, k, "/acquire", acquireBody(id, uniqueID("req")))
	wantStatus(t, a, 200, "lease_acquired")
	l := leaseOf(t, a, "lease")
	secretLike := secretOf(k.APIKey) // 64 hex digits: the key's own secret
	commit := func(l map[string]any, commitID string, outbox map[string]any) rawResp {
		return post(t, s, k, "/commits/authorize", map[string]any{"lock_identity": id, "lease_id": l["lease_id"],
			"fencing_token": l["fencing_token"], "service_instance_id": "inst-raw", "sink": "rabbitmq",
			"commit_id": commitID, "execution_id": "exec-raw", "job_id": "job-raw", "outbox": outbox})
	}
	msg := func(body string, h map[string]any) map[string]any {
		m := map[string]any{"routing_key": queue, "body": base64.StdEncoding.EncodeToString([]byte(body))}
		if h != nil {
			m["headers"] = h
		}
		return m
	}
	var accepted []string
	// A 64-hex commit id (a digest is one) is accepted, and audited and
	// logged only redacted (checked at the end).
	c1 := commit(l, secretLike, msg("one", map[string]any{"a": "1"}))
	wantStatus(t, c1, 200, "lease_inspected")
	accepted = append(accepted, c1.JSON["commit"].(map[string]any)["target"].(string))
	c2 := commit(l, "c-two", msg("two", nil))
	wantStatus(t, c2, 200, "lease_inspected")
	accepted = append(accepted, c2.JSON["commit"].(map[string]any)["target"].(string))

	// Forged fence headers, any case, escaped: 400, nothing stored.
	for _, h := range []map[string]any{{"X-StarIntel-Fencing-Token": "99"}, {"x-starintel-lease-id": "lease_x"},
		{"CC": "other"}, {"bcc": "x"}, {"x-starintel-": "x"}} {
		r := commit(l, uniqueID("forged"), msg("forged", h))
		wantStatus(t, r, 400, "invalid_lease_request")
	}
	// Same commit id, changed message: 409 every way.
	for _, m := range []map[string]any{msg("two!", nil), msg("two", map[string]any{"a": "1"}),
		with(msg("two", nil), "content_type", "text/plain"), with(msg("two", nil), "routing_key", queue+"x")} {
		wantStatus(t, commit(l, "c-two", m), 409, "idempotency_conflict")
	}

	// Revoke; the old holder's new publication is refused, its replay is
	// answered (no second entry), a changed replay conflicts.
	wantStatus(t, post(t, s, adm, "/"+l["lease_id"].(string)+"/revoke", map[string]any{"lock_identity": id,
		"fencing_token": l["fencing_token"], "reason": "test", "request_id": uniqueID("rev")}), 200, "lease_revoked")
	r := commit(l, "c-after", msg("stale", nil))
	if r.Status != 409 || r.code() != "lease_lost" {
		t.Fatalf("stale new publication: %d %s", r.Status, r.Body)
	}
	rp := commit(l, "c-two", msg("two", nil))
	if rp.Status != 200 || rp.JSON["replayed"] != true {
		t.Fatalf("stale replay: %d %s", rp.Status, rp.Body)
	}
	wantStatus(t, commit(l, "c-two", msg("stale body", nil)), 409, "idempotency_conflict")

	// A successor reusing the commit id: conflict, never the first answer.
	b := post(t, s, k, "/acquire", acquireBody(id, uniqueID("req")))
	wantStatus(t, b, 200, "lease_acquired")
	l2 := leaseOf(t, b, "lease")
	wantStatus(t, commit(l2, "c-two", msg("two", nil)), 409, "idempotency_conflict")
	c3 := commit(l2, "c-three", msg("three", nil))
	wantStatus(t, c3, 200, "lease_inspected")
	accepted = append(accepted, c3.JSON["commit"].(map[string]any)["target"].(string))

	got.WaitFor(t, accepted, 30*time.Second)
	time.Sleep(time.Second)
	if got.Distinct() != len(accepted) {
		t.Fatalf("%d distinct deliveries, %d accepted", got.Distinct(), len(accepted))
	}
	bodies.Range(func(k, v any) bool {
		if v == "stale" || v == "forged" || v == "stale body" || v == "two!" {
			t.Errorf("refused publication delivered: %v %v", k, v)
		}
		return true
	})
	for _, out := range [][]byte{s.Stdout(), s.Stderr()} {
		if bytes.Contains(out, []byte(secretLike)) {
			t.Errorf("the secret-shaped commit id appears in the server's output")
		}
	}
}
