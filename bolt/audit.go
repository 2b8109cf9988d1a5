package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/groupcommit"
	"github.com/starintel/starlease/internal/layered"
)

// AuditFileName is the conventional name of the bbolt audit file in a data
// directory.
const AuditFileName = "audit.db"

// Retention defaults of an AuditSink.
const (
	DefaultAuditMaxEvents = 1_000_000
	DefaultAuditMaxAge    = 90 * 24 * time.Hour
	// auditPrunePerWrite bounds the deletions one Write does, so a Write's
	// cost stays bounded after a retention change; Prune finishes the job.
	auditPrunePerWrite = 256
)

// The audit file's buckets and meta keys (a file of its own, apart from
// the lease store's).
var (
	auditBucketEvents = []byte("events") // event id (ULID text) → event JSON
	auditBucketMeta   = []byte("meta")
	auditKeyCount     = []byte("count") // uint64 number of events
	auditKeyHigh      = []byte("high")  // uint64 number of high-priority events among them
)

// AuditOptions configures an AuditSink.
type AuditOptions struct {
	// MaxEvents bounds the number of stored normal-priority events; the
	// oldest go first. High-priority events (force-release, revoke) are
	// not counted and go by age (MaxAge) only, so no flood of other
	// events can prune them. Zero means DefaultAuditMaxEvents.
	MaxEvents int
	// MaxAge bounds the age of stored events, by their event id time.
	// Zero means DefaultAuditMaxAge.
	MaxAge time.Duration
	// Now is the clock used for age pruning; nil means time.Now.
	Now func() time.Time
}

// AuditSink is audit.Sink on a bbolt file of its own (AuditFileName in a
// data directory): events keyed by event id, so keys are in time order.
// Every Write is one committed (fsynced) transaction. Retention is bounded
// by count (normal-priority events only) and age (every event) and
// enforced on every write (at most auditPrunePerWrite deletions each) and
// by Prune. Safe for concurrent use.
type AuditSink struct {
	db *bbolt.DB
	// group shares one transaction (and its fsync) among concurrent
	// writers, as the lease store's mutations do.
	group  groupCommit
	path   string
	opts   AuditOptions
	mu     sync.RWMutex // guards closed against Close racing a transaction
	closed bool

	// failed is the last Write's failure (bbolt rolled it back; the next
	// Write tries again), until a Write or Check succeeds. "Last" is in
	// transaction order: ran numbers each write function as it runs
	// (serially, under bbolt's write lock), and an outcome older than the
	// one recorded (failedAt) is dropped, so a success reported late
	// cannot hide a later transaction's failure, nor the reverse.
	ran      atomic.Uint64
	failMu   sync.Mutex
	failed   error
	failedAt uint64
}

var (
	_ audit.Sink    = (*AuditSink)(nil)
	_ audit.Checker = (*AuditSink)(nil)
	_ audit.Index   = (*AuditSink)(nil)
)

// OpenAudit opens (creating if needed, mode 0600) the bbolt audit file at
// path. A file held by another process fails after one second.
func OpenAudit(path string, o AuditOptions) (*AuditSink, error) {
	if o.MaxEvents <= 0 {
		o.MaxEvents = DefaultAuditMaxEvents
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultAuditMaxAge
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	// A new file gets PageSize pages: at 4 KiB a split must leave at
	// least two events on each side, so with events of ~800 bytes every
	// leaf held two and the file was 0.41 full.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, PageSize: PageSize})
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(auditBucketEvents); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(auditBucketMeta)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("audit: initialize %s: %w", path, err)
	}
	return &AuditSink{db: db, group: groupCommit{db: db, fills: auditFills, queue: groupcommit.Queue[*groupCall]{Max: maxGroupCommit}}, path: path, opts: o}, nil
}

// ErrDuplicateAuditEvent is returned when an event id is already stored.
var ErrDuplicateAuditEvent = errors.New("audit: duplicate event id")

// Write validates e (audit.Marshal) and stores it in one committed
// transaction (shared with concurrent writers), then prunes past retention.
func (s *AuditSink) Write(ctx context.Context, e audit.Event) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	b, err := audit.Marshal(e)
	if err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return audit.ErrClosed
	}
	// A duplicate fails its own function only: the group commit rolls its
	// writes back and the others of its transaction commit.
	err = s.update(func(tx *layered.View) error {
		_, err := s.putEvents(tx, []auditEntry{{[]byte(e.EventID), b}}, ErrDuplicateAuditEvent)
		return err
	})
	if err != nil && !errors.Is(err, ErrDuplicateAuditEvent) {
		return fmt.Errorf("audit: write: %w", err)
	}
	return err
}

// AddMissing stores, in one committed transaction (shared with concurrent
// writers), the event of each of lines (audit file lines) whose event id
// the store does not hold yet, then prunes past retention: audit.Index,
// for the store as the index of the server's audit file (audit.Indexed).
// Each line is decoded strictly and stored as Marshal encodes the event,
// so the store holds what Write would; a line that does not decode is
// skipped and counted. Lines the server's own file took (taken) are
// Marshal's bytes already and are stored as they are: taken is for
// audit.Indexed's lines handed over in memory only; any other caller
// passes false.
func (s *AuditSink) AddMissing(ctx context.Context, lines [][]byte, taken bool) (added, skipped int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, fmt.Errorf("audit: write: %w", err)
	}
	entries, skipped := auditEntries(lines, taken)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, skipped, audit.ErrClosed
	}
	err = s.update(func(tx *layered.View) (err error) {
		added, err = s.putEvents(tx, entries, nil)
		return err
	})
	if err != nil {
		return 0, skipped, fmt.Errorf("%s: write: %w", filepath.Base(s.path), s.reason(err))
	}
	return added, skipped, nil
}

// auditEntry is an event as the store keeps it: its id, and Marshal's
// bytes.
type auditEntry struct{ key, value []byte }

// auditEntries is the entry of each of lines (audit file lines). A line
// read back from the file is decoded strictly and encoded as Marshal does;
// one that does not decode is skipped and counted. A line the server's own
// file took (taken) is Marshal's bytes already: its id is read where
// Marshal writes it.
func auditEntries(lines [][]byte, taken bool) (entries []auditEntry, skipped int) {
	entries = make([]auditEntry, 0, len(lines))
	for _, line := range lines {
		if taken {
			if id, ok := leadingEventID(line); ok {
				entries = append(entries, auditEntry{id, line})
				continue
			}
		}
		e, err := audit.Unmarshal(line)
		if err != nil {
			skipped++
			continue
		}
		b, err := audit.Marshal(e)
		if err != nil {
			skipped++
			continue
		}
		entries = append(entries, auditEntry{[]byte(e.EventID), b})
	}
	return entries, skipped
}

// update runs fn in a write transaction shared with concurrent writers
// and records its outcome for Check; a duplicate event is no failure of
// the store.
func (s *AuditSink) update(fn func(*layered.View) error) error {
	var at uint64
	err := s.group.update(func(tx *layered.View) error {
		at = s.ran.Add(1)
		return fn(tx)
	})
	if at == 0 {
		// No transaction ran the function: the outcome is newer than
		// every one that did.
		at = s.ran.Add(1)
	}
	if err != nil && !errors.Is(err, ErrDuplicateAuditEvent) {
		s.setOutcome(at, fmt.Errorf("%s: write: %w", filepath.Base(s.path), s.reason(err)))
		return err
	}
	s.setOutcome(at, nil)
	return err
}

// putEvents stores each of entries the store does not hold yet (one it
// holds is skipped, or fails with held when that is set), counts them in
// and prunes past retention; it returns how many it stored.
func (s *AuditSink) putEvents(tx *layered.View, entries []auditEntry, held error) (int, error) {
	ev := tx.Bucket(auditBucketEvents)
	n, high := auditCount(tx, auditKeyCount), auditCount(tx, auditKeyHigh)
	added := 0
	for _, e := range entries {
		if ev.Get(e.key) != nil {
			if held != nil {
				return 0, held
			}
			continue
		}
		if err := ev.Put(e.key, e.value); err != nil {
			return 0, err
		}
		n, added = n+1, added+1
		if auditHighPriority(e.value) {
			high++
		}
	}
	n, high, _ = s.prune(tx, n, high, auditPrunePerWrite*max(added, 1))
	return added, auditSetCounts(tx, n, high)
}

// Holds reports whether the store holds the event of every line of
// lines (audit file lines) that decodes strictly, or would not keep it:
// audit.Index. An event older than MaxAge, or a normal-priority one older
// than every stored event while MaxEvents normal ones are stored, is one
// retention took out (or would at once): held, so catching up does not add
// it again at every start.
func (s *AuditSink) Holds(ctx context.Context, lines [][]byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// A line the file took starts with its event id (Marshal's order):
	// read it there, without decoding the whole line.
	probes, _ := auditEntries(lines, true)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false, audit.ErrClosed
	}
	cutoff := ulid.Timestamp(s.opts.Now().Add(-s.opts.MaxAge))
	held := true
	err := s.db.View(func(btx *bbolt.Tx) error {
		tx := readView(btx)
		ev := tx.Bucket(auditBucketEvents)
		n, high := auditCount(tx, auditKeyCount), auditCount(tx, auditKeyHigh)
		full := n-min(high, n) >= uint64(s.opts.MaxEvents)
		oldest, _ := ev.Cursor().First()
		for _, p := range probes {
			switch {
			case ev.Get(p.key) != nil, auditKeyTime(p.key) < cutoff:
			case full && !auditHighPriority(p.value) && oldest != nil && bytes.Compare(p.key, oldest) < 0:
			default:
				held = false
				return nil
			}
		}
		return nil
	})
	return held, err
}

// leadingEventID is the event id a line opens with, as Marshal writes
// it: {"event_id":"<26-character ULID>",.
func leadingEventID(line []byte) ([]byte, bool) {
	const open = `{"event_id":"`
	rest, ok := bytes.CutPrefix(line, []byte(open))
	if !ok || len(rest) < ulid.EncodedSize+2 || rest[ulid.EncodedSize] != '"' || rest[ulid.EncodedSize+1] != ',' {
		return nil, false
	}
	id := rest[:ulid.EncodedSize]
	if _, err := ulid.ParseStrict(string(id)); err != nil {
		return nil, false
	}
	return id, true
}

// reason is err as /readyz may show it: bbolt formats some errors as text
// with the file's path in it (a failed resize), so the data directory is
// taken out of the text.
func (s *AuditSink) reason(err error) error {
	err = audit.SystemError(err)
	dir := filepath.Dir(s.path) + string(filepath.Separator)
	if msg := err.Error(); strings.Contains(msg, dir) {
		return &scrubbedError{msg: strings.ReplaceAll(msg, dir, ""), err: err}
	}
	return err
}

// scrubbedError is an error whose text had a path taken out.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// setOutcome records the outcome of the write function run at, unless a
// later one is already recorded.
func (s *AuditSink) setOutcome(at uint64, err error) {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if at < s.failedAt {
		return
	}
	s.failed, s.failedAt = err, at
}

// Check reports whether the sink can write durably now: nil, or the last
// Write's failure while it lasts. A failed transaction is rolled back by
// bbolt, so recovery needs only room: after a failure Check writes and
// fsyncs a scratch file of one maximal event beside the database, and
// success clears the failure.
func (s *AuditSink) Check(ctx context.Context) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return audit.ErrClosed
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if s.failed == nil {
		return nil
	}
	if audit.CheckRoom(filepath.Dir(s.path)) != nil {
		return s.failed
	}
	s.failed = nil
	return nil
}

func auditCount(tx *layered.View, key []byte) uint64 {
	if v := tx.Bucket(auditBucketMeta).Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func auditSetCounts(tx *layered.View, n, high uint64) error {
	m := tx.Bucket(auditBucketMeta)
	if err := m.Put(auditKeyCount, binary.BigEndian.AppendUint64(nil, n)); err != nil {
		return err
	}
	return m.Put(auditKeyHigh, binary.BigEndian.AppendUint64(nil, high))
}

// auditHighPriority reports whether a stored event (audit.Marshal's bytes)
// is high priority. The field appears unescaped only as the event's own: a
// string value's quotes are escaped.
func auditHighPriority(v []byte) bool {
	return bytes.Contains(v, []byte(`"priority":"high"`))
}

// prune deletes, oldest first, events older than MaxAge, and normal-priority
// events while more than MaxEvents of them are stored, at most max
// deletions; high-priority events are kept until they are older than
// MaxAge. It takes and returns the counts of all events and of
// high-priority ones, and whether it stopped early. (A database written
// before the high-priority count existed counts its older high-priority
// events as normal until they age out: fewer normal events are kept
// meanwhile, never more.)
func (s *AuditSink) prune(tx *layered.View, n, high uint64, max int) (uint64, uint64, bool) {
	cutoff := ulid.Timestamp(s.opts.Now().Add(-s.opts.MaxAge))
	events := tx.Bucket(auditBucketEvents)
	c := events.Cursor()
	skipped := false
	deleted := 0
	for k, v := c.First(); ; {
		if k == nil {
			if !skipped { // every event was looked at and none is left
				return 0, 0, false
			}
			return n, high, false
		}
		isHigh := auditHighPriority(v)
		if auditKeyTime(k) >= cutoff { // no later event is older
			if n-min(high, n) <= uint64(s.opts.MaxEvents) {
				return n, high, false
			}
			if isHigh { // counted out of MaxEvents: only age prunes it
				skipped = true
				k, v = c.Next()
				continue
			}
		}
		if deleted == max {
			return n, high, true
		}
		key := append([]byte(nil), k...)
		if events.Delete(key) != nil {
			return n, high, true
		}
		deleted++
		n--
		if isHigh && high > 0 {
			high--
		}
		k, v = c.Seek(key)
	}
}

// auditKeyTime is the ULID time of a key; an unparsable key counts as
// oldest.
func auditKeyTime(k []byte) uint64 {
	id, err := ulid.ParseStrict(string(k))
	if err != nil {
		return 0
	}
	return id.Time()
}

// Prune enforces retention completely (Write does it incrementally).
func (s *AuditSink) Prune(ctx context.Context) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return audit.ErrClosed
	}
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.db.Update(func(btx *bbolt.Tx) error {
			return direct(btx, func(tx *layered.View) error {
				var n, high uint64
				n, high, more = s.prune(tx, auditCount(tx, auditKeyCount), auditCount(tx, auditKeyHigh), 10*auditPrunePerWrite)
				return auditSetCounts(tx, n, high)
			})
		}); err != nil {
			return fmt.Errorf("audit: prune: %w", err)
		}
	}
	return nil
}

// Count returns the number of stored events.
func (s *AuditSink) Count(ctx context.Context) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, audit.ErrClosed
	}
	var n uint64
	err := s.db.View(func(tx *bbolt.Tx) error { n = auditCount(readView(tx), auditKeyCount); return nil })
	return int(n), err
}

// Read returns up to limit stored events matching f, oldest first. A limit
// of zero or less means audit.DefaultReadLimit; more than
// audit.MaxReadLimit is capped (audit.ReadLimit). A stored event that does
// not decode strictly fails the read.
func (s *AuditSink) Read(ctx context.Context, f audit.Filter, limit int) ([]audit.Event, error) {
	limit = audit.ReadLimit(limit)
	var start []byte
	if !f.Since.IsZero() {
		if f.Since.Before(time.UnixMilli(0)) {
			f.Since = time.UnixMilli(0)
		}
		var id ulid.ULID
		if err := id.SetTime(ulid.Timestamp(f.Since)); err != nil {
			return nil, fmt.Errorf("audit: read: since out of range")
		}
		start = []byte(id.String())
	}
	if f.After != "" && string(start) <= f.After {
		start = append([]byte(f.After), 0)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, audit.ErrClosed
	}
	var out []audit.Event
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(auditBucketEvents).Cursor()
		k, v := c.First()
		if start != nil {
			k, v = c.Seek(start)
		}
		for i := 0; k != nil && len(out) < limit; k, v = c.Next() {
			if i++; i%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			e, err := audit.Unmarshal(v)
			if err != nil {
				return fmt.Errorf("stored event %s: %w", k, err)
			}
			if f.Matches(&e) {
				out = append(out, e)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("audit: read: %w", err)
	}
	return out, nil
}

// Close closes the file. Later calls fail with audit.ErrClosed.
func (s *AuditSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.db.Close()
}
