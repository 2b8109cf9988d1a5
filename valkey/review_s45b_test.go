package valkey

import (
	mrand "math/rand"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// Second review of stored format 6 (session 45), of f5acb27, whose
// version 4 records kept only 8 characters of their hash tag: a tenant
// that names its own targets finds two identities whose tags share them
// (a birthday search over about 2^24 target ids), and a record copied
// between those was read as the other's where the library compares no
// tuple. Version 4 keeps the whole tag since. Each test runs on format 5
// too.

// collidingPair are two identities of one tenant whose hash tags share
// their first 8 characters (what f5acb27 kept of the tag): rReVrQVl-nD2... and
// rReVrQVlXVoT.... Found by a birthday search over 2^25 target ids
// (about 10 s on one core): the key check is 48 bits, so a tenant who
// names its own targets meets a collision after about 2^24 of them.
func collidingPair() (lease.Identity, lease.Identity) {
	id := func(target string) lease.Identity {
		return lease.Identity{TenantID: "tenant-rv4coll", ProgramID: "program-rv4coll", TargetNamespace: "starintel-target",
			TargetID: target, ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
	}
	return id("target_1345695"), id("target_19541255")
}

func review45bCollidingLeases(t *testing.T, o Options, ttlA time.Duration) (*Store, *lease.Record, *lease.Record) {
	t.Helper()
	ia, ib := collidingPair()
	ka, kb := lockKey(t, ia), lockKey(t, ib)
	if ka == kb || tagOf(ka)[:8] != tagOf(kb)[:8] {
		t.Fatalf("not a colliding pair: %s %s", ka, kb)
	}
	reqA := acquireReq(ia)
	reqA.TTL = ttlA
	return review45Leases(t, o, reqA, acquireReq(ib))
}

// F1: review 45's poisoning, with two identities whose tags share the
// key check: a copy of A's version 4 record under B's key is decoded by
// inspect-by-id of B (no tuple), remembered with B's lock key, and A's own
// intact record then reads as "stored under a foreign lock key".
func TestReview45bKeyCheckCollisionPoisonsMemo(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, a, b := review45bCollidingLeases(t, o, 30*time.Second)
			misplace(t, s, a, b)
			flushMemo(t, s)
			res, err := s.Inspect(bg, lease.InspectRequest{LeaseID: b.LeaseID, DeadlineAt: far()})
			if lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("inspect by id of B over A's copied record: %v %v, want lease_corrupt", res.Code, err)
			}
			if _, err := s.Renew(bg, renewReq(a)); err != nil {
				t.Errorf("renewal of A, whose own record is intact: %v", err)
			}
		})
	}
}

// F1b: the reaper's entry for B over the copy of A's record (expired):
// it must find B's key corrupt, not archive A's lease into B's history and
// drop B's schedule entry.
func TestReview45bKeyCheckCollisionReaper(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, a, b := review45bCollidingLeases(t, o, time.Second)
			mustNotReapMisplaced(t, s, a, b)
		})
	}
}

// F1c: the lookup of B's acquisition over the copy of A's record (memo
// empty) must fail closed, not answer "no such request".
func TestReview45bKeyCheckCollisionLookup(t *testing.T) {
	for name, o := range map[string]Options{"format5": {ReferringEvidence: true}, "format6": {LeanRecords: true}} {
		t.Run(name, func(t *testing.T) {
			s, a, b := review45bCollidingLeases(t, o, 30*time.Second)
			misplace(t, s, a, b)
			flushMemo(t, s)
			res, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: b.Identity(), PrincipalID: b.OwnerPrincipalID,
				RequestID: b.RequestID, DeadlineAt: far()})
			if lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("lookup of B's acquisition over A's copied record: %+v %v, want lease_corrupt", res.Code, err)
			}
		})
	}
}

// Random single-byte damage (replace, insert, delete) anywhere before the
// metadata of version 4 records, with lease ids of edge ULID times: the
// library and Go (DecodeEmbeddingRecordAt) agree on every one.
func TestReview45bLeanAgreementFuzz(t *testing.T) {
	s := open6(t, Options{})
	withTestFunctions(t, s, decodeCheck, "starlease_decode_check45b", "sldc45b_")
	rng := mrand.New(mrand.NewSource(45))
	const pool = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_+. \n\r\x00"
	for range 4 {
		for _, meta := range []lease.Metadata{nil, {"a": "b"}} {
			req := acquireReq(newIdentity())
			req.Metadata = meta
			a, err := s.Acquire(bg, req)
			if err != nil {
				t.Fatal(err)
			}
			rn := renewReq(a.Lease)
			rn.TTL = 7 * time.Second
			if _, err := s.Renew(bg, rn); err != nil {
				t.Fatal(err)
			}
			raw := mustGet(t, s, s.keys.active(tagOf(a.Lease.LockKey)))
			metaAt := strings.LastIndexByte(raw, '\n') + 1
			for i := 0; i < 600; i++ {
				pos := rng.Intn(metaAt)
				c := pool[rng.Intn(len(pool))]
				var bad string
				switch rng.Intn(3) {
				case 0:
					bad = raw[:pos] + string(c) + raw[pos+1:]
				case 1:
					bad = raw[:pos] + string(c) + raw[pos:]
				default:
					bad = raw[:pos] + raw[pos+1:]
				}
				if bad == raw {
					continue
				}
				v := libraryVerdict(t, s, a.Lease, bad)
				rec, _, gerr := lease.DecodeEmbeddingRecordAt([]byte(bad), a.Lease.LockKey)
				goOK := gerr == nil && rec.LockKey == a.Lease.LockKey
				if (v == "ok") != goOK {
					t.Errorf("library %q, Go %v on\n%q", v, gerr, bad)
				}
			}
		}
	}
}
