package service

import (
	"context"
	"testing"

	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// A publication the bucket refuses and that has no evidence stays refused
// (429) and, asked of the store replay-only, changes nothing: the outbox
// holds only the accepted publication.
func TestThrottledNewPublicationStaysRefusedAndWritesNothing(t *testing.T) {
	ctx := context.Background()
	s, store := newService(t, &audittest.Recorder{}, Config{PrincipalRate: 1e-3, PrincipalBurst: 2})
	p := principal(t, "prn-pubnew1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target)) // bucket: 1 left
	if err != nil {
		t.Fatal(err)
	}
	in := CommitInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "rabbitmq", CommitID: "pub-1", ExecutionID: "exec-1", JobID: "job-1",
		Outbox: &lease.OutboxMessage{RoutingKey: "q", Body: []byte("result")}}
	if _, err := s.AuthorizeCommit(ctx, call(p), in); err != nil { // bucket: 0 left
		t.Fatal(err)
	}
	next := in
	next.CommitID = "pub-2"
	for range 2 {
		if _, err := s.AuthorizeCommit(ctx, call(p), next); code(err) != lease.CodeRateLimited {
			t.Fatalf("new publication with an empty bucket: %v, want lease_rate_limited", err)
		}
	}
	pending, err := store.(lease.Outbox).OutboxPending(ctx, 0)
	if err != nil || len(pending) != 1 {
		t.Fatalf("outbox after a throttled publication: %d entries, %v; want the accepted one alone", len(pending), err)
	}
}

// A malformed publication is refused as invalid before it spends a token:
// with one token left, it is 400 (not 429) and a valid publication after
// it still goes through.
func TestInvalidPublicationSpendsNoToken(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, &audittest.Recorder{}, Config{PrincipalRate: 1e-3, PrincipalBurst: 2})
	p := principal(t, "prn-pubbad1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target)) // bucket: 1 left
	if err != nil {
		t.Fatal(err)
	}
	in := CommitInput{Identity: target, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken,
		ServiceInstanceID: "inst-1", Sink: "rabbitmq", CommitID: "pub-1", ExecutionID: "exec-1", JobID: "job-1",
		Outbox: &lease.OutboxMessage{RoutingKey: "q", Body: []byte("result")}}
	bad := in
	bad.CommitID = "bad commit id"
	for range 3 {
		if _, err := s.AuthorizeCommit(ctx, call(p), bad); code(err) != lease.CodeInvalidRequest {
			t.Fatalf("malformed publication: %v, want invalid_lease_request", err)
		}
	}
	if res, err := s.AuthorizeCommit(ctx, call(p), in); err != nil || res.Replayed {
		t.Fatalf("valid publication after malformed ones: %v replayed=%v; the bucket's last token was spent", err, res.Replayed)
	}
}
