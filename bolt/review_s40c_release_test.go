package bolt

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// A lease renewed with another ttl, then released: the release's v3
// evidence names the renewed expiry and ttl; after the entry is trimmed
// (cap 1) it is v2 and still exact.
func TestS40cRenewedThenReleasedTrimmed(t *testing.T) {
	forEachByRef(t, testS40cRenewedThenReleasedTrimmed)
}

func testS40cRenewedThenReleasedTrimmed(t *testing.T, byRef string) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 1
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	s.schema10Writes = byRef == "ev3"
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	req := acquireReq("acq-r", time.Minute, far)
	req.Identity.TargetID = "renewed"
	a, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	r := a.Lease
	if _, err := s.Renew(ctx, lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, TTL: 3 * time.Minute, Mutation: lease.Mutation{RequestID: "ren-1", DeadlineAt: far, Caller: callerOfRecord(r)}}); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	relReq := lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel-r", DeadlineAt: far, Caller: callerOfRecord(r)}}
	rel, err := s.Release(ctx, relReq)
	if err != nil {
		t.Fatal(err)
	}
	l := refLife{req, a, relReq, rel}
	if v := l.storedReleaseVersion(t, s, far); v != byRef {
		t.Fatalf("release evidence %s, want %s", v, byRef)
	}
	l.answersExactly(t, s, far)
	conflicts := func(when string) {
		other := relReq
		other.FencingToken++
		if _, err := s.Release(ctx, other); lease.AsError(err) == nil || lease.AsError(err).Code != lease.CodeIdempotencyConflict {
			t.Fatalf("%s: release with the same request id, other token: %v, want idempotency_conflict", when, err)
		}
	}
	conflicts(byRef)
	more := refLives(t, s, c, "renewed", 20, 2, far)
	conflicts("ev2")
	if v := l.storedReleaseVersion(t, s, far); v != "ev2" {
		t.Fatalf("release evidence after trim %s, want ev2", v)
	}
	for _, m := range append([]refLife{l}, more...) {
		m.answersExactly(t, s, far)
	}
}

// The same principal reuses a release request id for a later lease once
// the first release's evidence expired (history kept longer): trimming
// the first lease's entry computes the same scope, which now holds the
// second lease's v3 evidence; it must be left alone and keep answering.
func TestS40cReleaseRequestIDReusedAfterEvidenceExpired(t *testing.T) {
	forEachByRef(t, testS40cReleaseRequestIDReusedAfterEvidenceExpired)
}

func testS40cReleaseRequestIDReusedAfterEvidenceExpired(t *testing.T, byRef string) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 2
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	s.schema10Writes = byRef == "ev3"
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	first := refLives(t, s, c, "reused", 0, 1, far)[0]
	c.Add(o.WithDefaults().IdempotencyRetention + time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if v := first.storedReleaseVersion(t, s, far); v != "none" {
		t.Fatalf("first release evidence after its retention: %s", v)
	}
	// Second lease, released with the first release's request id.
	req := acquireReq("acq-second", time.Minute, far)
	req.Identity.TargetID = "reused"
	a, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	r := a.Lease
	relReq := lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: first.relReq.RequestID, DeadlineAt: far, Caller: callerOfRecord(r)}}
	rel, err := s.Release(ctx, relReq)
	if err != nil || rel.Replayed {
		t.Fatalf("second release: %+v %v", rel, err)
	}
	second := refLife{req, a, relReq, rel}
	// Trim the first lease's entry (cap 2).
	more := refLives(t, s, c, "reused", 30, 1, far)
	if v := second.storedReleaseVersion(t, s, far); v != byRef {
		t.Fatalf("second release evidence: %s, want %s", v, byRef)
	}
	second.answersExactly(t, s, far)
	more = append(more, refLives(t, s, c, "reused", 40, 2, far)...)
	if v := second.storedReleaseVersion(t, s, far); v != "ev2" {
		t.Fatalf("second release evidence after trim: %s, want ev2", v)
	}
	second.answersExactly(t, s, far)
	for _, m := range more {
		m.answersExactly(t, s, far)
	}
}

// A force-release by an admin principal who is also an owner that used
// the same request id for a release of its own lease: the force-released
// entry's detach computes that release scope; it must not touch it.
func TestS40cForceReleaseEntryDoesNotDetachAnotherRelease(t *testing.T) {
	forEachByRef(t, testS40cForceReleaseEntryDoesNotDetachAnotherRelease)
}

func testS40cForceReleaseEntryDoesNotDetachAnotherRelease(t *testing.T, byRef string) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 3
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	s.schema10Writes = byRef == "ev3"
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	// lease F, force-released by prn-actor (the owner's principal too) with request "x".
	req := acquireReq("acq-f", time.Minute, far)
	req.Identity.TargetID = "forced"
	a, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	fr, err := s.ForceRelease(ctx, lease.AdminRequest{Identity: a.Lease.Identity(), LeaseID: a.Lease.LeaseID, FencingToken: a.Lease.FencingToken,
		Reason: "review", Mutation: lease.Mutation{RequestID: "x", DeadlineAt: far, Caller: callerOfRecord(a.Lease)}})
	if err != nil {
		t.Fatal(err)
	}
	_ = fr
	c.Add(time.Second)
	// lease G released by its owner with request "x".
	req2 := acquireReq("acq-g", time.Minute, far)
	req2.Identity.TargetID = "forced"
	g, err := s.Acquire(ctx, req2)
	if err != nil {
		t.Fatal(err)
	}
	c.Add(time.Second)
	r := g.Lease
	relReq := lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "x", DeadlineAt: far, Caller: callerOfRecord(r)}}
	rel, err := s.Release(ctx, relReq)
	if err != nil {
		t.Fatal(err)
	}
	l := refLife{req2, g, relReq, rel}
	// Trim F's entry only.
	more := refLives(t, s, c, "forced", 50, 2, far)
	if v := l.storedReleaseVersion(t, s, far); v != byRef {
		t.Fatalf("G's release evidence after F's entry went: %s, want %s", v, byRef)
	}
	l.answersExactly(t, s, far)
	more = append(more, refLives(t, s, c, "forced", 60, 3, far)...)
	if v := l.storedReleaseVersion(t, s, far); v != "ev2" {
		t.Fatalf("G's release evidence after its entry went: %s, want ev2", v)
	}
	l.answersExactly(t, s, far)
	for _, m := range more {
		m.answersExactly(t, s, far)
	}
}
