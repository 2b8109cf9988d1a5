package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"time"
)

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
