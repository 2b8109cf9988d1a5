package bolt

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

func encoded(t *testing.T, r *lease.Record) string {
	t.Helper()
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type leaseLife struct {
	acq, ren, rel lease.Result
	acqReq        lease.AcquireRequest
	renReq        lease.RenewRequest
	relReq        lease.ReleaseRequest
}

// live runs acquire, renew and release of one lease of target.
func live(t *testing.T, s *Store, c *clock, target string, far time.Time) leaseLife {
	t.Helper()
	ctx := context.Background()
	var l leaseLife
	var err error
	l.acqReq = acquireReq("acq-"+target, time.Minute, far)
	l.acqReq.Identity.TargetID = target
	if l.acq, err = s.Acquire(ctx, l.acqReq); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	r := l.acq.Lease
	l.renReq = lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, TTL: 2 * time.Minute,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "ren-" + target, DeadlineAt: far, Caller: callerOfRecord(r)}}
	if l.ren, err = s.Renew(ctx, l.renReq); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	l.relReq = lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel-" + target, DeadlineAt: far, Caller: callerOfRecord(r)}}
	if l.rel, err = s.Release(ctx, l.relReq); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	return l
}

// replays checks each request of l replays its original result exactly.
func (l leaseLife) replays(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	a, err := s.Acquire(ctx, l.acqReq)
	if err != nil || !a.Replayed || a.Code != l.acq.Code || encoded(t, a.Lease) != encoded(t, l.acq.Lease) || a.BackendTime != l.acq.BackendTime {
		t.Fatalf("acquire replay: %v %+v, want %+v", err, a.Lease, l.acq.Lease)
	}
	r, err := s.Renew(ctx, l.renReq)
	if err != nil || !r.Replayed || encoded(t, r.Lease) != encoded(t, l.ren.Lease) || r.BackendTime != l.ren.BackendTime {
		t.Fatalf("renew replay: %v %+v, want %+v", err, r.Lease, l.ren.Lease)
	}
	e, err := s.Release(ctx, l.relReq)
	if err != nil || !e.Replayed || encoded(t, e.Lease) != encoded(t, l.rel.Lease) || e.BackendTime != l.rel.BackendTime {
		t.Fatalf("release replay: %v %+v, want %+v", err, e.Lease, l.rel.Lease)
	}
	// A changed retry still conflicts.
	changed := l.renReq
	changed.TTL = 3 * time.Minute
	if _, err := s.Renew(ctx, changed); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("changed renew retry: %v, want idempotency_conflict", err)
	}
}

// Every replay of an acquire, a renewal and a release answers exactly the
// original result although the record has since been renewed and archived.
func TestEvidenceReplaysExactly(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := live(t, s, c, "ref-1", far)
	l.replays(t, s)
}

// When history trimming or retention removes a lease's record, its
// evidence still answers every replay exactly.
func TestEvidenceOutlivesItsRecord(t *testing.T) {
	for _, how := range []string{"trim", "retention"} {
		t.Run(how, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryPerIdentity, o.HistoryRetention = 2, time.Hour
			s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
			far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			first := live(t, s, c, "outlive", far)
			switch how {
			case "trim":
				for i := range 2 {
					l := first
					l.acqReq.RequestID, l.acqReq.ExecutionID = fmt.Sprintf("acq-more-%d", i), fmt.Sprintf("execution-%d", i)
					a, err := s.Acquire(context.Background(), l.acqReq)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := s.Release(context.Background(), lease.ReleaseRequest{Identity: a.Lease.Identity(), LeaseID: a.Lease.LeaseID,
						FencingToken: a.Lease.FencingToken, ServiceInstanceID: a.Lease.ServiceInstanceID,
						Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-more-%d", i), DeadlineAt: far, Caller: callerOfRecord(a.Lease)}}); err != nil {
						t.Fatal(err)
					}
				}
			case "retention":
				c.Add(2 * time.Hour)
				if err := s.reap(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: first.acq.Lease.LeaseID, DeadlineAt: far}); code(err) != lease.CodeNotFound {
				t.Fatalf("the first lease's history entry should be gone: %v", err)
			}
			first.replays(t, s)
		})
	}
}

// Evidence past retention goes.
func TestEvidenceRetentionDropsEvidence(t *testing.T) {
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	live(t, s, c, "drop-1", far)
	live(t, s, c, "drop-2", far)
	c.Add(lease.DefaultIdempotencyRetention + time.Hour)
	if err := s.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := kindLen(t, s, kindIdem); got != 0 {
		t.Fatalf("evidence past retention: %d", got)
	}
}
