package bolt

// Review attack: the restore path with a file the new settings wrote
// (no freelist on disk, many freed pages), backed up under concurrent
// writes; the restored file is opened by restore.go's own bbolt options,
// then by the store, and recovered.

import (
	"bytes"
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

// A backup is "one consistent point-in-time snapshot" (one read
// transaction), so concurrent writes must not make it fail.
func TestReviewBackupUnderConcurrentWrites(t *testing.T) {
	t.Run("new_settings", func(t *testing.T) { restoreChurned(t, false, true) })
	// The settings before d107503 (freelist written at every commit), to
	// tell a regression from an older fault.
	t.Run("old_settings", func(t *testing.T) { restoreChurned(t, true, true) })
}

// The restore path with a churned file the new settings wrote, backed up
// while no write runs.
func TestReviewRestoreChurnedFile(t *testing.T) { restoreChurned(t, false, false) }

func restoreChurned(t *testing.T, oldSettings, concurrent bool) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "a.db"), Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if oldSettings {
		s.db.Close()
		db, err := bbolt.Open(filepath.Join(dir, "a.db"), 0o600, &bbolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s.db, s.group.db, s.group.engine.db = db, db, db
	}
	far := time.Now().Add(time.Hour)
	churn := func(prefix string, n int) {
		for k := 0; k < n; k++ {
			req := acquireReq(fmt.Sprint(prefix, "-acq-", k), time.Hour, far)
			req.Identity.TargetID = fmt.Sprint(prefix, "-", k%50)
			req.Metadata = lease.Metadata{"pad": strings.Repeat("x", 1+k%900)}
			res, err := s.Acquire(ctx, req)
			if err != nil {
				continue // conflict: an active lease on the target
			}
			_, _ = s.Release(ctx, lease.ReleaseRequest{Identity: req.Identity, LeaseID: res.Lease.LeaseID,
				FencingToken: res.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
				Mutation: lease.Mutation{RequestID: fmt.Sprint(prefix, "-rel-", k), DeadlineAt: far, Caller: req.Caller}})
		}
	}
	churn("pre", 600)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4 && concurrent || w < 1; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				churn(fmt.Sprint("w", w, "-", i), 10)
			}
		}(w)
	}
	var buf bytes.Buffer
	if !concurrent {
		close(stop)
		wg.Wait()
	} else {
		time.Sleep(50 * time.Millisecond)
	}
	m, err := s.Backup(ctx, &buf)
	if concurrent {
		close(stop)
		wg.Wait()
	}
	if err != nil {
		t.Fatalf("backup while writes run: %v (bbolt's WriteTo copies free pages, which the writers reuse, "+
			"so the two passes of backupfile.Write differ)", err)
	}
	target := filepath.Join(dir, "b.db")
	ns := NewNamespace(target, Options{})
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("restore: %v", err)
	}
	for _, o := range []*bbolt.Options{{Timeout: time.Second}, {Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}} {
		db, err := bbolt.Open(target, 0o600, o)
		if err != nil {
			t.Fatal(err)
		}
		checkConsistent(t, db, fmt.Sprintf("restored file opened with %+v", o))
		db.Close()
	}
	r, err := ns.OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx)
	if err != nil || st.Marker.BackupSHA256 != m.PayloadSHA256 {
		t.Fatalf("state: %v", err)
	}
	plan := lease.RecoveryPlan{Counters: map[string]uint64{}, Epoch: 1, Floor: 1000, Reason: "review"}
	for k, v := range st.Counters {
		plan.Counters[k] = v + 10
	}
	if _, err := r.Finish(ctx, plan); err != nil {
		t.Fatalf("finish: %v", err)
	}
	s2, err := Open(target, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	res, err := s2.Acquire(ctx, acquireReq("after-restore", time.Minute, far))
	if err != nil || res.Lease.FencingToken <= 1000 {
		t.Fatalf("acquire after recovery: %v %+v", err, res.Lease)
	}
	checkConsistent(t, s2.db, "recovered")
}
