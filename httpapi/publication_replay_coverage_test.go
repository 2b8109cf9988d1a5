package httpapi_test

import (
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

// TestPublicationReplayResolvesUnderRateLimit applies issue 11 §6's first
// bullet ("A replay of a committed request can be answered 429 ... A retry
// after outcome_unknown must resolve, not be throttled") to the one
// mutation TestReplayResolvesUnderLimits does not cover: a publication
// (POST /commits/authorize with an outbox object), which is charged to the
// principal's rate bucket. Over HTTP on bolt and Valkey at --principal-rate
// 1 (burst 2): an acquire and a publication empty the bucket; the retry of
// the committed publication with the same commit id and message must be
// answered from its evidence (replayed, same message id), while a new
// publication is refused 429.
func TestPublicationReplayResolvesUnderRateLimit(t *testing.T) {
	bin := testenv.BuildStarlease(t)
	r := testenv.StartRedis(t)
	for _, backend := range []string{"bolt", "valkey"} {
		t.Run(backend, func(t *testing.T) {
			var s *e2eServer
			if backend == "valkey" {
				s = startValkeyServer(t, bin, r, "--principal-rate", "1").e2eServer
			} else {
				s = startServer(t, bin, newRowRecorder(), "--principal-rate", "1")
			}
			throttledWindow(t, func(attempt int) *e2eKey {
				return s.createKey(fmt.Sprintf("prn-pub-replay-%d", attempt), "api_client", "targets:lease", "tenant:tenant-a,program:program-a")
			}, func(k *e2eKey, later func(func())) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				store := client.NewLeaseStore(s.client(k), k.Principal)
				res, err := store.Acquire(ctx, lease.AcquireRequest{Identity: identity(uniqueID("pub-replay"), "usernamegen"),
					ServiceInstanceID: "inst-a", TTL: time.Minute, ExecutionID: "exec-a", JobID: "job-a",
					Mutation: lease.Mutation{RequestID: uniqueID("req"), DeadlineAt: time.Now().Add(10 * time.Second)}})
				if err != nil {
					t.Fatalf("acquire: %v", err)
				}
				c := fence.NewCommitter(store, fence.EnvelopeOf(res.Lease), lease.Caller{PrincipalID: k.Principal})
				pub := rabbitmq.NewPublisher(store, rabbitmq.WithAttempts(1)) // surface the first answer
				msg := lease.OutboxMessage{RoutingKey: "q", ContentType: "text/plain", Body: []byte("result")}
				first, err := pub.Publish(ctx, c, "p-1", msg)
				if err != nil {
					t.Fatalf("the first publication: %v", err)
				}
				replay, replayErr := pub.Publish(ctx, c, "p-1", msg)
				_, freshErr := pub.Publish(ctx, c, "p-2", msg)
				later(func() {
					if replayErr != nil || !replay.Replayed || replay.MessageID != first.MessageID {
						t.Errorf("the retry of a committed publication while the rate limit refuses: %+v %v; want it replayed from its evidence, not throttled",
							replay, replayErr)
					}
					if lease.CodeOf(freshErr) != lease.CodeRateLimited {
						t.Errorf("a new publication while the rate limit refuses: %v, want lease_rate_limited", freshErr)
					}
				})
			})
		})
	}
}
