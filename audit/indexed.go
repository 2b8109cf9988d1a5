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
	// AddMissing stores durably, in one transaction, the event of each of
	// lines (audit file lines without their newline) whose event id it
	// does not hold yet, and nothing if it fails. It returns how many it
	// added, and how many lines it skipped: those that do not decode
	// strictly (Unmarshal).
	AddMissing(ctx context.Context, lines [][]byte) (added, skipped int, err error)
	// Holds reports whether it holds the event of every line of lines
	// that decodes strictly.
	Holds(ctx context.Context, lines [][]byte) (bool, error)
	Close() error
}

// IndexedOptions configures an Indexed sink.
type IndexedOptions struct {
	// MaxBehind bounds the events the file took that wait in memory for
	// the index; more are counted as overflow and read back from the file
	// once the index takes events again. Zero means DefaultMaxBehind.
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
	// OnBehind, if set, is called when catching up read back
	// MaxRuns×2×MaxBehind lines and the index lacked events in each run:
	// events before those lines may stay missing from it.
	OnBehind func(lines int)
	// MaxRuns bounds the runs of 2×MaxBehind lines catching up reads
	// back. Zero means DefaultMaxRuns.
	MaxRuns int
}

// Defaults of IndexedOptions.
const (
	DefaultMaxBehind = 4096
	DefaultGather    = 50 * time.Millisecond
	DefaultMaxRuns   = 256
)

// ErrIndexBehind marks Indexed.Check's report of a failing index: events
// are durable in the audit file and wait for the index.
var ErrIndexBehind = errors.New("the audit store is behind the audit file")

// Indexed is the audit sink of a server whose audit store is local (the
// bolt backend): an event is durable once the audit file holds it
// (FileSink: fsynced) and Write returns then; the index gets the file's
// line after, with every line written meanwhile in one transaction. A
// request then waits for the file's fsync alone, not also for the index's
// commit after it (two more fsyncs). The index never holds up a Write: a
// failing index only makes events wait, and Check report it.
//
// The index holds a prefix of the file's lines: it takes them in file
// order, so those it lacks are the file's last lines. At most MaxBehind
// wait in memory; lines the file takes while that many wait (overflow: the
// index failing, or slower than the writes, for a while) are only
// counted, and read back from the file. Catching up (at OpenIndexed, after
// a crash; and after an overflow) reads the file backwards in runs of
// 2×MaxBehind lines until a run the index holds entirely (the lines of a
// file batch whose fsync failed, at most MaxBehind, may sit among them),
// then adds the runs oldest first, so a failure half way leaves a prefix
// again. It reads back at most MaxRuns runs (OnBehind reports reaching
// that). The index then lacks only lines not yet indexed when the file was
// rotated away (copied and truncated, or renamed) before a crash. The file
// holds every event regardless.
type Indexed struct {
	file  *FileSink
	index Index
	opts  IndexedOptions

	life   sync.RWMutex // Write holds it for reading; Close waits for Writes
	closed bool

	mu       sync.Mutex
	waiting  [][]byte // lines the file took, not yet in the index, in file order
	overflow int      // lines the file took while MaxBehind waited
	failed   error    // the index's last failure, while lines wait

	adding sync.Mutex // one AddMissing at a time, so the index gets file order

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// OpenIndexed returns file's events indexed by index. First it catches
// up: it adds what the index lacks at the end of the file (what a crash
// left unindexed). If that is more than startupRuns runs, or the index
// cannot take it now, the sink starts with the catch-up pending (done in
// the background; Check reports a failure), so a server with a wiped
// audit store and a long audit file starts at once. It returns how many
// lines the catch-up added do not decode (skipped: the file is the record,
// the index a copy). Closing the sink closes file and index.
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
	if o.MaxRuns <= 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	s := &Indexed{file: file, index: index, opts: o,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	skipped, pending, err := s.catchUp(ctx, min(startupRuns, o.MaxRuns), startupRuns < o.MaxRuns)
	if err != nil {
		if errors.Is(err, errReadBack) {
			return nil, 0, err
		}
		s.failed = err
	}
	if pending || err != nil {
		// The file is fine: start with the catch-up pending.
		s.overflow = 1
		s.kick <- struct{}{}
	}
	// Set before the first Write: appendBatch reads them under the file's
	// queue, after this.
	file.lines.Max = o.MaxBehind
	file.durable = s.took
	go s.loop()
	return s, skipped, nil
}

// Write writes e to the file, durable when it returns nil; the index gets
// it later.
func (s *Indexed) Write(ctx context.Context, e Event) error {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return s.file.Write(ctx, e)
}

// took queues the lines of a batch the file took, in file order
// (FileSink.durable).
func (s *Indexed) took(lines [][]byte) {
	s.mu.Lock()
	keep := min(max(s.opts.MaxBehind-len(s.waiting), 0), len(lines))
	s.waiting = append(s.waiting, lines[:keep]...)
	s.overflow += len(lines) - keep
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
		pause := s.opts.Gather
		if s.Flush(context.Background()) != nil {
			// A failing index is tried again every RetryInterval, not at
			// every batch the file takes meanwhile.
			pause = s.opts.RetryInterval
		}
		if pause > 0 {
			select {
			case <-s.stop:
				return
			case <-time.After(pause):
			}
		}
	}
}

// add is AddMissing within IndexTimeout, a panic of the index an error.
func (s *Indexed) add(ctx context.Context, lines [][]byte) (added, skipped int, err error) {
	actx, cancel := context.WithTimeout(ctx, s.opts.IndexTimeout)
	defer cancel()
	err = Recovered(func() error {
		added, skipped, err = s.index.AddMissing(actx, lines)
		return err
	})
	return added, skipped, err
}

// Flush adds every line waiting to the index, in one transaction, or,
// after an overflow, catches up from the file; it returns the index's
// failure (the lines then wait for the next try).
func (s *Indexed) Flush(ctx context.Context) error {
	s.adding.Lock()
	defer s.adding.Unlock()
	s.mu.Lock()
	batch := s.waiting[:len(s.waiting):len(s.waiting)]
	over := s.overflow
	s.mu.Unlock()
	switch {
	case over > 0:
		// The waiting lines are in the file too (took runs after the
		// append): catching up covers them, in file order.
		if _, _, err := s.catchUp(ctx, s.opts.MaxRuns, false); err != nil {
			return s.fail(err)
		}
	case len(batch) > 0:
		if _, _, err := s.add(ctx, batch); err != nil {
			return s.fail(err)
		}
	}
	s.mu.Lock()
	s.waiting = append([][]byte(nil), s.waiting[len(batch):]...)
	s.overflow -= over
	if len(s.waiting) == 0 && s.overflow == 0 {
		s.failed = nil
	}
	s.mu.Unlock()
	return nil
}

// errReadBack marks a failure to read the audit file back.
var errReadBack = errors.New("audit: read the audit file back")

// run is a run of lines catching up reads back: the offsets of its
// first line and of its end.
type run struct{ start, end int64 }

// startupRuns bounds the runs OpenIndexed reads back before it starts;
// more are caught up in the background.
const startupRuns = 16

// catchUp adds what the index lacks at the end of the file, oldest
// first: it reads runs of 2×MaxBehind lines backwards until one the index
// holds entirely, the file's start, or maxRuns runs, then adds them
// forwards, each in one transaction, so the index holds a prefix of the
// file again even if one fails. If maxRuns runs were read and
// deferCapped, it adds nothing and reports the catch-up pending. It
// returns the lines it added that do not decode.
func (s *Indexed) catchUp(ctx context.Context, maxRuns int, deferCapped bool) (skipped int, pending bool, err error) {
	n := 2 * s.opts.MaxBehind
	var runs []run
	reached := false // a run the index holds, or the file's start
	for end := int64(-1); len(runs) < maxRuns; {
		lines, start, err := s.file.linesBefore(end, n)
		if err != nil {
			return 0, false, fmt.Errorf("%w: %w", errReadBack, err)
		}
		if len(lines) == 0 {
			reached = true
			break
		}
		if end < 0 {
			end = start
			for _, l := range lines {
				end += int64(len(l) + 1)
			}
		}
		held, err := s.holds(ctx, lines)
		if err != nil {
			return 0, false, err
		}
		if held {
			reached = true
			break
		}
		runs = append(runs, run{start, end})
		if start == 0 {
			reached = true
			break
		}
		end = start
	}
	if !reached {
		if deferCapped {
			return 0, true, nil
		}
		if s.opts.OnBehind != nil {
			s.opts.OnBehind(maxRuns * n)
		}
	}
	for i := len(runs) - 1; i >= 0; i-- {
		lines, _, err := s.file.linesBefore(runs[i].end, n)
		if err != nil {
			return skipped, false, fmt.Errorf("%w: %w", errReadBack, err)
		}
		_, bad, err := s.add(ctx, lines)
		if err != nil {
			return skipped, false, err
		}
		skipped += bad
	}
	return skipped, false, nil
}

// holds is Holds within IndexTimeout, a panic of the index an error.
func (s *Indexed) holds(ctx context.Context, lines [][]byte) (held bool, err error) {
	actx, cancel := context.WithTimeout(ctx, s.opts.IndexTimeout)
	defer cancel()
	err = Recovered(func() error {
		held, err = s.index.Holds(actx, lines)
		return err
	})
	return held, err
}

func (s *Indexed) fail(err error) error {
	s.mu.Lock()
	s.failed = err
	s.mu.Unlock()
	return err
}

// Waiting is the number of lines the file took that the index does not
// hold yet (waiting in memory, and overflow).
func (s *Indexed) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting) + s.overflow
}

// Check reports the file's Check (durable audit unavailable), else the
// index's failure while lines wait for it (ErrIndexBehind: the events are
// durable in the file), else the index's own Check.
func (s *Indexed) Check(ctx context.Context) error {
	if err := s.file.Check(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	failed, n := s.failed, len(s.waiting)+s.overflow
	s.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("%w: %d events wait: %w", ErrIndexBehind, n, SystemError(failed))
	}
	if c, ok := s.index.(Checker); ok {
		if err := c.Check(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrIndexBehind, err)
		}
	}
	return nil
}

// Close refuses new Writes, waits for those under way (each bounded by
// the file's fsync), adds what waits to the index (one last try), and
// closes the index and the file. Lines it could not add stay in the file,
// and OpenIndexed adds them.
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
