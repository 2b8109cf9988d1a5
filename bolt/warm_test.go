package bolt

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// An acquire leaves its record decoded in the memo (warm), so the release
// that follows finds it there; bytes that changed underneath since, even
// to another valid record, are decoded strictly and judged as before:
// corrupt bytes and a record stored under a foreign lock key fail closed,
// and nothing of the lease is released.
func TestWarmMemoServesOnlyTheExactBytesItDecoded(t *testing.T) {
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	held := func(t *testing.T, s *Store, id lease.Identity, reqID string) *lease.Record {
		t.Helper()
		req := acquireReq(reqID, time.Minute, far)
		req.Identity = id
		got, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return got.Lease
	}
	release := func(s *Store, l *lease.Record, reqID string) (lease.Result, error) {
		return s.Release(ctx, releaseOf(l, reqID, far))
	}
	stored := func(t *testing.T, s *Store, lockKey string) []byte {
		t.Helper()
		v := storedActive(t, s, lockKey)
		if v == nil {
			t.Fatalf("no active record of %s", lockKey)
		}
		return v
	}

	t.Run("the release finds the acquired record decoded", func(t *testing.T) {
		s := openTemp(t, Options{ReapInterval: -1})
		l := held(t, s, testIdentity, "acq-1")
		known, ok := s.records.Known(stored(t, s, l.LockKey))
		if !ok {
			t.Fatal("the acquire did not leave its record in the memo")
		}
		if known.LeaseID != l.LeaseID || known.FencingToken != l.FencingToken || known.ExpiresAt != l.ExpiresAt {
			t.Fatalf("memo holds %+v, the acquire returned %+v", known, l)
		}
		ren, err := s.Renew(ctx, renewOf(l, "ren-1", far))
		if err != nil {
			t.Fatal(err)
		}
		if known, ok := s.records.Known(stored(t, s, l.LockKey)); !ok || known.ExpiresAt != ren.Lease.ExpiresAt {
			t.Fatalf("after the renewal the memo holds %+v (%v), want the renewed record", known, ok)
		}
		res, err := release(s, l, "rel-1")
		if err != nil || res.Code != lease.CodeReleased {
			t.Fatalf("release: %+v, %v", res, err)
		}
		if got, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: far}); lease.CodeOf(err) != lease.CodeNotFound {
			t.Fatalf("after the release: %+v, %v, want lease_not_found", got, err)
		}
	})

	t.Run("corrupt bytes under a warmed record fail closed", func(t *testing.T) {
		s := openTemp(t, Options{ReapInterval: -1})
		l := held(t, s, testIdentity, "acq-1")
		v := stored(t, s, l.LockKey)
		bad := bytes.Clone(v[:len(v)/2])
		putActiveRaw(t, s, l.LockKey, bad)
		if _, err := release(s, l, "rel-1"); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("release over corrupt bytes: %v, want corrupt", err)
		}
		if got := stored(t, s, l.LockKey); !bytes.Equal(got, bad) {
			t.Fatal("the corrupt record was changed")
		}
	})

	t.Run("another identity's warmed record under this lock key fails closed", func(t *testing.T) {
		s := openTemp(t, Options{ReapInterval: -1})
		mine := held(t, s, testIdentity, "acq-1")
		other := testIdentity
		other.TargetID = "another-target"
		theirs := held(t, s, other, "acq-2")
		// Their bytes are in the memo, decoded: a copy under my lock key
		// must still be refused for naming another lock key.
		v := stored(t, s, theirs.LockKey)
		if _, ok := s.records.Known(v); !ok {
			t.Fatal("the second acquire did not leave its record in the memo")
		}
		putActiveRaw(t, s, mine.LockKey, v)
		if _, err := release(s, mine, "rel-1"); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("release of mine over their record: %v, want corrupt", err)
		}
		res, err := release(s, theirs, "rel-2")
		if err != nil || res.Code != lease.CodeReleased {
			t.Fatalf("their own release: %+v, %v", res, err)
		}
	})
}
