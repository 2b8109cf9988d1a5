package bolt

// Review of audit.Indexed over bolt.AuditSink.AddMissing (fc86002): attack
// tests that held on the reviewed code.

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
)

// reviewMeta reads the store's count and high meta and recounts the events.
func reviewMeta(t *testing.T, s *AuditSink) (count, high, keys, highKeys, normalKeys uint64) {
	t.Helper()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		count, high = auditCount(readView(tx), auditKeyCount), auditCount(readView(tx), auditKeyHigh)
		return tx.Bucket(auditBucketEvents).ForEach(func(k, v []byte) error {
			keys++
			if auditHighPriority(v) {
				highKeys++
			} else {
				normalKeys++
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return
}

// Held: AddMissing given events the store already holds (a catch-up after
// a crash re-sends the file's tail), overlapping batches, duplicates within
// one batch and events retention already pruned keeps count and high meta
// equal to what is stored, and pruned events stay pruned.
func TestReviewIndexedAddMissingMetaNoDriftWithPruning(t *testing.T) {
	ctx := context.Background()
	s, err := OpenAudit(filepath.Join(t.TempDir(), AuditFileName), AuditOptions{MaxEvents: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var evs []audit.Event
	for i := range 40 {
		at := time.Now().Add(time.Duration(i) * time.Millisecond)
		if i%5 == 4 {
			evs = append(evs, audittest.RevokeEvent(at))
		} else {
			evs = append(evs, audittest.AcquireEvent(at))
		}
	}
	steps := [][]audit.Event{evs[:10], evs[5:20], append(append([]audit.Event{}, evs[18:25]...), evs[18:25]...), evs[:40], evs[30:40], evs}
	for i, b := range steps {
		if _, _, err := s.AddMissing(ctx, linesOf(t, b...), false); err != nil {
			t.Fatal(err)
		}
		count, high, keys, highKeys, normalKeys := reviewMeta(t, s)
		if count != keys || high != highKeys {
			t.Fatalf("step %d: meta count=%d high=%d, stored %d events, %d high", i, count, high, keys, highKeys)
		}
		if normalKeys > 7 {
			t.Fatalf("step %d: %d normal events kept, MaxEvents 7", i, normalKeys)
		}
	}
	// The 7 newest normal events and every high one.
	_, _, keys, highKeys, _ := reviewMeta(t, s)
	if highKeys != 8 || keys != 15 {
		t.Fatalf("kept %d events, %d high: want 15 and 8", keys, highKeys)
	}
}

// Held (claim 5): what audit.db stores for an event with credential-shaped
// values is byte for byte the audit.jsonl line, by the live path (the
// writer's event) and by the catch-up path (the line decoded again).
func TestReviewIndexedStoreBytesEqualFileLinesRedacted(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	s, _, err := audit.OpenIndexed(ctx, file, store, audit.IndexedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hex64 := strings.Repeat("ab", 32)
	var secret []audit.Event
	for i := range 6 {
		e := audittest.RevokeEvent(time.Now())
		switch i % 3 {
		case 0:
			e.TraceID = "t" + hex64
		case 1:
			e.Reason = "leaked star_sk_" + hex64
		case 2:
			e.Reason = "Bearer " + hex64
			e.ExecutionID = hex64
		}
		secret = append(secret, e)
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(path string) {
		st, err := OpenAudit(path, AuditOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		f, err := os.Open(file.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		n := 0
		for sc.Scan() {
			line := sc.Bytes()
			e, err := audit.Unmarshal(line)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(line, []byte(hex64)) {
				t.Fatal("the file holds a credential-shaped value")
			}
			if err := st.db.View(func(tx *bbolt.Tx) error {
				v := tx.Bucket(auditBucketEvents).Get([]byte(e.EventID))
				if !bytes.Equal(v, line) {
					t.Errorf("audit.db's bytes for %s differ from the file's line:\n%s\n%s", e.EventID, v, line)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n != len(secret) {
			t.Fatalf("%d lines", n)
		}
	}
	check(filepath.Join(dir, AuditFileName))

	// The catch-up path: a fresh store filled from the file's tail.
	file2, err := audit.OpenFile(file.Path())
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), AuditFileName)
	store2, err := OpenAudit(fresh, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s2, _, err := audit.OpenIndexed(ctx, file2, store2, audit.IndexedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	check(fresh)
}

// Held (claims 2, 4 over the real store): concurrent writers, audit.db
// failing on and off, crashes at random points (the store and the file
// closed under the abandoned sink, as a kill leaves them): after the last
// open and a clean Close the store holds exactly the file's events, each
// once, with count and high meta right.
func TestReviewIndexedRealStoreRandomCrashes(t *testing.T) {
	dir := t.TempDir()
	const maxBehind = 16
	var total int
	for cycle := range 8 {
		file, store := indexedFiles(t, dir)
		index := &flakyIndex{AuditSink: store}
		s, _, err := audit.OpenIndexed(context.Background(), file, index, audit.IndexedOptions{MaxBehind: maxBehind, RetryInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					e := freshEvents(5)[(g+i)%5]
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					_ = s.Write(ctx, e)
					cancel()
				}
			}()
		}
		for k := range 10 + cycle*3 {
			index.failing.Store(k%3 == 0)
			time.Sleep(time.Millisecond)
		}
		// Kill: the store and the file close under the sink.
		store.Close()
		file.Close()
		close(stop)
		wg.Wait()
		_ = s
	}
	file, store := indexedFiles(t, dir)
	s, _, err := audit.OpenIndexed(context.Background(), file, store, audit.IndexedOptions{MaxBehind: maxBehind})
	if err != nil {
		t.Fatal(err)
	}
	// What the start left to the background.
	for deadline := time.Now().Add(time.Minute); s.Waiting() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := fileIDs(t, filepath.Join(dir, "audit.jsonl"))
	total = len(want)
	st, err := OpenAudit(filepath.Join(dir, AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got []string
	if err := st.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(auditBucketEvents).ForEach(func(k, _ []byte) error { got = append(got, string(k)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) { // both sorted
		t.Fatalf("the store's %d events are not the file's %d", len(got), len(want))
	}
	count, high, keys, highKeys, _ := reviewMeta(t, st)
	if count != keys || high != highKeys {
		t.Fatalf("meta count=%d high=%d, stored %d, %d high", count, high, keys, highKeys)
	}
	if int(keys) != total {
		t.Fatalf("the store holds %d events, the file %d", keys, total)
	}
	t.Logf("%d events after 8 kills", total)
}
