package audit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// LimiterOptions configures a Limiter.
type LimiterOptions struct {
	// Rate is how many droppable events per second are written
	// individually, on average. Zero means 50.
	Rate float64
	// Burst is how many droppable events may be written at once after a
	// quiet period. Zero means 200.
	Burst int
	// FlushInterval is how often the count of dropped events is written as
	// one audit_dropped event. Zero means 10 s; negative disables the
	// background flush (Flush and Close still write it).
	FlushInterval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Limiter is a Sink that bounds audit volume under failure floods. An event
// is droppable when it is normal priority and not a success: its decision
// is deny or its result code is not a success code. Droppable events are
// written while a token bucket (Rate, Burst) has tokens; beyond that they
// are only counted, and the count is written periodically as one
// audit_dropped event. High-priority events and allowed successful events
// always go through to the next sink.
//
// The bucket is global: a flood from one caller also aggregates other
// callers' denials for a while. That is the bound that keeps storage safe;
// the aggregate records that it happened, and successful and high-priority
// events are unaffected.
type Limiter struct {
	next Sink
	opts LimiterOptions

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int64
	closed  bool

	stop chan struct{}
	done chan struct{}
}

// NewLimiter wraps next. Close closes next too.
func NewLimiter(next Sink, o LimiterOptions) *Limiter {
	if o.Rate <= 0 {
		o.Rate = 50
	}
	if o.Burst <= 0 {
		o.Burst = 200
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	l := &Limiter{next: next, opts: o, tokens: float64(o.Burst), last: o.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	if o.FlushInterval > 0 {
		go l.loop()
	} else {
		close(l.done)
	}
	return l
}

func (l *Limiter) loop() {
	defer close(l.done)
	t := time.NewTicker(l.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), l.opts.FlushInterval)
			_ = l.Flush(ctx) // a failed flush keeps its count for the next one
			cancel()
		}
	}
}

// Droppable reports whether a Limiter may aggregate e instead of writing it.
func Droppable(e *Event) bool {
	return e.Priority != PriorityHigh && e.EventType != EventDropped &&
		(e.Decision != DecisionAllow || e.ResultCode != "" && !e.ResultCode.Success())
}

// Write passes e to the next sink, unless e is droppable and the rate is
// exhausted: then it is counted and Write returns nil.
func (l *Limiter) Write(ctx context.Context, e Event) error {
	if Droppable(&e) {
		if err := e.Validate(); err != nil {
			return err // an invalid event is an error, never a silent drop
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return ErrClosed
		}
		if !l.take() {
			l.dropped++
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
	}
	return l.next.Write(ctx, e)
}

// take refills the bucket and takes one token; l.mu is held.
func (l *Limiter) take() bool {
	now := l.opts.Now()
	if d := now.Sub(l.last); d > 0 {
		l.tokens = min(float64(l.opts.Burst), l.tokens+d.Seconds()*l.opts.Rate)
		l.last = now
	}
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// Check checks the next sink.
func (l *Limiter) Check(ctx context.Context) error { return Check(ctx, l.next) }

// Dropped returns the count of dropped events not yet written as an
// audit_dropped event.
func (l *Limiter) Dropped() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// Flush writes the pending dropped count, if any, as one audit_dropped
// event. On failure the count is kept for the next flush.
func (l *Limiter) Flush(ctx context.Context) error {
	l.mu.Lock()
	n := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	if n == 0 {
		return nil
	}
	if err := l.next.Write(ctx, dropped(l.opts.Now(), n)); err != nil {
		l.mu.Lock()
		l.dropped += n
		l.mu.Unlock()
		return err
	}
	return nil
}

// Close stops the background flush, writes the pending count and closes the
// next sink.
func (l *Limiter) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(l.Flush(ctx), l.next.Close())
}
