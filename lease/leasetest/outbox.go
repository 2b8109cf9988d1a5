package leasetest

import (
	"bytes"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

// outboxOf returns the pending outbox entries of lockKey.
func (e *env) outboxOf(key string) []lease.OutboxEntry {
	e.t.Helper()
	box, ok := e.st.(lease.Outbox)
	if !ok {
		e.t.Fatal("the backend has no fenced outbox (lease.Outbox)")
	}
	all, err := box.OutboxPending(bg, 0)
	if err != nil {
		e.t.Fatalf("outbox pending: %v", err)
	}
	var out []lease.OutboxEntry
	for _, en := range all {
		if en.LockKey == key {
			out = append(out, en)
		}
	}
	return out
}

func (e *env) outboxDone(id string) {
	e.t.Helper()
	if err := e.st.(lease.Outbox).OutboxDone(bg, id); err != nil {
		e.t.Fatalf("outbox done: %v", err)
	}
}

func publication(body string) *lease.OutboxMessage {
	return &lease.OutboxMessage{Exchange: "starintel.results", RoutingKey: "target.result", ContentType: "application/json", Body: []byte(body)}
}

// fenced_outbox: a publication enters the outbox only in the same atomic
// operation as an accepted lease check; a stale holder's never does.
func (s *suite) fencedOutbox(t *testing.T) {
	s.leaf(t, "accepted_commit_appends_once", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "rabbitmq")
		r.Target, r.PayloadSHA256 = "", "" // the message is the write
		r.Outbox = publication(`{"open_ports":[22,443]}`)
		c := e.mustCommit(r)
		got := e.outboxOf(e.key)
		if len(got) != 1 {
			e.t.Fatalf("want one outbox entry, got %d", len(got))
		}
		en := got[0]
		if en.LeaseID != rec.LeaseID || en.FencingToken != rec.FencingToken || en.CommitID != r.CommitID ||
			en.Sink != "rabbitmq" || en.ExecutionID != rec.ExecutionID || en.AcceptedAt != c.AcceptedAt ||
			en.Identity != e.id || !bytes.Equal(en.Message.Body, r.Outbox.Body) || en.Message.RoutingKey != "target.result" ||
			en.Message.Headers != nil {
			e.t.Fatalf("outbox entry %s does not match the commit %+v", js(en), c)
		}
		// A retry of the same commit replays it and appends nothing.
		e.mustReplayCommit(r, c)
		if again := e.outboxOf(e.key); len(again) != 1 || again[0].MessageID != en.MessageID {
			e.t.Fatalf("a replayed commit must not append: %s", js(again))
		}
		e.outboxDone(en.MessageID)
		e.outboxDone(en.MessageID) // removing twice is not an error
		if left := e.outboxOf(e.key); len(left) != 0 {
			e.t.Fatalf("outbox after done: %s", js(left))
		}
	})
	s.leaf(t, "stale_holder_publication_never_enters", func(e *env) {
		old := e.grab()
		e.mustRelease(e.releaseReq(old))
		succ := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		stale := e.commitReq(old, "rabbitmq")
		stale.Target, stale.PayloadSHA256 = "", "" // the message is the write
		stale.Outbox = publication(`{"from":"stale"}`)
		e.commitFails(stale, lease.CodeLost)
		fresh := e.commitReq(succ, "rabbitmq")
		fresh.Target, fresh.PayloadSHA256 = "", "" // the message is the write
		fresh.Outbox = publication(`{"from":"successor"}`)
		e.mustCommit(fresh)
		got := e.outboxOf(e.key)
		if len(got) != 1 || string(got[0].Message.Body) != `{"from":"successor"}` || got[0].FencingToken != succ.FencingToken {
			e.t.Fatalf("only the successor's publication may be pending: %s", js(got))
		}
		e.outboxDone(got[0].MessageID)
	})
	s.leaf(t, "expired_holder_publication_never_enters", func(e *env) {
		rec := e.grabShort()
		e.waitExpired(rec)
		r := e.commitReq(rec, "rabbitmq")
		r.Target, r.PayloadSHA256 = "", "" // the message is the write
		r.Outbox = publication(`{}`)
		e.commitFails(r, lease.CodeLost)
		if got := e.outboxOf(e.key); len(got) != 0 {
			e.t.Fatalf("an expired holder's publication entered the outbox: %s", js(got))
		}
	})
	s.leaf(t, "changed_publication_is_idempotency_conflict", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "rabbitmq")
		r.Target, r.PayloadSHA256 = "", "" // the message is the write
		r.Outbox = publication(`{"v":1}`)
		e.mustCommit(r)
		r.Outbox = publication(`{"v":2}`)
		e.commitFails(r, lease.CodeIdempotencyConflict)
		got := e.outboxOf(e.key)
		if len(got) != 1 || string(got[0].Message.Body) != `{"v":1}` {
			e.t.Fatalf("outbox: %s", js(got))
		}
		e.outboxDone(got[0].MessageID)
	})
	s.leaf(t, "bad_publication_is_invalid", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "rabbitmq")
		r.Target, r.PayloadSHA256 = "", "" // the message is the write
		r.Outbox = publication(string(make([]byte, lease.MaxOutboxBody+1)))
		_, err := e.st.AuthorizeCommit(bg, r)
		mustInvalid(e.t, err, "outbox.body")
		r.Outbox = &lease.OutboxMessage{RoutingKey: "a b"}
		_, err = e.st.AuthorizeCommit(bg, r)
		mustInvalid(e.t, err, "outbox.routing_key")
		// AMQP's short strings: 256 bytes could never be published.
		r.Outbox = &lease.OutboxMessage{RoutingKey: strings.Repeat("k", lease.MaxAMQPShortString+1)}
		_, err = e.st.AuthorizeCommit(bg, r)
		mustInvalid(e.t, err, "outbox.routing_key")
		r.Outbox = &lease.OutboxMessage{Exchange: strings.Repeat("x", lease.MaxAMQPShortString+1), RoutingKey: "k"}
		_, err = e.st.AuthorizeCommit(bg, r)
		mustInvalid(e.t, err, "outbox.exchange")
		if got := e.outboxOf(e.key); len(got) != 0 {
			e.t.Fatalf("invalid publications must change nothing: %s", js(got))
		}
	})
	s.leaf(t, "publication_headers_round_trip", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "rabbitmq")
		r.Target, r.PayloadSHA256 = "", "" // the message is the write
		r.Outbox = publication(`{"v":1}`)
		// Values a stored entry must keep byte for byte, and a header that
		// spells the entry's own accepted_at member (the Valkey function
		// fills that in by position).
		r.Outbox.Headers = map[string]string{"x-schema": "port-scan/v2", "Tenant-Hint": "a\tb \"é\" \\ <&>",
			"accepted_at": "1970-01-01T00:00:00.000Z", "message": `{"body":"x"}`, "empty": ""}
		c := e.mustCommit(r)
		got := e.outboxOf(e.key)
		if len(got) != 1 || !maps.Equal(got[0].Message.Headers, r.Outbox.Headers) || got[0].AcceptedAt != c.AcceptedAt ||
			string(got[0].Message.Body) != `{"v":1}` {
			e.t.Fatalf("outbox entry %s, want headers %v", js(got), r.Outbox.Headers)
		}
		// The same headers, in a map of their own: a replay.
		same := r
		same.Outbox = publication(`{"v":1}`)
		same.Outbox.Headers = maps.Clone(r.Outbox.Headers)
		e.mustReplayCommit(same, c)
		// Other headers under the same commit id: a changed value, a
		// changed name case, one more, none.
		for _, other := range []map[string]string{
			withHeader(r.Outbox.Headers, "x-schema", "port-scan/v3"),
			withHeader(withoutHeader(r.Outbox.Headers, "x-schema"), "X-Schema", "port-scan/v2"),
			withHeader(r.Outbox.Headers, "x-extra", ""),
			nil,
		} {
			changed := r
			changed.Outbox = publication(`{"v":1}`)
			changed.Outbox.Headers = other
			e.commitFails(changed, lease.CodeIdempotencyConflict)
		}
		if again := e.outboxOf(e.key); len(again) != 1 || !maps.Equal(again[0].Message.Headers, r.Outbox.Headers) {
			e.t.Fatalf("outbox after conflicting replays: %s", js(again))
		}
		e.outboxDone(got[0].MessageID)
	})
	s.leaf(t, "bad_publication_headers_are_invalid", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "rabbitmq")
		r.Target, r.PayloadSHA256 = "", "" // the message is the write
		many := map[string]string{}
		for i := range lease.MaxOutboxHeaders + 1 {
			many[fmt.Sprintf("h-%02d", i)] = "v"
		}
		big := map[string]string{}
		for i := range 5 {
			big[fmt.Sprintf("h-%d", i)] = strings.Repeat("v", lease.MaxOutboxHeaderValueBytes)
		}
		for name, h := range map[string]map[string]string{
			"too many headers":     many,
			"reserved name":        {"X-StarIntel-Fencing-Token": "1"},
			"control character":    {"x-note": "a\rb"},
			"oversize value":       {"x-note": strings.Repeat("v", lease.MaxOutboxHeaderValueBytes+1)},
			"oversize all in all":  big,
			"oversize name":        {strings.Repeat("n", lease.MaxOutboxHeaderNameBytes+1): "v"},
			"space in header name": {"x note": "v"},
		} {
			r.Outbox = publication(`{}`)
			r.Outbox.Headers = h
			_, err := e.st.AuthorizeCommit(bg, r)
			if le := mustCode(e.t, err, lease.CodeInvalidRequest); le.Field != "outbox.headers" {
				e.t.Fatalf("%s: field %q, want outbox.headers (%v)", name, le.Field, err)
			}
		}
		if got := e.outboxOf(e.key); len(got) != 0 {
			e.t.Fatalf("invalid headers must change nothing: %s", js(got))
		}
		// Nothing was recorded under the commit id either: with good
		// headers it is a first acceptance, not a replay or a conflict.
		r.Outbox = publication(`{}`)
		r.Outbox.Headers = map[string]string{"x-note": "ok"}
		e.mustCommit(r)
		got := e.outboxOf(e.key)
		if len(got) != 1 || !maps.Equal(got[0].Message.Headers, r.Outbox.Headers) {
			e.t.Fatalf("outbox: %s", js(got))
		}
		e.outboxDone(got[0].MessageID)
	})
}

// withHeader and withoutHeader return a changed copy of h.
func withHeader(h map[string]string, name, value string) map[string]string {
	out := maps.Clone(h)
	out[name] = value
	return out
}

func withoutHeader(h map[string]string, name string) map[string]string {
	out := maps.Clone(h)
	delete(out, name)
	return out
}
