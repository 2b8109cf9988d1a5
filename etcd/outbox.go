package etcd

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"strings"

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
		dseq, n, err := s.deadMeta(t)
		if err != nil {
			return struct{}{}, err
		}
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
		dseq++
		t.put(s.keys.deadSeq(), u64(dseq))
		t.put(s.keys.deadCount(), u64(n+1))
		t.put(s.keys.dead(dseq), b)
		return struct{}{}, s.leaveOutbox(t, messageID, key, e.Message.Size())
	})
	return err
}

// deadMeta is the last dead-letter sequence given and the dead letters
// held, for a new dead letter in attempt t, which fetched both keys (so a
// concurrent change, which writes them, fails its compare). They are read
// from the dead letters themselves, at the attempt's revision: the last
// key's sequence if the sequence key is behind it (missing, malformed or
// damaged, its restart would overwrite a dead letter), and the range's
// own count (a damaged count would lift the bound).
func (s *Store) deadMeta(t *txn) (seq, n uint64, err error) {
	prefix := s.keys.deadPrefix()
	ctx, cancel := s.bound(t.ctx)
	defer cancel()
	r, err := s.cli.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithRev(t.rev),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, 0, errRead{err}
	}
	seq, _ = readU64(t.seen[s.keys.deadSeq()].val)
	if len(r.Kvs) == 1 {
		last, err := strconv.ParseUint(strings.TrimPrefix(string(r.Kvs[0].Key), prefix), 16, 64)
		if err != nil {
			return 0, 0, refuse(lease.CorruptState(s.log, lease.Identity{}, "outbox dead-letter key is malformed"))
		}
		seq = max(seq, last)
	}
	return seq, uint64(r.Count), nil
}

// OutboxDeadLetters returns up to limit dead letters, oldest first. One
// whose value does not decode is listed as damaged (named if its message
// id can be read) instead of failing the listing: the operator needs it
// listed to discard it.
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
		out = append(out, s.readDeadLetter(string(kv.Key), kv.Value))
	}
	return out, nil
}

// OutboxDeadLen counts the dead letters.
func (s *Store) OutboxDeadLen(ctx context.Context) (int64, error) {
	v, err := s.getOne(ctx, s.keys.deadCount())
	n, _ := readU64(v)
	return int64(n), err
}

// readDeadLetter is the dead letter at key, holding raw
// (lease.DecodeDeadLetter): a damaged one is named by the message id at
// its start, else by its key's sequence, the name a discard takes.
func (s *Store) readDeadLetter(key string, raw []byte) lease.DeadLetter {
	return lease.DecodeDeadLetter(raw, strings.TrimPrefix(key, s.keys.deadPrefix()))
}

// nameAt is the name readDeadLetter gives the dead letter at key, read in
// place where the value starts as json.Marshal writes it, so a scan need
// not decode every 64 KiB body.
func (s *Store) nameAt(key string, raw []byte) string {
	if id, ok := lease.DeadLetterID(raw); ok {
		return id
	}
	return s.readDeadLetter(key, raw).Entry.MessageID
}

// deadLetterPage bounds the dead letters one read of a scan holds: one is
// up to about 110 KiB (a 64 KiB body in base64 and 16 KiB of headers).
const deadLetterPage = 64

// deadLetterSeek finds the oldest dead letter of one message id across
// the attempts of one transaction. Dead letters are keyed by sequence,
// not message id, so the first attempt scans od/ at its revision, oldest
// first, and later attempts read only the key it found: rescanning in
// every attempt lost every compare to publication traffic (each one
// writes the outbox keys a requeue compares). The key found stays the
// id's oldest: a dead letter is never rewritten in place, and a new one
// takes a higher sequence than any held, so none can come before it.
type deadLetterSeek struct {
	messageID string
	from      string // where a scan starts: no key before it names the id
	key       string // the dead letter found, "" before a scan
}

func (s *Store) seekDeadLetter(messageID string) *deadLetterSeek {
	f := &deadLetterSeek{messageID: messageID, from: s.keys.deadPrefix()}
	if token, ok := lease.DamagedDeadLetterToken(messageID); ok {
		// Named by its key: read there, and nowhere else.
		f.key, f.from = s.keys.deadPrefix()+token, s.keys.deadPrefix()+"\xff"
	}
	return f
}

// keys is what an attempt fetches of the seek (with its other keys, in
// one round trip).
func (f *deadLetterSeek) keys() []string {
	if f.key == "" {
		return nil
	}
	return []string{f.key}
}

// findDeadLetter returns the key and value of the oldest dead letter of
// f's message id in attempt t ("", nil: none), entered in the attempt's
// reads so the commit compares it. Values naming another id are passed
// over, damaged or not. So are values naming none, by a requeue too:
// one may be this id's own older dead letter, but it can never be
// requeued (there is no entry to requeue), so passing over it cannot
// publish the message twice, while failing closed on it would block
// every later requeue until someone edits etcd by hand.
func (s *Store) findDeadLetter(t *txn, f *deadLetterSeek) (string, []byte, error) {
	if f.key != "" {
		raw, err := t.get(f.key)
		if err != nil {
			return "", nil, err
		}
		if raw != nil && s.nameAt(f.key, raw) == f.messageID {
			return f.key, raw, nil
		}
		// Requeued or discarded by someone else since. Rather than
		// answer NoDeadLetter outright, which may be false (damage can
		// leave a younger dead letter of the id, or the entry was set
		// aside again), the scan goes on past it at this attempt's
		// revision. Each such scan starts where the last one stopped,
		// so together they read od/ once.
		f.from, f.key = f.key+"\x00", ""
	}
	prefix := s.keys.deadPrefix()
	for {
		ctx, cancel := s.bound(t.ctx)
		r, err := s.cli.Get(ctx, f.from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
			clientv3.WithRev(t.rev), clientv3.WithLimit(deadLetterPage))
		cancel()
		if err != nil {
			return "", nil, errRead{err}
		}
		for _, kv := range r.Kvs {
			if s.nameAt(string(kv.Key), kv.Value) == f.messageID {
				f.key = string(kv.Key)
				t.seen[f.key] = seenKey{val: kv.Value, mod: kv.ModRevision} // compared at commit, as if fetched
				return f.key, kv.Value, nil
			}
		}
		if !r.More || len(r.Kvs) == 0 {
			return "", nil, nil
		}
		f.from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
}

// deadCountOf is the dead letters held in attempt t, which found one: the
// count key, or where it is missing, malformed or zero, the range's own
// count at the attempt's revision, as current as the key would be (every
// change to the dead letters writes the key, which the attempt compares).
func (s *Store) deadCountOf(t *txn) (uint64, error) {
	if n, ok := readU64(t.seen[s.keys.deadCount()].val); ok && n > 0 {
		return n, nil
	}
	ctx, cancel := s.bound(t.ctx)
	defer cancel()
	prefix := s.keys.deadPrefix()
	r, err := s.cli.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithRev(t.rev), clientv3.WithCountOnly())
	if err != nil {
		return 0, errRead{err}
	}
	return max(uint64(r.Count), 1), nil
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

// foundDeadLetter opens attempt t on the dead letters, fetching the keys
// more too, and finds f's: its key and value, or the refusal NoDeadLetter.
func (s *Store) foundDeadLetter(t *txn, f *deadLetterSeek, more ...string) (string, []byte, error) {
	if err := s.openDeadLetters(t, append(f.keys(), more...)...); err != nil {
		return "", nil, err
	}
	key, raw, err := s.findDeadLetter(t, f)
	if err == nil && key == "" {
		err = refuse(lease.NoDeadLetter())
	}
	return key, raw, err
}

// removeDeadLetter removes the dead letter at key in attempt t.
func (s *Store) removeDeadLetter(t *txn, key string) error {
	n, err := s.deadCountOf(t)
	if err != nil {
		return err
	}
	t.del(key)
	t.put(s.keys.deadCount(), u64(n-1))
	return nil
}

// OutboxRequeueDeadLetter moves dead letter messageID back into the
// pending outbox, after every entry pending, in one transaction: the
// entry is appended as the commit appends a publication (sequence, id
// entry, usage), within the same bounds. A damaged dead letter is
// refused: only its message id is known.
func (s *Store) OutboxRequeueDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	f := s.seekDeadLetter(messageID)
	return change(s, ctx, func(t *txn) (lease.DeadLetter, error) {
		key, raw, err := s.foundDeadLetter(t, f, s.keys.outboxSeq(), s.keys.outboxUsage(), s.keys.outboxID(messageID))
		if err != nil {
			return lease.DeadLetter{}, err
		}
		d := s.readDeadLetter(key, raw)
		if err := lease.CheckRequeue(d); err != nil {
			return lease.DeadLetter{}, refuse(err)
		}
		_, _, pending, err := s.pendingEntry(t, messageID)
		switch {
		case err != nil:
			return lease.DeadLetter{}, err
		case pending != "":
			return lease.DeadLetter{}, refuse(lease.DeadLetterPending())
		}
		room, err := s.outboxRoomFor(t, &d.Entry.Message, lease.UnixMilli(s.clock()))
		if err != nil {
			// Not committed as a refusal: a stale id entry pendingEntry
			// dropped stays, so a refusal changes nothing.
			if r, ok := err.(refusal); ok {
				return lease.DeadLetter{}, r.err
			}
			return lease.DeadLetter{}, err
		}
		if err := s.putOutbox(t, room, d.Entry); err != nil {
			return lease.DeadLetter{}, err
		}
		return d, s.removeDeadLetter(t, key)
	})
}

// OutboxDiscardDeadLetter removes dead letter messageID for good, in one
// transaction; the pending outbox is not read or written. A damaged one
// that names messageID is removed too (returned with Damaged): freeing
// its place is why an operator discards it.
func (s *Store) OutboxDiscardDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	f := s.seekDeadLetter(messageID)
	return change(s, ctx, func(t *txn) (lease.DeadLetter, error) {
		key, raw, err := s.foundDeadLetter(t, f)
		if err != nil {
			return lease.DeadLetter{}, err
		}
		return s.readDeadLetter(key, raw), s.removeDeadLetter(t, key)
	})
}
