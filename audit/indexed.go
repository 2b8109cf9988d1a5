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
	// strictly (Unmarshal). taken says the lines are the ones this
	// process's file took, exactly Marshal's bytes (the file writes
	// nothing else): they need not be decoded again; lines read back from
	// the file may have been changed on disk, and are.
	AddMissing(ctx context.Context, lines [][]byte, taken bool) (added, skipped int, err error)
	// Holds reports whether it holds the event of every line of lines
	// that decodes, or would not keep it (its retention took it out), so
	// catching up can stop there.
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
	// OnBehind, if set, is called with a number of lines of the audit
	// file the index will not get: overflow lines of a file rotated away
	// before they were read back, or the lines read back when catching up
	// reached MaxRuns runs (events before them may stay missing).
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
// counted, and read back from the file once the lines waiting in memory
// are in. Catching up (after an overflow, and at OpenIndexed after a
// crash) reads the file backwards in runs of 2×MaxBehind lines until a run
// the index holds entirely (the lines of a file batch whose fsync failed,
// at most MaxBehind, may sit among them), then adds the runs oldest first,
// so a failure half way leaves a prefix again. It reads back at most
// MaxRuns runs. A failing index is retried after RetryInterval, doubling
// up to 64 times that while it keeps failing.
//
// The index lacks (and OnBehind reports) overflow lines of a file that was
// rotated away (renamed, or copied and truncated) before they were read
// back, and lines further back than MaxRuns runs; after a crash also lines
// not yet indexed when the file was rotated away. The file holds every
// event regardless.
type Indexed struct {
	file  *FileSink
	index Index
	opts  IndexedOptions

	life   sync.RWMutex // Write holds it for reading; Close waits for Writes
	closed bool

	mu       sync.Mutex
	waiting  [][]byte // lines the file took, not yet in the index, in file order
	overflow int      // lines the file took while MaxBehind waited
	overGen  uint64   // the file's generation the overflow lines are in
	failed   error    // the index's last failure, while lines wait
	failures int      // consecutive failed Flushes, for the retry's backoff

	adding sync.Mutex // one AddMissing at a time, so the index gets file order

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	// halt ends the loop's work under way when Close begins (catching up
	// stops between runs).
	halt       context.Context
	cancelHalt context.CancelFunc
	closeOnce  sync.Once
	closeErr   error
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
	s.halt, s.cancelHalt = context.WithCancel(context.Background())
	gen := file.generation()
	skipped, pending, err := s.catchUp(ctx, min(startupRuns, o.MaxRuns), startupRuns < o.MaxRuns, gen)
	if err != nil {
		if errors.Is(err, errReadBack) {
			s.cancelHalt()
			return nil, 0, err
		}
		s.failed, s.failures = err, 1
	}
	if pending || err != nil {
		// The file is fine: start with the catch-up pending.
		s.overflow, s.overGen = 1, gen
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
func (s *Indexed) took(gen uint64, lines [][]byte) {
	s.mu.Lock()
	lost := 0
	if s.overflow > 0 && gen != s.overGen {
		// The overflow lines are in a file rotated away.
		lost, s.overflow = s.overflow, 0
	}
	// While overflow lines wait to be read back, later lines overflow
	// too: none may reach the index before them.
	keep := 0
	if s.overflow == 0 {
		keep = min(max(s.opts.MaxBehind-len(s.waiting), 0), len(lines))
	}
	s.waiting = append(s.waiting, lines[:keep]...)
	if keep < len(lines) {
		if s.overflow == 0 {
			s.overGen = gen
		}
		s.overflow += len(lines) - keep
	}
	s.mu.Unlock()
	s.behind(lost)
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
		if s.Flush(s.halt) != nil {
			// A failing index is tried again after RetryInterval, not at
			// every batch the file takes meanwhile, and less often while
			// it keeps failing.
			pause = s.retryPause()
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

// retryPause is how long the loop waits after a failed Flush:
// RetryInterval, doubled for each further consecutive failure, at most 64
// times. A Flush called from outside meanwhile (Close's waits for the loop
// to end; a caller of the exported method need not) may have succeeded and
// reset the count: then RetryInterval (the count is never taken below one,
// where the shift would panic).
func (s *Indexed) retryPause() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.RetryInterval << min(max(s.failures-1, 0), 6)
}

// add is AddMissing within IndexTimeout, a panic of the index an error.
func (s *Indexed) add(ctx context.Context, lines [][]byte, taken bool) (added, skipped int, err error) {
	actx, cancel := context.WithTimeout(ctx, s.opts.IndexTimeout)
	defer cancel()
	err = Recovered(func() error {
		added, skipped, err = s.index.AddMissing(actx, lines, taken)
		return err
	})
	return added, skipped, err
}

// Flush adds every line waiting to the index, in one transaction, then,
// after an overflow, catches up from the file; it returns the index's
// failure (the lines then wait for the next try).
func (s *Indexed) Flush(ctx context.Context) error {
	s.adding.Lock()
	defer s.adding.Unlock()
	s.mu.Lock()
	batch := s.waiting[:len(s.waiting):len(s.waiting)]
	over, overGen := s.overflow, s.overGen
	s.mu.Unlock()
	// The waiting lines come before any overflow line in the file: they
	// go first, from memory, wherever the file is now.
	if len(batch) > 0 {
		if _, _, err := s.add(ctx, batch, true); err != nil {
			return s.fail(err)
		}
		s.mu.Lock()
		s.waiting = append([][]byte(nil), s.waiting[len(batch):]...)
		s.mu.Unlock()
	}
	if over > 0 {
		lost := 0
		switch _, _, err := s.catchUp(ctx, s.opts.MaxRuns, false, overGen); {
		case errors.Is(err, errRotated):
			lost = over
		case err != nil:
			return s.fail(err)
		}
		s.mu.Lock()
		if s.overGen == overGen && s.overflow >= over {
			s.overflow -= over
		} else {
			lost = 0 // took found the file rotated and reported them
		}
		s.mu.Unlock()
		s.behind(lost)
	}
	s.mu.Lock()
	s.failures = 0
	if len(s.waiting) == 0 && s.overflow == 0 {
		s.failed = nil
	}
	s.mu.Unlock()
	return nil
}

// behind reports n lines the index will not get (OnBehind).
func (s *Indexed) behind(n int) {
	if n > 0 && s.opts.OnBehind != nil {
		s.opts.OnBehind(n)
	}
}

// errReadBack marks a failure to read the audit file back.
var errReadBack = errors.New("audit: read the audit file back")

// errRotated: the lines to read back are in a file rotated away.
var errRotated = errors.New("audit: the audit file was rotated away")

// run is a run of lines catching up reads back: the offsets of its
// first line and of its end.
type run struct{ start, end int64 }

// closeBudget bounds Close's last try to add what waits.
const closeBudget = time.Second

// startupRuns bounds the runs OpenIndexed reads back before it starts;
// more are caught up in the background.
const startupRuns = 2

// catchUp adds what the index lacks at the end of the file, oldest
// first: it reads runs of 2×MaxBehind lines backwards until one the index
// holds entirely, the file's start, or maxRuns runs, then adds them
// forwards, each in one transaction, so the index holds a prefix of the
// file again even if one fails. If maxRuns runs were read and
// deferCapped, it adds nothing and reports the catch-up pending. The file
// must stay in generation gen (errRotated); it stops between runs when
// ctx ends. It returns the lines it added that do not decode.
func (s *Indexed) catchUp(ctx context.Context, maxRuns int, deferCapped bool, gen uint64) (skipped int, pending bool, err error) {
	n := 2 * s.opts.MaxBehind
	var runs []run
	reached := false // a run the index holds, or the file's start
	for end := int64(-1); len(runs) < maxRuns; {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		lines, start, g, err := s.file.linesBefore(end, n)
		if err != nil {
			return 0, false, fmt.Errorf("%w: %w", errReadBack, err)
		}
		if g != gen {
			return 0, false, errRotated
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
		s.behind(maxRuns * n)
	}
	for i := len(runs) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			return skipped, false, err
		}
		lines, _, g, err := s.file.linesBefore(runs[i].end, n)
		if err != nil {
			return skipped, false, fmt.Errorf("%w: %w", errReadBack, err)
		}
		if g != gen {
			return skipped, false, errRotated
		}
		_, bad, err := s.add(ctx, lines, false)
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
	s.failures++
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
		s.cancelHalt()
		<-s.done
		// One last try, bounded: what it does not add stays in the file
		// for OpenIndexed.
		ctx, cancel := context.WithTimeout(context.Background(), closeBudget)
		err := s.Flush(ctx)
		cancel()
		s.closeErr = errors.Join(err, s.index.Close(), s.file.Close())
	})
	return s.closeErr
}
