package valkey

import (
	"bytes"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// olderLayout rewrites dead letter id as outbox_dead wrote it before the
// dead letter's own entry key: its entry left in the entry key it shares
// with a pending entry of its id, its reason without the own-entry mark,
// no own entry key.
func olderLayout(t *testing.T, s *Store, id string) {
	t.Helper()
	raw, ok := get(t, s, s.keys.outboxDeadEntry(id))
	why, _ := get(t, s, s.keys.outboxDeadWhy(id))
	if !ok || !ownEntry(why) {
		t.Fatalf("dead letter %s: own entry %v, reason %q", id, ok, why)
	}
	c := s.client
	run(t, s, c.B().Set().Key(s.keys.outboxMsg(id)).Value(raw).Build(),
		c.B().Set().Key(s.keys.outboxDeadWhy(id)).Value(strings.TrimSuffix(why, ownEntryMark)+"}").Build(),
		c.B().Del().Key(s.keys.outboxDeadEntry(id)).Build())
}

// onlyID reports whether e holds its message id and nothing else.
func onlyID(e lease.OutboxEntry, id string) bool {
	return reflect.DeepEqual(e, lease.OutboxEntry{MessageID: id})
}

func run(t *testing.T, s *Store, cmds ...vk.Completed) {
	t.Helper()
	for _, c := range cmds {
		if err := s.client.Do(bg, c).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// wantDamaged checks that the listing names dead letter id, damaged, with
// its reason and no more of its entry than its id, and counts what it
// lists.
func wantDamaged(t *testing.T, s *Store, id, reason, damaged string) {
	t.Helper()
	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.OutboxDeadLen(bg)
	if err != nil || int64(len(listed)) != n {
		t.Fatalf("%d dead letters listed, %d counted (%v)", len(listed), n, err)
	}
	for _, d := range listed {
		if d.Entry.MessageID != id {
			continue
		}
		if d.Damaged != damaged || d.Reason != reason || d.DeadAt.IsZero() || !onlyID(d.Entry, id) {
			t.Fatalf("dead letter %s listed as %+v; want damaged %q, reason %q, only its id", id, d, damaged, reason)
		}
		return
	}
	t.Fatalf("dead letter %s not listed: %+v", id, listed)
}

// otherBody is req with another body: the same message id (the commit id
// is reused), another publication.
func otherBody(req lease.CommitRequest, body string) lease.CommitRequest {
	m := *req.Outbox
	m.Body = []byte(body)
	req.Outbox = &m
	return req
}

// A dead letter keeps its own entry: the same message id accepted again,
// then relayed (which removes the entry key), leaves it whole, listed and
// requeued byte for byte.
func TestDeadLetterKeepsItsEntryWhenItsIDIsRelayed(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, req := deadLetterOn(t, s, "abc", "no exchange")
	raw, _ := get(t, s, s.keys.outboxDeadEntry(id))
	acceptAgain(t, s, otherBody(req, "second"))
	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 1 || listed[0].Damaged != "" || string(listed[0].Entry.Message.Body) != "abc" {
		t.Fatalf("dead letters while its id is pending again: %+v %v", listed, err)
	}
	if err := s.OutboxDone(bg, id); err != nil {
		t.Fatal(err)
	}
	if got, _ := get(t, s, s.keys.outboxDeadEntry(id)); got != raw {
		t.Fatalf("the relay of the same message id changed the dead letter's entry: %q, want %q", got, raw)
	}
	d, err := s.OutboxRequeueDeadLetter(bg, id)
	if err != nil || d.Damaged != "" || string(d.Entry.Message.Body) != "abc" || d.Reason != "no exchange" {
		t.Fatalf("requeue: %+v %v", d, err)
	}
	if back, _ := get(t, s, s.keys.outboxMsg(id)); back != raw {
		t.Fatalf("requeued entry %q; want the dead letter's bytes %q", back, raw)
	}
	wantOutbox(t, s, []string{id}, 3, nil)
}

// Dead letters set aside before the own entry key (their entry in the
// entry key, their reason unmarked) are listed, requeued and discarded as
// before, beside new ones; with an entry of their id pending, the entry
// key is the pending entry's: the dead letter is listed and discarded as
// missing its entry, its requeue refused, and the pending entry is never
// touched. The store runs as the documented ACL user: reading an older
// dead letter takes a function of its own (outbox_dead_read).
func TestOlderLayoutDeadLetters(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions()})
	admin := open(t, r, Options{KeyPrefix: s.keys.ns, StoreOptions: leasetest.StoreOptions()}) // KEYS, DUMP for snapshot
	a, _ := deadLetterOn(t, s, "abc", "no exchange")
	b, _ := deadLetterOn(t, s, "de", "access refused")
	c, _ := deadLetterOn(t, s, "f", "nacked")
	olderLayout(t, s, a)
	olderLayout(t, s, b)
	rawA, _ := get(t, s, s.keys.outboxMsg(a))

	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 3 {
		t.Fatalf("dead letters %+v %v", listed, err)
	}
	for i, want := range []struct{ id, body, reason string }{{a, "abc", "no exchange"}, {b, "de", "access refused"}, {c, "f", "nacked"}} {
		if d := listed[i]; d.Entry.MessageID != want.id || string(d.Entry.Message.Body) != want.body || d.Reason != want.reason ||
			d.Damaged != "" || d.DeadAt.IsZero() {
			t.Fatalf("dead letter %d listed as %+v; want %+v", i, d, want)
		}
	}
	d, err := s.OutboxRequeueDeadLetter(bg, a)
	if err != nil || string(d.Entry.Message.Body) != "abc" || d.Reason != "no exchange" {
		t.Fatalf("requeue of an older dead letter: %+v %v", d, err)
	}
	if back, _ := get(t, s, s.keys.outboxMsg(a)); back != rawA {
		t.Fatalf("requeued entry %q; want %q", back, rawA)
	}
	d, err = s.OutboxDiscardDeadLetter(bg, b)
	if err != nil || string(d.Entry.Message.Body) != "de" || d.Reason != "access refused" || d.Damaged != "" {
		t.Fatalf("discard of an older dead letter: %+v %v", d, err)
	}
	if _, ok := get(t, s, s.keys.outboxMsg(b)); ok {
		t.Fatal("the discarded older dead letter's entry stayed")
	}
	wantOutbox(t, s, []string{a}, 3, []string{c})

	// Its id pending again: the entry key is no longer the dead letter's.
	e, req := deadLetterOn(t, s, "ghi", "no route")
	olderLayout(t, s, e)
	acceptAgain(t, s, otherBody(req, "pending"))
	pending, _ := get(t, s, s.keys.outboxMsg(e))
	wantDamaged(t, s, e, "no route", lease.DeadLetterEntryMissing)
	before := snapshot(t, admin, "")
	_, err = s.OutboxRequeueDeadLetter(bg, e)
	mustCode(t, err, lease.CodeInvalidRequest)
	unchanged(t, admin, before, "a refused requeue")
	d, err = s.OutboxDiscardDeadLetter(bg, e)
	if err != nil || !onlyID(d.Entry, e) || d.Reason != "no route" || d.Damaged != lease.DeadLetterEntryMissing {
		t.Fatalf("discard of an older dead letter whose id is pending: %+v %v", d, err)
	}
	if got, _ := get(t, s, s.keys.outboxMsg(e)); got != pending {
		t.Fatalf("the discard changed the pending entry: %q, want %q", got, pending)
	}
	wantOutbox(t, s, []string{a, e}, 3+7, []string{c})
}

// An older version's discard of a new dead letter left its own entry key
// behind; the same id set aside again by an older version (unmarked
// reason) is that later publication, never the copy left behind, and
// clearing it removes the copy.
func TestOlderDeadLetterIgnoresACopyLeftBehind(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, req := deadLetterOn(t, s, "abc", "no exchange")
	c := s.client
	// The older outbox_discard: member and reason gone, the entry key (absent) too.
	run(t, s, c.B().Zrem().Key(s.keys.outboxDead()).Member(id).Build(), c.B().Del().Key(s.keys.outboxDeadWhy(id)).Build())
	acceptAgain(t, s, otherBody(req, "second"))
	second, _ := get(t, s, s.keys.outboxMsg(id))
	// The older outbox_dead: the id moves, its entry stays in the entry key.
	run(t, s, c.B().Zrem().Key(s.keys.outbox()).Member(id).Build(),
		c.B().Set().Key(s.keys.outboxBytes()).Value("0").Build(),
		c.B().Zadd().Key(s.keys.outboxDead()).ScoreMember().ScoreMember(1, id).Build(),
		c.B().Set().Key(s.keys.outboxDeadWhy(id)).Value(`{"reason":"again","dead_at":"2026-01-02T03:04:05.006Z"}`).Build())

	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 1 || string(listed[0].Entry.Message.Body) != "second" || listed[0].Reason != "again" {
		t.Fatalf("dead letters %+v %v; want the later publication", listed, err)
	}
	d, err := s.OutboxRequeueDeadLetter(bg, id)
	if err != nil || string(d.Entry.Message.Body) != "second" {
		t.Fatalf("requeue: %+v %v", d, err)
	}
	if got, _ := get(t, s, s.keys.outboxMsg(id)); got != second {
		t.Fatalf("requeued entry %q, want %q", got, second)
	}
	if _, ok := get(t, s, s.keys.outboxDeadEntry(id)); ok {
		t.Fatal("the copy left behind stayed")
	}
	wantOutbox(t, s, []string{id}, 6, nil)
}

// The same message id set aside twice (accepted again, refused again,
// while the first dead letter waits): one member per id, so the newer
// replaces the older, entry and reason, and a warning names the id.
func TestSecondDeadLetteringReplacesTheFirst(t *testing.T) {
	var logs bytes.Buffer
	o := leasetest.StoreOptions()
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s := open(t, sharedServer(t), Options{StoreOptions: o})
	id, req := deadLetterOn(t, s, "abc", "no exchange")
	if strings.Contains(logs.String(), "replaced") {
		t.Fatalf("a first dead-lettering logged a replacement: %s", logs.String())
	}
	first, _ := listOne(t, s)
	acceptAgain(t, s, otherBody(req, "second"))
	raw, _ := get(t, s, s.keys.outboxMsg(id))
	if err := s.OutboxDeadLetter(bg, id, "still no exchange"); err != nil {
		t.Fatal(err)
	}
	if got, _ := get(t, s, s.keys.outboxDeadEntry(id)); got != raw {
		t.Fatalf("own entry %q after the second dead-lettering; want the newer %q", got, raw)
	}
	d, n := listOne(t, s)
	if n != 1 || string(d.Entry.Message.Body) != "second" || d.Reason != "still no exchange" || d.DeadAt.Time().Before(first.DeadAt.Time()) {
		t.Fatalf("dead letters after the second: %+v (count %d)", d, n)
	}
	if l := logs.String(); !strings.Contains(l, "replaced") || !strings.Contains(l, "message_id="+id) {
		t.Fatalf("no warning naming %s: %s", id, l)
	}
	wantOutbox(t, s, nil, 0, []string{id})
}

func listOne(t *testing.T, s *Store) (lease.DeadLetter, int64) {
	t.Helper()
	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 1 {
		t.Fatalf("dead letters %+v %v", listed, err)
	}
	n, err := s.OutboxDeadLen(bg)
	if err != nil {
		t.Fatal(err)
	}
	return listed[0], n
}

// A dead letter that does not decode (its entry, or its reason) is listed,
// named and damaged, beside the others, instead of failing the listing;
// its requeue is refused (corrupt) changing nothing, its discard clears it.
func TestListingNamesDamagedDeadLetters(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	a, _ := deadLetterOn(t, s, "abc", "no exchange")
	b, _ := deadLetterOn(t, s, "de", "access refused")
	c, _ := deadLetterOn(t, s, "f", "nacked")
	run(t, s, s.client.B().Set().Key(s.keys.outboxDeadEntry(a)).Value(`{"message_id":"`+a+`","lock_identity":{}}`).Build(),
		s.client.B().Set().Key(s.keys.outboxDeadWhy(c)).Value(`{"reason":7,"own_entry":true}`).Build())

	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 3 {
		t.Fatalf("dead letters %+v %v", listed, err)
	}
	if d := listed[0]; !onlyID(d.Entry, a) || d.Damaged != lease.DeadLetterCorrupt || d.Reason != "no exchange" {
		t.Fatalf("the dead letter whose entry is corrupt listed as %+v", d)
	}
	if d := listed[1]; d.Damaged != "" || string(d.Entry.Message.Body) != "de" {
		t.Fatalf("a whole dead letter listed as %+v", d)
	}
	if d := listed[2]; !onlyID(d.Entry, c) || d.Damaged != lease.DeadLetterCorrupt {
		t.Fatalf("the dead letter whose reason is corrupt listed as %+v", d)
	}
	before := snapshot(t, s, "")
	_, err = s.OutboxRequeueDeadLetter(bg, a)
	mustCode(t, err, lease.CodeCorrupt)
	unchanged(t, s, before, "a refused requeue")
	d, err := s.OutboxDiscardDeadLetter(bg, a)
	if err != nil || !onlyID(d.Entry, a) || d.Damaged != lease.DeadLetterCorrupt || d.Reason != "no exchange" {
		t.Fatalf("discard of a corrupt dead letter: %+v %v", d, err)
	}
	// Its entry is whole: it goes back, its reason lost.
	d, err = s.OutboxRequeueDeadLetter(bg, c)
	if err != nil || d.Damaged != "" || string(d.Entry.Message.Body) != "f" || d.Reason != "" {
		t.Fatalf("requeue of a dead letter whose reason is corrupt: %+v %v", d, err)
	}
	wantOutbox(t, s, []string{c}, 1, []string{b})
}

// Keys only an older dead letter's read touches (outbox_dead_read),
// holding another type, fail the listing closed (corrupt).
func TestOlderDeadLetterReadWrongTypeFailsClosed(t *testing.T) {
	r := sharedServer(t)
	for _, key := range []func(s *Store, id string) string{
		func(s *Store, _ string) string { return s.keys.outbox() },
		func(s *Store, id string) string { return s.keys.outboxMsg(id) },
	} {
		s := open(t, r, Options{StoreOptions: leasetest.StoreOptions()})
		id, _ := deadLetterOn(t, s, "abc", "no exchange")
		olderLayout(t, s, id)
		k := key(s, id)
		run(t, s, s.client.B().Del().Key(k).Build(), s.client.B().Lpush().Key(k).Element("x").Build())
		_, err := s.OutboxDeadLetters(bg, 0)
		mustCode(t, err, lease.CodeCorrupt)
	}
}
