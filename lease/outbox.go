package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxAMQPShortString bounds an outbox message's exchange and routing key.
const MaxAMQPShortString = 255

// MaxOutboxBody bounds an outbox message body.
const MaxOutboxBody = 64 << 10

// Bounds of an outbox message's application headers.
const (
	MaxOutboxHeaders          = 32
	MaxOutboxHeaderNameBytes  = 128
	MaxOutboxHeaderValueBytes = 4096
	// MaxOutboxHeadersBytes bounds the names and values together.
	MaxOutboxHeadersBytes = 16 << 10
)

// ReservedHeaderPrefix starts the names of the fence headers the relay sets
// on every publication (package rabbitmq). An application header under it
// is refused, in any case, so a caller can neither forge nor shadow a
// fence header.
const ReservedHeaderPrefix = "x-starintel-"

// OutboxMessage is a publication that becomes visible only through the
// fenced outbox. Exchange may be empty (the default exchange). Headers are
// application headers the relay publishes as string values beside the
// fence headers; nil and empty are the same (no headers).
type OutboxMessage struct {
	Exchange    string            `json:"exchange"`
	RoutingKey  string            `json:"routing_key"`
	ContentType string            `json:"content_type"`
	Body        []byte            `json:"body"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// OutboxEntry is an accepted publication waiting for its relay. MessageID is
// stable (derived from the commit), so a relay that publishes twice after a
// crash publishes the same message id and consumers drop the duplicate.
type OutboxEntry struct {
	MessageID    string        `json:"message_id"`
	Identity     Identity      `json:"lock_identity"`
	LockKey      string        `json:"lock_key"`
	LeaseID      string        `json:"lease_id"`
	FencingToken uint64        `json:"fencing_token"`
	ExecutionID  string        `json:"execution_id"`
	TraceID      string        `json:"trace_id,omitempty"`
	Sink         string        `json:"sink"`
	CommitID     string        `json:"commit_id"`
	AcceptedAt   Timestamp     `json:"accepted_at"`
	Message      OutboxMessage `json:"message"`
}

// Outbox is the relay's side of the fenced outbox. Backends that accept
// CommitRequest.Outbox implement it.
type Outbox interface {
	// OutboxPending returns up to limit entries, oldest accepted first.
	OutboxPending(ctx context.Context, limit int) ([]OutboxEntry, error)
	// OutboxDone removes an entry after the broker confirmed it. Removing
	// an entry that is gone is not an error.
	OutboxDone(ctx context.Context, messageID string) error
}

// MaxOutboxDeadLetters bounds an outbox's dead letters. Once it holds this
// many, OutboxDeadLetter refuses (the entry stays pending and blocks the
// relay, loudly) rather than dropping anything: dead letters are removed
// only by an operator.
const MaxOutboxDeadLetters = 10000

// MaxDeadLetterReason bounds the reason kept with a dead letter (longer
// ones are cut).
const MaxDeadLetterReason = 512

// OutboxDeadLetters is an outbox that can set aside a poison entry: one the
// broker refuses for a reason retrying will not cure (an exchange that does
// not exist, access refused, repeated nacks or returns). bolt and valkey
// implement it.
type OutboxDeadLetters interface {
	// OutboxDeadLetter moves a pending entry out of the pending outbox into
	// its dead letters, kept with reason and the time, so later entries are
	// relayed. An entry that is not pending is not an error. With
	// MaxOutboxDeadLetters held it refuses (CodeBackendUnavailable) and the
	// entry stays pending.
	OutboxDeadLetter(ctx context.Context, messageID, reason string) error
	// OutboxDeadLetters returns up to limit dead letters, oldest first.
	OutboxDeadLetters(ctx context.Context, limit int) ([]DeadLetter, error)
	// OutboxDeadLen counts the dead letters.
	OutboxDeadLen(ctx context.Context) (int64, error)
}

// OutboxDeadLetterAdmin is an operator's hand on the dead letters (the
// `starlease outbox` command): once the cause is cured (the exchange
// declared, the permission granted) a dead letter goes back to the
// relay, or it is discarded; either frees room below
// MaxOutboxDeadLetters. Every backend with dead letters implements it.
type OutboxDeadLetterAdmin interface {
	OutboxDeadLetters
	// OutboxRequeueDeadLetter moves dead letter messageID back into the
	// pending outbox, after every entry pending, with its message id,
	// acceptance time and message unchanged, and returns it. Refused,
	// changing nothing: no such dead letter (CodeNotFound); an entry of
	// that id pending (CodeInvalidRequest); the pending outbox at one of
	// its bounds (OutboxFull), which bound accepted publications as they
	// bound this one.
	OutboxRequeueDeadLetter(ctx context.Context, messageID string) (DeadLetter, error)
	// OutboxDiscardDeadLetter removes dead letter messageID for good and
	// returns it; CodeNotFound if there is none.
	OutboxDiscardDeadLetter(ctx context.Context, messageID string) (DeadLetter, error)
}

// DeadLettersFull is the refusal of a dead-lettering with
// MaxOutboxDeadLetters held: the entry stays pending.
func DeadLettersFull() *Error {
	return Errorf(CodeBackendUnavailable, "the outbox holds %d dead letters (the bound); an operator must requeue or discard some (starlease outbox)", MaxOutboxDeadLetters)
}

// NoDeadLetter is the refusal of a requeue or discard of a message id that
// names no dead letter.
func NoDeadLetter() *Error {
	return &Error{Code: CodeNotFound, Reason: "no dead letter has this message id", PublicReason: true}
}

// DeadLetterPending is the refusal of a requeue whose message id names an
// entry still pending (the same publication accepted again after its
// commit evidence expired): two entries of one message id would be
// published twice, and removing one would remove both.
func DeadLetterPending() *Error {
	return &Error{Code: CodeInvalidRequest, Reason: "an entry with this message id is pending; discard the dead letter instead", PublicReason: true}
}

// DeadLetter is an outbox entry set aside as undeliverable.
type DeadLetter struct {
	Entry  OutboxEntry `json:"entry"`
	Reason string      `json:"reason"`
	DeadAt Timestamp   `json:"dead_at"`
	// Damaged, set only by a listing (OutboxDeadLetters) or a discard,
	// says why the dead letter is known only in part: its stored value
	// does not decode, or its entry is missing. Entry then holds at most
	// the message id, read from what is stored. It is listed rather than
	// failing the listing, so an operator can discard it and free its
	// place below MaxOutboxDeadLetters; it is never requeued.
	Damaged string `json:"damaged,omitempty"`
}

// Why a dead letter is Damaged.
const (
	DeadLetterCorrupt      = "corrupt"       // its stored value does not decode
	DeadLetterEntryMissing = "entry_missing" // its entry is gone (Valkey's older layout)
)

// damagedPrefix starts the name of a damaged dead letter whose message id
// cannot be read. Message ids start "msg_" (OutboxMessageID), so no
// publication has such a name.
const damagedPrefix = "damaged_"

// DeadLetterDamaged is the refusal of a requeue of a damaged dead letter:
// nothing of it can be trusted to publish, so it can only be discarded.
func DeadLetterDamaged() *Error {
	return &Error{Code: CodeCorrupt, Reason: "the dead letter is damaged (it, or its entry, does not decode as stored); it was not requeued: discard it", PublicReason: true}
}

// CheckRequeue refuses (DeadLetterDamaged) to requeue d if it is damaged
// or its entry is one the pending outbox would not take back as it is:
// the relay reads pending entries strictly and would fail closed on it.
func CheckRequeue(d DeadLetter) error {
	if d.Damaged != "" {
		return DeadLetterDamaged()
	}
	b, err := EncodeOutboxEntry(d.Entry)
	if err == nil {
		_, err = DecodeOutboxEntry(b)
	}
	if err != nil {
		return DeadLetterDamaged()
	}
	return nil
}

// DecodeDeadLetter decodes a dead letter stored as json.Marshal writes a
// DeadLetter. One that does not decode, names no valid message id, or
// decodes to another id than the one at its start (a second message_id
// member, which json.Marshal never writes: a scan that reads the id in
// place must name it as the listing does) is returned Damaged, named by
// the message id at its start (DeadLetterID), else
// DamagedDeadLetterID(unnamed), unnamed being the backend's key for it.
func DecodeDeadLetter(raw []byte, unnamed string) DeadLetter {
	var d DeadLetter
	id, ok := DeadLetterID(raw)
	if json.Unmarshal(raw, &d) == nil && d.Damaged == "" && CheckOpaqueID("message_id", d.Entry.MessageID) == nil &&
		(!ok || id == d.Entry.MessageID) {
		return d
	}
	if !ok {
		id = DamagedDeadLetterID(unnamed)
	}
	return DeadLetter{Entry: OutboxEntry{MessageID: id}, Damaged: DeadLetterCorrupt}
}

// DamagedDeadLetterID names a damaged dead letter whose message id cannot
// be read by its place in the store (token: the backend's key for it, in
// hex), so a listing can show it and a discard can name it.
func DamagedDeadLetterID(token string) string { return damagedPrefix + token }

// DamagedDeadLetterToken is the token of a DamagedDeadLetterID name.
func DamagedDeadLetterToken(id string) (string, bool) { return strings.CutPrefix(id, damagedPrefix) }

// DeadLetterID reads the message id at the start of a dead letter stored
// as json.Marshal writes lease.DeadLetter (its entry's first member;
// message ids need no escaping), without decoding the rest: a scan need
// not decode every body, and a damaged value can still be named.
func DeadLetterID(raw []byte) (string, bool) {
	rest, ok := bytes.CutPrefix(raw, []byte(`{"entry":{"message_id":"`))
	if !ok {
		return "", false
	}
	id, _, ok := bytes.Cut(rest, []byte(`"`))
	if !ok || CheckOpaqueID("message_id", string(id)) != nil {
		return "", false
	}
	return string(id), true
}

// CutDeadLetterReason bounds a dead letter's reason to MaxDeadLetterReason
// bytes (at a rune boundary).
func CutDeadLetterReason(reason string) string {
	if len(reason) <= MaxDeadLetterReason {
		return reason
	}
	cut := MaxDeadLetterReason
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// checkOutboxMessage bounds an outbox message: exchange and routing key
// follow the identifier rule (exchange may be empty), a content type of at
// most 128 printable ASCII bytes, a body of at most MaxOutboxBody bytes.
func checkOutboxMessage(m *OutboxMessage) error {
	if err := CheckExchange(m.Exchange); err != nil {
		return err
	}
	if err := CheckOpaqueID("outbox.routing_key", m.RoutingKey); err != nil {
		return err
	}
	// AMQP carries the routing key as a short string: an entry that could
	// never be published would wait at the head of the outbox forever.
	if len(m.RoutingKey) > MaxAMQPShortString {
		return Invalid("outbox.routing_key", "must be at most 255 bytes")
	}
	if len(m.ContentType) > 128 || strings.IndexFunc(m.ContentType, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0 {
		return Invalid("outbox.content_type", "must be at most 128 printable ASCII bytes")
	}
	if len(m.Body) > MaxOutboxBody {
		return Invalid("outbox.body", "must be at most 64 KiB")
	}
	return checkOutboxHeaders(m.Headers)
}

// CheckExchange validates an outbox message's exchange: empty (the
// default exchange) or an identifier of at most 255 bytes (an AMQP short
// string; an entry that could never be published would wait at the head
// of the outbox forever).
func CheckExchange(x string) error {
	if x == "" {
		return nil
	}
	if err := CheckOpaqueID("outbox.exchange", x); err != nil {
		return err
	}
	if len(x) > MaxAMQPShortString {
		return Invalid("outbox.exchange", "must be at most 255 bytes")
	}
	return nil
}

// checkOutboxHeaders bounds application headers: at most MaxOutboxHeaders,
// names of 1..128 printable ASCII bytes outside ReservedHeaderPrefix,
// values of valid UTF-8 without control characters but tab, at most 4096
// bytes, and at most 16 KiB of names and values together. Names are
// checked in sorted order so the same headers always get the same answer.
func checkOutboxHeaders(h map[string]string) error {
	const field = "outbox.headers"
	if len(h) > MaxOutboxHeaders {
		return Invalid(field, "at most 32 headers")
	}
	total := 0
	for _, name := range slices.Sorted(maps.Keys(h)) {
		v := h[name]
		if len(name) < 1 || len(name) > MaxOutboxHeaderNameBytes ||
			strings.IndexFunc(name, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			return Invalid(field, "a header name must be 1 to 128 printable ASCII bytes without spaces")
		}
		if len(name) >= len(ReservedHeaderPrefix) && strings.EqualFold(name[:len(ReservedHeaderPrefix)], ReservedHeaderPrefix) {
			return Invalid(field, "header names starting with "+ReservedHeaderPrefix+" are reserved for the fence headers")
		}
		// The broker routes by CC and BCC (sender-selected distribution):
		// they would send a message past the exchange and routing key the
		// publication names, and a value that is not an array makes the
		// broker close the channel.
		if strings.EqualFold(name, "CC") || strings.EqualFold(name, "BCC") {
			return Invalid(field, "CC and BCC are routing headers the broker interprets; name the routing key instead")
		}
		if len(v) > MaxOutboxHeaderValueBytes {
			return Invalid(field, "a header value must be at most 4096 bytes")
		}
		if !utf8.ValidString(v) || strings.IndexFunc(v, func(r rune) bool { return r != '\t' && unicode.IsControl(r) }) >= 0 {
			return Invalid(field, "a header value must be UTF-8 without control characters (tab allowed)")
		}
		total += len(name) + len(v)
	}
	if total > MaxOutboxHeadersBytes {
		return Invalid(field, "header names and values must total at most 16384 bytes")
	}
	return nil
}

// headersDigestInput is the canonical encoding of headers for the commit
// digest: each name and value length-prefixed, in sorted name order.
func headersDigestInput(h map[string]string) []byte {
	d := &fieldHasher{}
	for _, name := range slices.Sorted(maps.Keys(h)) {
		d.add(name, h[name])
	}
	return d.buf
}

// OutboxMessageID is the stable message id of the publication of an
// accepted commit: the same commit always yields the same id.
func OutboxMessageID(commitScope string) string { return "msg_" + commitScope }

// EncodeOutboxEntry and DecodeOutboxEntry are the stored form of an outbox
// entry; decoding is strict.
func EncodeOutboxEntry(e OutboxEntry) ([]byte, error) {
	if e.MessageID == "" || e.FencingToken < 1 || e.FencingToken > MaxFencingToken || !e.AcceptedAt.inRange() {
		return nil, corrupt("outbox: invalid entry")
	}
	if err := checkOutboxMessage(&e.Message); err != nil {
		return nil, corrupt("outbox: " + AsError(err).Reason)
	}
	return json.Marshal(e)
}

// DecodeOutboxEntry strictly decodes a stored outbox entry.
func DecodeOutboxEntry(b []byte) (OutboxEntry, error) {
	var e OutboxEntry
	if err := strictUnmarshal(b, &e); err != nil {
		return OutboxEntry{}, corrupt("outbox: " + err.Error())
	}
	if e.MessageID == "" || e.FencingToken < 1 || e.FencingToken > MaxFencingToken || !e.AcceptedAt.inRange() {
		return OutboxEntry{}, corrupt("outbox: invalid entry")
	}
	if f, ok := e.Identity.isCanonical(); !ok || e.Identity.lockKeyOfCanonical() != e.LockKey {
		return OutboxEntry{}, corrupt("outbox: identity " + f + " does not match lock_key")
	}
	if err := checkOutboxMessage(&e.Message); err != nil {
		return OutboxEntry{}, corrupt("outbox: " + AsError(err).Reason)
	}
	return e, nil
}

// MaxOutboxMessageBytes is the largest Size of a valid outbox message: a
// body and headers at their bounds.
const MaxOutboxMessageBytes = MaxOutboxBody + MaxOutboxHeadersBytes

// Size is what m counts against StoreOptions.OutboxMaxBytes: its body and
// its header names and values, in bytes. The rest of an entry (exchange,
// routing key, content type, the fence fields) is bounded per entry, so
// OutboxMaxPending bounds it.
func (m *OutboxMessage) Size() int64 {
	n := int64(len(m.Body))
	for name, v := range m.Headers {
		n += int64(len(name) + len(v))
	}
	return n
}

// OutboxEntryOfAnother reports whether a stored outbox entry, which the
// lookup of messageID led to, is the entry of another message: it decodes
// and names another message id (damage, a misplaced lookup). Removing,
// dead-lettering or replacing it for messageID would drop another
// commit's unpublished message, so backends leave it pending. An entry
// that does not decode is no other message's: it is messageID's to remove.
// An entry that begins with its message id as EncodeOutboxEntry writes it
// (its first member) is messageID's without decoding its body.
func OutboxEntryOfAnother(raw []byte, messageID string) bool {
	if rest, ok := bytes.CutPrefix(raw, []byte(`{"message_id":"`)); ok {
		if own, ok := bytes.CutPrefix(rest, []byte(messageID)); ok && len(own) > 0 && own[0] == '"' {
			return false
		}
	}
	e, err := DecodeOutboxEntry(raw)
	return err == nil && e.MessageID != messageID
}

// OutboxEntrySize is the Size of the message of an encoded outbox entry
// (EncodeOutboxEntry's bytes), 0 if it does not decode, so counting an
// entry in and out agrees even for a corrupt one. Backends call it when an
// entry leaves the outbox, inside their atomic step, so it measures the
// body in place (decoding a 64 KiB entry takes milliseconds): the message
// is the entry's last member, its body (base64, which holds no quote, or
// null) comes before its headers, and no JSON string holds an unescaped
// quote, so the first `,"body":` is the body's key. Only the headers are
// decoded; anything else is decoded whole.
func OutboxEntrySize(raw []byte) int64 {
	if n, ok := outboxEntrySizeInPlace(raw); ok {
		return n
	}
	e, err := DecodeOutboxEntry(raw)
	if err != nil {
		return 0
	}
	return e.Message.Size()
}

func outboxEntrySizeInPlace(raw []byte) (int64, bool) {
	const bodyKey, headersKey = `,"body":`, `,"headers":`
	i := bytes.Index(raw, []byte(bodyKey))
	if i < 0 || !bytes.HasSuffix(raw, []byte("}}")) {
		return 0, false
	}
	rest := raw[i+len(bodyKey):]
	var n int64
	switch {
	case bytes.HasPrefix(rest, []byte("null")):
		rest = rest[len("null"):]
	case len(rest) > 0 && rest[0] == '"':
		end := bytes.IndexByte(rest[1:], '"')
		if end < 0 {
			return 0, false
		}
		n = base64Size(rest[1 : 1+end])
		rest = rest[end+2:]
	default:
		return 0, false
	}
	if len(rest) == len("}}") {
		return n, true
	}
	if !bytes.HasPrefix(rest, []byte(headersKey)) {
		return 0, false
	}
	var h map[string]string
	if json.Unmarshal(rest[len(headersKey):len(rest)-len("}}")], &h) != nil {
		return 0, false
	}
	for name, v := range h {
		n += int64(len(name) + len(v))
	}
	return n, true
}

// base64Size is the decoded length of padded base64 text.
func base64Size(b []byte) int64 {
	n := int64(len(b)) / 4 * 3
	if bytes.HasSuffix(b, []byte("==")) {
		return n - 2
	}
	if bytes.HasSuffix(b, []byte("=")) {
		return n - 1
	}
	return n
}

// OutboxUsage is the pending outbox against its bounds.
type OutboxUsage struct {
	// Pending and Bytes are the pending entries and their Size in all.
	Pending int64 `json:"pending"`
	Bytes   int64 `json:"bytes"`
	// MaxPending and MaxBytes are the store's bounds
	// (StoreOptions.OutboxMaxPending, OutboxMaxBytes).
	MaxPending int64 `json:"max_pending"`
	MaxBytes   int64 `json:"max_bytes"`
}

// Fill is the larger of Pending/MaxPending and Bytes/MaxBytes: at 1 a
// publication is refused (at least one that needs a byte).
func (u OutboxUsage) Fill() float64 {
	f := 0.0
	if u.MaxPending > 0 {
		f = float64(u.Pending) / float64(u.MaxPending)
	}
	if u.MaxBytes > 0 {
		f = max(f, float64(u.Bytes)/float64(u.MaxBytes))
	}
	return f
}

// OutboxMeter is an outbox that keeps its usage in counters updated in
// the same atomic steps as its entries (bolt and valkey), so reading it is
// cheap and exact.
type OutboxMeter interface {
	OutboxUsage(ctx context.Context) (OutboxUsage, error)
}

// OutboxFullRetryAfter is the retry hint of a full outbox: the relay
// removes entries as fast as the broker confirms them, so a retry soon
// after may fit; while the broker is down, retries keep being refused.
const OutboxFullRetryAfter = time.Second

// Which bound a full outbox reached (OutboxFull).
const (
	OutboxBoundPending = "pending"
	OutboxBoundBytes   = "bytes"
)

// OutboxFull is the refusal of a publication that does not fit: bound is
// OutboxBoundPending or OutboxBoundBytes. It is retryable and the refused
// commit changed nothing, so a retry with the same commit id after the
// relay drained the outbox is a first acceptance.
func OutboxFull(bound string) *Error {
	what := "as many pending publications"
	if bound == OutboxBoundBytes {
		what = "as many bytes of pending publications"
	}
	return &Error{Code: CodeBackendUnavailable, Reason: "the outbox is full (it holds " + what +
		" as this server allows); retry with the same commit id once the relay has drained it",
		RetryAfter: OutboxFullRetryAfter, PublicReason: true}
}

// OutboxRoom refuses (OutboxFull) a publication of size bytes that would
// take the pending outbox past one of o's bounds; pending and bytes are
// its usage before it. Every backend decides with it (the Valkey function
// with the same comparisons).
func (o StoreOptions) OutboxRoom(pending, bytes, size int64) *Error {
	o = o.WithDefaults()
	switch {
	case pending >= o.OutboxMaxPending:
		return OutboxFull(OutboxBoundPending)
	case bytes+size > o.OutboxMaxBytes:
		return OutboxFull(OutboxBoundBytes)
	}
	return nil
}
