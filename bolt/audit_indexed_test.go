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

func (f *flakyIndex) AddMissing(ctx context.Context, lines [][]byte, taken bool) (int, int, error) {
	f.calls.Add(1)
	if f.failing.Load() {
		return 0, 0, fmt.Errorf("audit: write: %w", errIndexDown)
	}
	return f.AuditSink.AddMissing(ctx, lines, taken)
}

func (f *flakyIndex) Holds(ctx context.Context, lines [][]byte) (bool, error) {
	if f.failing.Load() {
		return false, fmt.Errorf("audit: read: %w", errIndexDown)
	}
	return f.AuditSink.Holds(ctx, lines)
}

// linesOf is the audit file lines of events.
func linesOf(t *testing.T, events ...audit.Event) [][]byte {
	t.Helper()
	out := make([][]byte, len(events))
	for i, e := range events {
		b, err := audit.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
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
	events := freshEvents(120)
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
	if err := store2.db.View(func(tx *bbolt.Tx) error { high = int(auditCount(readView(tx), auditKeyHigh)); return nil }); err != nil {
		t.Fatal(err)
	}
	if high != 24 {
		t.Fatalf("high-priority count %d, want 24", high)
	}
}

// A crash leaves events in the file the store lacks; opening again reads
// the file backwards in runs of 2×MaxBehind lines and adds what each run
// lacks, until a run adds nothing: everything before it is in the store.
func TestIndexedCatchesUpAfterACrash(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name        string
		held        []int // events the store holds before opening
		wantIndexed []int // events it holds after
	}{
		// Runs of 8: 12..19 adds 12, 14..19; 4..11 adds 4..8, 11; 0..3
		// adds 1..3 (the file's start).
		{"missing throughout", []int{0, 9, 10, 13}, seq(0, 20)},
		// 12..19 are all there: the scan stops; 0..7 stay missing (no
		// crash leaves a hole behind lines the store holds).
		{"a run already held", seq(8, 20), seq(8, 20)},
		// A clean stop left nothing: the first run adds nothing.
		{"nothing missing", seq(0, 20), seq(0, 20)},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file, store := indexedFiles(t, dir)
			events := freshEvents(20)
			for _, e := range events {
				if err := file.Write(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := store.AddMissing(ctx, linesOf(t, pick(events, c.held)...), false); err != nil {
				t.Fatal(err)
			}
			s, bad, err := audit.OpenIndexed(ctx, file, store, audit.IndexedOptions{MaxBehind: 4})
			if err != nil || bad != 0 {
				t.Fatalf("open: %d bad, %v", bad, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			want := auditIDs(pick(events, c.wantIndexed))
			slices.Sort(want)
			if got := storedIDs(t, filepath.Join(dir, AuditFileName)); !slices.Equal(got, want) {
				t.Fatalf("after catching up the store holds %d events, want %d", len(got), len(want))
			}
		})
	}
}

func seq(from, to int) (out []int) {
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func pick(events []audit.Event, at []int) (out []audit.Event) {
	for _, i := range at {
		out = append(out, events[i])
	}
	return out
}

// gatedIndex is the bolt audit store whose AddMissing waits for open.
type gatedIndex struct {
	*AuditSink
	open chan struct{}
}

func (g *gatedIndex) AddMissing(ctx context.Context, lines [][]byte, taken bool) (int, int, error) {
	<-g.open
	return g.AuditSink.AddMissing(ctx, lines, taken)
}

// A store far behind a long file (wiped) does not hold the start up: the
// catch-up reads 16 runs, adds nothing before the sink opens, and goes on
// in the background, where the store gets every event.
func TestIndexedStartsAtOnceFarBehind(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	events := freshEvents(100)
	for _, e := range events {
		if err := file.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	index := &gatedIndex{AuditSink: store, open: make(chan struct{})}
	// Runs of 4 lines: 16 runs are 64 lines, fewer than the 100 missing.
	opened := make(chan error, 1)
	var s *audit.Indexed
	go func() {
		var err error
		s, _, err = audit.OpenIndexed(ctx, file, index, audit.IndexedOptions{MaxBehind: 2, Gather: -1})
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(index.open)
		t.Fatal("OpenIndexed waited to add what the store lacks before it returned")
	}
	close(index.open)
	deadline := time.Now().Add(10 * time.Second)
	for s.Waiting() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n, err := store.Count(ctx); err != nil || n != 100 {
		t.Fatalf("the store holds %d events after catching up (%v), want 100", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
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

// While the store fails, every Write goes on into the file, beyond
// MaxBehind too; the store is tried every RetryInterval, not at each
// write; Check says why, naming no path. Once the store takes events
// again, it gets them all: those waiting, and the overflow read back from
// the file.
func TestIndexedStoreDownThenCatchesUp(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	index := &flakyIndex{AuditSink: store}
	s, _, err := audit.OpenIndexed(ctx, file, index, audit.IndexedOptions{MaxBehind: 3, RetryInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	index.failing.Store(true)
	events := freshEvents(10)
	if err := s.Write(ctx, events[0]); err != nil {
		t.Fatal(err)
	}
	for index.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	for _, e := range events[1:] {
		short, cancel := context.WithTimeout(ctx, time.Second)
		err := s.Write(short, e)
		cancel()
		if err != nil {
			t.Fatalf("write while the store is down: %v", err)
		}
	}
	if calls := index.calls.Load(); calls > 2 {
		t.Fatalf("the failing store was tried %d times during the writes, want once per RetryInterval", calls)
	}
	if got := fileIDs(t, file.Path()); len(got) != 10 {
		t.Fatalf("the file holds %d events, want all 10", len(got))
	}
	err = s.Check(ctx)
	if !errors.Is(err, audit.ErrIndexBehind) || !strings.Contains(err.Error(), "10 events wait") || strings.Contains(err.Error(), dir) {
		t.Fatalf("check while the store is down: %v, want ErrIndexBehind, the backlog and no path", err)
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
	got, want := auditIDs(stored), auditIDs(events)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the store holds %v, want %v", got, want)
	}
}

// An overflow catching up cannot read back entirely is reported: the
// store gets the lines waiting in memory and the file's last MaxRuns runs
// of 2×MaxBehind lines, and OnBehind says how many lines it read back.
func TestIndexedReportsWhatItCannotCatchUpOn(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file, store := indexedFiles(t, dir)
	index := &flakyIndex{AuditSink: store}
	var behind atomic.Int64
	s, _, err := audit.OpenIndexed(ctx, file, index, audit.IndexedOptions{MaxBehind: 2, MaxRuns: 4, RetryInterval: 20 * time.Millisecond,
		OnBehind: func(n int) { behind.Add(int64(n)) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	index.failing.Store(true)
	events := freshEvents(40)
	for _, e := range events {
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	index.failing.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for s.Waiting() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// The 2 waiting in memory (events 0 and 1), then 4 runs of 4 lines:
	// events 24..39.
	want := auditIDs(append(events[:2:2], events[24:]...))
	slices.Sort(want)
	stored, err := store.Read(ctx, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	got := auditIDs(stored)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("the store holds %d events, want %d", len(got), len(want))
	}
	if n := behind.Load(); n != 16 {
		t.Fatalf("OnBehind said %d lines, want the 16 read back", n)
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

// Holds reads a line's event id where Marshal puts it, first; anything
// else is decoded in full.
func TestLeadingEventIDReadsMarshalsOrder(t *testing.T) {
	for _, e := range freshEvents(5) {
		line := linesOf(t, e)[0]
		id, ok := leadingEventID(line)
		if !ok || string(id) != e.EventID {
			t.Fatalf("leadingEventID(%.60s…) = %q, %v; want %s", line, id, ok, e.EventID)
		}
	}
	for _, bad := range []string{`{"event_type":"x","event_id":"01M91DJ5188BNB54NZBB6EPXKF"}`, `{"event_id":"01M91DJ5188BNB54NZBB6EPXK"}`,
		`{"event_id":"01M91DJ5188BNB54NZBB6EPXKFX",`, `{"event_id":"not-a-ulid-at-all-not-a-ulid",`} {
		if id, ok := leadingEventID([]byte(bad)); ok {
			t.Fatalf("leadingEventID(%s) = %q, want none", bad, id)
		}
	}
}
