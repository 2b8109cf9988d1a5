package valkey

import (
	"context"
	"encoding/json"
	"strconv"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

var (
	_ lease.Outbox            = (*Store)(nil)
	_ lease.OutboxDeadLetters = (*Store)(nil)
	_ lease.OutboxMeter       = (*Store)(nil)
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
		return lease.Errorf(lease.CodeBackendUnavailable, "the outbox holds %d dead letters (the bound); an operator must clear them", lease.MaxOutboxDeadLetters)
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
