package valkey

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// deadLetterOn accepts a publication on a fresh lease of s and sets it
// aside with reason: its message id and the commit request (to accept it
// again).
func deadLetterOn(t *testing.T, s *Store, body, reason string) (string, lease.CommitRequest) {
	t.Helper()
	held, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	req := commitReq(held.Lease)
	req.Target = ""
	req.Outbox = &lease.OutboxMessage{Exchange: "leases", RoutingKey: "lease.commit", ContentType: "text/plain", Body: []byte(body)}
	res, err := s.AuthorizeCommit(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Commit.Target
	if err := s.OutboxDeadLetter(bg, id, reason); err != nil {
		t.Fatal(err)
	}
	return id, req
}

// acceptAgain accepts req's publication again as after its commit evidence
// expired (the evidence key deleted): an entry of the dead letter's message
// id is pending again, written to the entry key they share.
func acceptAgain(t *testing.T, s *Store, req lease.CommitRequest) {
	t.Helper()
	_, p, err := lease.PrepareCommit(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.commit(tagOf(p.LockKey), p.Scope)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthorizeCommit(bg, req); err != nil {
		t.Fatal(err)
	}
}

// wantOutbox checks the pending message ids, the usage counters and the
// dead letters' ids read back.
func wantOutbox(t *testing.T, s *Store, pending []string, bytes int64, dead []string) {
	t.Helper()
	p, err := s.OutboxPending(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range p {
		ids = append(ids, e.MessageID)
	}
	d, err := s.OutboxDeadLetters(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	var deadIDs []string
	for _, l := range d {
		deadIDs = append(deadIDs, l.Entry.MessageID)
	}
	u, err := s.OutboxUsage(bg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.OutboxDeadLen(bg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ids, ",") != strings.Join(pending, ",") || u.Pending != int64(len(pending)) || u.Bytes != bytes ||
		strings.Join(deadIDs, ",") != strings.Join(dead, ",") || n != int64(len(dead)) {
		t.Fatalf("pending %q, usage %+v, dead letters %q (count %d); want pending %q of %d bytes, dead letters %q",
			ids, u, deadIDs, n, pending, bytes, dead)
	}
}

func unchanged(t *testing.T, s *Store, before map[string]string, what string) {
	t.Helper()
	if after := snapshot(t, s, ""); !maps.Equal(before, after) {
		t.Fatalf("%s changed the namespace:\n before %q\n after  %q", what, before, after)
	}
}

// A requeue moves the stored entry back byte for byte, scored with the
// next outbox sequence (after every pending entry), and removes the dead
// letter's keys.
func TestRequeueKeepsTheStoredEntry(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, _ := deadLetterOn(t, s, "abc", "no exchange")
	raw, _ := get(t, s, s.keys.outboxDeadEntry(id))
	if _, ok := get(t, s, s.keys.outboxMsg(id)); ok || raw == "" {
		t.Fatalf("dead-lettered: own entry %q, and the entry key stayed %v; want the entry moved to its own key", raw, ok)
	}
	later, _ := deadLetterOn(t, s, "de", "later")
	if err := s.OutboxDone(bg, later); err != nil { // still a dead letter: not pending
		t.Fatal(err)
	}
	other, _ := deadLetterOn(t, s, "fghi", "x")
	if _, err := s.OutboxRequeueDeadLetter(bg, other); err != nil {
		t.Fatal(err)
	}
	seq, _ := get(t, s, s.keys.outboxSeq())
	d, err := s.OutboxRequeueDeadLetter(bg, id)
	if err != nil || d.Reason != "no exchange" || d.DeadAt.IsZero() || d.Entry.MessageID != id || string(d.Entry.Message.Body) != "abc" {
		t.Fatalf("requeue: %+v %v", d, err)
	}
	if back, _ := get(t, s, s.keys.outboxMsg(id)); back != raw {
		t.Fatalf("requeued entry %q; want the stored bytes %q", back, raw)
	}
	score, err := s.client.Do(bg, s.client.B().Zscore().Key(s.keys.outbox()).Member(id).Build()).AsFloat64()
	next, _ := strconv.ParseUint(seq, 10, 64)
	if now, _ := get(t, s, s.keys.outboxSeq()); err != nil || score != float64(next+1) || now != strconv.FormatUint(next+1, 10) {
		t.Fatalf("requeued with score %v %v, outbox sequence %q; want %d (the sequence was %s)", score, err, now, next+1, seq)
	}
	if _, ok := get(t, s, s.keys.outboxDeadWhy(id)); ok {
		t.Fatal("the requeued dead letter's reason key stayed")
	}
	if _, ok := get(t, s, s.keys.outboxDeadEntry(id)); ok {
		t.Fatal("the requeued dead letter's own entry key stayed")
	}
	wantOutbox(t, s, []string{other, id}, 4+3, []string{later})
}

// The same publication accepted again (its commit evidence expired) while
// its dead letter waits: a requeue is refused (DeadLetterPending) and
// changes nothing; a discard removes the dead letter and leaves the
// pending entry, which the relay then removes as any other.
func TestRequeueRefusedWhileItsIDIsPending(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, req := deadLetterOn(t, s, "abc", "no exchange")
	acceptAgain(t, s, req)
	wantOutbox(t, s, []string{id}, 3, []string{id})
	entry, _ := get(t, s, s.keys.outboxMsg(id))

	before := snapshot(t, s, "")
	_, err := s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, err, lease.CodeInvalidRequest)
	if le := lease.AsError(err); le.Reason != lease.DeadLetterPending().Reason {
		t.Fatalf("requeue refused with %+v; want DeadLetterPending", le)
	}
	unchanged(t, s, before, "a refused requeue")

	d, err := s.OutboxDiscardDeadLetter(bg, id)
	if err != nil || d.Entry.MessageID != id || d.Reason != "no exchange" {
		t.Fatalf("discard: %+v %v", d, err)
	}
	if got, ok := get(t, s, s.keys.outboxMsg(id)); !ok || got != entry {
		t.Fatalf("the pending entry after the discard: %q %v; want %q", got, ok, entry)
	}
	if _, ok := get(t, s, s.keys.outboxDeadWhy(id)); ok {
		t.Fatal("the discarded dead letter's reason key stayed")
	}
	wantOutbox(t, s, []string{id}, 3, nil)
	if err := s.OutboxDone(bg, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, s, s.keys.outboxMsg(id)); ok {
		t.Fatal("the relayed entry stayed")
	}
	wantOutbox(t, s, nil, 0, nil)
}

// An older version's dead letter whose entry is gone (an entry of its id
// pending meanwhile was relayed, removing the key they shared) cannot be
// requeued, changing nothing; it is listed, damaged, and can be
// discarded. (Before the dead letter's own entry key this was every dead
// letter's fate: see TestDeadLetterKeepsItsEntryWhenItsIDIsRelayed.)
func TestRequeueOfADeadLetterWithoutEntry(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, req := deadLetterOn(t, s, "abc", "no exchange")
	olderLayout(t, s, id)
	acceptAgain(t, s, req)
	if err := s.OutboxDone(bg, id); err != nil {
		t.Fatal(err)
	}
	wantDamaged(t, s, id, "no exchange", lease.DeadLetterEntryMissing)
	before := snapshot(t, s, "")
	_, err := s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, err, lease.CodeNotFound)
	unchanged(t, s, before, "a refused requeue")
	d, err := s.OutboxDiscardDeadLetter(bg, id)
	if err != nil || d.Entry.MessageID != id || d.Reason != "no exchange" || d.Damaged != lease.DeadLetterEntryMissing {
		t.Fatalf("discard: %+v %v", d, err)
	}
	if n, err := s.OutboxDeadLen(bg); err != nil || n != 0 {
		t.Fatalf("dead letters after the discard: %d %v", n, err)
	}
}

// A closed namespace refuses both, changing nothing; reopened, they run.
func TestDeadLetterAdminOnClosedNamespace(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	a, _ := deadLetterOn(t, s, "abc", "no exchange")
	b, _ := deadLetterOn(t, s, "de", "access refused")
	if ok, err := s.Seal(bg); err != nil || !ok {
		t.Fatalf("seal: %v %v", ok, err)
	}
	before := snapshot(t, s, "")
	for name, op := range map[string]func(context.Context, string) (lease.DeadLetter, error){
		"requeue": s.OutboxRequeueDeadLetter, "discard": s.OutboxDiscardDeadLetter,
	} {
		_, err := op(bg, a)
		mustCode(t, err, lease.CodeBackendUnavailable)
		if !strings.Contains(lease.AsError(err).Reason, "namespace is closed") {
			t.Fatalf("%s on a closed namespace: %v", name, err)
		}
	}
	unchanged(t, s, before, "a refusal on a closed namespace")
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.gate()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OutboxRequeueDeadLetter(bg, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OutboxDiscardDeadLetter(bg, b); err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, s, []string{a}, 3, nil)
}

// Every key either function reads or writes, holding another type, fails
// it closed (corrupt; a gate of another type: closed), never with a raw
// error, and changes nothing.
func TestDeadLetterAdminWrongTypesFailClosed(t *testing.T) {
	r := sharedServer(t)
	type key struct {
		name    string
		of      func(s *Store, id string) string
		string  bool
		discard bool // a key outbox_discard reads too
	}
	keys := []key{
		{"outbox", func(s *Store, _ string) string { return s.keys.outbox() }, false, true},
		{"entry", func(s *Store, id string) string { return s.keys.outboxMsg(id) }, true, true},
		{"dead", func(s *Store, _ string) string { return s.keys.outboxDead() }, false, true},
		{"reason", func(s *Store, id string) string { return s.keys.outboxDeadWhy(id) }, true, true},
		{"dead_entry", func(s *Store, id string) string { return s.keys.outboxDeadEntry(id) }, true, true},
		{"gate", func(s *Store, _ string) string { return s.keys.gate() }, true, true},
		{"bytes", func(s *Store, _ string) string { return s.keys.outboxBytes() }, true, false},
		{"outbox_seq", func(s *Store, _ string) string { return s.keys.outboxSeq() }, true, false},
	}
	for _, k := range keys {
		for _, op := range []string{"requeue", "discard"} {
			if op == "discard" && !k.discard {
				continue
			}
			t.Run(op+"_"+k.name, func(t *testing.T) {
				s := open(t, r, Options{StoreOptions: leasetest.StoreOptions()})
				id, _ := deadLetterOn(t, s, "abc", "no exchange")
				key := k.of(s, id)
				wrong := s.client.B().Set().Key(key).Value("x").Build()
				if k.string {
					wrong = s.client.B().Lpush().Key(key).Element("x").Build()
				}
				for _, c := range []vk.Completed{s.client.B().Del().Key(key).Build(), wrong} {
					if err := s.client.Do(bg, c).Error(); err != nil {
						t.Fatal(err)
					}
				}
				t.Cleanup(func() { s.client.Do(bg, s.client.B().Del().Key(key).Build()) })
				before := snapshot(t, s, "")
				var err error
				if op == "requeue" {
					_, err = s.OutboxRequeueDeadLetter(bg, id)
				} else {
					_, err = s.OutboxDiscardDeadLetter(bg, id)
				}
				want := lease.CodeCorrupt
				if k.name == "gate" {
					want = lease.CodeBackendUnavailable
				}
				mustCode(t, err, want)
				unchanged(t, s, before, "a refusal")
			})
		}
	}
}

// A corrupt entry is never made pending (the relay's reads would fail
// closed on it): the requeue is refused as corrupt, changing nothing, and
// a discard clears it. A malformed byte counter fails a requeue closed.
func TestRequeueOfACorruptDeadLetter(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, _ := deadLetterOn(t, s, "abc", "no exchange")
	broken := `{"message_id":"` + id + `","lock_identity":{}}`
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.outboxDeadEntry(id)).Value(broken).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, s, "")
	_, err := s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, err, lease.CodeCorrupt)
	unchanged(t, s, before, "a refused requeue")
	// The function itself moves only the entry whose digest it is given.
	rep, err := s.fcall(bg, call{fn: "outbox_requeue", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(id), s.keys.outboxDead(), s.keys.outboxDeadWhy(id), s.keys.gate(),
			s.keys.outboxBytes(), s.keys.outboxSeq(), s.keys.outboxDeadEntry(id)},
		args: []string{id, strings.Repeat("0", 40), "10", "100000"}})
	if err != nil || rep.status != "unverified" || rep.at(0) != broken {
		t.Fatalf("requeue of another digest: %+v %v", rep, err)
	}
	unchanged(t, s, before, "an unverified requeue")
	d, err := s.OutboxDiscardDeadLetter(bg, id)
	if err != nil || d.Entry.MessageID != id || d.Reason != "no exchange" || d.Damaged != lease.DeadLetterCorrupt {
		t.Fatalf("discard of a corrupt dead letter: %+v %v", d, err)
	}
	if _, ok := get(t, s, s.keys.outboxDeadEntry(id)); ok {
		t.Fatal("the discarded entry stayed")
	}
	wantOutbox(t, s, nil, 0, nil)

	id, _ = deadLetterOn(t, s, "abc", "no exchange")
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.outboxBytes()).Value("-1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, s, "")
	_, err = s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, err, lease.CodeCorrupt)
	unchanged(t, s, before, "a requeue with a malformed byte counter")
}
