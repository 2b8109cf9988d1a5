package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/starintel/starlease/internal/groupcommit"
	"github.com/starintel/starlease/internal/syncdir"
)

// FileSink appends events to a JSON-lines file, one event per line. It is
// safe for concurrent use, and holds an exclusive lock (flock) on the file
// while open: it is the file's only writer.
//
// Every Write fsyncs before it returns, so every accepted event is durable.
// Concurrent writers share the fsync (groupcommit.Queue): whoever finds no
// append in progress appends every queued line in one write and one fsync,
// the lines queued meanwhile going to the next batch, so a busy server pays
// one fsync per batch instead of one per event, and a writer alone pays
// exactly its own.
// A batch fails or lands as a whole.
//
// A failed write or fsync (a full disk, an I/O error) never leaves a
// partial line and never disables the sink: the file is truncated back to
// the end of the last durable line at once (and again before the next
// write, if that failed too), and every later Write tries again, so the
// sink recovers by itself when the fault clears. An event whose Write
// failed is not in the file. Check reports the fault until it clears.
// OpenFile quarantines a torn tail a crash left behind, so appends always
// start on a line boundary.
type FileSink struct {
	// lines batches concurrent writers' lines into one append and fsync.
	lines groupcommit.Queue[*pendingLine]

	mu     sync.Mutex
	f      file
	path   string
	size   int64 // end of the last durable line
	dirty  bool  // bytes past size may be on disk: truncate before writing
	failed error // the last write's failure, until a write or Check succeeds
	closed bool
	torn   int64 // bytes of a torn tail OpenFile quarantined
	// reading counts the reads of f that linesBefore runs without mu:
	// Close waits for them, so the file and its lock are released when
	// Close returns (a read in flight would otherwise keep the descriptor,
	// and the lock, past it).
	reading sync.WaitGroup

	reopened int // times the file at path was (re)opened in place of s.f

	// durable, if set (Indexed, before the first Write), is called with
	// the lines (without their newline) of each batch the file took, in
	// file order, before their writers return, and the file's generation.
	durable func(gen uint64, lines [][]byte)
	// gen counts the times the lines before the end stopped being the
	// file's: it was reopened at its path (rotated away) or found shorter
	// (cut from outside). Offsets of one generation mean nothing in another.
	gen uint64
}

// file is what FileSink needs of its *os.File (tests wrap it to inject
// faults).
type file interface {
	io.Writer
	io.ReaderAt
	Stat() (os.FileInfo, error)
	Sync() error
	Truncate(size int64) error
	Close() error
}

// OpenFile opens (creating if needed) the audit file at path for appending,
// with mode 0600. An existing file is narrowed to 0600; anything but a
// regular file is refused (a symbolic link too: it is not followed), as is
// a file another process holds open as an audit file. A torn final line (no newline: a crash in the middle of a
// write) is moved to path+".torn" and cut off.
func OpenFile(path string) (*FileSink, error) {
	f, size, torn, err := openPath(path)
	if err != nil {
		return nil, err
	}
	return &FileSink{f: f, path: path, size: size, torn: torn}, nil
}

var errSymlink = errors.New("a symbolic link, not a regular file")

// openPath opens, locks and checks the audit file at path (OpenFile).
func openPath(path string) (f *os.File, size, torn int64, err error) {
	// O_NOFOLLOW: a symbolic link at path (whoever can write the data
	// directory could point it at any file) is refused, never followed:
	// the server would narrow its target to 0600, cut its last line and
	// append events to it.
	f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, 0, 0, fmt.Errorf("audit: open %s: %w", path, errSymlink)
		}
		return nil, 0, 0, fmt.Errorf("audit: open %s: %w", path, err)
	}
	size, torn, err = openChecks(f, path)
	if err != nil {
		f.Close()
		return nil, 0, 0, fmt.Errorf("audit: open %s: %w", path, err)
	}
	return f, size, torn, nil
}

// followPathLocked makes sure the open file is the one at the sink's path:
// once the audit file is unlinked or renamed away, events written to the
// open file reach no path an operator reads. If the path names another
// file, or none, it is opened (created) in its place, as OpenFile does;
// if that fails the error is returned (the sink is degraded). s.mu is held.
func (s *FileSink) followPathLocked() error {
	cur, err := s.f.Stat()
	if err != nil {
		return err
	}
	at, err := os.Lstat(s.path)
	switch {
	case err == nil && os.SameFile(cur, at):
		return nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	}
	f, size, torn, err := openPath(s.path)
	if err != nil {
		return fmt.Errorf("the audit file was replaced or removed, and reopening it failed: %w", SystemError(errors.Unwrap(err)))
	}
	old := s.f
	s.f, s.size, s.dirty, s.torn = f, size, false, s.torn+torn
	s.reopened++
	s.gen++
	_ = old.Close()
	return nil
}

// Reopened is how many times the sink found its file unlinked, renamed
// away or replaced and opened the file at its path instead.
func (s *FileSink) Reopened() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reopened
}

// openChecks locks and checks an opened audit file, repairs a torn tail,
// and returns the size to append at and the torn bytes quarantined.
func openChecks(f *os.File, path string) (size, torn int64, err error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, 0, errors.New("not a regular file")
	}
	// Truncating back after a failure is safe only for the one writer.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return 0, 0, fmt.Errorf("in use by another process (%v)", err)
	}
	if fi.Mode().Perm() != 0o600 {
		if err := f.Chmod(0o600); err != nil {
			return 0, 0, err
		}
	}
	if size, err = repairTornTail(f, path, fi.Size()); err != nil {
		return 0, 0, err
	}
	// Make the file's directory entry durable too.
	return size, fi.Size() - size, syncdir.Sync(filepath.Dir(path))
}

// repairTornTail finds the end of the last whole line of f (size bytes)
// and, if bytes follow it, appends them to path+".torn" (fsynced) and
// truncates f there. It returns the new size.
func repairTornTail(f *os.File, path string, size int64) (int64, error) {
	end, err := lastLineEnd(f, size)
	if err != nil || end == size {
		return size, err
	}
	tail := make([]byte, size-end)
	if _, err := f.ReadAt(tail, end); err != nil {
		return 0, err
	}
	q, err := os.OpenFile(path+".torn", os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, fmt.Errorf("quarantine the torn tail: %w", err)
	}
	_, err = q.Write(append(tail, '\n'))
	if err == nil {
		err = q.Sync()
	}
	if cerr := q.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("quarantine the torn tail: %w", err)
	}
	if err := f.Truncate(end); err != nil {
		return 0, err
	}
	return end, f.Sync()
}

// lastLineEnd is the offset just past the last newline of f's first size
// bytes (0 if there is none), read backwards in chunks.
func lastLineEnd(f io.ReaderAt, size int64) (int64, error) {
	buf := make([]byte, 64<<10)
	for off := size; off > 0; {
		n := min(int64(len(buf)), off)
		off -= n
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return off + int64(i) + 1, nil
		}
	}
	return 0, nil
}

// linesBefore returns up to n whole lines (without their newlines) that
// end at offset end (a line boundary; a negative end or one past the last
// durable line means that line's end), oldest first, the offset at which
// the first of them starts, and the file's generation they belong to. It
// reads backwards, at most as many bytes as n lines of the longest event
// take (a longer line is cut to its end: it is no event), without holding
// up writes: the lines before the end of the last durable line do not
// change within a generation.
func (s *FileSink) linesBefore(end int64, n int) (lines [][]byte, start int64, gen uint64, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, 0, 0, ErrClosed
	}
	f, size := s.f, s.size
	gen = s.gen
	s.reading.Add(1)
	s.mu.Unlock()
	defer s.reading.Done()
	if end < 0 || end > size {
		end = size
	}
	limit := int64(n+1) * (MaxEventBytes + 1)
	var chunks [][]byte // newest first
	newlines, read, off := 0, int64(0), end
	for off > 0 && newlines <= n && read < limit {
		k := min(int64(64<<10), off)
		off -= k
		c := make([]byte, k)
		if _, err := f.ReadAt(c, off); err != nil {
			return nil, 0, 0, err
		}
		newlines += bytes.Count(c, []byte{'\n'})
		read += k
		chunks = append(chunks, c)
	}
	slices.Reverse(chunks)
	lines = bytes.Split(bytes.Join(chunks, nil), []byte{'\n'})
	lines = lines[:len(lines)-1] // the region ends with a newline
	start = off
	if off > 0 && len(lines) > 0 {
		start += int64(len(lines[0]) + 1)
		lines = lines[1:] // begins before the bytes read
	}
	if len(lines) > n {
		for _, l := range lines[:len(lines)-n] {
			start += int64(len(l) + 1)
		}
		lines = lines[len(lines)-n:]
	}
	return lines, start, gen, nil
}

// generation is the file's generation (see gen).
func (s *FileSink) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Path is the file's path.
func (s *FileSink) Path() string { return s.path }

// TornBytes is the size of the torn tail OpenFile moved to Path()+".torn",
// zero if the file ended on a line boundary.
func (s *FileSink) TornBytes() int64 { return s.torn }

// pendingLine is one Write's line waiting in the queue, and its outcome.
type pendingLine struct {
	b    []byte
	high bool
	err  error
	done chan struct{}
}

// Write validates e, appends it as one line and fsyncs (with the lines of
// concurrent writers).
func (s *FileSink) Write(ctx context.Context, e Event) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	b, err := Marshal(e)
	if err != nil {
		return err
	}
	p := &pendingLine{b: append(b, '\n'), high: e.Priority == PriorityHigh || PriorityOf(e.EventType) == PriorityHigh,
		done: make(chan struct{})}
	s.lines.Submit(p, s.appendBatch)
	<-p.done
	return p.err
}

// appendBatch appends the lines of batch in one write and one fsync and
// gives each its outcome.
func (s *FileSink) appendBatch(batch []*pendingLine) {
	// Answered however the append ends, so no writer waits forever.
	err := ErrSinkPanicked
	defer func() {
		for _, p := range batch {
			p.err = err
			close(p.done)
		}
	}()
	var lines []byte
	high := false
	for _, p := range batch {
		lines = append(lines, p.b...)
		high = high || p.high
	}
	var gen uint64
	err = s.appendGuarded(lines, high, &gen)
	if err == nil && s.durable != nil {
		taken := make([][]byte, len(batch))
		for i, p := range batch {
			taken[i] = p.b[:len(p.b)-1]
		}
		s.durable(gen, taken)
	}
}

// appendGuarded is appendLocked under s.mu. A panic in it fails the batch
// instead of leaving s.mu held and the batch's writers waiting forever. The
// file may then hold some or all of the batch's lines, reported as not
// written, so as after a failed write they are cut off at once (or, if
// that fails too, before the next write and by Check).
func (s *FileSink) appendGuarded(b []byte, high bool, gen *uint64) (err error) {
	s.mu.Lock()
	returned := false
	defer func() {
		// A panic, or a file operation that ended the goroutine
		// (runtime.Goexit): not returned.
		if !returned || err == ErrSinkPanicked {
			s.dirty = true
			_ = Recovered(s.truncateLocked)
			err = s.fail("write", ErrSinkPanicked)
		}
		s.mu.Unlock()
	}()
	err = Recovered(func() error { return s.appendLocked(b, high) })
	returned = true
	*gen = s.gen
	return err
}

// appendLocked appends whole lines durably or not at all; s.mu is held.
func (s *FileSink) appendLocked(b []byte, high bool) error {
	if s.closed {
		return ErrClosed
	}
	// A high-priority event (force-release, revoke) is reported durable to
	// the administrator: it must land in the file at the path, not in one
	// unlinked or renamed away.
	if high {
		if err := s.followPathLocked(); err != nil {
			return s.fail("reopen", err)
		}
	}
	if err := s.truncateLocked(); err != nil {
		return s.fail("truncate", err)
	}
	if err := s.shrinkToFileLocked(); err != nil {
		return s.fail("stat", err)
	}
	if _, err := s.f.Write(b); err != nil {
		s.dirty = true
		_ = s.truncateLocked() // at once: a crash must not find a partial line
		return s.fail("write", err)
	}
	if err := s.f.Sync(); err != nil {
		// The lines may or may not be on disk: they are reported as not
		// written, so they must not stay.
		s.dirty = true
		_ = s.truncateLocked()
		return s.fail("fsync", err)
	}
	s.size += int64(len(b))
	s.failed = nil
	return nil
}

// truncateLocked cuts the file back to the last durable line if a failed
// write may have left bytes past it; s.mu is held.
func (s *FileSink) truncateLocked() error {
	if !s.dirty {
		return nil
	}
	// Never truncate above the file's real size: that would fill the gap
	// with NUL bytes (a line no reader gets past).
	if err := s.shrinkToFileLocked(); err != nil {
		return err
	}
	if err := s.f.Truncate(s.size); err != nil {
		return err
	}
	if err := s.f.Sync(); err != nil {
		return err
	}
	s.dirty = false
	return nil
}

// shrinkToFileLocked lowers s.size to the end of the file's last whole line
// when the file is shorter than s.size: it was cut from outside (logrotate
// copytruncate), and the end of the last durable line is no longer s.size.
// Appends (O_APPEND) go to the real end, so a failed write is cut back to
// where it began. s.mu is held.
func (s *FileSink) shrinkToFileLocked() error {
	fi, err := s.f.Stat()
	if err != nil {
		return err
	}
	if real := fi.Size(); real < s.size {
		end, err := lastLineEnd(s.f, real)
		if err != nil {
			return err
		}
		s.size = end
		s.gen++
	}
	return nil
}

// truncateTo cuts the file to n bytes, a line boundary (Spool empties its
// file once everything in it was forwarded).
func (s *FileSink) truncateTo(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.size, s.dirty = n, true
	return s.truncateLocked()
}

// fail records a failure for Check and returns it; s.mu is held.
func (s *FileSink) fail(op string, err error) error {
	s.failed = fmt.Errorf("%s: %s: %w", filepath.Base(s.path), op, SystemError(err))
	return fmt.Errorf("audit: %s %s: %w", op, s.path, err)
}

// Check reports whether the sink can write durably now: nil, or the last
// failure while it lasts. It first makes sure the open file is still the
// one at the path (unlinked, renamed away or replaced: the file at the path
// is opened instead, or Check reports why it cannot be). After a failure it tries to recover without
// writing an event: the file is cut back to its last durable line and a
// scratch file of one maximal event is written and fsynced beside it (a
// full disk fails here). Success clears the failure.
func (s *FileSink) Check(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	// The file at the path must be the open one (see followPathLocked).
	if err := s.followPathLocked(); err != nil {
		return s.fail("reopen", err)
	}
	if s.failed == nil {
		return nil
	}
	if err := s.truncateLocked(); err != nil {
		return s.failed
	}
	if err := CheckRoom(filepath.Dir(s.path)); err != nil {
		return s.failed
	}
	s.failed = nil
	return nil
}

// Close closes the file, once the reads under way have ended: when it
// returns, the file is no longer open, nor locked, in this process. Later
// writes fail with ErrClosed.
func (s *FileSink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	f := s.f
	s.mu.Unlock()
	s.reading.Wait()
	return f.Close()
}
