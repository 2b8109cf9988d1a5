// Package audittest provides audit sinks for tests: a Recorder that keeps
// the events it is given, and a FailingSink that refuses every write; and
// valid events to write to a sink under test (Event, AcquireEvent,
// DenyEvent, RevokeEvent).
package audittest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/starintel/starlease/audit"
)

// ErrSinkFailed is FailingSink's default error.
var ErrSinkFailed = errors.New("audittest: audit sink failure")

// FailingSink fails every Write (with Err, or ErrSinkFailed when Err is nil)
// and counts the calls. Safe for concurrent use; the zero value is ready.
type FailingSink struct {
	Err    error
	calls  atomic.Int64
	closed atomic.Bool
}

// Write counts the call and fails.
func (s *FailingSink) Write(ctx context.Context, e audit.Event) error {
	s.calls.Add(1)
	if s.Err != nil {
		return s.Err
	}
	return ErrSinkFailed
}

// Calls returns how many times Write was called.
func (s *FailingSink) Calls() int { return int(s.calls.Load()) }

// Close marks the sink closed.
func (s *FailingSink) Close() error { s.closed.Store(true); return nil }

// Closed reports whether Close was called.
func (s *FailingSink) Closed() bool { return s.closed.Load() }

// Recorder keeps every event written to it in memory, in order. Like the
// real sinks it validates each event and refuses an invalid one, so tests
// catch events a real sink would refuse. Safe for concurrent use; the zero
// value is ready.
type Recorder struct {
	mu     sync.Mutex
	events []audit.Event
	closed bool
}

// Write validates and records e.
func (r *Recorder) Write(ctx context.Context, e audit.Event) error {
	if err := e.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return audit.ErrClosed
	}
	if e.FencingToken != nil {
		t := *e.FencingToken
		e.FencingToken = &t
	}
	r.events = append(r.events, e)
	return nil
}

// Close marks the recorder closed; its events stay readable.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

// Events returns a copy of the recorded events, in write order.
func (r *Recorder) Events() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.events...)
}

// OfType returns the recorded events of type t, in write order.
func (r *Recorder) OfType(t audit.EventType) []audit.Event {
	var out []audit.Event
	for _, e := range r.Events() {
		if e.EventType == t {
			out = append(out, e)
		}
	}
	return out
}

// Len returns the number of recorded events.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// Reset forgets every recorded event.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = nil
}

var (
	_ audit.Sink = (*FailingSink)(nil)
	_ audit.Sink = (*Recorder)(nil)
)
