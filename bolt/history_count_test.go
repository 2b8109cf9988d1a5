package bolt

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// storedHistoryCount is lockKey's history count; ok is false when it has
// none.
func storedHistoryCount(t *testing.T, s *Store, lockKey string) (n uint64, ok bool) {
	t.Helper()
	_, n, ok = storedHistory(t, s, lockKey)
	return n, ok
}

// historyLeaseIDs are the lease ids of lockKey's history entries, oldest
// first.
func historyLeaseIDs(t *testing.T, s *Store, lockKey string) []string {
	t.Helper()
	ids, _, _ := storedHistory(t, s, lockKey)
	return ids
}

// setHistoryCount writes lockKey's count entry as raw bytes (nil deletes
// it), as damage or a schema 8 file would leave it.
func setHistoryCount(t *testing.T, s *Store, lockKey string, v []byte) {
	t.Helper()
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		if v == nil {
			return tx.Bucket(bucketIdent).Delete(historyCountKey(lockKey))
		}
		return tx.Bucket(bucketIdent).Put(historyCountKey(lockKey), v)
	}); err != nil {
		t.Fatal(err)
	}
}

// The count an identity keeps equals its history entries after every
// archive (release, revoke, expiry) and every retention drop, trimming
// keeps exactly the newest HistoryPerIdentity by lease id, and an
// identity whose last entry goes keeps no count. Two identities are
// interleaved so a count is never another's.
func TestHistoryCountFollowsEntries(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity, o.HistoryRetention = 3, time.Hour
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	ended := map[string][]string{} // lock key → lease ids, oldest first
	check := func(lockKey, when string) {
		t.Helper()
		ids := historyLeaseIDs(t, s, lockKey)
		want := ended[lockKey][max(0, len(ended[lockKey])-3):]
		if !slices.Equal(ids, want) {
			t.Fatalf("%s: history %v, want the newest three %v", when, ids, want)
		}
		n, ok := storedHistoryCount(t, s, lockKey)
		if ok != (len(ids) > 0) || n != uint64(len(ids)) {
			t.Fatalf("%s: count %d (stored %v) for %d entries", when, n, ok, len(ids))
		}
	}
	for i := 0; i < 7; i++ {
		for id := 0; id < 2; id++ {
			a := rhAcquire(t, s, fmt.Sprintf("acq-%d-%d", id, i), fmt.Sprintf("count-%d", id), nil)
			c.Add(time.Second)
			switch i % 3 {
			case 0:
				rhRelease(t, s, fmt.Sprintf("rel-%d-%d", id, i), a.Lease)
			case 1:
				if _, err := s.Revoke(ctx, rhAdminReq(fmt.Sprintf("rev-%d-%d", id, i), a.Lease, "count", "inc-1")); err != nil {
					t.Fatal(err)
				}
			default:
				c.Add(2 * time.Minute)
				if err := s.reap(ctx); err != nil {
					t.Fatal(err)
				}
			}
			ended[a.Lease.LockKey] = append(ended[a.Lease.LockKey], a.Lease.LeaseID)
			check(a.Lease.LockKey, fmt.Sprintf("after ending lease %d of identity %d", i, id))
		}
	}
	// Retention drops the kept entries one by one, oldest first (they
	// ended minutes apart); each drop takes one off the count, and the
	// last takes the count with it.
	c.Add(time.Hour - 6*time.Minute)
	sizes := map[int]bool{}
	for step := 0; step < 30; step++ {
		c.Add(30 * time.Second)
		if err := s.reap(ctx); err != nil {
			t.Fatal(err)
		}
		for lockKey, all := range ended {
			ids := historyLeaseIDs(t, s, lockKey)
			sizes[len(ids)] = true
			if !slices.Equal(ids, all[len(all)-len(ids):]) {
				t.Fatalf("retention step %d: history %v is not the newest of %v", step, ids, all)
			}
			n, ok := storedHistoryCount(t, s, lockKey)
			if ok != (len(ids) > 0) || n != uint64(len(ids)) {
				t.Fatalf("retention step %d: count %d (stored %v) for %d entries", step, n, ok, len(ids))
			}
		}
	}
	if !sizes[1] || !sizes[2] || !sizes[0] {
		t.Fatalf("retention went through history sizes %v, want 2, 1 and 0 among them", sizes)
	}
	for lockKey := range ended {
		if ids := historyLeaseIDs(t, s, lockKey); len(ids) != 0 {
			t.Fatalf("history %v left after retention", ids)
		}
		if _, ok := storedHistoryCount(t, s, lockKey); ok {
			t.Fatal("an identity without history keeps a count")
		}
	}
	// The next archive counts from nothing again.
	a := rhAcquire(t, s, "acq-again", "count-0", nil)
	rhRelease(t, s, "rel-again", a.Lease)
	ended[a.Lease.LockKey] = []string{a.Lease.LeaseID}
	check(a.Lease.LockKey, "after ending a lease once history was empty")
}

// A file of schema 8 has no counts: it opens as schema 9, and an
// identity's first archive counts its entries, trimming all that are over
// the bound at once (here the bound is lower than when they were written).
func TestHistoryCountMadeForSchema8File(t *testing.T) {
	path := t.TempDir() + "/leases.db"
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 10
	s, err := Open(path, Options{StoreOptions: o, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	var lockKey string
	for i := 0; i < 6; i++ {
		a := rhAcquire(t, s, fmt.Sprintf("acq-%d", i), "schema8", nil)
		rhRelease(t, s, fmt.Sprintf("rel-%d", i), a.Lease)
		ids, lockKey = append(ids, a.Lease.LeaseID), a.Lease.LockKey
	}
	if n, _ := storedHistoryCount(t, s, lockKey); n != 6 {
		t.Fatalf("count %d after 6 ends", n)
	}
	setHistoryCount(t, s, lockKey, nil)
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV8)) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	o.HistoryPerIdentity = 2
	s, err = Open(path, Options{StoreOptions: o, ReapInterval: -1})
	if err != nil {
		t.Fatalf("a schema 8 file does not open: %v", err)
	}
	defer s.Close()
	if v := storedSchema(t, s.db); v != schemaVersion {
		t.Errorf("schema %q after open, want %q", v, schemaVersion)
	}
	if got := historyLeaseIDs(t, s, lockKey); !slices.Equal(got, ids) {
		t.Fatalf("migration changed the history: %v, want %v", got, ids)
	}
	a := rhAcquire(t, s, "acq-after", "schema8", nil)
	rhRelease(t, s, "rel-after", a.Lease)
	want := []string{ids[5], a.Lease.LeaseID}
	if got := historyLeaseIDs(t, s, lockKey); !slices.Equal(got, want) {
		t.Fatalf("history %v after the first archive, want %v", got, want)
	}
	if n, ok := storedHistoryCount(t, s, lockKey); !ok || n != 2 {
		t.Fatalf("count %d (stored %v), want 2", n, ok)
	}
	// What trimming dropped is gone for Inspect too.
	if _, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: ids[0], DeadlineAt: rhFar}); code(err) != lease.CodeNotFound {
		t.Fatalf("trimmed lease: %v, want not_found", err)
	}
}

// A damaged count: a malformed one is counted again; one above the
// entries never drops the entry being written, and is corrected.
func TestHistoryCountDamage(t *testing.T) {
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 3
	s := openTemp(t, Options{StoreOptions: o, ReapInterval: -1})
	end := func(i int) *lease.Record {
		a := rhAcquire(t, s, fmt.Sprintf("acq-%d", i), "damage", nil)
		rhRelease(t, s, fmt.Sprintf("rel-%d", i), a.Lease)
		return a.Lease
	}
	var ids []string
	var lockKey string
	for i := 0; i < 3; i++ {
		r := end(i)
		ids, lockKey = append(ids, r.LeaseID), r.LockKey
	}

	setHistoryCount(t, s, lockKey, []byte{1, 2, 3})
	r := end(3)
	ids = append(ids[1:], r.LeaseID)
	if got := historyLeaseIDs(t, s, lockKey); !slices.Equal(got, ids) {
		t.Fatalf("malformed count: history %v, want %v", got, ids)
	}
	if n, ok := storedHistoryCount(t, s, lockKey); !ok || n != 3 {
		t.Fatalf("malformed count: now %d (stored %v), want 3", n, ok)
	}

	setHistoryCount(t, s, lockKey, u64(1000))
	r = end(4)
	if got := historyLeaseIDs(t, s, lockKey); !slices.Equal(got, []string{r.LeaseID}) {
		t.Fatalf("count above the entries: history %v, want only the entry written %s", got, r.LeaseID)
	}
	if n, ok := storedHistoryCount(t, s, lockKey); !ok || n != 1 {
		t.Fatalf("count above the entries: now %d (stored %v), want 1", n, ok)
	}
}
