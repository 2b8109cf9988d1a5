package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// With bolt, an audit event is durable in audit.jsonl when the request is
// answered and reaches the bolt audit store just after. A server killed
// under load leaves events in the file the store lacks; started again, it
// adds them before it answers, so the store holds exactly the file's
// events.
func TestServeBoltAuditStoreCatchesUpAfterKill(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBin(t), "--principal-rate", "1000000", "--target-rate", "1000000",
		"--max-active-per-principal", "100000")
	key, _ := srv.CreateKey("prn_auditkill", "service_instance", "targets:lease,targets:read", "tenant:*,program:*")
	c, err := client.New(srv.URL(), key)
	if err != nil {
		t.Fatal(err)
	}
	leases := c.LeaseStore("prn_auditkill")
	var answered atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "starintel-target",
					TargetID: fmt.Sprintf("target_%d_%d", g, i), ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
				_, err := leases.Acquire(context.Background(), lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance_a",
					TTL: 30 * time.Second, MaximumLifetime: time.Hour, ExecutionID: "execution_a", JobID: "job_a",
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("req_%d_%d", g, i), DeadlineAt: time.Now().Add(10 * time.Second),
						Caller: lease.Caller{PrincipalID: "prn_auditkill"}}})
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error()) // the server is gone, after the kill
					return
				}
				answered.Add(1)
			}
		}()
	}
	for deadline := time.Now().Add(time.Minute); answered.Load() < 300; time.Sleep(5 * time.Millisecond) {
		if e := firstErr.Load(); e != nil || time.Now().After(deadline) {
			t.Fatalf("%d acquires answered before the kill; first error: %v", answered.Load(), e)
		}
	}
	srv.Kill()
	close(stop)
	wg.Wait()

	dir := srv.DataDir()
	// Whatever the kill left, take the store's five newest events out as
	// well: a crash between the file's fsync and the store's commit.
	store, err := bolt.OpenAudit(filepath.Join(dir, bolt.AuditFileName), bolt.AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inFile, err := audit.ReadFile(filepath.Join(dir, auditFile))
	if err != nil {
		t.Fatal(err)
	}
	held := storeIDs(t, store)
	missing := 0
	for _, e := range inFile {
		if !slices.Contains(held, e.EventID) {
			missing++
		}
	}
	t.Logf("after the kill: %d events in the file, %d in the store, %d of the file's missing there", len(inFile), len(held), missing)
	store.Close()
	dropNewestAuditEvents(t, filepath.Join(dir, bolt.AuditFileName), 5)

	srv.StartAgain()
	if err := srv.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	inFile, err = audit.ReadFile(filepath.Join(dir, auditFile))
	if err != nil {
		t.Fatal(err)
	}
	store, err = bolt.OpenAudit(filepath.Join(dir, bolt.AuditFileName), bolt.AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	want := make([]string, 0, len(inFile))
	for _, e := range inFile {
		want = append(want, e.EventID)
	}
	slices.Sort(want)
	if got := storeIDs(t, store); !slices.Equal(got, want) {
		t.Fatalf("the audit store holds %d events, the file %d: want the same events", len(got), len(want))
	}
	if int64(len(want)) < answered.Load() {
		t.Fatalf("the file holds %d events for %d answered requests", len(want), answered.Load())
	}
}

// storeIDs reads every event id of a bolt audit store, sorted.
func storeIDs(t *testing.T, s *bolt.AuditSink) []string {
	t.Helper()
	var ids []string
	for {
		f := audit.Filter{}
		if len(ids) > 0 {
			f.After = ids[len(ids)-1]
		}
		page, err := s.Read(context.Background(), f, audit.MaxReadLimit)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, auditEventIDs(page)...)
		if len(page) < audit.MaxReadLimit {
			break
		}
	}
	n, err := s.Count(context.Background())
	if err != nil || n != len(ids) {
		t.Fatalf("the store counts %d events (%v) and reads %d", n, err, len(ids))
	}
	slices.Sort(ids)
	return ids
}

func auditEventIDs(events []audit.Event) []string {
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.EventID
	}
	return ids
}

// dropNewestAuditEvents deletes the n newest (normal-priority) events of
// the bolt audit store at path, and counts them out, as if their commit
// never happened.
func dropNewestAuditEvents(t *testing.T, path string, n int) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error {
		c := tx.Bucket([]byte("events")).Cursor()
		for k, _ := c.Last(); k != nil && n > 0; k, _ = c.Last() {
			if err := c.Delete(); err != nil {
				return err
			}
			n--
			meta := tx.Bucket([]byte("meta"))
			count := binary.BigEndian.Uint64(meta.Get([]byte("count")))
			if err := meta.Put([]byte("count"), binary.BigEndian.AppendUint64(nil, count-1)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
