package valkey

// Outside review (i11b) of CommitRequest.ReplayOnly on a real redis-server:
// a replay-only commit writes nothing anywhere in the keyspace (no
// evidence, no outbox entry, no high-water mark, no commit seq, no TTL
// change), whatever it asks, and never answers another principal's,
// identity's or sink's commit as a replay.

import (
	"sort"
	"testing"

	"github.com/starintel/starlease/lease"
)

// keyspace is every key of the server with its DUMP and PTTL.
func keyspace(t *testing.T, s *Store) map[string]string {
	t.Helper()
	keys, err := s.client.Do(bg, s.client.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	out := map[string]string{}
	for _, k := range keys {
		d, err := s.client.Do(bg, s.client.B().Dump().Key(k).Build()).ToString()
		if err != nil {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		out[k] = d
	}
	return out
}

func sameKeyspace(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for k, v := range after {
		if w, ok := before[k]; !ok {
			t.Errorf("%s created key %q", what, k)
		} else if w != v {
			t.Errorf("%s changed key %q", what, k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("%s deleted key %q", what, k)
		}
	}
}

func replayOnlyReq(r lease.CommitRequest) lease.CommitRequest { r.ReplayOnly = true; return r }

func TestReview2ReplayOnlyWritesNothingValkey(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	id := newIdentity()
	res, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Lease
	doc := commitReq(rec)
	c, err := s.AuthorizeCommit(bg, doc)
	if err != nil {
		t.Fatal(err)
	}
	pub := commitReq(rec)
	pub.Sink, pub.Target = "rabbitmq", ""
	pub.Outbox = &lease.OutboxMessage{RoutingKey: "q", ContentType: "application/json", Body: []byte(`{"v":1}`)}
	p, err := s.AuthorizeCommit(bg, pub)
	if err != nil {
		t.Fatal(err)
	}

	// Other identity (same principal, same commit id): its own scope.
	other := newIdentity()
	ores, err := s.Acquire(bg, acquireReq(other))
	if err != nil {
		t.Fatal(err)
	}
	otherPub := pub
	otherPub.Identity, otherPub.LeaseID, otherPub.FencingToken = other, ores.Lease.LeaseID, ores.Lease.FencingToken
	otherPub.ServiceInstanceID, otherPub.ExecutionID, otherPub.JobID = ores.Lease.ServiceInstanceID, ores.Lease.ExecutionID, ores.Lease.JobID

	changedBody := pub
	changedBody.Outbox = &lease.OutboxMessage{RoutingKey: "q", ContentType: "application/json", Body: []byte(`{"v":2}`)}
	changedKey := pub
	changedKey.Outbox = &lease.OutboxMessage{RoutingKey: "q2", ContentType: "application/json", Body: []byte(`{"v":1}`)}
	otherPrincipal := pub
	otherPrincipal.Caller = lease.Caller{PrincipalID: "prn_other_2", ClientID: "client_2", CredentialID: "key_2"}
	otherSink := pub
	otherSink.Sink = "rabbitmq2"
	fresh := pub
	fresh.CommitID = uid("commit_")
	freshDoc := commitReq(rec)

	before := keyspace(t, s)
	for _, tc := range []struct {
		name string
		req  lease.CommitRequest
		want lease.Code
	}{
		{"changed body", changedBody, lease.CodeIdempotencyConflict},
		{"changed routing key", changedKey, lease.CodeIdempotencyConflict},
		{"another principal, same commit id", otherPrincipal, lease.CodeIdempotencyConflict},
		{"another sink", otherSink, lease.CodeNotFound},
		{"another identity, same commit id", otherPub, lease.CodeNotFound},
		{"a new publication", fresh, lease.CodeNotFound},
		{"a new document commit", freshDoc, lease.CodeNotFound},
	} {
		for range 2 {
			r, err := s.AuthorizeCommit(bg, replayOnlyReq(tc.req))
			if err == nil {
				t.Fatalf("%s: replay-only answered %+v, want %s", tc.name, r, tc.want)
			}
			mustCode(t, err, tc.want)
		}
	}
	// The genuine replays.
	if r, err := s.AuthorizeCommit(bg, replayOnlyReq(pub)); err != nil || !r.Replayed || r.Commit != p.Commit {
		t.Fatalf("replay-only of the publication: %+v %v", r, err)
	}
	if r, err := s.AuthorizeCommit(bg, replayOnlyReq(doc)); err != nil || !r.Replayed || r.Commit != c.Commit {
		t.Fatalf("replay-only of the document commit: %+v %v", r, err)
	}
	sameKeyspace(t, "replay-only commits", before, keyspace(t, s))
	pending, err := s.OutboxPending(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || pending[0].MessageID != p.Commit.Target {
		t.Fatalf("outbox after replay-only requests: %d entries, want the accepted publication alone", len(pending))
	}
	// The next real commit takes the next sequence: nothing was consumed.
	n, err := s.AuthorizeCommit(bg, freshDoc)
	if err != nil || n.Commit.Seq != p.Commit.Seq+1 {
		t.Fatalf("next commit: seq %d (%v), want %d", n.Commit.Seq, err, p.Commit.Seq+1)
	}
}
