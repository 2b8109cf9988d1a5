package leasetest

import (
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

// deadLetterAdmin is the backend's operator hand on its dead letters; a
// backend that sets publications aside must let an operator clear them.
func (e *env) deadLetterAdmin() lease.OutboxDeadLetterAdmin {
	e.t.Helper()
	a, ok := e.st.(lease.OutboxDeadLetterAdmin)
	if !ok {
		e.t.Fatal("the backend keeps dead letters but gives an operator no way to requeue or discard them (lease.OutboxDeadLetterAdmin)")
	}
	return a
}

// deadLetter sets pending entry id aside as the relay does.
func (e *env) deadLetter(id, reason string) {
	e.t.Helper()
	if err := e.deadLetterAdmin().OutboxDeadLetter(bg, id, reason); err != nil {
		e.t.Fatalf("dead letter %s: %v", id, err)
	}
}

// wantDeadLetters checks the dead letters read back, oldest first, by
// message id and reason, and their count.
func (e *env) wantDeadLetters(want ...[2]string) []lease.DeadLetter {
	e.t.Helper()
	a := e.deadLetterAdmin()
	dead, err := a.OutboxDeadLetters(bg, 0)
	if err != nil {
		e.t.Fatalf("dead letters: %v", err)
	}
	n, err := a.OutboxDeadLen(bg)
	if err != nil {
		e.t.Fatalf("dead letters' count: %v", err)
	}
	ok := len(dead) == len(want) && n == int64(len(want))
	for i := 0; ok && i < len(want); i++ {
		ok = dead[i].Entry.MessageID == want[i][0] && dead[i].Reason == want[i][1]
	}
	if !ok {
		e.t.Fatalf("dead letters %s (count %d); want (message id, reason) %q", js(dead), n, want)
	}
	return dead
}

// pendingIDs is the pending outbox's message ids, in relay order.
func (e *env) pendingIDs() []string {
	e.t.Helper()
	all, err := e.st.(lease.Outbox).OutboxPending(bg, 0)
	if err != nil {
		e.t.Fatalf("outbox pending: %v", err)
	}
	ids := make([]string, len(all))
	for i, en := range all {
		ids[i] = en.MessageID
	}
	return ids
}

func (e *env) wantPending(ids ...string) {
	e.t.Helper()
	if got := e.pendingIDs(); strings.Join(got, ",") != strings.Join(ids, ",") {
		e.t.Fatalf("pending outbox %q; want %q", got, ids)
	}
}

// outbox_dead_letter_admin: an operator requeues a dead letter (after
// curing its cause) or discards it. A requeued entry is the entry that was
// set aside, byte for byte, pending again after every entry pending, and
// the relay's removal, a second dead-lettering and a replay of its commit
// treat it as any pending entry. Refusals change nothing: an unknown or
// malformed message id, a full pending outbox (by entries or by bytes).
func (s *suite) deadLetterAdminLeaves(t *testing.T) {
	s.boundedLeaf(t, "requeue_and_discard", 10, 1<<20, func(e *env) {
		rec := e.grab()
		rA := e.publicationReq(rec, sized(3, map[string]string{"x-a": "é \t\"<&>"}))
		a := e.mustCommit(rA)
		b := e.mustCommit(e.publicationReq(rec, sized(4, nil)))
		c := e.mustCommit(e.publicationReq(rec, sized(5, nil)))
		set := e.outboxOf(e.key)
		if len(set) != 3 || set[0].MessageID != a.Target {
			e.t.Fatalf("pending %s", js(set))
		}
		original := set[0]
		e.deadLetter(a.Target, "no exchange")
		e.deadLetter(b.Target, "access refused")
		e.wantPending(c.Target)
		e.wantUsage(1, 5)
		admin := e.deadLetterAdmin()

		got, err := admin.OutboxRequeueDeadLetter(bg, a.Target)
		if err != nil || js(got.Entry) != js(original) || got.Reason != "no exchange" {
			e.t.Fatalf("requeue: %s, %v; want the entry set aside %s", js(got), err, js(original))
		}
		e.wantPending(c.Target, a.Target) // after every entry pending
		if back := e.outboxOf(e.key)[1]; js(back) != js(original) {
			e.t.Fatalf("requeued entry %s; want the original %s", js(back), js(original))
		}
		e.wantUsage(2, 5+rA.Outbox.Size())
		e.wantDeadLetters([2]string{b.Target, "access refused"})

		// Gone from the dead letters: a second requeue, an unknown id and a
		// malformed one are refused and change nothing.
		for _, id := range []string{a.Target, "msg_unknown", c.Target} {
			_, err := admin.OutboxRequeueDeadLetter(bg, id)
			mustCode(e.t, err, lease.CodeNotFound)
			_, err = admin.OutboxDiscardDeadLetter(bg, id)
			mustCode(e.t, err, lease.CodeNotFound)
		}
		for _, id := range []string{"", "msg bad", strings.Repeat("m", 300)} {
			_, err := admin.OutboxRequeueDeadLetter(bg, id)
			mustCode(e.t, err, lease.CodeInvalidRequest)
			_, err = admin.OutboxDiscardDeadLetter(bg, id)
			mustCode(e.t, err, lease.CodeInvalidRequest)
		}
		e.wantPending(c.Target, a.Target)
		e.wantUsage(2, 5+rA.Outbox.Size())
		e.wantDeadLetters([2]string{b.Target, "access refused"})

		// The requeued entry is pending like any other: its commit
		// replays without a second entry, it can be set aside again, and
		// the relay removes it.
		e.mustReplayCommit(rA, a)
		e.wantPending(c.Target, a.Target)
		e.deadLetter(a.Target, "still no exchange")
		e.wantDeadLetters([2]string{b.Target, "access refused"}, [2]string{a.Target, "still no exchange"})
		e.wantUsage(1, 5)
		if _, err := admin.OutboxRequeueDeadLetter(bg, a.Target); err != nil {
			e.t.Fatalf("requeue again: %v", err)
		}
		e.outboxDone(a.Target)
		e.wantPending(c.Target)
		e.wantUsage(1, 5)
		e.wantDeadLetters([2]string{b.Target, "access refused"})

		// Discarded for good; pending entries are untouched.
		got, err = admin.OutboxDiscardDeadLetter(bg, b.Target)
		if err != nil || got.Entry.MessageID != b.Target || got.Reason != "access refused" || len(got.Entry.Message.Body) != 4 {
			e.t.Fatalf("discard: %s, %v", js(got), err)
		}
		e.wantDeadLetters()
		e.wantPending(c.Target)
		e.wantUsage(1, 5)
		_, err = admin.OutboxDiscardDeadLetter(bg, b.Target)
		mustCode(e.t, err, lease.CodeNotFound)
		e.outboxDone(c.Target)
		e.wantUsage(0, 0)
	})
	s.boundedLeaf(t, "requeue_respects_the_outbox_bounds", 2, 700, func(e *env) {
		rec := e.grab()
		a := e.mustCommit(e.publicationReq(rec, sized(300, nil)))
		e.deadLetter(a.Target, "poison")
		b := e.mustCommit(e.publicationReq(rec, sized(10, nil)))
		c := e.mustCommit(e.publicationReq(rec, sized(10, nil)))
		admin := e.deadLetterAdmin()
		// Full by entries.
		_, err := admin.OutboxRequeueDeadLetter(bg, a.Target)
		le := mustCode(e.t, err, lease.CodeBackendUnavailable)
		if !strings.Contains(le.Reason, "the outbox is full") {
			e.t.Fatalf("requeue into a full outbox: %+v", le)
		}
		e.wantPending(b.Target, c.Target)
		e.wantDeadLetters([2]string{a.Target, "poison"})
		// Full by bytes: 450 pending + 300 > 700.
		e.outboxDone(c.Target)
		d := e.mustCommit(e.publicationReq(rec, sized(450, nil)))
		e.outboxDone(b.Target)
		e.wantUsage(1, 450)
		_, err = admin.OutboxRequeueDeadLetter(bg, a.Target)
		le = mustCode(e.t, err, lease.CodeBackendUnavailable)
		if !strings.Contains(le.Reason, "the outbox is full") {
			e.t.Fatalf("requeue past the byte bound: %+v", le)
		}
		e.wantPending(d.Target)
		e.wantDeadLetters([2]string{a.Target, "poison"})
		// Room again: it fits exactly as a new publication would.
		e.outboxDone(d.Target)
		if _, err := admin.OutboxRequeueDeadLetter(bg, a.Target); err != nil {
			e.t.Fatalf("requeue with room: %v", err)
		}
		e.wantPending(a.Target)
		e.wantUsage(1, 300)
		e.wantDeadLetters()
	})
}
