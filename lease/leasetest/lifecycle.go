package leasetest

import (
	"errors"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// ttl_and_lifetime: TTL, maximum lifetime and backend time are enforced.
func (s *suite) ttlAndLifetime(t *testing.T) {
	s.leaf(t, "expires_at_is_acquired_at_plus_ttl", func(e *env) {
		r := e.acquireReq()
		r.TTL, r.MaximumLifetime = 7*time.Second, 7*time.Second
		rec := e.mustAcquire(r) // checks expires_at = acquired_at + ttl
		sameRecord(e.t, "inspected", e.active(e.id), rec)
	})
	s.leaf(t, "renew_extends_from_backend_time", func(e *env) {
		rec := e.grab()
		time.Sleep(20 * time.Millisecond)
		r := e.renewReq(rec)
		r.TTL = 40 * time.Second
		got := e.mustRenew(r)
		if !rec.AcquiredAt.Before(got.RenewedAt) || got.ExpiresAt != got.RenewedAt.Add(r.TTL) || got.TTLMs != r.TTL.Milliseconds() {
			e.t.Fatalf("renewed %s, want renewed_at after acquired_at %v and expires_at = renewed_at + 40s", js(got), rec.AcquiredAt)
		}
		sameRecord(e.t, "inspected", e.active(e.id), got)
	})
	s.leaf(t, "renew_without_ttl_keeps_ttl_ms", func(e *env) {
		rec := e.grab()
		time.Sleep(5 * time.Millisecond)
		got := e.mustRenew(e.renewReq(rec))
		if got.TTLMs != rec.TTLMs || got.ExpiresAt != got.RenewedAt.Add(Long) {
			e.t.Fatalf("renewed %s, want ttl_ms %d and expires_at = renewed_at + ttl", js(got), rec.TTLMs)
		}
	})
	s.leaf(t, "renew_is_capped_by_maximum_lifetime", func(e *env) {
		r := e.acquireReq()
		r.TTL, r.MaximumLifetime = 10*time.Second, 10*time.Second
		rec := e.mustAcquire(r)
		time.Sleep(20 * time.Millisecond)
		got := e.mustRenew(e.renewReq(rec))
		limit := rec.AcquiredAt.Add(r.MaximumLifetime)
		if !rec.AcquiredAt.Before(got.RenewedAt) || got.ExpiresAt != limit {
			e.t.Fatalf("renewed %s, want expires_at capped at acquired_at + maximum_lifetime = %v", js(got), limit)
		}
		sameRecord(e.t, "inspected", e.active(e.id), got)
	})
	s.leaf(t, "renewal_preserves_owner_execution_job_token_lifetime", func(e *env) {
		rec := e.grab()
		time.Sleep(5 * time.Millisecond)
		r := e.renewReq(rec)
		r.TTL = 20 * time.Second
		got := e.mustRenew(r)
		want := rec.Clone()
		want.RenewedAt, want.ExpiresAt, want.TTLMs, want.RequestID = got.RenewedAt, got.ExpiresAt, got.TTLMs, got.RequestID
		sameRecord(e.t, "renewed record apart from renewed_at, expires_at, ttl_ms, request_id", got, want)
		e.wantCounter(e.key, rec.FencingToken)
	})
	s.leaf(t, "lease_expires_at_backend_time", func(e *env) {
		rec := e.grabShort()
		_, err := e.st.Acquire(bg, e.acquireReqFor(e.id, newCaller("actor")))
		mustCode(e.t, err, lease.CodeConflict)
		e.waitExpired(rec)
		e.noActive(e.id)
		if got := e.list(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID}); len(got) != 0 {
			e.t.Fatalf("expired lease still listed")
		}
		e.wantNextToken(rec, lease.StateExpired)
		wantStrings(e.t, "history", e.historyStates(e.id), []string{rec.LeaseID + ":expired"})
	})
	s.leaf(t, "maximum_lifetime_ends_renewals", func(e *env) {
		r := e.acquireReq()
		r.TTL, r.MaximumLifetime = Short, Short+Short/2
		rec := e.mustAcquire(r)
		limit := rec.AcquiredAt.Add(r.MaximumLifetime)
		renewals := 0
		for stop := time.Now().Add(r.MaximumLifetime + 2*time.Second); ; time.Sleep(25 * time.Millisecond) {
			if time.Now().After(stop) {
				e.t.Fatalf("renewals still succeed past the maximum lifetime")
			}
			rn := e.renewReq(rec)
			rn.TTL = Long // asks for far more than the lifetime left
			res, err := e.st.Renew(bg, rn)
			if err != nil {
				mustCode(e.t, err, lease.CodeLost)
				break
			}
			if res.Lease.ExpiresAt != limit {
				e.t.Fatalf("renewal set expires_at %v, want it capped at acquired_at + maximum_lifetime %v", res.Lease.ExpiresAt, limit)
			}
			renewals++
		}
		if renewals == 0 {
			e.t.Fatalf("no renewal succeeded before the lease expired")
		}
		got := e.stateOf(rec.LeaseID, lease.StateExpired)
		if got.ExpiresAt != limit {
			e.t.Fatalf("expired at %v, want the lifetime limit %v", got.ExpiresAt, limit)
		}
	})
}

// terminal_never_reactivates: no operation transitions a terminal record
// back to active.
func (s *suite) terminalNeverReactivates(t *testing.T) {
	for _, how := range []ender{endRelease, endForceRelease, endRevoke} {
		s.leaf(t, "after_"+how.name, func(e *env) {
			rec := e.grab()
			ended := e.end(how, rec)
			before := e.snap(e.id)
			_, err := e.st.Renew(bg, e.renewReq(rec))
			checkCode(e.t, "renew", err, lease.CodeLost)
			_, err = e.st.Release(bg, e.releaseReq(rec))
			checkCode(e.t, "release", err, lease.CodeLost)
			for _, op := range []lease.Op{lease.OpForceRelease, lease.OpRevoke} {
				_, err = e.adminOp(op, e.adminReq(rec))
				checkCode(e.t, string(op), err, lease.CodeLost)
			}
			_, err = e.st.AuthorizeCommit(bg, e.commitReq(rec, "couchdb"))
			checkCode(e.t, "commit", err, lease.CodeLost)
			e.unchanged(e.id, before)
			sameRecord(e.t, "terminal record", e.byID(rec.LeaseID), ended)
			e.noActive(e.id)
		})
	}
}

// stale_operations_never_mutate_successor: stale renew, release, expiry
// cleanup, administrative operations and commits cannot touch a successor.
func (s *suite) staleNeverMutatesSuccessor(t *testing.T) {
	setup := func(e *env) (old, succ *lease.Record) {
		old = e.grab()
		e.mustRelease(e.releaseReq(old))
		succ = e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		return old, succ
	}
	for _, c := range []struct {
		name string
		call func(e *env, old, succ *lease.Record) error
	}{
		{"renew", func(e *env, old, _ *lease.Record) error { _, err := e.st.Renew(bg, e.renewReq(old)); return err }},
		{"release", func(e *env, old, _ *lease.Record) error { _, err := e.st.Release(bg, e.releaseReq(old)); return err }},
		{"force_release", func(e *env, old, _ *lease.Record) error {
			_, err := e.st.ForceRelease(bg, e.adminReq(old))
			return err
		}},
		{"revoke", func(e *env, old, _ *lease.Record) error { _, err := e.st.Revoke(bg, e.adminReq(old)); return err }},
		{"revoke_with_stale_token", func(e *env, old, succ *lease.Record) error {
			r := e.adminReq(succ)
			r.FencingToken = old.FencingToken
			_, err := e.st.Revoke(bg, r)
			return err
		}},
		{"force_release_with_stale_lease_id", func(e *env, old, succ *lease.Record) error {
			r := e.adminReq(succ)
			r.LeaseID = old.LeaseID
			_, err := e.st.ForceRelease(bg, r)
			return err
		}},
		{"commit", func(e *env, old, _ *lease.Record) error {
			_, err := e.st.AuthorizeCommit(bg, e.commitReq(old, "couchdb"))
			return err
		}},
		{"successor_owner_with_stale_token", func(e *env, old, succ *lease.Record) error {
			h := heldOf(succ)
			h.Token = old.FencingToken
			_, err := e.st.Renew(bg, h.renew(e))
			return err
		}},
	} {
		s.leaf(t, c.name, func(e *env) {
			old, succ := setup(e)
			before := e.snap(e.id)
			mustCode(e.t, c.call(e, old, succ), lease.CodeLost)
			e.unchanged(e.id, before)
			e.mustRenew(e.renewReq(succ))
		})
	}
	s.leaf(t, "expiry_cleanup", func(e *env) {
		old, succ := setup(e)
		before := e.snap(e.id)
		e.expireIfCurrent(old)
		e.unchanged(e.id, before)
		sameRecord(e.t, "successor", e.active(e.id), succ)
	})
}

// expireIfCurrent runs the backend's conditional expiry cleanup for rec. A
// cleanup that does nothing may report so with a *lease.Error; any other
// error fails.
func (e *env) expireIfCurrent(rec *lease.Record) {
	e.t.Helper()
	e.expireIfCurrentKey(rec.LockKey, rec.LeaseID, rec.FencingToken)
}

func (e *env) expireIfCurrentKey(key, leaseID string, token uint64) {
	e.t.Helper()
	if err := e.faults.ExpireIfCurrent(bg, key, leaseID, token); err != nil {
		var le *lease.Error
		if !errors.As(err, &le) {
			e.t.Fatalf("expiry cleanup: error %T (%v) is not a *lease.Error", err, err)
		}
		e.t.Logf("expiry cleanup reported %v", err)
	}
}

// stale_release_after_reacquire: compare-and-delete mismatch; the successor
// remains active.
func (s *suite) staleReleaseAfterReacquire(t *testing.T) {
	s.leaf(t, "successor_remains_active", func(e *env) {
		old := e.grabShort()
		e.waitExpired(old)
		succ := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		before := e.snap(e.id)
		_, err := e.st.Release(bg, e.releaseReq(old))
		mustCode(e.t, err, lease.CodeLost)
		e.unchanged(e.id, before)
		sameRecord(e.t, "successor", e.active(e.id), succ)
		e.stateOf(old.LeaseID, lease.StateExpired)
		e.mustRelease(e.releaseReq(succ))
	})
}

// delayed_expiry_cleanup_sees_successor: cleanup is conditional on lease id
// and token, so it cannot delete a newer lease.
func (s *suite) delayedExpiryCleanup(t *testing.T) {
	s.leaf(t, "successor_remains_active", func(e *env) {
		old := e.grabShort()
		e.waitExpired(old)
		succ := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		before := e.snap(e.id)
		e.expireIfCurrent(old)
		e.unchanged(e.id, before)
		sameRecord(e.t, "successor", e.active(e.id), succ)
	})
	s.leaf(t, "unexpired_lease_is_untouched", func(e *env) {
		rec := e.grab()
		before := e.snap(e.id)
		e.expireIfCurrent(rec)
		e.unchanged(e.id, before)
		e.mustRenew(e.renewReq(rec))
	})
	s.leaf(t, "mismatched_token_is_a_noop", func(e *env) {
		rec := e.grabShort()
		e.waitExpired(rec)
		before := e.snap(e.id)
		e.expireIfCurrentKey(rec.LockKey, rec.LeaseID, rec.FencingToken+1)
		e.expireIfCurrentKey(rec.LockKey, lease.NewLeaseID(lease.At(time.Now())), rec.FencingToken)
		e.unchanged(e.id, before)
	})
	s.leaf(t, "expired_current_lease_is_cleaned_once", func(e *env) {
		rec := e.grabShort()
		e.waitExpired(rec)
		e.expireIfCurrent(rec)
		_, err := e.inspect(e.id)
		mustCode(e.t, err, lease.CodeNotFound)
		want := rec.Clone()
		want.State = lease.StateExpired
		sameRecord(e.t, "expired record", e.byID(rec.LeaseID), want)
		before := e.snap(e.id)
		e.expireIfCurrent(rec)
		e.unchanged(e.id, before)
		wantStrings(e.t, "history", e.historyStates(e.id), []string{rec.LeaseID + ":expired"})
		e.wantCounter(e.key, 1)
		e.wantNextToken(rec, lease.StateExpired)
	})
}

// matchOp is an operation that requires the exact lease tuple.
type matchOp struct {
	name string
	call func(e *env, h held, commitID string) error
	// ok performs the exact-tuple request successfully afterwards.
	ok func(e *env, rec *lease.Record, commitID string)
}

var (
	opRenew = matchOp{"renew",
		func(e *env, h held, _ string) error { _, err := e.st.Renew(bg, h.renew(e)); return err },
		func(e *env, rec *lease.Record, _ string) { e.mustRenew(e.renewReq(rec)) }}
	opRelease = matchOp{"release",
		func(e *env, h held, _ string) error { _, err := e.st.Release(bg, h.release(e)); return err },
		func(e *env, rec *lease.Record, _ string) { e.mustRelease(e.releaseReq(rec)) }}
	// A lost commit stores nothing: the same commit id then authorizes
	// afresh with the exact tuple.
	opCommit = matchOp{"commit",
		func(e *env, h held, id string) error {
			r := h.commit("couchdb")
			r.CommitID = id
			_, err := e.st.AuthorizeCommit(bg, r)
			return err
		},
		func(e *env, rec *lease.Record, id string) {
			r := e.commitReq(rec, "couchdb")
			r.CommitID = id
			e.mustCommit(r)
		}}
)

// <op>_requires_every_field: renew-if-owner, release-if-owner and commit
// authorization require every matching field; a mismatch is lease-lost and
// mutates nothing.
func (s *suite) requiresEveryField(op matchOp) func(*testing.T) {
	return func(t *testing.T) {
		for _, m := range []struct {
			field string
			// apply makes h mismatch; it may return another identity whose
			// state must stay unchanged too.
			apply func(e *env, rec *lease.Record, h *held) *lease.Identity
		}{
			{"lease_id", func(e *env, _ *lease.Record, h *held) *lease.Identity {
				h.LeaseID = lease.NewLeaseID(lease.At(time.Now()))
				return nil
			}},
			{"owner_principal_id", func(e *env, _ *lease.Record, h *held) *lease.Identity {
				h.Caller.PrincipalID = newCaller("actor").PrincipalID
				return nil
			}},
			{"service_instance_id", func(e *env, _ *lease.Record, h *held) *lease.Identity {
				h.Instance = uid("instance_")
				return nil
			}},
			{"fencing_token", func(e *env, _ *lease.Record, h *held) *lease.Identity {
				h.Token++
				return nil
			}},
			{"lock_identity", func(e *env, rec *lease.Record, h *held) *lease.Identity {
				// Another identity held by the same owner and instance with
				// the same token: only the identity tells them apart.
				other := e.otherTarget()
				e.mustAcquire(e.acquireReqFor(other, callerOf(rec)))
				h.Identity = other
				return &other
			}},
		} {
			s.leaf(t, m.field, func(e *env) {
				rec := e.grab()
				h := heldOf(rec)
				other := m.apply(e, rec, &h)
				before := e.snap(e.id)
				var beforeOther string
				if other != nil {
					beforeOther = e.snap(*other)
				}
				commitID := uid("commit_")
				mustCode(e.t, op.call(e, h, commitID), lease.CodeLost)
				e.unchanged(e.id, before)
				if other != nil {
					e.unchanged(*other, beforeOther)
				}
				op.ok(e, rec, commitID)
			})
		}
	}
}
