package etcd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/audit"
)

// DefaultAuditMaxLen is the default cap of the audit stream.
const DefaultAuditMaxLen = 1_000_000

// AuditOptions configures an AuditSink.
type AuditOptions struct {
	// MaxLen caps the stream: an append that takes it past MaxLen removes
	// the oldest entries in the same transaction. Zero means
	// DefaultAuditMaxLen. A cap lowered below the stream's length is
	// reached gradually, auditTrimExtra entries per append.
	MaxLen int64
}

// Audit keys: audit/head is the stream's head (auditHead), audit/e/<pos>
// an entry holding exactly the bytes of audit.Marshal, audit/id/<event id>
// the marker of the event's newest entry, holding its pos. A pos is
// <16 hex ms>/<16 hex seq>/<event id>: keys sort in append order, and the
// ms part lets Since start a scan near its time.
func (l layout) auditHead() string                 { return l.p + "audit/head" }
func (l layout) auditEntries() string              { return l.p + "audit/e/" }
func (l layout) auditMarker(eventID string) string { return l.p + "audit/id/" + eventID }

// auditHead is the head of the stream: the last sequence number given,
// the ms of the newest entry and the number of entries, as three 8-byte
// big-endian numbers. Every append reads and rewrites it, so appends are
// ordered by it and one that lost the race reads afresh.
type auditHead struct{ seq, ms, count uint64 }

func (h auditHead) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, h.seq)
	b = binary.BigEndian.AppendUint64(b, h.ms)
	return binary.BigEndian.AppendUint64(b, h.count)
}

func decodeAuditHead(v []byte) (auditHead, bool) {
	if len(v) != 24 {
		return auditHead{}, false
	}
	return auditHead{binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), binary.BigEndian.Uint64(v[16:])}, true
}

func auditPos(ms, seq uint64, eventID string) string {
	return hex16(ms) + "/" + hex16(seq) + "/" + eventID
}

// parseAuditPos reads a pos; ok is false if it is malformed.
func parseAuditPos(pos string) (ms uint64, eventID string, ok bool) {
	parts := strings.Split(pos, "/")
	if len(parts) != 3 || len(parts[0]) != 16 || len(parts[1]) != 16 {
		return 0, "", false
	}
	ms, err1 := strconv.ParseUint(parts[0], 16, 64)
	_, err2 := strconv.ParseUint(parts[1], 16, 64)
	if err1 != nil || err2 != nil || auditEventMs(parts[2]) == 0 {
		return 0, "", false
	}
	return ms, parts[2], true
}

// auditEventMs is the time of an event id, 0 if it is not a ULID.
func auditEventMs(id string) uint64 {
	u, err := ulid.ParseStrict(id)
	if err != nil {
		return 0
	}
	return u.Time()
}

const (
	// auditBatch and auditBatchBytes bound one append transaction: with
	// the trimming they stay well inside etcd's default limits (128
	// operations and 1.5 MiB a request).
	auditBatch      = 16
	auditBatchBytes = 512 << 10
	// auditTrimExtra is how many entries beyond its own an append may
	// remove, so a lowered cap is reached.
	auditTrimExtra = 8
	// auditReadBatch is the range read page size of Read.
	auditReadBatch = 256
)

// AuditSink is audit.Sink on the lease backend's etcd cluster: a capped,
// append-only stream under the prefix's audit/ keys that every server
// sharing the cluster writes, its entries in append order. Each event is
// one entry holding exactly the bytes of audit.Marshal, added in a
// transaction that compares the head it read, together with the event's
// marker, the new head and, past the cap, the removal of the oldest
// entries and their markers. Write returns nil only once that transaction
// committed: etcd acknowledges a write once a quorum of members has it in
// its fsynced log, so an acknowledged event survives a crash and the loss
// of any minority of members. A failed Write means the event may or may
// not be stored: force-release and revoke then report failure, and a
// retried event may appear twice (same event id).
//
// Concurrent writes of one sink are grouped: while one transaction is in
// flight the next events queue, and go in the next transaction together
// (up to auditBatch), so the head is contended only between servers.
// Safe for concurrent use.
type AuditSink struct {
	s      *Store
	maxLen uint64

	mu       sync.Mutex
	queue    []*auditAdd
	flushing bool
	closed   bool
	wg       sync.WaitGroup // the flusher
}

// auditAdd is one queued event and where its writer waits for the result.
type auditAdd struct {
	id   string
	ms   uint64
	raw  []byte
	once bool
	done chan error
}

var (
	_ audit.Sink       = (*AuditSink)(nil)
	_ audit.OnceWriter = (*AuditSink)(nil)
)

// AuditSink returns the audit sink in s's prefix, on s's client. Closing it
// does not close s.
func (s *Store) AuditSink(o AuditOptions) *AuditSink {
	if o.MaxLen <= 0 {
		o.MaxLen = DefaultAuditMaxLen
	}
	return &AuditSink{s: s, maxLen: uint64(o.MaxLen)}
}

// Write validates e and appends it; see AuditSink.
func (a *AuditSink) Write(ctx context.Context, e audit.Event) error {
	return a.write(ctx, e, false)
}

// WriteOnce is Write at most once per event id (audit.OnceWriter): it adds
// nothing if the stream holds a marker of the event, which every add
// writes in the same transaction as the entry. The check and the add are
// one transaction, so it depends on no clock. audit.Spool forwards through
// it, so an event spooled after a Write whose reply was lost, or forwarded
// again after a crash, is in the stream once (unless the cap has removed
// the earlier entry, and its marker with it).
func (a *AuditSink) WriteOnce(ctx context.Context, e audit.Event) error {
	return a.write(ctx, e, true)
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
	w := &auditAdd{id: e.EventID, ms: id.Time(), raw: b, once: once, done: make(chan error, 1)}
	a.mu.Lock()
	switch {
	case a.closed:
		a.mu.Unlock()
		return audit.ErrClosed
	case a.s.closed.Load():
		a.mu.Unlock()
		return errors.New("audit: etcd sink: store is closed")
	}
	a.queue = append(a.queue, w)
	if !a.flushing {
		a.flushing = true
		a.wg.Add(1)
		go a.flush()
	}
	a.mu.Unlock()
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("audit: etcd write: %w (the event may still be added)", ctx.Err())
	}
}

// flush appends the queued events, a batch per transaction, until none
// is left.
func (a *AuditSink) flush() {
	defer a.wg.Done()
	for {
		a.mu.Lock()
		n, size := 0, 0
		for n < len(a.queue) && n < auditBatch && (n == 0 || size+len(a.queue[n].raw) <= auditBatchBytes) {
			size += len(a.queue[n].raw)
			n++
		}
		if n == 0 {
			a.flushing = false
			a.mu.Unlock()
			return
		}
		batch := append([]*auditAdd(nil), a.queue[:n]...)
		a.queue = a.queue[n:]
		a.mu.Unlock()
		err := a.append(batch)
		for _, w := range batch {
			w.done <- err
		}
	}
}

// append adds batch in one transaction, reading afresh while another
// server's append gets there first, within the store's call timeout.
func (a *AuditSink) append(batch []*auditAdd) error {
	ctx, cancel := a.s.bound(context.Background())
	defer cancel()
	for n := 0; ; n++ {
		ok, err := a.tryAppend(ctx, batch)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("audit: etcd write: lost to concurrent writers until the deadline")
		case <-time.After(min(time.Duration(n+1)*time.Millisecond, retryPause)):
		}
	}
}

// tryAppend is one attempt of append: false if the head (or a marker it
// read) changed before the commit, nothing written.
func (a *AuditSink) tryAppend(ctx context.Context, batch []*auditAdd) (bool, error) {
	k := a.s.keys
	fail := func(what string, err error) error {
		return fmt.Errorf("audit: etcd write failed (%s): %s", what, classify(err))
	}
	// One round trip at one revision: the head, the batch's markers and
	// the oldest entries (keys only), in case the cap is reached.
	ids := []string{}
	seenID := map[string]bool{}
	for _, w := range batch {
		if !seenID[w.id] {
			seenID[w.id] = true
			ids = append(ids, w.id)
		}
	}
	ops := []clientv3.Op{clientv3.OpGet(k.auditHead())}
	for _, id := range ids {
		ops = append(ops, clientv3.OpGet(k.auditMarker(id)))
	}
	ops = append(ops, clientv3.OpGet(k.auditEntries(), clientv3.WithRange(clientv3.GetPrefixRangeEnd(k.auditEntries())),
		clientv3.WithKeysOnly(), clientv3.WithLimit(int64(len(batch)+auditTrimExtra))))
	r, err := a.s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, fail("read", err)
	}
	rev := r.Header.Revision
	cmps := []clientv3.Cmp{}
	var head auditHead
	if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.auditHead()), "=", 0))
	} else {
		var ok bool
		if head, ok = decodeAuditHead(kvs[0].Value); !ok {
			// Fail closed: appending over a head that does not decode
			// could reuse positions.
			return false, errors.New("audit: etcd write: the audit stream's head is malformed")
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.auditHead()), "=", kvs[0].ModRevision))
	}
	marked := map[string]bool{}
	for i, id := range ids {
		var mod int64
		if kvs := r.Responses[1+i].GetResponseRange().Kvs; len(kvs) > 0 {
			mod = kvs[0].ModRevision
			marked[id] = true
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.auditMarker(id)), "=", mod))
	}
	oldest := r.Responses[1+len(ids)].GetResponseRange().Kvs

	var writes []clientv3.Op
	added := map[string]string{} // event id → pos of its entry in this batch
	var order []string
	for _, w := range batch {
		if w.once {
			if _, dup := added[w.id]; dup || marked[w.id] {
				continue
			}
		}
		head.seq++
		head.ms = max(head.ms, w.ms)
		head.count++
		pos := auditPos(head.ms, head.seq, w.id)
		writes = append(writes, clientv3.OpPut(k.auditEntries()+pos, string(w.raw)))
		if _, ok := added[w.id]; !ok {
			order = append(order, w.id)
		}
		added[w.id] = pos
	}
	if len(writes) == 0 {
		return true, nil // every event was there already
	}
	for _, id := range order {
		writes = append(writes, clientv3.OpPut(k.auditMarker(id), added[id]))
	}

	// Past the cap, the oldest entries go, each with its marker if the
	// marker still names it (a later copy of the event keeps its own).
	trim := 0
	if head.count > a.maxLen {
		trim = int(min(head.count-a.maxLen, uint64(len(oldest))))
	}
	var trimmed []string // markers that may name a removed entry
	trimmedPos := map[string]string{}
	for _, kv := range oldest[:trim] {
		writes = append(writes, clientv3.OpDelete(string(kv.Key)))
		head.count--
		pos := string(kv.Key[len(k.auditEntries()):])
		if _, id, ok := parseAuditPos(pos); ok {
			if _, readd := added[id]; !readd {
				if _, twice := trimmedPos[id]; !twice {
					trimmed = append(trimmed, id)
				}
				trimmedPos[id] = pos
			}
		}
	}
	if len(trimmed) > 0 {
		mops := make([]clientv3.Op, len(trimmed))
		for i, id := range trimmed {
			mops[i] = clientv3.OpGet(k.auditMarker(id), clientv3.WithRev(rev))
		}
		mr, err := a.s.cli.Txn(ctx).Then(mops...).Commit()
		if err != nil {
			return false, fail("read", err)
		}
		for i, id := range trimmed {
			var mod int64
			if kvs := mr.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
				mod = kvs[0].ModRevision
				if string(kvs[0].Value) == trimmedPos[id] {
					writes = append(writes, clientv3.OpDelete(k.auditMarker(id)))
				}
			}
			if !seenID[id] {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.auditMarker(id)), "=", mod))
			}
		}
	}
	writes = append(writes, clientv3.OpPut(k.auditHead(), string(head.encode())))
	cr, err := a.s.cli.Txn(ctx).If(cmps...).Then(writes...).Commit()
	if err != nil {
		return false, fail("commit", err)
	}
	return cr.Succeeded, nil
}

// Read returns up to limit stored events matching f, in stream (append)
// order. A limit of zero or less means audit.DefaultReadLimit; more than
// audit.MaxReadLimit is capped (audit.ReadLimit). An entry whose key or
// value does not decode strictly (audit.Unmarshal), or holds another
// event than its key names, fails the read.
//
// Filter.Since keeps events whose event id time is at or after Since, as
// for bolt.AuditSink. Filter.After continues a listing: pass the event id
// of the last event of one page to read the next. Several writers append
// to one stream, so append order is not event-id order; After is
// therefore a position: Read finds the entry holding that event through
// its marker and returns what was appended after it (an event written
// late is not skipped). If the event has no marker (removed by the cap,
// or never written), Read keeps the events whose id sorts after After, as
// bolt.AuditSink does. An entry's ms is never before its event's time, so
// both Since and After start the scan at their time.
func (a *AuditSink) Read(ctx context.Context, f audit.Filter, limit int) ([]audit.Event, error) {
	limit = audit.ReadLimit(limit)
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, audit.ErrClosed
	}
	if a.s.closed.Load() {
		return nil, errors.New("audit: read: store is closed")
	}
	ctx, cancel := a.s.bound(ctx)
	defer cancel()
	prefix := a.s.keys.auditEntries()
	from := prefix
	var sinceMs uint64
	if !f.Since.IsZero() && f.Since.UnixMilli() > 0 {
		sinceMs = uint64(f.Since.UnixMilli())
		from = prefix + hex16(sinceMs)
	}
	lexical := false
	if f.After != "" {
		afterMs := auditEventMs(f.After)
		if afterMs == 0 {
			return nil, errors.New("audit: read: after is not an event id")
		}
		r, err := a.s.cli.Get(ctx, a.s.keys.auditMarker(f.After))
		if err != nil {
			return nil, fmt.Errorf("audit: read: %s", classify(err))
		}
		start := prefix + hex16(afterMs)
		if len(r.Kvs) > 0 {
			pos := string(r.Kvs[0].Value)
			if _, id, ok := parseAuditPos(pos); !ok || id != f.After {
				return nil, errors.New("audit: read: the marker of the after event is malformed")
			}
			start = prefix + pos + "\x00"
		} else {
			lexical = true
		}
		from = max(from, start)
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	out := []audit.Event{}
	for len(out) < limit {
		r, err := a.s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(auditReadBatch))
		if err != nil {
			return nil, fmt.Errorf("audit: read: %s", classify(err))
		}
		for _, kv := range r.Kvs {
			pos := string(kv.Key[len(prefix):])
			from = string(kv.Key) + "\x00"
			_, id, ok := parseAuditPos(pos)
			if !ok {
				return nil, errors.New("audit: read: malformed stream entry key")
			}
			e, err := audit.Unmarshal(kv.Value)
			if err != nil {
				return nil, fmt.Errorf("audit: read: stored entry %s: %w", pos, err)
			}
			if e.EventID != id {
				return nil, fmt.Errorf("audit: read: stored entry %s holds another event", pos)
			}
			if (lexical && e.EventID <= f.After) || (sinceMs > 0 && auditEventMs(e.EventID) < sinceMs) || !f.Matches(&e) {
				continue
			}
			out = append(out, e)
			if len(out) == limit {
				break
			}
		}
		if !r.More {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("audit: read: %w", err)
		}
	}
	return out, nil
}

// Close marks the sink closed; later calls fail with audit.ErrClosed.
// Events already queued are still appended (their writers wait for it).
// The shared client stays open (the Store owns it).
func (a *AuditSink) Close() error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.wg.Wait()
	return nil
}
