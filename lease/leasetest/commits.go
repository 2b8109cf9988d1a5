package leasetest

import (
	"strings"
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

// commit_binds_one_write: an authorization authorizes exactly one write.
// The commit id's digest covers the write (target, payload digest) and the
// lease's job; a replay answers only for that write.
func (s *suite) commitBindsOneWrite(t *testing.T) {
	s.leaf(t, "replay_with_another_target", func(e *env) {
		rec := e.grab()
		r := e.commitReq(rec, "couchdb")
		c := e.mustCommit(r)
		for _, v := range []struct {
			name   string
			change func(*lease.CommitRequest)
		}{
			{"target", func(x *lease.CommitRequest) { x.Target = uid("doc:") }},
			{"payload_sha256", func(x *lease.CommitRequest) { x.PayloadSHA256 = payloadDigest(uid("body_")) }},
			{"no payload_sha256", func(x *lease.CommitRequest) { x.PayloadSHA256 = "" }},
		} {
			x := r
			v.change(&x)
			before := e.snap(e.id)
			e.commitFails(x, lease.CodeIdempotencyConflict)
			e.unchanged(e.id, before)
			// The other write needs a commit id of its own, and gets it
			// while the lease is held.
			x.CommitID = uid("commit_")
			e.mustCommit(x)
		}
		e.mustReplayCommit(r, c)
	})
	s.leaf(t, "another_job", func(e *env) {
		rec := e.grab()
		for _, v := range []struct {
			name   string
			change func(*lease.CommitRequest)
		}{
			{"job_id", func(x *lease.CommitRequest) { x.JobID = uid("job_") }},
			{"execution_id", func(x *lease.CommitRequest) { x.ExecutionID = uid("execution_") }},
		} {
			x := e.commitReq(rec, "couchdb")
			v.change(&x)
			before := e.snap(e.id)
			e.commitFails(x, lease.CodeLost)
			e.unchanged(e.id, before)
		}
		// Nothing was recorded for the refused ids: the lease's own job
		// commits, and the lease is untouched.
		e.mustCommit(e.commitReq(rec, "couchdb"))
		e.mustRenew(e.renewReq(rec))
	})
	s.leaf(t, "target_is_required", func(e *env) {
		rec := e.grab()
		for _, v := range []struct {
			field  string
			change func(*lease.CommitRequest)
		}{
			{"target", func(x *lease.CommitRequest) { x.Target = "" }},
			{"target", func(x *lease.CommitRequest) { x.Target = "doc\x00x" }},
			{"target", func(x *lease.CommitRequest) { x.Target = string(make([]byte, lease.MaxCommitTargetBytes+1)) }},
			{"payload_sha256", func(x *lease.CommitRequest) { x.PayloadSHA256 = "ABC" }},
			{"payload_sha256", func(x *lease.CommitRequest) { x.PayloadSHA256 = strings.ToUpper(payloadDigest("x")) }},
			{"job_id", func(x *lease.CommitRequest) { x.JobID = "" }},
			{"target", func(x *lease.CommitRequest) { x.Outbox = publication(`{}`) }}, // a publication names its own write
		} {
			x := e.commitReq(rec, "couchdb")
			v.change(&x)
			_, err := e.st.AuthorizeCommit(bg, x)
			if le := lease.AsError(err); err == nil || le.Code != lease.CodeInvalidRequest || le.Field != v.field {
				e.t.Fatalf("%s: %v, want invalid_lease_request on %s", v.field, err, v.field)
			}
		}
	})
}

// ending is one way a holder's lease ends.
type ending struct {
	name string
	// grab acquires the holder's lease; end ends it and returns the
	// successor's lease, if the ending makes one.
	grab func(e *env) *lease.Record
	end  func(e *env, rec *lease.Record) *lease.Record
}

var endings = []ending{
	{"revoke", (*env).grab, func(e *env, rec *lease.Record) *lease.Record {
		e.mustAdmin(lease.OpRevoke, e.adminReq(rec))
		return nil
	}},
	{"force_release", (*env).grab, func(e *env, rec *lease.Record) *lease.Record {
		e.mustAdmin(lease.OpForceRelease, e.adminReq(rec))
		return nil
	}},
	{"release", (*env).grab, func(e *env, rec *lease.Record) *lease.Record {
		e.mustRelease(e.releaseReq(rec))
		return nil
	}},
	{"expiry", (*env).grabShort, func(e *env, rec *lease.Record) *lease.Record {
		e.waitExpired(rec)
		return nil
	}},
	{"supersession", (*env).grabShort, func(e *env, rec *lease.Record) *lease.Record {
		e.waitExpired(rec)
		succ := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		e.mustCommit(e.commitReq(succ, "couchdb"))
		return succ
	}},
}

// stale_holder_write_paths: a holder whose lease ended (revoked,
// force-released, released, expired, superseded) tries every write path
// it still has at the authorization boundary: a new commit id, a replayed
// commit id for another write, payload or job, a new publication, a
// replayed publication with another body. Nothing is authorized but the
// exact writes authorized before the lease ended, and nothing changes.
func (s *suite) staleHolderWritePaths(t *testing.T) {
	for _, end := range endings {
		s.leaf(t, end.name, func(e *env) {
			rec := end.grab(e)
			doc := e.commitReq(rec, "couchdb")
			c := e.mustCommit(doc)
			pub := e.commitReq(rec, "rabbitmq")
			pub.Target, pub.PayloadSHA256 = "", ""
			pub.Outbox = publication(`{"from":"holder"}`)
			p := e.mustCommit(pub)
			succ := end.end(e, rec)

			fresh := e.commitReq(rec, "couchdb")
			e.commitFails(fresh, lease.CodeLost)
			// (After the first refusal: it may archive an expired record.)
			before := e.snap(e.id)
			freshPub := e.commitReq(rec, "rabbitmq")
			freshPub.Target, freshPub.PayloadSHA256 = "", ""
			freshPub.Outbox = publication(`{"from":"stale holder"}`)
			e.commitFails(freshPub, lease.CodeLost)
			for _, change := range []func(*lease.CommitRequest){
				func(x *lease.CommitRequest) { x.Target = uid("doc:") },
				func(x *lease.CommitRequest) { x.Target = fresh.Target },
				func(x *lease.CommitRequest) { x.PayloadSHA256 = payloadDigest("after the end") },
				func(x *lease.CommitRequest) { x.JobID = uid("job_") },
			} {
				x := doc
				change(&x)
				e.commitFails(x, lease.CodeIdempotencyConflict)
			}
			changedPub := pub
			changedPub.Outbox = publication(`{"from":"holder, after the end"}`)
			e.commitFails(changedPub, lease.CodeIdempotencyConflict)
			e.unchanged(e.id, before)

			// What was authorized while the lease was live still answers,
			// for exactly its write.
			e.mustReplayCommit(doc, c)
			e.mustReplayCommit(pub, p)
			got := e.outboxOf(e.key)
			if len(got) != 1 || string(got[0].Message.Body) != `{"from":"holder"}` || got[0].MessageID != p.Target {
				e.t.Fatalf("outbox after the stale holder's attempts: %s", js(got))
			}
			e.outboxDone(got[0].MessageID)
			if succ != nil {
				e.mustCommit(e.commitReq(succ, "couchdb"))
			}
		})
	}
}

// replayOnly is r asking only for its replay (CommitRequest.ReplayOnly).
func replayOnly(r lease.CommitRequest) lease.CommitRequest {
	r.ReplayOnly = true
	return r
}

// commit_replay_only: a ReplayOnly commit (how a rate-limited caller still
// resolves the retry of a commit it made) answers from the commit id's
// evidence alone: the replay of the accepted commit, idempotency_conflict
// for other inputs, else lease_not_found. It does not check the lease, so
// it answers after the lease ended, and it writes nothing: no evidence, no
// commit seq, no high-water mark, no outbox entry.
func (s *suite) commitReplayOnly(t *testing.T) {
	s.leaf(t, "no_evidence_writes_nothing", func(e *env) {
		e.setCounter(e.key, 41)
		high := e.grab()
		doc := e.commitReq(high, "couchdb")
		pub := e.publicationReq(high, publication(`{"from":"replay only"}`))
		before := e.snap(e.id)
		for _, r := range []lease.CommitRequest{doc, pub} {
			e.commitFails(replayOnly(r), lease.CodeNotFound)
			e.commitFails(replayOnly(r), lease.CodeNotFound) // the first recorded nothing
		}
		e.unchanged(e.id, before)
		if got := e.outboxOf(e.key); len(got) != 0 {
			e.t.Fatalf("a replay-only publication entered the outbox: %s", js(got))
		}
		// The publication's commit id is unused: it is accepted now, as
		// the identity's first commit.
		p := e.mustCommit(pub)
		if p.Seq != 1 {
			e.t.Fatalf("commit seq %d after replay-only requests alone: they consumed a sequence", p.Seq)
		}
		e.outboxDone(p.Target)
		// No high-water mark was raised on couchdb by token 42, and the
		// document's commit id is unused: with the counter lowered, token
		// 10 commits that id there, as a first acceptance.
		e.mustRelease(e.releaseReq(high))
		e.setCounter(e.key, 9)
		low := e.mustAcquire(e.acquireReqFor(e.id, newCaller("actor")))
		if low.FencingToken != 10 {
			e.t.Fatalf("token %d after lowering the counter to 9", low.FencingToken)
		}
		x := e.commitReq(low, "couchdb")
		x.CommitID, x.Target, x.PayloadSHA256 = doc.CommitID, doc.Target, doc.PayloadSHA256
		if c := e.mustCommit(x); c.Seq != p.Seq+1 {
			e.t.Fatalf("commit seq %d after %d", c.Seq, p.Seq)
		}
	})
	s.leaf(t, "replays_accepted_commit", func(e *env) {
		rec := e.grab()
		doc := e.commitReq(rec, "couchdb")
		c := e.mustCommit(doc)
		pub := e.publicationReq(rec, publication(`{"from":"holder"}`))
		p := e.mustCommit(pub)
		before := e.snap(e.id)
		e.mustReplayCommit(replayOnly(doc), c)
		e.mustReplayCommit(replayOnly(pub), p)
		e.mustReplayCommit(doc, c) // the same evidence answers either way
		e.unchanged(e.id, before)
		if got := e.outboxOf(e.key); len(got) != 1 || got[0].MessageID != p.Target {
			e.t.Fatalf("outbox after replay-only replays: %s", js(got))
		}
		e.outboxDone(p.Target)
		if n := e.mustCommit(e.commitReq(rec, "couchdb")); n.Seq != p.Seq+1 {
			e.t.Fatalf("commit seq %d after %d: a replay consumed a sequence", n.Seq, p.Seq)
		}
	})
	s.leaf(t, "changed_inputs_conflict", func(e *env) {
		rec := e.grab()
		doc := e.commitReq(rec, "couchdb")
		c := e.mustCommit(doc)
		pub := e.publicationReq(rec, publication(`{"from":"holder"}`))
		p := e.mustCommit(pub)
		before := e.snap(e.id)
		for _, change := range []func(*lease.CommitRequest){
			func(x *lease.CommitRequest) { x.Target = uid("doc:") },
			func(x *lease.CommitRequest) { x.PayloadSHA256 = payloadDigest(uid("body_")) },
			func(x *lease.CommitRequest) { x.JobID = uid("job_") },
		} {
			x := doc
			change(&x)
			e.commitFails(replayOnly(x), lease.CodeIdempotencyConflict)
		}
		changed := pub
		changed.Outbox = publication(`{"from":"holder, changed"}`)
		e.commitFails(replayOnly(changed), lease.CodeIdempotencyConflict)
		e.unchanged(e.id, before)
		if got := e.outboxOf(e.key); len(got) != 1 || string(got[0].Message.Body) != `{"from":"holder"}` {
			e.t.Fatalf("outbox after conflicting replay-only requests: %s", js(got))
		}
		e.outboxDone(p.Target)
		e.mustReplayCommit(doc, c)
	})
	s.leaf(t, "after_revoke", func(e *env) {
		rec := e.grab()
		doc := e.commitReq(rec, "couchdb")
		c := e.mustCommit(doc)
		pub := e.publicationReq(rec, publication(`{"from":"holder"}`))
		p := e.mustCommit(pub)
		e.mustAdmin(lease.OpRevoke, e.adminReq(rec))
		before := e.snap(e.id)
		e.mustReplayCommit(replayOnly(doc), c)
		e.mustReplayCommit(replayOnly(pub), p)
		changed := doc
		changed.Target = uid("doc:")
		e.commitFails(replayOnly(changed), lease.CodeIdempotencyConflict)
		// A commit id never accepted has no evidence: not found, not
		// lease_lost (the lease is not what it asks about).
		e.commitFails(replayOnly(e.commitReq(rec, "couchdb")), lease.CodeNotFound)
		e.unchanged(e.id, before)
		e.outboxDone(p.Target)
	})
}
