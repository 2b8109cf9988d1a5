package leasetest

import (
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// mutationCase performs one of the five mutations on a fresh lease of e.id
// and can retry it with the same request.
type mutationCase struct {
	op   lease.Op
	code lease.Code
	// first performs the mutation; it returns the resulting record, the
	// principal that scopes its idempotency key, its request id and a retry.
	first func(e *env) (rec *lease.Record, principal, requestID string, retry func() (lease.Result, error))
}

func mutationCases() []mutationCase {
	return []mutationCase{
		{lease.OpAcquire, lease.CodeAcquired, func(e *env) (*lease.Record, string, string, func() (lease.Result, error)) {
			r := e.acquireReq()
			return e.mustAcquire(r), r.Caller.PrincipalID, r.RequestID,
				func() (lease.Result, error) { return e.st.Acquire(bg, r) }
		}},
		{lease.OpRenew, lease.CodeRenewed, func(e *env) (*lease.Record, string, string, func() (lease.Result, error)) {
			r := e.renewReq(e.grab())
			r.TTL = 45 * time.Second
			return e.mustRenew(r), r.Caller.PrincipalID, r.RequestID,
				func() (lease.Result, error) { return e.st.Renew(bg, r) }
		}},
		{lease.OpRelease, lease.CodeReleased, func(e *env) (*lease.Record, string, string, func() (lease.Result, error)) {
			r := e.releaseReq(e.grab())
			return e.mustRelease(r), r.Caller.PrincipalID, r.RequestID,
				func() (lease.Result, error) { return e.st.Release(bg, r) }
		}},
		{lease.OpForceRelease, lease.CodeForceReleased, func(e *env) (*lease.Record, string, string, func() (lease.Result, error)) {
			r := e.adminReq(e.grab())
			return e.mustAdmin(lease.OpForceRelease, r), r.Caller.PrincipalID, r.RequestID,
				func() (lease.Result, error) { return e.st.ForceRelease(bg, r) }
		}},
		{lease.OpRevoke, lease.CodeRevoked, func(e *env) (*lease.Record, string, string, func() (lease.Result, error)) {
			r := e.adminReq(e.grab())
			r.Reason, r.IncidentID = "", uid("inc_")
			return e.mustAdmin(lease.OpRevoke, r), r.Caller.PrincipalID, r.RequestID,
				func() (lease.Result, error) { return e.st.Revoke(bg, r) }
		}},
	}
}

// idempotent_retries: acquire, renew, release, force-release and revoke
// retries by request id return the original result and mutate nothing.
func (s *suite) idempotentRetries(t *testing.T) {
	for _, c := range mutationCases() {
		s.leaf(t, string(c.op), func(e *env) {
			rec, principal, rid, retry := c.first(e)
			time.Sleep(5 * time.Millisecond) // a retry that renewed would move renewed_at
			before := e.snap(e.id)
			for i := 0; i < 3; i++ {
				res, err := retry()
				e.replayed(string(c.op), res, err, c.code, rec)
				if cur := res.Current; cur != nil && (cur.LeaseID != rec.LeaseID || cur.State != rec.State) {
					e.t.Fatalf("replay reports current %s although the lease did not change state", js(cur))
				}
			}
			e.unchanged(e.id, before)
			e.mustLookup(c.op, e.id, principal, rid, c.code, rec)
		})
	}
	s.leaf(t, "scope_includes_principal", func(e *env) {
		r := e.acquireReq()
		rec := e.mustAcquire(r)
		r2 := e.acquireReqFor(e.id, newCaller("actor"))
		r2.RequestID = r.RequestID
		_, err := e.st.Acquire(bg, r2)
		mustCode(e.t, err, lease.CodeConflict)
		sameRecord(e.t, "holder", e.active(e.id), rec)
	})
	s.leaf(t, "scope_includes_operation", func(e *env) {
		r := e.acquireReq()
		rec := e.mustAcquire(r)
		rn := e.renewReq(rec)
		rn.RequestID = r.RequestID
		e.mustRenew(rn)
		rl := e.releaseReq(rec)
		rl.RequestID = r.RequestID
		e.mustRelease(rl)
	})
	s.leaf(t, "scope_includes_lock_key", func(e *env) {
		r := e.acquireReq()
		rec := e.mustAcquire(r)
		r2 := e.acquireReqFor(e.otherTarget(), e.owner)
		r2.RequestID = r.RequestID
		other := e.mustAcquire(r2)
		if other.LeaseID == rec.LeaseID || other.FencingToken != 1 {
			e.t.Fatalf("same request id on another identity returned %s", js(other))
		}
	})
}

// duplicate_request_id_with_changed_body: reuse of a request id with
// different inputs is idempotency_conflict and mutates nothing; the original
// request still replays its original result.
func (s *suite) changedBody(t *testing.T) {
	type variant struct {
		name string
		call func() error
	}
	group(t, "idempotency_conflict_no_mutation", func(t *testing.T) {
		for _, c := range []struct {
			name string
			// setup performs a mutation; it returns changed-body retries and
			// a check that the original request still replays.
			setup func(e *env) ([]variant, func())
		}{
			{"acquire", func(e *env) ([]variant, func()) {
				r := e.acquireReq()
				rec := e.mustAcquire(r)
				call := func(x lease.AcquireRequest) error { return errOf(e.st.Acquire(bg, x)) }
				return []variant{
						{"execution_id", func() error { x := r; x.ExecutionID = uid("execution_"); return call(x) }},
						{"ttl", func() error { x := r; x.TTL = Long / 2; return call(x) }},
						{"service_instance_id", func() error { x := r; x.ServiceInstanceID = uid("instance_"); return call(x) }},
						{"metadata", func() error { x := r; x.Metadata = lease.Metadata{"purpose": "other"}; return call(x) }},
					}, func() {
						res, err := e.st.Acquire(bg, r)
						e.replayed("acquire", res, err, lease.CodeAcquired, rec)
					}
			}},
			{"renew", func(e *env) ([]variant, func()) {
				r := e.renewReq(e.grab())
				rec := e.mustRenew(r)
				call := func(x lease.RenewRequest) error { return errOf(e.st.Renew(bg, x)) }
				return []variant{
						{"ttl", func() error { x := r; x.TTL = Long / 2; return call(x) }},
						{"service_instance_id", func() error { x := r; x.ServiceInstanceID = uid("instance_"); return call(x) }},
					}, func() {
						res, err := e.st.Renew(bg, r)
						e.replayed("renew", res, err, lease.CodeRenewed, rec)
					}
			}},
			{"release", func(e *env) ([]variant, func()) {
				r := e.releaseReq(e.grab())
				rec := e.mustRelease(r)
				call := func(x lease.ReleaseRequest) error { return errOf(e.st.Release(bg, x)) }
				return []variant{
						{"fencing_token", func() error { x := r; x.FencingToken++; return call(x) }},
						{"lease_id", func() error { x := r; x.LeaseID = lease.NewLeaseID(lease.At(time.Now())); return call(x) }},
					}, func() {
						res, err := e.st.Release(bg, r)
						e.replayed("release", res, err, lease.CodeReleased, rec)
					}
			}},
			{"force_release", func(e *env) ([]variant, func()) {
				r := e.adminReq(e.grab())
				rec := e.mustAdmin(lease.OpForceRelease, r)
				call := func(x lease.AdminRequest) error { return errOf(e.st.ForceRelease(bg, x)) }
				return []variant{
						{"reason", func() error { x := r; x.Reason = "another reason"; return call(x) }},
						{"incident_id", func() error { x := r; x.IncidentID = uid("inc_"); return call(x) }},
					}, func() {
						res, err := e.st.ForceRelease(bg, r)
						e.replayed("force_release", res, err, lease.CodeForceReleased, rec)
					}
			}},
			{"revoke", func(e *env) ([]variant, func()) {
				r := e.adminReq(e.grab())
				rec := e.mustAdmin(lease.OpRevoke, r)
				call := func(x lease.AdminRequest) error { return errOf(e.st.Revoke(bg, x)) }
				return []variant{
						{"reason", func() error { x := r; x.Reason = "another reason"; return call(x) }},
						{"fencing_token", func() error { x := r; x.FencingToken++; return call(x) }},
					}, func() {
						res, err := e.st.Revoke(bg, r)
						e.replayed("revoke", res, err, lease.CodeRevoked, rec)
					}
			}},
			{"commit", func(e *env) ([]variant, func()) {
				r := e.commitReq(e.grab(), "couchdb")
				c := e.mustCommit(r)
				call := func(x lease.CommitRequest) error { _, err := e.st.AuthorizeCommit(bg, x); return err }
				return []variant{
						{"execution_id", func() error { x := r; x.ExecutionID = uid("execution_"); return call(x) }},
						{"trace_id", func() error { x := r; x.TraceID = uid("trace_"); return call(x) }},
						{"fencing_token", func() error { x := r; x.FencingToken++; return call(x) }},
					}, func() {
						res, err := e.st.AuthorizeCommit(bg, r)
						if err != nil || !res.Replayed || res.Code != lease.CodeCommitAuthorized || res.Commit != c {
							e.t.Fatalf("commit replay %+v, %v; want %+v replayed", res, err, c)
						}
					}
			}},
		} {
			s.leaf(t, c.name, func(e *env) {
				variants, replay := c.setup(e)
				before := e.snap(e.id)
				for _, v := range variants {
					checkCode(e.t, "changed "+v.name, v.call(), lease.CodeIdempotencyConflict)
				}
				e.unchanged(e.id, before)
				replay()
			})
		}
	})
}

func errOf(_ lease.Result, err error) error { return err }

// acquire_response_lost: a retry by request id returns the original lease
// and token.
func (s *suite) acquireResponseLost(t *testing.T) {
	s.leaf(t, "retry_returns_original_lease_and_token", func(e *env) {
		r := e.acquireReq()
		rec := e.mustAcquire(r)
		fns := make([]func() (lease.Result, error), 8)
		for i := range fns {
			fns[i] = func() (lease.Result, error) { return e.st.Acquire(bg, r) }
		}
		for _, o := range concurrently(fns...) {
			e.replayed("acquire", o.res, o.err, lease.CodeAcquired, rec)
		}
		e.wantCounter(e.key, 1)
		sameRecord(e.t, "active", e.active(e.id), rec)
	})
	s.leaf(t, "retry_after_lease_ended_returns_original_plus_current", func(e *env) {
		r := e.acquireReq()
		rec := e.mustAcquire(r)
		released := e.mustRelease(e.releaseReq(rec))
		res, err := e.st.Acquire(bg, r)
		e.replayed("acquire", res, err, lease.CodeAcquired, rec)
		if res.Current == nil {
			e.t.Fatalf("replay of an ended lease without its current state")
		}
		sameRecord(e.t, "current state", res.Current, released)
		e.noActive(e.id)
		e.wantCounter(e.key, 1)
	})
	// A renewal's answer says the caller holds the lease too: its replay
	// after the lease ended reports the state now, as an acquire's does.
	s.leaf(t, "renew_retry_after_lease_ended_returns_original_plus_current", func(e *env) {
		rec := e.mustAcquire(e.acquireReq())
		r := e.renewReq(rec)
		renewed := e.mustRenew(r)
		released := e.mustRelease(e.releaseReq(renewed))
		res, err := e.st.Renew(bg, r)
		e.replayed("renew", res, err, lease.CodeRenewed, renewed)
		if res.Current == nil {
			e.t.Fatalf("replay of a renewal of an ended lease without its current state")
		}
		sameRecord(e.t, "current state", res.Current, released)
		e.noActive(e.id)
	})
	s.leaf(t, "retry_concurrent_with_first_attempt_allocates_once", func(e *env) {
		r := e.acquireReq()
		fns := make([]func() (lease.Result, error), 8)
		for i := range fns {
			fns[i] = func() (lease.Result, error) { return e.st.Acquire(bg, r) }
		}
		outs := concurrently(fns...)
		first := 0
		var rec *lease.Record
		for _, o := range outs {
			if o.err != nil {
				e.t.Fatalf("concurrent retry: %v", o.err)
			}
			if !o.res.Replayed {
				first++
				rec = o.res.Lease
			}
		}
		if first != 1 {
			e.t.Fatalf("%d attempts performed the acquisition, want 1", first)
		}
		for _, o := range outs {
			sameRecord(e.t, "every attempt's lease", o.res.Lease, rec)
		}
		e.wantCounter(e.key, 1)
	})
}

// service_crash_after_backend_commit: the service lost every response; the
// retries resolve from the idempotency records.
func (s *suite) crashAfterCommit(t *testing.T) {
	s.leaf(t, "retry_resolves_from_idempotency_record", func(e *env) {
		acq := e.acquireReq()
		rec := e.mustAcquire(acq)
		time.Sleep(5 * time.Millisecond)
		rn := e.renewReq(rec)
		renewed := e.mustRenew(rn)
		rl := e.releaseReq(rec)
		released := e.mustRelease(rl)
		before := e.snap(e.id)
		// The restarted service resolves each request, then retries it.
		e.mustLookup(lease.OpAcquire, e.id, acq.Caller.PrincipalID, acq.RequestID, lease.CodeAcquired, rec)
		e.mustLookup(lease.OpRenew, e.id, rn.Caller.PrincipalID, rn.RequestID, lease.CodeRenewed, renewed)
		e.mustLookup(lease.OpRelease, e.id, rl.Caller.PrincipalID, rl.RequestID, lease.CodeReleased, released)
		res, err := e.st.Acquire(bg, acq)
		e.replayed("acquire", res, err, lease.CodeAcquired, rec)
		res, err = e.st.Renew(bg, rn)
		e.replayed("renew", res, err, lease.CodeRenewed, renewed)
		res, err = e.st.Release(bg, rl)
		e.replayed("release", res, err, lease.CodeReleased, released)
		e.unchanged(e.id, before)
	})
}

// service_crash_before_backend_commit: nothing was stored; the retry
// performs the operation exactly once.
func (s *suite) crashBeforeCommit(t *testing.T) {
	s.leaf(t, "retry_performs_once", func(e *env) {
		r := e.acquireReq()
		_, err := e.lookup(lease.OpAcquire, e.id, r.Caller.PrincipalID, r.RequestID)
		mustCode(e.t, err, lease.CodeNotFound)
		e.wantCounter(e.key, 0)
		rec := e.mustAcquire(r)
		res, err := e.st.Acquire(bg, r)
		e.replayed("acquire", res, err, lease.CodeAcquired, rec)
		rl := e.releaseReq(rec)
		_, err = e.lookup(lease.OpRelease, e.id, rl.Caller.PrincipalID, rl.RequestID)
		mustCode(e.t, err, lease.CodeNotFound)
		released := e.mustRelease(rl)
		res, err = e.st.Release(bg, rl)
		e.replayed("release", res, err, lease.CodeReleased, released)
		e.wantCounter(e.key, 1)
		wantStrings(e.t, "history", e.historyStates(e.id), []string{rec.LeaseID + ":released"})
	})
}

// timeout_after_submission: the outcome is unknown until resolved by
// request id, before more work.
func (s *suite) timeoutAfterSubmission(t *testing.T) {
	s.leaf(t, "lookup_request_resolves", func(e *env) {
		r := e.acquireReq()
		done := make(chan struct{})
		go func() { // the response never reaches the caller
			defer close(done)
			_, _ = e.st.Acquire(bg, r)
		}()
		<-done
		res, err := e.lookup(lease.OpAcquire, e.id, r.Caller.PrincipalID, r.RequestID)
		if err != nil || res.Code != lease.CodeAcquired || !res.Replayed || res.Op != lease.OpAcquire || res.Lease == nil {
			e.t.Fatalf("lookup: %+v, %v; want the stored acquire", res, err)
		}
		e.checkNewLease(res.Lease, r)
		sameRecord(e.t, "resolved lease", e.active(e.id), res.Lease)
		e.mustRenew(e.renewReq(res.Lease))
	})
	s.leaf(t, "lookup_is_scoped_by_operation_principal_and_identity", func(e *env) {
		r := e.acquireReq()
		rec := e.mustAcquire(r)
		for _, c := range []struct {
			name      string
			op        lease.Op
			id        lease.Identity
			principal string
			rid       string
		}{
			{"operation", lease.OpRelease, e.id, r.Caller.PrincipalID, r.RequestID},
			{"principal", lease.OpAcquire, e.id, newCaller("actor").PrincipalID, r.RequestID},
			{"identity", lease.OpAcquire, e.otherTarget(), r.Caller.PrincipalID, r.RequestID},
			{"request_id", lease.OpAcquire, e.id, r.Caller.PrincipalID, uid("req_")},
		} {
			_, err := e.lookup(c.op, c.id, c.principal, c.rid)
			checkCode(e.t, "other "+c.name, err, lease.CodeNotFound)
		}
		e.mustLookup(lease.OpAcquire, e.id, r.Caller.PrincipalID, r.RequestID, lease.CodeAcquired, rec)
	})
}
