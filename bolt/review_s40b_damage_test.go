package bolt

import (
	"bytes"
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Damage to a lease's history entry (or its active record): with the
// acquisition's evidence in version 2 (self-contained) the acquisition
// still replays and looks up exactly its original result; in version 3
// it names a record that is unreadable, so the replay and lookup fail
// closed (corrupt, the identity quarantined), never with another answer.
// Once the damaged entry is trimmed away (dropHistory cannot decode it,
// so detachEvidence never runs) the file holds no damage at all, yet the
// acquisition stays unanswerable for the rest of its idempotency
// retention, where version 2 answered throughout: the price of version 3,
// accepted (review s40b; the note of session 40 says so).
func TestS40bDamagedRecordMakesItsAcquisitionUnanswerable(t *testing.T) {
	for _, form := range []string{"version2-before-this-commit", "version3"} {
		t.Run("history/"+form, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryPerIdentity = 2
			s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := refLives(t, s, c, "damaged", 0, 1, far)[0]
			k, v, p := evidenceOf(t, s, l.lookup(far))
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				ident := tx.Bucket(bucketIdent)
				if form != "version3" {
					if err := ident.Put(k, asVersion2(t, tx, p.LockKey, v)); err != nil {
						return err
					}
				}
				// One flipped byte in the lease's history entry.
				c := ident.Cursor()
				hk, hv := c.Seek(historyPrefix(p.LockKey))
				if !bytes.HasPrefix(hk, historyPrefix(p.LockKey)) {
					t.Fatal("no history entry")
				}
				bad := bytes.Clone(hv)
				bad[len(bad)/2] ^= 0x01
				return ident.Put(bytes.Clone(hk), bad)
			}); err != nil {
				t.Fatal(err)
			}
			answers := func(when string) {
				t.Helper()
				if form == "version3" {
					s40bFailsClosed(t, s, l, far, when)
				} else {
					s40bAnswers(t, s, l, far, when)
				}
			}
			answers("with the damaged history entry")
			// Two more leases trim the damaged entry away (cap 2): the
			// file then holds no damaged entry.
			more := refLives(t, s, c, "damaged", 1, 2, far)
			if err := s.db.View(func(tx *bbolt.Tx) error {
				c := tx.Bucket(bucketIdent).Cursor()
				prefix := historyPrefix(p.LockKey)
				for k, v := c.Seek(prefix); bytes.HasPrefix(k, prefix); k, v = c.Next() {
					if _, err := lease.DecodeStoredHistoryAt(v, p.LockKey); err != nil {
						t.Fatalf("a damaged history entry is left: %v", err)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			c.Add(24 * time.Hour) // well within the idempotency retention
			answers("a day after the damaged entry was trimmed away")
			if q := quarantineOf(t, s, p.LockKey); (q != "") != (form == "version3") {
				t.Errorf("identity quarantined: %q", q)
			}
			for _, m := range more {
				m.answersExactly(t, s, far)
			}
		})
	}
	for _, form := range []string{"version2-before-this-commit", "version3"} {
		t.Run("active/"+form, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			req := acquireReq("acq-active", time.Minute, far)
			a, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			l := refLife{req: req, acq: a}
			k, v, p := evidenceOf(t, s, l.lookup(far))
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				ident := tx.Bucket(bucketIdent)
				if form != "version3" {
					if err := ident.Put(k, asVersion2(t, tx, p.LockKey, v)); err != nil {
						return err
					}
				}
				bad := bytes.Clone(ident.Get(activeKey(p.LockKey)))
				bad[len(bad)/2] ^= 0x01
				return ident.Put(activeKey(p.LockKey), bad)
			}); err != nil {
				t.Fatal(err)
			}
			// The lookup (a read; it reports the current state only where
			// it can find it) answers from version 2 evidence; version 3
			// fails closed.
			got, err := s.LookupRequest(ctx, l.lookup(far))
			if form == "version3" {
				if code(err) != lease.CodeCorrupt {
					t.Fatalf("lookup of an acquisition whose active record is damaged: %v %+v, want corrupt", err, got.Lease)
				}
				return
			}
			if err != nil || encoded(t, got.Lease) != encoded(t, a.Lease) || got.BackendTime != a.BackendTime {
				t.Fatalf("lookup of an acquisition whose active record is damaged: %v", err)
			}
		})
	}
}

// s40bAnswers is answersExactly, reporting instead of stopping.
func s40bAnswers(t *testing.T, s *Store, l refLife, far time.Time, when string) {
	t.Helper()
	ctx := context.Background()
	a, err := s.Acquire(ctx, l.req)
	if err != nil || !a.Replayed || a.Code != l.acq.Code || encoded(t, a.Lease) != encoded(t, l.acq.Lease) || a.BackendTime != l.acq.BackendTime {
		t.Errorf("%s: replay of %s: %v (replayed %v)", when, l.req.RequestID, err, a.Replayed)
	}
	got, err := s.LookupRequest(ctx, l.lookup(far))
	if err != nil || got.Code != l.acq.Code || encoded(t, got.Lease) != encoded(t, l.acq.Lease) || got.BackendTime != l.acq.BackendTime {
		t.Errorf("%s: lookup of %s: %v", when, l.req.RequestID, err)
	}
}

// s40bFailsClosed checks that l's acquisition neither replays nor looks
// up: both answer corrupt.
func s40bFailsClosed(t *testing.T, s *Store, l refLife, far time.Time, when string) {
	t.Helper()
	ctx := context.Background()
	if a, err := s.Acquire(ctx, l.req); code(err) != lease.CodeCorrupt {
		t.Errorf("%s: replay of %s: %v %+v, want corrupt", when, l.req.RequestID, err, a.Lease)
	}
	if got, err := s.LookupRequest(ctx, l.lookup(far)); code(err) != lease.CodeCorrupt {
		t.Errorf("%s: lookup of %s: %v %+v, want corrupt", when, l.req.RequestID, err, got.Lease)
	}
}
