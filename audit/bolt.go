package audit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	bbolt "go.etcd.io/bbolt"
)

// BoltFileName is the conventional name of the bbolt audit file in a data
// directory.
const BoltFileName = "audit.db"

// Retention defaults of a BoltSink.
const (
	DefaultMaxEvents = 1_000_000
	DefaultMaxAge    = 90 * 24 * time.Hour
	// prunePerWrite bounds the deletions one Write does, so a Write's cost
	// stays bounded after a retention change; Prune finishes the job.
	prunePerWrite = 256
)

var (
	bucketEvents = []byte("events") // event id (ULID text) → event JSON
	bucketMeta   = []byte("meta")
	keyCount     = []byte("count") // uint64 number of events
	keyHigh      = []byte("high")  // uint64 number of high-priority events among them
)

// BoltOptions configures a BoltSink.
type BoltOptions struct {
	// MaxEvents bounds the number of stored normal-priority events; the
	// oldest go first. High-priority events (force-release, revoke) are
	// not counted and go by age (MaxAge) only, so no flood of other
	// events can prune them. Zero means DefaultMaxEvents.
	MaxEvents int
	// MaxAge bounds the age of stored events, by their event id time.
	// Zero means DefaultMaxAge.
	MaxAge time.Duration
	// Now is the clock used for age pruning; nil means time.Now.
	Now func() time.Time
}

// BoltSink stores events in a bbolt file, keyed by event id, so keys are in
// time order. Every Write is one committed (fsynced) transaction. Retention
// is bounded by count (normal-priority events only) and age (every event)
// and enforced on every write (at most prunePerWrite deletions each) and by
// Prune. Safe for concurrent use.
type BoltSink struct {
	db     *bbolt.DB
	path   string
	opts   BoltOptions
	mu     sync.RWMutex // guards closed against Close racing a transaction
	closed bool

	// failed is the last Write's failure (bbolt rolled it back; the next
	// Write tries again), until a Write or Check succeeds.
	failMu sync.Mutex
	failed error
}

// OpenBolt opens (creating if needed, mode 0600) the bbolt audit file at
// path. A file held by another process fails after one second.
func OpenBolt(path string, o BoltOptions) (*BoltSink, error) {
	if o.MaxEvents <= 0 {
		o.MaxEvents = DefaultMaxEvents
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketEvents); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(bucketMeta)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("audit: initialize %s: %w", path, err)
	}
	return &BoltSink{db: db, path: path, opts: o}, nil
}

// ErrDuplicateEvent is returned when an event id is already stored.
var ErrDuplicateEvent = errors.New("audit: duplicate event id")

// Write validates e and stores it in one committed transaction, then prunes
// past retention.
func (s *BoltSink) Write(ctx context.Context, e Event) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	b, err := Marshal(e)
	if err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	key := []byte(e.EventID)
	err = s.db.Update(func(tx *bbolt.Tx) error {
		ev := tx.Bucket(bucketEvents)
		if ev.Get(key) != nil {
			return ErrDuplicateEvent
		}
		if err := ev.Put(key, b); err != nil {
			return err
		}
		n, high := count(tx, keyCount)+1, count(tx, keyHigh)
		if highPriority(b) {
			high++
		}
		n, high, _ = s.prune(tx, n, high, prunePerWrite)
		return setCounts(tx, n, high)
	})
	if err != nil && !errors.Is(err, ErrDuplicateEvent) {
		s.setFailed(fmt.Errorf("%s: write: %w", filepath.Base(s.path), SystemError(err)))
		return fmt.Errorf("audit: write: %w", err)
	}
	s.setFailed(nil)
	return err
}

func (s *BoltSink) setFailed(err error) {
	s.failMu.Lock()
	s.failed = err
	s.failMu.Unlock()
}

// Check reports whether the sink can write durably now: nil, or the last
// Write's failure while it lasts. A failed transaction is rolled back by
// bbolt, so recovery needs only room: after a failure Check writes and
// fsyncs a scratch file of one maximal event beside the database, and
// success clears the failure.
func (s *BoltSink) Check(ctx context.Context) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if s.failed == nil {
		return nil
	}
	if CheckRoom(filepath.Dir(s.path)) != nil {
		return s.failed
	}
	s.failed = nil
	return nil
}

func count(tx *bbolt.Tx, key []byte) uint64 {
	if v := tx.Bucket(bucketMeta).Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func setCounts(tx *bbolt.Tx, n, high uint64) error {
	m := tx.Bucket(bucketMeta)
	if err := m.Put(keyCount, binary.BigEndian.AppendUint64(nil, n)); err != nil {
		return err
	}
	return m.Put(keyHigh, binary.BigEndian.AppendUint64(nil, high))
}

// highPriority reports whether a stored event (Marshal's bytes) is high
// priority. The field appears unescaped only as the event's own: a string
// value's quotes are escaped.
func highPriority(v []byte) bool {
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
func (s *BoltSink) prune(tx *bbolt.Tx, n, high uint64, max int) (uint64, uint64, bool) {
	cutoff := ulid.Timestamp(s.opts.Now().Add(-s.opts.MaxAge))
	c := tx.Bucket(bucketEvents).Cursor()
	skipped := false
	deleted := 0
	for k, v := c.First(); ; {
		if k == nil {
			if !skipped { // every event was looked at and none is left
				return 0, 0, false
			}
			return n, high, false
		}
		isHigh := highPriority(v)
		if keyTime(k) >= cutoff { // no later event is older
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
		if c.Delete() != nil {
			return n, high, true
		}
		deleted++
		n--
		if isHigh && high > 0 {
			high--
		}
		k, v = c.Seek(key) // re-seek: Next after Delete skips a key in bbolt
	}
}

// keyTime is the ULID time of a key; an unparsable key counts as oldest.
func keyTime(k []byte) uint64 {
	id, err := ulid.ParseStrict(string(k))
	if err != nil {
		return 0
	}
	return id.Time()
}

// Prune enforces retention completely (Write does it incrementally).
func (s *BoltSink) Prune(ctx context.Context) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.db.Update(func(tx *bbolt.Tx) error {
			var n, high uint64
			n, high, more = s.prune(tx, count(tx, keyCount), count(tx, keyHigh), 10*prunePerWrite)
			return setCounts(tx, n, high)
		}); err != nil {
			return fmt.Errorf("audit: prune: %w", err)
		}
	}
	return nil
}

// Count returns the number of stored events.
func (s *BoltSink) Count(ctx context.Context) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	var n uint64
	err := s.db.View(func(tx *bbolt.Tx) error { n = count(tx, keyCount); return nil })
	return int(n), err
}

// Read returns up to limit stored events matching f, oldest first. A limit
// of zero or less means DefaultReadLimit; more than MaxReadLimit is capped
// (ReadLimit). A stored event that does not decode strictly fails the read.
func (s *BoltSink) Read(ctx context.Context, f Filter, limit int) ([]Event, error) {
	limit = ReadLimit(limit)
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
		return nil, ErrClosed
	}
	var out []Event
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketEvents).Cursor()
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
			e, err := Unmarshal(v)
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

// Close closes the file. Later calls fail with ErrClosed.
func (s *BoltSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.db.Close()
}
