package bolt

import (
	"context"
	"fmt"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease/leasetest"
)

// A replay or lookup of an ended lease's acquisition walks the identity's
// history (strictly decoding every entry, newest first) twice with
// version 3 evidence: once to rebuild the evidence (referredRecord) and
// once more for the lease's state now (currentOf), where version 2
// walked it once. At the default cap (64) and the oldest entry, that is
// 64 more strict decodes per lookup, and per replay inside the write
// transaction. Measured as allocations against the same lookup with the
// evidence in version 2 (the form this commit detaches it into): about
// 1.9 times as many.
func TestS40bEndedAcquisitionWalksHistoryOnce(t *testing.T) {
	forEachByRef(t, testS40bEndedAcquisitionWalksHistoryOnce)
}

func testS40bEndedAcquisitionWalksHistoryOnce(t *testing.T, byRef string) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 64
	s := openTemp(t, Options{StoreOptions: so, Now: c.Now, ReapInterval: -1})
	s.schema10Writes = byRef == "ev3"
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	oldest := map[string]refLife{}
	for _, target := range []string{"v3", "v2"} {
		for i := 0; i < 64; i++ {
			l := refLives(t, s, c, target, i, 1, far)[0]
			if i == 0 {
				oldest[target] = l
			}
		}
	}
	if got := oldest["v3"].storedVersion(t, s, far); got != byRef {
		t.Fatalf("setup: %s", got)
	}
	k, v, p := evidenceOf(t, s, oldest["v2"].lookup(far))
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(k, asVersion2(t, tx, p.LockKey, v)) }); err != nil {
		t.Fatal(err)
	}
	for _, l := range oldest {
		l.answersExactly(t, s, far)
	}
	allocs := map[string]float64{}
	for target, l := range oldest {
		lk := l.lookup(far)
		allocs["lookup "+target] = testing.AllocsPerRun(50, func() {
			if _, err := s.LookupRequest(ctx, lk); err != nil {
				t.Fatal(err)
			}
		})
		req := l.req
		allocs["replay "+target] = testing.AllocsPerRun(20, func() {
			if r, err := s.Acquire(ctx, req); err != nil || !r.Replayed {
				t.Fatal(err)
			}
		})
	}
	t.Log(fmt.Sprint(allocs))
	for _, op := range []string{"lookup", "replay"} {
		if v3, v2 := allocs[op+" v3"], allocs[op+" v2"]; v3 > 1.2*v2 {
			t.Errorf("%s of the oldest ended acquisition: %.0f allocations with version 3 evidence, %.0f with version 2 (the history is walked twice)", op, v3, v2)
		}
	}
}
