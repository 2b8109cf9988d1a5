package bolt

import (
	"errors"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/groupcommit"
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

	// rolledBack, if set, is called by the committer after a transaction
	// that did not commit, while no other write transaction runs (the
	// store forgets the time the transaction registered; see readTx).
	rolledBack func()

	// fills are applied at the start of each transaction.
	fills []bucketFill

	// queue batches the calls; its Max bounds the calls of one
	// transaction, so one commit's pages and every caller's latency stay
	// bounded under a flood.
	queue groupcommit.Queue[*groupCall]
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
	g.queue.Submit(c, g.commit)
	<-c.done
	return c.err
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
	return g.db.Update(func(tx *bbolt.Tx) error {
		setFills(tx, g.fills)
		return fn(tx)
	})
}

func safely(fn func(*bbolt.Tx) error, tx *bbolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errPanicked, p)
		}
	}()
	return fn(tx)
}
