package fence_test

import (
	"context"
	"testing"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

// From an adversarial review of the one-write binding: a guard authorized
// its write any number of times. After writes W1 then W2 to the same document, a revoked
// holder replays W1's commit id with W1's exact payload: the backend
// answers a known commit id without consulting the lease, and the sink
// admitted the equal-token guard again, so the document reverted to W1
// after Revoke reported success. The commit seq refuses it.
func TestReplayedCommitDoesNotRollBackAfterRevoke(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	rec := e.acquire("instance-a", "req-a")
	c := e.committer(rec)
	sink := fencetest.NewMemorySink("jobs")
	w1 := fencetest.Doc{ID: "job", Body: "running"}
	w2 := fencetest.Doc{ID: "job", Body: "succeeded"}
	if _, err := fence.Write(ctx, c, sink, "c-1", w1); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Write(ctx, c, sink, "c-2", w2); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Revoke(ctx, lease.AdminRequest{Identity: identity, LeaseID: rec.LeaseID,
		FencingToken: rec.FencingToken, Reason: "incident drill",
		Mutation: lease.Mutation{RequestID: "req-admin", DeadlineAt: e.far(), Caller: admin}}); err != nil {
		t.Fatal(err)
	}
	_, err := fence.Write(ctx, c, sink, "c-1", w1) // a delayed retry of W1
	got, _ := sink.Get("job")
	if err == nil || got.Body != w2.Body {
		t.Fatalf("revoked holder's replay of a used commit: err=%v, document now %q rev %d (want refusal, %q kept)",
			err, got.Body, got.Rev, w2.Body)
	}
}
