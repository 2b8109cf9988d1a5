package bolt

// Review rv2 (commit 5617523): attacks on version 2 active records in the
// store — splicing, the reaper, backup / restore / recovery of schema 5
// and 6, reads through the memo, concurrency.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// rvAcquire acquires target with hostile metadata and a non-ASCII tuple.
func rvAcquire(t *testing.T, s *Store, target string, ttl time.Duration, far time.Time) *lease.Record {
	t.Helper()
	req := acquireReq("acq-"+target, ttl, far)
	req.Identity.TargetID = target
	req.Identity.ActorName = "akteur-é"
	req.Metadata = lease.Metadata{"source": "scan \"7\" <&> é \u2028", "depth": 2.5, "ok": true, "none": nil}
	res, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("acquire %s: %v", target, err)
	}
	if v := storedActive(t, s, res.Lease.LockKey); !strings.HasPrefix(string(v), lease.RecordV2Prefix) {
		t.Fatalf("%s not stored in version 2: %q", target, v)
	}
	return res.Lease
}

func putRaw(t *testing.T, s *Store, key, v []byte) {
	t.Helper()
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(key, v) }); err != nil {
		t.Fatal(err)
	}
}

func quarantined(t *testing.T, s *Store, lockKey string) []byte {
	t.Helper()
	var q []byte
	if err := s.db.View(func(tx *bbolt.Tx) error {
		q = bytes.Clone(tx.Bucket(bucketQuarantine).Get([]byte(lockKey)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return q
}

// Another identity's (valid) version 2 record under this identity's key:
// every reader refuses it — inspect (memo path, after the same bytes were
// read and memoized under their own key), renew, release, list, the
// reaper, recovery's State — the identity is quarantined, nothing is
// rewritten.
func TestReviewRv2SplicedRecordCorrupt(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a := rvAcquire(t, s, "ziel-a", time.Minute, far)
	b := rvAcquire(t, s, "ziel-b", time.Minute, far)
	av := storedActive(t, s, a.LockKey)
	// Memoize a's bytes first (a read), so the splice is a memo hit.
	if in, err := s.Inspect(ctx, lease.InspectRequest{Identity: a.Identity(), DeadlineAt: far, Caller: callerOfRecord(a)}); err != nil || in.Lease.LeaseID != a.LeaseID {
		t.Fatalf("inspect a: %v", err)
	}
	putRaw(t, s, activeKey(b.LockKey), av)
	if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: b.Identity(), DeadlineAt: far, Caller: callerOfRecord(b)}); code(err) != lease.CodeCorrupt {
		t.Fatalf("inspect b (memo hit of a's bytes): %v, want corrupt", err)
	}
	if _, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: b.LeaseID, DeadlineAt: far, Caller: callerOfRecord(b)}); code(err) != lease.CodeCorrupt {
		t.Fatalf("inspect b by id: %v, want corrupt", err)
	}
	lst, err := s.List(ctx, lease.ListRequest{By: lease.ListByProgram, TenantID: b.TenantID, ProgramID: b.ProgramID, DeadlineAt: far, Caller: callerOfRecord(b)})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	{
		for _, l := range lst.Leases {
			if l.LockKey == b.LockKey || (l.LeaseID == a.LeaseID && l.LockKey != a.LockKey) {
				t.Fatalf("list shows the spliced record: %+v", l)
			}
		}
		if len(lst.Leases) != 1 || lst.Leases[0].LeaseID != a.LeaseID {
			t.Fatalf("list: %+v", lst.Leases)
		}
	}
	if _, err := s.Renew(ctx, renewOf(b, "ren-b", far)); code(err) != lease.CodeCorrupt {
		t.Fatalf("renew b: %v, want corrupt", err)
	}
	if _, err := s.Renew(ctx, renewOf(a, "ren-b-as-a", far)); err != nil {
		t.Fatalf("renew a itself: %v", err)
	}
	if q := quarantined(t, s, b.LockKey); q == nil {
		t.Fatal("b not quarantined")
	}
	if v := storedActive(t, s, b.LockKey); !bytes.Equal(v, av) {
		t.Fatalf("spliced value rewritten: %q", v)
	}
	// The reaper past b's expiry: b's entry names b's key, whose record is
	// a's: nothing archived under b, the value stays.
	c.Add(10 * time.Minute)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if v := storedActive(t, s, b.LockKey); !bytes.Equal(v, av) {
		t.Fatalf("reaper touched the spliced value: %q", v)
	}
	// Recovery of a backup holding the splice fails closed.
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	ns := NewNamespace(filepath.Join(t.TempDir(), "r.db"), Options{ReapInterval: -1})
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	r, err := ns.OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.State(ctx); code(err) != lease.CodeCorrupt {
		t.Fatalf("recovery state with a spliced record: %v, want corrupt", err)
	}
	if _, err := r.Finish(ctx, lease.RecoveryPlan{Epoch: 1, Reason: "x"}); code(err) != lease.CodeCorrupt {
		t.Fatalf("recovery finish with a spliced record: %v, want corrupt", err)
	}
}

// Version 2 records that expire are archived by the reaper exactly as
// version 1 ones: history holds the record, state expired, ended at its
// expiry; inspect by lease id answers it; the active entry and its index
// entries are gone. A version 1 record (schema 5) beside them too.
func TestReviewRv2ReaperArchivesVersion2(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []*lease.Record
	for i := 0; i < 40; i++ {
		recs = append(recs, rvAcquire(t, s, fmt.Sprintf("ziel-%d", i), time.Duration(1+i%3)*time.Second, far))
	}
	putRaw(t, s, activeKey(recs[0].LockKey), []byte(encoded(t, recs[0]))) // a version 1 record
	c.Add(time.Minute)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if n := kindLen(t, s, kindActive); n != 0 {
		t.Fatalf("%d active records left after the reaper", n)
	}
	if n := bucketLen(t, s, bucketActiveExp); n != 0 {
		t.Fatalf("%d expiry index entries left", n)
	}
	for _, r := range recs {
		in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: r.LeaseID, DeadlineAt: far, Caller: callerOfRecord(r)})
		if err != nil || in.Lease == nil {
			t.Fatalf("inspect %s: %v", r.TargetID, err)
		}
		want := r.Clone()
		want.State = lease.StateExpired
		if encoded(t, in.Lease) != encoded(t, want) {
			t.Fatalf("history of %s:\n%s\nwant\n%s", r.TargetID, encoded(t, in.Lease), encoded(t, want))
		}
		h, err := s.History(ctx, lease.HistoryRequest{Identity: r.Identity(), DeadlineAt: far, Caller: callerOfRecord(r)})
		if err != nil || len(h.Entries) != 1 || h.Entries[0].EndedAt != r.ExpiresAt || encoded(t, h.Entries[0].Record) != encoded(t, want) {
			t.Fatalf("history %s: %v %+v", r.TargetID, err, h)
		}
	}
}

// A backup of a schema 6 file (version 2 records) and one of a schema 5
// file (version 1 records) both restore; recovery's State reads every
// record exactly; Finish archives them; the recovered store works.
func TestReviewRv2BackupsOfSchema5And6Recover(t *testing.T) {
	for _, schema := range []string{schemaVersion, schemaVersionV5} {
		t.Run("schema"+schema, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			dir := t.TempDir()
			s, err := Open(filepath.Join(dir, "a.db"), Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			want := map[string]string{}
			var recs []*lease.Record
			for i := 0; i < 10; i++ {
				ttl := time.Hour
				if i%2 == 0 {
					ttl = time.Second // expired by recovery time
				}
				r := rvAcquire(t, s, fmt.Sprintf("ziel-%d", i), ttl, far)
				recs = append(recs, r)
				want[r.LeaseID] = encoded(t, r)
			}
			if schema == schemaVersionV5 {
				if err := s.db.Update(func(tx *bbolt.Tx) error {
					for _, r := range recs {
						if err := tx.Bucket(bucketIdent).Put(activeKey(r.LockKey), []byte(encoded(t, r))); err != nil {
							return err
						}
					}
					return asSchema(tx, schemaVersionV5)
				}); err != nil {
					t.Fatal(err)
				}
			}
			var buf bytes.Buffer
			if _, err := s.Backup(ctx, &buf); err != nil {
				t.Fatal(err)
			}
			c.Add(time.Minute)
			ns := NewNamespace(filepath.Join(dir, "r.db"), Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
				t.Fatalf("restore: %v", err)
			}
			r, err := ns.OpenClosed(ctx)
			if err != nil {
				t.Fatal(err)
			}
			st, err := r.State(ctx)
			if err != nil || len(st.Active) != len(recs) {
				t.Fatalf("state: %v, %d active", err, len(st.Active))
			}
			for _, a := range st.Active {
				if encoded(t, a) != want[a.LeaseID] {
					t.Fatalf("restored record %s:\n%s\nwant\n%s", a.LeaseID, encoded(t, a), want[a.LeaseID])
				}
			}
			res, err := r.Finish(ctx, lease.RecoveryPlan{Counters: st.Counters, Epoch: 1, Floor: 100, Reason: "review rv2"})
			if err != nil || len(res.Revoked) != 5 || len(res.Expired) != 5 {
				t.Fatalf("finish: %v %+v", err, res)
			}
			s2, err := Open(filepath.Join(dir, "r.db"), Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			for _, rec := range recs {
				in, err := s2.Inspect(ctx, lease.InspectRequest{LeaseID: rec.LeaseID, DeadlineAt: far, Caller: callerOfRecord(rec)})
				if err != nil || in.Lease == nil || in.Lease.FencingToken != rec.FencingToken || !in.Lease.State.Terminal() {
					t.Fatalf("after recovery %s: %v %+v", rec.LeaseID, err, in.Lease)
				}
				got := in.Lease.Clone()
				got.State = lease.StateActive
				if encoded(t, got) != want[rec.LeaseID] {
					t.Fatalf("archived %s:\n%s\nwant\n%s", rec.LeaseID, encoded(t, got), want[rec.LeaseID])
				}
			}
			again, err := s2.Acquire(ctx, acquireReq("after", time.Minute, far))
			if err != nil || again.Lease.FencingToken <= 100 {
				t.Fatalf("acquire after recovery: %v", err)
			}
			if v := storedActive(t, s2, again.Lease.LockKey); !strings.HasPrefix(string(v), lease.RecordV2Prefix) {
				t.Fatalf("not version 2 after recovery: %q", v)
			}
		})
	}
}

// For the cross-build check: with REVIEW_RV2_OUT set, write a schema 6
// store file (version 2 records) and a backup of it there, for a schema 5
// build (ae5aeee) to try (bolt/review_rv2_old_test.go in its worktree).
func TestReviewRv2WriteSchema6Artifacts(t *testing.T) {
	out := os.Getenv("REVIEW_RV2_OUT")
	if out == "" {
		t.Skip("REVIEW_RV2_OUT not set")
	}
	ctx := context.Background()
	path := filepath.Join(out, "schema6.db")
	os.Remove(path)
	s, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(24 * time.Hour)
	r := rvAcquire(t, s, "ziel-x", time.Hour, far)
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.WriteFile(filepath.Join(out, "schema6.backup"), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "schema6.target"), []byte(r.TargetID), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Reads (memo) and writes (direct) of version 2 records concurrently:
// every inspect answers a record some write produced, never another
// identity's, and is never corrupt. Run with -race.
func TestReviewRv2ConcurrentReadsAndWrites(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1})
	far := time.Now().Add(time.Hour)
	var recs []*lease.Record
	for i := 0; i < 6; i++ {
		recs = append(recs, rvAcquire(t, s, fmt.Sprintf("ziel-%d", i), time.Minute, far))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < len(recs); w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cur := recs[w]
			for k := 0; k < 60; k++ {
				res, err := s.Renew(ctx, renewOf(cur, fmt.Sprintf("ren-%d-%d", w, k), far))
				if err != nil {
					errs <- fmt.Errorf("renew %d: %v", w, err)
					return
				}
				cur = res.Lease
			}
		}(w)
	}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 300; k++ {
				r := recs[(g+k)%len(recs)]
				in, err := s.Inspect(ctx, lease.InspectRequest{Identity: r.Identity(), DeadlineAt: far, Caller: callerOfRecord(r)})
				if err != nil || in.Lease == nil || in.Lease.LockKey != r.LockKey || in.Lease.LeaseID != r.LeaseID {
					errs <- fmt.Errorf("inspect: %v %+v", err, in.Lease)
					return
				}
				in.Lease.Metadata["source"] = "mutated by a reader"
				in.Lease.LeaseID = "x"
				if len(in.Lease.Metadata) != 4 {
					errs <- fmt.Errorf("metadata %v", in.Lease.Metadata)
					return
				}
				lst, err := s.List(ctx, lease.ListRequest{By: lease.ListByProgram, TenantID: r.TenantID, ProgramID: r.ProgramID, DeadlineAt: far, Caller: callerOfRecord(r)})
				if err != nil {
					errs <- fmt.Errorf("list: %v", err)
					return
				}
				for _, l := range lst.Leases {
					if l.Metadata["source"] != "scan \"7\" <&> é \u2028" {
						errs <- fmt.Errorf("a reader's change leaked: %v", l.Metadata)
						return
					}
					l.Metadata["source"] = "mutated by a lister"
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
