package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// rraKV fails a read-only etcd transaction (no If) that gets the key
// failKey while armed: a transient read failure in the middle of an
// attempt (timeout, a member without a leader), as fetch sees it.
type rraKV struct {
	clientv3.KV
	armed   *atomic.Bool
	failKey *atomic.Value
	hits    *atomic.Int64
}

func (k rraKV) Txn(ctx context.Context) clientv3.Txn { return &rraTxn{Txn: k.KV.Txn(ctx), kv: k} }

type rraTxn struct {
	clientv3.Txn
	kv    rraKV
	ops   []clientv3.Op
	guard bool
}

func (t *rraTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn, t.guard = t.Txn.If(cs...), true
	return t
}
func (t *rraTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.ops = t.Txn.Then(ops...), append(t.ops, ops...)
	return t
}
func (t *rraTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *rraTxn) Commit() (*clientv3.TxnResponse, error) {
	if !t.guard && t.kv.armed.Load() {
		fk, _ := t.kv.failKey.Load().(string)
		for _, op := range t.ops {
			if op.IsGet() && string(op.KeyBytes()) == fk {
				t.kv.hits.Add(1)
				return nil, errors.New("injected transient read failure")
			}
		}
	}
	return t.Txn.Commit()
}

// TestRenewalReplayReadFailureIsNotRenewed (an attack review): a renewal's
// replay must not turn a storage error while reading the state now into
// "renewed, no current state" (which tells a caller resolving an unknown
// outcome that it still holds a released lease). An acquire's replay
// fails on the same error; the renewal's should fail (or retry), not
// answer without the state.
func TestRenewalReplayReadFailureIsNotRenewed(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 1)
	cli := c.Client()
	kv := rraKV{KV: cli.KV, armed: &atomic.Bool{}, failKey: &atomic.Value{}, hits: &atomic.Int64{}}
	cli.KV = kv
	s2, err := Open(atkBG, Options{Client: cli, KeyPrefix: atkPrefix(), ReapInterval: -1, OpTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	owner := atkCaller()
	acq := atkAcquireReq(atkIdentity(), owner, 30*time.Second, atkSoon())
	rec := atkAcquire(t, s2, acq)
	rn := atkRenewReq(rec, owner, 30*time.Second, atkSoon())
	renewed, err := s2.Renew(atkBG, rn)
	if err != nil {
		t.Fatal(err)
	}
	atkRelease(t, s2, renewed.Lease, owner, atkSoon())

	kv.failKey.Store(s2.keys.leaseID(rec.LeaseID))
	kv.armed.Store(true)
	ra, aerr := s2.Acquire(atkBG, acq)
	rr, rerr := s2.Renew(atkBG, rn)
	kv.armed.Store(false)
	t.Logf("injected failures: %d; acquire replay: %+v err=%v", kv.hits.Load(), ra.Current, aerr)
	if kv.hits.Load() == 0 {
		t.Fatal("the failure was never injected")
	}
	if aerr == nil || rerr == nil {
		t.Fatalf("a replay answered though the read of the state now failed: acquire %+v (%v), renewal %+v (%v)", ra, aerr, rr, rerr)
	}
	// Once the read works, the renewal's replay reports the lease released.
	rr, rerr = s2.Renew(atkBG, rn)
	if rerr != nil || !rr.Replayed || rr.Current == nil || rr.Current.State != lease.StateReleased {
		t.Fatalf("renewal replay after the failure: %+v, %v", rr, rerr)
	}
}
