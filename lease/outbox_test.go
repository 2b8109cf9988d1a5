package lease

import (
	"bytes"
	"strings"
	"testing"
)

// outboxEntryOf is a valid entry carrying m.
func outboxEntryOf(m OutboxMessage) OutboxEntry {
	return OutboxEntry{MessageID: "msg_1", Identity: contractIdentity(), LockKey: goldenContractKey, LeaseID: "lease_01",
		FencingToken: 42, ExecutionID: "execution_01", TraceID: "trace_01", Sink: "rabbitmq", CommitID: "commit_01",
		AcceptedAt: UnixMilli(1), Message: m}
}

// OutboxEntrySize reads back exactly the Size of the message an entry was
// encoded with, in place or by decoding, and 0 for what does not decode.
func TestOutboxEntrySize(t *testing.T) {
	for name, m := range map[string]OutboxMessage{
		"no body":               {RoutingKey: "q"},
		"empty body":            {RoutingKey: "q", Body: []byte{}},
		"one byte":              {RoutingKey: "q", Body: []byte("x")},
		"two bytes":             {RoutingKey: "q", Body: []byte("xy")},
		"three bytes":           {RoutingKey: "q", Body: []byte("xyz")},
		"largest body":          {RoutingKey: "q", Body: bytes.Repeat([]byte{0xff}, MaxOutboxBody)},
		"headers":               {RoutingKey: "q", Body: []byte("ab"), Headers: map[string]string{"x-a": "a\tb \"é\" \\ <&> \u2028", "e": ""}},
		"headers spell members": {RoutingKey: "q", Body: []byte("ab"), Headers: map[string]string{"body": `,"body":"QUFB"}}`, "headers": "}}"}},
		"content type quotes":   {RoutingKey: "q", ContentType: `text/x; a=",\"body\":"`, Body: []byte("a")},
	} {
		b, err := EncodeOutboxEntry(outboxEntryOf(m))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, inPlace := outboxEntrySizeInPlace(b)
		if got := OutboxEntrySize(b); got != m.Size() || !inPlace || n != m.Size() {
			t.Errorf("%s: size %d (in place %d, %v), want %d", name, got, n, inPlace, m.Size())
		}
	}
	good, _ := EncodeOutboxEntry(outboxEntryOf(OutboxMessage{RoutingKey: "q", Body: []byte("abc")}))
	for name, raw := range map[string]string{
		"empty":     "",
		"truncated": string(good[:len(good)-3]),
		"not json":  "body",
	} {
		if got := OutboxEntrySize([]byte(raw)); got != 0 {
			t.Errorf("%s: size %d, want 0", name, got)
		}
	}
	// Another member order (not what the encoder writes) is decoded whole.
	moved := strings.Replace(string(good), `"message_id":"msg_1",`, "", 1)
	moved = strings.Replace(moved, `}}`, `},"message_id":"msg_1"}`, 1)
	if _, ok := outboxEntrySizeInPlace([]byte(moved)); ok {
		t.Fatalf("measured in place: %s", moved)
	}
	if got := OutboxEntrySize([]byte(moved)); got != 3 {
		t.Fatalf("reordered entry: size %d, want 3", got)
	}
}

func FuzzOutboxEntrySize(f *testing.F) {
	f.Add([]byte("abc"), "x-a", "v", "text/plain")
	f.Add([]byte(nil), "body", `,"body":"x"}}`, `"`)
	f.Fuzz(func(t *testing.T, body []byte, name, value, contentType string) {
		m := OutboxMessage{RoutingKey: "q", ContentType: contentType, Body: body, Headers: map[string]string{name: value}}
		b, err := EncodeOutboxEntry(outboxEntryOf(m))
		if err != nil {
			return // not a valid message
		}
		// Every entry the encoder writes is measured in place.
		if got, ok := outboxEntrySizeInPlace(b); !ok || got != m.Size() {
			t.Fatalf("size %d (in place: %v), want %d: %s", got, ok, m.Size(), b)
		}
	})
}

// OutboxEntryOfAnother: an entry is its own message's (by its leading
// member, or decoded), another message's only when it decodes and names
// another id, and no message's when it does not decode.
func TestOutboxEntryOfAnother(t *testing.T) {
	own, err := EncodeOutboxEntry(outboxEntryOf(OutboxMessage{RoutingKey: "q", Body: []byte("abc")}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, id string
		raw      []byte
		want     bool
	}{
		{"its own", "msg_1", own, false},
		{"another's", "msg_2", own, true},
		{"a longer id sharing the prefix", "msg_", own, true},
		{"an id the entry's extends", "msg_10", own, true},
		{"not decodable", "msg_2", own[:len(own)-1], false},
		{"leading member elsewhere", "msg_2", []byte(`{"lock_key":"x","message_id":"msg_1"}`), false},
	} {
		if got := OutboxEntryOfAnother(tc.raw, tc.id); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
