package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// A requeue rescans the dead letters (oldest first, a page of 64 at a
// time) inside every attempt, and its transaction compares the outbox's
// usage and sequence keys, which every commit with a publication and every
// relay OutboxDone writes. With many dead letters (the situation the
// command exists for: near the 10,000 bound) and publications flowing,
// every attempt loses its compare and the requeue of a recent dead letter
// never succeeds within the command's deadline.
func TestAttackRequeueStarvesUnderPublicationTraffic(t *testing.T) {
	s := dlStore(t, testenv.StartEtcdCluster(t, 1))
	target := dlSetAside(t, s, "tenant-starve", "poison")
	control := dlSetAside(t, s, "tenant-control", "poison")
	keys, vals := dlKeys(t, s)
	var d lease.DeadLetter
	if err := json.Unmarshal(vals[0], &d); err != nil {
		t.Fatal(err)
	}
	// Older dead letters of other messages, with 8 KiB bodies (bound: 64
	// KiB), written before the two above in scan order.
	const n = 3000
	d.Entry.Message.Body = []byte(strings.Repeat("b", 8<<10))
	for start := 0; start < n; start += 64 {
		var ops []clientv3.Op
		for i := start; i < min(start+64, n); i++ {
			c := d
			c.Entry.MessageID, c.Reason = fmt.Sprintf("msg_old_%05d", i), "old"
			b, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(s.keys.dead(uint64(10+i)), string(b)))
		}
		if _, err := s.cli.Txn(bg).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.cli.Put(bg, s.keys.deadCount(), string(u64(n+2))); err != nil {
		t.Fatal(err)
	}
	// The two real dead letters move after the old ones.
	for i, k := range keys {
		if _, err := s.cli.Txn(bg).Then(clientv3.OpDelete(k), clientv3.OpPut(s.keys.dead(uint64(n+100+i)), string(vals[i]))).Commit(); err != nil {
			t.Fatal(err)
		}
	}

	// Control: without traffic the requeue of a recent dead letter works.
	begun := time.Now()
	if _, err := s.OutboxRequeueDeadLetter(bg, control); err != nil {
		t.Fatalf("control requeue: %v", err)
	}
	t.Logf("requeue without traffic took %v", time.Since(begun))
	if err := s.OutboxDone(bg, control); err != nil {
		t.Fatal(err)
	}

	// A worker publishing steadily and a relay removing what it relayed.
	req := recAcquire("target-traffic", "req-traffic", 3*time.Minute)
	req.Identity.TenantID = "tenant-traffic"
	a, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	l := a.Lease
	ctx, stop := context.WithCancel(bg)
	var wg sync.WaitGroup
	var published atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			m := lease.OutboxMessage{RoutingKey: "q", Body: []byte("result")}
			res, err := s.AuthorizeCommit(bg, lease.CommitRequest{Identity: l.Identity(), LeaseID: l.LeaseID,
				FencingToken: l.FencingToken, ServiceInstanceID: l.ServiceInstanceID, Sink: "rabbitmq",
				CommitID: fmt.Sprintf("commit-traffic-%d", i), ExecutionID: l.ExecutionID, JobID: l.JobID, Outbox: &m,
				DeadlineAt: recFar(), Caller: recCaller})
			if err != nil {
				continue
			}
			_ = s.OutboxDone(bg, res.Commit.Target)
			published.Add(1)
			time.Sleep(5 * time.Millisecond) // ~100 publications a second at most
		}
	}()
	defer func() { stop(); wg.Wait() }()

	rctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	begun = time.Now()
	_, err = s.OutboxRequeueDeadLetter(rctx, target)
	took := time.Since(begun)
	stop()
	wg.Wait()
	if err != nil {
		t.Fatalf("requeue under %d publications in %v failed: %v", published.Load(), took, err)
	}
	t.Logf("requeue under traffic took %v (%d publications)", took, published.Load())
}
