package bolt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// downgradeToV2 rewrites the closed schema 3 file at path in the schema 2
// layout, as the schema 2 code wrote it: one bucket per kind, history keys
// lock key ‖ 0 ‖ seq, evidence keyed by scope alone, the time indexes
// naming those keys. It lets a test build any state with today's code and
// then migrate it.
func downgradeToV2(t *testing.T, path string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error {
		legacy := map[byte]*bbolt.Bucket{}
		for kind, name := range map[byte][]byte{kindActive: legacyActive, kindCounter: legacyCounters, kindHistory: legacyHistory, kindIdem: legacyIdem} {
			b, err := tx.CreateBucket(name)
			if err != nil {
				return err
			}
			legacy[kind] = b
		}
		if err := unpackLookups(tx); err != nil {
			return err
		}
		ident := tx.Bucket(bucketIdent)
		oldKey := func(k []byte) []byte {
			lockKey, kind, _ := splitIdentKey(k)
			rest := k[packedLen+1:]
			switch kind {
			case kindHistory:
				return append(join(lockKey, ""), rest...)
			case kindIdem:
				return []byte(base64.RawURLEncoding.EncodeToString(rest))
			}
			return []byte(lockKey)
		}
		if err := ident.ForEach(func(k, v []byte) error {
			lockKey, kind, _ := splitIdentKey(k)
			switch kind { // schema 2 builds wrote version 1 records, evidence and history
			case kindHistoryCount: // schema 9's
				return nil
			case kindActive:
				v1, ok := lease.ExpandRecord(string(v))
				if !ok {
					return fmt.Errorf("active record of %s does not expand", lockKey)
				}
				v = []byte(v1)
			case kindIdem:
				v1, _, ok := v1Evidence(tx, lockKey, v)
				if !ok {
					return fmt.Errorf("evidence of %s does not expand", lockKey)
				}
				v = v1
			case kindHistory:
				v1, ok := lease.ExpandHistoryAt(string(v), lockKey)
				if !ok {
					return fmt.Errorf("history of %s does not expand", lockKey)
				}
				v = []byte(v1)
			}
			return legacy[kind].Put(oldKey(k), v)
		}); err != nil {
			return err
		}
		if err := legacy[kindHistory].SetSequence(ident.Sequence()); err != nil {
			return err
		}
		for _, b := range [][]byte{bucketHistoryExp, bucketIdemExp} {
			if err := rewriteIndex(tx, b, oldKey); err != nil {
				return err
			}
		}
		if err := tx.DeleteBucket(bucketIdent); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV2))
	}); err != nil {
		t.Fatal(err)
	}
}

// schema2Fixture is testdata/schema2.db, written by the schema 2 code
// (before the ident bucket) at a fixed clock, and what it holds.
type schema2Fixture struct {
	A1, A2, B1, C1     *lease.Record
	B1RenewedExpiresAt lease.Timestamp `json:"b1_renewed_expires_at"`
	ClockAfter         time.Time       `json:"clock_after"`
}

// openFixture decodes testdata/name.json into fx and returns a temporary
// copy of testdata/name.db, the store file it describes.
func openFixture(t *testing.T, name string, fx any) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err == nil {
		err = json.Unmarshal(raw, fx)
	}
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(filepath.Join("testdata", name+".db"))
	if err != nil {
		t.Fatal(err)
	}
	return tempStoreFile(t, db)
}

// tempStoreFile writes the store file raw to a temporary directory.
func tempStoreFile(t *testing.T, raw []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leases.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func openSchema2Fixture(t *testing.T, edit func(*bbolt.Tx) error) (string, schema2Fixture) {
	t.Helper()
	var fx schema2Fixture
	path := openFixture(t, "schema2", &fx)
	if edit != nil {
		d, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Update(edit); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	return path, fx
}

// A store file written by the schema 2 code opens as schema 3 with every
// fact where a request finds it: replays answer from their evidence (and a
// changed retry conflicts), counters continue, history pages keep their
// order and their entries, lookups by lease id and by request id answer,
// and the time indexes (rewritten to the new keys) still expire leases,
// evidence and history.
func TestSchemaV2FixtureMigrates(t *testing.T) {
	for _, from := range []string{schemaVersionV2, schemaVersionV1} {
		t.Run("schema"+from, func(t *testing.T) {
			path, fx := openSchema2Fixture(t, func(tx *bbolt.Tx) error {
				if from != schemaVersionV1 {
					return nil
				}
				for _, b := range [][]byte{bucketActiveExp, bucketHistoryExp} {
					if err := tx.DeleteBucket(b); err != nil {
						return err
					}
				}
				return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV1))
			})
			checkMigratedFixture(t, path, fx)
		})
	}
}

func checkMigratedFixture(t *testing.T, path string, fx schema2Fixture) {
	ctx := context.Background()
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
		for _, b := range [][]byte{legacyActive, legacyCounters, legacyHistory, legacyIdem} {
			if tx.Bucket(b) != nil {
				t.Errorf("schema 2 bucket %s left behind", b)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	idA, idB, idC := fx.A1.Identity(), fx.B1.Identity(), fx.C1.Identity()

	// Replays, each from its evidence.
	acq := func(id lease.Identity, reqID string, ttl time.Duration) (lease.Result, error) {
		r := acquireReq(reqID, ttl, far)
		r.Identity = id
		return s.Acquire(ctx, r)
	}
	r, err := acq(idA, "acq-a1", time.Hour)
	if err != nil || !r.Replayed || r.Lease.LeaseID != fx.A1.LeaseID || r.Lease.FencingToken != 1 ||
		r.Current == nil || r.Current.State != lease.StateReleased {
		t.Fatalf("replay of acq-a1: %v %+v", err, r)
	}
	if r, err = acq(idA, "acq-a2", time.Hour); err != nil || !r.Replayed || r.Lease.LeaseID != fx.A2.LeaseID || r.Lease.FencingToken != 2 {
		t.Fatalf("replay of acq-a2: %v %+v", err, r)
	}
	if _, err = acq(idA, "acq-a2", 2*time.Hour); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("changed retry of acq-a2: %v, want idempotency_conflict", err)
	}
	rel, err := s.Release(ctx, lease.ReleaseRequest{Identity: idA, LeaseID: fx.A1.LeaseID, FencingToken: 1,
		ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: "rel-a1", DeadlineAt: far, Caller: callerOfRecord(fx.A1)}})
	if err != nil || !rel.Replayed || rel.Code != lease.CodeReleased {
		t.Fatalf("replay of rel-a1: %v %+v", err, rel)
	}
	lk, err := s.LookupRequest(ctx, lease.LookupRequest{Op: lease.OpRenew, Identity: idB, RequestID: "ren-b1",
		PrincipalID: fx.B1.OwnerPrincipalID, DeadlineAt: far})
	if err != nil || lk.Code != lease.CodeRenewed || lk.Lease.ExpiresAt != fx.B1RenewedExpiresAt {
		t.Fatalf("lookup of ren-b1: %v %+v", err, lk)
	}

	// The counter continues: A's next lease is token 3.
	if _, err = acq(idA, "acq-a3", time.Hour); code(err) != lease.CodeConflict {
		t.Fatalf("acquire over the migrated active lease: %v, want conflict", err)
	}
	if _, err = s.Release(ctx, lease.ReleaseRequest{Identity: idA, LeaseID: fx.A2.LeaseID, FencingToken: 2,
		ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: "rel-a2", DeadlineAt: far, Caller: callerOfRecord(fx.A2)}}); err != nil {
		t.Fatalf("release of the migrated active lease: %v", err)
	}
	if r, err = acq(idA, "acq-a3", time.Hour); err != nil || r.Lease.FencingToken != 3 {
		t.Fatalf("acquire after migration: %v %+v, want token 3", err, r.Lease)
	}

	// History: newest first, the migrated entries after the new one, and
	// a page token continuing across them.
	h, err := s.History(ctx, lease.HistoryRequest{Identity: idA, PageSize: 1, DeadlineAt: far})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != fx.A2.LeaseID || h.NextPageToken == "" {
		t.Fatalf("history page 1 of A: %v %+v", err, h)
	}
	h, err = s.History(ctx, lease.HistoryRequest{Identity: idA, PageSize: 5, PageToken: h.NextPageToken, DeadlineAt: far})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != fx.A1.LeaseID || h.Entries[0].Record.State != lease.StateReleased {
		t.Fatalf("history page 2 of A: %v %+v", err, h)
	}
	hc, err := s.History(ctx, lease.HistoryRequest{Identity: idC, DeadlineAt: far})
	if err != nil || len(hc.Entries) != 1 || hc.Entries[0].Record.State != lease.StateRevoked ||
		hc.Entries[0].Reason != "fixture revoke" || hc.Entries[0].IncidentID != "inc-1" {
		t.Fatalf("history of C: %v %+v", err, hc)
	}
	in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: fx.C1.LeaseID, DeadlineAt: far})
	if err != nil || in.Lease.State != lease.StateRevoked {
		t.Fatalf("inspect of C by lease id: %v %+v", err, in.Lease)
	}

	// The time indexes name the new keys: B expires through the reaper,
	// then evidence and history go at their retention.
	c.Add(3 * time.Minute)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if got := kindLen(t, s, kindActive); got != 1 { // A's new lease only
		t.Fatalf("active records after B's expiry: %d, want 1", got)
	}
	in, err = s.Inspect(ctx, lease.InspectRequest{LeaseID: fx.B1.LeaseID, DeadlineAt: far})
	if err != nil || in.Lease.State != lease.StateExpired {
		t.Fatalf("B after the reaper: %v %+v", err, in.Lease)
	}
	c.Add(lease.DefaultIdempotencyRetention + time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupRequest(ctx, lease.LookupRequest{Op: lease.OpAcquire, Identity: idA, RequestID: "acq-a1",
		PrincipalID: fx.A1.OwnerPrincipalID, DeadlineAt: far}); code(err) != lease.CodeNotFound {
		t.Fatalf("migrated evidence past retention: %v, want not_found", err)
	}
	if got := kindLen(t, s, kindIdem); got != 0 {
		t.Fatalf("evidence left past retention: %d", got)
	}
	checkRetiredPastHistoryRetention(t, s, c, [][]byte{bucketHistoryExp, bucketIdemExp}, 3)
}

// checkRetiredPastHistoryRetention runs the reaper once history retention
// has passed and checks that of what leases left only the counters (want
// of them, never reclaimed) remain, and no entry of the buckets.
func checkRetiredPastHistoryRetention(t *testing.T, s *Store, c *clock, buckets [][]byte, counters int) {
	t.Helper()
	c.Add(lease.DefaultHistoryRetention)
	if err := s.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, b := range buckets {
		if got := bucketLen(t, s, b); got != 0 {
			t.Fatalf("%s entries left past retention: %d", b, got)
		}
	}
	if got := kindLen(t, s, kindHistory); got != 0 {
		t.Fatalf("history entries left past retention: %d", got)
	}
	if got := kindLen(t, s, kindCounter); got != counters {
		t.Fatalf("counters: %d, want %d (never reclaimed)", got, counters)
	}
}

// Evidence that does not decode has no lock key to be placed under: the
// migration refuses the file, as corrupt, and leaves it as it was.
func TestSchemaV2MigrationRefusesCorruptEvidence(t *testing.T) {
	path, _ := openSchema2Fixture(t, func(tx *bbolt.Tx) error {
		b := tx.Bucket(legacyIdem)
		k, _ := b.Cursor().First()
		return b.Put(bytes.Clone(k), []byte(`{"idempotency_version":1}`))
	})
	if _, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("open: %v, want corrupt", err)
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bbolt.Tx) error {
		if v := string(tx.Bucket(bucketMeta).Get(keySchema)); v != schemaVersionV2 {
			t.Errorf("schema after the refused migration: %q", v)
		}
		if tx.Bucket(legacyIdem) == nil || tx.Bucket(legacyActive).Stats().KeyN != 2 {
			t.Error("the refused migration changed the file")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
