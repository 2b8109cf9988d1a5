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

// lookups are the lookup requests of l's three mutations.
func (l leaseLife) lookups(far time.Time) []lease.LookupRequest {
	lk := func(op lease.Op, id lease.Identity, m lease.Mutation) lease.LookupRequest {
		return lease.LookupRequest{Op: op, Identity: id, PrincipalID: m.Caller.PrincipalID, RequestID: m.RequestID, DeadlineAt: far}
	}
	return []lease.LookupRequest{lk(lease.OpAcquire, l.acqReq.Identity, l.acqReq.Mutation),
		lk(lease.OpRenew, l.renReq.Identity, l.renReq.Mutation), lk(lease.OpRelease, l.relReq.Identity, l.relReq.Mutation)}
}

// evidenceOf returns the stored evidence of lk and its key.
func evidenceOf(t *testing.T, s *Store, lk lease.LookupRequest) ([]byte, []byte, lease.Prepared) {
	t.Helper()
	p, err := lease.PrepareLookup(lk, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	k := idemKey(p.LockKey, p.Scope)
	var v []byte
	if err := s.db.View(func(tx *bbolt.Tx) error { v = bytes.Clone(tx.Bucket(bucketIdent).Get(k)); return nil }); err != nil {
		t.Fatal(err)
	}
	return k, v, p
}

// lookupsAnswer checks that every lookup of l answers its original result.
func (l leaseLife) lookupsAnswer(t *testing.T, s *Store, far time.Time) {
	t.Helper()
	want := []lease.Result{l.acq, l.ren, l.rel}
	for i, lk := range l.lookups(far) {
		got, err := s.LookupRequest(context.Background(), lk)
		if err != nil || got.Code != want[i].Code || encoded(t, got.Lease) != encoded(t, want[i].Lease) || got.BackendTime != want[i].BackendTime {
			t.Fatalf("lookup of %s: %+v, %v; want %+v", lk.Op, got, err, want[i])
		}
	}
}

// Schema 4 stores idempotency evidence in version 2, about a third of the
// bytes, and schema 10 an acquisition's and a release's in version 3, by
// reference to the lease's record, under a quarter; schema 11 those in
// version 4, under an eighth; every replay and lookup answers exactly the
// original result.
func TestEvidenceStoredInVersion2(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := live(t, s, c, "compact-1", far)
	for _, lk := range l.lookups(far) {
		_, v, p := evidenceOf(t, s, lk)
		if lk.Op == lease.OpAcquire || lk.Op == lease.OpRelease {
			var v1 []byte
			var known, ok bool
			s.db.View(func(tx *bbolt.Tx) error { v1, known, ok = v1Evidence(tx, p.LockKey, v); return nil })
			if !strings.HasPrefix(string(v), lease.EvidenceLeanPrefix) || !known || !ok || len(v) > len(v1)/8 {
				t.Fatalf("%s evidence is not version 4 at under an eighth of the bytes of version 1 (%d, %d): %q", lk.Op, len(v), len(v1), v)
			}
			continue
		}
		v1, ok := lease.ExpandEvidence(string(v), p.Identity)
		if !strings.HasPrefix(string(v), lease.EvidenceV2Prefix) || !ok || len(v) > len(v1)/2 {
			t.Fatalf("%s evidence is not version 2 at under half the bytes of version 1 (%d, %d): %q", lk.Op, len(v), len(v1), v)
		}
	}
	l.replays(t, s)
	l.lookupsAnswer(t, s, far)
}

// A schema 3 file holds version 1 evidence and history: it opens as
// schema 4 without them being rewritten, and they still answer every
// replay, lookup, history read and inspect exactly.
func TestSchema3EvidenceStillReplays(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := live(t, s, c, "schema3", far)
	v1s := map[string]string{}
	for _, lk := range l.lookups(far) {
		k, v, p := evidenceOf(t, s, lk)
		v1, ok := lease.ExpandEvidence(string(v), p.Identity)
		if !ok {
			t.Fatal("evidence does not expand")
		}
		v1s[string(k)] = v1
	}
	for k, v := range historyOf(t, s, l) {
		v1, ok := lease.ExpandHistoryAt(string(v), unpackLockKey([]byte(k)[:packedLen]))
		if !ok {
			t.Fatal("history does not expand")
		}
		v1s[k] = v1
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		for k, v := range v1s {
			if err := tx.Bucket(bucketIdent).Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return asSchema(tx, schemaVersionV3)
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(path, o); err != nil {
		t.Fatalf("a schema 3 file: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if v := string(tx.Bucket(bucketMeta).Get(keySchema)); v != schemaVersion {
			t.Errorf("schema %q after open, want %q", v, schemaVersion)
		}
		for k, v := range v1s {
			if got := string(tx.Bucket(bucketIdent).Get([]byte(k))); got != v {
				t.Errorf("a version 1 entry was rewritten: %q", got)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	l.replays(t, s)
	l.lookupsAnswer(t, s, far)
	l.endedReads(t, s, far)
}

// Version 2 evidence that does not rebuild into well-formed evidence (a
// number spelled otherwise, a line with a quote, a line missing) fails
// closed: the replay and the lookup answer corrupt, the identity is
// quarantined, and the evidence is left as it was.
func TestCorruptVersion2EvidenceFailsClosed(t *testing.T) {
	for name, edit := range map[string]func(lines []string) []string{
		"token with a leading zero": func(f []string) []string { f[lease.Ev2Token] = "0" + f[lease.Ev2Token]; return f },
		"quote in a line":           func(f []string) []string { f[lease.Ev2Job] += `","x":"y`; return f },
		"line missing":              func(f []string) []string { return append(f[:lease.Ev2Trace], f[lease.Ev2Trace+1:]...) },
		"metadata not an object":    func(f []string) []string { f[lease.Ev2Metadata] = "[]"; return f },
	} {
		t.Run(name, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := live(t, s, c, "corrupt-ev2", far)
			// The renewal's: an acquisition's evidence is version 3.
			lk := l.lookups(far)[1]
			k, v, p := evidenceOf(t, s, lk)
			bad := strings.Join(edit(strings.Split(string(v), "\n")), "\n")
			if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(k, []byte(bad)) }); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Renew(context.Background(), l.renReq); code(err) != lease.CodeCorrupt {
				t.Fatalf("replay: %v, want corrupt", err)
			}
			if _, err := s.LookupRequest(context.Background(), lk); code(err) != lease.CodeCorrupt {
				t.Fatalf("lookup: %v, want corrupt", err)
			}
			_, after, _ := evidenceOf(t, s, lk)
			var quarantined []byte
			s.db.View(func(tx *bbolt.Tx) error {
				quarantined = bytes.Clone(tx.Bucket(bucketQuarantine).Get([]byte(p.LockKey)))
				return nil
			})
			if string(after) != bad || quarantined == nil {
				t.Fatalf("evidence %q (changed: %v), quarantine %q", after, string(after) != bad, quarantined)
			}
		})
	}
}

// historyOf returns the stored history entries of l's identity, by key.
func historyOf(t *testing.T, s *Store, l leaseLife) map[string][]byte {
	t.Helper()
	_, _, p := evidenceOf(t, s, l.lookups(time.Now().Add(time.Hour))[0])
	out := map[string][]byte{}
	prefix := historyPrefix(p.LockKey)
	s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketIdent).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			out[string(k)] = bytes.Clone(v)
		}
		return nil
	})
	return out
}

// endedReads checks that the history and an inspect by lease id of l's
// lease answer its release exactly.
func (l leaseLife) endedReads(t *testing.T, s *Store, far time.Time) {
	t.Helper()
	ctx := context.Background()
	h, err := s.History(ctx, lease.HistoryRequest{Identity: l.acqReq.Identity, DeadlineAt: far, Caller: l.acqReq.Caller})
	if err != nil || len(h.Entries) != 1 {
		t.Fatalf("history: %+v, %v", h, err)
	}
	e := h.Entries[0]
	if encoded(t, e.Record) != encoded(t, l.rel.Lease) || e.EndedAt != l.rel.BackendTime || e.EndedBy != l.relReq.Caller.PrincipalID ||
		e.RequestID != l.relReq.RequestID {
		t.Fatalf("history entry %+v, want the release %+v", e, l.rel)
	}
	in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l.rel.Lease.LeaseID, DeadlineAt: far, Caller: l.acqReq.Caller})
	if err != nil || in.Lease == nil || in.Lease.State != lease.StateReleased || in.Lease.FencingToken != l.rel.Lease.FencingToken {
		t.Fatalf("inspect by lease id: %+v, %v", in, err)
	}
}

// Schema 4 stores history entries in version 2, and the history and an
// inspect by lease id read them back exactly.
func TestHistoryStoredInVersion2(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	s.schema10Writes = true // version 2, as schemas 4 to 10 write it
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := live(t, s, c, "compact-history", far)
	hist := historyOf(t, s, l)
	if len(hist) != 1 {
		t.Fatalf("%d history entries", len(hist))
	}
	for _, v := range hist {
		v1, ok := lease.ExpandHistory(string(v))
		if !strings.HasPrefix(string(v), lease.HistoryV2Prefix) || !ok || len(v) > len(v1)*3/4 {
			t.Fatalf("history entry is not version 2 at under three quarters of version 1 (%d, %d): %q", len(v), len(v1), v)
		}
	}
	l.endedReads(t, s, far)
}

// Schema 11 stores history entries in version 3, without the hash tag
// and with its shortenings, at least 60 bytes under version 2 of the same
// entry, and the history and an inspect by lease id read them back
// exactly.
func TestHistoryStoredInVersion3(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := live(t, s, c, "compact-history", far)
	hist := historyOf(t, s, l)
	if len(hist) != 1 {
		t.Fatalf("%d history entries", len(hist))
	}
	for k, v := range hist {
		lockKey := unpackLockKey([]byte(k)[:packedLen])
		h, err := lease.DecodeStoredHistoryAt(v, lockKey)
		if err != nil {
			t.Fatal(err)
		}
		v2, err := lease.CompactHistory(h)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(v), lease.HistoryV3Prefix) || !strings.HasPrefix(string(v2), lease.HistoryV2Prefix) || len(v) > len(v2)-60 {
			t.Fatalf("history entry is not version 3 at 60 bytes under version 2 (%d, %d): %q", len(v), len(v2), v)
		}
		if _, err := lease.DecodeStoredHistory(v); code(err) != lease.CodeCorrupt {
			t.Fatalf("version 3 decoded without its lock key: %v", err)
		}
	}
	l.endedReads(t, s, far)
}

// v1Evidence returns stored evidence v of lockKey as version 1 bytes, the
// tuple of a version 2 one taken from the identity's active record or one
// of its history entries (as a reader takes it from the request), a
// version 3 one rebuilt from the record of its lease (the active one or
// a history entry's, as the store does); ok is false if it does not
// expand, or if no record of the identity (of version 3's lease) is left
// to take the tuple from (then known is false).
func v1Evidence(tx *bbolt.Tx, lockKey string, v []byte) (v1 []byte, known, ok bool) {
	if bytes.HasPrefix(v, []byte(lease.EvidenceLeanPrefix)) {
		rec, endedAt := leanRecordIn(tx, lockKey, string(v))
		if rec == nil {
			return nil, false, false
		}
		s, ok := lease.ExpandLeanEvidence(string(v), rec, endedAt)
		return []byte(s), true, ok
	}
	if bytes.HasPrefix(v, []byte(lease.EvidenceRefPrefix)) {
		rec := referredRecordIn(tx, lockKey, string(v))
		if rec == nil {
			return nil, false, false
		}
		s, ok := lease.ExpandReferringEvidence(string(v), rec)
		return []byte(s), true, ok
	}
	if !bytes.HasPrefix(v, []byte(lease.EvidenceV2Prefix)) {
		return v, true, true
	}
	ident := tx.Bucket(bucketIdent)
	var id *lease.Identity
	if r, err := lease.DecodeStoredRecord(ident.Get(activeKey(lockKey))); err == nil {
		t := r.Identity()
		id = &t
	}
	prefix := historyPrefix(lockKey)
	c := ident.Cursor()
	for k, hv := c.Seek(prefix); id == nil && k != nil && bytes.HasPrefix(k, prefix); k, hv = c.Next() {
		if h, err := lease.DecodeStoredHistoryAt(hv, lockKey); err == nil {
			t := h.Record.Identity()
			id = &t
		}
	}
	if id == nil {
		return nil, false, false
	}
	s, ok := lease.ExpandEvidence(string(v), *id)
	return []byte(s), true, ok
}

// referredRecordIn is the record under lockKey of the lease version 3
// evidence raw names, read from tx alone (the active record, else a
// history entry's), or nil.
func referredRecordIn(tx *bbolt.Tx, lockKey, raw string) *lease.Record {
	id, ok := lease.ReferredLeaseID(raw)
	if !ok {
		return nil
	}
	ident := tx.Bucket(bucketIdent)
	if r, err := lease.DecodeStoredRecord(ident.Get(activeKey(lockKey))); err == nil && r.LeaseID == id {
		return r
	}
	prefix := historyPrefix(lockKey)
	c := ident.Cursor()
	for k, hv := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, hv = c.Next() {
		if h, err := lease.DecodeStoredHistoryAt(hv, lockKey); err == nil && h.Record.LeaseID == id {
			return h.Record
		}
	}
	return nil
}

// leanRecordIn is the record under lockKey of the lease version 4
// evidence raw names by its token, read from tx alone (the active record,
// else a history entry's, then with its ended_at), or nil.
func leanRecordIn(tx *bbolt.Tx, lockKey, raw string) (*lease.Record, lease.Timestamp) {
	_, token, ok := lease.LeanEvidenceToken(raw)
	if !ok {
		return nil, lease.Timestamp{}
	}
	ident := tx.Bucket(bucketIdent)
	if r, err := lease.DecodeStoredRecord(ident.Get(activeKey(lockKey))); err == nil && r.FencingToken == token {
		return r, lease.Timestamp{}
	}
	prefix := historyPrefix(lockKey)
	c := ident.Cursor()
	for k, hv := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, hv = c.Next() {
		if h, err := lease.DecodeStoredHistoryAt(hv, lockKey); err == nil && h.Record.FencingToken == token {
			return h.Record, h.EndedAt
		}
	}
	return nil, lease.Timestamp{}
}

// asVersion2 is stored evidence v of lockKey in version 2: version 3 or 4
// rewritten as the store detaches it (lease.ReferredEvidence or
// lease.LeanReferredEvidence, then lease.CompactEvidence) with the record
// of its lease, anything else as it is. Tests of version 2 evidence take
// an acquisition's this way.
func asVersion2(t *testing.T, tx *bbolt.Tx, lockKey string, v []byte) []byte {
	t.Helper()
	if bytes.HasPrefix(v, []byte(lease.EvidenceLeanPrefix)) {
		rec, endedAt := leanRecordIn(tx, lockKey, string(v))
		ev, ok := lease.LeanReferredEvidence(string(v), rec, endedAt)
		if !ok {
			t.Fatalf("version 4 evidence does not rebuild: %q", v)
		}
		b, err := lease.CompactEvidence(ev, rec.Identity())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.HasPrefix(v, []byte(lease.EvidenceRefPrefix)) {
		return v
	}
	rec := referredRecordIn(tx, lockKey, string(v))
	ev, ok := lease.ReferredEvidence(string(v), rec)
	if !ok {
		t.Fatalf("version 3 evidence does not rebuild: %q", v)
	}
	b, err := lease.CompactEvidence(ev, rec.Identity())
	if err != nil {
		t.Fatal(err)
	}
	return b
}
