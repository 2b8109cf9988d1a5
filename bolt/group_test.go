package bolt

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/groupcommit"
	"github.com/starintel/starlease/internal/layered"
)

func openGroup(t *testing.T, max int) *groupCommit {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "group.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("k")); return err }); err != nil {
		t.Fatal(err)
	}
	return &groupCommit{db: db, queue: groupcommit.Queue[*groupCall]{Max: max}}
}

func lastTxID(t *testing.T, db *bbolt.DB) int {
	t.Helper()
	tx, err := db.Begin(false)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	return tx.ID()
}

func put(key string) func(*layered.View) error {
	return func(tx *layered.View) error { return tx.Bucket([]byte("k")).Put([]byte(key), []byte("v")) }
}

func stored(t *testing.T, db *bbolt.DB, key string) bool {
	t.Helper()
	var ok bool
	if err := db.View(func(tx *bbolt.Tx) error { ok = tx.Bucket([]byte("k")).Get([]byte(key)) != nil; return nil }); err != nil {
		t.Fatal(err)
	}
	return ok
}

// holdFirst starts a call whose function waits, inside its transaction,
// until n more calls are queued behind it; it returns the first call's
// result channel. The queued calls then share exactly one transaction.
func holdFirst(t *testing.T, g *groupCommit, n int) <-chan error {
	t.Helper()
	first := make(chan error, 1)
	entered := make(chan struct{})
	go func() {
		first <- g.update(func(tx *layered.View) error {
			select {
			case <-entered:
			default:
				close(entered)
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				queued := g.queue.Queued()
				if queued >= n {
					return put("first")(tx)
				}
			}
			return errors.New("the other calls never queued")
		})
	}()
	<-entered
	return first
}

// Calls that arrive during a commit share the next one: one transaction
// for all of them, and every write is there afterwards.
func TestGroupCommitSharesOneTransaction(t *testing.T) {
	g := openGroup(t, 256)
	before := lastTxID(t, g.db)
	first := holdFirst(t, g, 20)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[i] = g.update(put(fmt.Sprint("k", i))) }(i)
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if !stored(t, g.db, fmt.Sprint("k", i)) {
			t.Fatalf("call %d's write is missing", i)
		}
	}
	if got := lastTxID(t, g.db) - before; got != 2 {
		t.Fatalf("21 calls took %d transactions, want 2 (the first, then the 20 queued behind it)", got)
	}
}

// max bounds a transaction: 20 queued calls with max 8 take three.
func TestGroupCommitBoundsATransaction(t *testing.T) {
	g := openGroup(t, 8)
	before := lastTxID(t, g.db)
	first := holdFirst(t, g, 20)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := g.update(put(fmt.Sprint("k", i))); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := lastTxID(t, g.db) - before; got != 4 {
		t.Fatalf("1+20 calls with max 8 took %d transactions, want 4", got)
	}
}

// A function that fails (or panics) gets its own error; its writes are
// rolled back, and the others of its transaction still commit.
func TestGroupCommitIsolatesAFailure(t *testing.T) {
	g := openGroup(t, 256)
	first := holdFirst(t, g, 5)
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := fmt.Sprint("k", i)
			errs[i] = g.update(func(tx *layered.View) error {
				if err := put(key)(tx); err != nil {
					return err
				}
				switch i {
				case 1:
					return boom
				case 3:
					panic("bad function")
				}
				return nil
			})
		}(i)
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		switch i {
		case 1:
			if !errors.Is(err, boom) {
				t.Fatalf("failing call got %v, want its own error", err)
			}
		case 3:
			if !errors.Is(err, errPanicked) {
				t.Fatalf("panicking call got %v, want errPanicked", err)
			}
		default:
			if err != nil {
				t.Fatalf("call %d got %v, another call's failure", i, err)
			}
		}
		if want := i != 1 && i != 3; stored(t, g.db, fmt.Sprint("k", i)) != want {
			t.Fatalf("call %d: write stored = %v, want %v", i, !want, want)
		}
	}
	// The committer is free again: a later call commits at once.
	if err := g.update(put("after")); err != nil || !stored(t, g.db, "after") {
		t.Fatalf("a call after the failures: %v", err)
	}
}
