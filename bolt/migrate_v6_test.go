package bolt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// v6Key is the schema 6 form of ident key k: the lock key and the
// idempotency scope as text, a 0 after the lock key.
func v6Key(k []byte) []byte {
	lockKey, kind, ok := splitIdentKey(k)
	if !ok || kind == kindHistoryCount { // schema 9's, which no older file holds
		return nil
	}
	rest := k[packedLen+1:]
	if kind == kindIdem {
		rest = []byte(base64.RawURLEncoding.EncodeToString(rest))
	}
	return v6IdentKey(lockKey, kind, string(rest))
}

// asSchema rewrites tx's store from this layout to schema 6's, as the
// schema 6 code wrote it (the inverse of migrateV6), and marks it
// version: a test builds a state with today's code, then makes it an
// older file.
func asSchema(tx *bbolt.Tx, version string) error {
	if err := rewriteBucket(tx, bucketIdent, func(k, v []byte) ([]byte, []byte, error) { return v6Key(k), v, nil }); err != nil {
		return err
	}
	for _, b := range [][]byte{bucketIdemExp, bucketHistoryExp} {
		if err := rewriteIndex(tx, b, v6Key); err != nil {
			return err
		}
	}
	if err := unpackLookups(tx); err != nil {
		return err
	}
	return tx.Bucket(bucketMeta).Put(keySchema, []byte(version))
}

// unpackLookups gives the List index, the lease-id lookups and the
// active-expiry index their lock keys as text, as schemas 2 to 6 stored
// them.
func unpackLookups(tx *bbolt.Tx) error {
	if err := rewriteBucket(tx, bucketIndex, func(k, _ []byte) ([]byte, []byte, error) {
		lockKey, _ := leaseLockKey(readView(tx).Bucket(bucketLeases), string(k[bytes.LastIndexByte(k, 0)+1:]))
		return k, []byte(lockKey), nil
	}); err != nil {
		return err
	}
	if err := rewriteBucket(tx, bucketLeases, func(k, v []byte) ([]byte, []byte, error) {
		return k, append(append([]byte(unpackLockKey(v[:packedLen])), 0), v[packedLen:]...), nil
	}); err != nil {
		return err
	}
	return rewriteIndex(tx, bucketActiveExp, func(packed []byte) []byte { return []byte(unpackLockKey(packed)) })
}

// schema6Fixture is testdata/schema6.db, written by the schema 6 code at a
// fixed clock: A released A1, then holds A2 (renewed); B1 is held by
// another owner in another program; C1 expired and was archived by C2's
// acquisition, and C2 was released.
type schema6Fixture struct {
	A1, A1Released, A2, A2Renewed, B1, C1, C2, C2Released *lease.Record
	ClockAfter                                            time.Time `json:"clock_after"`
}

func (f *schema6Fixture) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for name, p := range map[string]**lease.Record{"a1": &f.A1, "a1_released": &f.A1Released, "a2": &f.A2,
		"a2_renewed": &f.A2Renewed, "b1": &f.B1, "c1": &f.C1, "c2": &f.C2, "c2_released": &f.C2Released} {
		*p = new(lease.Record)
		if err := json.Unmarshal(m[name], *p); err != nil {
			return err
		}
	}
	return json.Unmarshal(m["clock_after"], &f.ClockAfter)
}

func openSchema6Fixture(t *testing.T) (string, schema6Fixture) {
	t.Helper()
	var fx schema6Fixture
	path := openFixture(t, "schema6", &fx)
	return path, fx
}

// layoutOf copies the buckets migrateV6 rewrites, with their sequences.
func layoutOf(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	if err := db.View(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{bucketIdent, bucketIdemExp, bucketHistoryExp, bucketActiveExp, bucketLeases, bucketIndex} {
			b := tx.Bucket(name)
			m := map[string]string{"\xffsequence": string(u64(b.Sequence()))}
			if err := b.ForEach(func(k, v []byte) error { m[string(k)] = string(v); return nil }); err != nil {
				return err
			}
			out[string(name)] = m
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// A file written by the schema 6 code opens as schema 7 with every key
// packed, and every fact where a request finds it: replays and lookups
// answer from their evidence, a changed retry conflicts, inspect by lease
// id finds active and ended leases, List finds the active ones through
// index entries that no longer hold a lock key, counters continue,
// history pages keep their entries, and the time indexes still expire
// leases, evidence and history.
func TestSchemaV6FixtureMigrates(t *testing.T) {
	ctx := context.Background()
	path, fx := openSchema6Fixture(t)
	before := layoutOf(t, path)
	if n := len(before[string(bucketIdent)]); n < 15 {
		t.Fatalf("fixture has %d ident entries, want the 15 its story wrote", n)
	}
	c := &clock{t: fx.ClockAfter.Add(time.Second)}
	s, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer s.Close()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if v := string(tx.Bucket(bucketMeta).Get(keySchema)); v != schemaVersion {
			t.Errorf("schema after open: %q", v)
		}
		for _, name := range [][]byte{bucketIdent, bucketIdemExp, bucketHistoryExp, bucketActiveExp, bucketLeases, bucketIndex} {
			if err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				if bytes.Contains(k, []byte(lease.KeyPrefix)) || bytes.Contains(v, []byte(lease.KeyPrefix)) {
					t.Errorf("%s still holds a lock key as text: %q → %q", name, k, v)
				}
				if bytes.Equal(name, bucketIndex) && len(v) != 0 {
					t.Errorf("index entry %q keeps a value %q", k, v)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mut := func(reqID string, r *lease.Record) lease.Mutation {
		return lease.Mutation{RequestID: reqID, DeadlineAt: far, Caller: callerOfRecord(r)}
	}
	acq := func(r *lease.Record, reqID string, ttl time.Duration) (lease.Result, error) {
		req := acquireReq(reqID, ttl, far)
		req.Identity, req.Caller = r.Identity(), callerOfRecord(r)
		return s.Acquire(ctx, req)
	}
	for _, w := range []struct {
		rec   *lease.Record
		reqID string
		ttl   time.Duration
	}{{fx.A1, "acq-a1", time.Hour}, {fx.A2, "acq-a2", time.Hour}, {fx.B1, "acq-b1", time.Hour}, {fx.C1, "acq-c1", 10 * time.Second}, {fx.C2, "acq-c2", time.Hour}} {
		r, err := acq(w.rec, w.reqID, w.ttl)
		if err != nil || !r.Replayed || r.Lease.LeaseID != w.rec.LeaseID || r.Lease.FencingToken != w.rec.FencingToken ||
			r.Lease.ExpiresAt != w.rec.ExpiresAt {
			t.Fatalf("replay of %s: %v %+v, want %+v", w.reqID, err, r.Lease, w.rec)
		}
	}
	if _, err := acq(fx.A2, "acq-a2", 2*time.Hour); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("changed retry of acq-a2: %v, want idempotency_conflict", err)
	}
	rel, err := s.Release(ctx, lease.ReleaseRequest{Identity: fx.A1.Identity(), LeaseID: fx.A1.LeaseID, FencingToken: 1,
		ServiceInstanceID: fx.A1.ServiceInstanceID, Mutation: mut("rel-a1", fx.A1)})
	if err != nil || !rel.Replayed || rel.Code != lease.CodeReleased || rel.Lease.State != lease.StateReleased {
		t.Fatalf("replay of rel-a1: %v %+v", err, rel)
	}
	lk, err := s.LookupRequest(ctx, lease.LookupRequest{Op: lease.OpRenew, Identity: fx.A2.Identity(), RequestID: "ren-a2",
		PrincipalID: fx.A2.OwnerPrincipalID, DeadlineAt: far})
	if err != nil || lk.Code != lease.CodeRenewed || lk.Lease.ExpiresAt != fx.A2Renewed.ExpiresAt {
		t.Fatalf("lookup of ren-a2: %v %+v", err, lk)
	}

	// Inspect by lease id: active, released, expired.
	for _, w := range []struct {
		id    string
		state lease.State
		exp   lease.Timestamp
	}{{fx.A2.LeaseID, lease.StateActive, fx.A2Renewed.ExpiresAt}, {fx.A1.LeaseID, lease.StateReleased, fx.A1Released.ExpiresAt},
		{fx.C1.LeaseID, lease.StateExpired, fx.C1.ExpiresAt}, {fx.C2.LeaseID, lease.StateReleased, fx.C2Released.ExpiresAt}} {
		in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: w.id, DeadlineAt: far})
		if err != nil || in.Lease.LeaseID != w.id || in.Lease.State != w.state || in.Lease.ExpiresAt != w.exp {
			t.Fatalf("inspect %s: %v %+v, want %s", w.id, err, in.Lease, w.state)
		}
	}

	// List: each filter finds exactly its active leases.
	list := func(req lease.ListRequest) []string {
		req.DeadlineAt = far
		res, err := s.List(ctx, req)
		if err != nil {
			t.Fatalf("list %+v: %v", req, err)
		}
		var ids []string
		for _, r := range res.Leases {
			ids = append(ids, r.LeaseID)
		}
		return ids
	}
	a, b := fx.A2, fx.B1
	for _, w := range []struct {
		req  lease.ListRequest
		want []string
	}{
		{lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-actor"}, []string{a.LeaseID}},
		{lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: "prn-other"}, []string{b.LeaseID}},
		{lease.ListRequest{By: lease.ListByProgram, TenantID: b.TenantID, ProgramID: b.ProgramID}, []string{b.LeaseID}},
		{lease.ListRequest{By: lease.ListByTarget, TenantID: a.TenantID, ProgramID: a.ProgramID, TargetNamespace: a.TargetNamespace,
			TargetID: a.TargetID}, []string{a.LeaseID}},
		{lease.ListRequest{By: lease.ListByTarget, TenantID: fx.C2.TenantID, ProgramID: fx.C2.ProgramID,
			TargetNamespace: fx.C2.TargetNamespace, TargetID: fx.C2.TargetID}, nil},
	} {
		if got := list(w.req); strings.Join(got, ",") != strings.Join(w.want, ",") {
			t.Fatalf("list %+v: %v, want %v", w.req, got, w.want)
		}
	}

	// History, newest first; counters continue.
	hc, err := s.History(ctx, lease.HistoryRequest{Identity: fx.C1.Identity(), DeadlineAt: far})
	if err != nil || len(hc.Entries) != 2 || hc.Entries[0].Record.LeaseID != fx.C2.LeaseID ||
		hc.Entries[1].Record.LeaseID != fx.C1.LeaseID || hc.Entries[1].Record.State != lease.StateExpired {
		t.Fatalf("history of C: %v %+v", err, hc)
	}
	if r, err := acq(fx.C1, "acq-c3", time.Hour); err != nil || r.Lease.FencingToken != 3 {
		t.Fatalf("acquire after migration: %v %+v, want token 3", err, r.Lease)
	}
	if _, err := acq(fx.A1, "acq-a3", time.Hour); code(err) != lease.CodeConflict {
		t.Fatalf("acquire over the migrated active lease: %v, want conflict", err)
	}

	// The time indexes name the packed keys: A2 and B1 expire through the
	// reaper, then evidence and history go at their retention.
	c.Add(3 * time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*lease.Record{fx.A2, fx.B1} {
		in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: r.LeaseID, DeadlineAt: far})
		if err != nil || in.Lease.State != lease.StateExpired {
			t.Fatalf("%s after the reaper: %v %+v", r.LeaseID, err, in.Lease)
		}
	}
	if got := kindLen(t, s, kindActive); got != 0 {
		t.Fatalf("active records after every expiry: %d, want 0", got)
	}
	c.Add(lease.DefaultIdempotencyRetention + time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupRequest(ctx, lease.LookupRequest{Op: lease.OpAcquire, Identity: fx.A1.Identity(), RequestID: "acq-a1",
		PrincipalID: fx.A1.OwnerPrincipalID, DeadlineAt: far}); code(err) != lease.CodeNotFound {
		t.Fatalf("migrated evidence past retention: %v, want not_found", err)
	}
	if got := kindLen(t, s, kindIdem); got != 0 {
		t.Fatalf("evidence left past retention: %d", got)
	}
	checkRetiredPastHistoryRetention(t, s, c, [][]byte{bucketHistoryExp, bucketIdemExp, bucketActiveExp, bucketLeases, bucketIndex}, 3)
}

// The migration loses nothing: packing the fixture and writing it back in
// the schema 6 layout (asSchema, which the other old-schema tests use to
// build their files) gives the fixture's buckets byte for byte, sequences
// included.
func TestSchemaV6MigrationIsLossless(t *testing.T) {
	path, fx := openSchema6Fixture(t)
	want := layoutOf(t, path)
	c := &clock{t: fx.ClockAfter.Add(time.Second)}
	s, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	packed := 0
	if err := s.db.View(func(tx *bbolt.Tx) error {
		packed = tx.Bucket(bucketIdent).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return asSchema(tx, schemaVersionV6) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	got := layoutOf(t, path)
	if packed != len(want[string(bucketIdent)])-1 {
		t.Fatalf("ident entries: %d after migration, %d before", packed, len(want[string(bucketIdent)])-1)
	}
	for name, entries := range want {
		for k, v := range entries {
			if gv, ok := got[name][k]; !ok || gv != v {
				t.Errorf("%s[%q]: %q (present %v), want %q", name, k, gv, ok, v)
			}
		}
		if len(got[name]) != len(entries) {
			t.Errorf("%s: %d entries, want %d", name, len(got[name]), len(entries))
		}
	}
}

// A schema 6 file with a key of no schema 6 shape is refused as corrupt,
// and left as it was: still schema 6, every key in place.
func TestSchemaV6MigrationRefusesAMalformedKey(t *testing.T) {
	for name, bad := range map[string]struct{ bucket, k, v []byte }{
		"ident key without a lock key": {bucketIdent, []byte("not-a-lock-key\x00a"), []byte("x")},
		"scope that is no digest":      {bucketIdent, v6IdentKey(testLockKey(t), kindIdem, "short"), []byte("x")},
		"unknown kind":                 {bucketIdent, v6IdentKey(testLockKey(t), 'z', ""), []byte("x")},
		"lookup without a lock key":    {bucketLeases, []byte("lease_x"), []byte("active\x000")},
	} {
		t.Run(name, func(t *testing.T) {
			path, _ := openSchema6Fixture(t)
			db, err := bbolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bad.bucket).Put(bad.k, bad.v) }); err != nil {
				t.Fatal(err)
			}
			db.Close()
			want := layoutOf(t, path)
			if _, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
				t.Fatalf("open: %v, want corrupt", err)
			}
			got := layoutOf(t, path)
			for b, entries := range want {
				if len(got[b]) != len(entries) {
					t.Fatalf("%s changed: %d entries, want %d", b, len(got[b]), len(entries))
				}
				for k, v := range entries {
					if got[b][k] != v {
						t.Fatalf("%s[%q] changed", b, k)
					}
				}
			}
			db, err = bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			_ = db.View(func(tx *bbolt.Tx) error {
				if v := string(tx.Bucket(bucketMeta).Get(keySchema)); v != schemaVersionV6 {
					t.Errorf("schema after the refusal: %q", v)
				}
				return nil
			})
		})
	}
}

func testLockKey(t *testing.T) string {
	t.Helper()
	_, k, err := lease.CanonicalLockKey(testIdentity, leasetest.StoreOptions().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
