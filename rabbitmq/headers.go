package rabbitmq

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/lease"
)

// The fence headers the relay sets on every publication: the accepted
// commit's lock key, lease id, fencing token (an AMQP signed 64-bit
// integer), execution id, trace id (omitted when empty), accepted_at
// (backend time, RFC 3339 with milliseconds, UTC), sink and commit id.
const (
	HeaderLockKey      = "x-starintel-lock-key"
	HeaderLeaseID      = "x-starintel-lease-id"
	HeaderFencingToken = "x-starintel-fencing-token"
	HeaderExecutionID  = "x-starintel-execution-id"
	HeaderTraceID      = "x-starintel-trace-id"
	HeaderAcceptedAt   = "x-starintel-accepted-at"
	HeaderSink         = "x-starintel-sink"
	HeaderCommitID     = "x-starintel-commit-id"
)

// Fence is the fence a delivery carries: its message id and the fence
// headers. It is delivery metadata, so it proves nothing about ownership by
// itself (see Deduper).
type Fence struct {
	MessageID    string
	LockKey      string
	LeaseID      string
	FencingToken uint64
	ExecutionID  string
	TraceID      string
	AcceptedAt   lease.Timestamp
	Sink         string
	CommitID     string
}

// publishing is the AMQP message of an outbox entry: persistent, with the
// entry's stable message id, content type and body, its acceptance time as
// the timestamp, and in headers the message's application headers (as
// strings) and the fence. The fence is set last, so it always wins; the
// store already refuses application headers under
// lease.ReservedHeaderPrefix, which every fence header name starts with.
func publishing(e lease.OutboxEntry) amqp.Publishing {
	h := make(amqp.Table, len(e.Message.Headers)+8)
	for name, v := range e.Message.Headers {
		h[name] = v
	}
	h[HeaderLockKey] = e.LockKey
	h[HeaderLeaseID] = e.LeaseID
	h[HeaderFencingToken] = int64(e.FencingToken) // at most 2^53-1
	h[HeaderExecutionID] = e.ExecutionID
	h[HeaderAcceptedAt] = e.AcceptedAt.String()
	h[HeaderSink] = e.Sink
	h[HeaderCommitID] = e.CommitID
	if e.TraceID != "" {
		h[HeaderTraceID] = e.TraceID
	} else {
		delete(h, HeaderTraceID) // no trace: no trace header, whatever the entry held
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  e.Message.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    e.MessageID,
		Timestamp:    e.AcceptedAt.Time(),
		Body:         e.Message.Body,
	}
}

// ErrNoFence reports a delivery without a complete, well-formed fence.
var ErrNoFence = errors.New("rabbitmq: delivery carries no valid fence")

// FenceOf reads the fence of a delivery. A delivery without a message id,
// lock key, lease id or a fencing token in 1..2^53-1, or with a malformed
// fence header, is an error wrapping ErrNoFence. Integer headers of any
// AMQP integer type are accepted, strings as string or bytes.
func FenceOf(d amqp.Delivery) (Fence, error) {
	f := Fence{MessageID: d.MessageId}
	if f.MessageID == "" {
		return Fence{}, noFence("no message id")
	}
	var err error
	str := func(name string, required bool) string {
		if err != nil {
			return ""
		}
		v, ok := d.Headers[name]
		if !ok {
			if required {
				err = noFence("header %s is missing", name)
			}
			return ""
		}
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		default:
			err = noFence("header %s is not a string", name)
			return ""
		}
		if required && s == "" {
			err = noFence("header %s is empty", name)
		}
		return s
	}
	f.LockKey = str(HeaderLockKey, true)
	f.LeaseID = str(HeaderLeaseID, true)
	f.ExecutionID = str(HeaderExecutionID, false)
	f.TraceID = str(HeaderTraceID, false)
	f.Sink = str(HeaderSink, false)
	f.CommitID = str(HeaderCommitID, false)
	at := str(HeaderAcceptedAt, false)
	if err != nil {
		return Fence{}, err
	}
	if lease.CheckLockKey(f.LockKey) != nil {
		return Fence{}, noFence("header %s is not a canonical lock key", HeaderLockKey)
	}
	tok, ok := token(d.Headers[HeaderFencingToken])
	if !ok {
		return Fence{}, noFence("header %s is missing or not an integer in 1..2^53-1", HeaderFencingToken)
	}
	f.FencingToken = tok
	if at != "" {
		ts, perr := lease.ParseTimestamp(at)
		if perr != nil {
			return Fence{}, noFence("header %s is not a timestamp", HeaderAcceptedAt)
		}
		f.AcceptedAt = ts
	}
	return f, nil
}

// token reads a fencing token of any AMQP integer type.
func token(v any) (uint64, bool) {
	var n int64
	switch v := v.(type) {
	case int64:
		n = v
	case int32:
		n = int64(v)
	case int16:
		n = int64(v)
	case int8:
		n = int64(v)
	case int:
		n = int64(v)
	case uint8:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint32:
		n = int64(v)
	case uint64:
		if v > lease.MaxFencingToken {
			return 0, false
		}
		n = int64(v)
	default:
		return 0, false
	}
	if n < 1 || uint64(n) > lease.MaxFencingToken {
		return 0, false
	}
	return uint64(n), true
}

func noFence(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNoFence, fmt.Sprintf(format, args...))
}
