package valkey

import (
	"testing"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease/leasetest"
)

// Adopted from a second review of the dead-letter changes (it failed
// before allow-oom). The listing of dead letters was reads only (GET); with the fix, a dead
// letter of the older layout (or one whose reason key is gone) is read by
// outbox_dead_read, a function registered without flags, so FCALL of it
// is a write and deny-oom command: on a server at maxmemory (noeviction,
// as the package requires) `starlease outbox dead-letters` fails as soon
// as one such dead letter is in the page, though it changes nothing. Dead
// letters themselves (up to 10,000 of ~110 KiB) are a likely cause of the
// full server the operator is trying to diagnose.
func TestAttack2OlderLayoutListingFailsAtMaxmemory(t *testing.T) {
	r := testenv.StartRedis(t) // its own: maxmemory would fail others' writes
	s := open(t, r, Options{StoreOptions: leasetest.StoreOptions()})
	id, _ := deadLetterOn(t, s, "abc", "no exchange")
	olderLayout(t, s, id)
	c := s.client
	run(t, s, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "1").Build())
	t.Cleanup(func() {
		_ = c.Do(bg, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build()).Error()
	})
	if v, ok := get(t, s, s.keys.outboxDeadWhy(id)); !ok || v == "" {
		t.Fatalf("a plain read fails at maxmemory too: %q", v)
	}
	if listed, err := s.OutboxDeadLetters(bg, 0); err != nil {
		t.Errorf("a listing of one older-layout dead letter fails on a full server (reads alone succeed): %v", err)
	} else if len(listed) != 1 {
		t.Errorf("listed %+v", listed)
	}
}
