package leasetest

import (
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// world is what an entry-point test runs against: a live lease of e.id,
// and a free identity that acquisitions target.
type world struct {
	rec  *lease.Record
	free lease.Identity
}

func (e *env) newWorld() world {
	e.t.Helper()
	return world{rec: e.grab(), free: e.otherTarget()}
}

// noEffect runs f and asserts that nothing readable about the world changed.
func (e *env) noEffect(w world, f func()) {
	e.t.Helper()
	before, beforeFree := e.snap(e.id), e.snap(w.free)
	f()
	e.unchanged(e.id, before)
	e.unchanged(w.free, beforeFree)
	got := e.list(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID})
	wantStrings(e.t, "leases of the owner", leaseIDs(got), []string{w.rec.LeaseID})
}

// entryPoint calls one Store method with a valid request against w, with
// deadline d.
type entryPoint struct {
	name string
	call func(e *env, w world, d time.Time) error
}

func entryPoints() []entryPoint {
	return []entryPoint{
		{"acquire", func(e *env, w world, d time.Time) error {
			r := e.acquireReqFor(w.free, e.owner)
			r.DeadlineAt = d
			return errOf(e.st.Acquire(bg, r))
		}},
		{"renew", func(e *env, w world, d time.Time) error {
			r := e.renewReq(w.rec)
			r.DeadlineAt = d
			return errOf(e.st.Renew(bg, r))
		}},
		{"release", func(e *env, w world, d time.Time) error {
			r := e.releaseReq(w.rec)
			r.DeadlineAt = d
			return errOf(e.st.Release(bg, r))
		}},
		{"force_release", func(e *env, w world, d time.Time) error {
			r := e.adminReq(w.rec)
			r.DeadlineAt = d
			return errOf(e.st.ForceRelease(bg, r))
		}},
		{"revoke", func(e *env, w world, d time.Time) error {
			r := e.adminReq(w.rec)
			r.DeadlineAt = d
			return errOf(e.st.Revoke(bg, r))
		}},
		{"inspect_by_identity", func(e *env, w world, d time.Time) error {
			return errOf(e.st.Inspect(bg, lease.InspectRequest{Identity: e.id, DeadlineAt: d, Caller: e.owner}))
		}},
		{"inspect_by_lease_id", func(e *env, w world, d time.Time) error {
			return errOf(e.st.Inspect(bg, lease.InspectRequest{LeaseID: w.rec.LeaseID, DeadlineAt: d, Caller: e.owner}))
		}},
		{"list", func(e *env, w world, d time.Time) error {
			_, err := e.st.List(bg, lease.ListRequest{By: lease.ListByProgram, TenantID: e.id.TenantID,
				ProgramID: e.id.ProgramID, DeadlineAt: d, Caller: e.owner})
			return err
		}},
		{"history", func(e *env, w world, d time.Time) error {
			_, err := e.st.History(bg, lease.HistoryRequest{Identity: e.id, DeadlineAt: d, Caller: e.admin})
			return err
		}},
		{"authorize_commit", func(e *env, w world, d time.Time) error {
			r := e.commitReq(w.rec, "couchdb")
			r.DeadlineAt = d
			_, err := e.st.AuthorizeCommit(bg, r)
			return err
		}},
		{"lookup_request", func(e *env, w world, d time.Time) error {
			return errOf(e.st.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: e.id,
				PrincipalID: w.rec.OwnerPrincipalID, RequestID: w.rec.RequestID, DeadlineAt: d}))
		}},
	}
}

// finite_deadlines: every call has a finite deadline_at; work whose deadline
// passed before the atomic section is deadline-exceeded and changes nothing.
func (s *suite) finiteDeadlines(t *testing.T) {
	group(t, "zero_deadline_is_invalid", func(t *testing.T) {
		for _, ep := range entryPoints() {
			s.leaf(t, ep.name, func(e *env) {
				w := e.newWorld()
				e.noEffect(w, func() { mustInvalid(e.t, ep.call(e, w, time.Time{}), "deadline_at") })
			})
		}
	})
	group(t, "past_deadline_exceeded", func(t *testing.T) {
		for _, ep := range entryPoints() {
			s.leaf(t, ep.name, func(e *env) {
				w := e.newWorld()
				e.noEffect(w, func() { mustCode(e.t, ep.call(e, w, past()), lease.CodeDeadlineExceeded) })
			})
		}
	})
	s.leaf(t, "exceeded_request_is_not_stored", func(e *env) {
		r := e.acquireReq()
		r.DeadlineAt = past()
		_, err := e.st.Acquire(bg, r)
		mustCode(e.t, err, lease.CodeDeadlineExceeded)
		_, err = e.lookup(lease.OpAcquire, e.id, r.Caller.PrincipalID, r.RequestID)
		mustCode(e.t, err, lease.CodeNotFound)
		r.DeadlineAt = deadline()
		if rec := e.mustAcquire(r); rec.FencingToken != 1 {
			e.t.Fatalf("token %d, want 1", rec.FencingToken)
		}
	})
}

// backend_unavailable_before_submission: a closed store answers
// backend-unavailable at every entry point; no local success is assumed.
func (s *suite) backendUnavailable(t *testing.T) {
	b := s.newBackend(t)
	base := s.envOn(t, b)
	if h := b.Store.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("health of an open store: %+v", h)
	}
	w := base.newWorld()
	if err := b.Store.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	for _, ep := range entryPoints() {
		t.Run(ep.name, func(t *testing.T) {
			t.Parallel()
			mustCode(t, ep.call(base.on(t), w, deadline()), lease.CodeBackendUnavailable)
		})
	}
	t.Run("health_reports_unavailable", func(t *testing.T) {
		t.Parallel()
		if h := b.Store.Health(bg); h.Status != lease.HealthUnavailable {
			t.Fatalf("health of a closed store: %+v, want unavailable", h)
		}
	})
}
