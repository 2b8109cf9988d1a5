package rabbitmq_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// A publication refused because the lease was revoked reaches the
// executor's work context at once, as a refused commit does: the holder
// learns of the loss on its next commit, not only on its next renewal.
func TestRefusedPublicationCancelsWork(t *testing.T) {
	store, err := bolt.Open(filepath.Join(t.TempDir(), "lease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	id := lease.Identity{TenantID: "acme", ProgramID: "recon", TargetNamespace: "web", TargetID: "example.com", ActorName: "portscan"}
	spec := executor.Spec{Identity: id, ServiceInstanceID: "instance-1", ExecutionID: "exec-1", JobID: "job-1",
		Caller: actor, TTL: time.Minute, Logger: slog.New(slog.DiscardHandler)}
	var publishErr, cause error
	err = executor.Run(context.Background(), store, spec, func(ctx context.Context, l *executor.Lease) error {
		if _, err := store.Revoke(ctx, lease.AdminRequest{Identity: id, LeaseID: l.LeaseID(), FencingToken: l.FencingToken(),
			Reason: "compromised worker", Mutation: lease.Mutation{RequestID: "revoke-1", DeadlineAt: time.Now().Add(time.Second),
				Caller: admin}}); err != nil {
			t.Errorf("revoke: %v", err)
		}
		_, publishErr = rabbitmq.NewPublisher(store).Publish(context.Background(), l.Committer(), "commit-1",
			lease.OutboxMessage{RoutingKey: "results", Body: []byte("{}")})
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		default:
		}
		return nil
	})
	if lease.CodeOf(publishErr) != lease.CodeLost {
		t.Fatalf("publication after revoke: %v", publishErr)
	}
	if !errors.Is(cause, executor.ErrRevoked) {
		t.Fatalf("the work context must be cancelled with ErrRevoked right after the refused publication, cause %v (run: %v)", cause, err)
	}
	pending, err := store.OutboxPending(context.Background(), 10)
	if err != nil || len(pending) != 0 {
		t.Fatalf("nothing may enter the outbox: %v %d", err, len(pending))
	}
}
