package valkey

import (
	"bytes"
	_ "embed"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Tests of stored format 4 (format.go): a lease's acquisition evidence in
// its active record (version 3) while it is active, written out to its
// own key by every ending; its expiry schedule entries are every record
// version's, tag ‖ 0 ‖ lease id ‖ 0 ‖ token.

func open4(t *testing.T, o Options) *Store {
	t.Helper()
	o.StoreOptions = leasetest.StoreOptions()
	o.EmbeddedEvidence = true
	s := open(t, sharedServer(t), o)
	if !s.writes(embeddedEvidence) || s.writeFormat() != "embedded_evidence" {
		t.Fatal("the namespace is not in format 4")
	}
	return s
}

// pexpireTime is a key's absolute expiry in ms (-2: no key, -1: none).
func pexpireTime(t *testing.T, s *Store, key string) int64 {
	t.Helper()
	v, err := s.client.Do(bg, s.client.B().Arbitrary("PEXPIRETIME").Keys(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func evidenceKey(t *testing.T, s *Store, req lease.AcquireRequest) string {
	t.Helper()
	_, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return s.keys.idem(tagOf(p.LockKey), p.Scope)
}

func encoded(t *testing.T, r *lease.Record) string {
	t.Helper()
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mustReplay replays req and checks it answers first's lease byte for
// byte, replayed, with the state now (Current) of state want (nil Current
// when the lease is still as acquired).
func mustReplay(t *testing.T, s *Store, req lease.AcquireRequest, first lease.Result, want lease.State) lease.Result {
	t.Helper()
	got, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !got.Replayed || got.Code != lease.CodeAcquired || encoded(t, got.Lease) != encoded(t, first.Lease) ||
		got.BackendTime.UnixMilli() != first.BackendTime.UnixMilli() {
		t.Fatalf("replay answered\n %+v\nwant the first answer\n %+v", got.Lease, first.Lease)
	}
	switch {
	case want == "" && got.Current != nil:
		t.Fatalf("replay of an unchanged lease reports a current state: %+v", got.Current)
	case want != "" && (got.Current == nil || got.Current.State != want || got.Current.LeaseID != first.Lease.LeaseID):
		t.Fatalf("replay's current state: %+v, want %s", got.Current, want)
	}
	lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
		RequestID: req.RequestID, DeadlineAt: far()})
	if err != nil || encoded(t, lr.Lease) != encoded(t, first.Lease) {
		t.Fatalf("lookup: %+v %v", lr, err)
	}
	if want != "" && (lr.Current == nil || lr.Current.State != want) {
		t.Fatalf("lookup's current state: %+v, want %s", lr.Current, want)
	}
	// Another digest under the same request id conflicts.
	other := req
	other.TTL += time.Second
	_, err = s.Acquire(bg, other)
	mustCode(t, err, lease.CodeIdempotencyConflict)
	return got
}

// mustWrittenOut checks that first's acquisition evidence is in its own
// key, in evidence version 2, expiring at acquired_at + the idempotency
// retention, expanding to exactly the first answer; and that first's
// active record is gone.
func mustWrittenOut(t *testing.T, s *Store, req lease.AcquireRequest, first lease.Result) {
	t.Helper()
	key := evidenceKey(t, s, req)
	v, ok := get(t, s, key)
	if !ok || !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
		t.Fatalf("evidence key after the end: %q %v", v, ok)
	}
	if at, want := pexpireTime(t, s, key), first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
		t.Fatalf("evidence PXAT %d, want acquired_at + retention %d", at, want)
	}
	raw, ok := lease.ExpandEvidence(v, first.Lease.Identity())
	ev, err := lease.DecodeIdempotencyRecord([]byte(raw))
	if !ok || err != nil || ev.Op != lease.OpAcquire || encoded(t, ev.Lease) != encoded(t, first.Lease) {
		t.Fatalf("written-out evidence: %v %+v", err, ev)
	}
	if cur, ok := get(t, s, s.keys.active(tagOf(first.Lease.LockKey))); ok && strings.Contains(cur, "\n"+first.Lease.LeaseID+"\n") {
		t.Fatal("the ended lease's active record is still there")
	}
}

// acquire4 acquires req in a format 4 namespace and checks what is
// stored: a version 3 record, no evidence key, an expiry entry tag ‖ 0 ‖
// lease id ‖ 0 ‖ token, and a PXAT no earlier than the evidence's
// retention.
func acquire4(t *testing.T, s *Store, req lease.AcquireRequest) lease.Result {
	t.Helper()
	res, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	tag := tagOf(res.Lease.LockKey)
	raw, ok := get(t, s, s.keys.active(tag))
	if !ok || !strings.HasPrefix(raw, lease.RecordV3Prefix) {
		t.Fatalf("format 4 record: %.20q", raw)
	}
	rec, e, err := lease.DecodeEmbeddingRecord([]byte(raw))
	if err != nil || e == nil || encoded(t, rec) != encoded(t, res.Lease) {
		t.Fatalf("stored record: %v", err)
	}
	if _, ok := get(t, s, evidenceKey(t, s, req)); ok {
		t.Fatal("an evidence key was written at acquire")
	}
	if at, min := pexpireTime(t, s, s.keys.active(tag)), res.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at < min {
		t.Fatalf("active PXAT %d, below acquired_at + idempotency retention %d", at, min)
	}
	if _, err := s.client.Do(bg, s.client.B().Zscore().Key(s.keys.expiry()).Member(tag+"\x00"+res.Lease.LeaseID+"\x00"+utoa(res.Lease.FencingToken)).Build()).AsFloat64(); err != nil {
		t.Fatalf("no tag ‖ 0 ‖ lease id ‖ 0 ‖ token expiry entry: %v", err)
	}
	return res
}

// waitExpired waits until backend time is past rec's expiry.
func waitExpired(t *testing.T, s *Store, rec *lease.Record) {
	t.Helper()
	for {
		now, err := s.backendTime(bg)
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMilli() > rec.ExpiresAt.UnixMilli() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func shortReq(id lease.Identity) lease.AcquireRequest {
	req := acquireReq(id)
	req.TTL = 100 * time.Millisecond
	return req
}

// While a lease is active its acquisition is replayed from its record: the
// first answer byte for byte, another digest conflicts; every way it ends
// writes the evidence out first, so the replay answers the same with the
// state now.
func TestEmbeddedEvidenceReplays(t *testing.T) {
	endings := []struct {
		name  string
		short bool
		want  lease.State
		end   func(t *testing.T, s *Store, res lease.Result)
	}{
		{"release", false, lease.StateReleased, func(t *testing.T, s *Store, res lease.Result) {
			if _, err := s.Release(bg, releaseReq(res.Lease)); err != nil {
				t.Fatal(err)
			}
		}},
		{"revoke", false, lease.StateRevoked, func(t *testing.T, s *Store, res lease.Result) {
			if _, err := s.Revoke(bg, adminReq(res.Lease)); err != nil {
				t.Fatal(err)
			}
		}},
		{"force_release", false, lease.StateReleased, func(t *testing.T, s *Store, res lease.Result) {
			if _, err := s.ForceRelease(bg, adminReq(res.Lease)); err != nil {
				t.Fatal(err)
			}
		}},
		{"reaper", true, lease.StateExpired, func(t *testing.T, s *Store, res lease.Result) {
			waitExpired(t, s, res.Lease)
			if err := s.reap(bg); err != nil {
				t.Fatal(err)
			}
			if n, _ := s.ActiveLeases(bg); n != 0 {
				t.Fatalf("%d expiry entries left", n)
			}
		}},
		{"acquire_over_expired", true, lease.StateExpired, func(t *testing.T, s *Store, res lease.Result) {
			waitExpired(t, s, res.Lease)
			next := acquire4(t, s, acquireReq(res.Lease.Identity()))
			if next.Lease.FencingToken != res.Lease.FencingToken+1 {
				t.Fatalf("successor token %d", next.Lease.FencingToken)
			}
		}},
		{"renew_lost_expired", true, lease.StateExpired, func(t *testing.T, s *Store, res lease.Result) {
			waitExpired(t, s, res.Lease)
			_, err := s.Renew(bg, renewReq(res.Lease))
			mustCode(t, err, lease.CodeLost)
		}},
		{"commit_lost_expired", true, lease.StateExpired, func(t *testing.T, s *Store, res lease.Result) {
			waitExpired(t, s, res.Lease)
			_, err := s.AuthorizeCommit(bg, commitReq(res.Lease))
			mustCode(t, err, lease.CodeLost)
		}},
	}
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			s := open4(t, Options{})
			req := acquireReq(newIdentity())
			if e.short {
				req = shortReq(req.Identity)
			}
			first := acquire4(t, s, req)
			if !e.short {
				mustReplay(t, s, req, first, "")
				// A renewal changing the ttl keeps the acquisition's.
				rr := renewReq(first.Lease)
				rr.TTL = 45 * time.Second
				if _, err := s.Renew(bg, rr); err != nil {
					t.Fatal(err)
				}
				// Still active: no current state differs from the answer's.
				mustReplay(t, s, req, first, "")
			}
			e.end(t, s, first)
			mustWrittenOut(t, s, req, first)
			mustReplay(t, s, req, first, e.want)
		})
	}
}

// A lease acquired in format 3 (its evidence in its own key) and ended
// after the switch to format 4 replays as before; a format 4 record renewed
// by an instance that has not yet seen the switch stays version 3.
func TestEmbeddedEvidenceAcrossTheSwitch(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), CompactRecords: true}
	a, b := open(t, r, o), open(t, r, o)
	req := acquireReq(newIdentity())
	old, err := a.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, a, a.keys.active(tagOf(old.Lease.LockKey))); !strings.HasPrefix(v, lease.RecordV2Prefix) {
		t.Fatalf("format 3 record: %.10q", v)
	}
	if _, ok := get(t, a, evidenceKey(t, a, req)); !ok {
		t.Fatal("format 3 wrote no evidence key")
	}
	if err := a.EnableEmbeddedEvidence(bg); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, a, a.keys.format()); v != embeddedEvidence {
		t.Fatalf("switch %q", v)
	}
	mustReplay(t, a, req, old, "")
	if _, err := a.Release(bg, releaseReq(old.Lease)); err != nil {
		t.Fatal(err)
	}
	mustReplay(t, a, req, old, lease.StateReleased)

	// b has not seen the switch: a version 3 record it renews keeps its
	// evidence.
	req4 := acquireReq(newIdentity())
	first := acquire4(t, a, req4)
	if b.writes(embeddedEvidence) {
		t.Fatal("b saw the switch already")
	}
	if _, err := b.Renew(bg, renewReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, b, b.keys.active(tagOf(first.Lease.LockKey))); !strings.HasPrefix(v, lease.RecordV3Prefix) {
		t.Fatalf("renewed by a format 3 writer: %.10q", v)
	}
	mustReplay(t, b, req4, first, "")
	if _, err := b.Release(bg, releaseReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	mustWrittenOut(t, b, req4, first)
	mustReplay(t, b, req4, first, lease.StateReleased)
}

// A backup of a format 4 namespace restores its version 3 records, and the
// recovery that ends them writes their evidence out: the replay answers
// the original result, ended.
func TestEmbeddedEvidenceAfterRestore(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{StoreOptions: leasetest.StoreOptions(), EmbeddedEvidence: true})
	req := acquireReq(newIdentity())
	first := acquire4(t, src, req)
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
	if len(st.Active) != 1 || encoded(t, st.Active[0]) != encoded(t, first.Lease) {
		t.Fatalf("restored active records: %+v", st.Active)
	}
	if res, err := c.Finish(bg, lease.RecoveryPlan{Reason: "restored"}); err != nil || len(res.Revoked) != 1 {
		t.Fatalf("finish: %+v %v", res, err)
	}
	dst.loadFormat(bg)
	if !dst.writes(embeddedEvidence) {
		t.Fatal("the restored namespace is not in format 4")
	}
	mustWrittenOut(t, dst, req, first)
	mustReplay(t, dst, req, first, lease.StateRevoked)
}

// With no reaper running, a format 4 record is kept as long as the
// evidence it carries: PXAT max(expires_at + grace, acquired_at +
// retention).
func TestEmbeddedEvidenceOutlivesNoReaper(t *testing.T) {
	s := open4(t, Options{})
	res := acquire4(t, s, acquireReq(newIdentity()))
	key := s.keys.active(tagOf(res.Lease.LockKey))
	want := max(res.Lease.ExpiresAt.UnixMilli()+s.reclaimGrace.Milliseconds(),
		res.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds())
	if at := pexpireTime(t, s, key); at != want {
		t.Fatalf("active PXAT %d, want %d", at, want)
	}
	rn, err := s.Renew(bg, renewReq(res.Lease))
	if err != nil {
		t.Fatal(err)
	}
	if at := pexpireTime(t, s, key); at != want || rn.Lease.AcquiredAt != res.Lease.AcquiredAt {
		t.Fatalf("active PXAT after a renewal %d, want %d", at, want)
	}
}

// A version 3 record's expiry entry is tag ‖ 0 ‖ lease id ‖ 0 ‖ token, as
// every record version's (the contract: all cleanup is conditional on
// lease_id and fencing_token): a late expiry naming an old lease id or
// token, or no lease id, never ends the successor, even once it has
// expired; its ending removes its one entry.
func TestExpiryEntryNamesLeaseAndToken(t *testing.T) {
	s := open4(t, Options{})
	old := acquire4(t, s, shortReq(newIdentity()))
	tag := tagOf(old.Lease.LockKey)
	key := s.keys.active(tag)
	waitExpired(t, s, old.Lease)
	next := acquire4(t, s, shortReq(old.Lease.Identity()))
	zset := func() []string {
		t.Helper()
		m, err := s.client.Do(bg, s.client.B().Zrange().Key(s.keys.expiry()).Min("0").Max("-1").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	entry := tag + "\x00" + next.Lease.LeaseID + "\x00" + utoa(next.Lease.FencingToken)
	if got := zset(); !reflect.DeepEqual(got, []string{entry}) {
		t.Fatalf("expiry schedule %q, want only %q", got, entry)
	}
	waitExpired(t, s, next.Lease)
	stored := mustGet(t, s, key)
	for _, late := range []struct {
		id    string
		token uint64
	}{
		{old.Lease.LeaseID, old.Lease.FencingToken},
		{old.Lease.LeaseID, next.Lease.FencingToken},
		{next.Lease.LeaseID, old.Lease.FencingToken},
		{"", next.Lease.FencingToken},
		{"", old.Lease.FencingToken},
	} {
		if err := s.expireIfCurrent(bg, old.Lease.LockKey, late.id, late.token); err != nil {
			t.Fatal(err)
		}
		if v, _ := get(t, s, key); v != stored {
			t.Fatalf("a late expiry of lease id %q, token %d ended the successor: %.40q", late.id, late.token, v)
		}
	}
	if got := zset(); !reflect.DeepEqual(got, []string{entry}) {
		t.Fatalf("expiry schedule after the late expiries %q", got)
	}
	// Its own entry ends it, and the entry goes with it.
	if err := s.expireIfCurrent(bg, next.Lease.LockKey, next.Lease.LeaseID, next.Lease.FencingToken); err != nil {
		t.Fatal(err)
	}
	if v, ok := get(t, s, key); ok {
		t.Fatalf("the successor's own expiry left its record: %.40q", v)
	}
	if got := zset(); len(got) != 0 {
		t.Fatalf("expiry schedule after the end: %q", got)
	}
	last := acquire4(t, s, acquireReq(old.Lease.Identity()))
	if _, err := s.Release(bg, releaseReq(last.Lease)); err != nil {
		t.Fatal(err)
	}
	if got := zset(); len(got) != 0 {
		t.Fatalf("expiry schedule after a release: %q", got)
	}
}

// The reaper reads tag ‖ 0 ‖ lease id ‖ 0 ‖ token and nothing else (no
// entry without the lease id).
func TestExpiryEntryForms(t *testing.T) {
	tag := strings.Repeat("A", 43)
	for m, want := range map[string]bool{
		tag + "\x00lease_1\x007": true, tag + "\x007": false, tag + "\x00\x007": false,
		tag + "\x00lease_1\x00": false, tag + "\x00lease_1\x0007": false, tag + "\x00x": false, "short\x00lease_1\x007": false,
		tag + "\x00lease..1\x007": false, tag + "\x00a\x00b\x007": false, tag: false,
	} {
		gotTag, id, token, ok := expiryEntry(m)
		if ok != want || ok && (gotTag != tag || token != 7 || id != "lease_1") {
			t.Errorf("%q: %q %q %d %v, want ok %v", m, gotTag, id, token, ok, want)
		}
	}
}

// The gate: a namespace below format 4 is never written in it (version 2
// records and an evidence key), the switch only rises, and a build that
// knows only format 3 (its library without level 4 and version 3 records,
// simulated) refuses a format 4 namespace's switch and answers its records
// as corrupt.
func TestEmbeddedEvidenceGate(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), CompactRecords: true}
	s3 := open(t, r, o)
	req := acquireReq(newIdentity())
	res, err := s3.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, s3, s3.keys.active(tagOf(res.Lease.LockKey))); !strings.HasPrefix(v, lease.RecordV2Prefix) {
		t.Fatalf("a format 3 namespace's record: %.10q", v)
	}
	if _, ok := get(t, s3, evidenceKey(t, s3, req)); !ok {
		t.Fatal("a format 3 namespace's acquisition wrote no evidence key")
	}
	o.CompactRecords, o.EmbeddedEvidence = false, true
	s4 := open(t, r, o)
	res4 := acquire4(t, s4, acquireReq(newIdentity()))
	if err := s4.EnableCompactRecords(bg); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, s4, s4.keys.format()); v != embeddedEvidence || !s4.writes(embeddedEvidence) {
		t.Fatalf("the switch went down to %q", v)
	}

	// A format 3 build: its library as this one's without level 4 and
	// without version 3 records.
	old := olderBuild(t, r, o.KeyPrefix, ", ['4'] = 4", "  if head == 'rv3\\n' then return decode_rv3(raw, lock_key, a, o) end\n")
	err = old.raiseFormat(bg, compactRecords)
	mustCode(t, err, lease.CodeCorrupt)
	if v, _ := get(t, old, old.keys.format()); v != embeddedEvidence {
		t.Fatalf("an older build changed the switch to %q", v)
	}
	_, err = old.Inspect(bg, lease.InspectRequest{Identity: res4.Lease.Identity(), DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	_, err = old.Renew(bg, renewReq(res4.Lease))
	mustCode(t, err, lease.CodeCorrupt)
	if _, err := lease.DecodeStoredRecord([]byte(mustGet(t, s4, s4.keys.active(tagOf(res4.Lease.LockKey))))); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("a format 3 Go reader on version 3: %v", err)
	}
	// This build refuses a later format the same way.
	if err := s4.client.Do(bg, s4.client.B().Set().Key(s4.keys.format()).Value("9").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, s4.EnableEmbeddedEvidence(bg), lease.CodeCorrupt)
}

// olderBuild opens a store under prefix whose library is this one's
// without cuts (each must be there): a build from before what they add.
func olderBuild(t *testing.T, r *testenv.Redis, prefix string, cuts ...string) *Store {
	t.Helper()
	src := librarySource
	for _, cut := range cuts {
		if !strings.Contains(src, cut) {
			t.Fatalf("the library has no %q to cut", cut)
		}
		src = strings.Replace(src, cut, "", 1)
	}
	old := open(t, r, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions()})
	old.lib = newLibrary("", src)
	if err := old.lib.load(bg, old.client); err != nil {
		t.Fatal(err)
	}
	return old
}

func mustGet(t *testing.T, s *Store, key string) string {
	t.Helper()
	v, ok := get(t, s, key)
	if !ok {
		t.Fatalf("no key %q", key)
	}
	return v
}

// Damaged version 3 records fail closed, for the replay and the lookup
// too: never answered from a guess.
func TestEmbeddedEvidenceCorrupt(t *testing.T) {
	s := open4(t, Options{})
	req := acquireReq(newIdentity())
	res := acquire4(t, s, req)
	key := s.keys.active(tagOf(res.Lease.LockKey))
	good := mustGet(t, s, key)
	for name, bad := range map[string]string{
		"scope":     good[:69] + "+" + good[70:],
		"truncated": good[:100],
		"digest":    "rv3\n" + strings.ToUpper(good[4:68]) + good[68:],
		// R2: damage to the head (lookup read the scope at fixed
		// positions of records headed rv3\n only, and answered these
		// not-found).
		"v2_head_v3body": "rv2\n" + good[4:],
		"crlf":           strings.Replace(good, "\n", "\r\n", 1),
		"v3_head_v2body": "rv3\n" + good[114:],
		"not_a_record":   "x",
	} {
		t.Log(name)
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(bad).Px(time.Hour).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far()})
		mustCode(t, err, lease.CodeCorrupt)
		_, err = s.Acquire(bg, req)
		mustCode(t, err, lease.CodeCorrupt)
		_, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
			RequestID: req.RequestID, DeadlineAt: far()})
		mustCode(t, err, lease.CodeCorrupt)
	}
	// Another identity's record (well formed) in this key: corrupt too.
	other := acquire4(t, s, acquireReq(newIdentity()))
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(mustGet(t, s, s.keys.active(tagOf(other.Lease.LockKey)))).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
		RequestID: req.RequestID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	// The intact record answers its own acquisition, and not-found for
	// another request id, or for another principal's same request id.
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(good).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
		RequestID: req.RequestID, DeadlineAt: far()})
	if err != nil || encoded(t, lr.Lease) != encoded(t, res.Lease) {
		t.Fatalf("lookup of the intact record's acquisition: %+v %v", lr.Lease, err)
	}
	for _, l := range []lease.LookupRequest{
		{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID, RequestID: "req_other_1", DeadlineAt: far()},
		{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: "prn_other", RequestID: req.RequestID, DeadlineAt: far()},
	} {
		_, err = s.LookupRequest(bg, l)
		mustCode(t, err, lease.CodeNotFound)
	}
}

// R1: an instance of this build whose in-memory format is still version 1
// (it opened before the namespace went straight to 4 and has not reloaded
// the switch) renews a format 4 lease. The record stays in version 3, and
// the renewal's evidence is version 1 JSON holding the record's version 1
// JSON (not the version 3 bytes): the renewal's retry and its lookup
// answer the first renewal, on that instance and on a format 4 one.
func TestEmbeddedEvidenceRenewByVersion1Writer(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions()}
	v1 := open(t, r, o) // no switch yet: writes version 1
	o.EmbeddedEvidence = true
	s4 := open(t, r, o) // switches the namespace 1 -> 4
	if v1.writeFormat() != "v1" || s4.writeFormat() != "embedded_evidence" {
		t.Fatalf("formats %q %q", v1.writeFormat(), s4.writeFormat())
	}
	req := acquireReq(newIdentity())
	first := acquire4(t, s4, req)
	rr := renewReq(first.Lease)
	got, err := v1.Renew(bg, rr)
	if err != nil {
		t.Fatalf("renew by the version 1 writer: %v", err)
	}
	tag := tagOf(first.Lease.LockKey)
	if raw := mustGet(t, s4, s4.keys.active(tag)); !strings.HasPrefix(raw, lease.RecordV3Prefix) {
		t.Fatalf("the renewed record left version 3: %.20q", raw)
	}
	ev := mustGet(t, v1, v1.keys.idem(tag, lease.IdempotencyScope(lease.OpRenew, first.Lease.LockKey, rr.Caller.PrincipalID, rr.RequestID)))
	if e, err := lease.DecodeIdempotencyRecord([]byte(ev)); err != nil || e.Lease == nil || encoded(t, e.Lease) != encoded(t, got.Lease) {
		t.Fatalf("the renewal's evidence does not decode to its lease: %v\n%.160q", err, ev)
	}
	for name, s := range map[string]*Store{"version 1 writer": v1, "format 4 writer": s4} {
		again, err := s.Renew(bg, rr)
		if err != nil || !again.Replayed || encoded(t, again.Lease) != encoded(t, got.Lease) {
			t.Errorf("%s: renew retry answered %+v, %v; want the first renewal replayed", name, again.Lease, err)
		}
		lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRenew, Identity: rr.Identity, PrincipalID: rr.Caller.PrincipalID,
			RequestID: rr.RequestID, DeadlineAt: far()})
		if err != nil || lr.Lease == nil || encoded(t, lr.Lease) != encoded(t, got.Lease) {
			t.Errorf("%s: lookup of the renewal: %+v, %v", name, lr.Lease, err)
		}
	}
	// The acquisition is still answered from the record.
	if again, err := v1.Acquire(bg, req); err != nil || !again.Replayed || encoded(t, again.Lease) != encoded(t, first.Lease) {
		t.Fatalf("acquire replay after the renewal: %+v %v", again.Lease, err)
	}
}

// libraryFormat3 is main's library.lua verbatim: an older build, which
// knows formats up to 3.
//
//go:embed testdata/library_format3.lua
var libraryFormat3 string

// The README's format 4 paragraph, as behaviour: an older build answers a
// version 3 record's identity as corrupt (and quarantines it) but the
// lookup of its acquisition as not found; the rollback needs the flag
// removed (an instance with it raises the switch back to 4 at its reaper
// pass), the switch set to 3 and every instance restarted (one that loaded
// 4 keeps writing version 3 until it reloads the switch); a renewal keeps a
// version 3 record; an expired version 3 record is still there until it is
// archived, which writes its evidence out, after which the older build
// replays the acquisition. The paragraph says each of these.
func TestEmbeddedEvidenceRollback(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), EmbeddedEvidence: true}
	s4 := open(t, r, o)
	req := shortReq(newIdentity())
	first := acquire4(t, s4, req)
	tag := tagOf(first.Lease.LockKey)
	lookup := lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
		RequestID: req.RequestID, DeadlineAt: far()}
	setSwitch := func(v string) {
		t.Helper()
		if err := s4.client.Do(bg, s4.client.B().Set().Key(s4.keys.format()).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	head := func(s *Store, res lease.Result) string {
		t.Helper()
		v, _ := get(t, s, s.keys.active(tagOf(res.Lease.LockKey)))
		return v[:min(len(v), 4)]
	}

	// An older build on the format 4 namespace.
	old := open(t, r, Options{KeyPrefix: o.KeyPrefix, StoreOptions: leasetest.StoreOptions()})
	old.lib = newLibrary("", libraryFormat3)
	if err := old.lib.load(bg, old.client); err != nil {
		t.Fatal(err)
	}
	_, err := old.Acquire(bg, req)
	mustCode(t, err, lease.CodeCorrupt)
	if _, ok := get(t, old, old.keys.quarantine(tag)); !ok {
		t.Fatal("the older build did not quarantine the identity")
	}
	_, err = old.LookupRequest(bg, lookup)
	mustCode(t, err, lease.CodeNotFound)

	// The switch set back to 3, no restart: the instance that loaded 4
	// still writes version 3, and its flag raises the switch again.
	setSwitch(compactRecords)
	held := acquire4(t, s4, acquireReq(newIdentity()))
	if err := s4.reap(bg); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, s4, s4.keys.format()); v != embeddedEvidence {
		t.Fatalf("the flagged instance's reaper pass left the switch at %q", v)
	}
	// Flag removed, switch at 3, restarted: version 2 and evidence keys.
	setSwitch(compactRecords)
	s3 := open(t, r, Options{KeyPrefix: o.KeyPrefix, StoreOptions: leasetest.StoreOptions()})
	if s3.writeFormat() != "compact_records" {
		t.Fatalf("the restarted instance writes %q", s3.writeFormat())
	}
	req3 := acquireReq(newIdentity())
	res3, err := s3.Acquire(bg, req3)
	if err != nil || head(s3, res3) != lease.RecordV2Prefix {
		t.Fatalf("the restarted instance's record: %q %v", head(s3, res3), err)
	}
	if _, ok := get(t, s3, evidenceKey(t, s3, req3)); !ok {
		t.Fatal("the restarted instance wrote no evidence key")
	}
	// A renewal keeps a version 3 record in version 3.
	rn, err := s3.Renew(bg, renewReq(held.Lease))
	if err != nil || head(s3, rn) != lease.RecordV3Prefix {
		t.Fatalf("renewed version 3 record: %q %v", head(s3, rn), err)
	}
	// Expired is not enough: the version 3 record stays until archived.
	waitExpired(t, s3, first.Lease)
	if head(s3, first) != lease.RecordV3Prefix {
		t.Fatalf("the expired lease's record: %q", head(s3, first))
	}
	if err := s3.reap(bg); err != nil {
		t.Fatal(err)
	}
	if v, ok := get(t, s3, s3.keys.active(tag)); ok {
		t.Fatalf("the reaper left the expired record: %.10q", v)
	}
	if v := mustGet(t, s3, evidenceKey(t, s3, req)); !strings.HasPrefix(v, "ev2\n") {
		t.Fatalf("the archived lease's evidence: %.10q", v)
	}
	got, err := old.Acquire(bg, req)
	if err != nil || !got.Replayed || encoded(t, got.Lease) != encoded(t, first.Lease) {
		t.Fatalf("the older build's replay once archived: %+v %v", got.Lease, err)
	}
	if _, err := old.LookupRequest(bg, lookup); err != nil {
		t.Fatalf("the older build's lookup once archived: %v", err)
	}

	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	for _, says := range []string{
		"quarantines the identity",
		"as not found (`lease_not_found`",
		"remove `--valkey-embedded-evidence` from every instance (one that still has it raises the switch back to 4",
		"`SET <prefix>:format 3`; restart every instance",
		"one that loaded 4 keeps writing version 3 records, and one that runs no reaper never reloads it",
		"must be archived, not just expired",
		"acquired_at plus the idempotency retention",
		"A renewal keeps a version 3 record in version 3",
	} {
		if !strings.Contains(readme, says) {
			t.Errorf("the README does not say %q", says)
		}
	}
}
