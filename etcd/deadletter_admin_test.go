package etcd

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// States of the dead letters the conformance cannot create: an entry of
// the dead letter's message id pending again, writers racing, damage.

func dlStore(t *testing.T, c *testenv.EtcdCluster) *Store {
	return open(t, c, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1})
}

// dlSetAside publishes one message under tenant and sets it aside.
func dlSetAside(t *testing.T, s *Store, tenant, reason string) string {
	t.Helper()
	id := scopePublish(t, s, tenant)
	if err := s.OutboxDeadLetter(bg, id, reason); err != nil {
		t.Fatalf("dead letter %s: %v", id, err)
	}
	return id
}

// dlKeys reads the dead letters' keys and values, oldest first.
func dlKeys(t *testing.T, s *Store) (keys []string, vals [][]byte) {
	t.Helper()
	r, err := s.cli.Get(bg, s.keys.deadPrefix(), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		keys, vals = append(keys, string(kv.Key)), append(vals, kv.Value)
	}
	return keys, vals
}

// dlState is what the tests read back: pending ids in relay order, the
// usage key, the dead letters' message ids and reasons oldest first, and
// the dead-letter count key.
func dlState(t *testing.T, s *Store) string {
	t.Helper()
	es, err := s.OutboxPending(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	var pending []string
	for _, e := range es {
		pending = append(pending, e.MessageID)
	}
	u, err := s.getOne(bg, s.keys.outboxUsage())
	if err != nil {
		t.Fatal(err)
	}
	p, b := usage(u)
	_, vals := dlKeys(t, s)
	var dead []string
	for _, v := range vals {
		var d lease.DeadLetter
		if err := json.Unmarshal(v, &d); err != nil {
			dead = append(dead, "<corrupt>")
			continue
		}
		dead = append(dead, d.Entry.MessageID+"("+d.Reason+")")
	}
	n, err := s.OutboxDeadLen(bg)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("pending %v usage (%d, %d) dead %v count %d", pending, p, b, dead, n)
}

// A requeue whose message id is pending again (the same commit accepted
// again after its evidence expired, written here as putOutbox writes it)
// is refused with DeadLetterPending and changes nothing; a discard
// removes the dead letter and leaves that pending entry alone.
func TestDeadLetterRequeueRefusedWhileItsIDIsPending(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	id := dlSetAside(t, s, "tenant-pend", "no exchange")
	other := scopePublish(t, s, "tenant-later")
	dead, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters: %v, %v", dead, err)
	}
	raw, err := lease.EncodeOutboxEntry(dead[0].Entry)
	if err != nil {
		t.Fatal(err)
	}
	seqRaw, err := s.getOne(bg, s.keys.outboxSeq())
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.getOne(bg, s.keys.outboxUsage())
	if err != nil {
		t.Fatal(err)
	}
	seq, _ := readU64(seqRaw)
	seq++
	p, b := usage(u)
	if _, err := s.cli.Txn(bg).Then(
		clientv3.OpPut(s.keys.outbox(seq), string(raw)),
		clientv3.OpPut(s.keys.outboxID(id), hex16(seq)),
		clientv3.OpPut(s.keys.outboxSeq(), string(u64(seq))),
		clientv3.OpPut(s.keys.outboxUsage(), string(encodeUsage(p+1, b+dead[0].Entry.Message.Size()))),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	size := dead[0].Entry.Message.Size()
	before := keysOf(t, s)
	want := fmt.Sprintf("pending [%s %s] usage (2, %d) dead [%s(no exchange)] count 1", other, id, b+size, id)
	if got := dlState(t, s); got != want {
		t.Fatalf("set up: %s; want %s", got, want)
	}

	_, err = s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, "requeue of a pending message id", err, lease.CodeInvalidRequest)
	if lease.AsError(err).Reason != lease.DeadLetterPending().Reason {
		t.Fatalf("requeue of a pending message id: %v; want DeadLetterPending", err)
	}
	if after := keysOf(t, s); !maps.Equal(before, after) {
		t.Fatalf("the refused requeue changed the prefix:\nbefore %q\nafter  %q", before, after)
	}

	got, err := s.OutboxDiscardDeadLetter(bg, id)
	if err != nil || got.Entry.MessageID != id || got.Reason != "no exchange" {
		t.Fatalf("discard: %+v, %v", got, err)
	}
	if v, err := s.getOne(bg, s.keys.outbox(seq)); err != nil || string(v) != string(raw) {
		t.Fatalf("the pending entry of the discarded id: %q, %v", v, err)
	}
	if v, err := s.getOne(bg, s.keys.outboxID(id)); err != nil || string(v) != hex16(seq) {
		t.Fatalf("the pending entry's id entry: %q, %v", v, err)
	}
	want = fmt.Sprintf("pending [%s %s] usage (2, %d) dead [] count 0", other, id, b+size)
	if got := dlState(t, s); got != want {
		t.Fatalf("after discard: %s; want %s", got, want)
	}
}

// An id entry left behind (it names no entry) does not block a requeue:
// a refusal for a full outbox leaves it as it was, and the requeue that
// fits replaces it with the entry's own.
func TestDeadLetterRequeueOverAStaleIDEntry(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	id := dlSetAside(t, s, "tenant-stale", "access refused")
	other := scopePublish(t, s, "tenant-full")
	stale := hex16(1 << 40)
	if _, err := s.cli.Put(bg, s.keys.outboxID(id), stale); err != nil {
		t.Fatal(err)
	}
	faults{s}.SetOutboxBounds(1, 1<<20)
	before := keysOf(t, s)
	_, err := s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, "requeue into a full outbox", err, lease.CodeBackendUnavailable)
	if !strings.Contains(lease.AsError(err).Reason, "the outbox is full") {
		t.Fatalf("requeue into a full outbox: %v", err)
	}
	if after := keysOf(t, s); !maps.Equal(before, after) {
		t.Fatalf("the refused requeue changed the prefix:\nbefore %q\nafter  %q", before, after)
	}
	if err := s.OutboxDone(bg, other); err != nil {
		t.Fatal(err)
	}
	got, err := s.OutboxRequeueDeadLetter(bg, id)
	if err != nil || got.Entry.MessageID != id {
		t.Fatalf("requeue: %+v, %v", got, err)
	}
	v, err := s.getOne(bg, s.keys.outboxID(id))
	if err != nil || v == nil || string(v) == stale {
		t.Fatalf("id entry after the requeue: %q, %v", v, err)
	}
	if e, err := s.getOne(bg, s.keys.outboxPrefix()+string(v)); err != nil || lease.OutboxEntryOfAnother(e, id) || e == nil {
		t.Fatalf("the id entry names %q, %v", e, err)
	}
	want := fmt.Sprintf("pending [%s] usage (1, %d) dead [] count 0", id, got.Entry.Message.Size())
	if got := dlState(t, s); got != want {
		t.Fatalf("after the requeue: %s; want %s", got, want)
	}
}

// Writers racing on one dead letter: of two requeues and a discard of it,
// exactly one succeeds and the others find no dead letter; a dead letter
// set aside meanwhile is counted. One pending entry at most results.
func TestDeadLetterAdminRaces(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	for round := range 6 {
		id := dlSetAside(t, s, fmt.Sprintf("tenant-race-%d", round), "poison")
		next := scopePublish(t, s, fmt.Sprintf("tenant-next-%d", round))
		ops := []string{"requeue", "requeue", "discard", "dead-letter"}
		if round%2 == 1 {
			ops = ops[:2] // two requeues alone
		}
		errs := make([]error, len(ops))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, op := range ops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				switch op {
				case "requeue":
					_, errs[i] = s.OutboxRequeueDeadLetter(bg, id)
				case "discard":
					_, errs[i] = s.OutboxDiscardDeadLetter(bg, id)
				case "dead-letter":
					errs[i] = s.OutboxDeadLetter(bg, next, "refused")
				}
			}()
		}
		close(start)
		wg.Wait()
		won := ""
		for i, op := range ops {
			switch {
			case op == "dead-letter":
				if errs[i] != nil {
					t.Fatalf("round %d: dead letter: %v", round, errs[i])
				}
			case errs[i] == nil:
				if won != "" {
					t.Fatalf("round %d: both %s and %s succeeded (%v)", round, won, op, errs)
				}
				won = op
			default:
				if lease.CodeOf(errs[i]) != lease.CodeNotFound || lease.AsError(errs[i]).Reason != lease.NoDeadLetter().Reason {
					t.Fatalf("round %d: %s lost with %v; want NoDeadLetter", round, op, errs[i])
				}
			}
		}
		if won == "" {
			t.Fatalf("round %d: no operation succeeded: %v", round, errs)
		}
		es, err := s.OutboxPending(bg, 0)
		if err != nil {
			t.Fatal(err)
		}
		var pending []string
		var bytes int64
		for _, e := range es {
			pending = append(pending, e.MessageID)
			bytes += e.Message.Size()
		}
		wantPending, wantDead := []string{}, []string{}
		if won == "requeue" {
			wantPending = append(wantPending, id)
		}
		if len(ops) == 4 {
			wantDead = append(wantDead, next+"(refused)")
		} else {
			wantPending = append([]string{next}, wantPending...)
		}
		want := fmt.Sprintf("pending %v usage (%d, %d) dead %v count %d", wantPending, len(wantPending), bytes, wantDead, len(wantDead))
		if got := dlState(t, s); got != want || len(pending) != len(wantPending) {
			t.Fatalf("round %d (%s won): %s; want %s", round, won, got, want)
		}
		// Clear the round: the relay confirms what is pending, the
		// operator discards what is set aside.
		for _, p := range pending {
			if err := s.OutboxDone(bg, p); err != nil {
				t.Fatal(err)
			}
		}
		if len(ops) == 4 {
			if _, err := s.OutboxDiscardDeadLetter(bg, next); err != nil {
				t.Fatal(err)
			}
		}
		if got := dlState(t, s); got != "pending [] usage (0, 0) dead [] count 0" {
			t.Fatalf("round %d cleared: %s", round, got)
		}
	}
}

// Past the first page of the scan, with one message id in two dead
// letters (damage), a requeue acts on the oldest and leaves the other;
// the dead letters of other messages are untouched.
func TestDeadLetterRequeueFindsTheOldestPastAPage(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	id := dlSetAside(t, s, "tenant-page", "first")
	keys, vals := dlKeys(t, s)
	if len(keys) != 1 {
		t.Fatalf("dead letters: %q", keys)
	}
	var d lease.DeadLetter
	if err := json.Unmarshal(vals[0], &d); err != nil {
		t.Fatal(err)
	}
	put := func(seq uint64, msgID, reason string) {
		t.Helper()
		c := d
		c.Entry.MessageID, c.Reason = msgID, reason
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.cli.Put(bg, s.keys.dead(seq), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	// The first page holds other messages; the id's dead letter moves
	// past it, with a younger copy after it.
	if _, err := s.cli.Delete(bg, keys[0]); err != nil {
		t.Fatal(err)
	}
	const others = deadLetterPage + 6
	for i := range others {
		put(uint64(10+i), fmt.Sprintf("msg_other_%03d", i), "other")
	}
	put(500, id, "oldest")
	put(501, id, "younger")
	if _, err := s.cli.Put(bg, s.keys.deadCount(), string(u64(others+2))); err != nil {
		t.Fatal(err)
	}
	got, err := s.OutboxRequeueDeadLetter(bg, id)
	if err != nil || got.Reason != "oldest" || got.Entry.MessageID != id {
		t.Fatalf("requeue: %+v, %v; want the oldest", got, err)
	}
	keys, vals = dlKeys(t, s)
	if len(keys) != others+1 || keys[others] != s.keys.dead(501) || !strings.Contains(string(vals[others]), `"reason":"younger"`) {
		t.Fatalf("dead letters after the requeue: %d, last %q", len(keys), keys[len(keys)-1])
	}
	if n, err := s.OutboxDeadLen(bg); err != nil || n != others+1 {
		t.Fatalf("dead-letter count %d, %v; want %d", n, err, others+1)
	}
	es, err := s.OutboxPending(bg, 0)
	if err != nil || len(es) != 1 || es[0].MessageID != id {
		t.Fatalf("pending %v, %v", es, err)
	}
	// The younger copy is refused while the entry is pending, then
	// discarded.
	_, err = s.OutboxRequeueDeadLetter(bg, id)
	mustCode(t, "requeue of the younger copy", err, lease.CodeInvalidRequest)
	got, err = s.OutboxDiscardDeadLetter(bg, id)
	if err != nil || got.Reason != "younger" {
		t.Fatalf("discard: %+v, %v", got, err)
	}
	if n, err := s.OutboxDeadLen(bg); err != nil || n != others {
		t.Fatalf("dead-letter count %d, %v; want %d", n, err, others)
	}
}

// dlListed is the listing read back, oldest first: each dead letter's
// message id, reason and damage.
func dlListed(t *testing.T, s *Store) string {
	t.Helper()
	dead, err := s.OutboxDeadLetters(bg, 0)
	if err != nil {
		t.Fatalf("dead letters: %v", err)
	}
	var out []string
	for _, d := range dead {
		out = append(out, fmt.Sprintf("%q(%s)%s", d.Entry.MessageID, d.Reason, d.Damaged))
	}
	return strings.Join(out, " ")
}

// A damaged dead letter (a value that does not decode, or names no valid
// message id) is listed as damaged, named when its message id can be read,
// instead of failing the listing. A discard of the id it names removes
// it; a requeue of it is refused (lease_corrupt) and changes nothing.
// Damaged values naming another id, or none, are passed over by both.
func TestDeadLetterDamaged(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 1)
	unchanged := func(t *testing.T, s *Store, before map[string]string) {
		t.Helper()
		if after := keysOf(t, s); !maps.Equal(before, after) {
			t.Fatalf("a refusal changed the prefix:\nbefore %q\nafter  %q", before, after)
		}
	}
	put := func(t *testing.T, s *Store, key, v string) {
		t.Helper()
		if _, err := s.cli.Put(bg, key, v); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("its own value", func(t *testing.T) {
		s := dlStore(t, c)
		id := dlSetAside(t, s, "tenant-own", "poison")
		keys, _ := dlKeys(t, s)
		put(t, s, keys[0], `{"entry":{"message_id":"`+id+`","lock_identity":`)
		if got, want := dlListed(t, s), fmt.Sprintf("%q()corrupt", id); got != want {
			t.Fatalf("listed %s; want %s", got, want)
		}
		before := keysOf(t, s)
		_, err := s.OutboxRequeueDeadLetter(bg, id)
		mustCode(t, "requeue", err, lease.CodeCorrupt)
		unchanged(t, s, before)
		got, err := s.OutboxDiscardDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id || got.Damaged != lease.DeadLetterCorrupt || got.Reason != "" {
			t.Fatalf("discard: %+v, %v", got, err)
		}
		if got := dlState(t, s); got != "pending [] usage (0, 0) dead [] count 0" {
			t.Fatalf("after discard: %s", got)
		}
		_, err = s.OutboxDiscardDeadLetter(bg, id)
		mustCode(t, "second discard", err, lease.CodeNotFound)
	})
	t.Run("an older damaged copy of its own", func(t *testing.T) {
		s := dlStore(t, c)
		id := dlSetAside(t, s, "tenant-copy", "poison")
		put(t, s, s.keys.dead(0), `{"entry":{"message_id":"`+id+`","lock_`)
		put(t, s, s.keys.deadCount(), string(u64(2)))
		if got, want := dlListed(t, s), fmt.Sprintf("%q()corrupt %q(poison)", id, id); got != want {
			t.Fatalf("listed %s; want %s", got, want)
		}
		// The oldest is acted on: the damaged one.
		before := keysOf(t, s)
		_, err := s.OutboxRequeueDeadLetter(bg, id)
		mustCode(t, "requeue", err, lease.CodeCorrupt)
		unchanged(t, s, before)
		got, err := s.OutboxDiscardDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id || got.Damaged != lease.DeadLetterCorrupt {
			t.Fatalf("discard: %+v, %v", got, err)
		}
		if keys, _ := dlKeys(t, s); !slices.Equal(keys, []string{s.keys.dead(1)}) {
			t.Fatalf("dead letters after the discard: %q", keys)
		}
		got, err = s.OutboxRequeueDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id || got.Reason != "poison" || got.Damaged != "" {
			t.Fatalf("requeue: %+v, %v", got, err)
		}
		want := fmt.Sprintf("pending [%s] usage (1, %d) dead [] count 0", id, got.Entry.Message.Size())
		if got := dlState(t, s); got != want {
			t.Fatalf("after the requeue: %s; want %s", got, want)
		}
	})
	t.Run("older values naming no id", func(t *testing.T) {
		s := dlStore(t, c)
		id := dlSetAside(t, s, "tenant-after", "poison")
		keys, vals := dlKeys(t, s)
		// Its dead letter moves past three damaged ones naming no valid id
		// (the first in its place).
		if keys[0] != s.keys.dead(1) {
			t.Fatalf("dead letters: %q", keys)
		}
		if _, err := s.cli.Txn(bg).Then(clientv3.OpPut(s.keys.dead(10), string(vals[0])),
			clientv3.OpPut(s.keys.deadSeq(), string(u64(10))), clientv3.OpPut(s.keys.deadCount(), string(u64(4))),
			clientv3.OpPut(s.keys.dead(1), "\x00garbage"), clientv3.OpPut(s.keys.dead(2), `{}`),
			clientv3.OpPut(s.keys.dead(3), `{"entry":{"message_id":"bad id"}}`)).Commit(); err != nil {
			t.Fatal(err)
		}
		// Listed by the names of their keys, which a discard takes.
		damaged := `"damaged_0000000000000001"()corrupt "damaged_0000000000000002"()corrupt "damaged_0000000000000003"()corrupt`
		if got, want := dlListed(t, s), damaged+fmt.Sprintf(" %q(poison)", id); got != want {
			t.Fatalf("listed %s; want %s", got, want)
		}
		got, err := s.OutboxRequeueDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id || got.Reason != "poison" {
			t.Fatalf("requeue: %+v, %v", got, err)
		}
		want := fmt.Sprintf("pending [%s] usage (1, %d) dead [<corrupt> () bad id()] count 3", id, got.Entry.Message.Size())
		if got := dlState(t, s); got != want {
			t.Fatalf("after the requeue: %s; want %s", got, want)
		}
		keys, vals = dlKeys(t, s)
		if !slices.Equal(keys, []string{s.keys.dead(1), s.keys.dead(2), s.keys.dead(3)}) || string(vals[0]) != "\x00garbage" {
			t.Fatalf("dead letters after the requeue: %q %q", keys, vals)
		}
		before := keysOf(t, s)
		_, err = s.OutboxDiscardDeadLetter(bg, id)
		mustCode(t, "discard of a requeued id", err, lease.CodeNotFound)
		unchanged(t, s, before)
		// Set aside again (at sequence 11), it is discarded past them.
		if err := s.OutboxDeadLetter(bg, id, "again"); err != nil {
			t.Fatal(err)
		}
		got, err = s.OutboxDiscardDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id || got.Reason != "again" || got.Damaged != "" {
			t.Fatalf("discard: %+v, %v", got, err)
		}
		if got := dlListed(t, s); got != damaged {
			t.Fatalf("listed %s; want %s", got, damaged)
		}
		if n, err := s.OutboxDeadLen(bg); err != nil || n != 3 {
			t.Fatalf("dead-letter count %d, %v; want 3", n, err)
		}
		// Each by its name: requeue refused, discard takes exactly it.
		for i, name := range []string{"damaged_0000000000000002", "damaged_0000000000000001", "damaged_0000000000000003"} {
			_, err := s.OutboxRequeueDeadLetter(bg, name)
			mustCode(t, "requeue of "+name, err, lease.CodeCorrupt)
			got, err := s.OutboxDiscardDeadLetter(bg, name)
			if err != nil || got.Entry.MessageID != name || got.Damaged != lease.DeadLetterCorrupt {
				t.Fatalf("discard of %s: %+v, %v", name, got, err)
			}
			if n, err := s.OutboxDeadLen(bg); err != nil || n != int64(2-i) {
				t.Fatalf("dead-letter count %d, %v; want %d", n, err, 2-i)
			}
			_, err = s.OutboxDiscardDeadLetter(bg, name)
			mustCode(t, "second discard of "+name, err, lease.CodeNotFound)
		}
		if keys, _ := dlKeys(t, s); len(keys) != 0 {
			t.Fatalf("dead letters left: %q", keys)
		}
	})
	t.Run("another message's damaged value", func(t *testing.T) {
		s := dlStore(t, c)
		id := dlSetAside(t, s, "tenant-fine", "poison")
		put(t, s, s.keys.dead(0), `{"entry":{"message_id":"msg_another","lock_`)
		got, err := s.OutboxRequeueDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id {
			t.Fatalf("requeue: %+v, %v", got, err)
		}
		size := got.Entry.Message.Size()
		keys, _ := dlKeys(t, s)
		if !slices.Equal(keys, []string{s.keys.dead(0)}) {
			t.Fatalf("dead letters after the requeue: %q", keys)
		}
		if got := dlListed(t, s); got != `"msg_another"()corrupt` {
			t.Fatalf("listed %s", got)
		}
		got, err = s.OutboxDiscardDeadLetter(bg, "msg_another")
		if err != nil || got.Entry.MessageID != "msg_another" || got.Damaged != lease.DeadLetterCorrupt {
			t.Fatalf("discard: %+v, %v", got, err)
		}
		want := fmt.Sprintf("pending [%s] usage (1, %d) dead [] count 0", id, size)
		if got := dlState(t, s); got != want {
			t.Fatalf("after the discard: %s; want %s", got, want)
		}
	})
	t.Run("a value in another layout", func(t *testing.T) {
		s := dlStore(t, c)
		id := dlSetAside(t, s, "tenant-layout", "poison")
		keys, vals := dlKeys(t, s)
		var d lease.DeadLetter
		if err := json.Unmarshal(vals[0], &d); err != nil {
			t.Fatal(err)
		}
		b, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := lease.DeadLetterID(b); ok {
			t.Fatal("the indented value is read in place")
		}
		put(t, s, keys[0], string(b))
		if got, want := dlListed(t, s), fmt.Sprintf("%q(poison)", id); got != want {
			t.Fatalf("listed %s; want %s", got, want)
		}
		got, err := s.OutboxDiscardDeadLetter(bg, id)
		if err != nil || got.Entry.MessageID != id || got.Reason != "poison" || got.Damaged != "" {
			t.Fatalf("discard: %+v, %v", got, err)
		}
		if got := dlState(t, s); got != "pending [] usage (0, 0) dead [] count 0" {
			t.Fatalf("after discard: %s", got)
		}
	})
	t.Run("an entry the outbox would not take", func(t *testing.T) {
		s := dlStore(t, c)
		id := dlSetAside(t, s, "tenant-invalid", "poison")
		keys, vals := dlKeys(t, s)
		var d lease.DeadLetter
		if err := json.Unmarshal(vals[0], &d); err != nil {
			t.Fatal(err)
		}
		d.Entry.LockKey = "not the identity's"
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		put(t, s, keys[0], string(b))
		before := keysOf(t, s)
		_, err = s.OutboxRequeueDeadLetter(bg, id)
		mustCode(t, "requeue", err, lease.CodeCorrupt)
		unchanged(t, s, before)
		// Listed as it is, so it can be discarded as it is.
		got, err := s.OutboxDiscardDeadLetter(bg, id)
		if err != nil || got.Entry.LockKey != d.Entry.LockKey {
			t.Fatalf("discard: %+v, %v", got, err)
		}
		if got := dlState(t, s); !strings.HasSuffix(got, "dead [] count 0") || strings.Contains(got, id) {
			t.Fatalf("after discard: %s", got)
		}
	})
}

// The oldest dead letter of a message id is found once: a later attempt
// reads only the key found (a copy planted before it by hand, which no
// operation writes, is not seen), and once that key is gone the scan goes
// on past it, to a younger copy or to none.
func TestDeadLetterSeekReadsOnlyItsKey(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	id := dlSetAside(t, s, "tenant-seek", "first")
	keys, vals := dlKeys(t, s)
	var d lease.DeadLetter
	if err := json.Unmarshal(vals[0], &d); err != nil {
		t.Fatal(err)
	}
	put := func(seq uint64, msgID, reason string) {
		t.Helper()
		c := d
		c.Entry.MessageID, c.Reason = msgID, reason
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.cli.Put(bg, s.keys.dead(seq), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.cli.Delete(bg, keys[0]); err != nil {
		t.Fatal(err)
	}
	put(10, "msg_other", "other")
	put(500, id, "oldest")
	put(501, id, "younger")
	f := s.seekDeadLetter(id)
	attempt := func() string {
		t.Helper()
		tx := s.newTxn(bg)
		if err := s.openDeadLetters(tx, f.keys()...); err != nil {
			t.Fatal(err)
		}
		key, raw, err := s.findDeadLetter(tx, f)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" && (s.nameAt(key, raw) != id || tx.seen[key].mod == 0) {
			t.Fatalf("found %s holding %q, mod %d", key, raw, tx.seen[key].mod)
		}
		return key
	}
	for i, want := range []string{s.keys.dead(500), s.keys.dead(500)} {
		if got := attempt(); got != want {
			t.Fatalf("attempt %d found %q; want %q", i, got, want)
		}
		put(5, id, "planted")
	}
	if _, err := s.cli.Delete(bg, s.keys.dead(500)); err != nil {
		t.Fatal(err)
	}
	if got := attempt(); got != s.keys.dead(501) {
		t.Fatalf("after the oldest went, found %q; want %q", got, s.keys.dead(501))
	}
	if _, err := s.cli.Delete(bg, s.keys.dead(501)); err != nil {
		t.Fatal(err)
	}
	if got := attempt(); got != "" {
		t.Fatalf("after both went, found %q; want none", got)
	}
}

// TestDeadLetterMetaDamageOverwritesNothing: the dead-letter sequence and
// count keys damaged (missing, malformed, behind the last dead letter, a
// count of 0) neither restart the sequence over a held dead letter nor
// lift the bound: a new dead letter goes after the last key, and the
// count written is the dead letters held.
func TestDeadLetterMetaDamageOverwritesNothing(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 1)
	for _, damage := range []struct {
		name     string
		seq, cnt []byte // nil: deleted
	}{
		{"missing", nil, nil},
		{"malformed", []byte("x"), []byte("y")},
		{"behind", u64(1), u64(0)},
	} {
		t.Run(damage.name, func(t *testing.T) {
			s := dlStore(t, c)
			first := dlSetAside(t, s, "tenant-meta-a", "first")
			second := dlSetAside(t, s, "tenant-meta-b", "second")
			ops := []clientv3.Op{}
			for k, v := range map[string][]byte{s.keys.deadSeq(): damage.seq, s.keys.deadCount(): damage.cnt} {
				if v == nil {
					ops = append(ops, clientv3.OpDelete(k))
				} else {
					ops = append(ops, clientv3.OpPut(k, string(v)))
				}
			}
			if _, err := s.cli.Txn(bg).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			third := dlSetAside(t, s, "tenant-meta-c", "third")
			keys, _ := dlKeys(t, s)
			if !slices.Equal(keys, []string{s.keys.dead(1), s.keys.dead(2), s.keys.dead(3)}) {
				t.Fatalf("dead-letter keys %q", keys)
			}
			listed, err := s.OutboxDeadLetters(bg, 0)
			if err != nil || len(listed) != 3 || listed[0].Entry.MessageID != first || listed[1].Entry.MessageID != second ||
				listed[2].Entry.MessageID != third {
				t.Fatalf("listed %+v, %v", listed, err)
			}
			if n, err := s.OutboxDeadLen(bg); err != nil || n != 3 {
				t.Fatalf("count %d, %v; want 3", n, err)
			}
		})
	}
}

// TestDeadLetterNamingTwoIDsIsDamaged (from a review of the shared
// decoder): a value whose start names one message id (A) but which
// decodes to another (B, a second message_id member) is damaged and
// named A, as the scan reads it in place: the listing and the scan agree,
// a discard of B finds nothing, and a requeue of A is refused instead of
// moving B's entry (and replacing B's pending one).
func TestDeadLetterNamingTwoIDsIsDamaged(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	a := dlSetAside(t, s, "tenant-rr-a", "poison")
	b := scopePublish(t, s, "tenant-rr-b")
	pend, err := s.OutboxPending(bg, 0)
	if err != nil || len(pend) != 1 || pend[0].MessageID != b {
		t.Fatalf("pending %+v, %v", pend, err)
	}
	v, err := json.Marshal(lease.DeadLetter{Entry: pend[0], Reason: "poison", DeadAt: pend[0].AcceptedAt})
	if err != nil {
		t.Fatal(err)
	}
	raw := strings.Replace(string(v), `{"entry":{"message_id":"`+b+`"`, `{"entry":{"message_id":"`+a+`","message_id":"`+b+`"`, 1)
	keys, _ := dlKeys(t, s)
	if len(keys) != 1 {
		t.Fatalf("dead letters %q", keys)
	}
	if _, err := s.cli.Put(bg, keys[0], raw); err != nil {
		t.Fatal(err)
	}
	if got, want := dlListed(t, s), fmt.Sprintf("%q()corrupt", a); got != want {
		t.Fatalf("listed %s; want %s", got, want)
	}
	before := keysOf(t, s)
	_, err = s.OutboxDiscardDeadLetter(bg, b)
	mustCode(t, "discard by the decoded id", err, lease.CodeNotFound)
	_, err = s.OutboxRequeueDeadLetter(bg, a)
	mustCode(t, "requeue by the id at its start", err, lease.CodeCorrupt)
	if after := keysOf(t, s); !maps.Equal(before, after) {
		t.Fatalf("a refusal changed the prefix:\nbefore %q\nafter  %q", before, after)
	}
	d, err := s.OutboxDiscardDeadLetter(bg, a)
	if err != nil || d.Entry.MessageID != a || d.Damaged != lease.DeadLetterCorrupt {
		t.Fatalf("discard: %+v, %v", d, err)
	}
	if got := dlState(t, s); got != fmt.Sprintf("pending [%s] usage (1, %d) dead [] count 0", b, pend[0].Message.Size()) {
		t.Fatalf("after the discard: %s", got)
	}
}
