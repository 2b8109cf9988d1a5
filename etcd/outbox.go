package etcd

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/lease"
)

var (
	_ lease.Outbox            = (*Store)(nil)
	_ lease.OutboxDeadLetters = (*Store)(nil)
	_ lease.OutboxMeter       = (*Store)(nil)

	_ lease.OutboxDeadLetterAdmin = (*Store)(nil)
)

// The pending outbox's usage (entries, bytes) is one key, meta/outbox_usage,
// changed in the same transaction as every entry that enters or leaves, so
// a commit checks the bounds without a range read. Every publication reads
// and writes it (and the sequence): publications serialize on it, which
// the compare-and-retry of change absorbs.

// outboxUsageOf is the pending outbox's usage in attempt t: the usage key,
// or, where it is missing while entries were ever appended or malformed,
// a recount of the entries at the attempt's revision. The recount is as
// current as the key would be: every change to the entries writes the
// key, which the attempt compares.
func (s *Store) outboxUsageOf(t *txn) (pending, bytes int64, err error) {
	if err := t.fetch(s.keys.outboxUsage(), s.keys.outboxSeq()); err != nil {
		return 0, 0, err
	}
	v := t.writes[s.keys.outboxUsage()]
	if v == nil {
		v = t.seen[s.keys.outboxUsage()].val
	}
	if len(v) == 16 {
		pending, bytes = usage(v)
		return pending, bytes, nil
	}
	if v == nil && t.seen[s.keys.outboxSeq()].val == nil {
		return 0, 0, nil // nothing was ever appended
	}
	s.log.Warn("the outbox usage counter is missing or malformed; recounting the pending entries")
	from := s.keys.outboxPrefix()
	for {
		ctx, cancel := s.bound(t.ctx)
		r, err := s.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.keys.outboxPrefix())),
			clientv3.WithRev(t.rev), clientv3.WithLimit(500))
		cancel()
		if err != nil {
			return 0, 0, errRead{err}
		}
		for _, kv := range r.Kvs {
			pending++
			bytes += lease.OutboxEntrySize(kv.Value)
		}
		if !r.More || len(r.Kvs) == 0 {
			return pending, bytes, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
}

// usage decodes the usage key: 16 bytes, pending then bytes.
func usage(v []byte) (pending, bytes int64) {
	if len(v) != 16 {
		return 0, 0
	}
	return int64(binary.BigEndian.Uint64(v[:8])), int64(binary.BigEndian.Uint64(v[8:]))
}

func encodeUsage(pending, bytes int64) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(max(pending, 0)))
	return binary.BigEndian.AppendUint64(b, uint64(max(bytes, 0)))
}

// outboxRoom is an admitted publication's place: the usage before it.
type outboxRoom struct{ pending, bytes int64 }

// outboxRoomFor checks the outbox's bounds for m in attempt t (a refusal
// when full).
func (s *Store) outboxRoomFor(t *txn, m *lease.OutboxMessage, now lease.Timestamp) (*outboxRoom, error) {
	pending, bytes, err := s.outboxUsageOf(t)
	if err != nil {
		return nil, err
	}
	if full := s.opts.OutboxRoom(pending, bytes, m.Size()); full != nil {
		full.BackendTime = now.Time()
		return nil, refuse(full)
	}
	return &outboxRoom{pending: pending, bytes: bytes}, nil
}

// putOutbox appends an accepted publication, in the commit's transaction.
func (s *Store) putOutbox(t *txn, room *outboxRoom, e lease.OutboxEntry) error {
	b, err := lease.EncodeOutboxEntry(e)
	if err != nil {
		return err
	}
	pending, bytes := room.pending+1, room.bytes+e.Message.Size()
	// A message id is pending already only if its commit's evidence
	// expired while the entry waited and the same commit id was accepted
	// again: the new entry replaces the old one.
	idKey := s.keys.outboxID(e.MessageID)
	old, err := t.get(idKey)
	if err != nil {
		return err
	}
	if old != nil {
		oldKey := s.keys.outboxPrefix() + string(old)
		raw, err := t.get(oldKey)
		if err != nil {
			return err
		}
		if raw != nil && !lease.OutboxEntryOfAnother(raw, e.MessageID) {
			pending, bytes = pending-1, bytes-lease.OutboxEntrySize(raw)
			t.del(oldKey)
		}
	}
	seq, ok, err := t.getU64(s.keys.outboxSeq())
	if err != nil {
		return err
	}
	if !ok {
		return s.quarantine(t, "", lease.Identity{}, "outbox sequence is malformed")
	}
	seq++
	t.put(s.keys.outboxSeq(), u64(seq))
	t.put(s.keys.outbox(seq), b)
	t.put(idKey, []byte(hex16(seq)))
	t.put(s.keys.outboxUsage(), encodeUsage(pending, bytes))
	return nil
}

// rangeRead is a linearizable range read of the prefix's first limit keys
// in key order, starting at from (inclusive).
func (s *Store) rangeRead(ctx context.Context, from, prefix string, limit int64) (*clientv3.GetResponse, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(limit))
	if err != nil {
		return nil, s.failure(err, false)
	}
	return r, nil
}

// getOne is a linearizable read of one key (nil if absent).
func (s *Store) getOne(ctx context.Context, key string) ([]byte, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, s.failure(err, false)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	return r.Kvs[0].Value, nil
}

// OutboxPending returns up to limit entries, oldest accepted first. A
// corrupt entry fails the call closed rather than being skipped.
func (s *Store) OutboxPending(ctx context.Context, limit int) ([]lease.OutboxEntry, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	r, err := s.rangeRead(ctx, s.keys.outboxPrefix(), s.keys.outboxPrefix(), int64(limit))
	if err != nil {
		return nil, err
	}
	out := make([]lease.OutboxEntry, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		e, err := lease.DecodeOutboxEntry(kv.Value)
		if err != nil {
			return nil, lease.CorruptState(s.log, lease.Identity{}, "outbox entry is corrupt")
		}
		out = append(out, e)
	}
	return out, nil
}

// OutboxDone removes an entry once the broker confirmed it.
func (s *Store) OutboxDone(ctx context.Context, messageID string) error {
	_, err := change(s, ctx, func(t *txn) (struct{}, error) {
		_, raw, key, err := s.pendingEntry(t, messageID)
		if err != nil || key == "" {
			return struct{}{}, err
		}
		return struct{}{}, s.leaveOutbox(t, messageID, key, lease.OutboxEntrySize(raw))
	})
	return err
}

// pendingEntry finds the pending entry of messageID in attempt t: its
// key is "" if it is not pending (a stale id entry is then removed).
func (s *Store) pendingEntry(t *txn, messageID string) (idKey string, raw []byte, key string, err error) {
	idKey = s.keys.outboxID(messageID)
	if err := t.fetch(idKey, s.keys.outboxUsage(), s.keys.gate()); err != nil {
		return "", nil, "", err
	}
	// A closed namespace (restored, awaiting verification) changes
	// nothing, its outbox included: the relay waits.
	if gate := t.seen[s.keys.gate()].val; gate != nil {
		return "", nil, "", lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed: %s", gate)
	}
	seq := t.seen[idKey].val
	if seq == nil {
		return idKey, nil, "", nil
	}
	key = s.keys.outboxPrefix() + string(seq)
	if raw, err = t.get(key); err != nil {
		return "", nil, "", err
	}
	if raw == nil || lease.OutboxEntryOfAnother(raw, messageID) {
		t.del(idKey)
		return idKey, nil, "", nil
	}
	return idKey, raw, key, nil
}

// leaveOutbox removes a pending entry of size bytes and its id.
func (s *Store) leaveOutbox(t *txn, messageID, key string, size int64) error {
	pending, bytes, err := s.outboxUsageOf(t)
	if err != nil {
		return err
	}
	t.put(s.keys.outboxUsage(), encodeUsage(pending-1, bytes-size))
	t.del(key)
	t.del(s.keys.outboxID(messageID))
	return nil
}

// OutboxLen counts the pending entries (for the relay's backlog metric).
func (s *Store) OutboxLen(ctx context.Context) (int64, error) {
	u, err := s.OutboxUsage(ctx)
	return u.Pending, err
}

// OutboxUsage reads the pending outbox's counters and bounds.
func (s *Store) OutboxUsage(ctx context.Context) (lease.OutboxUsage, error) {
	u := lease.OutboxUsage{MaxPending: s.opts.OutboxMaxPending, MaxBytes: s.opts.OutboxMaxBytes}
	v, err := s.getOne(ctx, s.keys.outboxUsage())
	u.Pending, u.Bytes = usage(v)
	return u, err
}

// OutboxDeadLetter moves a pending entry to the dead letters, with its
// reason, in one transaction. Nothing is dropped: with
// MaxOutboxDeadLetters held it refuses and the entry stays pending.
func (s *Store) OutboxDeadLetter(ctx context.Context, messageID, reason string) error {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return err
	}
	_, err := change(s, ctx, func(t *txn) (struct{}, error) {
		_, raw, key, err := s.pendingEntry(t, messageID)
		if err != nil || key == "" {
			return struct{}{}, err
		}
		if err := t.fetch(s.keys.deadSeq(), s.keys.deadCount()); err != nil {
			return struct{}{}, err
		}
		n, _ := readU64(t.seen[s.keys.deadCount()].val)
		if n >= lease.MaxOutboxDeadLetters {
			return struct{}{}, refuse(lease.DeadLettersFull())
		}
		e, err := lease.DecodeOutboxEntry(raw)
		if err != nil {
			return struct{}{}, refuse(lease.CorruptState(s.log, lease.Identity{}, "outbox entry is corrupt"))
		}
		b, err := json.Marshal(lease.DeadLetter{Entry: e, Reason: lease.CutDeadLetterReason(reason), DeadAt: lease.UnixMilli(s.clock())})
		if err != nil {
			return struct{}{}, err
		}
		dseq, _ := readU64(t.seen[s.keys.deadSeq()].val)
		dseq++
		t.put(s.keys.deadSeq(), u64(dseq))
		t.put(s.keys.deadCount(), u64(n+1))
		t.put(s.keys.dead(dseq), b)
		return struct{}{}, s.leaveOutbox(t, messageID, key, e.Message.Size())
	})
	return err
}

// OutboxDeadLetters returns up to limit dead letters, oldest first.
func (s *Store) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	r, err := s.rangeRead(ctx, s.keys.deadPrefix(), s.keys.deadPrefix(), int64(limit))
	if err != nil {
		return nil, err
	}
	out := make([]lease.DeadLetter, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		var d lease.DeadLetter
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			return nil, &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox dead letter is corrupt; failing closed"}
		}
		out = append(out, d)
	}
	return out, nil
}

// OutboxDeadLen counts the dead letters.
func (s *Store) OutboxDeadLen(ctx context.Context) (int64, error) {
	v, err := s.getOne(ctx, s.keys.deadCount())
	n, _ := readU64(v)
	return int64(n), err
}

// deadLetterPage bounds the dead letters one read of a scan holds: one is
// up to about 110 KiB (a 64 KiB body in base64 and 16 KiB of headers).
const deadLetterPage = 64

// foundDead is the dead letter of a message id found in an attempt.
type foundDead struct {
	key   string
	d     lease.DeadLetter
	count uint64 // the dead letters held, this one included
}

// findDeadLetter finds the dead letter of messageID in attempt t, whose
// first fetch read the dead-letter count: nil if there is none. Dead
// letters are keyed by sequence, not message id, so it scans od/ at the
// attempt's revision, oldest first, a page at a time. Should one message
// id have two dead letters (only damage makes two: a requeue removes the
// first before the entry can be set aside again), the oldest is acted
// on, the one set aside first: the scan stops at it. Only its key joins
// the compare; the rest of the scan is as current as the count, which
// every change to the dead letters writes and the attempt compares.
func (s *Store) findDeadLetter(t *txn, messageID string) (*foundDead, error) {
	n, ok := readU64(t.seen[s.keys.deadCount()].val)
	prefix := s.keys.deadPrefix()
	from := prefix
	for first := true; ; first = false {
		ctx, cancel := s.bound(t.ctx)
		r, err := s.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
			clientv3.WithRev(t.rev), clientv3.WithLimit(deadLetterPage))
		cancel()
		if err != nil {
			return nil, errRead{err}
		}
		if first && (!ok || n == 0) {
			// A count that is missing or malformed while dead letters
			// exist: the range's own count is exact at this revision.
			n = uint64(r.Count)
		}
		for _, kv := range r.Kvs {
			mine, err := deadLetterOf(kv.Value, messageID)
			if err != nil {
				return nil, refuse(lease.CorruptState(s.log, lease.Identity{}, "outbox dead letter is corrupt"))
			}
			if !mine {
				continue
			}
			var d lease.DeadLetter
			if err := json.Unmarshal(kv.Value, &d); err != nil || d.Entry.MessageID != messageID {
				return nil, refuse(lease.CorruptState(s.log, lease.Identity{}, "outbox dead letter is corrupt"))
			}
			key := string(kv.Key)
			t.seen[key] = seenKey{val: kv.Value, mod: kv.ModRevision} // compared at commit, as if fetched
			return &foundDead{key: key, d: d, count: max(n, 1)}, nil
		}
		if !r.More || len(r.Kvs) == 0 {
			return nil, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
}

// deadLetterOf reports whether stored dead letter raw is messageID's. One
// that begins with its message id as json.Marshal writes it (the entry's
// first member; message ids need no escaping) is read in place, so a scan
// does not decode every 64 KiB body; anything else is decoded, and one
// that does not decode is an error: it may be messageID's, older than any
// found after it.
func deadLetterOf(raw []byte, messageID string) (bool, error) {
	if rest, ok := bytes.CutPrefix(raw, []byte(`{"entry":{"message_id":"`)); ok {
		if id, _, ok := bytes.Cut(rest, []byte(`"`)); ok && bytes.IndexByte(id, '\\') < 0 {
			return string(id) == messageID, nil
		}
	}
	var d lease.DeadLetter
	if err := json.Unmarshal(raw, &d); err != nil {
		return false, err
	}
	return d.Entry.MessageID == messageID, nil
}

// openDeadLetters begins an attempt on the dead letters: one read of the
// keys it decides on, at the attempt's revision, and the namespace's gate.
func (s *Store) openDeadLetters(t *txn, more ...string) error {
	if err := t.fetch(append([]string{s.keys.gate(), s.keys.deadCount()}, more...)...); err != nil {
		return err
	}
	if gate := t.seen[s.keys.gate()].val; gate != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed: %s", gate)
	}
	return nil
}

// OutboxRequeueDeadLetter moves dead letter messageID back into the
// pending outbox, after every entry pending, in one transaction: the
// entry is appended as the commit appends a publication (sequence, id
// entry, usage), within the same bounds.
func (s *Store) OutboxRequeueDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	return change(s, ctx, func(t *txn) (lease.DeadLetter, error) {
		if err := s.openDeadLetters(t, s.keys.outboxSeq(), s.keys.outboxUsage(), s.keys.outboxID(messageID)); err != nil {
			return lease.DeadLetter{}, err
		}
		f, err := s.findDeadLetter(t, messageID)
		switch {
		case err != nil:
			return lease.DeadLetter{}, err
		case f == nil:
			return lease.DeadLetter{}, refuse(lease.NoDeadLetter())
		}
		// The entry re-enters the pending outbox, which the relay reads
		// strictly: one that would not decode there fails here.
		if b, err := lease.EncodeOutboxEntry(f.d.Entry); err != nil {
			return lease.DeadLetter{}, refuse(lease.CorruptState(s.log, lease.Identity{}, "outbox dead letter is corrupt"))
		} else if _, err := lease.DecodeOutboxEntry(b); err != nil {
			return lease.DeadLetter{}, refuse(lease.CorruptState(s.log, lease.Identity{}, "outbox dead letter is corrupt"))
		}
		_, _, pending, err := s.pendingEntry(t, messageID)
		switch {
		case err != nil:
			return lease.DeadLetter{}, err
		case pending != "":
			return lease.DeadLetter{}, refuse(lease.DeadLetterPending())
		}
		room, err := s.outboxRoomFor(t, &f.d.Entry.Message, lease.UnixMilli(s.clock()))
		if err != nil {
			// Not committed as a refusal: a stale id entry pendingEntry
			// dropped stays, so a refusal changes nothing.
			if r, ok := err.(refusal); ok {
				return lease.DeadLetter{}, r.err
			}
			return lease.DeadLetter{}, err
		}
		if err := s.putOutbox(t, room, f.d.Entry); err != nil {
			return lease.DeadLetter{}, err
		}
		t.del(f.key)
		t.put(s.keys.deadCount(), u64(f.count-1))
		return f.d, nil
	})
}

// OutboxDiscardDeadLetter removes dead letter messageID for good, in one
// transaction; the pending outbox is not read or written.
func (s *Store) OutboxDiscardDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	return change(s, ctx, func(t *txn) (lease.DeadLetter, error) {
		if err := s.openDeadLetters(t); err != nil {
			return lease.DeadLetter{}, err
		}
		f, err := s.findDeadLetter(t, messageID)
		switch {
		case err != nil:
			return lease.DeadLetter{}, err
		case f == nil:
			return lease.DeadLetter{}, refuse(lease.NoDeadLetter())
		}
		t.del(f.key)
		t.put(s.keys.deadCount(), u64(f.count-1))
		return f.d, nil
	})
}
