// Package bolt is the embedded durable lease backend on go.etcd.io/bbolt: one
// file, no server, the default backend of starlease.
//
// Every mutation is one bbolt write transaction, its linearization point.
// Concurrent mutations share a transaction and its fsync (group.go).
// Backend time is the process clock read inside the transaction and never
// allowed to move backwards: the last time used is persisted and taken as a
// floor, so a clock step back (or a restart on a machine whose clock is
// behind) cannot revive an expired lease.
//
// AuditSink is the audit store of a bolt data directory: a bbolt file of
// its own (AuditFileName), apart from the lease store's.
package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterr "go.etcd.io/bbolt/errors"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/groupcommit"
	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/internal/redolog"
	"github.com/starintel/starlease/lease"
)

// schemaVersion is the layout version stored in the meta bucket. Version
// 2 added the time indexes active_exp and history_exp; version 3 keeps an
// identity's active record, counter, history and idempotency evidence
// together in one bucket under its lock key, so a mutation dirties one leaf
// for them instead of one in each of four buckets. Older files are
// migrated when they are opened (migrate.go), and a backup of any of them
// restores. Version 4 writes idempotency evidence in version 2
// (lease.CompactEvidence) and version 5 history entries too
// (lease.CompactHistory), version 6 active records too
// (lease.CompactRecord); a build of an older schema cannot read them, so
// it refuses the file instead of answering a replay, a history read or a
// lease wrongly. Version 7 packs lock keys and idempotency scopes in keys
// (ident.go) and drops the lock key from List index entries. Version 8
// changes no value: its tree goes with a redo log (engine.go) that may
// hold acknowledged writes the tree has not taken yet, which a build of
// an older schema would not redo. Version 9 keeps a count of each
// identity's history entries (kindHistoryCount) beside them, which a
// build of an older schema would not keep up to date; a file of version 8
// has none, and each identity's is made when it next ends a lease.
// Version 10 stores the evidence of an acquisition and of a release by
// reference to the lease's record (lease.ReferringEvidence), which a
// build of an older schema would answer as corrupt; a file of version 9
// holds none. Version 11 stores that evidence leaner, naming the lease
// by its fencing token (lease.LeanEvidence), and history entries without
// what their key holds (lease.CompactHistoryAt, version 3), which a build
// of an older schema would also answer as corrupt; a file of version 10
// opens unchanged (its values stay readable) and new writes take the new
// forms.
const (
	schemaVersion    = "11"
	schemaVersionV10 = "10"
	schemaVersionV9  = "9"
	schemaVersionV8  = "8"
	schemaVersionV7  = "7"
	schemaVersionV6  = "6"
	schemaVersionV5  = "5"
	schemaVersionV4  = "4"
	schemaVersionV3  = "3"
	schemaVersionV2  = "2"
	schemaVersionV1  = "1"
)

var (
	bucketMeta       = []byte("meta")
	bucketIdent      = []byte("ident")       // packed lock key ‖ kind ‖ … → an identity's facts (identKey, schema 3)
	bucketIdemExp    = []byte("idem_exp")    // expiry ms ‖ evidence's ident key → ∅
	bucketLeases     = []byte("leases")      // lease id → packed lock key ‖ state ‖ 0 ‖ ended ms
	bucketIndex      = []byte("index")       // by ‖ 0 ‖ value ‖ 0 ‖ lease id → ∅ (the leases bucket names its identity)
	bucketHighWater  = []byte("high_water")  // lock key ‖ 0 ‖ sink → uint64, never deleted
	bucketCommits    = []byte("commits")     // commit scope → accepted commit
	bucketCommitExp  = []byte("commit_exp")  // expiry ms ‖ scope → ∅
	bucketCommitSeq  = []byte("commit_seq")  // lock key → uint64, the last commit seq, never deleted
	bucketQuarantine = []byte("quarantine")  // lock key → reason
	bucketOutbox     = []byte("outbox")      // seq → outbox entry, in acceptance order
	bucketOutboxIDs  = []byte("outbox_ids")  // message id → seq
	bucketOutboxDead = []byte("outbox_dead") // seq → dead letter (JSON: entry, reason, dead_at), oldest first
	bucketActiveExp  = []byte("active_exp")  // expires ms ‖ packed lock key → ∅, one per active record (schema 2)
	bucketHistoryExp = []byte("history_exp") // ended ms ‖ history key → ∅, one per history entry (schema 2)
	allBuckets       = [][]byte{bucketMeta, bucketIdent, bucketIdemExp, bucketLeases, bucketIndex, bucketHighWater,
		bucketCommits, bucketCommitExp, bucketCommitSeq, bucketQuarantine, bucketOutbox, bucketOutboxIDs,
		bucketOutboxDead, bucketActiveExp, bucketHistoryExp}

	keySchema = []byte("schema")
	keyClock  = []byte("clock_ms")
)

// PageSize is the page size of a new store file. A commit writes every
// page it dirtied, each to its own place in the file, and its fsync costs
// per write far more than per byte: 16 KiB pages hold four times the
// entries of 4 KiB ones, so the tree is a level shallower and an
// acquire+release pair dirties about 8 pages instead of 14 (twice the
// bytes, half the writes), which measured a third more pairs per second
// at 50 goroutines and a tenth more at 1.
const PageSize = 16 << 10

// Options configures a Store.
type Options struct {
	lease.StoreOptions
	// ReapInterval is how often expired records and retained evidence past
	// their retention are cleaned up. Zero means 30 s; negative disables.
	ReapInterval time.Duration
	// Now is the clock; nil means time.Now. Tests only.
	Now func() time.Time
	// FlushInterval is how long acknowledged writes (durable in the redo
	// log beside the store file) wait before the tree takes them in one
	// commit. Zero means DefaultFlushInterval; negative flushes every
	// batch before it is answered (tests that read the file directly).
	FlushInterval time.Duration
}

// zeroFlushInterval is what a zero FlushInterval means: the package's own
// tests, which read and damage the file directly, make it -1.
var zeroFlushInterval = DefaultFlushInterval

// RedoLogDir is the redo log directory of the store file at path.
func RedoLogDir(path string) string { return path + ".redo" }

// Store is the bolt lease store. It is safe for concurrent use.
type Store struct {
	db     *bbolt.DB
	group  groupCommit
	opts   lease.StoreOptions
	log    *slog.Logger
	now    func() time.Time
	closed atomic.Bool
	// closeMu is held shared by each mutation from its closed check until
	// it is answered; Close sets closed, then takes it alone once: Close
	// waits for the mutations in flight, and none passes the check after.
	// One that passed it and reached the log after Close's last flush
	// would be acknowledged, then deleted with the log (a clean close
	// resets it). closed is set before the wait, so new mutations are
	// refused at once rather than queued behind the slowest in flight.
	closeMu sync.RWMutex
	// closing is held by Close throughout, so a later (or concurrent)
	// Close returns only once the first has closed the file.
	closing sync.Mutex
	// admittedHook, if set, runs in each mutation after its closed check
	// (tests).
	admittedHook func()
	// soloCommits disables group commit (benchmarks measure what it buys).
	soloCommits bool
	// schema10Writes writes values as schema 10 did (tests build files of
	// the older formats, which this build must still read). Set before
	// the first write.
	schema10Writes bool
	// records decodes the active records read-only transactions read (of
	// either stored version), answering rereads of the same bytes from
	// memory.
	records *lease.RecordMemo

	// Backend time. tmu orders time readings with transactions: lastMs
	// keeps the process clock monotone; pending holds the id and first
	// backend time of each write batch not yet shown to readers (two
	// while one waits for the disk and the next runs its functions,
	// oldest first), which reads that do not see it must not be later
	// than (see readTx). The engine shows every batch to readers under
	// its id, one that failed too, so a registration never outlives its
	// batch.
	// gate, when not empty, closes the namespace (a restore awaiting
	// recovery verification): every mutation is refused, reads answer.
	// Read at Open: only recovery clears it, and bbolt admits one process
	// per file, so it cannot change under an open store.
	gate string

	tmu     sync.Mutex
	lastMs  int64
	pending []pendingTime
	stop    chan struct{}
	wg      sync.WaitGroup
}

var _ lease.Store = (*Store)(nil)

// Open opens (creating if needed) the store file at path. A file held by
// another process makes Open fail after one second rather than wait forever.
func Open(path string, o Options) (*Store, error) {
	// The free-page list is not written at every commit but rebuilt from
	// the pages when the file opens (as etcd runs bbolt): a commit then
	// writes only the pages it changed. The map form keeps allocation
	// cheap in a large, fragmented file. A new file gets PageSize pages; a
	// file keeps the page size it was created with.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType,
		PageSize: PageSize})
	if err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot open the store file: %s", classify(err))
	}
	s := &Store{db: db, opts: o.StoreOptions.WithDefaults(), now: o.Now, stop: make(chan struct{}),
		records: lease.NewRecordMemo(lease.DecodeStoredRecord)}
	// A caller's own logger writes no secret-shaped value (an ALERT names
	// an identity, whose target id may be 64 hex digits).
	s.opts.Logger = audit.ScreenLogger(s.opts.Logger, nil)
	s.log = s.opts.Logger
	if s.now == nil {
		s.now = time.Now
	}
	s.group = groupCommit{db: db, fills: storeFills, queue: groupcommit.Queue[*groupCall]{Max: maxGroupCommit}}
	interval := o.FlushInterval
	if interval == 0 {
		interval = zeroFlushInterval
	}
	// The log is redone before anything else writes the tree: a migration
	// then starts from every acknowledged write.
	// The log goes with the file, not the name it is opened by (a
	// symlink); a hard link or a copy is told apart by keyRedoLog.
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		db.Close()
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot resolve the store file's path: %s", classify(err))
	}
	eng, err := openEngine(db, RedoLogDir(real), interval, storeFills)
	if err != nil {
		db.Close()
		if errors.Is(err, redolog.ErrCorrupt) {
			s.log.Error("lease store redo log is damaged", "error", err)
			return nil, lease.Errorf(lease.CodeCorrupt, "the store's redo log is damaged or belongs to another store file")
		}
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot open the redo log: %s", classify(err))
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		s.gate = string(meta.Get(keyGate))
		switch v := meta.Get(keySchema); {
		case v == nil:
			if err := meta.Put(keySchema, []byte(schemaVersion)); err != nil {
				return err
			}
		case string(v) != schemaVersion:
			if err := migrate(tx, string(v)); err != nil {
				return err
			}
		}
		return direct(tx, initOutboxUsage)
	}); err != nil {
		_ = eng.close()
		db.Close()
		if errors.Is(err, errSchema) {
			return nil, lease.Errorf(lease.CodeCorrupt, "store file has an unsupported schema version")
		}
		var le *lease.Error
		if errors.As(err, &le) {
			return nil, le
		}
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot initialize the store file: %s", classify(err))
	}
	if s.gate != "" {
		s.log.Warn("lease namespace is closed; mutations are refused", "reason", s.gate)
	}
	eng.waiting = s.group.queue.Queued
	s.group.engine = eng
	if err := db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyClock); len(v) == 8 {
			s.lastMs = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	}); err != nil {
		_ = eng.close()
		db.Close()
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot read the store file: %s", classify(err))
	}
	lease.Reaper{Interval: o.ReapInterval, Pass: s.reap, Log: s.log}.Start(&s.wg, s.stop)
	return s, nil
}

var errSchema = errors.New("unsupported schema")

// Close stops the reaper and closes the file. Later calls fail with
// backend_unavailable. A Close while another runs returns once that one
// has closed the file.
func (s *Store) Close() error {
	s.closing.Lock()
	defer s.closing.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	// Every mutation that found the store open is answered (none finds it
	// open from here on).
	s.closeMu.Lock()
	//lint:ignore SA2001 a barrier: Lock returns once every holder is gone
	s.closeMu.Unlock()
	close(s.stop)
	s.wg.Wait()
	// The tree takes every acknowledged write, so the log is empty when
	// the file is closed cleanly (a copy of the file alone is whole).
	_ = s.sync()
	if err := s.group.engine.close(); err != nil {
		s.log.Error("lease store flush at close failed; the redo log keeps the writes", "error_class", classify(err))
	}
	if err := s.db.Close(); err != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "close failed: %s", classify(err))
	}
	return nil
}

// Health reports ok while the file is open.
func (s *Store) Health(ctx context.Context) lease.Health {
	if s.closed.Load() {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "store is closed"}
	}
	if err := s.db.View(func(tx *bbolt.Tx) error { return nil }); err != nil {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "store file unavailable: " + classify(err)}
	}
	if err := s.group.engine.health(); err != nil {
		if errors.Is(err, errEngineFailed) {
			// Reads answer; writes resume once the log recovers.
			return lease.Health{Status: lease.HealthDegraded, Reason: "a redo log append failed; writes are refused until it recovers"}
		}
		return lease.Health{Status: lease.HealthDegraded, Reason: "the store file does not take flushed writes: " + classify(err)}
	}
	if s.gate != "" {
		return lease.Health{Status: lease.HealthDegraded, Reason: "namespace is closed: " + s.gate}
	}
	return lease.Health{Status: lease.HealthOK}
}

// classify names a storage error's class without its text.
func classify(err error) string {
	switch {
	case errors.Is(err, bolterr.ErrDatabaseNotOpen):
		return "not open"
	case errors.Is(err, bolterr.ErrTimeout):
		return "file locked by another process"
	case errors.Is(err, bolterr.ErrDatabaseReadOnly):
		return "read only"
	case errors.Is(err, bolterr.ErrInvalid), errors.Is(err, bolterr.ErrChecksum), errors.Is(err, bolterr.ErrVersionMismatch):
		return "invalid store file"
	default:
		return "i/o error"
	}
}

// begin refuses work that cannot start: a closed store is unavailable, a
// context already done is a deadline that passed before submission.
func (s *Store) begin(ctx context.Context) error { return lease.CheckStart(ctx, s.closed.Load()) }

// maxGroupCommit bounds the mutations one transaction commits together.
const maxGroupCommit = 256

// mutate runs fn once, as one write transaction. A caller alone uses its
// own transaction; concurrent callers share one (and its fsync) through
// the group commit, where a function that fails is rolled back alone.
//
// A storage failure after submission is outcome_unknown: bbolt may have
// written the pages before the error, so only a request lookup can tell.
func (s *Store) mutate(ctx context.Context, fn func(tx *layered.View) error) error {
	// Checked before closeMu too: a Close waiting for the mutations in
	// flight refuses a new one at once, not once they are answered.
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if err := s.begin(ctx); err != nil {
		return err
	}
	if s.admittedHook != nil {
		s.admittedHook()
	}
	if s.gate != "" {
		return lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed: %s", s.gate)
	}
	var err error
	if s.soloCommits {
		err = s.group.alone(fn)
	} else {
		err = s.group.update(fn)
	}
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, bolterr.ErrDatabaseNotOpen):
		return lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	case errors.Is(err, errEngineFailed):
		// Refused before anything was written.
		return lease.Errorf(lease.CodeBackendUnavailable, "writes are refused until the redo log recovers from a failed append")
	case errors.Is(err, errRedoBacklog):
		return lease.Errorf(lease.CodeBackendUnavailable, "writes are refused while the store file does not take flushed writes")
	}
	s.log.Error("lease store write failed", "error_class", classify(err))
	return lease.Errorf(lease.CodeOutcomeUnknown, "storage write failed; resolve by request id")
}

// view runs fn as one read transaction; a *lease.Error from fn is the
// typed result and passes through.
func (s *Store) view(ctx context.Context, fn func(tx *layered.View) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	v, release, err := s.group.engine.reader()
	if err == nil {
		err = fn(v)
		release()
	}
	if err != nil {
		var le *lease.Error
		if errors.As(err, &le) {
			return le
		}
		return s.storageReadError(err)
	}
	return nil
}

// sync makes the tree hold every write acknowledged before it began: a
// batch through the committer freezes the layers, then a flush applies
// them. For what reads the file itself (a backup, recovery's direct
// transaction).
func (s *Store) sync() error {
	e := s.group.engine
	e.wantFreeze.Store(true)
	c := &groupCall{fn: func(*layered.View) error { return nil }, done: make(chan struct{})}
	s.group.queue.Submit(c, s.group.commit)
	<-c.done
	if c.err != nil {
		return c.err
	}
	return e.flush()
}

// storageReadError maps a storage failure of a read.
func (s *Store) storageReadError(err error) error {
	if errors.Is(err, bolterr.ErrDatabaseNotOpen) {
		return lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	s.log.Error("lease store read failed", "error_class", classify(err))
	return lease.Errorf(lease.CodeBackendUnavailable, "storage read failed")
}

// clock returns backend time for tx: the process clock (kept monotone),
// floored at the last time any write transaction used, which a write
// transaction persists. A write transaction also registers its time so
// reads that cannot see it stay before it (readTx).
func (s *Store) clock(tx *layered.View) lease.Timestamp {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	now := s.monotoneMs(tx)
	if tx.Writable() {
		_ = tx.Bucket(bucketMeta).Put(keyClock, u64(uint64(now)))
		if e := s.group.engine; e != nil {
			s.dropShownLocked(e.snap.Load().id)
		}
		if n := len(s.pending); n == 0 || s.pending[n-1].id != tx.ID() {
			s.pending = append(s.pending, pendingTime{id: tx.ID(), ms: now})
		}
	}
	return lease.UnixMilli(now)
}

// monotoneMs is max(process clock, last reading, time persisted in tx).
// The caller holds tmu.
func (s *Store) monotoneMs(tx *layered.View) int64 {
	now := max(s.now().UnixMilli(), s.lastMs)
	if v := tx.Bucket(bucketMeta).Get(keyClock); len(v) == 8 {
		now = max(now, int64(binary.BigEndian.Uint64(v)))
	}
	s.lastMs = now
	return now
}

// readTx opens a read view and its backend time. A read linearizes at its
// snapshot: it sees every write acknowledged before it and none after, so
// its time must not be later than the time of a write in progress that its
// snapshot does not contain (otherwise it would report the old state at a
// time when the new state already holds). Taking the snapshot and reading
// the time under tmu makes the two consistent; the tree transaction under
// it is begun after, outside tmu (see engine.readerAt). lastMs holds every
// time this process wrote, and the file's from before it (Open), so a
// read needs no clock from the file.
func (s *Store) readTx() (*layered.View, func(), lease.Timestamp, error) {
	e := s.group.engine
	for {
		s.tmu.Lock()
		snap := e.snap.Load()
		now := max(s.now().UnixMilli(), s.lastMs)
		s.lastMs = now
		s.dropShownLocked(snap.id)
		if len(s.pending) > 0 && s.pending[0].ms < now {
			now = s.pending[0].ms
		}
		s.tmu.Unlock()
		tx, release, ok, err := e.readerAt(snap)
		if err != nil {
			return nil, nil, lease.Timestamp{}, err
		}
		if ok {
			return tx, release, lease.UnixMilli(now), nil
		}
	}
}

// pendingTime is a write batch's id and the first backend time it read.
type pendingTime struct {
	id int
	ms int64
}

// dropShownLocked forgets the pending times of batches readers see (id
// and older). tmu held.
func (s *Store) dropShownLocked(id int) {
	n := 0
	for n < len(s.pending) && s.pending[n].id <= id {
		n++
	}
	if n > 0 {
		s.pending = append(s.pending[:0], s.pending[n:]...)
	}
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func join(parts ...string) []byte {
	var b []byte
	for i, p := range parts {
		if i > 0 {
			b = append(b, 0)
		}
		b = append(b, p...)
	}
	return b
}
