package leasetest

import (
	"testing"

	"github.com/starintel/starlease/lease"
)

// commitFails asserts a commit authorization fails with code.
func (e *env) commitFails(r lease.CommitRequest, code lease.Code) {
	e.t.Helper()
	_, err := e.st.AuthorizeCommit(bg, r)
	mustCode(e.t, err, code)
}

// mustReplayCommit asserts r replays the accepted commit c.
func (e *env) mustReplayCommit(r lease.CommitRequest, c lease.Commit) {
	e.t.Helper()
	res, err := e.st.AuthorizeCommit(bg, r)
	if err != nil || res.Code != lease.CodeCommitAuthorized || !res.Replayed || res.Commit != c {
		e.t.Fatalf("commit retry: %+v, %v; want replay of %+v", res, err, c)
	}
}

// former_holder_commits_after_expiry: fenced-write validation rejects it as
// lease-lost; a commit linearized while the lease was valid stays accepted.
func (s *suite) commitsAfterExpiry(t *testing.T) {
	s.leaf(t, "lease_lost", func(e *env) {
		rec := e.grabShort()
		r := e.commitReq(rec, "couchdb")
		c := e.mustCommit(r)
		e.waitExpired(rec)
		e.commitFails(e.commitReq(rec, "couchdb"), lease.CodeLost)
		e.commitFails(e.commitReq(rec, "rabbitmq"), lease.CodeLost)
		e.mustReplayCommit(r, c)
		e.stateOf(rec.LeaseID, lease.StateExpired)
		succ := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		e.mustCommit(e.commitReq(succ, "couchdb"))
	})
}

// former_holder_commits_after_release: lease-lost.
func (s *suite) commitsAfterRelease(t *testing.T) {
	s.leaf(t, "lease_lost", func(e *env) {
		rec := e.grab()
		e.mustRelease(e.releaseReq(rec))
		e.commitFails(e.commitReq(rec, "couchdb"), lease.CodeLost)
		e.stateOf(rec.LeaseID, lease.StateReleased)
	})
}

// former_holder_commits_after_new_acquisition: the former holder's lower
// token is rejected.
func (s *suite) commitsAfterNewAcquisition(t *testing.T) {
	s.leaf(t, "lease_lost", func(e *env) {
		old := e.grab()
		e.mustCommit(e.commitReq(old, "couchdb"))
		e.mustRelease(e.releaseReq(old))
		succ := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		e.mustCommit(e.commitReq(succ, "couchdb"))
		before := e.snap(e.id)
		e.commitFails(e.commitReq(old, "couchdb"), lease.CodeLost)
		e.commitFails(e.commitReq(old, "rabbitmq"), lease.CodeLost)
		e.unchanged(e.id, before)
		e.mustCommit(e.commitReq(succ, "couchdb"))
	})
	s.leaf(t, "lower_token_rejected", func(e *env) {
		// A token below the high-water mark can only be live if the counter
		// was lowered (a bad restore): the fencing guard must still refuse.
		e.setCounter(e.key, 41)
		high := e.grab()
		e.mustCommit(e.commitReq(high, "couchdb"))
		e.mustRelease(e.releaseReq(high))
		e.setCounter(e.key, 9)
		low := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		if low.FencingToken != 10 {
			e.t.Fatalf("token %d after lowering the counter to 9", low.FencingToken)
		}
		before := e.snap(e.id)
		r := e.commitReq(low, "couchdb")
		e.commitFails(r, lease.CodeCommitRejected)
		e.commitFails(r, lease.CodeCommitRejected) // a rejection is not stored as a success
		e.commitFails(e.commitReq(low, "couchdb"), lease.CodeCommitRejected)
		e.unchanged(e.id, before)
		e.wantCounter(e.key, 10)
		// The high-water mark is per sink.
		e.mustCommit(e.commitReq(low, "rabbitmq"))
		e.mustRenew(e.renewReq(low))
	})
}

// commit_authorization: what an accepted commit records and how it replays.
func (s *suite) commitAuthorization(t *testing.T) {
	s.leaf(t, "authorized_commit_read_back", func(e *env) {
		rec := e.grab()
		before := e.snap(e.id)
		c := e.mustCommit(e.commitReq(rec, "couchdb"))
		if c.AcceptedAt.Before(rec.AcquiredAt) || !c.AcceptedAt.Before(rec.ExpiresAt) {
			e.t.Fatalf("accepted_at %v outside the lease [%v, %v)", c.AcceptedAt, rec.AcquiredAt, rec.ExpiresAt)
		}
		// Another commit under the same token (equal to the high-water mark).
		c2 := e.mustCommit(e.commitReq(rec, "couchdb"))
		if c2.AcceptedAt.Before(c.AcceptedAt) {
			e.t.Fatalf("backend time went backwards: %v after %v", c2.AcceptedAt, c.AcceptedAt)
		}
		e.unchanged(e.id, before) // authorization does not touch the lease
	})
	s.leaf(t, "replay_by_commit_id_after_lease_ended", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "couchdb")
		c := e.mustCommit(r)
		e.mustReplayCommit(r, c)
		e.mustRelease(e.releaseReq(rec))
		e.mustReplayCommit(r, c)
	})
	s.leaf(t, "commit_id_is_scoped_by_sink", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "couchdb")
		e.mustCommit(r)
		r.Sink = "rabbitmq"
		e.mustCommit(r)
	})
	s.leaf(t, "high_water_is_per_identity", func(e *env) {
		e.setCounter(e.key, 99)
		high := e.grab()
		e.mustCommit(e.commitReq(high, "couchdb"))
		other := e.mustAcquire(e.acquireReqFor(e.otherTarget(), e.owner))
		if other.FencingToken != 1 {
			e.t.Fatalf("token %d on a fresh identity", other.FencingToken)
		}
		e.mustCommit(e.commitReq(other, "couchdb"))
	})
}
