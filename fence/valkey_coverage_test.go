package fence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// Issue 11 §1 and §7 on a real redis-server: the fence tests above run on
// bolt; these run the same reproduction and the stale-holder property at
// the reference sink with the Valkey backend deciding every authorization
// (backend time is the server's own clock, so expiry is waited out).

// openValkeyStore opens a Valkey store in a fresh key namespace of r.
func openValkeyStore(t *testing.T, r *testenv.Redis) *valkey.Store {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := valkey.Open(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: "fence" + hex.EncodeToString(b), ReapInterval: -1})
	if err != nil {
		t.Fatalf("valkey.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if h := s.Health(ctx); h.Status != lease.HealthOK {
		t.Fatalf("valkey store health %s: %s", h.Status, h.Reason)
	}
	return s
}

// The reported reproduction of the replayed-commit-id hole, step by step,
// with the Valkey backend: after the revoke reported success, the revoked
// holder's replayed commit id lands no write on another document, before
// or after a successor wrote; each refusal is the one the issue requires
// (idempotency_conflict for the replay with another target), and what the
// sink holds is read back.
func TestReplayReproductionOnValkey(t *testing.T) {
	ctx := context.Background()
	s := openValkeyStore(t, testenv.StartRedis(t))
	far := func() time.Time { return time.Now().Add(time.Hour) }
	acquire := func(instance string) *lease.Record {
		t.Helper()
		res, err := s.Acquire(ctx, lease.AcquireRequest{Identity: identity, ServiceInstanceID: instance, TTL: ttl,
			MaximumLifetime: time.Hour, ExecutionID: "exec-" + instance, JobID: "job-1", TraceID: "trace-" + instance,
			Mutation: lease.Mutation{RequestID: "req-" + instance, DeadlineAt: far(), Caller: actor}})
		if err != nil {
			t.Fatalf("acquire as %s: %v", instance, err)
		}
		return res.Lease
	}
	committer := func(rec *lease.Record) *fence.Committer {
		return fence.NewCommitter(s, fence.EnvelopeOf(rec), actor, fence.WithClock(time.Now), fence.WithAttempts(1))
	}
	sink := fencetest.NewMemorySink("documents")

	a := acquire("instance-a")
	ca := committer(a)
	gA, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-1", Body: "from a"})
	if err != nil {
		t.Fatalf("1. holder's write: %v", err)
	}
	if res, err := s.Revoke(ctx, lease.AdminRequest{Identity: identity, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
		Reason: "incident drill", Mutation: lease.Mutation{RequestID: "req-revoke", DeadlineAt: far(), Caller: admin}}); err != nil ||
		res.Code != lease.CodeRevoked {
		t.Fatalf("2. revoke: %+v %v", res, err)
	}
	if _, err := fence.Write(ctx, ca, sink, "c2", fencetest.Doc{ID: "doc-2"}); code(err) != lease.CodeLost {
		t.Fatalf("3. a new commit id after revoke: %v, want lease_lost", err)
	}
	if _, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-2", Body: "after revoke"}); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("4. the revoked holder's replayed commit id for doc-2: %v, want idempotency_conflict", err)
	}
	b := acquire("instance-b")
	if b.FencingToken <= a.FencingToken {
		t.Fatalf("successor token %d not above %d", b.FencingToken, a.FencingToken)
	}
	gB, err := fence.Write(ctx, committer(b), sink, "b1", fencetest.Doc{ID: "doc-1", Body: "from b"})
	if err != nil {
		t.Fatalf("5. successor's write: %v", err)
	}
	if _, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-3", Body: "token 1 after token 2"}); code(err) != lease.CodeIdempotencyConflict {
		t.Fatalf("5. the revoked holder's replayed commit id for doc-3: %v, want idempotency_conflict", err)
	}
	// Its exact first write replays at the backend (the contract lets it
	// finish), and the sink refuses it: the successor's token is higher.
	if _, err := fence.Write(ctx, ca, sink, "c1", fencetest.Doc{ID: "doc-1", Body: "from a"}); code(err) != lease.CodeCommitRejected {
		t.Fatalf("the exact replay of c1 after the successor wrote: %v, want commit_rejected by the sink", err)
	}
	// And its guard, used straight on the sink, for another document.
	if err := sink.Commit(ctx, gA, fencetest.Doc{ID: "doc-4", Body: "from a"}); code(err) != lease.CodeCommitRejected {
		t.Fatalf("the old guard on another document: %v, want commit_rejected", err)
	}
	for _, id := range []string{"doc-2", "doc-3", "doc-4"} {
		if d, ok := sink.Get(id); ok {
			t.Errorf("%s exists: %+v", id, d)
		}
	}
	if d, ok := sink.Get("doc-1"); !ok || d.Body != "from b" || d.Guard != gB {
		t.Errorf("doc-1 holds %+v, want the successor's write", d)
	}
	accepted := sink.Accepted()
	if len(accepted) != 2 || accepted[0].Guard != gA || accepted[1].Guard != gB {
		t.Errorf("accepted writes %+v, want exactly the holder's c1 then the successor's b1", accepted)
	}
}

// The stale-holder property at the reference sink, with the Valkey backend.
func TestStaleHolderAtTheMemorySinkOnValkey(t *testing.T) {
	s := openValkeyStore(t, testenv.StartRedis(t))
	const vttl = 3 * time.Second
	sink := fencetest.NewMemorySink("documents")
	docID := func(rec *lease.Record, obj int) string { return rec.TargetID + "/doc-" + string(rune('0'+obj)) }
	fencetest.StaleHolder[fencetest.Doc]{Store: s, Now: time.Now, Expire: func() { time.Sleep(vttl + 200*time.Millisecond) },
		TTL: vttl, Identity: identity, Holder: actor,
		Successor: lease.Caller{PrincipalID: "prn-successor", ClientID: "client-2", CredentialID: "key-2"}, Admin: admin,
		Sink: sink, Objects: 2, JobBound: false,
		Payload: func(rec *lease.Record, obj int, label string) fencetest.Doc {
			return fencetest.Doc{ID: docID(rec, obj), Body: label}
		},
		Read: func(_ context.Context, rec *lease.Record, obj int) (string, *fence.Guard, error) {
			d, ok := sink.Get(docID(rec, obj))
			if !ok {
				return "", nil, nil
			}
			return d.Body, &d.Guard, nil
		}}.Run(t)
}
