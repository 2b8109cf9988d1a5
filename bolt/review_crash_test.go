package bolt

// Review attack: kill -9 during heavy writes with NoFreelistSync and the
// map freelist, then reopen; files switched between the old (freelist
// synced) and the new settings.

import (
	"bufio"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

const crashChildEnv = "STARLEASE_REVIEW_CRASH_CHILD"

// TestReviewCrashChild is the child process: it writes until killed,
// printing each acknowledged acquisition and release.
func TestReviewCrashChild(t *testing.T) {
	s, round, say := inCrashChild(t, crashChildEnv, "TestReviewKill9DuringHeavyWrites")
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for g := 0; g < 24; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; ; k++ {
				target := fmt.Sprintf("r%s-g%d-k%d", round, g, k)
				req := acquireReq("acq-"+target, time.Hour, far)
				req.Identity.TargetID = target
				req.Metadata = lease.Metadata{"pad": strings.Repeat("p", 200+k%700)}
				res, err := s.Acquire(ctx, req)
				if err != nil {
					say("ERR %s %v", target, err)
					continue
				}
				say("ACK %s %s %d", target, res.Lease.LeaseID, res.Lease.FencingToken)
				if k%2 == 0 {
					rel := lease.ReleaseRequest{Identity: req.Identity, LeaseID: res.Lease.LeaseID,
						FencingToken: res.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
						Mutation: lease.Mutation{RequestID: "rel-" + target, DeadlineAt: far, Caller: req.Caller}}
					if _, err := s.Release(ctx, rel); err == nil {
						say("REL %s %s", target, res.Lease.LeaseID)
					}
				}
			}
		}(g)
	}
	wg.Wait()
}

func checkFile(t *testing.T, path string, o *bbolt.Options) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, o)
	if err != nil {
		t.Fatalf("reopen with %+v: %v", o, err)
	}
	defer db.Close()
	checkConsistent(t, db, fmt.Sprintf("reopened with %+v", o))
	// Old settings: a write that syncs the freelist again.
	if err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("review-touch"), []byte(time.Now().String()))
	}); err != nil {
		t.Fatalf("write after reopen: %v", err)
	}
}

func TestReviewKill9DuringHeavyWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	path := filepath.Join(t.TempDir(), "starlease.db")
	acked := map[string]string{}    // target → lease id
	released := map[string]string{} // target → lease id
	for round := 0; round < 4; round++ {
		child := startCrashChild(t, "TestReviewCrashChild", crashChildEnv, path, round)
		sc := bufio.NewScanner(child.out)
		n := 0
		killAt := 400 + 300*round
		killed := false
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 4 && f[0] == "ACK":
				acked[f[1]] = f[2]
				n++
			case len(f) == 3 && f[0] == "REL":
				released[f[1]] = f[2]
			case len(f) > 0 && (f[0] == "OPENERR" || f[0] == "ERR"):
				t.Errorf("child: %s", sc.Text())
			}
			if n >= killAt && !killed {
				killed = true
				child.kill()
			}
		}
		_ = child.cmd.Wait()
		if !killed {
			t.Fatalf("round %d: the child exited before it was killed (%d acks)", round, n)
		}
		// Reopen: the new settings (the store), then every acknowledged
		// write must be there.
		s, err := Open(path, Options{ReapInterval: -1})
		if err != nil {
			t.Fatalf("round %d: reopen after kill -9: %v", round, err)
		}
		ctx := context.Background()
		far := time.Now().Add(time.Hour)
		for target, id := range acked {
			res, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: id, DeadlineAt: far})
			if err != nil {
				t.Fatalf("round %d: acknowledged lease %s of %s lost after kill -9: %v", round, id, target, err)
			}
			if rel, ok := released[target]; ok && rel == id && res.Lease.State != lease.StateReleased {
				t.Fatalf("round %d: acknowledged release of %s lost: %s", round, target, res.Lease.State)
			}
		}
		if _, err := s.Acquire(ctx, acquireReq(fmt.Sprint("after-", round), time.Millisecond, far)); err != nil &&
			lease.CodeOf(err) != lease.CodeConflict {
			t.Fatalf("round %d: write after reopen: %v", round, err)
		}
		s.Close()
		// Alternate which settings see the file next: the old ones
		// (freelist written at every commit) or the new.
		if round%2 == 0 {
			checkFile(t, path, &bbolt.Options{Timeout: time.Second})
		} else {
			checkFile(t, path, &bbolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
		}
		t.Logf("round %d: %d acks before kill; %d acknowledged leases all present", round, n, len(acked))
	}
}
