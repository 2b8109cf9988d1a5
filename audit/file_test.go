package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFileSinkConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 25
	want := map[string]Event{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				e := acquireEvent(t0.Add(time.Duration(w*each+i) * time.Millisecond))
				e.RequestID = fmt.Sprintf("request_%d_%d", w, i)
				if i%3 == 0 {
					e = revokeEvent(e.Timestamp.Time())
				}
				if err := s.Write(context.Background(), e); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				want[e.EventID] = e
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(raw, []byte("\n")), []byte("\n"))
	if len(lines) != writers*each {
		t.Fatalf("%d lines, want %d", len(lines), writers*each)
	}
	for i, l := range lines {
		if !json.Valid(l) {
			t.Fatalf("line %d is not valid JSON: %s", i+1, l)
		}
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d events, want %d", len(got), len(want))
	}
	for _, e := range got {
		w, ok := want[e.EventID]
		if !ok {
			t.Fatalf("unexpected event %s", e.EventID)
		}
		a, _ := Marshal(e)
		b, _ := Marshal(w)
		if !bytes.Equal(a, b) {
			t.Fatalf("event changed:\n%s\n%s", a, b)
		}
		delete(want, e.EventID)
	}
}

func TestFileSinkAppendsAndNarrowsMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		s, err := OpenFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(context.Background(), acquireEvent(t0.Add(time.Duration(i)*time.Second))); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := ReadFile(path)
	if err != nil || len(got) != 2 {
		t.Fatalf("got %d events, %v; want 2 (reopen appends)", len(got), err)
	}
	if _, err := OpenFile(t.TempDir()); err == nil {
		t.Fatal("opened a directory as an audit file")
	}
}

func TestFileSinkRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := revokeEvent(t0)
	bad.Reason = "forged\nline"
	var ve *ValidationError
	if err := s.Write(context.Background(), bad); !errors.As(err, &ve) {
		t.Fatalf("invalid event: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Write(ctx, acquireEvent(t0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	s.Close()
	if err := s.Write(context.Background(), acquireEvent(t0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed sink: %v", err)
	}
	if b, _ := os.ReadFile(path); len(b) != 0 {
		t.Fatalf("refused events were written: %s", b)
	}
}

func TestReadFileStrict(t *testing.T) {
	good, _ := Marshal(acquireEvent(t0))
	cases := map[string]string{
		"torn final line": string(good) + "\n" + string(good[:len(good)/2]),
		"blank line":      string(good) + "\n\n",
		"unknown field":   strings.Replace(string(good), "{", `{"raw_body":"x",`, 1) + "\n",
		"secret":          strings.Replace(string(good), `"job_01"`, `"star_sk_v1_x"`, 1) + "\n",
	}
	for name, content := range cases {
		path := filepath.Join(t.TempDir(), "a.jsonl")
		os.WriteFile(path, []byte(content), 0o600)
		if _, err := ReadFile(path); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "star_sk_") {
			t.Errorf("%s: error echoes a secret: %v", name, err)
		}
	}
	path := filepath.Join(t.TempDir(), "empty.jsonl")
	os.WriteFile(path, nil, 0o600)
	if got, err := ReadFile(path); err != nil || len(got) != 0 {
		t.Fatalf("empty file: %v, %v", got, err)
	}
}

// TestOpenFileRefusesSymlink guarantees that OpenFile never follows a
// symbolic link at the audit path: it is refused, and the file it points at
// is left exactly as it was (not narrowed, cut or appended to).
func TestOpenFileRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim.conf")
	orig := []byte("keep=1\nlast line without newline")
	if err := os.WriteFile(victim, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "audit.jsonl")
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	s, err := OpenFile(path)
	if err == nil {
		s.Close()
	}
	now, _ := os.ReadFile(victim)
	if !bytes.Equal(now, orig) {
		t.Fatalf("OpenFile through a symlink modified its target: %q", now)
	}
	if err == nil {
		t.Fatal("OpenFile accepted a symbolic link as the audit file")
	}
}

// TestFileSinkUnlinkedFileIsReopenedBeforeHighPriority guarantees that once
// the audit file is unlinked under a running server, a high-priority event
// (revoke) is not accepted as durable into the unlinked inode: the sink
// opens a file at the path first and the event is readable there.
func TestFileSinkUnlinkedFileIsReopenedBeforeHighPriority(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	werr := s.Write(ctx, revokeEvent(t0))
	cerr := s.Check(ctx)
	if _, err := os.Stat(path); os.IsNotExist(err) && werr == nil && cerr == nil {
		t.Fatal("a high-priority event was accepted as durable into an unlinked audit file, and Check reports healthy")
	}
	if werr != nil || cerr != nil {
		t.Fatalf("write %v, check %v: the sink should have opened a file at the path", werr, cerr)
	}
	got, err := ReadFile(path)
	if err != nil || len(got) != 1 || got[0].EventType != EventRevoke {
		t.Fatalf("the file at the path holds %d events (%v), want the revoke", len(got), err)
	}
	if s.Reopened() != 1 {
		t.Fatalf("Reopened = %d, want 1", s.Reopened())
	}
}

// TestFileSinkCheckFollowsRenamedFile guarantees that Check notices the
// audit file was renamed away (logrotate without copytruncate) and opens
// the file at the path, so later events are written where operators read.
func TestFileSinkCheckFollowsRenamedFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, acquireEvent(t0)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := s.Write(ctx, acquireEvent(t0.Add(time.Millisecond))); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{path: 1, path + ".1": 1} {
		if got, err := ReadFile(name); err != nil || len(got) != want {
			t.Fatalf("%s holds %d events (%v), want %d", name, len(got), err, want)
		}
	}
}

// TestFileSinkReplacedBySymlinkIsDegraded guarantees that when the audit
// path is replaced by something that cannot be opened as the audit file (a
// symbolic link), high-priority writes are refused and Check reports it.
func TestFileSinkReplacedBySymlinkIsDegraded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, revokeEvent(t0)); err == nil {
		t.Fatal("a revoke event was accepted though the audit path is a symbolic link")
	}
	if err := s.Check(ctx); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Check: %v, want the symbolic link reported", err)
	}
	if b, _ := os.ReadFile(victim); len(b) != 0 {
		t.Fatalf("the link's target was written: %q", b)
	}
}

// readGatedFile holds each ReadAt until release is closed, and records a
// Close that came while a read was under way (which would leave the
// descriptor, and its lock, open past Close).
type readGatedFile struct {
	*os.File
	entered       chan struct{}
	release       chan struct{}
	inRead        sync.Mutex
	reading       bool
	closed        chan struct{}
	closedInARead bool
}

func (f *readGatedFile) ReadAt(b []byte, off int64) (int, error) {
	f.inRead.Lock()
	f.reading = true
	f.inRead.Unlock()
	close(f.entered)
	<-f.release
	n, err := f.File.ReadAt(b, off)
	f.inRead.Lock()
	f.reading = false
	f.inRead.Unlock()
	return n, err
}

func (f *readGatedFile) Close() error {
	f.inRead.Lock()
	f.closedInARead = f.reading
	f.inRead.Unlock()
	close(f.closed)
	return f.File.Close()
}

// A sink closed while the audit index reads its file back returns from
// Close only once the read is over and the file closed: the same path
// then opens again at once (a crash and restart in one process, as the
// bolt crash tests do), instead of "in use by another process".
func TestFileSinkCloseWaitsForReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), acquireEvent(t0)); err != nil {
		t.Fatal(err)
	}
	rf := &readGatedFile{File: s.f.(*os.File), entered: make(chan struct{}), release: make(chan struct{}), closed: make(chan struct{})}
	s.f = rf
	read := make(chan error, 1)
	go func() {
		lines, _, _, err := s.linesBefore(-1, 1)
		if err == nil && len(lines) != 1 {
			err = fmt.Errorf("read back %d lines, want 1", len(lines))
		}
		read <- err
	}()
	<-rf.entered
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	// Give Close every chance to close the file under the read.
	select {
	case <-rf.closed:
	case <-time.After(500 * time.Millisecond):
	}
	close(rf.release)
	if err := <-read; err != nil {
		t.Fatalf("the read begun before Close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	select {
	case <-rf.closed:
	default:
		t.Fatal("Close returned without closing the file")
	}
	if rf.closedInARead {
		t.Fatal("Close closed the file while a read of it was under way")
	}
	again, err := OpenFile(path)
	if err != nil {
		t.Fatalf("reopening after Close: %v", err)
	}
	again.Close()
}
