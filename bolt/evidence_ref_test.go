package bolt

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// refLife is one lease of an identity: acquired (request acq-<n>) and
// released (rel-<n>).
type refLife struct {
	req    lease.AcquireRequest
	acq    lease.Result
	relReq lease.ReleaseRequest
	rel    lease.Result
}

// refLives acquires and releases n leases of one identity (target), one
// after the other, a second apart, with request ids acq-<i> and rel-<i>
// for i from from on (two digits at least).
func refLives(t *testing.T, s *Store, c *clock, target string, from, n int, far time.Time) []refLife {
	t.Helper()
	ctx := context.Background()
	var out []refLife
	for i := from; i < from+n; i++ {
		req := acquireReq(fmt.Sprintf("acq-%02d", i), time.Minute, far)
		req.Identity.TargetID = target
		a, err := s.Acquire(ctx, req)
		if err != nil || a.Replayed {
			t.Fatalf("acquire %d: %v replayed=%v", i, err, a.Replayed)
		}
		c.Add(time.Second)
		r := a.Lease
		relReq := lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
			ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%02d", i), DeadlineAt: far,
				Caller: callerOfRecord(r)}}
		rel, err := s.Release(ctx, relReq)
		if err != nil || rel.Replayed {
			t.Fatalf("release %d: %v replayed=%v", i, err, rel.Replayed)
		}
		c.Add(time.Second)
		out = append(out, refLife{req, a, relReq, rel})
	}
	return out
}

// lookup is the lookup request of l's acquisition.
func (l refLife) lookup(far time.Time) lease.LookupRequest {
	return lease.LookupRequest{Op: lease.OpAcquire, Identity: l.req.Identity, PrincipalID: l.req.Caller.PrincipalID,
		RequestID: l.req.RequestID, DeadlineAt: far}
}

// releaseLookup is the lookup request of l's release.
func (l refLife) releaseLookup(far time.Time) lease.LookupRequest {
	return lease.LookupRequest{Op: lease.OpRelease, Identity: l.relReq.Identity, PrincipalID: l.relReq.Caller.PrincipalID,
		RequestID: l.relReq.RequestID, DeadlineAt: far}
}

// answersExactly checks that l's acquisition and, if it was released,
// its release replay and look up their original results exactly.
func (l refLife) answersExactly(t *testing.T, s *Store, far time.Time) {
	t.Helper()
	ctx := context.Background()
	a, err := s.Acquire(ctx, l.req)
	if err != nil || !a.Replayed || a.Code != l.acq.Code || encoded(t, a.Lease) != encoded(t, l.acq.Lease) || a.BackendTime != l.acq.BackendTime {
		t.Fatalf("replay of %s: %v %+v, want %+v", l.req.RequestID, err, a.Lease, l.acq.Lease)
	}
	got, err := s.LookupRequest(ctx, l.lookup(far))
	if err != nil || got.Code != l.acq.Code || encoded(t, got.Lease) != encoded(t, l.acq.Lease) || got.BackendTime != l.acq.BackendTime {
		t.Fatalf("lookup of %s: %v %+v, want %+v", l.req.RequestID, err, got.Lease, l.acq.Lease)
	}
	if l.rel.Lease == nil {
		return
	}
	r, err := s.Release(ctx, l.relReq)
	if err != nil || !r.Replayed || r.Code != l.rel.Code || encoded(t, r.Lease) != encoded(t, l.rel.Lease) || r.BackendTime != l.rel.BackendTime {
		t.Fatalf("replay of %s: %v %+v, want %+v", l.relReq.RequestID, err, r.Lease, l.rel.Lease)
	}
	got, err = s.LookupRequest(ctx, l.releaseLookup(far))
	if err != nil || got.Code != l.rel.Code || encoded(t, got.Lease) != encoded(t, l.rel.Lease) || got.BackendTime != l.rel.BackendTime {
		t.Fatalf("lookup of %s: %v %+v, want %+v", l.relReq.RequestID, err, got.Lease, l.rel.Lease)
	}
}

// storedVersion is the version prefix of l's stored acquisition evidence.
func (l refLife) storedVersion(t *testing.T, s *Store, far time.Time) string {
	t.Helper()
	return storedVersionOf(t, s, l.lookup(far))
}

// storedReleaseVersion is the version prefix of l's stored release
// evidence.
func (l refLife) storedReleaseVersion(t *testing.T, s *Store, far time.Time) string {
	t.Helper()
	return storedVersionOf(t, s, l.releaseLookup(far))
}

// storedVersionOf is the version prefix of lk's stored evidence.
func storedVersionOf(t *testing.T, s *Store, lk lease.LookupRequest) string {
	t.Helper()
	_, v, _ := evidenceOf(t, s, lk)
	switch {
	case bytes.HasPrefix(v, []byte(lease.EvidenceLeanPrefix)):
		return "ev4"
	case bytes.HasPrefix(v, []byte(lease.EvidenceRefPrefix)):
		return "ev3"
	case bytes.HasPrefix(v, []byte(lease.EvidenceV2Prefix)):
		return "ev2"
	case v == nil:
		return "none"
	}
	return "v1"
}

// forEachByRef runs test once for each form of evidence by reference a
// store may hold: version 3 (written by schema 10, still read) and
// version 4 (written now).
func forEachByRef(t *testing.T, test func(t *testing.T, byRef string)) {
	for _, byRef := range []string{"ev3", "ev4"} {
		t.Run(byRef, func(t *testing.T) { test(t, byRef) })
	}
}

// An acquisition's evidence refers to its record while the lease is
// active and, once it ended, to its history entry; when the identity's
// history cap drops that entry, the evidence is rewritten in version 2
// first. Every acquisition replays and looks up its original result
// exactly throughout.
// Both forms by reference are detached: version 3 (written by schema 10,
// still read) and version 4 (written now).
func TestAcquireEvidenceDetachedWhenItsHistoryIsTrimmed(t *testing.T) {
	for _, byRef := range []string{"ev3", "ev4"} {
		t.Run(byRef, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryPerIdentity = 2
			s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
			s.schema10Writes = byRef == "ev3"
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			lives := refLives(t, s, c, "trimmed", 0, 4, far)
			for i, want := range []string{"ev2", "ev2", byRef, byRef} {
				if got := lives[i].storedVersion(t, s, far); got != want {
					t.Fatalf("acquisition %d's evidence is %s, want %s (history keeps the last 2 leases)", i, got, want)
				}
				if got := lives[i].storedReleaseVersion(t, s, far); got != want {
					t.Fatalf("release %d's evidence is %s, want %s (history keeps the last 2 leases)", i, got, want)
				}
				lives[i].answersExactly(t, s, far)
			}
		})
	}
}

// History past its retention goes with the reaper while the evidence of
// its acquisition lasts: the evidence is rewritten first and still
// answers exactly.
func TestAcquireEvidenceDetachedWhenItsHistoryRetires(t *testing.T) {
	for _, byRef := range []string{"ev3", "ev4"} {
		t.Run(byRef, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryRetention = time.Hour
			s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
			s.schema10Writes = byRef == "ev3"
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := refLives(t, s, c, "retired", 0, 1, far)[0]
			if got, rel := l.storedVersion(t, s, far), l.storedReleaseVersion(t, s, far); got != byRef || rel != byRef {
				t.Fatalf("evidence before retention: acquisition %s, release %s; want %s", got, rel, byRef)
			}
			c.Add(2 * time.Hour)
			if err := s.reap(context.Background()); err != nil {
				t.Fatal(err)
			}
			if h, err := s.History(context.Background(), lease.HistoryRequest{Identity: l.req.Identity, DeadlineAt: far, Caller: l.req.Caller}); err != nil || len(h.Entries) != 0 {
				t.Fatalf("history past retention: %+v, %v; want none", h, err)
			}
			if got, rel := l.storedVersion(t, s, far), l.storedReleaseVersion(t, s, far); got != "ev2" || rel != "ev2" {
				t.Fatalf("evidence after its history retired: acquisition %s, release %s; want ev2", got, rel)
			}
			l.answersExactly(t, s, far)
		})
	}
}

// Version 3 evidence of identity A found under identity B's evidence key
// (same principal and request id) names a lease B has no record of: the
// replay and the lookup fail closed, B is quarantined, and A's lease is
// never answered as B's.
func TestVersion3EvidenceOfAnotherIdentityFailsClosed(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	s.schema10Writes = true // version 3, which files of schema 10 hold
	a := scopeAcquire(t, s, "tenant-a", "program-a", "target-a", "prn-x", "req-a")
	b := scopeAcquire(t, s, "tenant-b", "program-b", "target-b", "prn-x", "req-b")
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		ident := tx.Bucket(bucketIdent)
		v := ident.Get(idemKey(b.LockKey, lease.IdempotencyScope(lease.OpAcquire, b.LockKey, "prn-x", "req-b")))
		if !bytes.HasPrefix(v, []byte(lease.EvidenceRefPrefix)) {
			t.Fatalf("evidence of b is not version 3: %.20q", v)
		}
		return ident.Put(idemKey(a.LockKey, lease.IdempotencyScope(lease.OpAcquire, a.LockKey, "prn-x", "req-b")), bytes.Clone(v))
	}); err != nil {
		t.Fatal(err)
	}
	res, err := s.LookupRequest(ctx, lease.LookupRequest{Op: lease.OpAcquire, Identity: a.Identity(), PrincipalID: "prn-x",
		RequestID: "req-b", DeadlineAt: time.Now().Add(time.Minute)})
	if code(err) != lease.CodeCorrupt {
		t.Fatalf("lookup: %v %+v, want corrupt", err, res.Lease)
	}
	req := acquireReq("req-b", 30*time.Second, time.Now().Add(time.Hour))
	req.Identity = a.Identity()
	req.Caller = callerOfRecord(b)
	if r, err := s.Acquire(ctx, req); code(err) != lease.CodeCorrupt {
		t.Fatalf("replay: %v %+v, want corrupt", err, r.Lease)
	}
	if q := quarantineOf(t, s, a.LockKey); q == "" {
		t.Fatal("identity a not quarantined")
	}
}

// quarantineOf is the quarantine reason recorded for lockKey ("" none).
func quarantineOf(t *testing.T, s *Store, lockKey string) string {
	t.Helper()
	var q string
	if err := s.db.View(func(tx *bbolt.Tx) error { q = string(tx.Bucket(bucketQuarantine).Get([]byte(lockKey))); return nil }); err != nil {
		t.Fatal(err)
	}
	return q
}

// Version 3 evidence that cannot be rebuilt fails closed (corrupt, the
// identity quarantined, the evidence left as it was): lines that name
// another token or lease, a number spelled otherwise, a line missing or
// added, and evidence whose lease has no record left (its active record
// gone by damage).
func TestCorruptVersion3EvidenceFailsClosed(t *testing.T) {
	for name, edit := range map[string]func(lines []string) []string{
		"another token":              func(f []string) []string { f[6] = "2"; return f },
		"another lease":              func(f []string) []string { f[5] = "lease_01KZ8WPXG0ZR33TQ3M8DR5XHBQ"; return f },
		"expiry with a leading zero": func(f []string) []string { f[7] = "0" + f[7]; return f },
		"ttl not a number":           func(f []string) []string { f[8] = "6e4"; return f },
		"line missing":               func(f []string) []string { return f[:len(f)-1] },
		"line added":                 func(f []string) []string { return append(f, "x") },
		"digest of another request":  func(f []string) []string { f[2] = strings.Repeat("0", 64); return f },
		"no record of the lease":     nil,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			s.schema10Writes = true // version 3, which files of schema 10 hold
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			req := acquireReq("acq-corrupt", time.Minute, far)
			a, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			l := refLife{req: req, acq: a}
			k, v, p := evidenceOf(t, s, l.lookup(far))
			bad := string(v)
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				if edit == nil {
					return tx.Bucket(bucketIdent).Delete(activeKey(p.LockKey))
				}
				bad = strings.Join(edit(strings.Split(string(v), "\n")), "\n")
				return tx.Bucket(bucketIdent).Put(k, []byte(bad))
			}); err != nil {
				t.Fatal(err)
			}
			if name == "digest of another request" {
				// The digest is the request's: it conflicts, as any
				// evidence of another request would.
				if _, err := s.Acquire(ctx, req); code(err) != lease.CodeIdempotencyConflict {
					t.Fatalf("replay: %v, want idempotency_conflict", err)
				}
				return
			}
			if r, err := s.Acquire(ctx, req); code(err) != lease.CodeCorrupt {
				t.Fatalf("replay: %v %+v, want corrupt", err, r.Lease)
			}
			if r, err := s.LookupRequest(ctx, l.lookup(far)); code(err) != lease.CodeCorrupt {
				t.Fatalf("lookup: %v %+v, want corrupt", err, r.Lease)
			}
			if _, after, _ := evidenceOf(t, s, l.lookup(far)); string(after) != bad || quarantineOf(t, s, p.LockKey) == "" {
				t.Fatalf("evidence %q (changed: %v), quarantine %q", after, string(after) != bad, quarantineOf(t, s, p.LockKey))
			}
		})
	}
}

// A schema 9 file holds an acquisition's evidence in version 2: it opens
// as schema 10 without it being rewritten, and it still answers exactly,
// beside the version 3 evidence of an acquisition after the upgrade.
func TestSchema9AcquireEvidenceStillReplays(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	before := refLives(t, s, c, "schema9", 0, 1, far)[0]
	k, v, p := evidenceOf(t, s, before.lookup(far))
	var v2 []byte
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		v2 = asVersion2(t, tx, p.LockKey, v)
		if err := tx.Bucket(bucketIdent).Put(k, v2); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV9))
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path, o)
	if err != nil {
		t.Fatalf("a schema 9 file does not open: %v", err)
	}
	defer s.Close()
	if v := storedSchema(t, s.db); v != schemaVersion {
		t.Errorf("schema %q after open, want %q", v, schemaVersion)
	}
	if _, got, _ := evidenceOf(t, s, before.lookup(far)); !bytes.Equal(got, v2) {
		t.Fatalf("the schema 9 evidence was rewritten: %q", got)
	}
	before.answersExactly(t, s, far)
	after := refLives(t, s, c, "schema10", 0, 1, far)[0]
	// By reference, in the form this build writes (version 3 until
	// schema 11, version 4 since).
	if got := after.storedVersion(t, s, far); got != "ev4" {
		t.Fatalf("evidence written after the upgrade: %s, want ev4", got)
	}
	after.answersExactly(t, s, far)
}

// A release's version 3 evidence is rebuilt only from its lease's history
// entry as the release left it: an entry that says otherwise (another
// expiry or ttl) or none at all (damage) fails closed.
func TestCorruptReleaseVersion3EvidenceFailsClosed(t *testing.T) {
	for name, edit := range map[string]func(lines []string) []string{
		"another expiry": func(f []string) []string { f[7] = "1"; return f },
		"another ttl":    func(f []string) []string { f[8] = "1"; return f },
		"no history":     nil,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			s.schema10Writes = true // version 3, which files of schema 10 hold
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := refLives(t, s, c, "corrupt-release", 0, 1, far)[0]
			k, v, p := evidenceOf(t, s, l.releaseLookup(far))
			if !bytes.HasPrefix(v, []byte(lease.EvidenceRefPrefix)) {
				t.Fatalf("release evidence is not version 3: %q", v)
			}
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				if edit == nil {
					prefix := historyPrefix(p.LockKey)
					hk, _ := tx.Bucket(bucketIdent).Cursor().Seek(prefix)
					if !bytes.HasPrefix(hk, prefix) {
						t.Fatal("no history entry")
					}
					return tx.Bucket(bucketIdent).Delete(hk)
				}
				return tx.Bucket(bucketIdent).Put(k, []byte(strings.Join(edit(strings.Split(string(v), "\n")), "\n")))
			}); err != nil {
				t.Fatal(err)
			}
			if r, err := s.Release(ctx, l.relReq); code(err) != lease.CodeCorrupt {
				t.Fatalf("replay: %v %+v, want corrupt", err, r.Lease)
			}
			if r, err := s.LookupRequest(ctx, l.releaseLookup(far)); code(err) != lease.CodeCorrupt {
				t.Fatalf("lookup: %v %+v, want corrupt", err, r.Lease)
			}
			if quarantineOf(t, s, p.LockKey) == "" {
				t.Fatal("identity not quarantined")
			}
		})
	}
}
