package bolt

import (
	"context"
	"fmt"
	"math/rand"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// s40bAcq is one granted acquisition and its request.
type s40bAcq struct {
	req lease.AcquireRequest
	res lease.Result
}

// A random life of a few identities (acquire, renew, release, force
// release, revoke, clock steps of seconds to days, reaper passes, clean
// reopen and crash), under small history caps and retentions: every
// acquisition whose evidence is still within its retention replays and
// looks up exactly its original result.
func TestS40bRandomLivesReplayExactly(t *testing.T) {
	type cfg struct {
		cap        int
		histRet    time.Duration
		idemRet    time.Duration
		stepMaxSec int
	}
	cfgs := []cfg{
		{1, time.Hour, 0, 3 * 3600},
		{2, time.Hour, 0, 24 * 3600},
		{1, 0, 0, 36 * 3600},
		{3, 2 * time.Hour, 30 * 24 * time.Hour, 48 * 3600},
		{1, time.Millisecond, 0, 600},
	}
	for ci, cf := range cfgs {
		// 3 seeds each in the suite (6 in the review run).
		for seed := int64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("cfg%d/seed%d", ci, seed), func(t *testing.T) {
				s40bRun(t, seed, cf.cap, cf.histRet, cf.idemRet, cf.stepMaxSec, time.Hour)
			})
			if seed == 1 {
				t.Run(fmt.Sprintf("cfg%d/seed%d/flush-each", ci, seed), func(t *testing.T) {
					s40bRun(t, seed, cf.cap, cf.histRet, cf.idemRet, cf.stepMaxSec, -1)
				})
			}
		}
	}
}

func s40bRun(t *testing.T, seed int64, hcap int, histRet, idemRet time.Duration, stepMaxSec int, flush time.Duration) {
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(seed))
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = hcap
	so.HistoryRetention = histRet
	so.IdempotencyRetention = idemRet
	o := Options{StoreOptions: so, Now: c.Now, ReapInterval: -1, FlushInterval: flush}
	path := filepath.Join(t.TempDir(), "starlease.db")
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	ret := s.opts.IdempotencyRetention
	far := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	targets := []string{"t0", "t1", "t2"}
	principals := []string{"prn-a", "prn-b"}
	var acqs []s40bAcq
	cur := map[string]*lease.Record{} // target → last granted lease (may have ended)
	n := 0
	check := func(a s40bAcq, where string) {
		t.Helper()
		exp := a.res.BackendTime.Add(ret)
		if !c.Now().Before(exp.Time().Add(-time.Second)) {
			return // evidence may be gone
		}
		got, err := s.Acquire(ctx, a.req)
		if err != nil || !got.Replayed || got.Code != a.res.Code || encoded(t, got.Lease) != encoded(t, a.res.Lease) || got.BackendTime != a.res.BackendTime {
			t.Fatalf("seed %d %s: replay of %s: %v replayed=%v\n got %+v\nwant %+v", seed, where, a.req.RequestID, err, got.Replayed, got.Lease, a.res.Lease)
		}
		lk := lease.LookupRequest{Op: lease.OpAcquire, Identity: a.req.Identity, PrincipalID: a.req.Caller.PrincipalID, RequestID: a.req.RequestID, DeadlineAt: far}
		lr, err := s.LookupRequest(ctx, lk)
		if err != nil || lr.Code != a.res.Code || encoded(t, lr.Lease) != encoded(t, a.res.Lease) || lr.BackendTime != a.res.BackendTime {
			t.Fatalf("seed %d %s: lookup of %s: %v %+v", seed, where, a.req.RequestID, err, lr.Lease)
		}
	}
	for step := 0; step < 400; step++ {
		n++
		tg := targets[rnd.Intn(len(targets))]
		r := cur[tg]
		switch k := rnd.Intn(20); {
		case k < 6:
			rid := fmt.Sprintf("acq-%d", n)
			reuse := -1
			if len(acqs) > 0 && rnd.Intn(3) == 0 {
				reuse = rnd.Intn(len(acqs))
				rid = acqs[reuse].req.RequestID
			}
			req := acquireReq(rid, time.Duration(1+rnd.Intn(3600))*time.Second, far)
			req.MaximumLifetime = 2 * time.Hour
			if req.TTL > req.MaximumLifetime {
				req.TTL = req.MaximumLifetime
			}
			req.Identity.TargetID = tg
			req.Caller.PrincipalID = principals[rnd.Intn(2)]
			if reuse >= 0 {
				req.Identity.TargetID = acqs[reuse].req.Identity.TargetID
				req.Caller.PrincipalID = acqs[reuse].req.Caller.PrincipalID
				tg = req.Identity.TargetID
			}
			if rnd.Intn(3) == 0 {
				req.Metadata = lease.Metadata{"k": fmt.Sprint(n), "n": rnd.Intn(1000)}
			}
			res, err := s.Acquire(ctx, req)
			if err == nil && !res.Replayed {
				kept := acqs[:0]
				for _, a := range acqs {
					if a.req.RequestID != req.RequestID || a.req.Identity != req.Identity || a.req.Caller.PrincipalID != req.Caller.PrincipalID {
						kept = append(kept, a)
					}
				}
				acqs = append(kept, s40bAcq{req, res})
				cur[tg] = res.Lease
			}
		case k < 9 && r != nil:
			_, _ = s.Renew(ctx, lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
				ServiceInstanceID: r.ServiceInstanceID, TTL: time.Duration(1+rnd.Intn(3600)) * time.Second,
				Mutation: lease.Mutation{RequestID: fmt.Sprintf("ren-%d", n), DeadlineAt: far, Caller: callerOfRecord(r)}})
		case k < 11 && r != nil:
			_, _ = s.Release(ctx, lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
				ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%d", n), DeadlineAt: far, Caller: callerOfRecord(r)}})
		case k < 12 && r != nil:
			_, _ = s.Revoke(ctx, rhAdminReq(fmt.Sprintf("rev-%d", n), r, "why", "inc-1"))
		case k < 13 && r != nil:
			_, _ = s.ForceRelease(ctx, rhAdminReq(fmt.Sprintf("frc-%d", n), r, "why", "inc-1"))
		case k < 16:
			c.Add(time.Duration(1+rnd.Intn(stepMaxSec)) * time.Second)
		case k < 18:
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
		case k < 19:
			s.Close()
			o.StoreOptions.HistoryPerIdentity = []int{1, 2, 3, 64}[rnd.Intn(4)]
			o.StoreOptions.HistoryRetention = []time.Duration{time.Millisecond, time.Hour, 0}[rnd.Intn(3)]
			if s, err = Open(path, o); err != nil {
				t.Fatal(err)
			}
		default:
			crash(t, s)
			if s, err = Open(path, o); err != nil {
				t.Fatal(err)
			}
		}
		if len(acqs) > 0 {
			check(acqs[rnd.Intn(len(acqs))], fmt.Sprintf("step %d", step))
		}
	}
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range acqs {
		check(a, "end")
	}
}
