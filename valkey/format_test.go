package valkey

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
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
	if !c.writes(compactFormat) {
		t.Fatal("an instance opened after the switch writes version 1")
	}
	for _, req := range []lease.AcquireRequest{before, after} {
		if got, err := c.Acquire(bg, req); err != nil || !got.Replayed {
			t.Fatalf("replay across the switch: %v %+v", err, got)
		}
	}
	// Options.CompactFormat (--valkey-compact-format) switches at open.
	d := open(t, r, Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions(), CompactFormat: true})
	if v, _ := get(t, d, d.keys.format()); v != compactFormat || !d.writes(compactFormat) {
		t.Fatalf("a store opened with CompactFormat: switch %q, compact %v", v, d.writes(compactFormat))
	}
}

// Format 3 stores active records in version 2 from the switch on, for a
// writer at once and for another instance at its next reaper pass;
// records of either version are read by both and a version 1 record is
// rewritten in version 2 at its next change. The switch only rises: an
// instance opened with CompactFormat leaves a format 3 namespace in 3,
// and a value the build does not know is refused and left as it is.
func TestCompactRecordsIsANamespaceSwitch(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions(), CompactFormat: true}
	a, b := open(t, r, o), open(t, r, o)
	stored := func(s *Store, rec *lease.Record) string {
		t.Helper()
		v, ok := get(t, s, s.keys.active(tagOf(rec.LockKey)))
		if !ok {
			t.Fatal("no active record")
		}
		return v
	}
	old, err := b.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if v := stored(b, old.Lease); !strings.HasPrefix(v, `{"record_version":1,`) {
		t.Fatalf("record in format 2: %.30q, want version 1", v)
	}
	if err := a.EnableCompactRecords(bg); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, a, a.keys.format()); v != compactRecords || !a.writes(compactRecords) || !a.writes(compactFormat) {
		t.Fatalf("switch %q, records %v, compact %v", v, a.writes(compactRecords), a.writes(compactFormat))
	}
	// b has not seen the switch yet: it still writes version 1 records,
	// and reads the version 2 ones a writes.
	fresh, err := a.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if v := stored(a, fresh.Lease); !strings.HasPrefix(v, lease.RecordV2Prefix) {
		t.Fatalf("record after the switch: %.30q, want version 2", v)
	}
	rn, err := b.Renew(bg, renewReq(fresh.Lease))
	if err != nil {
		t.Fatal(err)
	}
	if v := stored(b, rn.Lease); !strings.HasPrefix(v, `{"record_version":1,`) {
		t.Fatalf("a format 2 writer's record: %.30q", v)
	}
	if err := b.reap(bg); err != nil {
		t.Fatal(err)
	}
	if !b.writes(compactRecords) {
		t.Fatal("the reaper pass did not take the switch")
	}
	for _, rec := range []*lease.Record{old.Lease, rn.Lease} {
		got, err := b.Renew(bg, renewReq(rec))
		if err != nil {
			t.Fatal(err)
		}
		if v := stored(b, got.Lease); !strings.HasPrefix(v, lease.RecordV2Prefix) {
			t.Fatalf("a version 1 record renewed after the switch: %.30q", v)
		}
		in, err := a.Inspect(bg, lease.InspectRequest{Identity: rec.Identity(), DeadlineAt: far()})
		if err != nil || !reflect.DeepEqual(in.Lease, got.Lease) {
			t.Fatalf("inspect: %+v %v, want %+v", in.Lease, err, got.Lease)
		}
		if _, err := a.Release(bg, releaseReq(got.Lease)); err != nil {
			t.Fatal(err)
		}
	}
	// Opening with the earlier format's option does not lower it.
	c := open(t, r, o)
	if v, _ := get(t, c, c.keys.format()); v != compactRecords || !c.writes(compactRecords) {
		t.Fatalf("after an open with CompactFormat: switch %q, records %v", v, c.writes(compactRecords))
	}
	if err := c.EnableCompactFormat(bg); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, c, c.keys.format()); v != compactRecords || !c.writes(compactRecords) {
		t.Fatalf("after EnableCompactFormat: switch %q, records %v", v, c.writes(compactRecords))
	}
	// A value this build does not know stays, and is refused.
	if err := c.client.Do(bg, c.client.B().Set().Key(c.keys.format()).Value("9").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.EnableCompactRecords(bg); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("raising an unknown switch: %v, want corrupt", err)
	}
	if v, _ := get(t, c, c.keys.format()); v != "9" {
		t.Fatalf("the unknown switch became %q", v)
	}
	c.loadFormat(bg)
	if c.writes(compactFormat) || c.writes(compactRecords) {
		t.Fatal("an unknown switch is not read as version 1")
	}
}

// A closed namespace keeps its switch: an instance opened with
// CompactRecords while it is sealed opens (mutations are refused anyway)
// and leaves the switch as it is, then raises it at its first reaper pass
// after recovery reopens the namespace.
func TestCompactRecordsWaitsForAClosedNamespace(t *testing.T) {
	r, o, _ := sealedCompactNamespace(t)
	o.CompactRecords = true
	d := open(t, r, o)
	if v, _ := get(t, d, d.keys.format()); v != compactFormat || d.writes(compactRecords) {
		t.Fatalf("a sealed namespace's switch: %q, records %v", v, d.writes(compactRecords))
	}
	if err := d.EnableCompactRecords(bg); !errors.Is(err, errFormatClosed) {
		t.Fatalf("raising a sealed namespace's switch: %v", err)
	}
	c, _ := closedState(t, o)
	if _, err := c.Finish(bg, lease.RecoveryPlan{Reason: "failover drill"}); err != nil {
		t.Fatal(err)
	}
	if err := d.reap(bg); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, d, d.keys.format()); v != compactRecords || !d.writes(compactRecords) {
		t.Fatalf("after the namespace reopened: switch %q, records %v", v, d.writes(compactRecords))
	}
}

// sealedCompactNamespace is a namespace in format 2 holding a lease,
// sealed (closed as after a failover), with the options that opened it.
func sealedCompactNamespace(t *testing.T) (*testenv.Redis, Options, *Store) {
	t.Helper()
	r := sharedServer(t)
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions(), CompactFormat: true}
	s := open(t, r, o)
	if _, err := s.Acquire(bg, acquireReq(newIdentity())); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seal(bg); err != nil {
		t.Fatal(err)
	}
	return r, o, s
}
