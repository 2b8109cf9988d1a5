package valkey

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"

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
// with its reason, its entry into the dead letter's own key, in one
// function call. Nothing is dropped: with MaxOutboxDeadLetters held it
// refuses and the entry stays pending. A dead letter of the same message
// id already held is replaced by this newer one (one member per id; see
// the package documentation), which is logged.
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
			s.keys.outboxBytes(), s.keys.outboxDeadEntry(messageID)},
		args: []string{messageID, string(why), strconv.Itoa(lease.MaxOutboxDeadLetters)}})
	if err != nil {
		return err
	}
	switch rep.status {
	case "ok":
		return nil
	case "replaced":
		s.log.Warn("a dead letter was replaced by a newer one of the same message id (the same publication accepted again and set aside again); the older one's entry and reason are gone",
			"message_id", messageID)
		return nil
	case "closed":
		return s.closedNamespace(rep)
	case "full":
		return lease.DeadLettersFull()
	default:
		return deadLetterKeysWrongType()
	}
}

// deadLetterKeysWrongType is the answer when a dead letter's keys hold the
// wrong type.
func deadLetterKeysWrongType() *lease.Error {
	return &lease.Error{Code: lease.CodeCorrupt, Reason: "outbox dead-letter keys hold the wrong type; failing closed"}
}

// OutboxDeadLetters returns up to limit dead letters, oldest first. Each
// is listed: one whose entry is gone or does not decode is named by its
// message id, Damaged set, so an operator can discard it. A dead letter
// set aside by an older version (its entry in the entry key it shares
// with a pending entry of its id) is read by a function (outbox_dead_read).
func (s *Store) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	rows, err := s.outboxRows(ctx, s.keys.outboxDead(), "outbox_dead_letters", limit, s.keys.outboxDeadWhy, s.keys.outboxDeadEntry)
	if err != nil {
		return nil, err
	}
	var older []string
	for _, r := range rows {
		if !ownEntry(r.vals[0]) {
			older = append(older, r.id)
		}
	}
	read, err := s.readOlderDeadLetters(ctx, older)
	if err != nil {
		return nil, err
	}
	out := make([]lease.DeadLetter, 0, len(rows))
	for _, r := range rows {
		why, raw := r.vals[0], r.vals[1]
		if o, ok := read[r.id]; ok {
			if !o.dead {
				continue // removed in between
			}
			why, raw = o.why, o.raw
		}
		out = append(out, deadLetterOf(r.id, why, raw))
	}
	return out, nil
}

// olderDeadLetter is what outbox_dead_read answered for one message id.
type olderDeadLetter struct {
	dead     bool
	why, raw string
}

// readOlderDeadLetters reads dead letters ids in one function call: which
// entry an older version's dead letter has depends on whether an entry of
// its id is pending, which only a function reads with its entry key under
// the documented ACL (no ZSCORE).
func (s *Store) readOlderDeadLetters(ctx context.Context, ids []string) (map[string]olderDeadLetter, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	c := call{fn: "outbox_dead_read", keys: []string{s.keys.outbox(), s.keys.outboxDead()}, args: ids}
	for _, id := range ids {
		c.keys = append(c.keys, s.keys.outboxDeadEntry(id), s.keys.outboxMsg(id), s.keys.outboxDeadWhy(id))
	}
	rep, err := s.fcall(ctx, c)
	if err != nil {
		return nil, err
	}
	switch {
	case rep.status == "wrongtype":
		return nil, deadLetterKeysWrongType()
	case rep.status != "ok" || len(rep.f) != 3*len(ids):
		return nil, s.malformed(c)
	}
	out := make(map[string]olderDeadLetter, len(ids))
	for i, id := range ids {
		out[id] = olderDeadLetter{dead: rep.f[3*i] == "1", why: rep.f[3*i+1], raw: rep.f[3*i+2]}
	}
	return out, nil
}

// ownEntryMark ends the reason key of a dead letter whose entry is in its
// own key (ns:outbox_dead_entry:<id>); library.lua's OWN_ENTRY.
const ownEntryMark = `,"own_entry":true}`

func ownEntry(why string) bool { return strings.HasSuffix(why, ownEntryMark) }

// deadLetterOf is dead letter id from its reason key's value and its
// entry ("" if gone). What is missing or does not decode is named in
// Damaged (its Entry then only the message id) rather than failing: the
// operator must see it to discard it.
func deadLetterOf(id, why, raw string) lease.DeadLetter {
	d := lease.DeadLetter{Entry: lease.OutboxEntry{MessageID: id}}
	var r struct {
		Reason string          `json:"reason"`
		DeadAt lease.Timestamp `json:"dead_at"`
	}
	if why != "" && json.Unmarshal([]byte(why), &r) != nil {
		d.Damaged = lease.DeadLetterCorrupt
		return d
	}
	d.Reason, d.DeadAt = r.Reason, r.DeadAt
	if raw == "" {
		d.Damaged = lease.DeadLetterEntryMissing
		return d
	}
	e, err := lease.DecodeOutboxEntry([]byte(raw))
	if err != nil || e.MessageID != id {
		d.Damaged = lease.DeadLetterCorrupt
		return d
	}
	d.Entry = e
	return d
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
// entry goes back to the entry key byte for byte, its size counted and
// bounded as a commit's publication. The entry is decoded strictly first
// and the function moves it only if it still has those bytes (their
// SHA-1): a corrupt entry made pending would fail the relay's reads
// closed, so it is refused (corrupt; discard it) and stays a dead letter.
func (s *Store) OutboxRequeueDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	if err := s.writable(ctx); err != nil {
		return lease.DeadLetter{}, err
	}
	c := call{fn: "outbox_requeue", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(messageID), s.keys.outboxDead(), s.keys.outboxDeadWhy(messageID), s.keys.gate(),
			s.keys.outboxBytes(), s.keys.outboxSeq(), s.keys.outboxDeadEntry(messageID)}}
	// Best effort: whatever this read misses, the function answers
	// "unverified" with the entry it found.
	want := ""
	res := s.client.DoMulti(ctx, s.client.B().Get().Key(c.keys[3]).Build(), s.client.B().Get().Key(c.keys[7]).Build(),
		s.client.B().Get().Key(c.keys[1]).Build())
	if why, _ := res[0].ToString(); !ownEntry(why) {
		res[1] = res[2] // an older version's dead letter (see outbox_requeue)
	}
	if raw, err := res[1].ToString(); err == nil {
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
			d := s.deadLetterRead(c.fn, messageID, rep)
			if d.Damaged != "" {
				// Only its reason can be: the entry moved was verified.
				e, _ := lease.DecodeOutboxEntry([]byte(rep.at(0)))
				d = lease.DeadLetter{Entry: e}
			}
			return d, nil
		case "unverified":
			var ok bool
			if want, ok = entryDigest(rep.at(0), messageID); !ok {
				return lease.DeadLetter{}, lease.DeadLetterDamaged()
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
// damaged dead letter (its entry gone or corrupt) is discarded too (that
// is how an operator clears it): what is known of it is returned, Damaged
// set.
func (s *Store) OutboxDiscardDeadLetter(ctx context.Context, messageID string) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", messageID); err != nil {
		return lease.DeadLetter{}, err
	}
	if err := s.writable(ctx); err != nil {
		return lease.DeadLetter{}, err
	}
	c := call{fn: "outbox_discard", mutation: true,
		keys: []string{s.keys.outbox(), s.keys.outboxMsg(messageID), s.keys.outboxDead(), s.keys.outboxDeadWhy(messageID), s.keys.gate(),
			s.keys.outboxDeadEntry(messageID)},
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
		return lease.DeadLetter{}, deadLetterKeysWrongType()
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
// entry, and 1, its reason key's value). The change is made, so what does
// not decode (a discarded damaged dead letter) is named in Damaged, and
// logged, rather than failing the call.
func (s *Store) deadLetterRead(fn, messageID string, rep reply) lease.DeadLetter {
	d := deadLetterOf(messageID, rep.at(1), rep.at(0))
	if d.Damaged != "" {
		s.log.Warn("a dead letter was damaged", "function", fn, "message_id", messageID, "damaged", d.Damaged)
	}
	return d
}
