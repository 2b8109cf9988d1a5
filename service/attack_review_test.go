package service

// Outside adversarial review of the issue 11 fixes (i11-attack): attacks on
// the service layer, each asserting the guarantee so it fails if broken.

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Issue 11 §6: "A replay of a committed request can be answered 429:
// quotas run before the idempotency lookup. A retry after outcome_unknown
// must resolve, not be throttled." Acquire and renew look the replay up
// when a limit refuses; a publication (AuthorizeCommit with an outbox) is
// charged to the principal's bucket before the store sees it, so the retry
// of an already accepted publication — the retry fence.Retry makes after
// an outcome_unknown — is answered lease_rate_limited while the bucket is
// empty, and the publisher cannot learn that its message is in the outbox.
func TestAttackPublicationReplayNotThrottled(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{PrincipalRate: 1e-3, PrincipalBurst: 2})
	p := principal(t, "prn-pubreplay1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target)) // bucket: 1 left
	if err != nil {
		t.Fatal(err)
	}
	in := CommitInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "rabbitmq", CommitID: "pub-1", ExecutionID: "exec-1", JobID: "job-1",
		Outbox: &lease.OutboxMessage{RoutingKey: "q", Body: []byte("result")}}
	first, err := s.AuthorizeCommit(ctx, call(p), in) // bucket: 0 left
	if err != nil {
		t.Fatal(err)
	}
	// The answer was lost; the publisher retries with the same commit id.
	again, err := s.AuthorizeCommit(ctx, call(p), in)
	if err != nil || !again.Replayed || again.Commit != first.Commit {
		t.Fatalf("retry of an accepted publication with an empty bucket: %v (replayed=%v); want the original authorization",
			err, again.Replayed)
	}
	// A changed publication under the same commit id is still a conflict,
	// not a free pass around the bucket.
	changed := in
	changed.Outbox = &lease.OutboxMessage{RoutingKey: "q", Body: []byte("other")}
	if _, err := s.AuthorizeCommit(ctx, call(p), changed); code(err) != lease.CodeIdempotencyConflict && code(err) != lease.CodeRateLimited {
		t.Fatalf("changed publication under a used commit id: %v", err)
	}
}

// A guard-bound (non-outbox) commit is not charged to the bucket: its
// replay, and a new commit, resolve with an empty bucket (held).
func TestAttackCommitReplayWithEmptyBucket(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{PrincipalRate: 1e-3, PrincipalBurst: 1})
	p := principal(t, "prn-cmreplay1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	in := CommitInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "couchdb", CommitID: "c-1", ExecutionID: "exec-1", JobID: "job-1",
		Target: "doc-1", PayloadSHA256: lease.PayloadSHA256([]byte(`{}`))}
	first, err := s.AuthorizeCommit(ctx, call(p), in)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.AuthorizeCommit(ctx, call(p), in)
	if err != nil || !again.Replayed || again.Commit != first.Commit {
		t.Fatalf("commit replay: %v %+v", err, again)
	}
	other := in
	other.Target = "doc-2"
	if _, err := s.AuthorizeCommit(ctx, call(p), other); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("replayed commit id for another document: %v, want idempotency_conflict", err)
	}
}

// A stale holder's replay of its commit id after revoke, retargeted to
// another document, another payload, another job or another execution, is
// never a fresh authorization; each attempt is audited as a rejected
// commit (held).
func TestAttackRevokedHolderReplayVariants(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	s, _ := newService(t, rec, Config{})
	p := principal(t, "prn-stale1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	adm := principal(t, "prn-admin1", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	base := CommitInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "couchdb", CommitID: "c-1", ExecutionID: "exec-1", JobID: "job-1",
		Target: "doc-1", PayloadSHA256: lease.PayloadSHA256([]byte(`{"v":1}`))}
	if _, err := s.AuthorizeCommit(ctx, call(p), base); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(ctx, call(adm), AdminInput{Identity: target, LeaseID: got.Lease.LeaseID,
		FencingToken: got.Lease.FencingToken, Reason: "drill"}); err != nil {
		t.Fatal(err)
	}
	before := len(rec.OfType(audit.EventCommitRejected))
	variants := map[string]func(*CommitInput){
		"target":    func(c *CommitInput) { c.Target = "doc-2" },
		"payload":   func(c *CommitInput) { c.PayloadSHA256 = lease.PayloadSHA256([]byte(`{"v":2}`)) },
		"no-digest": func(c *CommitInput) { c.PayloadSHA256 = "" },
		"job":       func(c *CommitInput) { c.JobID = "job-2" },
		"execution": func(c *CommitInput) { c.ExecutionID = "exec-2" },
		"trace":     func(c *CommitInput) { c.TraceID = "trace-x" },
		"sink":      func(c *CommitInput) { c.Sink = "couchdb-2" },
		"new-id":    func(c *CommitInput) { c.CommitID = "c-2" },
		"outbox": func(c *CommitInput) {
			c.Target, c.PayloadSHA256, c.Outbox = "", "", &lease.OutboxMessage{RoutingKey: "q", Body: []byte("x")}
		},
		"case-target": func(c *CommitInput) { c.Target = "DOC-1" },
	}
	for name, mut := range variants {
		in := base
		mut(&in)
		res, err := s.AuthorizeCommit(ctx, call(p), in)
		if err == nil {
			t.Errorf("%s: revoked holder got an authorization %+v", name, res.Commit)
		}
	}
	if n := len(rec.OfType(audit.EventCommitRejected)) - before; n != len(variants) {
		t.Errorf("%d rejected-commit events for %d refused attempts", n, len(variants))
	}
	// The exact replay still answers (the contract's linearized commit).
	if res, err := s.AuthorizeCommit(ctx, call(p), base); err != nil || !res.Replayed {
		t.Errorf("exact replay after revoke: %v", err)
	}
	_ = time.Second
}
