package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
)

// flakyIndex is the bolt audit store with a switch that makes AddMissing
// fail (a full disk under the store) before it reaches the store.
type flakyIndex struct {
	*AuditSink
	failing atomic.Bool
	calls   atomic.Int64
}

var errIndexDown = errors.New("no space left on device")

func (f *flakyIndex) AddMissing(ctx context.Context, events []audit.Event) error {
	f.calls.Add(1)
	if f.failing.Load() {
		return fmt.Errorf("audit: write: %w", errIndexDown)
	}
	return f.AuditSink.AddMissing(ctx, events)
}

// indexedFiles opens an audit file and a bolt audit store in dir.
func indexedFiles(t *testing.T, dir string) (*audit.FileSink, *AuditSink) {
	t.Helper()
	file, err := audit.OpenFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := OpenAudit(filepath.Join(dir, AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return file, store
}

// storedIDs is every event id the bolt audit store at path holds, sorted.
func storedIDs(t *testing.T, path string) []string {
	t.Helper()
	s, err := OpenAudit(path, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	events, err := s.Read(context.Background(), audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.Count(context.Background())
	if err != nil || n != len(events) {
		t.Fatalf("the store counts %d events (%v) and reads %d", n, err, len(events))
	}
	ids := auditIDs(events)
	slices.Sort(ids)
	return ids
}

func fileIDs(t *testing.T, path string) []string {
	t.Helper()
	events, err := audit.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ids := auditIDs(events)
	slices.Sort(ids)
	return ids
}

func freshEvents(n int) []audit.Event {
	out := make([]audit.Event, n)
	for i := range out {
		if i%5 == 4 {
			out[i] = audittest.RevokeEvent(time.Now())
		} else {
			out[i] = audittest.AcquireEvent(time.Now())
		}
	}
	return out
}

// Each Write returns once the file holds its event; the store holds every
// event once after Close, with the high-priority count right.
func TestIndexedFileFirstThenStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	s, bad, err := audit.OpenIndexed(ctx, file, store, audit.IndexedOptions{})
	if err != nil || bad != 0 {
		t.Fatalf("open: %d bad, %v", bad, err)
	}
	events := freshEvents(300)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var missing []string
	for _, e := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Write(ctx, e); err != nil {
				t.Errorf("write: %v", err)
				return
			}
			// Durable when Write returns: in the file.
			if !slices.Contains(fileIDs(t, file.Path()), e.EventID) {
				mu.Lock()
				missing = append(missing, e.EventID)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(missing) > 0 {
		t.Fatalf("%d events were not in the file when their Write returned", len(missing))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := auditIDs(events)
	slices.Sort(want)
	if got := storedIDs(t, filepath.Join(dir, AuditFileName)); !slices.Equal(got, want) {
		t.Fatalf("the store holds %d events, want the %d written", len(got), len(want))
	}
	if got := fileIDs(t, filepath.Join(dir, "audit.jsonl")); !slices.Equal(got, want) {
		t.Fatalf("the file holds %d events, want the %d written", len(got), len(want))
	}
	store2, err := OpenAudit(filepath.Join(dir, AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store2.Close()
	high := 0
	if err := store2.db.View(func(tx *bbolt.Tx) error { high = int(auditCount(tx, auditKeyHigh)); return nil }); err != nil {
		t.Fatal(err)
	}
	if high != 60 {
		t.Fatalf("high-priority count %d, want 60", high)
	}
}

// A crash leaves events in the file the store lacks; opening again adds
// those of the file's last MaxBehind lines, each once, and none already
// there twice.
func TestIndexedCatchesUpAfterACrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	events := freshEvents(12)
	for _, e := range events {
		if err := file.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// The store already has some of the last ones (indexed before the
	// crash), and one of the first ones.
	if err := store.AddMissing(ctx, []audit.Event{events[0], events[9], events[10]}); err != nil {
		t.Fatal(err)
	}
	s, bad, err := audit.OpenIndexed(ctx, file, store, audit.IndexedOptions{MaxBehind: 8})
	if err != nil || bad != 0 {
		t.Fatalf("open: %d bad, %v", bad, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The last 8 lines are events 4..11; 0 was there already; 1..3 lie
	// further back than any unindexed event can (see audit.Indexed).
	want := auditIDs(append([]audit.Event{events[0]}, events[4:]...))
	slices.Sort(want)
	if got := storedIDs(t, filepath.Join(dir, AuditFileName)); !slices.Equal(got, want) {
		t.Fatalf("after catching up the store holds %v, want %v", got, want)
	}
}

// Damaged lines at the end of the file are skipped and counted; the
// events around them are added.
func TestIndexedSkipsLinesThatDoNotDecode(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	events := freshEvents(3)
	var lines []string
	for i, e := range events {
		b, err := audit.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
		if i == 1 {
			lines = append(lines, `{"event_id":"not an event"}`, strings.Repeat("x", 3*audit.MaxEventBytes))
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file, err := audit.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	store, err := OpenAudit(filepath.Join(dir, AuditFileName), AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, bad, err := audit.OpenIndexed(ctx, file, store, audit.IndexedOptions{})
	if err != nil || bad != 2 {
		t.Fatalf("open: %d bad lines, %v; want 2", bad, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := auditIDs(events)
	slices.Sort(want)
	if got := storedIDs(t, filepath.Join(dir, AuditFileName)); !slices.Equal(got, want) {
		t.Fatalf("the store holds %v, want %v", got, want)
	}
}

// While the store fails, Writes go on into the file until MaxBehind
// events wait; the next waits for room and fails with its context,
// leaving nothing in the file; Check says why. Once the store takes
// events again, the waiting ones reach it in file order.
func TestIndexedStoreDownWaitsThenCatchesUp(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	index := &flakyIndex{AuditSink: store}
	s, _, err := audit.OpenIndexed(ctx, file, index, audit.IndexedOptions{MaxBehind: 3, RetryInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	index.failing.Store(true)
	events := freshEvents(4)
	for _, e := range events[:3] {
		if err := s.Write(ctx, e); err != nil {
			t.Fatalf("write while the store is down, with room: %v", err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	err = s.Write(short, events[3])
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "behind the audit file") {
		t.Fatalf("write with no room: %v, want a deadline error naming the backlog", err)
	}
	if got := fileIDs(t, file.Path()); len(got) != 3 || slices.Contains(got, events[3].EventID) {
		t.Fatalf("the file holds %d events, want the 3 written and not the refused one", len(got))
	}
	if err := s.Check(ctx); err == nil || !strings.Contains(err.Error(), "3 audit events wait") || strings.Contains(err.Error(), dir) {
		t.Fatalf("check while the store is down: %v, want the backlog and no path", err)
	}
	if n := s.Waiting(); n != 3 {
		t.Fatalf("%d events wait, want 3", n)
	}
	index.failing.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for s.Waiting() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("check after the store came back: %v", err)
	}
	stored, err := store.Read(ctx, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := auditIDs(stored), auditIDs(events[:3]); !slices.Equal(got, want) {
		t.Fatalf("the store holds %v, want %v", got, want)
	}
	// Room again: a Write goes through.
	if err := s.Write(ctx, events[3]); err != nil {
		t.Fatalf("write after the store came back: %v", err)
	}
}

// Close adds what waits; events it could not add stay in the file and
// the next open adds them.
func TestIndexedCloseLeavesNothingBehind(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	index := &flakyIndex{AuditSink: store}
	s, _, err := audit.OpenIndexed(ctx, file, index, audit.IndexedOptions{RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	index.failing.Store(true)
	events := freshEvents(5)
	for _, e := range events {
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); !errors.Is(err, errIndexDown) {
		t.Fatalf("close with the store down: %v, want its failure", err)
	}
	if got := storedIDs(t, filepath.Join(dir, AuditFileName)); len(got) != 0 {
		t.Fatalf("the store holds %d events, want none yet", len(got))
	}
	file, store = indexedFiles(t, dir)
	s, _, err = audit.OpenIndexed(ctx, file, store, audit.IndexedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want := auditIDs(events)
	slices.Sort(want)
	if got := storedIDs(t, filepath.Join(dir, AuditFileName)); !slices.Equal(got, want) {
		t.Fatalf("after reopening the store holds %v, want %v", got, want)
	}
}
