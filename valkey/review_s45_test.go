package valkey

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Review of stored format 6 (session 45), by a helper that did not write
// it: misplaced version 4 records on every path, the library and Go in
// agreement on spellings, mixed instances. Each test runs on format 5 too.

// flushMemo reloads the library (as a server restart, or REC_OF's bound
// of 256 entries, does): the Lua memo of decoded records is empty after.
func flushMemo(t *testing.T, s *Store) {
	t.Helper()
	if err := s.client.Do(bg, s.client.B().FunctionLoad().Replace().FunctionCode(s.lib.code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// misplace copies the current active record of src under dst's active key.
func misplace(t *testing.T, s *Store, src, dst *lease.Record) string {
	t.Helper()
	raw := mustGet(t, s, s.keys.active(tagOf(src.LockKey)))
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.active(tagOf(dst.LockKey))).Value(raw).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	return raw
}

func review45Pair(t *testing.T, o Options) (*Store, *lease.Record, *lease.Record) {
	t.Helper()
	return review45Leases(t, o, acquireReq(newIdentity()), acquireReq(newIdentity()))
}

// review45Leases opens a store with o in a namespace of its own and
// acquires reqA and reqB.
func review45Leases(t *testing.T, o Options, reqA, reqB lease.AcquireRequest) (*Store, *lease.Record, *lease.Record) {
	t.Helper()
	o.StoreOptions = leasetest.StoreOptions()
	o.KeyPrefix = randomPrefix()
	s := open(t, sharedServer(t), o)
	a, err := s.Acquire(bg, reqA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(bg, reqB)
	if err != nil {
		t.Fatal(err)
	}
	return s, a.Lease, b.Lease
}

// mustNotReapMisplaced copies a's record (its ttl 1 s) under b's key, lets
// it expire, and runs the reaper's expiry of a's lease under b's lock key:
// it must leave b's key and history as they are.
func mustNotReapMisplaced(t *testing.T, s *Store, a, b *lease.Record) {
	t.Helper()
	raw := misplace(t, s, a, b)
	flushMemo(t, s)
	time.Sleep(1200 * time.Millisecond)
	histB := s.keys.history(tagOf(b.LockKey))
	before, _ := s.client.Do(bg, s.client.B().Llen().Key(histB).Build()).AsInt64()
	if err := s.expireIfCurrent(bg, b.LockKey, a.LeaseID, a.FencingToken); err != nil {
		t.Fatal(err)
	}
	after, _ := s.client.Do(bg, s.client.B().Llen().Key(histB).Build()).AsInt64()
	got, ok := get(t, s, s.keys.active(tagOf(b.LockKey)))
	if !ok || got != raw || after != before {
		t.Fatalf("the reaper acted on A's record under B's key: active present=%v, B's history %d -> %d entries", ok, before, after)
	}
}

// Inspect by lease id of B, whose active key holds a copy of A's record,
// must fail closed (format 5 does: lease_corrupt).
func TestReview45InspectByIDMisplaced(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, a, b := review45Pair(t, o)
			misplace(t, s, a, b)
			flushMemo(t, s)
			res, err := s.Inspect(bg, lease.InspectRequest{LeaseID: b.LeaseID, DeadlineAt: far()})
			if lease.CodeOf(err) != lease.CodeCorrupt {
				t.Fatalf("inspect by id of the identity holding a misplaced record: %+v %v, want lease_corrupt", res.Code, err)
			}
		})
	}
}

// A misplaced copy read without a tuple (inspect by id here; the reaper
// alike) poisons the library's memo: A's own, untouched record then
// reads as "stored under a foreign lock key" and its holder cannot renew.
func TestReview45MisplacedCopyPoisonsGenuineLease(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, a, b := review45Pair(t, o)
			misplace(t, s, a, b)
			flushMemo(t, s)
			_, _ = s.Inspect(bg, lease.InspectRequest{LeaseID: b.LeaseID, DeadlineAt: far()})
			if _, err := s.Renew(bg, renewReq(a)); err != nil {
				t.Errorf("after inspect by id: renewal of A, whose own record is intact: %v", err)
			}
			// The same through the reaper's read of B's own schedule entry.
			misplace(t, s, a, b)
			flushMemo(t, s)
			_, _ = s.expireOne(bg, b.LockKey, b.LeaseID, b.FencingToken)
			if _, err := s.Renew(bg, renewReq(a)); err != nil {
				t.Errorf("after a reaper pass: renewal of A, whose own record is intact: %v", err)
			}
		})
	}
}

// The reaper (expire reads with the lock key only) must not act on a
// misplaced record: a schedule entry under B's tag naming A's lease must
// find B's key corrupt, not archive A's record into B's history.
func TestReview45ReaperActsOnMisplacedRecord(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			reqA := acquireReq(newIdentity())
			reqA.TTL = time.Second
			s, a, b := review45Leases(t, o, reqA, acquireReq(newIdentity()))
			mustNotReapMisplaced(t, s, a, b)
		})
	}
}

// Targeted version 4 spellings: the library's and Go's verdicts must agree,
// and neither may accept bytes other than the stored record's.
func TestReview45LeanAgreement(t *testing.T) {
	s := open6(t, Options{})
	withTestFunctions(t, s, decodeCheck, "starlease_decode_check45", "sldc45_")
	for _, meta := range []lease.Metadata{nil, {"a": "b"}} {
		req := acquireReq(newIdentity())
		req.Metadata = meta
		a, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		raw := mustGet(t, s, s.keys.active(tagOf(a.Lease.LockKey)))
		verdict := func(b string) string { return libraryVerdict(t, s, a.Lease, b) }
		lines := strings.Split(raw, "\n")
		with := func(i int, v string) string {
			c := append([]string(nil), lines...)
			c[i] = v
			return strings.Join(c, "\n")
		}
		cases := map[string]string{}
		add := func(i int, vs ...string) {
			for _, v := range vs {
				cases[fmt.Sprintf("line%d=%q", i, v)] = with(i, v)
			}
		}
		// Line 1 is the key check (the tag's first 8 characters).
		add(1, "", strings.Repeat("A", 8), lines[1][:7], lines[1]+"A", tagOf(a.Lease.LockKey), strings.ToLower(lines[1]), lines[1]+"\r")
		add(2, strings.Repeat("A", 43), strings.Repeat("A", 42)+"B", strings.Repeat("+", 43), strings.Repeat("/", 43), strings.Repeat("A", 44), strings.Repeat("A", 42))
		add(3, strings.Repeat("A", 43), strings.Repeat("+", 43), strings.Repeat(".", 43), strings.Repeat("=", 43), strings.Repeat("A", 42)+"\r")
		add(4, "0", "00", "1", "01", "86400000", "86400001", "30000", "9999999999999999", "10000000000000000", " 1", "1\r")
		add(12, "", ".x", "-x", "_x", "x", "lease_x", lines[12]+"..", strings.Repeat("a", 250), strings.Repeat("a", 251), "star_sk_x", "X")
		add(17, "0", "1", "9007199254740991", "9007199254740992", "9007199254740993", "10000000000000000", "01")
		add(18, "0", "1", "253402300799999", "253402300800000", "9999999999999999", "0"+lines[18], "-0", "-1", "+1", "--1", "-01",
			"-9999999999999999", "-10000000000000000", "1-")
		add(19, "0", "1", "29999", "30000", "300000", "9007199254740993", "9999999999999999", "00", "01")
		add(20, "0", "1", "29999", "30000", "30001", "300000", "300001", "9999999999999999", "00", "01")
		add(21, "1", "29999", "30001", "86400000", "86400001")
		add(22, "1", "29999", "30000", "604800000", "604800001")
		add(len(lines)-1, "", "{}", "{}\n", " {}", "{} ", "\n", "null", "{\"a\":\"b\"}\n", "{\"a\":\"b\"} ", "{\"a\":\"b\",\"a\":\"c\"}", "{\"a\":1e0}", "{\"a\":\"\\u0062\"}")
		// combined: renewed spelled and expires spelled at the derived ones.
		cases["renewed1_expires30001"] = strings.Join(append(append(append([]string(nil), lines[:19]...), "1", "30001"), lines[21:]...), "\n")
		cases["renewed1_expires30000"] = strings.Join(append(append(append([]string(nil), lines[:19]...), "1", "30000"), lines[21:]...), "\n")
		cases["renewed1_expiresEmpty"] = strings.Join(append(append(append([]string(nil), lines[:19]...), "1", ""), lines[21:]...), "\n")
		cases["trailing_nl"] = raw + "\n"
		cases["crlf"] = strings.ReplaceAll(raw, "\n", "\r\n")
		for name, bad := range cases {
			if bad == raw {
				continue
			}
			v := verdict(bad)
			rec, _, gerr := lease.DecodeEmbeddingRecordAt([]byte(bad), a.Lease.LockKey)
			goOK := gerr == nil && rec.LockKey == a.Lease.LockKey
			if v == "ok" && !goOK && (strings.HasPrefix(name, fmt.Sprintf("line%d=", len(lines)-1)) || name == "trailing_nl" && meta != nil) {
				continue // metadata left to Go, as in every record version (documented)
			}
			if (v == "ok") != goOK {
				t.Errorf("meta=%v %s: library %q, Go %v", meta != nil, name, v, gerr)
			} else if v == "ok" {
				t.Logf("meta=%v %s: both accept", meta != nil, name)
			}
		}
	}
}

// The reaper archiving a misplaced (expired) copy of A's older record
// under B's key removes A's List index members: A, live and intact under
// its own key, is no longer listed; B's identity is then acquirable.
func TestReview45ReaperMisplacedHidesLiveLease(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			o.StoreOptions = leasetest.StoreOptions()
			s := open(t, sharedServer(t), o)
			reqA := acquireReq(newIdentity())
			reqA.TTL = time.Second
			ra, err := s.Acquire(bg, reqA)
			if err != nil {
				t.Fatal(err)
			}
			rb, err := s.Acquire(bg, acquireReq(newIdentity()))
			if err != nil {
				t.Fatal(err)
			}
			a, b := ra.Lease, rb.Lease
			misplace(t, s, a, b) // A's record as acquired, expiring in 1 s
			time.Sleep(700 * time.Millisecond)
			rn := renewReq(a)
			rn.TTL = 30 * time.Second
			if _, err := s.Renew(bg, rn); err != nil { // A lives on under its own key
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			_ = s.expireIfCurrent(bg, b.LockKey, a.LeaseID, a.FencingToken)
			l, err := s.List(bg, lease.ListRequest{By: lease.ListByTarget, TenantID: a.TenantID, ProgramID: a.ProgramID,
				TargetNamespace: a.TargetNamespace, TargetID: a.TargetID, DeadlineAt: far(), Caller: owner})
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Leases) != 1 || l.Leases[0].LeaseID != a.LeaseID {
				t.Errorf("List of A's target after the reaper ran on B's key: %d leases, want A's live lease", len(l.Leases))
			}
			if _, err := s.Acquire(bg, acquireReq(b.Identity())); lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("acquire of B's identity over its misplaced record: %v, want lease_corrupt", err)
			}
		})
	}
}

// The reaper's own entry for B, whose key holds a copy of A's record,
// must find it corrupt (alert, entry kept), not drop the entry as stale.
func TestReview45ReaperDropsEntryOverMisplacedRecord(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, a, b := review45Pair(t, o)
			misplace(t, s, a, b)
			flushMemo(t, s)
			member := tagOf(b.LockKey) + "\x00" + b.LeaseID + "\x00" + strconv.FormatUint(b.FencingToken, 10)
			done, err := s.expireOne(bg, b.LockKey, b.LeaseID, b.FencingToken)
			if err != nil {
				t.Fatal(err)
			}
			sc := s.client.Do(bg, s.client.B().Zscore().Key(s.keys.expiry()).Member(member).Build())
			if _, err := sc.AsFloat64(); err != nil || done {
				t.Errorf("B's schedule entry over a misplaced record: done=%v, still scheduled: %v", done, err == nil)
			}
		})
	}
}

// Mixed instances: a version 1 writer (no switch seen) and a format 4
// writer renew (another ttl) and release a lease a format 6 instance
// acquired; every replay answers the first answer; another digest conflicts.
func TestReview45MixedWritersReplay(t *testing.T) {
	for name, oo := range map[string]Options{"v1writer": {}, "format4": {EmbeddedEvidence: true}, "format5": {ReferringEvidence: true}} {
		t.Run(name, func(t *testing.T) {
			r := sharedServer(t)
			o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions()}
			oo.KeyPrefix, oo.StoreOptions = o.KeyPrefix, o.StoreOptions
			b := open(t, r, oo)
			o.LeanRecords = true
			a := open(t, r, o)
			req := acquireReq(newIdentity())
			first, err := a.Acquire(bg, req)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			rn := renewReq(first.Lease)
			rn.TTL = 10 * time.Second
			renewed, err := b.Renew(bg, rn)
			if err != nil {
				t.Fatal(err)
			}
			mustReplay(t, a, req, first, "")
			mustReplay(t, b, req, first, "")
			other := req
			other.TTL = 20 * time.Second
			if _, err := a.Acquire(bg, other); lease.CodeOf(err) != lease.CodeIdempotencyConflict {
				t.Errorf("another digest after a renewal: %v", err)
			}
			rn2 := renewReq(renewed.Lease)
			if renewed, err = a.Renew(bg, rn2); err != nil {
				t.Fatal(err)
			}
			mustReplay(t, b, req, first, "")
			if _, err := b.Release(bg, releaseReq(renewed.Lease)); err != nil {
				t.Fatal(err)
			}
			mustReplay(t, a, req, first, lease.StateReleased)
			mustReplay(t, b, req, first, lease.StateReleased)
			if _, err := a.Acquire(bg, other); lease.CodeOf(err) != lease.CodeIdempotencyConflict {
				t.Errorf("another digest after the release: %v", err)
			}
		})
	}
}

// TestLeanRecordMisplaced's lookup, with the library's memo empty (a
// restart, or 256 other records since): the misplaced record must still
// fail closed, not answer "no such request".
func TestReview45LookupOverMisplacedRecordMemoEmpty(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, victim, other := review45Pair(t, o)
			misplace(t, s, other, victim)
			flushMemo(t, s)
			res, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: victim.Identity(), PrincipalID: victim.OwnerPrincipalID,
				RequestID: victim.RequestID, DeadlineAt: far()})
			if lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("lookup of the victim's acquisition over a misplaced record: %+v %v, want lease_corrupt", res, err)
			}
		})
	}
}

// A renewed (other ttl) lean record expired by the reaper: the replay
// answers the first answer, with the lease now expired.
func TestReview45ReapedLeanReplay(t *testing.T) {
	s := open6(t, Options{})
	req := acquireReq(newIdentity())
	req.TTL = time.Second
	first, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	rn := renewReq(first.Lease)
	rn.TTL = 1500 * time.Millisecond
	if _, err := s.Renew(bg, rn); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1700 * time.Millisecond)
	flushMemo(t, s)
	if err := s.reap(bg); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, s, s.keys.active(tagOf(first.Lease.LockKey))); ok {
		t.Fatal("not reaped")
	}
	mustReplay(t, s, req, first, lease.StateExpired)
	other := req
	other.TTL = 2 * time.Second
	if _, err := s.Acquire(bg, other); lease.CodeOf(err) != lease.CodeIdempotencyConflict {
		t.Errorf("another digest after the expiry: %v", err)
	}
}

// Mutations that carry the tuple refuse a misplaced record even with the
// memo empty (the other's lease id and token, the victim's identity).
func TestReview45TupleMutationsOverMisplaced(t *testing.T) {
	s, victim, other := review45Pair(t, Options{LeanRecords: true})
	key := s.keys.active(tagOf(victim.LockKey))
	raw := misplace(t, s, other, victim)
	as := other.Clone()
	as.TenantID, as.ProgramID, as.TargetNamespace, as.TargetID = victim.TenantID, victim.ProgramID, victim.TargetNamespace, victim.TargetID
	as.ActorName, as.WorkflowName, as.OperationClass = victim.ActorName, victim.WorkflowName, victim.OperationClass
	ops := map[string]func() error{
		"renew":   func() error { _, err := s.Renew(bg, renewReq(as)); return err },
		"release": func() error { _, err := s.Release(bg, releaseReq(as)); return err },
		"revoke":  func() error { _, err := s.Revoke(bg, adminReq(as)); return err },
		"force":   func() error { _, err := s.ForceRelease(bg, adminReq(as)); return err },
		"commit":  func() error { _, err := s.AuthorizeCommit(bg, commitReq(as)); return err },
		"inspect": func() error {
			_, err := s.Inspect(bg, lease.InspectRequest{Identity: victim.Identity(), DeadlineAt: far()})
			return err
		},
	}
	for name, op := range ops {
		flushMemo(t, s)
		if err := op(); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Errorf("%s over a misplaced record: %v", name, err)
		}
		if got := mustGet(t, s, key); got != raw {
			t.Fatalf("%s changed the record", name)
		}
	}
}
