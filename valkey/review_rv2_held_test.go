package valkey

// Review of namespace format 3 (commit b053f20): behaviour the reviewer
// tried to break and found held. These assert the correct behaviour.

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

func storedActive(t *testing.T, s *Store, rec *lease.Record) string {
	t.Helper()
	v, ok := get(t, s, s.keys.active(tagOf(rec.LockKey)))
	if !ok {
		t.Fatal("no active record")
	}
	return v
}

func isV2(raw string) bool { return strings.HasPrefix(raw, lease.RecordV2Prefix) }

// The largest fencing token (2^53-1, 16 digits) is written, read back and
// renewed in record version 2, and the next acquisition is refused as
// exhausted.
func TestRV2ReviewTokenAtLimit(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	id := newIdentity()
	const max = uint64(1<<53 - 1)
	if err := (faults{s}).SetCounter(bg, lockKey(t, id), max-1); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(bg, acquireReq(id))
	if err != nil || a.Lease.FencingToken != max {
		t.Fatalf("acquire at the limit: %+v %v", a, err)
	}
	if raw := storedActive(t, s, a.Lease); !isV2(raw) || !strings.Contains(raw, "\n9007199254740991\n") {
		t.Fatalf("stored: %q", raw)
	}
	rn, err := s.Renew(bg, renewReq(a.Lease))
	if err != nil || rn.Lease.FencingToken != max {
		t.Fatalf("renew: %+v %v", rn, err)
	}
	in, err := s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
	if err != nil || !reflect.DeepEqual(in.Lease, rn.Lease) {
		t.Fatalf("inspect: %+v %v", in, err)
	}
	if _, err := s.AuthorizeCommit(bg, commitReq(rn.Lease)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if _, err := s.Release(bg, releaseReq(rn.Lease)); err != nil {
		t.Fatal(err)
	}
	_, err = s.Acquire(bg, acquireReq(id))
	mustCode(t, err, lease.CodeCounterExhausted)
}

// Metadata at the 4 KiB bound, with unicode, escapes, line and paragraph
// separators and newlines inside strings, round-trips through a version 2
// record (acquire, renew, inspect, release, history), stored as
// lease.CompactRecord's bytes; one byte more is refused before it is sent.
func TestRV2ReviewMetadataEdges(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	exact := lease.Metadata{"pad": ""}
	b, _ := exact.MarshalJSON()
	exact["pad"] = strings.Repeat("z", lease.MaxMetadataBytes-len(b))
	if b, _ := exact.MarshalJSON(); len(b) != lease.MaxMetadataBytes {
		t.Fatalf("metadata is %d bytes", len(b))
	}
	for i, meta := range []lease.Metadata{
		exact,
		{"u": "ünïcödé 😀 \u2028\u2029 \x7f", "nl": "a\nb\r\nc", "q": `"\`, "html": "</script><!--&", "n": -1e-7, "big": 1e300, "z": 0, "f": false, "nil": nil},
		{},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			id := newIdentity()
			req := acquireReq(id)
			req.Metadata = meta
			a, err := s.Acquire(bg, req)
			if err != nil {
				t.Fatal(err)
			}
			raw := storedActive(t, s, a.Lease)
			if want := storedRecordWant(t, s, a.Lease); raw != want || !isV2(raw) {
				t.Fatalf("stored %q\nwant %q", raw, want)
			}
			rn, err := s.Renew(bg, renewReq(a.Lease))
			if err != nil || !reflect.DeepEqual(rn.Lease.Metadata, a.Lease.Metadata) {
				t.Fatalf("renew: %+v %v", rn.Lease, err)
			}
			in, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far()})
			if err != nil || !reflect.DeepEqual(in.Lease, rn.Lease) {
				t.Fatalf("inspect: %+v %v", in, err)
			}
			if _, err := s.Release(bg, releaseReq(rn.Lease)); err != nil {
				t.Fatal(err)
			}
			h := onlyHistoryEntry(t, s, tagOf(a.Lease.LockKey))
			if !reflect.DeepEqual(h.Record.Metadata, rn.Lease.Metadata) {
				t.Fatalf("history metadata %v, want %v", h.Record.Metadata, rn.Lease.Metadata)
			}
		})
	}
	over := acquireReq(newIdentity())
	over.Metadata = lease.Metadata{"pad": exact["pad"].(string) + "z"}
	_, err := s.Acquire(bg, over)
	mustCode(t, err, lease.CodeInvalidRequest)
}

// Two instances of one namespace, one in format 2 (version 1 records) and
// one in format 3 (version 2 records), work on the same leases: each reads
// and renews the other's record, replays the other's requests (the replay
// reports the lease's state now), inspects by lease id and lists; and a
// request answered before the switch replays after it.
func TestRV2ReviewMixedInstancesAndReplays(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
	old := open(t, r, o) // version 1 everywhere
	id0 := newIdentity()
	req0 := acquireReq(id0)
	first, err := old.Acquire(bg, req0)
	if err != nil {
		t.Fatal(err)
	}
	o2 := o
	o2.CompactFormat = true
	two := open(t, r, o2)
	o3 := o
	o3.CompactRecords = true
	three := open(t, r, o3)
	two.setFormat(compactFormat) // has not yet seen the switch
	if !three.writes(compactRecords) || two.writeFormat() != "compact" || old.writeFormat() != "v1" {
		t.Fatalf("formats: %s %s %s", old.writeFormat(), two.writeFormat(), three.writeFormat())
	}
	// Before the switch: a version 1 record and evidence, renewed in v2.
	rn0, err := three.Renew(bg, renewReq(first.Lease))
	if err != nil || !isV2(storedActive(t, three, rn0.Lease)) {
		t.Fatalf("renew after the switch: %v", err)
	}
	rep, err := old.Acquire(bg, req0)
	if err != nil || !rep.Replayed || !reflect.DeepEqual(rep.Lease, first.Lease) || rep.Current != nil {
		t.Fatalf("replay of a pre-switch acquire: %+v %v", rep, err)
	}

	id := newIdentity()
	req := acquireReq(id)
	a, err := three.Acquire(bg, req)
	if err != nil || !isV2(storedActive(t, three, a.Lease)) {
		t.Fatalf("acquire in format 3: %v", err)
	}
	for _, s := range []*Store{old, two} {
		got, err := s.Acquire(bg, req)
		if err != nil || !got.Replayed || !reflect.DeepEqual(got.Lease, a.Lease) {
			t.Fatalf("replay on another instance: %+v %v", got, err)
		}
	}
	rreq := renewReq(a.Lease)
	rn, err := two.Renew(bg, rreq)
	if err != nil || isV2(storedActive(t, two, rn.Lease)) {
		t.Fatalf("format 2 renew of a version 2 record: %v", err)
	}
	if got, err := three.Renew(bg, rreq); err != nil || !got.Replayed || !reflect.DeepEqual(got.Lease, rn.Lease) {
		t.Fatalf("renew replay: %+v %v", got, err)
	}
	got, err := three.Acquire(bg, req)
	if err != nil || !got.Replayed || !reflect.DeepEqual(got.Lease, a.Lease) {
		t.Fatalf("acquire replay after a renewal elsewhere: %+v %v", got, err)
	}
	rn2, err := three.Renew(bg, renewReq(rn.Lease))
	if err != nil || !isV2(storedActive(t, three, rn2.Lease)) {
		t.Fatalf("format 3 renew of a version 1 record: %v", err)
	}
	for _, s := range []*Store{old, two, three} {
		in, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far()})
		if err != nil || !reflect.DeepEqual(in.Lease, rn2.Lease) {
			t.Fatalf("inspect by id: %+v %v", in, err)
		}
		l, err := s.List(bg, lease.ListRequest{By: lease.ListByTarget, TenantID: id.TenantID, ProgramID: id.ProgramID,
			TargetNamespace: id.TargetNamespace, TargetID: id.TargetID, DeadlineAt: far()})
		if err != nil || len(l.Leases) != 1 || !reflect.DeepEqual(l.Leases[0], rn2.Lease) {
			t.Fatalf("list: %+v %v", l, err)
		}
	}
	if _, err := old.Release(bg, releaseReq(rn2.Lease)); err != nil {
		t.Fatal(err)
	}
	got, err = three.Acquire(bg, req)
	if err != nil || !got.Replayed || got.Current == nil || got.Current.State != lease.StateReleased {
		t.Fatalf("replay after a release: %+v %v", got, err)
	}
}

// Concurrent switches to 2 and 3 from several instances end at 3, and
// every instance that asked for 3 writes version 2 records at once.
func TestRV2ReviewRaiseFormatRace(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
	var stores []*Store
	for range 6 {
		stores = append(stores, open(t, r, o))
	}
	for round := range 10 {
		var wg sync.WaitGroup
		errs := make([]error, len(stores))
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if (i+round)%2 == 0 {
					errs[i] = s.EnableCompactRecords(bg)
				} else {
					errs[i] = s.EnableCompactFormat(bg)
				}
			}()
		}
		wg.Wait()
		for i, s := range stores {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if (i+round)%2 == 0 && !s.writes(compactRecords) {
				t.Fatalf("round %d: store %d asked for 3 and writes %s", round, i, s.writeFormat())
			}
		}
		if v, _ := get(t, stores[0], stores[0].keys.format()); v != compactRecords {
			t.Fatalf("round %d: switch %q", round, v)
		}
	}
}

// A format switch of the wrong type is refused and left alone; an
// instance opened without the option keeps working.
func TestRV2ReviewFormatKeyWrongType(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
	s := open(t, r, o)
	if err := s.client.Do(bg, s.client.B().Rpush().Key(s.keys.format()).Element("3").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, s.EnableCompactRecords(bg), lease.CodeCorrupt)
	if typ, _ := s.client.Do(bg, s.client.B().Type().Key(s.keys.format()).Build()).ToString(); typ != "list" {
		t.Fatalf("the switch became a %s", typ)
	}
	o.CompactRecords = true
	o.Addr = r.Addr()
	if _, err := Open(bg, o); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("open with CompactRecords on a wrong-typed switch: %v", err)
	}
	s.loadFormat(bg)
	a, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil || isV2(storedActive(t, s, a.Lease)) {
		t.Fatalf("acquire: %v", err)
	}
}

// A format 3 namespace backs up and restores (version 2 records, the
// switch itself), recovery reads and ends its version 2 records, replays
// answer with the original results, and the restored namespace writes
// version 2 once an instance has read its switch.
func TestRV2ReviewBackupRestoreFormat3(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	id, id2 := newIdentity(), newIdentity()
	req := acquireReq(id)
	first, err := src.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Release(bg, releaseReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	live, err := src.Acquire(bg, acquireReq(id2))
	if err != nil || !isV2(storedActive(t, src, live.Lease)) {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: src.opts}
	dst := open(t, r, o)
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	c, st := closedState(t, o)
	if len(st.Active) != 1 || !reflect.DeepEqual(st.Active[0], live.Lease) {
		t.Fatalf("restored actives: %+v", st.Active)
	}
	res, err := c.Finish(bg, lease.RecoveryPlan{Reason: "restored"})
	if err != nil || len(res.Revoked) != 1 {
		t.Fatalf("finish: %+v %v", res, err)
	}
	rep, err := dst.Acquire(bg, req)
	if err != nil || !rep.Replayed || rep.Lease.LeaseID != first.Lease.LeaseID || rep.Current == nil || rep.Current.State != lease.StateReleased {
		t.Fatalf("replay after restore: %+v %v", rep, err)
	}
	_, err = dst.Renew(bg, renewReq(live.Lease))
	mustCode(t, err, lease.CodeLost)
	if err := dst.reap(bg); err != nil {
		t.Fatal(err)
	}
	next, err := dst.Acquire(bg, acquireReq(id2))
	if err != nil || next.Lease.FencingToken != live.Lease.FencingToken+1 || !isV2(storedActive(t, dst, next.Lease)) {
		t.Fatalf("acquire after restore: %+v %v", next, err)
	}
}

// A version 2 record copied under another identity's key is refused by
// every path, even while the library's and Go's memos hold its bytes
// (decoded under its own key): inspect (by identity and by lease id),
// renew, release, commit, acquire and the reaper's expiry; the copy is
// left in place and the original lease is untouched.
func TestRV2ReviewRecordUnderForeignKey(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	a, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	// Warm both memos with a's bytes.
	if _, err := s.Inspect(bg, lease.InspectRequest{Identity: a.Lease.Identity(), DeadlineAt: far()}); err != nil {
		t.Fatal(err)
	}
	rawA := storedActive(t, s, a.Lease)
	kb := s.keys.active(tagOf(b.Lease.LockKey))
	if err := s.client.Do(bg, s.client.B().Set().Key(kb).Value(rawA).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// b's identity with a's lease facts: what a stale or confused caller holds.
	forged := a.Lease.Clone()
	forged.TenantID, forged.ProgramID, forged.TargetID = b.Lease.TenantID, b.Lease.ProgramID, b.Lease.TargetID
	forged.LockKey = b.Lease.LockKey
	_, err = s.Inspect(bg, lease.InspectRequest{Identity: b.Lease.Identity(), DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	_, err = s.Inspect(bg, lease.InspectRequest{LeaseID: b.Lease.LeaseID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	for name, op := range map[string]func() error{
		"renew":   func() error { _, err := s.Renew(bg, renewReq(forged)); return err },
		"release": func() error { _, err := s.Release(bg, releaseReq(forged)); return err },
		"commit":  func() error { _, err := s.AuthorizeCommit(bg, commitReq(forged)); return err },
		"acquire": func() error { _, err := s.Acquire(bg, acquireReq(b.Lease.Identity())); return err },
	} {
		if err := op(); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Errorf("%s under the foreign record: %v, want corrupt", name, err)
		}
	}
	if err := s.expireIfCurrent(bg, b.Lease.LockKey, a.Lease.LeaseID, a.Lease.FencingToken); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, s, kb); v != rawA {
		t.Fatal("the foreign copy was changed")
	}
	in, err := s.Inspect(bg, lease.InspectRequest{Identity: a.Lease.Identity(), DeadlineAt: far()})
	if err != nil || !reflect.DeepEqual(in.Lease, a.Lease) {
		t.Fatalf("the original: %+v %v", in, err)
	}
}

// An identity with non-ASCII components of the longest length (256 bytes)
// is stored, read, renewed, listed and ended in record version 2.
func TestRV2ReviewUnicodeIdentity(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	id := newIdentity()
	id.TenantID = "ténant-ü-" + uid("")
	id.TargetID = strings.Repeat("é", 128) // 256 bytes
	id.ActorName = "актор"
	a, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	if raw := storedActive(t, s, a.Lease); raw != storedRecordWant(t, s, a.Lease) || !isV2(raw) {
		t.Fatalf("stored %q", raw)
	}
	rn, err := s.Renew(bg, renewReq(a.Lease))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.List(bg, lease.ListRequest{By: lease.ListByTarget, TenantID: rn.Lease.TenantID, ProgramID: rn.Lease.ProgramID,
		TargetNamespace: rn.Lease.TargetNamespace, TargetID: rn.Lease.TargetID, DeadlineAt: far()})
	if err != nil || len(l.Leases) != 1 || !reflect.DeepEqual(l.Leases[0], rn.Lease) {
		t.Fatalf("list: %+v %v", l, err)
	}
	if _, err := s.AuthorizeCommit(bg, commitReq(rn.Lease)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(bg, adminReq(rn.Lease)); err != nil {
		t.Fatal(err)
	}
	if h := onlyHistoryEntry(t, s, tagOf(a.Lease.LockKey)); h.Record.State != lease.StateRevoked || h.Record.TargetID != id.TargetID {
		t.Fatalf("history: %+v", h.Record)
	}
}

// The reaper's expiry archives an expired version 2 record as expired at
// its expires_at, and leaves a live one alone.
func TestRV2ReviewReaperOnVersion2(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	live, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.expireIfCurrent(bg, live.Lease.LockKey, live.Lease.LeaseID, live.Lease.FencingToken); err != nil {
		t.Fatal(err)
	}
	if raw := storedActive(t, s, live.Lease); !isV2(raw) {
		t.Fatal("the live record changed")
	}
	exp := putExpired(t, faults{s}, live.Lease)
	v2, _ := lease.CompactRecord(exp)
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.active(tagOf(exp.LockKey))).Value(string(v2)).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.expireIfCurrent(bg, exp.LockKey, exp.LeaseID, exp.FencingToken); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, s, s.keys.active(tagOf(exp.LockKey))); ok {
		t.Fatal("the expired record is still active")
	}
	h := onlyHistoryEntry(t, s, tagOf(exp.LockKey))
	if h.Record.State != lease.StateExpired || h.EndedAt != exp.ExpiresAt || h.Record.LeaseID != exp.LeaseID {
		t.Fatalf("history: %+v", h)
	}
}
