package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// FileSink appends events to a JSON-lines file, one event per line. It is
// safe for concurrent use.
//
// Every Write fsyncs before it returns, so every accepted event is durable.
// That costs one fsync per event; group commit (concurrent writers sharing
// one fsync, as bbolt's Batch does) would buy throughput and is possible
// without changing the contract of Write, but per-event fsync is the simple,
// obviously safe choice.
//
// After a failed write or fsync the file's tail is unknown (a torn line, or
// pages the kernel dropped), so the sink fails closed: every later Write
// fails until the sink is reopened.
type FileSink struct {
	mu     sync.Mutex
	f      *os.File
	path   string
	broken error
	closed bool
}

// OpenFile opens (creating if needed) the audit file at path for appending,
// with mode 0600. An existing file is narrowed to 0600; anything but a
// regular file is refused.
func OpenFile(path string) (*FileSink, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	if err == nil && fi.Mode().Perm() != 0o600 {
		err = f.Chmod(0o600)
	}
	if err == nil {
		// Make the file's directory entry durable too.
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: open %s: %w", path, err)
	}
	return &FileSink{f: f, path: path}, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Path is the file's path.
func (s *FileSink) Path() string { return s.path }

// Write validates e, appends it as one line and fsyncs.
func (s *FileSink) Write(ctx context.Context, e Event) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	b, err := Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.broken != nil:
		return s.broken
	}
	if _, err := s.f.Write(b); err != nil {
		s.broken = fmt.Errorf("audit: %s failed earlier (write): reopen required", s.path)
		return fmt.Errorf("audit: write %s: %w", s.path, err)
	}
	if err := s.f.Sync(); err != nil {
		s.broken = fmt.Errorf("audit: %s failed earlier (fsync): reopen required", s.path)
		return fmt.Errorf("audit: fsync %s: %w", s.path, err)
	}
	return nil
}

// Close closes the file. Later writes fail with ErrClosed.
func (s *FileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.f.Close()
}
