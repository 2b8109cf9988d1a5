package bolt

import (
	"errors"
	"fmt"
	"sync"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/groupcommit"
	"github.com/starintel/starlease/internal/layered"
)

// groupCommit runs concurrent write functions in shared transactions, one
// commit (and its fsyncs) for all of them, batched by groupcommit.Queue
// with no timer: a caller alone pays exactly one transaction; callers
// arriving during a commit share the next.
//
// bbolt's own Batch waits a fixed delay before committing, so every batch
// of a steady workload idles for it, and a batch formed while the previous
// commit runs holds only the callers that arrived in the delay.
type groupCommit struct {
	db *bbolt.DB
	// engine, if set, takes each batch (the store's redo log and later
	// flush); otherwise a batch commits its own transaction.
	engine *engine

	// commitHook, if set, runs in each transaction once the batch's
	// writes are in the tree, before the commit: tests stand in there for
	// bbolt's own panics while it spills pages.
	commitHook func(*bbolt.Tx)

	// fills are applied at the start of each transaction.
	fills []bucketFill

	// queue batches the calls; its Max bounds the calls of one
	// transaction, so one commit's pages and every caller's latency stay
	// bounded under a flood.
	queue groupcommit.Queue[*groupCall]
	// soloMu serializes alone's batches.
	soloMu sync.Mutex
}

type groupCall struct {
	fn   func(*layered.View) error
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

// update runs fn once, in a write transaction shared with concurrent
// callers. A function that fails leaves no write: its writes are rolled
// back alone, so its error is its own and the others' writes stay.
func (g *groupCommit) update(fn func(*layered.View) error) error {
	c := &groupCall{fn: fn, done: make(chan struct{})}
	g.queue.Submit(c, g.commit)
	<-c.done
	return c.err
}

// commit runs batch in one transaction: each function writes to a layer
// over the transaction, and one that fails is rolled back to where it
// began; the layer then goes to the tree and commits. A commit that fails
// fails every function that succeeded. A batch that wrote nothing (every
// function failed) rolls back: there is nothing to make durable.
func (g *groupCommit) commit(batch []*groupCall) {
	if g.engine != nil {
		g.engine.run(batch)
		return
	}
	err := g.run(func(tx *bbolt.Tx) error {
		err := direct(tx, func(w *layered.View) error {
			runEach(w, batch)
			if len(w.Changes()) == 0 {
				return errNoWrites
			}
			return nil
		})
		if err == nil && g.commitHook != nil {
			g.commitHook(tx)
		}
		return err
	})
	if errors.Is(err, errNoWrites) {
		err = nil
	}
	answer(batch, err)
}

// runEach runs each function of batch on w; one that fails is rolled
// back to where it began, alone, and keeps its error.
func runEach(w *layered.View, batch []*groupCall) {
	for _, c := range batch {
		m := w.Mark()
		if c.err = safely(c.fn, w); c.err != nil {
			w.Rollback(m)
		}
	}
}

// answer closes every call of batch; a call that succeeded gets err.
func answer(batch []*groupCall, err error) {
	for _, c := range batch {
		if c.err == nil {
			c.err = err
		}
		close(c.done)
	}
}

// errNoWrites rolls back the transaction of a batch that wrote nothing.
var errNoWrites = errors.New("the batch wrote nothing")

// alone runs fn as a batch of its own, one at a time (benchmarks measure
// what the group commit buys).
func (g *groupCommit) alone(fn func(*layered.View) error) error {
	g.soloMu.Lock()
	defer g.soloMu.Unlock()
	c := &groupCall{fn: fn, done: make(chan struct{})}
	g.commit([]*groupCall{c})
	<-c.done // the engine answers once the batch's record is durable
	return c.err
}

// run is db.Update that turns a panic of the commit into an error.
func (g *groupCommit) run(fn func(*bbolt.Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errCommitPanicked, p)
		}
	}()
	return g.db.Update(func(tx *bbolt.Tx) error {
		setFills(tx, g.fills)
		return fn(tx)
	})
}

func safely(fn func(*layered.View) error, tx *layered.View) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errPanicked, p)
		}
	}()
	return fn(tx)
}
