package audit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// OnceWriter is a Sink that can write an event at most once by its event
// id: WriteOnce stores nothing if the sink already holds the event, from
// an earlier WriteOnce or from a Write whose outcome its caller never
// learnt. Spool forwards through it.
type OnceWriter interface {
	WriteOnce(ctx context.Context, e Event) error
}

// SpoolOptions configures a Spool.
type SpoolOptions struct {
	// RetryInterval is how often forwarding is retried while events wait
	// and the backend refuses them. Zero means one second.
	RetryInterval time.Duration
	// ForwardTimeout bounds one forwarded write. Zero means 5 s.
	ForwardTimeout time.Duration
}

// Spool is a Sink in front of a backend's audit store (the Valkey stream)
// that keeps every event when the backend cannot take it: an event whose
// backend Write fails is appended to a local spool file instead (a
// FileSink: fsynced, never a partial line) and Write succeeds, since the
// event is durable. A background forwarder sends spooled events to the
// backend when it answers again, in spool order and through
// OnceWriter.WriteOnce when the backend has it, so an event is in the
// backend once even if its first Write reached it after all, or the server
// crashed between forwarding and noting it. While events wait, new events
// join the spool behind them (they do not overtake). When all are
// forwarded the spool file is emptied. Events still spooled at Close stay
// in the file and are forwarded by the next OpenSpool.
//
// Write fails only if neither the backend nor the spool file took the
// event. Check reports a spool file that cannot be written, and spooled
// events the backend keeps refusing.
type Spool struct {
	next  Sink
	local *FileSink
	opts  SpoolOptions

	mu       sync.RWMutex // Lock: appends to and bookkeeping of the spool
	pending  int          // spooled events not yet forwarded
	badLines int          // unreadable lines moved to the .bad file
	offset   int64        // bytes of the spool already forwarded
	fwdErr   error        // the last forwarding failure, while events wait
	closed   bool

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// OpenSpool opens (creating if needed) the spool file at path in front of
// next and starts forwarding what it holds. Close closes next too.
func OpenSpool(path string, next Sink, o SpoolOptions) (*Spool, error) {
	if o.RetryInterval <= 0 {
		o.RetryInterval = time.Second
	}
	if o.ForwardTimeout <= 0 {
		o.ForwardTimeout = 5 * time.Second
	}
	local, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	// Count the spooled lines without decoding them: a damaged line is
	// moved aside when the forwarder reaches it, it does not stop startup.
	// (OpenFile cut off a torn tail, so every line ends with a newline.)
	waiting, err := countLines(path)
	if err != nil {
		local.Close()
		return nil, fmt.Errorf("audit: spool %s: %w", path, err)
	}
	s := &Spool{next: next, local: local, opts: o, pending: waiting,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	s.poke()
	return s, nil
}

// Pending is the number of spooled events not yet forwarded.
func (s *Spool) Pending() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pending
}

// Write writes e to the backend, or spools it if the backend fails or
// events are already waiting.
func (s *Spool) Write(ctx context.Context, e Event) error {
	done, backendErr := s.writeDirect(ctx, e)
	if done {
		return backendErr
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	// A fresh context: the backend may have used up the caller's.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ForwardTimeout)
	defer cancel()
	if err := s.local.Write(wctx, e); err != nil {
		return errors.Join(backendErr, err)
	}
	s.pending++
	s.poke()
	return nil
}

// writeDirect writes e to the backend while nothing waits in the spool:
// done is true if that settled the write (written, or the spool closed);
// otherwise e must be spooled, and backendErr is why. A backend that
// panics fails like one that is down, and the read lock is released
// however the backend's call ends.
func (s *Spool) writeDirect(ctx context.Context, e Event) (done bool, backendErr error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.closed:
		return true, ErrClosed
	case s.pending > 0:
		return false, nil
	}
	if err := Recovered(func() error { return s.next.Write(ctx, e) }); err != nil {
		return false, err
	}
	return true, nil
}

func (s *Spool) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Spool) loop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-t.C:
		}
		_ = s.Forward(context.Background())
	}
}

// Forward sends the spooled events to the backend, in order, until none is
// left or one fails (it is then retried, from that event, later). The
// forwarder calls it; tests may too.
func (s *Spool) Forward(ctx context.Context) error {
	for {
		e, n, err := s.head()
		if err != nil {
			// The forwarder cannot get past the head: record it, so Check
			// (and /readyz) reports the events waiting behind it.
			s.mu.Lock()
			s.fwdErr = err
			s.mu.Unlock()
			return err
		}
		if n == 0 {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, s.opts.ForwardTimeout)
		if ow, ok := s.next.(OnceWriter); ok {
			err = Recovered(func() error { return ow.WriteOnce(wctx, e) })
		} else {
			err = Recovered(func() error { return s.next.Write(wctx, e) })
		}
		cancel()
		s.mu.Lock()
		if err != nil {
			s.fwdErr = err
			s.mu.Unlock()
			return err
		}
		s.fwdErr = nil
		s.offset += n
		s.pending--
		if s.pending == 0 {
			// Everything is in the backend: start the spool afresh. Even
			// if the truncate failed part-way, the file sink cuts back to
			// 0 before its next append, so the next event is at 0.
			_ = s.local.truncateTo(0)
			s.offset = 0
		}
		s.mu.Unlock()
	}
}

// head reads the oldest spooled event not yet forwarded and its line's
// length (0 if none waits). Under the lock, so no append is half done. A
// line that is not one readable event (bit rot, a bad sector, a line too
// long) is appended to the spool path+".bad" (fsynced), counted, and
// skipped, so the events behind it are still forwarded; only a failure to
// read the spool or to move such a line aside stops forwarding (Forward
// records it for Check).
func (s *Spool) head() (Event, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.closed || s.pending == 0 {
			return Event{}, 0, nil
		}
		e, n, err := s.readHeadLocked()
		if err != nil || n > 0 {
			return e, n, err
		}
	}
}

// readHeadLocked reads the line at s.offset: the event and the line's
// length, or (after moving an unreadable line aside) a zero length, to be
// called again. s.mu is held.
func (s *Spool) readHeadLocked() (Event, int64, error) {
	f, err := os.Open(s.local.Path())
	if err != nil {
		return Event{}, 0, err
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(io.NewSectionReader(f, s.offset, MaxEventBytes+1), MaxEventBytes+1).ReadSlice('\n')
	switch {
	case err == nil:
		if e, uerr := Unmarshal(line[:len(line)-1]); uerr == nil {
			return e, int64(len(line)), nil
		}
	case errors.Is(err, bufio.ErrBufferFull), errors.Is(err, io.EOF) && len(line) > MaxEventBytes:
		// Longer than any event: unreadable too.
	default:
		return Event{}, 0, fmt.Errorf("audit: spool: reading the next event: %w", err)
	}
	n, err := quarantineLine(f, s.offset, s.local.Path()+".bad")
	if err != nil {
		return Event{}, 0, fmt.Errorf("audit: spool: moving an unreadable event aside: %w", err)
	}
	s.offset += n
	s.pending--
	s.badLines++
	if s.pending == 0 {
		_ = s.local.truncateTo(0) // see Forward
		s.offset = 0
	}
	return Event{}, 0, nil
}

// quarantineLine appends the line of f starting at off (through its
// newline) to the file at q, fsynced, and returns the line's length.
func quarantineLine(f *os.File, off int64, q string) (int64, error) {
	r := bufio.NewReader(io.NewSectionReader(f, off, 1<<62))
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return 0, fmt.Errorf("no end of line: %w", err)
		}
	}
	qf, err := os.OpenFile(q, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	_, err = qf.Write(line)
	if err == nil {
		err = qf.Sync()
	}
	if cerr := qf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	return int64(len(line)), nil
}

// countLines counts the newline-terminated lines of the file at path.
func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	n := 0
	for {
		k, err := f.Read(buf)
		n += bytes.Count(buf[:k], []byte{'\n'})
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// BadLines is the number of unreadable spooled lines moved to the spool's
// path+".bad" file (not forwarded) since OpenSpool.
func (s *Spool) BadLines() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.badLines
}

// Check reports a spool file that cannot take events, or spooled events the
// backend keeps refusing (they are durable here, but not yet where audit
// readers look), and the backend's own Check.
func (s *Spool) Check(ctx context.Context) error {
	s.mu.RLock()
	pending, fwdErr := s.pending, s.fwdErr
	s.mu.RUnlock()
	var errs []error
	if err := s.local.Check(ctx); err != nil {
		errs = append(errs, fmt.Errorf("spool: %w", err))
	}
	if pending > 0 && fwdErr != nil {
		errs = append(errs, fmt.Errorf("%d events spooled locally, the backend's audit store does not take them yet", pending))
	}
	if err := Check(ctx, s.next); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Close stops forwarding (after one last attempt), closes the spool file
// and the backend sink. Spooled events stay for the next OpenSpool.
func (s *Spool) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.ForwardTimeout)
		_ = s.Forward(ctx)
		cancel()
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.closeErr = errors.Join(s.local.Close(), s.next.Close())
	})
	return s.closeErr
}
