package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Rich leases (metadata with escapes/unicode/numbers, renewal capped by
// the maximum lifetime, release, revoke with a reason, expire archived by
// the next acquisition, tokens near 2^53) replay and look up byte for byte
// after their history entry is trimmed (cap 1) and after reopen; another
// digest conflicts.
func TestS44RichLivesReplayAfterTrim(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	o := Options{StoreOptions: so, Now: c.Now, ReapInterval: -1}
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	meta := lease.Metadata{"q": `a"b\c`, "html": "<>&", "ls": "\u2028", "uni": "é日本🙂", "n1": json.Number("1.0"),
		"n2": json.Number("1e2"), "f": 1e21, "b": true, "z": nil}
	target := "rich"
	var lives []refLife
	// Start tokens near 2^53.
	var lockKey string
	{
		req := acquireReq("probe", time.Minute, far)
		req.Identity.TargetID = target
		_, p, err := lease.PrepareAcquire(req, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		lockKey = p.LockKey
		if err := s.db.Update(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketIdent).Put(counterKey(lockKey), u64((1<<53)-12))
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4; i++ {
		req := acquireReq(fmt.Sprintf("acq-%02d", i), 30*time.Second, far)
		req.Identity.TargetID = target
		req.MaximumLifetime = 40 * time.Second
		req.Metadata = meta
		req.TraceID = "trace-1"
		a, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		r := a.Lease
		l := refLife{req: req, acq: a}
		if got := l.storedVersion(t, s, far); got != "ev4" {
			t.Fatalf("acq %d stored %s", i, got)
		}
		c.Add(20 * time.Second)
		if _, err := s.Renew(ctx, lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
			ServiceInstanceID: r.ServiceInstanceID, TTL: 30 * time.Second, Mutation: lease.Mutation{RequestID: fmt.Sprintf("ren-%02d", i), DeadlineAt: far, Caller: callerOfRecord(r)}}); err != nil {
			t.Fatal(err)
		}
		c.Add(time.Second)
		switch i % 3 {
		case 0:
			l.relReq = lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
				ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%02d", i), DeadlineAt: far, Caller: callerOfRecord(r)}}
			if l.rel, err = s.Release(ctx, l.relReq); err != nil {
				t.Fatal(err)
			}
			if got := l.storedReleaseVersion(t, s, far); got != "ev4" {
				t.Fatalf("rel %d stored %s", i, got)
			}
		case 1:
			if _, err := s.Revoke(ctx, lease.AdminRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
				Reason: `he said "no" \ é <>&`, IncidentID: "inc-1", Mutation: lease.Mutation{RequestID: fmt.Sprintf("rev-%02d", i), DeadlineAt: far,
					Caller: lease.Caller{PrincipalID: "prn-admin", ClientID: "c-admin", CredentialID: "k-admin"}}}); err != nil {
				t.Fatal(err)
			}
		case 2:
			c.Add(time.Minute) // expires; the next acquisition archives it
		}
		c.Add(time.Second)
		lives = append(lives, l)
	}
	// last: acquire one more so the previous ones are all trimmed
	req := acquireReq("acq-last", 30*time.Second, far)
	req.Identity.TargetID = target
	c.Add(2 * time.Minute)
	if _, err := s.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	refLives(t, s, c, "other", 0, 0, far)
	c.Add(2 * time.Minute)
	req.RequestID = "acq-last2"
	if _, err := s.Acquire(ctx, req); err != nil { // archives acq-last (expired): trims life 3's entry
		t.Fatal(err)
	}
	for i, l := range lives {
		if got := l.storedVersion(t, s, far); got != "ev2" {
			t.Errorf("life %d: acquisition evidence %s after trim, want ev2", i, got)
		}
		if l.rel.Lease != nil {
			if got := l.storedReleaseVersion(t, s, far); got != "ev2" {
				t.Errorf("life %d: release evidence %s after trim, want ev2", i, got)
			}
		}
	}
	check := func(when string) {
		for i, l := range lives {
			l.answersExactly(t, s, far)
			other := l.req
			other.TTL += time.Second
			if _, err := s.Acquire(ctx, other); code(err) != lease.CodeIdempotencyConflict {
				t.Fatalf("%s life %d: other digest %v", when, i, err)
			}
			if l.rel.Lease != nil {
				or := l.relReq
				or.FencingToken++
				if _, err := s.Release(ctx, or); code(err) != lease.CodeIdempotencyConflict {
					t.Fatalf("%s life %d: other release digest %v", when, i, err)
				}
			}
		}
	}
	check("trimmed")
	s.Close()
	if s, err = Open(path, o); err != nil {
		t.Fatal(err)
	}
	check("reopened")
}

// Tamper: the acquisition's version 4 evidence copied under the same
// lease's release scope key. The read path answers the release replay
// corrupt (operation mismatch), and still does once the entry is trimmed:
// detaching leaves evidence of another operation than its key's as it is
// (it spliced it into version 2 acquisition evidence under the release
// key, which answered idempotency_conflict, before review 44's fix).
func TestS44MisplacedAcquireEvidenceStaysCorruptAfterTrim(t *testing.T) {
	ctx := context.Background()
	for _, trim := range []bool{false, true} {
		t.Run(fmt.Sprintf("trim=%v", trim), func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			so := leasetest.StoreOptions()
			so.HistoryPerIdentity = 1
			s := openTemp(t, Options{StoreOptions: so, Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := refLives(t, s, c, "misplaced", 0, 1, far)[0]
			_, va, _ := evidenceOf(t, s, l.lookup(far))
			kr, vr, _ := evidenceOf(t, s, l.releaseLookup(far))
			if !bytes.HasPrefix(va, []byte(lease.EvidenceLeanPrefix)) || !bytes.HasPrefix(vr, []byte(lease.EvidenceLeanPrefix)) {
				t.Fatalf("setup %q %q", va, vr)
			}
			if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(kr, va) }); err != nil {
				t.Fatal(err)
			}
			if trim {
				refLives(t, s, c, "misplaced", 10, 1, far) // trims l's entry
				if _, after, _ := evidenceOf(t, s, l.releaseLookup(far)); !bytes.Equal(after, va) {
					t.Errorf("the release key's misplaced evidence was rewritten when the entry was trimmed: %q", after)
				}
			}
			_, err := s.Release(ctx, l.relReq)
			if _, lerr := s.LookupRequest(ctx, l.releaseLookup(far)); code(lerr) != lease.CodeCorrupt {
				t.Errorf("release lookup with the acquisition's evidence under its key: %v, want corrupt", lerr)
			}
			if code(err) != lease.CodeCorrupt {
				t.Errorf("release replay with the acquisition's evidence under its key: %s, want corrupt (as before the trim)", code(err))
			}
		})
	}
}

// Schema 10 file: a lease acquired under schema 10 (ev3) and released
// under schema 11 (ev4 release, hv3 entry), then trimmed: both detach and
// replay byte for byte.
func TestS44Schema10AcquiredReleasedAfterUpgrade(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	o := Options{StoreOptions: so, Now: c.Now, ReapInterval: -1}
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	s.schema10Writes = true
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	req := acquireReq("acq-x", time.Hour, far)
	req.Identity.TargetID = "up"
	a, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV10)) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(path, o); err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	c.Add(time.Second)
	r := a.Lease
	l := refLife{req: req, acq: a}
	l.relReq = lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel-x", DeadlineAt: far, Caller: callerOfRecord(r)}}
	if l.rel, err = s.Release(ctx, l.relReq); err != nil {
		t.Fatal(err)
	}
	if a, r := l.storedVersion(t, s, far), l.storedReleaseVersion(t, s, far); a != "ev3" || r != "ev4" {
		t.Fatalf("stored %s %s", a, r)
	}
	c.Add(time.Second)
	refLives(t, s, c, "up", 10, 1, far)
	if a, r := l.storedVersion(t, s, far), l.storedReleaseVersion(t, s, far); a != "ev2" || r != "ev2" {
		t.Fatalf("after trim stored %s %s", a, r)
	}
	gone := a.Lease.Clone()
	gone.State = lease.StateExpired
	l.replaysAsFirst(t, s, far, gone, "trimmed")
	s.Close()
	if s, err = Open(path, o); err != nil {
		t.Fatal(err)
	}
	l.replaysAsFirst(t, s, far, gone, "trimmed, reopened")
}

// CRC forgery: damage the lease id of a released lease's history entry
// and compensate a CRC-32C with bit flips in other id fields (solved over
// GF(2), alphanumeric stays alphanumeric). The entry still decodes
// strictly. With a CRC-32C as version 4's check (before review 44's fix)
// the evidence then rebuilt "exactly" and the release replay answered
// the damaged lease id; a SHA-256 prefix cannot be matched this way, and
// the replay fails closed.
func TestS44ForgedCRCFailsClosed(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := refLives(t, s, c, "forged", 0, 1, far)[0]
	_, ev, p := evidenceOf(t, s, l.releaseLookup(far))
	keys, vals := rhEntries(t, s, p.LockKey)
	if len(vals) != 1 || !bytes.HasPrefix(vals[0], []byte(lease.HistoryV3Prefix)) {
		t.Fatalf("setup %q", vals)
	}
	h, err := lease.DecodeStoredHistoryAt(vals[0], p.LockKey)
	if err != nil {
		t.Fatal(err)
	}
	relP := l.relReq
	_, rp, err := lease.PrepareRelease(relP, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	v1Of := func(r *lease.Record) []byte {
		e := &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: lease.OpRelease, Digest: rp.Digest,
			Code: lease.CodeReleased, Lease: r, BackendTime: h.EndedAt}
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	base := v1Of(h.Record)
	if got, ok := lease.ExpandLeanEvidence(string(ev), h.Record, h.EndedAt); !ok || got != string(base) {
		t.Fatalf("sanity: %v", ok)
	}
	crc := func(b []byte) uint32 { return crc32c(b) }
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	type flip struct {
		field *string
		i     int
		bit   byte
	}
	flipIn := func(r *lease.Record, f flip) {
		// f.field points into r
		b := []byte(*f.field)
		b[f.i] ^= f.bit
		*f.field = string(b)
	}
	fieldsOf := func(r *lease.Record) []*string {
		return []*string{&r.ExecutionID, &r.JobID, &r.ServiceInstanceID, &r.OwnerClientID, &r.OwnerCredentialID}
	}
	// target damage: one bit of the lease id
	dam := h.Record.Clone()
	var target flip
	for i := len(dam.LeaseID) - 1; i >= 0; i-- {
		if c := dam.LeaseID[i]; alnum(c) && alnum(c^1) {
			target = flip{&dam.LeaseID, i, 1}
			break
		}
	}
	flipIn(dam, target)
	want := crc(v1Of(dam)) ^ crc(base)
	// candidate flips
	type cand struct {
		fi, i int
		bit   byte
		syn   uint32
	}
	var cands []cand
	for fi, fp := range fieldsOf(h.Record) {
		for i := 0; i < len(*fp); i++ {
			for _, bit := range []byte{1, 2, 4, 8, 16} {
				if c := (*fp)[i]; alnum(c) && alnum(c^bit) {
					r := h.Record.Clone()
					flipIn(r, flip{fieldsOf(r)[fi], i, bit})
					cands = append(cands, cand{fi, i, bit, crc(v1Of(r)) ^ crc(base)})
				}
			}
		}
	}
	// Gaussian elimination over GF(2): find a subset of syndromes XORing to want.
	type row struct {
		v   uint32
		set []int
	}
	var basis []row
	for k, cd := range cands {
		r := row{cd.syn, []int{k}}
		for _, b := range basis {
			if r.v^b.v < r.v {
				r.v ^= b.v
				r.set = xorSet(r.set, b.set)
			}
		}
		if r.v != 0 {
			basis = append(basis, r)
			// keep basis sorted by leading bit descending
			for j := len(basis) - 1; j > 0 && basis[j].v > basis[j-1].v; j-- {
				basis[j], basis[j-1] = basis[j-1], basis[j]
			}
		}
	}
	acc, set := want, []int(nil)
	for _, b := range basis {
		if acc^b.v < acc {
			acc ^= b.v
			set = xorSet(set, b.set)
		}
	}
	if acc != 0 {
		t.Fatalf("setup: no CRC-32C forgery with %d candidates (rank %d)", len(cands), len(basis))
	}
	for _, k := range set {
		cd := cands[k]
		flipIn(dam, flip{fieldsOf(dam)[cd.fi], cd.i, cd.bit})
	}
	dh := *h
	dh.Record = dam
	b, err := lease.CompactHistoryAt(&dh)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.DecodeStoredHistoryAt(b, p.LockKey); err != nil {
		t.Fatalf("forged entry does not decode: %v", err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(keys[0], b) }); err != nil {
		t.Fatal(err)
	}
	r, err := s.Release(ctx, l.relReq)
	if err == nil {
		t.Logf("release replay answered lease id %q (original %q), execution %q job %q instance %q client %q credential %q",
			r.Lease.LeaseID, l.rel.Lease.LeaseID, r.Lease.ExecutionID, r.Lease.JobID, r.Lease.ServiceInstanceID, r.Lease.OwnerClientID, r.Lease.OwnerCredentialID)
	}
	if code(err) != lease.CodeCorrupt {
		t.Errorf("release replay over a forged entry: %v; want corrupt", err)
	}
}

func xorSet(a, b []int) []int {
	m := map[int]bool{}
	for _, x := range a {
		m[x] = !m[x]
	}
	for _, x := range b {
		m[x] = !m[x]
	}
	var out []int
	for x, in := range m {
		if in {
			out = append(out, x)
		}
	}
	return out
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// Concurrent lives on distinct identities (group commit), cap 1 so every
// life after the first detaches by splicing; replays run concurrently.
func TestS44ConcurrentLivesSplice(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	s := openTemp(t, Options{StoreOptions: so, Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	done := make(chan []refLife, 6)
	for g := 0; g < 6; g++ {
		go func(g int) {
			lives := refLives(t, s, c, fmt.Sprintf("conc-%d", g), 0, 6, far)
			for _, l := range lives {
				l.answersExactly(t, s, far)
			}
			done <- lives
		}(g)
	}
	for g := 0; g < 6; g++ {
		lives := <-done
		for i, l := range lives[:5] {
			if v := l.storedVersion(t, s, far); v != "ev2" {
				t.Errorf("life %d: %s", i, v)
			}
		}
	}
}
