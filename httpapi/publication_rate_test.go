package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// A publication is charged to the principal's rate bucket: one lease
// holder cannot append 64 KiB publications as fast as the backend writes
// them (an adversarial review got 60 in a burst at --principal-rate 1,
// growing the outbox for every tenant while the relay could not drain).
// The refusal is lease_rate_limited (retryable: the publisher waits it out).
func TestPublicationsAreRateLimited(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	s := startServer(t, bin, newRowRecorder(), "--principal-rate", "1")
	k := s.createKey("prn-flood", "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
	store := client.NewLeaseStore(s.client(k), k.Principal)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := store.Acquire(ctx, lease.AcquireRequest{Identity: identity(uniqueID("t"), "usernamegen"), ServiceInstanceID: "inst-a",
		TTL: time.Minute, ExecutionID: "exec-a", JobID: "job-a", Mutation: lease.Mutation{RequestID: uniqueID("req"), DeadlineAt: time.Now().Add(10 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	c := fence.NewCommitter(store, fence.EnvelopeOf(res.Lease), lease.Caller{PrincipalID: k.Principal})
	body := bytes.Repeat([]byte("A"), lease.MaxOutboxBody)
	pub := rabbitmq.NewPublisher(store, rabbitmq.WithAttempts(1)) // surface the first refusal
	for i := 0; i < 60; i++ {
		if _, err := pub.Publish(ctx, c, fmt.Sprintf("flood-%d", i), lease.OutboxMessage{RoutingKey: "q", Body: body}); err != nil {
			if lease.CodeOf(err) != lease.CodeRateLimited {
				t.Fatalf("publication %d: %v, want lease_rate_limited", i, err)
			}
			return
		}
	}
	t.Fatalf("60 publications of 64 KiB accepted in a burst at --principal-rate 1")
}
