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

// storedActive returns the stored bytes of lockKey's active record (nil:
// none).
func storedActive(t *testing.T, s *Store, lockKey string) []byte {
	t.Helper()
	var v []byte
	if err := s.db.View(func(tx *bbolt.Tx) error {
		v = bytes.Clone(tx.Bucket(bucketIdent).Get(activeKey(lockKey)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// putActiveRaw stores v as lockKey's active record, as damage would.
func putActiveRaw(t *testing.T, s *Store, lockKey string, v []byte) {
	t.Helper()
	if err := (faults{s}).PutRawActive(context.Background(), lockKey, v); err != nil {
		t.Fatal(err)
	}
}

// releaseOf is the owner's release of r, request id, by deadline.
func releaseOf(r *lease.Record, id string, deadline time.Time) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: id, DeadlineAt: deadline, Caller: callerOfRecord(r)}}
}

func renewOf(r *lease.Record, id string, far time.Time) lease.RenewRequest {
	return lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, TTL: 2 * time.Minute,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: id, DeadlineAt: far, Caller: callerOfRecord(r)}}
}

// Schema 6 stores active records in version 2, at about half the bytes,
// and reads them back exactly; a schema 5 file's version 1 records open
// unchanged and keep answering inspect, renewal (which then stores version
// 2), release and replays.
func TestActiveRecordsInVersion2AndVersion1StillRead(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	acquire := func(target string) (lease.AcquireRequest, *lease.Record) {
		req := acquireReq("acq-"+target, time.Minute, far)
		req.Identity.TargetID = target
		req.Metadata = lease.Metadata{"source": "scan \"7\"", "depth": 2.0}
		res, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return req, res.Lease
	}
	reqA, a := acquire("record-v2")
	reqB, b := acquire("record-v1")
	for _, r := range []*lease.Record{a, b} {
		v := storedActive(t, s, r.LockKey)
		v1, ok := lease.ExpandRecord(string(v))
		if !strings.HasPrefix(string(v), lease.RecordV2Prefix) || !ok || v1 != encoded(t, r) || len(v) > len(v1)*6/10 {
			t.Fatalf("active record not stored in version 2 at under 60%% of version 1's bytes (%d, %d): %q", len(v), len(v1), v)
		}
	}
	// Make it a schema 5 file: B's record in version 1, as schema 5 wrote it.
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketIdent).Put(activeKey(b.LockKey), []byte(encoded(t, b))); err != nil {
			return err
		}
		return asSchema(tx, schemaVersionV5)
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(path, o); err != nil {
		t.Fatalf("a schema 5 file: %v", err)
	}
	defer s.Close()
	if v := storedSchema(t, s.db); v != schemaVersion {
		t.Errorf("schema %q after open, want %q", v, schemaVersion)
	}
	if v := storedActive(t, s, b.LockKey); string(v) != encoded(t, b) {
		t.Fatalf("opening rewrote a version 1 record: %q", v)
	}
	for _, r := range []*lease.Record{a, b} {
		in, err := s.Inspect(ctx, lease.InspectRequest{Identity: r.Identity(), DeadlineAt: far, Caller: callerOfRecord(r)})
		if err != nil || in.Lease == nil || encoded(t, in.Lease) != encoded(t, r) {
			t.Fatalf("inspect %s: %+v, %v", r.TargetID, in.Lease, err)
		}
		byID, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: r.LeaseID, DeadlineAt: far, Caller: callerOfRecord(r)})
		if err != nil || byID.Lease == nil || encoded(t, byID.Lease) != encoded(t, r) {
			t.Fatalf("inspect by id %s: %+v, %v", r.TargetID, byID.Lease, err)
		}
	}
	c.Add(time.Second)
	ren, err := s.Renew(ctx, renewOf(b, "ren-b", far))
	if err != nil || ren.Lease.ExpiresAt != lease.At(c.Now().Add(2*time.Minute)) {
		t.Fatalf("renew of a version 1 record: %+v, %v", ren.Lease, err)
	}
	if v := storedActive(t, s, b.LockKey); !strings.HasPrefix(string(v), lease.RecordV2Prefix) {
		t.Fatalf("renewed record not stored in version 2: %q", v)
	}
	for req, orig := range map[*lease.AcquireRequest]*lease.Record{&reqA: a, &reqB: b} {
		again, err := s.Acquire(ctx, *req)
		if err != nil || !again.Replayed || encoded(t, again.Lease) != encoded(t, orig) {
			t.Fatalf("acquire replay: %+v, %v", again.Lease, err)
		}
	}
	for _, r := range []*lease.Record{a, ren.Lease} {
		rel, err := s.Release(ctx, releaseOf(r, "rel-"+r.TargetID, far))
		if err != nil || rel.Lease.State != lease.StateReleased || rel.Lease.FencingToken != r.FencingToken {
			t.Fatalf("release %s: %+v, %v", r.TargetID, rel.Lease, err)
		}
		if v := storedActive(t, s, r.LockKey); v != nil {
			t.Fatalf("released record still stored: %q", v)
		}
	}
}

// A version 2 active record that does not rebuild into a valid record (a
// number spelled otherwise, a quote in a line, a line missing, another
// identity's hash tag) fails closed: a renewal and an inspect answer
// corrupt, the identity is quarantined, and the record is left as it was.
func TestCorruptVersion2RecordFailsClosed(t *testing.T) {
	for name, edit := range map[string]func(f []string) []string{
		"token with a leading zero": func(f []string) []string { f[lease.Rv2Record+5] = "0" + f[lease.Rv2Record+5]; return f },
		"quote in a line":           func(f []string) []string { f[lease.Rv2Record+12] += `","x":"y`; return f },
		"a line missing":            func(f []string) []string { return append(f[:lease.Rv2Record+3], f[lease.Rv2Record+4:]...) },
		"another identity's tag": func(f []string) []string {
			f[lease.Rv2Tag] = strings.Repeat("A", len(f[lease.Rv2Tag]))
			return f
		},
		"expiry past the lifetime": func(f []string) []string { f[lease.Rv2Record+8] = "9" + f[lease.Rv2Record+8]; return f },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			req := acquireReq("acq", time.Minute, far)
			res, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			r := res.Lease
			bad := strings.Join(edit(strings.Split(string(storedActive(t, s, r.LockKey)), "\n")), "\n")
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket(bucketIdent).Put(activeKey(r.LockKey), []byte(bad))
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Renew(ctx, renewOf(r, "ren", far)); code(err) != lease.CodeCorrupt {
				t.Fatalf("renew: %v, want corrupt", err)
			}
			if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: r.Identity(), DeadlineAt: far, Caller: callerOfRecord(r)}); code(err) != lease.CodeCorrupt {
				t.Fatalf("inspect: %v, want corrupt", err)
			}
			var quarantined []byte
			if err := s.db.View(func(tx *bbolt.Tx) error {
				quarantined = bytes.Clone(tx.Bucket(bucketQuarantine).Get([]byte(r.LockKey)))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if after := storedActive(t, s, r.LockKey); string(after) != bad || quarantined == nil {
				t.Fatalf("record %q (changed: %v), quarantine %q", after, string(after) != bad, quarantined)
			}
		})
	}
}
