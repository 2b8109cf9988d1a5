package audit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// LimiterOptions configures a Limiter.
type LimiterOptions struct {
	// Rate is how many droppable events per second each budget writes
	// individually, on average. Zero means 50.
	Rate float64
	// Burst is how many droppable events each budget may write at once
	// after a quiet period. Zero means 200.
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
// written while their budget's token bucket (Rate, Burst) has tokens;
// beyond that they are only counted, and each budget's count is written
// periodically as one audit_dropped event whose reason names the budget.
// High-priority events and allowed successful events always go through to
// the next sink.
//
// There are two budgets: events of requests that never authenticated (no
// principal: bad keys, an unavailable credential store) and events of
// authenticated principals. Anyone can send bad keys, so a flood of them
// only aggregates its own kind and never an authenticated caller's
// denials; the storage bound is twice Rate. Within a budget the bucket is
// shared: one principal's flood aggregates other principals' denials for a
// while, which the aggregate records.
type Limiter struct {
	next Sink
	opts LimiterOptions

	mu      sync.Mutex
	budgets [2]budget // by budgetOf
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
	l := &Limiter{next: next, opts: o, stop: make(chan struct{}), done: make(chan struct{})}
	for i := range l.budgets {
		l.budgets[i] = budget{tokens: float64(o.Burst), last: o.Now()}
	}
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

// Write passes e to the next sink, unless e is droppable and its budget
// is exhausted: then it is counted and Write returns nil.
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
		if b := &l.budgets[budgetOf(&e)]; !b.take(l.opts) {
			b.dropped++
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
	}
	return l.next.Write(ctx, e)
}

// budget is one token bucket and its count of dropped events.
type budget struct {
	tokens  float64
	last    time.Time
	dropped int64
}

// The budgets, indexes of Limiter.budgets.
const (
	budgetAuthenticated = iota
	budgetUnauthenticated
)

// budgetOf is the budget of a droppable event: unauthenticated when no
// principal was established.
func budgetOf(e *Event) int {
	if e.PrincipalID == "" {
		return budgetUnauthenticated
	}
	return budgetAuthenticated
}

// droppedReasons name each budget in its audit_dropped events.
var droppedReasons = [2]string{budgetAuthenticated: DroppedAuthenticated, budgetUnauthenticated: DroppedUnauthenticated}

// take refills the bucket and takes one token; the Limiter's mu is held.
func (b *budget) take(o LimiterOptions) bool {
	now := o.Now()
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(float64(o.Burst), b.tokens+d.Seconds()*o.Rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Dropped returns the count of dropped events, of both budgets, not yet
// written as audit_dropped events.
func (l *Limiter) Dropped() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.budgets[0].dropped + l.budgets[1].dropped
}

// Flush writes each budget's pending dropped count, if any, as one
// audit_dropped event naming the budget. On failure a count is kept for
// the next flush.
func (l *Limiter) Flush(ctx context.Context) error {
	var errs []error
	for i := range l.budgets {
		l.mu.Lock()
		n := l.budgets[i].dropped
		l.budgets[i].dropped = 0
		l.mu.Unlock()
		if n == 0 {
			continue
		}
		if err := l.next.Write(ctx, dropped(l.opts.Now(), n, droppedReasons[i])); err != nil {
			l.mu.Lock()
			l.budgets[i].dropped += n
			l.mu.Unlock()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Check checks the next sink.
func (l *Limiter) Check(ctx context.Context) error { return Check(ctx, l.next) }

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
