package audit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Index is an audit store that Indexed fills from the audit file: the
// bolt audit store (bolt.AuditSink), which operators query.
type Index interface {
	// AddMissing stores durably, in one transaction, each of events whose
	// event id it does not hold yet, and nothing if it fails.
	AddMissing(ctx context.Context, events []Event) error
	Close() error
}

// IndexedOptions configures an Indexed sink.
type IndexedOptions struct {
	// MaxBehind bounds the events the file holds and the index does not
	// yet: a Write waits for room (or its context) beyond it. Zero means
	// DefaultMaxBehind.
	MaxBehind int
	// RetryInterval is how often adding to a failing index is retried.
	// Zero means one second.
	RetryInterval time.Duration
	// IndexTimeout bounds one AddMissing. Zero means 5 s.
	IndexTimeout time.Duration
	// Gather is how long the index waits after adding a batch before it
	// adds the next, so one transaction takes every event written in that
	// time: its commit (two fsyncs) is shared by more events and competes
	// less for the disk with the requests' own. Zero means
	// DefaultGather; negative means no wait.
	Gather time.Duration
}

// Defaults of IndexedOptions.
const (
	DefaultMaxBehind = 4096
	DefaultGather    = 50 * time.Millisecond
)

// Indexed is the audit sink of a server whose audit store is local (the
// bolt backend): an event is durable once the audit file holds it
// (FileSink: fsynced) and Write returns then; the index gets it after,
// with every event written meanwhile in one transaction. A request then
// waits for the file's fsync alone, not also for the index's commit after
// it (two more fsyncs).
//
// At most MaxBehind events are in the file and not in the index: a Write
// takes room before it writes the file and the room is freed once the
// index holds the event. The index takes the events in file order, so
// those it lacks are always among the file's last MaxBehind lines; after a
// crash OpenIndexed adds those (the ones already there are skipped by event
// id) before it takes any new event.
//
// The bound holds for the file at the path: an event not yet indexed when
// the file is rotated away (copied and truncated, or renamed) and the
// server crashes before indexing it is in the rotated file only.
//
// A failing index does not fail Writes while there is room: the events
// are durable in the file and wait, in order, and are added when the
// index takes them again; Check reports the failure meanwhile. Close adds
// what waits, then closes the index and the file.
type Indexed struct {
	file  *FileSink
	index Index
	opts  IndexedOptions
	room  chan struct{} // a token per event taken and not yet indexed

	life   sync.RWMutex // Write holds it for reading; Close waits for Writes
	closed bool

	mu      sync.Mutex
	waiting []Event // in the file, not yet in the index, in file order
	failed  error   // the last AddMissing's failure, while events wait

	adding sync.Mutex // one AddMissing at a time, so the index gets file order

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// OpenIndexed returns file's events indexed by index: first it adds the
// events of the file's last MaxBehind lines the index lacks (what a crash
// left unindexed), and reports how many of those lines did not decode
// (skipped: the file is the record, the index a copy). It fails if the
// index cannot take them. Closing the sink closes file and index.
func OpenIndexed(ctx context.Context, file *FileSink, index Index, o IndexedOptions) (*Indexed, int, error) {
	if o.MaxBehind <= 0 {
		o.MaxBehind = DefaultMaxBehind
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = time.Second
	}
	if o.IndexTimeout <= 0 {
		o.IndexTimeout = 5 * time.Second
	}
	if o.Gather == 0 {
		o.Gather = DefaultGather
	}
	tail, bad, err := file.tailEvents(o.MaxBehind)
	if err != nil {
		return nil, 0, fmt.Errorf("audit: read the audit file's last events: %w", err)
	}
	if len(tail) > 0 {
		if err := index.AddMissing(ctx, tail); err != nil {
			return nil, bad, fmt.Errorf("audit: index the audit file's last events: %w", err)
		}
	}
	s := &Indexed{file: file, index: index, opts: o, room: make(chan struct{}, o.MaxBehind),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	// Set before the first Write: appendBatch reads it under the file's
	// queue, after this.
	file.durable = s.took
	go s.loop()
	return s, bad, nil
}

// Write writes e to the file (durable when it returns nil) and queues it
// for the index.
func (s *Indexed) Write(ctx context.Context, e Event) error {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return ErrClosed
	}
	select {
	case s.room <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("audit: write: the audit store is %d events behind the audit file: %w", s.opts.MaxBehind, ctx.Err())
	}
	if err := s.file.Write(ctx, e); err != nil {
		<-s.room
		return err
	}
	return nil
}

// took queues a batch the file took, in file order (FileSink.durable).
func (s *Indexed) took(events []Event) {
	s.mu.Lock()
	s.waiting = append(s.waiting, events...)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Indexed) loop() {
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
		_ = s.Flush(context.Background())
		if s.opts.Gather > 0 {
			select {
			case <-s.stop:
				return
			case <-time.After(s.opts.Gather):
			}
		}
	}
}

// Flush adds every event waiting to the index, in one transaction, and
// returns its failure (the events then wait for the next try).
func (s *Indexed) Flush(ctx context.Context) error {
	s.adding.Lock()
	defer s.adding.Unlock()
	s.mu.Lock()
	batch := s.waiting[:len(s.waiting):len(s.waiting)]
	s.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, s.opts.IndexTimeout)
	err := Recovered(func() error { return s.index.AddMissing(actx, batch) })
	cancel()
	s.mu.Lock()
	if err != nil {
		s.failed = err
		s.mu.Unlock()
		return err
	}
	s.waiting = append([]Event(nil), s.waiting[len(batch):]...)
	if len(s.waiting) == 0 {
		s.failed = nil
	}
	s.mu.Unlock()
	for range batch {
		<-s.room
	}
	return nil
}

// Waiting is the number of events in the file and not yet in the index.
func (s *Indexed) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// Check reports the file's Check, else the index's failure while events
// wait for it, else the index's own Check.
func (s *Indexed) Check(ctx context.Context) error {
	if err := s.file.Check(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	failed, n := s.failed, len(s.waiting)
	s.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("%d audit events wait for the audit store: %w", n, SystemError(failed))
	}
	if c, ok := s.index.(Checker); ok {
		return c.Check(ctx)
	}
	return nil
}

// Close refuses new Writes, waits for those under way, adds what waits to
// the index (one last try), and closes the index and the file. Events
// that could not be added stay in the file, and OpenIndexed adds them.
func (s *Indexed) Close() error {
	s.closeOnce.Do(func() {
		s.life.Lock()
		s.closed = true
		s.life.Unlock()
		close(s.stop)
		<-s.done
		err := s.Flush(context.Background())
		s.closeErr = errors.Join(err, s.index.Close(), s.file.Close())
	})
	return s.closeErr
}
