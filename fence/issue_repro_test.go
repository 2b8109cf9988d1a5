package fence_test

import (
	"context"
	"testing"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

// The reproduction of the replayed-commit-id hole, step by step as it was
// reported: a revoked holder replays the commit id of a write it made
// before the revoke, for another document, before and after a successor
// wrote. No write may land after the revoke reported success.
func TestRevokedHolderCannotReplayACommitIDForAnotherDocument(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	sink := fencetest.NewMemorySink("documents")
	a := e.acquire("instance-a", "req-a")
	ca := e.committer(a)
	if _, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-1", Body: "from a"}); err != nil {
		t.Fatalf("1. holder's write: %v", err)
	}
	if _, err := e.store.Revoke(ctx, lease.AdminRequest{Identity: identity, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
		Reason: "incident drill", Mutation: lease.Mutation{RequestID: "req-revoke", DeadlineAt: e.far(), Caller: admin}}); err != nil {
		t.Fatalf("2. revoke: %v", err)
	}
	if _, err := fence.Write(ctx, ca, sink, "c2", fencetest.Doc{ID: "doc-2"}); code(err) != lease.CodeLost {
		t.Fatalf("3. a new commit id after revoke: %v, want lease_lost", err)
	}
	if _, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-2", Body: "after revoke"}); err == nil {
		t.Fatal("4. the revoked holder's replayed commit id landed a write on doc-2")
	}
	e.clock.Add(ttl + 1)
	b := e.acquire("instance-b", "req-b")
	if _, err := fence.Write(ctx, e.committer(b), sink, "b1", fencetest.Doc{ID: "doc-1", Body: "from b"}); err != nil {
		t.Fatalf("5. successor's write: %v", err)
	}
	if _, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-3", Body: "token 1 after token 2"}); err == nil {
		t.Fatal("5. the revoked holder's replayed commit id landed a write on doc-3 after the successor's token")
	}
	for _, w := range sink.Accepted() {
		if w.Guard.LeaseID == a.LeaseID && w.ID != "doc-1" {
			t.Errorf("the sink holds the revoked holder's write of %s", w.ID)
		}
	}
	if _, ok := sink.Get("doc-2"); ok {
		t.Error("doc-2 exists")
	}
}
