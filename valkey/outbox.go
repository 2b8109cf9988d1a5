package valkey

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"strconv"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

var (
	_ lease.Outbox                = (*Store)(nil)
	_ lease.OutboxDeadLetters     = (*Store)(nil)
	_ lease.OutboxMeter           = (*Store)(nil)
	_ lease.OutboxDeadLetterAdmin = (*Store)(nil)
)

// OutboxPending returns up to limit publications, oldest accepted first.
// Entries are written only by the commit function, in the same atomic step
// as the lease check; this read needs no atomicity (an entry removed in
// between is simply not returned). A corrupt entry fails the call closed.
func (s *Store) OutboxPending(ctx context.Context, limit int) ([]lease.OutboxEntry, error) {
	rows, err := s.outboxRows(ctx, s.keys.outbox(), "outbox_pending", limit, s.keys.outboxMsg)
	if err != nil {
		return nil, err
	}
	out := make([]lease.OutboxEntry, 0, len(rows))
	for _, r := range rows {
		if !r.found[0] {
			continue // removed in between
		}
		e, derr := lease.DecodeOutboxEntry([]byte(r.vals[0]))
		if derr != nil || e.MessageID != r.id {
			return nil, &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox entry is corrupt; failing closed"}
		}
		out = append(out, e)
	}
	return out, nil
}

// outboxRow is one id of an outbox set and the values of its keys.
type outboxRow struct {
	id    string
	vals  []string
	found []bool
}

// outboxRows reads up to limit ids of the sorted set set, oldest first,
// then, in one pipelined round trip, the value of every key keysOf names
// for each id (found false where the key is gone).
func (s *Store) outboxRows(ctx context.Context, set, fn string, limit int, keysOf ...func(string) string) ([]outboxRow, error) {
	if limit <= 0 || limit > s.opts.MaxPageSize {
		limit = s.opts.MaxPageSize
	}
	if s.closed.Load() {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	ids, err := s.client.Do(ctx, s.client.B().Zrangebyscore().Key(set).Min("-inf").Max("+inf").
		Limit(0, int64(limit)).Build()).AsStrSlice()
	if err != nil {
		return nil, s.failure(call{fn: fn}, err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make(vk.Commands, 0, len(ids)*len(keysOf))
	for _, id := range ids {
		for _, key := range keysOf {
			cmds = append(cmds, s.client.B().Get().Key(key(id)).Build())
		}
	}
	res := s.client.DoMulti(ctx, cmds...)
	rows := make([]outboxRow, len(ids))
	for i, id := range ids {
		rows[i] = outboxRow{id: id, vals: make([]string, len(keysOf)), found: make([]bool, len(keysOf))}
		for j := range keysOf {
			v, err := res[i*len(keysOf)+j].ToString()
			switch {
			case vk.IsValkeyNil(err):
			case err != nil:
				return nil, s.failure(call{fn: fn}, err)
			default:
				rows[i].vals[j], rows[i].found[j] = v, true
			}
		}
	}
	return rows, nil
}

// OutboxDone removes a publication after the broker confirmed it.
func (s *Store) OutboxDone(ctx context.Context, messageID string) error {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return err
	}
	if err := s.writable(ctx); err != nil {
		return err
	}
	rep, err := s.fcall(ctx, call{fn: "outbox_done", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(messageID), s.keys.gate(), s.keys.outboxBytes()}, args: []string{messageID}})
	if err != nil {
		return err
	}
	switch rep.status {
	case "ok":
		return nil
	case "closed":
		return s.closedNamespace(rep)
	default:
		return &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox keys hold the wrong type; failing closed"}
	}
}

// OutboxLen counts the pending publications (for the relay's backlog
// metric).
func (s *Store) OutboxLen(ctx context.Context) (int64, error) {
	if s.closed.Load() {
		return 0, lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	n, err := s.client.Do(ctx, s.client.B().Zcard().Key(s.keys.outbox()).Build()).AsInt64()
	if err != nil {
		return 0, s.failure(call{fn: "outbox_len"}, err)
	}
	return n, nil
}

// OutboxUsage reads the pending outbox's size (ZCARD of its schedule) and
// byte counter (ns:outbox:bytes, kept by the functions that add and remove
// entries) in one round trip, with the bounds.
func (s *Store) OutboxUsage(ctx context.Context) (lease.OutboxUsage, error) {
	u := lease.OutboxUsage{MaxPending: s.opts.OutboxMaxPending, MaxBytes: s.opts.OutboxMaxBytes}
	if s.closed.Load() {
		return u, lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	c := s.client
	res := c.DoMulti(ctx, c.B().Zcard().Key(s.keys.outbox()).Build(), c.B().Get().Key(s.keys.outboxBytes()).Build())
	n, err := res[0].AsInt64()
	if err != nil {
		return u, s.failure(call{fn: "outbox_usage"}, err)
	}
	b, err := res[1].ToString()
	if err != nil && !vk.IsValkeyNil(err) {
		return u, s.failure(call{fn: "outbox_usage"}, err)
	}
	bytes, ok := int64(0), true
	if b != "" {
		var v uint64
		v, ok = tokenValue(b)
		bytes = int64(v)
	}
	if !ok {
		return u, &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox byte counter is malformed; failing closed"}
	}
	u.Pending, u.Bytes = n, bytes
	return u, nil
}

// recountOutboxBytes sets the byte counter of a namespace whose pending
// outbox was written before the counter existed (a version without it, or
// a restore of its backup), in one function call that checks the entries
// it sums are exactly the pending ones. Without it the counter would
// start at 0 and stay below the truth until the outbox drains. It does
// nothing if the counter exists or the outbox is empty.
func (s *Store) recountOutboxBytes(ctx context.Context) error {
	c := s.client
	for range 3 {
		res := c.DoMulti(ctx, c.B().Exists().Key(s.keys.outboxBytes()).Build(), c.B().Zcard().Key(s.keys.outbox()).Build())
		has, err := res[0].AsInt64()
		if err != nil {
			return s.failure(call{fn: "outbox_recount"}, err)
		}
		n, err := res[1].AsInt64()
		if err != nil {
			return s.failure(call{fn: "outbox_recount"}, err)
		}
		if has == 1 || n == 0 {
			return nil
		}
		ids, err := c.Do(ctx, c.B().Zrangebyscore().Key(s.keys.outbox()).Min("-inf").Max("+inf").Build()).AsStrSlice()
		if err != nil {
			return s.failure(call{fn: "outbox_recount"}, err)
		}
		keys := []string{s.keys.outboxBytes(), s.keys.outbox(), s.keys.gate()}
		for _, id := range ids {
			keys = append(keys, s.keys.outboxMsg(id))
		}
		rep, err := s.fcall(ctx, call{fn: "outbox_recount", mutation: true, keys: keys, args: ids})
		if err != nil {
			return err
		}
		switch rep.status {
		case "ok":
			return nil
		case "closed":
			return s.closedNamespace(rep)
		case "wrongtype":
			return &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox keys hold the wrong type; failing closed"}
		}
		// "retry": the outbox changed between the listing and the call.
	}
	return lease.Errorf(lease.CodeBackendUnavailable, "the outbox kept changing while its bytes were counted")
}

// OutboxDeadLetter moves a pending entry to the dead letters (ns:outbox_dead)
// with its reason, in one function call. Nothing is dropped: with
// MaxOutboxDeadLetters held it refuses and the entry stays pending.
func (s *Store) OutboxDeadLetter(ctx context.Context, messageID, reason string) error {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return err
	}
	if err := s.writable(ctx); err != nil {
		return err
	}
	why, err := json.Marshal(lease.CutDeadLetterReason(reason))
	if err != nil {
		return err
	}
	rep, err := s.fcall(ctx, call{fn: "outbox_dead", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(messageID), s.keys.outboxDead(), s.keys.outboxDeadWhy(messageID), s.keys.gate(),
			s.keys.outboxBytes()},
		args: []string{messageID, string(why), strconv.Itoa(lease.MaxOutboxDeadLetters)}})
	if err != nil {
		return err
	}
	switch rep.status {
	case "ok":
		return nil
	case "closed":
		return s.closedNamespace(rep)
	case "full":
		return lease.DeadLettersFull()
	default:
		return &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox dead-letter keys hold the wrong type; failing closed"}
	}
}

// OutboxDeadLetters returns up to limit dead letters, oldest first.
func (s *Store) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	rows, err := s.outboxRows(ctx, s.keys.outboxDead(), "outbox_dead_letters", limit, s.keys.outboxMsg, s.keys.outboxDeadWhy)
	if err != nil {
		return nil, err
	}
	out := make([]lease.DeadLetter, 0, len(rows))
	for _, r := range rows {
		if !r.found[0] {
			continue
		}
		var d lease.DeadLetter
		e, derr := lease.DecodeOutboxEntry([]byte(r.vals[0]))
		if derr != nil || e.MessageID != r.id || (r.vals[1] != "" && json.Unmarshal([]byte(r.vals[1]), &d) != nil) {
			return nil, &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox dead letter is corrupt; failing closed"}
		}
		d.Entry = e
		out = append(out, d)
	}
	return out, nil
}

// OutboxDeadLen counts the dead letters.
func (s *Store) OutboxDeadLen(ctx context.Context) (int64, error) {
	if s.closed.Load() {
		return 0, lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	n, err := s.client.Do(ctx, s.client.B().Zcard().Key(s.keys.outboxDead()).Build()).AsInt64()
	if err != nil {
		return 0, s.failure(call{fn: "outbox_dead_len"}, err)
	}
	return n, nil
}

// OutboxRequeueDeadLetter moves a dead letter back into the pending outbox,
// after every pending entry, in one function call (outbox_requeue): its
// entry key is kept as it is, its size counted and bounded as a commit's
// publication. The entry is decoded strictly first and the function moves
// it only if it still has those bytes (their SHA-1): a corrupt entry made
// pending would fail the relay's reads closed, so it is refused (corrupt;
// discard it) and stays a dead letter.
func (s *Store) OutboxRequeueDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	if err := s.writable(ctx); err != nil {
		return lease.DeadLetter{}, err
	}
	c := call{fn: "outbox_requeue", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(messageID), s.keys.outboxDead(), s.keys.outboxDeadWhy(messageID), s.keys.gate(),
			s.keys.outboxBytes(), s.keys.outboxSeq()}}
	// Best effort: whatever this read misses, the function answers
	// "unverified" with the entry it found.
	want := ""
	if raw, err := s.client.Do(ctx, s.client.B().Get().Key(c.keys[1]).Build()).ToString(); err == nil {
		want, _ = entryDigest(raw, messageID)
	}
	for range 3 {
		c.args = []string{messageID, want, itoa(s.opts.OutboxMaxPending), itoa(s.opts.OutboxMaxBytes)}
		rep, err := s.fcall(ctx, c)
		if err != nil {
			return lease.DeadLetter{}, err
		}
		switch rep.status {
		case "ok":
			return s.deadLetterRead(c.fn, messageID, rep), nil
		case "unverified":
			var ok bool
			if want, ok = entryDigest(rep.at(0), messageID); !ok {
				return lease.DeadLetter{}, &lease.Error{Code: lease.CodeCorrupt,
					Reason: "the dead letter's entry is corrupt; it was not requeued (discard it)", PublicReason: true}
			}
			continue // it changed since it was read: move the entry just read
		case "closed":
			return lease.DeadLetter{}, s.closedNamespace(rep)
		case "none":
			return lease.DeadLetter{}, lease.NoDeadLetter()
		case "pending":
			return lease.DeadLetter{}, lease.DeadLetterPending()
		case "noentry":
			return lease.DeadLetter{}, &lease.Error{Code: lease.CodeNotFound,
				Reason: "the dead letter has no entry left (one of its message id was relayed); discard it", PublicReason: true}
		case "full":
			full := lease.OutboxFull(rep.at(0))
			full.BackendTime = rep.now.Time()
			return lease.DeadLetter{}, full
		case "wrongtype", "corrupt":
			return lease.DeadLetter{}, &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox keys hold the wrong type or a malformed counter; failing closed"}
		default:
			return lease.DeadLetter{}, s.malformed(c)
		}
	}
	return lease.DeadLetter{}, lease.Errorf(lease.CodeBackendUnavailable, "the dead letter kept changing while it was requeued")
}

// OutboxDiscardDeadLetter removes a dead letter for good in one function
// call (outbox_discard), never a pending entry of its message id. A
// corrupt dead letter is discarded too (that is how an operator clears
// it): what of it decodes is returned.
func (s *Store) OutboxDiscardDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	if err := s.writable(ctx); err != nil {
		return lease.DeadLetter{}, err
	}
	c := call{fn: "outbox_discard", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(messageID), s.keys.outboxDead(), s.keys.outboxDeadWhy(messageID), s.keys.gate()},
		args: []string{messageID}}
	rep, err := s.fcall(ctx, c)
	if err != nil {
		return lease.DeadLetter{}, err
	}
	switch rep.status {
	case "ok":
		return s.deadLetterRead(c.fn, messageID, rep), nil
	case "closed":
		return lease.DeadLetter{}, s.closedNamespace(rep)
	case "none":
		return lease.DeadLetter{}, lease.NoDeadLetter()
	case "wrongtype":
		return lease.DeadLetter{}, &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox dead-letter keys hold the wrong type; failing closed"}
	default:
		return lease.DeadLetter{}, s.malformed(c)
	}
}

// entryDigest is the SHA-1 (hex, as Lua's redis.sha1hex) of raw if it is
// messageID's outbox entry, strictly decoded.
func entryDigest(raw, messageID string) (string, bool) {
	e, err := lease.DecodeOutboxEntry([]byte(raw))
	if err != nil || e.MessageID != messageID {
		return "", false
	}
	sum := sha1.Sum([]byte(raw))
	return hex.EncodeToString(sum[:]), true
}

// deadLetterRead is the dead letter an "ok" reply read (fields 0, the
// entry, and 1, its reason key's value). The change is made, so a part
// that does not decode (a discarded corrupt dead letter) is left out,
// and logged, rather than failing the call.
func (s *Store) deadLetterRead(fn, messageID string, rep reply) lease.DeadLetter {
	var d lease.DeadLetter
	if why := rep.at(1); why != "" && json.Unmarshal([]byte(why), &d) != nil {
		d = lease.DeadLetter{}
		s.log.Warn("a dead letter's reason was corrupt", "function", fn)
	}
	e, err := lease.DecodeOutboxEntry([]byte(rep.at(0)))
	if err != nil || e.MessageID != messageID {
		s.log.Warn("a dead letter's entry was missing or corrupt", "function", fn)
		e = lease.OutboxEntry{MessageID: messageID}
	}
	d.Entry = e
	return d
}
