package bolt

import (
	"errors"
	"fmt"
	"sync"

	bbolt "go.etcd.io/bbolt"
)

// groupCommit runs concurrent write functions in shared transactions, one
// commit (and its fsyncs) for all of them, with no timer: whoever finds no
// commit in progress commits what is queued at once, and keeps committing
// what queued up meanwhile until the queue is empty. A caller alone pays
// exactly one transaction; callers arriving during a commit share the next.
//
// bbolt's own Batch waits a fixed delay before committing, so every batch
// of a steady workload idles for it, and a batch formed while the previous
// commit runs holds only the callers that arrived in the delay.
type groupCommit struct {
	db *bbolt.DB
	// max bounds the calls in one transaction, so one commit's pages and
	// every caller's latency stay bounded under a flood.
	max int

	// rolledBack, if set, is called by the committer after a transaction
	// that did not commit, while no other write transaction runs (the
	// store forgets the time the transaction registered; see readTx).
	rolledBack func()

	mu      sync.Mutex
	queue   []*groupCall
	running bool
}

type groupCall struct {
	fn   func(*bbolt.Tx) error
	err  error
	done chan struct{}
}

// errPanicked replaces a panic of a write function, which must not take
// down the goroutine committing for others.
var errPanicked = errors.New("write function panicked")

// errCommitPanicked replaces a panic of the commit itself (bbolt asserts
// on a corrupt page): every call of the transaction gets it, and the
// group goes on, instead of leaving the calls unanswered and every later
// write queued forever behind a committer that is gone.
var errCommitPanicked = errors.New("commit panicked")

// update runs fn in a write transaction shared with concurrent callers.
// fn may run more than once (a transaction it shared failed because of
// another function) and must set its outputs afresh each time. A function
// that fails is retried alone, so its error is its own.
func (g *groupCommit) update(fn func(*bbolt.Tx) error) error {
	c := &groupCall{fn: fn, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if g.running {
		g.mu.Unlock()
		<-c.done
		return c.err
	}
	g.running = true
	g.mu.Unlock()
	g.commitQueued()
	<-c.done
	return c.err
}

// commitQueued commits one batch of the queue (the caller's own call is
// in it: a caller that finds no commit in progress finds the queue empty),
// then hands what queued meanwhile to a new goroutine, so a committer is
// answered after its own transaction, not once the load stops.
func (g *groupCommit) commitQueued() {
	g.mu.Lock()
	n := min(len(g.queue), g.max)
	if n == 0 {
		g.running = false
		g.mu.Unlock()
		return
	}
	batch := g.queue[:n:n]
	g.queue = g.queue[n:]
	if len(g.queue) == 0 {
		g.queue = nil
	}
	g.mu.Unlock()
	g.commit(batch)
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.running = false
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	go g.commitQueued()
}

// commit runs batch in one transaction. When a function fails, the
// transaction rolls back, that function runs alone in a transaction of
// its own (its result is its own error), and the rest are tried again.
func (g *groupCommit) commit(batch []*groupCall) {
	for len(batch) > 0 {
		failed := -1
		err := g.run(func(tx *bbolt.Tx) error {
			for i, c := range batch {
				if err := safely(c.fn, tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			// Committed, or the commit itself failed: the outcome is the
			// same for every function of the batch.
			for _, c := range batch {
				c.err = err
				close(c.done)
			}
			return
		}
		c := batch[failed]
		c.err = g.run(func(tx *bbolt.Tx) error { return safely(c.fn, tx) })
		close(c.done)
		batch = append(batch[:failed:failed], batch[failed+1:]...)
	}
}

// run is db.Update that turns a panic of the commit into an error, and
// reports a transaction that did not commit.
func (g *groupCommit) run(fn func(*bbolt.Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errCommitPanicked, p)
		}
		if err != nil && g.rolledBack != nil {
			g.rolledBack()
		}
	}()
	return g.db.Update(fn)
}

func safely(fn func(*bbolt.Tx) error, tx *bbolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errPanicked, p)
		}
	}()
	return fn(tx)
}
