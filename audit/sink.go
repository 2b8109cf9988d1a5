package audit

import (
	"context"
	"errors"
	"os"
	"sync"
)

// Sink receives audit events. Implementations are safe for concurrent use.
//
// Write returns nil only once the event is durable: a high-priority event
// (force-release, revoke) that Write accepted survives a crash, and the
// service reports such an operation's success only after Write returned
// nil. A Write error means the event may not have been recorded; the caller
// must not report a high-priority operation as successful.
type Sink interface {
	Write(ctx context.Context, e Event) error
	Close() error
}

// Checker is a Sink that can tell whether it can write durably now. Check
// returns nil when it can, else why not, in words safe to show operators
// (no paths or values): /readyz reports it. A sink that recovers from a
// fault by itself may use Check to try (see FileSink.Check).
type Checker interface {
	Check(ctx context.Context) error
}

// Check is s.Check if s is a Checker, else nil.
func Check(ctx context.Context, s Sink) error {
	if c, ok := s.(Checker); ok {
		return c.Check(ctx)
	}
	return nil
}

// ErrClosed is returned by Write on a closed sink.
var ErrClosed = errors.New("audit: sink is closed")

// CheckRoom reports whether one more event fits in the directory dir: it
// writes and fsyncs a scratch file of one maximal event (MaxEventBytes+1
// bytes) there, then removes it. A sink's Check uses it after a failed
// write to tell whether the fault (a full disk) has cleared, without
// writing an event.
func CheckRoom(dir string) error {
	f, err := os.CreateTemp(dir, ".audit-probe-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(make([]byte, MaxEventBytes+1))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// SystemError is the system error inside err (an *os.PathError's Err),
// without the path, else err itself. The reasons a sink's Check returns
// are shown by /readyz, so they name no path.
func SystemError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Multi returns a sink that writes every event to each of sinks, at the
// same time (each write waits on its own fsync; in turn they would add up),
// and fails if any of them fails (it still tries them all). A sink that
// panics fails its write (ErrSinkPanicked) instead of taking the process
// down from the goroutine its write runs in. Close closes them all.
func Multi(sinks ...Sink) Sink {
	return multi(append([]Sink(nil), sinks...))
}

type multi []Sink

func (m multi) Write(ctx context.Context, e Event) error {
	errs := make([]error, len(m))
	var wg sync.WaitGroup
	for i, s := range m[min(1, len(m)):] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Until Write returns: a sink that ends this goroutine
			// (runtime.Goexit) did not write.
			errs[i+1] = ErrSinkPanicked
			errs[i+1] = Recovered(func() error { return s.Write(ctx, e) })
		}()
	}
	if len(m) > 0 {
		errs[0] = Recovered(func() error { return m[0].Write(ctx, e) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ErrSinkPanicked is the error of a sink write that panicked. The panic's
// value is not kept: it could quote the event.
var ErrSinkPanicked = errors.New("audit: sink panicked")

// Recovered runs fn, one sink's write, and returns its error, or
// ErrSinkPanicked if it panicked. Only code whose locks and state survive a
// panic (deferred unlocks, state marked for repair) may be called through
// it; anything else must recover inside, where it knows what to repair.
func Recovered(fn func() error) (err error) {
	defer func() {
		if recover() != nil {
			err = ErrSinkPanicked
		}
	}()
	return fn()
}

// Check checks every sink.
func (m multi) Check(ctx context.Context) error {
	var errs []error
	for _, s := range m {
		if err := Check(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m multi) Close() error {
	var errs []error
	for _, s := range m {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var (
	_ Checker = (*Spool)(nil)
	_ Sink    = (*Spool)(nil)
	_ Checker = (*FileSink)(nil)
	_ Checker = (*Limiter)(nil)
	_ Checker = multi(nil)
	_ Sink    = (*FileSink)(nil)
	_ Sink    = (*Limiter)(nil)
	_ Sink    = multi(nil)
)
