package etcd

import (
	"testing"

	"github.com/starintel/starlease/internal/testenv"
)

// A damaged dead letter whose value names no message id is listed with
// message_id "" and can never be discarded (discard needs an opaque id;
// findDeadLetter passes over values naming none): it holds a place in
// meta/dead_count, below lease.MaxOutboxDeadLetters, for good, short of
// editing etcd by hand, which is what the damaged listing was to end.
func TestAttack2DamagedLetterNamingNoIDCannotBeDiscarded(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 1)
	s := dlStore(t, c)
	dlSetAside(t, s, "tenant-noid", "poison")
	keys, _ := dlKeys(t, s)
	if _, err := s.cli.Put(bg, keys[0], "\x00garbage"); err != nil {
		t.Fatal(err)
	}
	listed, err := s.OutboxDeadLetters(bg, 0)
	if err != nil || len(listed) != 1 || listed[0].Damaged == "" {
		t.Fatalf("listed %+v %v", listed, err)
	}
	if _, err := s.OutboxDiscardDeadLetter(bg, listed[0].Entry.MessageID); err != nil {
		n, _ := s.OutboxDeadLen(bg)
		t.Errorf("the listed damaged dead letter (message id %q) cannot be discarded: %v; %d dead letters stay counted", listed[0].Entry.MessageID, err, n)
	}
}
