package main

// Review of serve on bolt with audit.Indexed (2bd6768): kill -9 at random
// points under concurrent load, several times over, then a clean stop.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
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

// Held (claim 2, end to end): five kills at random points under 24
// concurrent clients (acquires, conflicting acquires that are denied,
// releases), each followed by a start; after a clean stop audit.db holds
// exactly audit.jsonl's events, and its count and high-priority meta match
// what it stores.
func TestReviewIndexedServeRepeatedKillsUnderLoad(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBin(t), "--principal-rate", "1000000", "--target-rate", "1000000",
		"--max-active-per-principal", "1000000")
	key, _ := srv.CreateKey("prn_reviewkill", "service_instance", "targets:lease,targets:read", "tenant:*,program:*")
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	var answered, succeeded atomic.Int64
	for cycle := range 5 {
		c, err := client.New(srv.URL(), key)
		if err != nil {
			t.Fatal(err)
		}
		leases := c.LeaseStore("prn_reviewkill")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// Every third acquire reuses a target: a conflict (deny).
					target := fmt.Sprintf("target_%d_%d_%d", cycle, g, i)
					if i%3 == 2 {
						target = fmt.Sprintf("target_%d_%d_%d", cycle, g, i-1)
					}
					id := lease.Identity{TenantID: "tenant-a", ProgramID: "program-a", TargetNamespace: "starintel-target",
						TargetID: target, ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
					res, err := leases.Acquire(context.Background(), lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance_a",
						TTL: 30 * time.Second, MaximumLifetime: time.Hour, ExecutionID: "execution_a", JobID: "job_a",
						Mutation: lease.Mutation{RequestID: fmt.Sprintf("req_%d_%d_%d", cycle, g, i), DeadlineAt: time.Now().Add(10 * time.Second),
							Caller: lease.Caller{PrincipalID: "prn_reviewkill"}}})
					if err != nil {
						if lease.CodeOf(err) == "" || lease.CodeOf(err) == lease.CodeBackendUnavailable {
							return // the server is gone
						}
						answered.Add(1)
						continue
					}
					answered.Add(1)
					succeeded.Add(1)
					if i%4 == 0 {
						_, err := leases.Release(context.Background(), lease.ReleaseRequest{Identity: id, LeaseID: res.Lease.LeaseID,
							FencingToken: res.Lease.FencingToken, ServiceInstanceID: "instance_a", Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel_%d_%d_%d", cycle, g, i),
								DeadlineAt: time.Now().Add(10 * time.Second), Caller: lease.Caller{PrincipalID: "prn_reviewkill"}}})
						if err == nil {
							answered.Add(1)
							succeeded.Add(1)
						}
					}
				}
			}()
		}
		time.Sleep(time.Duration(50+rng.Intn(400)) * time.Millisecond)
		srv.Kill()
		close(stop)
		wg.Wait()
		srv.StartAgain()
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	dir := srv.DataDir()
	inFile, err := audit.ReadFile(filepath.Join(dir, auditFile))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, 0, len(inFile))
	wantHigh := 0
	for _, e := range inFile {
		want = append(want, e.EventID)
		if e.Priority == audit.PriorityHigh {
			wantHigh++
		}
	}
	slices.Sort(want)
	if len(slices.Compact(slices.Clone(want))) != len(want) {
		t.Fatal("an event id twice in audit.jsonl")
	}
	store, err := bolt.OpenAudit(filepath.Join(dir, bolt.AuditFileName), bolt.AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := storeIDs(t, store) // also checks the count meta against the events read
	store.Close()
	if !slices.Equal(got, want) {
		missing := 0
		for _, id := range want {
			if _, ok := slices.BinarySearch(got, id); !ok {
				missing++
			}
		}
		t.Fatalf("audit.db holds %d events, audit.jsonl %d; %d of the file's are missing", len(got), len(want), missing)
	}
	db, err := bbolt.Open(filepath.Join(dir, bolt.AuditFileName), 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bbolt.Tx) error {
		high := tx.Bucket([]byte("meta")).Get([]byte("high"))
		if n := binary.BigEndian.Uint64(high); int(n) != wantHigh {
			t.Errorf("high meta %d, %d high-priority events", n, wantHigh)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Denied requests may be aggregated by the Limiter (a count a kill
	// loses, as before this change); every successful one has its event.
	if int64(len(want)) < succeeded.Load() {
		t.Fatalf("audit.jsonl holds %d events for %d successful requests", len(want), succeeded.Load())
	}
	t.Logf("%d events after 5 kills, %d answered requests, %d successful", len(want), answered.Load(), succeeded.Load())
}
