package audit

import (
	"context"
	"errors"
	"sort"
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
	// MaxPrincipals bounds how many authenticated principals have a budget
	// of their own at once. Zero means 256. A principal beyond it, while
	// the others' budgets are in use, shares one fallback budget (Rate,
	// Burst) with every other such principal.
	MaxPrincipals int
	// GlobalRate and GlobalBurst bound what all authenticated budgets
	// together write individually (the storage bound). Zero means 8 times
	// Rate and Burst: several principals must flood at once to reach it.
	GlobalRate  float64
	GlobalBurst int
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
// Events of requests that never authenticated (no principal: bad keys, an
// unavailable credential store) have one budget: anyone can send bad keys,
// so a flood of them only aggregates its own kind. Each authenticated
// principal has a budget of its own (up to MaxPrincipals at once; beyond
// that, a shared fallback budget), so one principal's flood cannot fold
// another principal's denials into a count; all authenticated budgets
// together are also capped by a global bucket (GlobalRate, GlobalBurst),
// which bounds storage. Each principal's dropped count is written as its
// own audit_dropped event naming the principal (principal_id), so at most
// MaxPrincipals+2 aggregates are written per flush.
type Limiter struct {
	next Sink
	opts LimiterOptions

	mu         sync.Mutex
	budgets    [2]budget          // the shared ones: authenticated, unauthenticated
	principals map[string]*budget // an authenticated principal's own
	global     budget             // the cap of all authenticated budgets
	closed     bool

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
	if o.MaxPrincipals <= 0 {
		o.MaxPrincipals = 256
	}
	if o.GlobalRate <= 0 {
		o.GlobalRate = 8 * o.Rate
	}
	if o.GlobalBurst <= 0 {
		o.GlobalBurst = 8 * o.Burst
	}
	l := &Limiter{next: next, opts: o, principals: map[string]*budget{},
		stop: make(chan struct{}), done: make(chan struct{})}
	for i := range l.budgets {
		l.budgets[i] = budget{tokens: float64(o.Burst), last: o.Now()}
	}
	l.global = budget{tokens: float64(o.GlobalBurst), last: o.Now()}
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
		b := l.budgetLocked(&e)
		ok := b.take(l.opts.Now(), l.opts.Rate, l.opts.Burst)
		if ok && e.PrincipalID != "" {
			ok = l.global.take(l.opts.Now(), l.opts.GlobalRate, l.opts.GlobalBurst)
		}
		if !ok {
			b.dropped++
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
	}
	return l.next.Write(ctx, e)
}

// budgetLocked is the budget of a droppable event: the unauthenticated one
// without a principal, else the principal's own (made on first use while
// fewer than MaxPrincipals exist), else the shared authenticated one. The
// Limiter's mu is held.
func (l *Limiter) budgetLocked(e *Event) *budget {
	if e.PrincipalID == "" {
		return &l.budgets[budgetUnauthenticated]
	}
	if b, ok := l.principals[e.PrincipalID]; ok {
		return b
	}
	if len(l.principals) >= l.opts.MaxPrincipals {
		return &l.budgets[budgetAuthenticated]
	}
	b := &budget{tokens: float64(l.opts.Burst), last: l.opts.Now()}
	l.principals[e.PrincipalID] = b
	return b
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

// droppedReasons name each budget in its audit_dropped events.
var droppedReasons = [2]string{budgetAuthenticated: DroppedAuthenticated, budgetUnauthenticated: DroppedUnauthenticated}

// refill adds what rate earned since the last refill, capped at burst.
func (b *budget) refill(now time.Time, rate float64, burst int) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(float64(burst), b.tokens+d.Seconds()*rate)
		b.last = now
	}
}

// take refills the bucket and takes one token; the Limiter's mu is held.
func (b *budget) take(now time.Time, rate float64, burst int) bool {
	b.refill(now, rate, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Dropped returns the count of dropped events, of every budget, not yet
// written as audit_dropped events.
func (l *Limiter) Dropped() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.budgets[0].dropped + l.budgets[1].dropped
	for _, b := range l.principals {
		n += b.dropped
	}
	return n
}

// Flush writes each budget's pending dropped count, if any, as one
// audit_dropped event: a principal's own (naming the principal, in
// principal order), the shared authenticated one, the unauthenticated one.
// On failure a count is kept for the next flush. A principal's budget that
// is full again and has nothing pending is forgotten, so the map holds the
// principals in use.
func (l *Limiter) Flush(ctx context.Context) error {
	var errs []error
	type pending struct {
		principal string
		n         int64
	}
	var own []pending
	l.mu.Lock()
	now := l.opts.Now()
	for p, b := range l.principals {
		if b.dropped > 0 {
			own = append(own, pending{p, b.dropped})
			b.dropped = 0
			continue
		}
		if b.refill(now, l.opts.Rate, l.opts.Burst); b.tokens >= float64(l.opts.Burst) {
			delete(l.principals, p)
		}
	}
	l.mu.Unlock()
	sort.Slice(own, func(i, j int) bool { return own[i].principal < own[j].principal })
	for _, p := range own {
		e := dropped(l.opts.Now(), p.n, DroppedAuthenticated)
		e.PrincipalID = p.principal
		if err := l.next.Write(ctx, e); err != nil {
			l.mu.Lock()
			if b, ok := l.principals[p.principal]; ok {
				b.dropped += p.n
			} else {
				l.budgets[budgetAuthenticated].dropped += p.n
			}
			l.mu.Unlock()
			errs = append(errs, err)
		}
	}
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
