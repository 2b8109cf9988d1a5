package valkey

import (
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// A namespace is written in version 1, which every build reads, until it
// is switched; an instance sharing it takes the switch at its next reaper
// pass (or when it opens), and its evidence and history are compact from
// then on, while what it wrote before still replays.
func TestCompactFormatIsANamespaceSwitch(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
	a, b := open(t, r, o), open(t, r, o)
	stored := func(s *Store, req lease.AcquireRequest) string {
		t.Helper()
		_, p, err := lease.PrepareAcquire(req, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := get(t, s, s.keys.idem(tagOf(p.LockKey), p.Scope))
		if !ok {
			t.Fatal("no evidence")
		}
		return v
	}
	before := acquireReq(newIdentity())
	if _, err := b.Acquire(bg, before); err != nil {
		t.Fatal(err)
	}
	if v := stored(b, before); !strings.HasPrefix(v, `{"idempotency_version":1,`) {
		t.Fatalf("evidence of an unswitched namespace: %.40q, want version 1", v)
	}
	if err := a.EnableCompactFormat(bg); err != nil {
		t.Fatal(err)
	}
	if err := b.reap(bg); err != nil {
		t.Fatal(err)
	}
	after := acquireReq(newIdentity())
	res, err := b.Acquire(bg, after)
	if err != nil {
		t.Fatal(err)
	}
	if v := stored(b, after); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
		t.Fatalf("evidence after the switch: %.40q, want version 2", v)
	}
	if _, err := b.Release(bg, releaseReq(res.Lease)); err != nil {
		t.Fatal(err)
	}
	if h := onlyHistoryEntry(t, b, tagOf(res.Lease.LockKey)); h.Record.LeaseID != res.Lease.LeaseID {
		t.Fatalf("history after the switch: %+v", h)
	}
	// A fresh instance reads the switch when it opens; both versions replay.
	c := open(t, r, o)
	if !c.compact.Load() {
		t.Fatal("an instance opened after the switch writes version 1")
	}
	for _, req := range []lease.AcquireRequest{before, after} {
		if got, err := c.Acquire(bg, req); err != nil || !got.Replayed {
			t.Fatalf("replay across the switch: %v %+v", err, got)
		}
	}
	// Options.CompactFormat (--valkey-compact-format) switches at open.
	d := open(t, r, Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions(), CompactFormat: true})
	if v, _ := get(t, d, d.keys.format()); v != compactFormat || !d.compact.Load() {
		t.Fatalf("a store opened with CompactFormat: switch %q, compact %v", v, d.compact.Load())
	}
}
