package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
	"github.com/starintel/starlease/lease/leasetest/race"
)

// TestRace runs the race suite with a linearizability check against a real
// three-member cluster, with the reaper running as a concurrent actor.
func TestRace(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	s := open(t, c, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond})
	race.Run(t, s, race.Options{})
}

// The helpers below build the requests of the multi-server tests
// (race, failover, quorum and skew): an actor is one owner on one service
// instance.

func uidOf(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// freshIdentity is an identity no other test uses.
func freshIdentity() lease.Identity {
	return lease.Identity{TenantID: uidOf("tenant-"), ProgramID: uidOf("program-"), TargetNamespace: "starintel-target",
		TargetID: uidOf("target_"), ActorName: "etcdtest", WorkflowName: "default", OperationClass: "default"}
}

type actor struct {
	caller   lease.Caller
	instance string
}

func newActor(class string) actor {
	return actor{caller: lease.Caller{PrincipalID: uidOf("prn_" + class + "_"), PrincipalClass: class,
		ClientID: uidOf("client_"), CredentialID: uidOf("key_"), CorrelationID: uidOf("corr_")},
		instance: uidOf("instance_")}
}

func (a actor) mutation(d time.Duration) lease.Mutation {
	return lease.Mutation{RequestID: uidOf("req_"), DeadlineAt: time.Now().Add(d), Caller: a.caller}
}

func (a actor) acquire(id lease.Identity, ttl time.Duration) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: id, ServiceInstanceID: a.instance, TTL: ttl, MaximumLifetime: 10 * time.Minute,
		ExecutionID: uidOf("execution_"), JobID: uidOf("job_"), TraceID: uidOf("trace_"), Mutation: a.mutation(10 * time.Second)}
}

func (a actor) renew(rec *lease.Record) lease.RenewRequest {
	return lease.RenewRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: a.instance, Mutation: a.mutation(10 * time.Second)}
}

func (a actor) release(rec *lease.Record) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: a.instance, Mutation: a.mutation(10 * time.Second)}
}

func (a actor) revoke(rec *lease.Record) lease.AdminRequest {
	return lease.AdminRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		Reason: "etcd test: revoke", Mutation: a.mutation(10 * time.Second)}
}

func (a actor) commit(rec *lease.Record, sink string) lease.CommitRequest {
	return lease.CommitRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		ServiceInstanceID: a.instance, Sink: sink, CommitID: uidOf("commit_"), ExecutionID: rec.ExecutionID,
		JobID: rec.JobID, TraceID: rec.TraceID, Target: uidOf("doc-"), PayloadSHA256: hex.EncodeToString(make([]byte, 32)),
		DeadlineAt: time.Now().Add(10 * time.Second), Caller: a.caller}
}

func (a actor) inspect(id lease.Identity) lease.InspectRequest {
	return lease.InspectRequest{Identity: id, DeadlineAt: time.Now().Add(10 * time.Second), Caller: a.caller}
}

func (a actor) lookup(op lease.Op, id lease.Identity, requestID string) lease.LookupRequest {
	return lease.LookupRequest{Op: op, Identity: id, PrincipalID: a.caller.PrincipalID, RequestID: requestID,
		DeadlineAt: time.Now().Add(10 * time.Second)}
}

// must fails the test unless err is nil and res has code want.
func must(t *testing.T, what string, res lease.Result, err error, want lease.Code) *lease.Record {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if res.Code != want || res.Lease == nil {
		t.Fatalf("%s: %s (lease %v), want %s", what, res.Code, res.Lease != nil, want)
	}
	return res.Lease
}

// refused fails the test unless err is a *lease.Error with code want; it
// returns the error.
func refused(t *testing.T, what string, err error, want lease.Code) *lease.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded, want %s", what, want)
	}
	le := lease.AsError(err)
	if le.Code != want {
		t.Fatalf("%s: %v, want %s", what, err, want)
	}
	return le
}

var bg = context.Background()
