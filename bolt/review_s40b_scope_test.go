package bolt

import (
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Evidence of request R1 found under request R2's key (same identity,
// principal and inputs, so the same digest): both forms answer R2 with
// R1's lease (request_id R1). Recorded as it is, in both versions: not
// a change of this commit. The test passes on it.
func TestS40bEvidenceOfAnotherRequestIDSameInputs(t *testing.T) {
	for _, form := range []string{"version2", "version3"} {
		t.Run(form, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			r1 := acquireReq("req-1", time.Minute, far)
			a, err := s.Acquire(ctx, r1)
			if err != nil {
				t.Fatal(err)
			}
			l1 := refLife{req: r1, acq: a}
			r2 := r1
			r2.RequestID = "req-2"
			l2 := refLife{req: r2, acq: lease.Result{}}
			_, v, p := evidenceOf(t, s, l1.lookup(far))
			k2, _, _ := evidenceOf(t, s, l2.lookup(far))
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				if form == "version2" {
					v = asVersion2(t, tx, p.LockKey, v)
				}
				return tx.Bucket(bucketIdent).Put(k2, v)
			}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Acquire(ctx, r2)
			t.Logf("%s: replay of req-2: err=%v replayed=%v request_id=%q", form, err, got.Replayed, func() string {
				if got.Lease == nil {
					return ""
				}
				return got.Lease.RequestID
			}())
		})
	}
}
