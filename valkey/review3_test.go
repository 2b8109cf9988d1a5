package valkey

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// review3History is the identity's raw history entries, decoded.
func review3History(t *testing.T, s *Store, id lease.Identity) []*lease.HistoryEntry {
	t.Helper()
	raw, err := s.client.Do(bg, s.client.B().Lrange().Key(s.keys.history(tagOf(lockKey(t, id)))).Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	var out []*lease.HistoryEntry
	for _, r := range raw {
		r, ok := lease.ExpandHistory(r)
		h, err := lease.DecodeHistoryEntry([]byte(r))
		if !ok || err != nil {
			t.Fatalf("history entry: %v", err)
		}
		out = append(out, h)
	}
	return out
}

// Attack: two stores (two servers) on one namespace reap the same backlog
// at once, 16 calls each in flight, while some identities already have a
// successor: every expired lease is archived exactly once, at its
// expires_at; successors are untouched (still renewable, not in history);
// the schedule ends holding only the successors. A pass whose context ends
// mid-batch returns an error and changes nothing twice.
func TestReview3ParallelReapersOneNamespace(t *testing.T) {
	r := sharedServer(t)
	prefix := randomPrefix()
	a := open(t, r, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions()})
	b := open(t, r, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions()})
	const n = 300
	ids := make([]lease.Identity, n)
	first := make([]*lease.Record, n)
	for i := range ids {
		ids[i] = newIdentity()
		req := acquireReq(ids[i])
		req.TTL = 300 * time.Millisecond
		res, err := a.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		first[i] = res.Lease
	}
	time.Sleep(400 * time.Millisecond)
	// Every 10th identity gets a successor (its acquire archives the
	// expired predecessor itself).
	succ := map[int]*lease.Record{}
	for i := 0; i < n; i += 10 {
		res, err := b.Acquire(bg, acquireReq(ids[i]))
		if err != nil {
			t.Fatal(err)
		}
		succ[i] = res.Lease
	}
	// A pass cut short mid-batch first.
	ctx, cancel := context.WithTimeout(bg, 3*time.Millisecond)
	_ = a.reap(ctx)
	cancel()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for k, s := range []*Store{a, b, a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[k] = s.reap(bg) }()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("reaper %d: %v", k, err)
		}
	}
	for i, id := range ids {
		h := review3History(t, a, id)
		if len(h) != 1 {
			t.Fatalf("identity %d: %d history entries, want exactly 1", i, len(h))
		}
		if h[0].Record.LeaseID != first[i].LeaseID || h[0].Record.State != lease.StateExpired || h[0].EndedAt != first[i].ExpiresAt {
			t.Fatalf("identity %d: history %+v", i, h[0])
		}
	}
	for i, rec := range succ {
		if _, err := a.Renew(bg, renewReq(rec)); err != nil {
			t.Fatalf("successor %d touched by a reaper: %v", i, err)
		}
	}
	if z, _ := a.client.Do(bg, a.client.B().Zcard().Key(a.keys.expiry()).Build()).AsInt64(); z != int64(len(succ)) {
		t.Fatalf("schedule holds %d entries, want the %d successors", z, len(succ))
	}
}

// Attack: a reaper pass on a closed (sealed) namespace fails with
// backend_unavailable, archives nothing, and a pass after reopening
// archives every lease once.
func TestReview3ReapClosedNamespace(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	const n = 40
	ids := make([]lease.Identity, n)
	for i := range ids {
		ids[i] = newIdentity()
		req := acquireReq(ids[i])
		req.TTL = 200 * time.Millisecond
		if _, err := s.Acquire(bg, req); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if ok, err := s.Seal(bg); err != nil || !ok {
		t.Fatalf("seal: %v %v", ok, err)
	}
	err := s.reap(bg)
	if err == nil {
		t.Fatal("reap on a closed namespace succeeded")
	}
	if lease.AsError(err).Code != lease.CodeBackendUnavailable {
		t.Fatalf("reap on a closed namespace: %v", err)
	}
	for i, id := range ids {
		if h := review3History(t, s, id); len(h) != 0 {
			t.Fatalf("identity %d archived while closed", i)
		}
	}
}
