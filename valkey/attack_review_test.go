package valkey

// Outside adversarial review of the issue 11 fixes (i11-attack): a stale
// holder's replays of its commit ids, with every field of the write
// altered, on a real redis-server and on bolt. Each case asserts the
// guarantee "an authorization authorizes exactly one write".

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

func TestAttackStaleHolderCommitReplays(t *testing.T) {
	r := testenv.StartRedis(t)
	stores := map[string]func(t *testing.T) lease.Store{
		"valkey": func(t *testing.T) lease.Store { return open(t, r, Options{}) },
		"bolt": func(t *testing.T) lease.Store {
			s, err := bolt.Open(filepath.Join(t.TempDir(), "l.db"), bolt.Options{ReapInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
	for name, mk := range stores {
		for _, op := range []lease.Op{lease.OpRevoke, lease.OpForceRelease, lease.OpRelease} {
			t.Run(name+"/"+string(op), func(t *testing.T) { attackReplays(t, mk(t), op) })
		}
	}
}

func attackReplays(t *testing.T, s lease.Store, end lease.Op) {
	ctx := context.Background()
	owner := lease.Caller{PrincipalID: "prn-a", ClientID: "c-a", CredentialID: "k-a"}
	adm := lease.Caller{PrincipalID: "prn-adm", ClientID: "c-adm", CredentialID: "k-adm"}
	id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "web",
		TargetID: "replay.example", ActorName: "crawler"}
	n := 0
	mut := func(c lease.Caller) lease.Mutation {
		n++
		return lease.Mutation{RequestID: fmt.Sprintf("r-%d", n), DeadlineAt: time.Now().Add(time.Minute), Caller: c}
	}
	acq := func(inst, exec, job string) *lease.Record {
		res, err := s.Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: inst, TTL: time.Minute,
			MaximumLifetime: time.Hour, ExecutionID: exec, JobID: job, Mutation: mut(owner)})
		if err != nil {
			t.Fatal(err)
		}
		return res.Lease
	}
	a := acq("inst-a", "exec-a", "job-a")
	base := lease.CommitRequest{Identity: id, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
		ServiceInstanceID: "inst-a", Sink: "couchdb", CommitID: "c-1", ExecutionID: "exec-a", JobID: "job-a",
		Target: "doc-1", PayloadSHA256: lease.PayloadSHA256([]byte("v1")), Caller: owner}
	authz := func(c lease.CommitRequest) (lease.CommitResult, error) {
		c.DeadlineAt = time.Now().Add(time.Minute)
		return s.AuthorizeCommit(ctx, c)
	}
	first, err := authz(base)
	if err != nil {
		t.Fatal(err)
	}
	pub := base
	pub.CommitID, pub.Sink, pub.Target, pub.PayloadSHA256 = "p-1", "rabbitmq", "", ""
	pub.Outbox = &lease.OutboxMessage{RoutingKey: "q", ContentType: "application/json", Body: []byte(`{"r":1}`)}
	if _, err := authz(pub); err != nil {
		t.Fatal(err)
	}
	switch end {
	case lease.OpRelease:
		if _, err := s.Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: a.LeaseID, FencingToken: a.FencingToken,
			ServiceInstanceID: "inst-a", Mutation: mut(owner)}); err != nil {
			t.Fatal(err)
		}
	default:
		req := lease.AdminRequest{Identity: id, LeaseID: a.LeaseID, FencingToken: a.FencingToken, Reason: "drill", Mutation: mut(adm)}
		if end == lease.OpRevoke {
			_, err = s.Revoke(ctx, req)
		} else {
			_, err = s.ForceRelease(ctx, req)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// A successor acquires and commits in both sinks.
	b := acq("inst-b", "exec-b", "job-b")
	bc := base
	bc.LeaseID, bc.FencingToken, bc.ServiceInstanceID, bc.ExecutionID, bc.JobID, bc.CommitID = b.LeaseID, b.FencingToken, "inst-b", "exec-b", "job-b", "b-1"
	if _, err := authz(bc); err != nil {
		t.Fatal(err)
	}

	alter := map[string]func(*lease.CommitRequest){
		"target":      func(c *lease.CommitRequest) { c.Target = "doc-2" },
		"target-case": func(c *lease.CommitRequest) { c.Target = "Doc-1" },
		"target-nfd":  func(c *lease.CommitRequest) { c.Target = "doc-1\u0301" },
		"payload":     func(c *lease.CommitRequest) { c.PayloadSHA256 = lease.PayloadSHA256([]byte("v2")) },
		"no-payload":  func(c *lease.CommitRequest) { c.PayloadSHA256 = "" },
		"job":         func(c *lease.CommitRequest) { c.JobID = "job-b" },
		"execution":   func(c *lease.CommitRequest) { c.ExecutionID = "exec-b" },
		"trace":       func(c *lease.CommitRequest) { c.TraceID = "t-x" },
		"sink":        func(c *lease.CommitRequest) { c.Sink = "couchdb-2" },
		"sink-case":   func(c *lease.CommitRequest) { c.Sink = "COUCHDB" }, // normalizes to the same sink
		"new-id":      func(c *lease.CommitRequest) { c.CommitID = "c-2" },
		"as-outbox": func(c *lease.CommitRequest) {
			c.Target, c.PayloadSHA256 = "", ""
			c.Outbox = &lease.OutboxMessage{RoutingKey: "q", Body: []byte("v1")}
		},
		"pub-body": func(c *lease.CommitRequest) {
			*c = pub
			c.Outbox = &lease.OutboxMessage{RoutingKey: "q", ContentType: "application/json", Body: []byte(`{"r":2}`)}
		},
		"pub-routing": func(c *lease.CommitRequest) {
			*c = pub
			c.Outbox = &lease.OutboxMessage{RoutingKey: "q2", ContentType: "application/json", Body: []byte(`{"r":1}`)}
		},
		"pub-headers": func(c *lease.CommitRequest) {
			*c = pub
			c.Outbox = &lease.OutboxMessage{RoutingKey: "q", ContentType: "application/json", Body: []byte(`{"r":1}`),
				Headers: map[string]string{"x-app": "1"}}
		},
		"other-owner": func(c *lease.CommitRequest) { c.Caller = lease.Caller{PrincipalID: "prn-b"} },
	}
	for what, f := range alter {
		c := base
		f(&c)
		res, err := authz(c)
		if err == nil {
			if what == "sink-case" && res.Replayed && res.Commit == first.Commit {
				continue // the same write, normalized: its own replay
			}
			t.Errorf("%s after %s: stale holder authorized %+v (replayed=%v)", what, end, res.Commit, res.Replayed)
		}
	}
	// The exact writes authorized while the lease was live still replay,
	// with their own token (the contract's linearized commits).
	if res, err := authz(base); err != nil || !res.Replayed || res.Commit != first.Commit {
		t.Errorf("exact replay after %s: %v %+v", end, err, res)
	}
	if res, err := authz(pub); err != nil || !res.Replayed {
		t.Errorf("exact publication replay after %s: %v %+v", end, err, res)
	}
	if u, err := s.(lease.OutboxMeter).OutboxUsage(ctx); err != nil || u.Pending != 1 {
		t.Errorf("outbox after the replays: %+v %v (want only the one publication)", u, err)
	}
}
