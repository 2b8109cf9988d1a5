package valkey

import (
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// A dead letter whose entry key was removed by the relay of an entry of
// the same message id (accepted again after its commit evidence expired)
// is still counted against lease.MaxOutboxDeadLetters, but the listing
// skips it: `starlease outbox dead-letters` prints "count 1" and no dead
// letter, so the operator never learns the id to discard it.
func TestAttackEntrylessDeadLetterIsInvisibleButCounted(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, req := deadLetterOn(t, s, "abc", "no exchange")
	acceptAgain(t, s, req)
	if err := s.OutboxDone(bg, id); err != nil { // the relay published the second acceptance
		t.Fatal(err)
	}
	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.OutboxDeadLen(bg)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(listed)) != n {
		t.Fatalf("dead letters counted %d (against the bound of %d) but %d listed: the operator cannot see the id %s to discard it",
			n, lease.MaxOutboxDeadLetters, len(listed), id)
	}
}

// The dead letter and a pending entry of its message id share one entry
// key. The message id is "msg_"+scope(lock key, sink, commit id): no lease
// in it. So a LATER lease of the same identity that reuses the commit id
// after the evidence expired overwrites the dead letter's entry: the
// dead letter now reads as the other lease's publication (another lease
// id, token, body). The operator's listing, the discard's answer and the
// durable audit event (writeOutboxEvent copies LeaseID/FencingToken from
// it) name the wrong publication, and the original body is gone for good.
func TestAttackAnotherLeaseOverwritesADeadLettersEntry(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	ident := newIdentity()
	first, err := s.Acquire(bg, acquireReq(ident))
	if err != nil {
		t.Fatal(err)
	}
	req := commitReq(first.Lease)
	req.Target = ""
	req.Outbox = &lease.OutboxMessage{Exchange: "leases", RoutingKey: "lease.commit", ContentType: "text/plain", Body: []byte("first lease's result")}
	res, err := s.AuthorizeCommit(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Commit.Target
	if err := s.OutboxDeadLetter(bg, id, "no exchange"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(bg, releaseReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	second, err := s.Acquire(bg, acquireReq(ident))
	if err != nil {
		t.Fatal(err)
	}
	again := commitReq(second.Lease)
	again.Target, again.CommitID = "", req.CommitID
	again.Outbox = &lease.OutboxMessage{Exchange: "leases", RoutingKey: "lease.commit", ContentType: "text/plain", Body: []byte("second lease's result")}
	acceptAgain(t, s, again)

	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 1 {
		t.Fatalf("dead letters %+v %v", listed, err)
	}
	if got := listed[0].Entry; got.LeaseID != first.Lease.LeaseID || string(got.Message.Body) != "first lease's result" {
		t.Errorf("the dead letter of lease %s (token %d) is listed as lease %s token %d with body %q: another lease's pending publication",
			first.Lease.LeaseID, first.Lease.FencingToken, got.LeaseID, got.FencingToken, got.Message.Body)
	}
	d, err := s.OutboxDiscardDeadLetter(bg, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.Entry.LeaseID != first.Lease.LeaseID {
		t.Errorf("discard answered (and the CLI audits) lease %s token %d; the discarded publication was lease %s token %d",
			d.Entry.LeaseID, d.Entry.FencingToken, first.Lease.LeaseID, first.Lease.FencingToken)
	}
}
