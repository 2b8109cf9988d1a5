package bolt

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/internal/redolog"
	"github.com/starintel/starlease/internal/syncdir"
)

// The engine is etcd's backend shape on bbolt: a batch of writes is
// acknowledged once its redo record is durable (one append and one
// fdatasync of a few hundred bytes per write), and the tree takes the
// writes of many batches later in one commit (flush), so a page is
// written once per flush instead of once per batch. Readers and writers
// see the unflushed batches as in-memory layers over the tree.
//
// Redo records are numbered; the flush that applies records up to n
// writes n in the tree (keyRedoApplied) in the same commit, and Open
// redoes every record after the one the tree holds. Each record starts
// with the tree's engine id (keyEngineID, random, written when the tree
// first meets a log), so a log beside another tree (a file swapped or
// restored by hand) fails Open instead of being redone into it.
//
// Ordering, which every reader relies on: a frozen layer leaves the
// engine's list only after the flush that applied it committed, and a
// view takes the list before it begins its tree transaction, so the tree
// a view reads holds nothing newer than its layers (only the same writes
// again, which the layers shadow with the same values).
type engine struct {
	db  *bbolt.DB
	id  []byte
	log *redolog.Log
	// logMu serializes the log's appends (committer) and the changes to
	// its list of segments (the flusher's Obsolete and Forget); the
	// flusher deletes segment files without it.
	logMu sync.Mutex
	// interval is how long batches accumulate before a flush; zero or less
	// flushes every batch before it is answered (tests that read the tree
	// directly).
	interval time.Duration
	fills    []bucketFill
	// maxPending bounds the redo bytes not yet in the tree: past it writes
	// are refused until a flush succeeds (a failing disk must not grow
	// memory without end).
	maxPending int64

	mu       sync.Mutex
	batch    int            // the last batch number given (views' ID)
	top      *layered.Layer // the batches since the last freeze
	topSeq   uint64         // the last redo record top holds
	topBytes int64          // its records' payload bytes
	frozen   []frozenLayer  // newest first, not in the tree yet
	snap     atomic.Pointer[engineSnap]
	// treeMayHold is the last batch the tree may hold: set before a flush
	// commits, so a reader whose snapshot is older than what its tree
	// transaction sees (a flush committed between the two) takes both
	// again.
	treeMayHold atomic.Int64
	// flushHook, if set, runs in each flush's transaction before its
	// commit: tests make flushes fail there.
	flushHook func() error
	// removeHook, if set, runs in each flush before it deletes the redo
	// segments the tree holds (tests).
	removeHook func()
	// closeHook, if set, runs in close once it has found whether the
	// tree holds every write (tests).
	closeHook func()
	// appendHook, if set, runs before each pipelined batch's redo append
	// (complete): tests hold a batch in flight there.
	appendHook func(id int)
	// exMu keeps readers from taking a snapshot and a tree transaction
	// while exclusive writes the tree and publishes its batch.
	exMu    sync.RWMutex
	frozeAt time.Time
	// wantFreeze asks the committer to freeze its top layer at its next
	// batch, for the flusher (sync; the reaper, see askFlush): only the
	// committer writes and freezes top.
	wantFreeze atomic.Bool
	// failed, once set, refuses every later write: an append whose outcome
	// is unknown may be redone at the next Open, so nothing may be written
	// after it in this process.
	failed error
	// prev is the last batch handed to complete (e.mu): its redo record
	// is appended and synced while the next batch runs its functions.
	prev *inflight
	// topMu orders writes to top (a batch's functions) with the rollback
	// of a batch whose append failed; applied, under it, is the last
	// batch whose functions wrote to top.
	topMu   sync.Mutex
	applied int
	// waiting, if set, is how many writes wait for the next batch: with
	// none, a batch appends its record before run returns.
	waiting  func() int
	flushErr error // the last flush's failure, while layers wait
	// treeHolds is the last batch the tree holds, set once a flush or
	// exclusive committed; flushed is closed and replaced at the end of
	// each flush attempt. Both for awaitFlushed (e.mu).
	treeHolds int
	flushed   chan struct{}
	// flushMu runs one flush at a time.
	flushMu   sync.Mutex
	kick      chan struct{}
	stop      chan struct{}
	flusherWG sync.WaitGroup
}

// frozenLayer is a layer no batch writes any more, waiting for a flush.
type frozenLayer struct {
	layer *layered.Layer
	seq   uint64 // the last redo record it holds
	bytes int64  // its records' payload bytes
	batch int    // the last batch it holds
}

// inflight is a batch whose writes are in top and whose redo record is
// being appended and synced (complete), while the next batch runs its
// functions over those writes. It is answered, and shown to readers,
// only once its record is durable; the next batch only after it.
type inflight struct {
	id      int
	batch   []*groupCall
	w       *layered.View // its writer, which can undo its writes in top
	start   layered.Mark
	snap    *layered.Layer // top as its functions left it
	payload []byte
	err     error // its append's failure, set before done closes
	undone  bool  // its writes were rolled back (topMu)
	done    chan struct{}
}

// frozenLayersLocked is front followed by the frozen layers, newest
// first (a new slice). e.mu held.
func (e *engine) frozenLayersLocked(front ...*layered.Layer) []*layered.Layer {
	out := make([]*layered.Layer, 0, len(front)+len(e.frozen))
	out = append(out, front...)
	for _, f := range e.frozen {
		out = append(out, f.layer)
	}
	return out
}

// engineSnap is what a reader sees: the acknowledged layers not yet in
// the tree (newest first) and the number of the last batch they hold.
type engineSnap struct {
	layers []*layered.Layer
	id     int
}

var (
	keyRedoApplied = []byte("redo_applied")
	keyEngineID    = []byte("engine_id")
	// keyRedoLog, while the store is open and after a crash, holds the
	// id of the redo log directory the tree goes with (its file "id");
	// a clean Close deletes it. A tree that holds it is opened only with
	// that log: the same file under another name (a hard link, a copy
	// without its log) would miss acknowledged writes, then redo stale
	// ones over newer.
	keyRedoLog = []byte("redo_log")
	// errEngineFailed is the answer to writes after a redo append failed.
	errEngineFailed = errors.New("an earlier redo log append failed and the log has not recovered")
	// errRedoBacklog refuses writes while too much waits for a flush.
	errRedoBacklog = errors.New("the redo log waits for a flush that keeps failing")
)

// redoSegmentSize is the redo log's segment size; zero is redolog's
// default (tests make it small).
var redoSegmentSize int64

// DefaultFlushInterval is how long acknowledged batches wait in memory
// (and in the redo log) before the tree takes them in one commit.
const DefaultFlushInterval = 100 * time.Millisecond

// defaultMaxPending bounds the redo bytes waiting for a flush.
const defaultMaxPending = 256 << 20

// openEngine redoes the records of the log at dir the tree does not hold
// yet, in one commit, and returns the engine that appends to it.
func openEngine(db *bbolt.DB, dir string, interval time.Duration, fills []bucketFill) (*engine, error) {
	var applied uint64
	var id, wantLog []byte
	if err := db.Update(func(tx *bbolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyRedoApplied); v != nil {
			if len(v) != 8 {
				return fmt.Errorf("%w: the redo mark is malformed", redolog.ErrCorrupt)
			}
			applied = binary.BigEndian.Uint64(v)
		}
		wantLog = bytes.Clone(meta.Get(keyRedoLog))
		switch v := meta.Get(keyEngineID); {
		case v == nil:
			id = make([]byte, 16)
			if _, err := rand.Read(id); err != nil {
				return err
			}
			return meta.Put(keyEngineID, id)
		case len(v) != 16:
			return fmt.Errorf("%w: the engine id is malformed", redolog.ErrCorrupt)
		default:
			id = bytes.Clone(v)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	log, recs, err := redolog.Open(dir, applied+1, redolog.Options{SegmentSize: redoSegmentSize})
	if err != nil {
		return nil, err
	}
	logID, err := logDirID(dir)
	if err != nil {
		log.Close()
		return nil, err
	}
	switch {
	case wantLog != nil && !bytes.Equal(wantLog, logID):
		log.Close()
		return nil, fmt.Errorf("%w: the file was not closed cleanly and the redo log beside it is not its own", redolog.ErrCorrupt)
	case wantLog == nil && len(recs) > 0 && recs[len(recs)-1].Seq > applied:
		log.Close()
		return nil, fmt.Errorf("%w: the file was closed cleanly, but the redo log beside it holds records it has not taken", redolog.ErrCorrupt)
	case wantLog == nil && log.Next() <= applied:
		// A clean file back beside a log it outran elsewhere: nothing in
		// the log is needed, and its numbers are behind the file's.
		log.Close()
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if log, recs, err = redolog.Open(dir, applied+1, redolog.Options{SegmentSize: redoSegmentSize}); err != nil {
			return nil, err
		}
		if logID, err = logDirID(dir); err != nil {
			log.Close()
			return nil, err
		}
	}
	e := &engine{db: db, id: id, log: log, interval: interval, fills: fills, maxPending: defaultMaxPending,
		top: layered.NewLayer(), frozeAt: time.Now(), kick: make(chan struct{}, 1), stop: make(chan struct{}),
		flushed: make(chan struct{})}
	if err := e.redo(applied, recs); err != nil {
		log.Close()
		return nil, err
	}
	// From the first append on, the tree goes with this log until a
	// clean Close.
	if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyRedoLog, logID) }); err != nil {
		log.Close()
		return nil, err
	}
	e.snap.Store(&engineSnap{})
	e.flusherWG.Add(1)
	go e.flusher()
	return e, nil
}

// redo applies the records after applied, in one commit that also
// records the last one applied, then drops the log's older segments.
func (e *engine) redo(applied uint64, recs []redolog.Record) error {
	if e.log.Next() <= applied {
		// The tree holds records the log no longer has: the next append
		// would reuse a number the tree counts as applied.
		return fmt.Errorf("%w: the log ends at %d before the tree's %d", redolog.ErrCorrupt, e.log.Next()-1, applied)
	}
	var todo []redolog.Record
	for _, r := range recs {
		if r.Seq > applied {
			todo = append(todo, r)
		}
	}
	if len(todo) > 0 {
		if todo[0].Seq != applied+1 {
			return fmt.Errorf("%w: the log resumes at %d after the tree's %d", redolog.ErrCorrupt, todo[0].Seq, applied)
		}
		last := todo[len(todo)-1].Seq
		if err := e.db.Update(func(tx *bbolt.Tx) error {
			setFills(tx, e.fills)
			for _, r := range todo {
				if err := e.applyRecord(tx, r.Payload); err != nil {
					return fmt.Errorf("%w: record %d: %v", redolog.ErrCorrupt, r.Seq, err)
				}
			}
			return tx.Bucket(bucketMeta).Put(keyRedoApplied, u64(last))
		}); err != nil {
			return err
		}
		applied = last
	}
	return e.log.Drop(applied + 1)
}

// logDirID reads the id of the redo log directory dir, making one for a
// directory that has none yet (durable before the tree names it).
func logDirID(dir string) ([]byte, error) {
	p := filepath.Join(dir, "id")
	b, err := os.ReadFile(p)
	switch {
	case err == nil && len(b) == 16:
		return b, nil
	case err == nil:
		return nil, fmt.Errorf("%w: the redo log's id is malformed", redolog.ErrCorrupt)
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(id)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = syncdir.Sync(dir)
	}
	if err != nil {
		return nil, err
	}
	return id, nil
}

// run runs batch: each function on a writer over the acknowledged layers
// (one that fails rolled back alone), one redo record of the batch's
// writes, then the batch is published to readers and answered.
//
// With a flush interval, the record is appended and synced by complete,
// in a goroutine of its own when other writes wait, and run returns at
// once, so the next batch
// runs its functions while this one waits for the disk (a pipeline two
// batches deep): the next batch sees this one's writes, appends only
// after this one's record is durable, and fails, its writes undone, if
// this one's append failed. Without an interval everything is done here,
// in order (runInline).
func (e *engine) run(batch []*groupCall) {
	if e.interval <= 0 {
		e.runInline(batch)
		return
	}
	e.recover()
	if e.wantFreeze.Swap(false) || time.Since(e.frozeAt) >= e.interval {
		// Only once every batch in top is durable: a frozen layer goes
		// to the tree, which must never take a write the log may lose.
		e.drain()
		e.mu.Lock()
		if e.freezeLocked() {
			e.kickFlusher()
		}
		e.mu.Unlock()
	}
	id, top, older, refuse := e.begin()
	if refuse != nil {
		e.refuse(id, batch, refuse)
		return
	}
	e.topMu.Lock()
	e.mu.Lock()
	refuse, prev := e.failed, e.prev
	e.mu.Unlock()
	if refuse != nil {
		e.topMu.Unlock()
		e.refuse(id, batch, refuse)
		return
	}
	// Whether this batch runs over the writes of the batch before (still
	// in top: its append is under way or succeeded).
	overPrev := prev != nil && !prev.undone
	cur, err := e.apply(batch, id, top, older)
	if err == nil && cur.payload != nil {
		e.mu.Lock()
		e.prev = cur
		e.mu.Unlock()
	}
	e.topMu.Unlock()
	if err != nil {
		e.refuse(id, batch, err)
		return
	}
	if prev != nil {
		<-prev.done
	}
	if overPrev && prev.err != nil {
		// This batch ran over writes whose record may be lost: undone,
		// newest first, and refused (nothing of it was appended, so its
		// own err stays nil: later batches run over none of its writes).
		e.topMu.Lock()
		if cur.payload != nil {
			cur.w.Rollback(cur.start)
			cur.undone = true
		}
		if !prev.undone {
			prev.w.Rollback(prev.start)
			prev.undone = true
		}
		e.topMu.Unlock()
		e.settle(cur, fmt.Errorf("%w: %v", errEngineFailed, prev.err))
		return
	}
	if cur.payload == nil {
		// Nothing to append; shown in order, after the batch before.
		e.settle(cur, nil)
		return
	}
	if e.waiting != nil && e.waiting() > 0 {
		go e.complete(cur)
		return
	}
	// Nobody waits to run next: no goroutine to hand over to (at one
	// writer that would only add a switch to every write).
	e.complete(cur)
}

// begin numbers the next batch and checks that writes are taken: refuse
// is why not (an append that failed, too much waiting for a flush).
func (e *engine) begin() (id int, top *layered.Layer, older []*layered.Layer, refuse error) {
	e.mu.Lock()
	if e.failed == nil && e.pendingLocked() > e.maxPending {
		// Past the bound: a flush now (the disk may have room again)
		// before refusing.
		e.mu.Unlock()
		_ = e.flush()
		e.mu.Lock()
	}
	refuse = e.failed
	if refuse == nil && e.pendingLocked() > e.maxPending {
		refuse = fmt.Errorf("%w: %v", errRedoBacklog, e.flushErr)
	}
	e.batch++
	id, top, older = e.batch, e.top, e.frozenLayersLocked()
	e.mu.Unlock()
	return id, top, older, refuse
}

// apply runs batch's functions on a writer over top (topMu held): the
// batch as it goes to complete, with its redo payload (nil if it wrote
// nothing).
func (e *engine) apply(batch []*groupCall, id int, top *layered.Layer, older []*layered.Layer) (*inflight, error) {
	tx, err := e.db.Begin(false)
	if err != nil {
		for _, c := range batch {
			c.err = err
		}
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	w := layered.NewWriter(baseOf{tx}, top, older...)
	w.SetID(id)
	start := w.Mark()
	runEach(w, batch)
	cur := &inflight{id: id, batch: batch, w: w, start: start, done: make(chan struct{})}
	if changes := w.Changes(); len(changes) > 0 {
		cur.payload = e.encode(changes)
		e.applied = id
	}
	cur.snap = w.Snapshot()
	return cur, nil
}

// complete appends and syncs cur's redo record, then shows cur to readers
// and answers it. If the append fails, the engine takes no more writes
// until the log recovers, and cur's writes are undone: here, unless the
// next batch has written over them (it undoes both, see run).
func (e *engine) complete(cur *inflight) {
	if e.appendHook != nil {
		e.appendHook(cur.id)
	}
	e.logMu.Lock()
	seq, err := e.log.Append(cur.payload)
	e.logMu.Unlock()
	if err != nil {
		e.topMu.Lock()
		e.mu.Lock()
		e.failed = fmt.Errorf("%w: %v", errEngineFailed, err)
		e.mu.Unlock()
		if e.applied == cur.id {
			cur.w.Rollback(cur.start)
			cur.undone = true
		}
		e.topMu.Unlock()
		cur.err = err
		e.settle(cur, err)
		return
	}
	e.mu.Lock()
	e.topSeq = seq
	e.topBytes += int64(len(cur.payload))
	e.mu.Unlock()
	e.settle(cur, nil)
}

// settle shows cur to readers, its writes if answerErr is nil and else as a
// batch that changed nothing, then answers its calls and marks it done.
func (e *engine) settle(cur *inflight, answerErr error) {
	if answerErr == nil {
		e.mu.Lock()
		e.snap.Store(&engineSnap{layers: e.frozenLayersLocked(cur.snap), id: cur.id})
		e.mu.Unlock()
	} else {
		e.publishNothing(cur.id)
	}
	answer(cur.batch, answerErr)
	close(cur.done)
}

// refuse answers a batch that runs no function (or could not) with err,
// once the batch before it is answered, and shows it as one that changed
// nothing.
func (e *engine) refuse(id int, batch []*groupCall, err error) {
	e.drain()
	e.publishNothing(id)
	answer(batch, err)
}

// drain waits until the last batch handed to complete is answered.
func (e *engine) drain() {
	e.mu.Lock()
	prev := e.prev
	e.mu.Unlock()
	if prev != nil {
		<-prev.done
	}
}

// publishNothing shows readers batch id as a batch that changed nothing:
// the layers they see stay, and reads stop deferring to its time.
func (e *engine) publishNothing(id int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.snap.Load()
	if cur.id < id {
		e.snap.Store(&engineSnap{layers: cur.layers, id: id})
	}
}

// runInline is run without a flush interval: each batch's record is
// appended, the batch published, and the tree flushed, before the next
// batch runs.
func (e *engine) runInline(batch []*groupCall) {
	e.recover()
	id, top, older, refuse := e.begin()
	if refuse != nil {
		e.publish(id, top)
		answer(batch, refuse)
		return
	}
	err := e.write(batch, id, top, older)
	e.publish(id, top)
	if err == nil {
		// Durable in the log already: a flush that fails is retried.
		if e.flush() != nil {
			e.kickFlusher()
		}
	}
	answer(batch, err)
}

// write runs the functions and logs their writes.
func (e *engine) write(batch []*groupCall, id int, top *layered.Layer, older []*layered.Layer) error {
	tx, err := e.db.Begin(false)
	if err != nil {
		for _, c := range batch {
			c.err = err
		}
		return err
	}
	defer func() { _ = tx.Rollback() }()
	w := layered.NewWriter(baseOf{tx}, top, older...)
	w.SetID(id)
	start := w.Mark()
	runEach(w, batch)
	changes := w.Changes()
	if len(changes) == 0 {
		return nil
	}
	payload := e.encode(changes)
	e.logMu.Lock()
	seq, err := e.log.Append(payload)
	e.logMu.Unlock()
	if err != nil {
		// The record may be in the file, and then is redone at the next
		// Open: no later write may be made on the state without it.
		w.Rollback(start)
		e.mu.Lock()
		e.failed = fmt.Errorf("%w: %v", errEngineFailed, err)
		e.mu.Unlock()
		return err
	}
	e.mu.Lock()
	e.topSeq = seq
	e.topBytes += int64(len(payload))
	e.mu.Unlock()
	return nil
}

// publish shows readers top as it is after batch id (also a batch that
// wrote nothing: reads then stop deferring to its time, see readTx), and
// freezes top when a flush is due or asked for.
func (e *engine) publish(id int, top *layered.Layer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.snap.Store(&engineSnap{layers: e.frozenLayersLocked(top.Snapshot()), id: id})
	if e.wantFreeze.Swap(false) || e.interval <= 0 || time.Since(e.frozeAt) >= e.interval {
		if e.freezeLocked() && e.interval > 0 {
			e.kickFlusher()
		}
	}
}

// askFlush asks for a flush of what is acknowledged so far: the next
// batch freezes top and kicks the flusher, which commits on its own
// goroutine. It reports whether it asked: not while flushes fail, as the
// flusher retries at its own pace then, and more frozen layers would only
// make reads and each retry slower.
func (e *engine) askFlush() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.flushErr != nil {
		return false
	}
	e.wantFreeze.Store(true)
	return true
}

// awaitFlushed waits until the tree holds batch upTo, or a flush failed,
// or ctx or the engine ends. It is the reaper's, which can archive faster
// than the tree takes it: so each flush commits about what it archived
// since the one before, never a backlog of its asks' layers in one
// commit (flush takes every frozen layer). upTo must be a batch that
// wrote, acknowledged before an ask (askFlush) that a later batch served:
// its layer is then frozen and flushed. (A batch that wrote nothing may
// be in no layer the tree ever takes, review s42b; an empty list of
// frozen layers, which writers refill whenever flushes take longer than
// the flush interval, may never come, review s42.)
func (e *engine) awaitFlushed(ctx context.Context, upTo int) {
	for {
		e.mu.Lock()
		done, flushed := e.treeHolds >= upTo || e.flushErr != nil, e.flushed
		e.mu.Unlock()
		if done {
			return
		}
		select {
		case <-flushed:
		case <-ctx.Done():
			return
		case <-e.stop:
			return
		}
	}
}

func (e *engine) kickFlusher() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// pendingLocked is the redo payload bytes the tree does not hold yet.
func (e *engine) pendingLocked() int64 {
	n := e.topBytes
	for _, f := range e.frozen {
		n += f.bytes
	}
	return n
}

// recover lets writes resume after a failed append once the failed
// record is surely not in the log (overwritten with zeros, durably): the
// state the batch was rolled back from is then the durable one.
func (e *engine) recover() {
	e.mu.Lock()
	failed := e.failed != nil
	e.mu.Unlock()
	if !failed {
		return
	}
	e.logMu.Lock()
	err := e.log.Recover()
	e.logMu.Unlock()
	if err == nil {
		e.mu.Lock()
		e.failed = nil
		e.mu.Unlock()
	}
}

// freezeLocked makes top a frozen layer and starts a new one, and
// reports whether it froze one (top held writes). Only the committer
// calls it, between batches: it alone writes top. e.mu held.
func (e *engine) freezeLocked() bool {
	e.frozeAt = time.Now()
	if e.top.Empty() {
		return false
	}
	e.frozen = append([]frozenLayer{{layer: e.top, seq: e.topSeq, bytes: e.topBytes, batch: e.batch}}, e.frozen...)
	e.top, e.topBytes = layered.NewLayer(), 0
	return true
}

// flusher flushes when kicked, and retries a failed flush.
func (e *engine) flusher() {
	defer e.flusherWG.Done()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-e.kick:
		case <-retry.C:
		}
		if err := e.flush(); err != nil {
			retry.Reset(time.Second)
		}
	}
}

// flush commits the frozen layers to the tree with the last redo record
// they hold, then drops them and the log segments the tree now holds.
func (e *engine) flush() error {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	e.mu.Lock()
	todo := e.frozenLayersLocked()
	var upTo uint64
	var upToBatch int
	if len(todo) > 0 {
		upTo, upToBatch = e.frozen[0].seq, e.frozen[0].batch
		e.treeMayHold.Store(int64(upToBatch))
	}
	e.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	err := e.db.Update(func(tx *bbolt.Tx) error {
		setFills(tx, e.fills)
		for i := len(todo) - 1; i >= 0; i-- {
			if err := applyLayer(tx, todo[i]); err != nil {
				return err
			}
		}
		if e.flushHook != nil {
			if err := e.flushHook(); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyRedoApplied, u64(upTo))
	})
	e.mu.Lock()
	close(e.flushed)
	e.flushed = make(chan struct{})
	if err != nil {
		e.flushErr = err
		e.mu.Unlock()
		return err
	}
	e.flushErr = nil
	e.treeHolds = max(e.treeHolds, upToBatch)
	// todo are the oldest frozen layers (later ones were put in front).
	keep := len(e.frozen) - len(todo)
	e.frozen = e.frozen[:keep]
	// Readers take the layers the tree does not hold yet; the tree they
	// begin from now on holds the rest.
	cur := e.snap.Load()
	e.snap.Store(&engineSnap{layers: cur.layers[:len(cur.layers)-min(len(todo), len(cur.layers))], id: cur.id})
	e.mu.Unlock()
	// The obsolete segments are deleted without logMu: appends do not
	// wait for their unlinks (redolog's Remove). Flushes run one at a
	// time (flushMu), so the segments Forget takes off are still the
	// oldest.
	e.logMu.Lock()
	obsolete := e.log.Obsolete(upTo + 1)
	e.logMu.Unlock()
	if e.removeHook != nil {
		e.removeHook()
	}
	deleted, err := e.log.Remove(obsolete)
	e.logMu.Lock()
	e.log.Forget(deleted)
	e.logMu.Unlock()
	return err
}

// exclusive runs fn in a write transaction of its own, as the next batch
// (id), straight on the tree: for recovery on a closed namespace, whose
// caller synced first and where no other write runs. Readers see it as
// batch id once it committed.
func (e *engine) exclusive(fn func(tx *bbolt.Tx, id int) error) error {
	e.drain()
	e.mu.Lock()
	if len(e.frozen) > 0 || !e.top.Empty() {
		e.mu.Unlock()
		return errors.New("the store holds writes the tree has not taken")
	}
	e.batch++
	id, top := e.batch, e.top
	e.mu.Unlock()
	e.exMu.Lock()
	defer e.exMu.Unlock()
	e.treeMayHold.Store(int64(id))
	err := e.db.Update(func(tx *bbolt.Tx) error {
		setFills(tx, e.fills)
		return fn(tx, id)
	})
	if err == nil {
		e.mu.Lock()
		e.treeHolds = max(e.treeHolds, id)
		e.mu.Unlock()
	}
	e.publish(id, top)
	return err
}

// reader returns a view of every acknowledged write, and its release.
func (e *engine) reader() (*layered.View, func(), error) {
	for {
		v, release, ok, err := e.readerAt(e.snap.Load())
		if err != nil || ok {
			return v, release, err
		}
	}
}

// readerAt is a view of s's layers over a new tree transaction. ok is
// false (and nothing is held) when a flush or exclusive may have given
// the tree batches newer than s: a newer snapshot holds them (it was
// published before they froze), so the caller takes one and asks again.
//
// No lock of the store's may be held here: beginning a tree transaction
// waits while a commit grows the file's map, and that waits for every
// open transaction, the committer's among them, which may be waiting for
// the store's clock lock.
func (e *engine) readerAt(s *engineSnap) (*layered.View, func(), bool, error) {
	e.exMu.RLock()
	defer e.exMu.RUnlock()
	tx, err := e.db.Begin(false)
	if err != nil {
		return nil, nil, false, err
	}
	if e.treeMayHold.Load() > int64(s.id) {
		_ = tx.Rollback()
		return nil, nil, false, nil
	}
	v := layered.NewView(baseOf{tx}, s.layers...)
	v.SetID(s.id)
	return v, func() { _ = tx.Rollback() }, true, nil
}

// health is the engine's failure, if any, after a try to recover from a
// failed append.
func (e *engine) health() error {
	e.recover()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed != nil {
		return e.failed
	}
	return e.flushErr
}

// close flushes everything and closes the log. The store refuses new
// writes already; the caller has let the group run the last ones (sync).
func (e *engine) close() error {
	e.drain()
	close(e.stop)
	e.flusherWG.Wait()
	err := e.flush()
	e.mu.Lock()
	clean := err == nil && e.failed == nil && len(e.frozen) == 0 && e.top.Empty()
	e.mu.Unlock()
	if e.closeHook != nil {
		e.closeHook()
	}
	if clean {
		// The tree holds every acknowledged write: it no longer needs
		// this log (a copy of the file alone is whole). Twice: a torn
		// newest meta page makes bbolt fall back one commit, which must
		// still be a clean one.
		for i := 0; i < 2 && err == nil; i++ {
			err = e.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyRedoLog) })
		}
		if err == nil {
			// Nothing in the log is needed: the next Open reads no
			// segment, and a short command that only reads makes none.
			e.logMu.Lock()
			err = e.log.Reset()
			e.logMu.Unlock()
		}
	}
	e.logMu.Lock()
	defer e.logMu.Unlock()
	if cerr := e.log.Close(); err == nil {
		err = cerr
	}
	return err
}

// Redo record payload: the engine id, then each change:
//
//	'p' bucket key value | 'd' bucket key | 's' bucket seq
//
// with bucket, key and value as uvarint length ‖ bytes, seq as u64.
func (e *engine) encode(ch []layered.Change) []byte {
	size := len(e.id)
	for _, c := range ch {
		size += 1 + sizedLen(len(c.Bucket)) + sizedLen(len(c.Key)) + sizedLen(len(c.Value)) + 8
	}
	out := append(make([]byte, 0, size), e.id...)
	for _, c := range ch {
		switch {
		case c.IsSeq:
			out = append(out, 's')
			out = appendBytes(out, []byte(c.Bucket))
			out = binary.BigEndian.AppendUint64(out, c.Seq)
		case c.Delete:
			out = append(out, 'd')
			out = appendBytes(out, []byte(c.Bucket))
			out = appendBytes(out, c.Key)
		default:
			out = append(out, 'p')
			out = appendBytes(out, []byte(c.Bucket))
			out = appendBytes(out, c.Key)
			out = appendBytes(out, c.Value)
		}
	}
	return out
}

// sizedLen bounds what appendBytes adds for n bytes.
func sizedLen(n int) int { return binary.MaxVarintLen64 + n }

func appendBytes(out, b []byte) []byte {
	out = binary.AppendUvarint(out, uint64(len(b)))
	return append(out, b...)
}

var errRecord = errors.New("malformed redo record")

// applyRecord applies one record's changes to tx; a record of another
// tree, or one that does not parse whole, is refused.
func (e *engine) applyRecord(tx *bbolt.Tx, p []byte) error {
	if !bytes.HasPrefix(p, e.id) {
		return errors.New("a record of another store file")
	}
	p = p[len(e.id):]
	next := func() ([]byte, bool) {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, false
		}
		b := p[k : k+int(n)]
		p = p[k+int(n):]
		return b, true
	}
	bucket := func() (*bbolt.Bucket, bool) {
		name, ok := next()
		if !ok {
			return nil, false
		}
		b := tx.Bucket(name)
		return b, b != nil
	}
	for len(p) > 0 {
		op := p[0]
		p = p[1:]
		b, ok := bucket()
		if !ok {
			return errRecord
		}
		switch op {
		case 's':
			if len(p) < 8 {
				return errRecord
			}
			if err := b.SetSequence(binary.BigEndian.Uint64(p)); err != nil {
				return err
			}
			p = p[8:]
		case 'd':
			k, ok := next()
			if !ok || len(k) == 0 {
				return errRecord
			}
			if err := b.Delete(k); err != nil {
				return err
			}
		case 'p':
			k, ok := next()
			if !ok || len(k) == 0 {
				return errRecord
			}
			v, ok := next()
			if !ok {
				return errRecord
			}
			// bbolt keeps the slices until the commit; p outlives it.
			if err := b.Put(k, v); err != nil {
				return err
			}
		default:
			return errRecord
		}
	}
	return nil
}
