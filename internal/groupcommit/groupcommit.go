// Package groupcommit runs concurrent submissions in batches with no
// timer: whoever finds no batch running runs what is queued at once, and
// what queues meanwhile goes to the next batch. The lease store's bbolt
// transactions and the audit file's appends share their fsync this way.
package groupcommit

import "sync"

// Queue batches items. The zero value is a queue without a bound.
type Queue[T any] struct {
	// Max bounds a batch, so one batch's work and every caller's wait stay
	// bounded under a flood; zero means no bound.
	Max int

	mu      sync.Mutex
	queue   []T
	running bool
}

// Submit queues item for run, which runs one batch and must give every
// item its outcome (the submitter waits for it by its own means, a channel
// in T); every Submit of a queue passes the same run. A caller that finds
// no batch running runs one batch itself (its own item is in it), then
// hands what queued meanwhile to a new goroutine, so it returns after its
// own batch, not once the load stops. Otherwise Submit returns at once: a
// running batch's successor takes the item.
func (q *Queue[T]) Submit(item T, run func(batch []T)) {
	q.mu.Lock()
	q.queue = append(q.queue, item)
	if q.running {
		q.mu.Unlock()
		return
	}
	q.running = true
	q.mu.Unlock()
	q.runQueued(run)
}

// Queued is how many items wait for a batch (tests use it to line
// callers up behind a running batch).
func (q *Queue[T]) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

func (q *Queue[T]) runQueued(run func([]T)) {
	q.mu.Lock()
	n := len(q.queue)
	if q.Max > 0 {
		n = min(n, q.Max)
	}
	if n == 0 {
		q.running = false
		q.mu.Unlock()
		return
	}
	batch := q.queue[:n:n]
	q.queue = q.queue[n:]
	if len(q.queue) == 0 {
		q.queue = nil
	}
	q.mu.Unlock()
	// Deferred, so a run that panics or ends its goroutine still hands
	// the queue on, instead of leaving it marked running with no runner
	// and every later item waiting forever.
	defer q.handOn(run)
	run(batch)
}

// handOn lets a new goroutine run what queued during a batch, or marks the
// queue idle.
func (q *Queue[T]) handOn(run func([]T)) {
	q.mu.Lock()
	if len(q.queue) == 0 {
		q.running = false
		q.mu.Unlock()
		return
	}
	q.mu.Unlock()
	go q.runQueued(run)
}
