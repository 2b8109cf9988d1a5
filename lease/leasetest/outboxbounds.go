package leasetest

import (
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

// OutboxBounder is implemented by the Faults of a backend with a fenced
// outbox: it sets a fresh backend's outbox bounds
// (lease.StoreOptions.OutboxMaxPending and OutboxMaxBytes) before its
// first use, so the suite can fill a small outbox of its own.
type OutboxBounder interface {
	SetOutboxBounds(maxPending, maxBytes int64)
}

// boundedLeaf registers a parallel leaf on a backend of its own whose
// outbox has the given bounds: the outbox is shared by every identity of a
// backend, so a full one would refuse the other subtests' publications.
func (s *suite) boundedLeaf(t *testing.T, name string, maxPending, maxBytes int64, f func(e *env)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		b := s.newBackend(t)
		bd, ok := b.Faults.(OutboxBounder)
		if !ok {
			t.Fatal("leasetest: the backend's Faults cannot set its outbox bounds (OutboxBounder); every outbox must be bounded")
		}
		bd.SetOutboxBounds(maxPending, maxBytes)
		f(s.envOn(t, b))
	})
}

// usage reads the backend's outbox usage.
func (e *env) usage() lease.OutboxUsage {
	e.t.Helper()
	m, ok := e.st.(lease.OutboxMeter)
	if !ok {
		e.t.Fatal("the backend does not report its outbox usage (lease.OutboxMeter)")
	}
	u, err := m.OutboxUsage(bg)
	if err != nil {
		e.t.Fatalf("outbox usage: %v", err)
	}
	return u
}

// wantUsage checks the outbox's counters against the pending entries and
// bytes the test expects, and against the pending entries read back.
func (e *env) wantUsage(pending int, bytes int64) {
	e.t.Helper()
	u := e.usage()
	all, err := e.st.(lease.Outbox).OutboxPending(bg, 0)
	if err != nil {
		e.t.Fatalf("outbox pending: %v", err)
	}
	var read int64
	for _, en := range all {
		read += en.Message.Size()
	}
	if u.Pending != int64(pending) || u.Bytes != bytes || len(all) != pending || read != bytes {
		e.t.Fatalf("outbox usage %+v with %d entries of %d bytes read back; want %d entries of %d bytes",
			u, len(all), read, pending, bytes)
	}
}

// publicationReq is a commit under rec whose write is the publication m.
func (e *env) publicationReq(rec *lease.Record, m *lease.OutboxMessage) lease.CommitRequest {
	r := e.commitReq(rec, "rabbitmq")
	r.Target, r.PayloadSHA256 = "", "" // the message is the write
	r.Outbox = m
	return r
}

// sized is a publication whose body has n bytes, with headers h.
func sized(n int, h map[string]string) *lease.OutboxMessage {
	return &lease.OutboxMessage{Exchange: "starintel.results", RoutingKey: "target.result", ContentType: "application/octet-stream",
		Body: []byte(strings.Repeat("b", n)), Headers: h}
}

// outboxFull asserts that r is refused because the outbox is full: a
// retryable lease_backend_unavailable whose reason says so and is meant
// for the caller.
func (e *env) outboxFull(r lease.CommitRequest) {
	e.t.Helper()
	_, err := e.st.AuthorizeCommit(bg, r)
	le := mustCode(e.t, err, lease.CodeBackendUnavailable)
	if !le.Code.Retryable() || le.RetryAfter <= 0 || !le.PublicReason || !strings.Contains(le.Reason, "the outbox is full") {
		e.t.Fatalf("a full outbox must refuse retryably, with a retry hint and a reason for the caller: %+v", le)
	}
}

// bounded_outbox: the pending outbox is bounded in entries and bytes
// (body and headers), checked in the commit's atomic step. A publication
// that does not fit is refused retryably and changes nothing: its commit
// id stays unused, so the same commit succeeds once the relay drained an
// entry. The counters stay exact through appends, removals and
// dead-letter moves.
func (s *suite) boundedOutbox(t *testing.T) {
	s.boundedLeaf(t, "full_outbox_refuses_retryably_and_changes_nothing", 3, 1<<20, func(e *env) {
		rec := e.grab()
		var accepted []lease.CommitRequest
		var last lease.Commit
		var bytes int64
		for i := range 3 {
			r := e.publicationReq(rec, sized(10+i, nil))
			last = e.mustCommit(r)
			accepted = append(accepted, r)
			bytes += r.Outbox.Size()
		}
		e.wantUsage(3, bytes)
		refused := e.publicationReq(rec, sized(5, map[string]string{"x-note": "late"}))
		e.outboxFull(refused)
		e.outboxFull(refused) // a retry while it is still full: the same answer
		e.wantUsage(3, bytes)
		// A retry of an accepted publication replays; a full outbox does
		// not refuse what is already in it.
		first := e.mustCommitReplayOf(accepted[0])
		// The relay confirms the oldest: the refused commit now fits, as a
		// first acceptance taking the next commit seq (the refusal took
		// none).
		e.outboxDone(e.outboxOf(e.key)[0].MessageID)
		e.wantUsage(2, bytes-accepted[0].Outbox.Size())
		c := e.mustCommit(refused)
		if c.Seq != last.Seq+1 {
			e.t.Fatalf("commit seq %d after %d: the refused commit consumed a sequence", c.Seq, last.Seq)
		}
		e.wantUsage(3, bytes-accepted[0].Outbox.Size()+refused.Outbox.Size())
		got := e.outboxOf(e.key)
		if len(got) != 3 || got[2].CommitID != refused.CommitID || got[2].AcceptedAt != c.AcceptedAt {
			e.t.Fatalf("outbox after the retry: %s", js(got))
		}
		e.mustReplayCommit(accepted[0], first)
	})
	s.boundedLeaf(t, "commit_without_publication_unaffected", 1, 1<<20, func(e *env) {
		rec := e.grab()
		p := e.publicationReq(rec, sized(10, nil))
		e.mustCommit(p)
		e.outboxFull(e.publicationReq(rec, sized(1, nil)))
		e.mustCommit(e.commitReq(rec, "couchdb"))
		e.wantUsage(1, p.Outbox.Size())
	})
	s.boundedLeaf(t, "byte_bound_counts_body_and_headers", 100, 1000, func(e *env) {
		rec := e.grab()
		a := e.publicationReq(rec, sized(600, nil))
		e.mustCommit(a)
		e.wantUsage(1, 600)
		// 300 body bytes would fit; with 105 bytes of header name and
		// value they do not.
		over := e.publicationReq(rec, sized(300, map[string]string{"x-pad": strings.Repeat("v", 100)}))
		if over.Outbox.Size() != 405 {
			e.t.Fatalf("size %d, want 405", over.Outbox.Size())
		}
		e.outboxFull(over)
		e.wantUsage(1, 600)
		// Exactly at the bound fits.
		b := e.publicationReq(rec, sized(300, map[string]string{"x-pad": strings.Repeat("v", 95)}))
		e.mustCommit(b)
		e.wantUsage(2, 1000)
		e.outboxFull(e.publicationReq(rec, sized(1, nil)))
		e.outboxDone(e.outboxOf(e.key)[0].MessageID)
		e.wantUsage(1, 400)
		e.mustCommit(over)
		e.wantUsage(2, 805)
	})
	s.boundedLeaf(t, "counters_exact_after_append_done_dead_letter", 100, 1<<20, func(e *env) {
		rec := e.grab()
		sizes := map[string]int64{} // message id → size, the pending entries
		var total int64
		check := func() {
			e.t.Helper()
			e.wantUsage(len(sizes), total)
		}
		add := func(m *lease.OutboxMessage) (lease.CommitRequest, lease.Commit) {
			e.t.Helper()
			r := e.publicationReq(rec, m)
			c := e.mustCommit(r)
			sizes[c.Target] = m.Size()
			total += m.Size()
			check()
			return r, c
		}
		drop := func(id string) {
			delete(sizes, id)
			total = 0
			for _, n := range sizes {
				total += n
			}
		}
		// Bodies of every length mod 3 (base64 padding), none, and headers
		// a stored entry escapes or that look like its members.
		add(sized(1, nil))
		r2, c2 := add(sized(2, map[string]string{"x-a": "1"}))
		_, c3 := add(sized(3, map[string]string{"Tenant-Hint": "a\tb \"é\" \\ <&> \u2028", "empty": ""}))
		_, c4 := add(&lease.OutboxMessage{RoutingKey: "k", Headers: map[string]string{"accepted_at": "1970-01-01T00:00:00.000Z"}})
		add(sized(4096, map[string]string{"x-b": strings.Repeat("é", 100)}))
		// Header names and values that spell the message's own members.
		add(sized(5, map[string]string{"body": `,"body":"QUFB","headers":{}}}`, "headers": "null"}))
		// A replay and a refused publication change nothing.
		e.mustReplayCommit(r2, c2)
		stale := e.publicationReq(rec, sized(7, nil))
		stale.FencingToken++
		e.commitFails(stale, lease.CodeLost)
		check()
		// The relay removes one; removing it again or an unknown id is
		// nothing.
		e.outboxDone(c3.Target)
		drop(c3.Target)
		check()
		e.outboxDone(c3.Target)
		e.outboxDone("msg_unknown")
		check()
		if dl, ok := e.st.(lease.OutboxDeadLetters); ok {
			// A dead letter leaves the pending outbox and its counters.
			if err := dl.OutboxDeadLetter(bg, c4.Target, "conformance: poison"); err != nil {
				e.t.Fatalf("dead letter: %v", err)
			}
			drop(c4.Target)
			check()
			if err := dl.OutboxDeadLetter(bg, c4.Target, "again"); err != nil {
				e.t.Fatalf("dead letter of an entry no longer pending: %v", err)
			}
			// Done of a dead letter's id is not a removal of anything
			// pending, and keeps the dead letter.
			e.outboxDone(c4.Target)
			check()
			dead, err := dl.OutboxDeadLetters(bg, 0)
			if err != nil || len(dead) != 1 || dead[0].Entry.MessageID != c4.Target {
				e.t.Fatalf("dead letters %s, %v", js(dead), err)
			}
		}
		add(sized(5, nil))
		for _, en := range e.outboxOf(e.key) {
			e.outboxDone(en.MessageID)
			drop(en.MessageID)
			check()
		}
		e.wantUsage(0, 0)
	})
}

// mustCommitReplayOf asserts that r, already accepted, replays now and
// returns the commit it replays.
func (e *env) mustCommitReplayOf(r lease.CommitRequest) lease.Commit {
	e.t.Helper()
	res, err := e.st.AuthorizeCommit(bg, r)
	if err != nil || !res.Replayed || res.Code != lease.CodeCommitAuthorized {
		e.t.Fatalf("replay of an accepted publication: %+v, %v", res, err)
	}
	return res.Commit
}
