package valkey

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/audit"
)

// auditLibrarySource is the audit sink's function library: one XADD per
// event, in one round trip whatever the stream's state.
//
//go:embed audit.lua
var auditLibrarySource string

var auditLibrary = newLibrary("audit", auditLibrarySource)

// DefaultAuditMaxLen is the default cap of the audit stream.
const DefaultAuditMaxLen = 1_000_000

// auditSeekWindow bounds how far past an event's own time Read looks for
// the entry holding Filter.After (see AuditSink.Read).
const auditSeekWindow = time.Minute

// auditCallTimeout bounds a call whose context has no deadline.
const auditCallTimeout = 5 * time.Second

// AuditOptions configures an AuditSink.
type AuditOptions struct {
	// MaxLen caps the stream (XADD MAXLEN ~, so the server may keep up to
	// one stream node, about a hundred entries, more). Zero means
	// DefaultAuditMaxLen.
	MaxLen int64
}

// Audit keys; see the package documentation.
func (k layout) audit() string              { return k.ns + ":audit" }
func (k layout) auditOnce(id string) string { return k.ns + ":audit:once:" + id }

// auditOnceTTL is how long the sink remembers an event it added (Write or
// WriteOnce; one small key per event): far longer than a spool takes to
// forward after a restart.
const auditOnceTTL = 7 * 24 * time.Hour

// AuditSink is audit.Sink on the lease backend's Valkey server: every event
// is one XADD to the capped stream ns:audit, its entry holding a single
// field "e" with exactly the bytes of audit.Marshal. Write returns nil only
// after the server acknowledged the entry, and on a server verified
// durable (appendonly yes, appendfsync always, maxmemory-policy noeviction
// — the same check that gates lease mutations; otherwise Write fails), so
// an acknowledged event survives a crash. A failed Write means the event
// may or may not be stored: force-release and revoke then report failure,
// and a retried event may appear twice (same event id). Several servers
// sharing one Valkey write one stream. Safe for concurrent use.
type AuditSink struct {
	s      *Store
	maxLen int64

	mu     sync.RWMutex
	closed bool
}

var (
	_ audit.Sink       = (*AuditSink)(nil)
	_ audit.OnceWriter = (*AuditSink)(nil)
)

// AuditSink returns the audit sink on s's server and namespace, sharing
// s's connections. Closing it does not close s.
func (s *Store) AuditSink(o AuditOptions) *AuditSink {
	if o.MaxLen <= 0 {
		o.MaxLen = DefaultAuditMaxLen
	}
	return &AuditSink{s: s, maxLen: o.MaxLen}
}

// Write validates e and appends it; see AuditSink.
func (a *AuditSink) Write(ctx context.Context, e audit.Event) error {
	return a.write(ctx, e, false)
}

func (a *AuditSink) write(ctx context.Context, e audit.Event, once bool) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: write: %w", err)
	}
	b, err := audit.Marshal(e)
	if err != nil {
		return err
	}
	id, err := ulid.ParseStrict(e.EventID)
	if err != nil {
		return errors.New("audit: write: event id is not a ULID")
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return audit.ErrClosed
	}
	if a.s.closed.Load() {
		return errors.New("audit: valkey sink: store is closed")
	}
	ctx, cancel := bounded(ctx, auditCallTimeout)
	defer cancel()
	if err := a.s.writable(ctx); err != nil {
		return errors.New("audit: valkey sink: backend durability is not verified")
	}
	ms := strconv.FormatUint(id.Time(), 10)
	fn := "add"
	if once {
		fn = "addonce"
	}
	keys := []string{a.s.keys.audit(), a.s.keys.auditOnce(e.EventID)}
	args := []string{ms, strconv.FormatInt(a.maxLen, 10), string(b), strconv.FormatInt(auditOnceTTL.Milliseconds(), 10)}
	if _, err := a.s.callAux(ctx, auditLibrary, fn, keys, args); err != nil {
		return fmt.Errorf("audit: valkey write failed: %s", classify(err))
	}
	return nil
}

// WriteOnce is Write at most once per event id (audit.OnceWriter): it adds
// nothing if an earlier Write or WriteOnce added the event. Every add sets
// a marker key per event (kept a week) atomically with its XADD, and
// WriteOnce checks only the marker, so no writer's clock matters.
// audit.Spool forwards through it, so an event spooled after a Write whose
// reply was lost, or forwarded again after a crash, is in the stream once.
// (An entry added before markers were set with every add is not found.)
func (a *AuditSink) WriteOnce(ctx context.Context, e audit.Event) error {
	return a.write(ctx, e, true)
}

// auditReadBatch is the XRANGE page size of Read.
const auditReadBatch = 256

// Read returns up to limit stored events matching f, in stream (arrival)
// order. A limit of zero or less means audit.DefaultReadLimit; more than
// audit.MaxReadLimit is capped (audit.ReadLimit). A stored entry that is
// not exactly one field "e" holding an event that decodes strictly
// (audit.Unmarshal) fails the read.
//
// Filter.Since keeps events whose event id time is at or after Since, as
// for bolt.AuditSink. Filter.After continues a listing: pass the event id
// of the last event of one page to read the next. Because several writers
// append to one stream, arrival order is not event-id order; After is
// therefore a position: Read finds the entry holding that event and
// returns what was appended after it (an event written late is not
// skipped). An entry's id time is never before its event's time, so both
// Since and After start the scan at their time with XRANGE; the entry
// holding After is looked for up to a minute of stream time past it (clock
// skew between writers). If it is not found there (trimmed by the cap, or
// never written), Read falls back to keeping events whose id sorts after
// After, as bolt.AuditSink does.
func (a *AuditSink) Read(ctx context.Context, f audit.Filter, limit int) ([]audit.Event, error) {
	limit = audit.ReadLimit(limit)
	var startMs, sinceMs uint64
	if !f.Since.IsZero() && f.Since.UnixMilli() > 0 {
		sinceMs = uint64(f.Since.UnixMilli())
		startMs = sinceMs
	}
	var afterMs uint64
	if f.After != "" {
		id, err := ulid.ParseStrict(f.After)
		if err != nil {
			return nil, errors.New("audit: read: after is not an event id")
		}
		afterMs = id.Time()
		startMs = max(startMs, afterMs)
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return nil, audit.ErrClosed
	}
	if a.s.closed.Load() {
		return nil, errors.New("audit: read: store is closed")
	}
	ctx, cancel := bounded(ctx, auditCallTimeout)
	defer cancel()

	start := "-"
	if startMs > 0 {
		start = strconv.FormatUint(startMs, 10) + "-0"
	}
	// With After, the scan starts seeking the entry that holds it,
	// collecting the lexicographic fallback meanwhile; once found, every
	// later entry counts (positional); past the seek window without it,
	// the fallback applies (lexical).
	const (
		plain = iota
		seeking
		positional
		lexical
	)
	mode := plain
	if f.After != "" {
		mode = seeking
	}
	seekEnd := afterMs + uint64(auditSeekWindow.Milliseconds())
	var out, candidates []audit.Event
	keep := func(e *audit.Event) bool {
		return f.Matches(e) && (sinceMs == 0 || eventMs(e.EventID) >= sinceMs)
	}
	cl := a.s.client
	for len(out) < limit {
		entries, err := cl.Do(ctx, cl.B().Xrange().Key(a.s.keys.audit()).Start(start).End("+").Count(auditReadBatch).Build()).ToArray()
		if err != nil {
			return nil, fmt.Errorf("audit: read: %s", classify(err))
		}
		for _, m := range entries {
			sid, e, err := decodeAuditEntry(m)
			if err != nil {
				return nil, err
			}
			start = "(" + sid
			if mode == seeking {
				switch {
				case streamMs(sid) > seekEnd:
					mode, out, candidates = lexical, candidates, nil
				case e.EventID == f.After:
					mode, candidates = positional, nil
					continue
				default:
					if e.EventID > f.After && len(candidates) < limit && keep(&e) {
						candidates = append(candidates, e)
					}
					continue
				}
			}
			if len(out) == limit {
				break
			}
			if (mode != lexical || e.EventID > f.After) && keep(&e) {
				out = append(out, e)
			}
		}
		if len(entries) < auditReadBatch {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("audit: read: %w", err)
		}
	}
	if mode == seeking {
		out = candidates // the stream ended before the entry was found
	}
	return out, nil
}

// decodeAuditEntry strictly decodes one XRANGE entry: [id, ["e", event]].
func decodeAuditEntry(m vk.ValkeyMessage) (string, audit.Event, error) {
	parts, err := m.ToArray()
	if err != nil || len(parts) != 2 {
		return "", audit.Event{}, errors.New("audit: read: malformed stream entry")
	}
	sid, err := parts[0].ToString()
	if err != nil || !validStreamID(sid) {
		return "", audit.Event{}, errors.New("audit: read: malformed stream entry id")
	}
	fv, err := parts[1].ToArray()
	if err != nil || len(fv) != 2 {
		return "", audit.Event{}, fmt.Errorf("audit: read: stored entry %s: not exactly one field", sid)
	}
	name, err1 := fv[0].ToString()
	raw, err2 := fv[1].ToString()
	if err1 != nil || err2 != nil || name != "e" {
		return "", audit.Event{}, fmt.Errorf("audit: read: stored entry %s: unexpected field", sid)
	}
	e, err := audit.Unmarshal([]byte(raw))
	if err != nil {
		return "", audit.Event{}, fmt.Errorf("audit: read: stored entry %s: %w", sid, err)
	}
	return sid, e, nil
}

func validStreamID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}

// streamMs is the time part of a (valid) stream entry id.
func streamMs(id string) uint64 {
	ms, _, _ := strings.Cut(id, "-")
	v, _ := strconv.ParseUint(ms, 10, 64)
	return v
}

// eventMs is the time of a (validated) event id.
func eventMs(id string) uint64 {
	u, err := ulid.ParseStrict(id)
	if err != nil {
		return 0
	}
	return u.Time()
}

// Close marks the sink closed; later calls fail with audit.ErrClosed. The
// shared connection stays open (the Store owns it).
func (a *AuditSink) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return nil
}
