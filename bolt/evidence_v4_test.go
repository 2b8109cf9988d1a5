package bolt

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// replaysAsFirst checks that l's acquisition and release replay and look
// up exactly what their first calls returned, byte for byte, with cur
// (nil: none) as the acquisition's current state; and that the same
// request ids with another digest conflict, changing nothing.
func (l refLife) replaysAsFirst(t *testing.T, s *Store, far time.Time, cur *lease.Record, when string) {
	t.Helper()
	ctx := context.Background()
	l.answersExactly(t, s, far)
	a, err := s.Acquire(ctx, l.req)
	if err != nil || (cur == nil) != (a.Current == nil) || (cur != nil && encoded(t, a.Current) != encoded(t, cur)) {
		t.Fatalf("%s: replay of %s: current %+v, %v; want %+v", when, l.req.RequestID, a.Current, err, cur)
	}
	other := l.req
	other.TTL += time.Second
	if _, err := s.Acquire(ctx, other); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("%s: acquisition %s with another digest: %v, want idempotency_conflict", when, l.req.RequestID, err)
	}
	if l.rel.Lease == nil {
		return
	}
	otherRel := l.relReq
	otherRel.FencingToken++
	if _, err := s.Release(ctx, otherRel); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("%s: release %s with another digest: %v, want idempotency_conflict", when, l.relReq.RequestID, err)
	}
	l.answersExactly(t, s, far)
}

// Version 4 evidence answers through a lease's whole life: while it is
// active, once it is released, after reopen, once its history entry is
// trimmed (the evidence then detached to version 2) and after reopen
// again. Every replay and lookup gives back the first call's result byte
// for byte and the lease's state now; another digest conflicts.
func TestLeanEvidenceReplaysThroughItsLife(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	o := Options{StoreOptions: so, Now: c.Now, ReapInterval: -1}
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	reopen := func() {
		t.Helper()
		s.Close()
		if s, err = Open(path, o); err != nil {
			t.Fatal(err)
		}
	}
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	req := acquireReq("acq-lean", time.Minute, far)
	req.Identity.TargetID = "lean"
	a, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	l := refLife{req: req, acq: a}
	if got := l.storedVersion(t, s, far); got != "ev4" {
		t.Fatalf("acquisition evidence %s, want ev4", got)
	}
	l.replaysAsFirst(t, s, far, nil, "active")
	// Renewed: the acquisition still answers as granted (a state that did
	// not change is not reported).
	c.Add(time.Second)
	r := a.Lease
	ren, err := s.Renew(ctx, lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, TTL: 3 * time.Minute, Mutation: lease.Mutation{RequestID: "ren-lean", DeadlineAt: far, Caller: callerOfRecord(r)}})
	if err != nil {
		t.Fatal(err)
	}
	if ren.Lease.ExpiresAt == a.Lease.ExpiresAt {
		t.Fatal("the renewal did not change the expiry")
	}
	l.replaysAsFirst(t, s, far, nil, "renewed")
	c.Add(time.Second)
	l.relReq = lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel-lean", DeadlineAt: far, Caller: callerOfRecord(r)}}
	if l.rel, err = s.Release(ctx, l.relReq); err != nil {
		t.Fatal(err)
	}
	if got, rel := l.storedVersion(t, s, far), l.storedReleaseVersion(t, s, far); got != "ev4" || rel != "ev4" {
		t.Fatalf("evidence after release: acquisition %s, release %s; want ev4", got, rel)
	}
	l.replaysAsFirst(t, s, far, l.rel.Lease, "released")
	reopen()
	l.replaysAsFirst(t, s, far, l.rel.Lease, "released, reopened")
	more := refLives(t, s, c, "lean", 10, 2, far) // cap 2: l's entry goes
	if got, rel := l.storedVersion(t, s, far), l.storedReleaseVersion(t, s, far); got != "ev2" || rel != "ev2" {
		t.Fatalf("evidence after its history was trimmed: acquisition %s, release %s; want ev2", got, rel)
	}
	// Its history entry is gone: the state now is reported as expired
	// (lease.CurrentOf), as for every form of evidence.
	gone := a.Lease.Clone()
	gone.State = lease.StateExpired
	l.replaysAsFirst(t, s, far, gone, "trimmed")
	reopen()
	l.replaysAsFirst(t, s, far, gone, "trimmed, reopened")
	for _, m := range more {
		if got := m.storedVersion(t, s, far); got != "ev4" {
			t.Fatalf("a later lease's evidence %s, want ev4", got)
		}
		m.replaysAsFirst(t, s, far, m.rel.Lease, "later lease")
	}
}

// Version 4 evidence that cannot be rebuilt exactly fails closed
// (corrupt, the identity quarantined, the evidence left as it was): a
// line naming another token, a check or digest of other bytes, a number
// spelled otherwise, a line missing or added, another operation, and
// evidence whose lease has no record left (damage); for a release also
// an entry that ended otherwise.
func TestCorruptVersion4EvidenceFailsClosed(t *testing.T) {
	zeros := strings.Repeat("A", 43)
	for name, edit := range map[string]func(lines []string) []string{
		"another token":  func(f []string) []string { f[4] = "2"; return f },
		"another check":  func(f []string) []string { f[3] = "AAAAAA"; return f },
		"another digest": func(f []string) []string { f[2] = zeros; return f },
		"ttl with a leading zero": func(f []string) []string {
			if len(f) < 6 {
				f[4] = "0" + f[4]
			} else {
				f[5] = "0" + f[5]
			}
			return f
		},
		"line missing":           func(f []string) []string { return f[:len(f)-1] },
		"line added":             func(f []string) []string { return append(f, "1") },
		"another operation":      func(f []string) []string { f[1] = map[string]string{"a": "r", "r": "a"}[f[1]]; return f },
		"unknown operation":      func(f []string) []string { f[1] = "x"; return f },
		"no record of the lease": nil,
	} {
		for _, op := range []lease.Op{lease.OpAcquire, lease.OpRelease} {
			t.Run(string(op)+"/"+name, func(t *testing.T) {
				ctx := context.Background()
				c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
				s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
				far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
				var l refLife
				lk := func() lease.LookupRequest { return l.lookup(far) }
				if op == lease.OpAcquire {
					req := acquireReq("acq-corrupt", time.Minute, far)
					a, err := s.Acquire(ctx, req)
					if err != nil {
						t.Fatal(err)
					}
					l = refLife{req: req, acq: a}
				} else {
					l = refLives(t, s, c, "corrupt-lean", 0, 1, far)[0]
					lk = func() lease.LookupRequest { return l.releaseLookup(far) }
				}
				k, v, p := evidenceOf(t, s, lk())
				if !bytes.HasPrefix(v, []byte(lease.EvidenceLeanPrefix)) {
					t.Fatalf("evidence is not version 4: %q", v)
				}
				bad := string(v)
				if err := s.db.Update(func(tx *bbolt.Tx) error {
					ident := tx.Bucket(bucketIdent)
					if edit != nil {
						bad = strings.Join(edit(strings.Split(string(v), "\n")), "\n")
						return ident.Put(k, []byte(bad))
					}
					if op == lease.OpAcquire {
						return ident.Delete(activeKey(p.LockKey))
					}
					hk, _ := ident.Cursor().Seek(historyPrefix(p.LockKey))
					if !bytes.HasPrefix(hk, historyPrefix(p.LockKey)) {
						t.Fatal("no history entry")
					}
					return ident.Delete(hk)
				}); err != nil {
					t.Fatal(err)
				}
				var err error
				if op == lease.OpAcquire {
					_, err = s.Acquire(ctx, l.req)
				} else {
					_, err = s.Release(ctx, l.relReq)
				}
				if code(err) != lease.CodeCorrupt {
					t.Fatalf("replay: %v, want corrupt", err)
				}
				if r, err := s.LookupRequest(ctx, lk()); code(err) != lease.CodeCorrupt {
					t.Fatalf("lookup: %v %+v, want corrupt", err, r.Lease)
				}
				if _, after, _ := evidenceOf(t, s, lk()); string(after) != bad || quarantineOf(t, s, p.LockKey) == "" {
					t.Fatalf("evidence %q (changed: %v), quarantine %q", after, string(after) != bad, quarantineOf(t, s, p.LockKey))
				}
			})
		}
	}
}

// A flipped byte in the lease id of the history entry a release's
// version 4 evidence rebuilds from (the fact version 3 cross-checked)
// fails the check: corrupt, never the damaged lease id as the answer.
func TestVersion4ReleaseOfDamagedEntryFailsClosed(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := refLives(t, s, c, "damaged-lean", 0, 1, far)[0]
	_, _, p := evidenceOf(t, s, l.releaseLookup(far))
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		ident := tx.Bucket(bucketIdent)
		hk, hv := ident.Cursor().Seek(historyPrefix(p.LockKey))
		i := bytes.Index(hv, []byte("lease_"))
		if i < 0 {
			t.Fatalf("no lease id in the entry %q", hv)
		}
		bad := bytes.Clone(hv)
		bad[i+3] = 'r' // lease_ → leare_
		if _, err := lease.DecodeStoredHistoryAt(bad, p.LockKey); err != nil {
			t.Fatalf("the damaged entry does not decode (want damage the decoder cannot see): %v", err)
		}
		return ident.Put(bytes.Clone(hk), bad)
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Release(ctx, l.relReq); code(err) != lease.CodeCorrupt {
		t.Fatalf("replay: %v %+v, want corrupt", err, r.Lease)
	}
	if r, err := s.LookupRequest(ctx, l.releaseLookup(far)); code(err) != lease.CodeCorrupt {
		t.Fatalf("lookup: %v %+v, want corrupt", err, r.Lease)
	}
}

// Version 4 evidence of identity A found under identity B's evidence key
// (same principal and request id, both leases token 1): B's record of
// that token is not the one B's request made (its scope differs), so the
// replay and lookup fail closed and B is quarantined; A's lease is never
// answered as B's, nor B's lease as the result of A's request.
func TestVersion4EvidenceOfAnotherIdentityFailsClosed(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	a := scopeAcquire(t, s, "tenant-a", "program-a", "target-a", "prn-x", "req-a")
	b := scopeAcquire(t, s, "tenant-b", "program-b", "target-b", "prn-x", "req-b")
	if a.FencingToken != b.FencingToken {
		t.Fatalf("tokens %d and %d: the test wants one token on both", a.FencingToken, b.FencingToken)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		ident := tx.Bucket(bucketIdent)
		v := ident.Get(idemKey(b.LockKey, lease.IdempotencyScope(lease.OpAcquire, b.LockKey, "prn-x", "req-b")))
		if !bytes.HasPrefix(v, []byte(lease.EvidenceLeanPrefix)) {
			t.Fatalf("evidence of b is not version 4: %.20q", v)
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

// A file of schema 10 (evidence in version 3, history in version 2, as
// that build wrote them) opens as schema 11 without a value rewritten:
// its replays, lookups and history answer as before; new writes take the
// new forms; trimming an old entry detaches its evidence; the fencing
// counter continues upward.
func TestSchema10StoreOpensAsSchema11(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 3
	o := Options{StoreOptions: so, Now: c.Now, ReapInterval: -1}
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	s.schema10Writes = true
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	old := refLives(t, s, c, "old", 0, 2, far)
	req := acquireReq("acq-old-live", time.Hour, far)
	req.Identity.TargetID = "old"
	live, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	oldLive := refLife{req: req, acq: live}
	for _, l := range append(old, oldLive) {
		if got := l.storedVersion(t, s, far); got != "ev3" {
			t.Fatalf("setup: evidence %s, want ev3", got)
		}
	}
	if _, vals := rhEntries(t, s, live.Lease.LockKey); len(vals) != 2 || !bytes.HasPrefix(vals[0], []byte(lease.HistoryV2Prefix)) ||
		!bytes.HasPrefix(vals[1], []byte(lease.HistoryV2Prefix)) {
		t.Fatalf("setup: history %q, want version 2", vals)
	}
	histReq := lease.HistoryRequest{Identity: req.Identity, DeadlineAt: far, Caller: req.Caller}
	before, err := s.History(ctx, histReq)
	if err != nil || len(before.Entries) != 2 {
		t.Fatalf("history: %d entries, %v", len(before.Entries), err)
	}
	raw := identValues(t, s)
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV10)) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(path, o); err != nil {
		t.Fatalf("a schema 10 file does not open: %v", err)
	}
	defer s.Close()
	if v := storedSchema(t, s.db); v != schemaVersion {
		t.Fatalf("schema %q after open, want %q", v, schemaVersion)
	}
	if after := identValues(t, s); len(after) != len(raw) {
		t.Fatalf("%d ident values after open, %d before", len(after), len(raw))
	} else {
		for k, v := range raw {
			if !bytes.Equal(after[k], v) {
				t.Fatalf("value %x rewritten on open: %q, was %q", k, after[k], v)
			}
		}
	}
	for _, l := range old {
		l.replaysAsFirst(t, s, far, l.rel.Lease, "old lease")
	}
	oldLive.replaysAsFirst(t, s, far, nil, "old live lease")
	if got, err := s.History(ctx, histReq); err != nil || !sameHistory(t, got.Entries, before.Entries) {
		t.Fatalf("history after open: %v, differs from before", err)
	}
	// New writes: version 4, and tokens above every old one.
	c.Add(2 * time.Hour) // the old live lease has expired
	fresh := refLives(t, s, c, "old", 10, 1, far)[0]
	if got, rel := fresh.storedVersion(t, s, far), fresh.storedReleaseVersion(t, s, far); got != "ev4" || rel != "ev4" {
		t.Fatalf("evidence written after the upgrade: %s, %s; want ev4", got, rel)
	}
	// The expired old lease's entry (archived by this acquisition) and the
	// new lease's are version 3; the old ones stay version 2.
	_, vals := rhEntries(t, s, live.Lease.LockKey)
	if len(vals) != 3 { // cap 3: the oldest went
		t.Fatalf("%d history entries, want 3", len(vals))
	}
	for i, want := range []string{lease.HistoryV2Prefix, lease.HistoryV3Prefix, lease.HistoryV3Prefix} {
		if !bytes.HasPrefix(vals[i], []byte(want)) {
			t.Fatalf("history entry %d: %.4q, want %q", i, vals[i], want)
		}
	}
	if old[0].storedVersion(t, s, far) != "ev2" {
		t.Fatal("the trimmed lease's evidence was not detached")
	}
	if fresh.acq.Lease.FencingToken <= live.Lease.FencingToken {
		t.Fatalf("token after the upgrade %d, not above %d", fresh.acq.Lease.FencingToken, live.Lease.FencingToken)
	}
	fresh.replaysAsFirst(t, s, far, fresh.rel.Lease, "new lease")
	for _, l := range old {
		l.answersExactly(t, s, far)
	}
	oldLive.answersExactly(t, s, far)
	// The old live lease's version 3 evidence now refers to a version 3
	// entry; when that entry is trimmed too, it is detached to version 2
	// (rebuilt, as version 3 is spliced only from version 2 entries).
	if got := oldLive.storedVersion(t, s, far); got != "ev3" {
		t.Fatalf("old live lease's evidence %s, want ev3", got)
	}
	later := refLives(t, s, c, "old", 20, 2, far)
	if got := oldLive.storedVersion(t, s, far); got != "ev2" {
		t.Fatalf("old live lease's evidence after its version 3 entry went: %s, want ev2", got)
	}
	oldLive.answersExactly(t, s, far)
	for _, l := range append(later, fresh) {
		l.answersExactly(t, s, far)
	}
}

// identValues is every key and value of s's ident bucket.
func identValues(t *testing.T, s *Store) map[string][]byte {
	t.Helper()
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdent).ForEach(func(k, v []byte) error { out[string(k)] = bytes.Clone(v); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameHistory reports that two pages of history hold the same entries,
// byte for byte as encoded.
func sameHistory(t *testing.T, a, b []lease.HistoryEntry) bool {
	t.Helper()
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, err1 := a[i].Encode()
		y, err2 := b[i].Encode()
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			return false
		}
	}
	return true
}

// A corrupt version 3 history entry fails closed: the listing skips it,
// an inspect by lease id does not find it,
// the acquisition's version 4 evidence (which rebuilds from it) answers
// corrupt, never a guess, and the identity is quarantined; retention
// removes the entry and its index entry.
func TestCorruptHistoryV3FailsClosed(t *testing.T) {
	for name, edit := range map[string]func(f []string) []string{
		"owner spelled out": func(f []string) []string { f[2] = f[14]; return f },
		"state letter":      func(f []string) []string { f[28] = "a"; return f },
		"unknown state":     func(f []string) []string { f[28] = "x"; return f },
		"renewed 0 after":   func(f []string) []string { f[20] = "0"; return f },
		"tuple changed":     func(f []string) []string { f[9] = "other"; return f },
		"truncated":         func(f []string) []string { return f[:len(f)-1] },
		"line added":        func(f []string) []string { return append(f, "{}") },
		"ended leading 0":   func(f []string) []string { f[1] = "0" + f[1]; return f },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryRetention = time.Hour
			s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := refLives(t, s, c, "corrupt-hv3", 0, 1, far)[0]
			keys, vals := rhEntries(t, s, l.acq.Lease.LockKey)
			if len(vals) != 1 || !bytes.HasPrefix(vals[0], []byte(lease.HistoryV3Prefix)) {
				t.Fatalf("not stored in version 3: %q", vals)
			}
			f := strings.Split(string(vals[0]), "\n")
			if f[2] != "=" || f[14] != l.acq.Lease.OwnerPrincipalID || f[28] != "r" || f[20] != "" || f[9] != "corrupt-hv3" {
				t.Fatalf("setup: lines %q", f)
			}
			bad := []byte(strings.Join(edit(f), "\n"))
			if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(keys[0], bad) }); err != nil {
				t.Fatal(err)
			}
			h, err := s.History(ctx, lease.HistoryRequest{Identity: l.req.Identity, DeadlineAt: far, Caller: l.req.Caller})
			if err != nil || len(h.Entries) != 0 {
				t.Fatalf("history %+v, %v; want the corrupt entry skipped", h.Entries, err)
			}
			if in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l.acq.Lease.LeaseID, DeadlineAt: far}); code(err) != lease.CodeNotFound {
				t.Fatalf("inspect by lease id %+v, %v; want not_found", in.Lease, err)
			}
			if r, err := s.Acquire(ctx, l.req); code(err) != lease.CodeCorrupt {
				t.Fatalf("acquisition replay %+v, %v; want corrupt", r.Lease, err)
			}
			if r, err := s.Release(ctx, l.relReq); code(err) != lease.CodeCorrupt {
				t.Fatalf("release replay %+v, %v; want corrupt", r.Lease, err)
			}
			if quarantineOf(t, s, l.acq.Lease.LockKey) == "" {
				t.Fatal("identity not quarantined")
			}
			c.Add(2 * time.Hour)
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
			if n, m := kindLen(t, s, kindHistory), bucketLen(t, s, bucketHistoryExp); n != 0 || m != 0 {
				t.Fatalf("after retention %d entries, %d index entries", n, m)
			}
		})
	}
}
