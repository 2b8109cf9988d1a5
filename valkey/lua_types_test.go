package valkey

import (
	"maps"
	"testing"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Every key a lease mutation reads or may write, holding another type than
// its own, fails the mutation closed before anything changes: corrupt (the
// gate: closed), with only the quarantine marker written. Each KEY of
// acquire, renew, release and a commit with a publication, one at a time
// (the library's checks of stored types must not depend on which
// combination of keys exists).
func TestWrongTypeOfEveryKeyChangesNothing(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	// A key and whether the library writes it as a string (the wrong type
	// is then a list, else a string).
	type key struct {
		name   string
		key    string
		string bool
	}
	common := func(tag, evidence string) []key {
		return []key{
			{"active", s.keys.active(tag), true}, {"history", s.keys.history(tag), false},
			{"index", s.keys.index(), false}, {"schedule", s.keys.expiry(), false},
			{"evidence", evidence, true}, {"gate", s.keys.gate(), true},
		}
	}
	type op struct {
		name string
		// prepare makes the operation on a fresh identity: its hash tag,
		// its keys, and the call that runs it.
		prepare func(t *testing.T) (string, []key, func() error)
	}
	held := func(t *testing.T) *lease.Record {
		a, err := s.Acquire(bg, acquireReq(newIdentity()))
		if err != nil {
			t.Fatal(err)
		}
		return a.Lease
	}
	ops := []op{
		{"acquire", func(t *testing.T) (string, []key, func() error) {
			req := acquireReq(newIdentity())
			_, p, err := lease.PrepareAcquire(req, s.opts)
			if err != nil {
				t.Fatal(err)
			}
			tag := tagOf(p.LockKey)
			keys := append(common(tag, s.keys.idem(tag, p.Scope)),
				key{"counter", s.keys.counter(tag), true}, key{"floor", s.keys.counterFloor(), true})
			return tag, keys, func() error { _, err := s.Acquire(bg, req); return err }
		}},
		{"renew", func(t *testing.T) (string, []key, func() error) {
			req := renewReq(held(t))
			_, p, err := lease.PrepareRenew(req, s.opts)
			if err != nil {
				t.Fatal(err)
			}
			tag := tagOf(p.LockKey)
			return tag, common(tag, s.keys.idem(tag, p.Scope)), func() error { _, err := s.Renew(bg, req); return err }
		}},
		{"release", func(t *testing.T) (string, []key, func() error) {
			req := releaseReq(held(t))
			_, p, err := lease.PrepareRelease(req, s.opts)
			if err != nil {
				t.Fatal(err)
			}
			tag := tagOf(p.LockKey)
			return tag, common(tag, s.keys.idem(tag, p.Scope)), func() error { _, err := s.Release(bg, req); return err }
		}},
		{"commit", func(t *testing.T) (string, []key, func() error) {
			req := commitReq(held(t))
			req.Target = "" // the publication is the write
			req.Outbox = &lease.OutboxMessage{Exchange: "leases", RoutingKey: "lease.commit", ContentType: "application/json",
				Body: []byte(`{}`)}
			_, p, err := lease.PrepareCommit(req, s.opts)
			if err != nil {
				t.Fatal(err)
			}
			tag := tagOf(p.LockKey)
			keys := append(common(tag, s.keys.commit(tag, p.Scope)), key{"marks", s.keys.marks(tag), false},
				key{"outbox", s.keys.outbox(), false}, key{"outbox_entry", s.keys.outboxMsg(lease.OutboxMessageID(p.Scope)), true},
				key{"commit_seq", s.keys.commitSeq(tag), true}, key{"outbox_seq", s.keys.outboxSeq(), true},
				key{"outbox_bytes", s.keys.outboxBytes(), true})
			return tag, keys, func() error { _, err := s.AuthorizeCommit(bg, req); return err }
		}},
	}
	for _, o := range ops {
		_, keys, _ := o.prepare(t)
		for i := range keys {
			t.Run(o.name+"_"+keys[i].name, func(t *testing.T) {
				tag, keys, run := o.prepare(t)
				k := keys[i]
				var cmd vk.Completed
				if k.string {
					cmd = s.client.B().Lpush().Key(k.key).Element("x").Build()
				} else {
					cmd = s.client.B().Set().Key(k.key).Value("x").Build()
				}
				if err := s.client.Do(bg, s.client.B().Del().Key(k.key).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if err := s.client.Do(bg, cmd).Error(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.client.Do(bg, s.client.B().Del().Key(k.key).Build()) })
				quarantine := s.keys.quarantine(tag)
				before := snapshot(t, s, quarantine)
				want := lease.CodeCorrupt
				if k.name == "gate" {
					want = lease.CodeBackendUnavailable
				}
				mustCode(t, run(), want)
				if after := snapshot(t, s, quarantine); !maps.Equal(before, after) {
					t.Fatalf("a refused operation changed the namespace:\n before %q\n after  %q", before, after)
				}
			})
		}
	}
}
