package audit

import (
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// LogHandler is a slog.Handler that writes, in place of every value a log
// record carries that may be credential material (lease.SecretShaped: its
// message, attribute keys, group names and values — a string, an error's
// text, anything else's JSON — in groups too, as given or as a handler
// quotes it), the form its Redactor gives that value in audit events. A log line can take values from callers and
// stores (an identity's 64-hex target id in an ALERT, an error's text);
// this keeps them out of logs as audit keeps them out of events, and keeps
// the two correlatable. Each value goes through Redactor.Value, the
// events' rule: a literal that reads as a redaction is hashed too, so a
// log line given an already redacted value shows another form: log the
// value itself.
type LogHandler struct {
	next slog.Handler
	r    *Redactor
}

// NewLogHandler wraps next with r (nil: the unkeyed form, Redacted). A
// LogHandler without next (nil, or the zero LogHandler) writes nothing: a
// log call never panics in the code that logged.
func NewLogHandler(next slog.Handler, r *Redactor) *LogHandler { return &LogHandler{next: next, r: r} }

// ScreenLogger is l written through a LogHandler with r: l itself if its
// handler already is one, so a logger serve screened with its pepper's
// key keeps that key; slog.Default() screened if l is nil or a LogHandler
// without next (which would drop the lines, ALERTs included). Every
// component that logs values callers chose (stores, service, executor,
// relays, recovery) screens its logger through it, so a library user's
// own logger is screened too (with nil, the unkeyed form).
//
// Only the logger's own handler is looked at: a LogHandler behind another
// handler is not seen, and its values are screened twice (a keyed form
// then hashes the outer's form): give the LogHandler itself. Do not give
// slog.SetDefault a logger screened from slog's default handler: that
// handler writes through the log package, which SetDefault sends back to
// the logger, and the first line waits on itself (slog's own behaviour
// for any handler wrapping its default).
func ScreenLogger(l *slog.Logger, r *Redactor) *slog.Logger {
	if l == nil || writesNowhere(l) {
		l = slog.Default()
	}
	if _, ok := l.Handler().(*LogHandler); ok {
		return l
	}
	return slog.New(NewLogHandler(l.Handler(), r))
}

// Enabled implements slog.Handler.
func (h *LogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next != nil && h.next.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *LogHandler) Handle(ctx context.Context, rec slog.Record) error {
	if h.next == nil {
		return nil
	}
	out := slog.NewRecord(rec.Time, rec.Level, h.value(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// writesNowhere reports whether l's handler is a LogHandler without next.
func writesNowhere(l *slog.Logger) bool {
	h, ok := l.Handler().(*LogHandler)
	return ok && h.next == nil
}

// WithAttrs implements slog.Handler.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if h.next == nil {
		return h
	}
	screened := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		screened[i] = h.attr(a)
	}
	return &LogHandler{next: h.next.WithAttrs(screened), r: h.r}
}

// WithGroup implements slog.Handler.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	if h.next == nil {
		return h
	}
	return &LogHandler{next: h.next.WithGroup(h.value(name)), r: h.r}
}

func (h *LogHandler) attr(a slog.Attr) slog.Attr {
	key := h.value(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(key, h.value(v.String()))
	case slog.KindGroup:
		group := v.Group()
		screened := make([]slog.Attr, len(group))
		for i, g := range group {
			screened[i] = h.attr(g)
		}
		return slog.Attr{Key: key, Value: slog.GroupValue(screened...)}
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			// The text the JSON handler writes for an error.
			return slog.String(key, h.value(text(err.Error)))
		}
		return slog.Attr{Key: key, Value: h.anyValue(v.Any())}
	}
	return slog.Attr{Key: key, Value: v}
}

// value is v as a log line may show it: its redacted form if v holds
// credential material, or if a line slog's text or JSON handler writes
// for it does. Their escapes write a byte or rune as up to eight hex
// digits (\x7f, \u0008, \ufffd, \U000e0001), which join the hex digits
// after it. The lines checked are slog's own (quotedBy), not a copy of
// its escaping rules, and v quoted whole (strconv.Quote), as the text
// handler quotes a key together with a group prefix that needs quoting.
// Only a value that is not printable ASCII and holds 56 hex digits in a
// row can be made 64 by escaping.
func (h *LogHandler) value(v string) string {
	if screened := h.r.Value(v); screened != v || printableASCII(v) || !lease.HexRun(v, 64-8) {
		return screened
	}
	for _, quoted := range append(quotedBy(v), strconv.Quote(v)) {
		if lease.SecretShaped(quoted) {
			return h.r.redact(v)
		}
	}
	return v
}

// quotedBy are the lines slog's text and JSON handlers write for a record
// holding v as its message, an attribute's key and its value.
func quotedBy(v string) []string {
	var txt, js strings.Builder
	rec := slog.NewRecord(time.Time{}, slog.LevelInfo, v, 0)
	rec.AddAttrs(slog.String(v, v))
	_ = slog.NewTextHandler(&txt, nil).Handle(context.Background(), rec)
	_ = slog.NewJSONHandler(&js, nil).Handle(context.Background(), rec)
	return []string{txt.String(), js.String()}
}

// printableASCII reports whether every byte of v is printable ASCII,
// which no handler escapes as hex.
func printableASCII(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// anyValue is what a value of kind Any other than an error (a slice, a
// map, a struct, a named string or number) is written as: its JSON, or,
// if it holds credential material, that JSON's redacted form. The JSON
// checked is what is passed on (screenedValue), so the handler never
// renders the value itself: its %+v form would show fields JSON leaves
// out and call String, each call may give another text than the one
// checked, and on a cyclic value it never returns. The JSON's strings are
// checked with their escapes decoded too ("star\u005fsk_" is star_sk_ to
// whoever reads the log), and what the text handler shows (a byte
// slice's bytes unless it is a TextMarshaler, a JSON string's content,
// else the JSON) as that handler quotes it (value). A named string is
// written as its string. A value that does not marshal is the text of
// why.
func (h *LogHandler) anyValue(x any) slog.Value {
	marshalled := false
	j := text(func() string {
		j, err := encodeJSON(x)
		if err != nil {
			return "!ERROR:" + err.Error()
		}
		marshalled = true
		return j
	})
	if screened := h.r.Value(j); screened != j || !marshalled {
		return slog.StringValue(screened)
	}
	if escapedSecret(j) {
		return slog.StringValue(h.r.redact(j))
	}
	shown := j
	_, isText := x.(encoding.TextMarshaler)
	switch rv := reflect.ValueOf(x); {
	case rv.Kind() == reflect.String:
		return slog.StringValue(h.value(rv.String()))
	case !isText && rv.Kind() == reflect.Slice && rv.Type().Elem().Kind() == reflect.Uint8:
		shown = text(func() string { return string(rv.Bytes()) })
	default:
		// A value whose JSON is a string (a TextMarshaler such as
		// net.IP): that string.
		var s string
		if json.Unmarshal([]byte(j), &s) == nil {
			shown = s
		}
	}
	if screened := h.value(shown); screened != shown {
		return slog.StringValue(screened)
	}
	return slog.AnyValue(screenedValue{json: j, text: shown})
}

// encodeJSON is x's JSON as slog's JSON handler encodes it: without HTML
// escapes.
func encodeJSON(x any) (string, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// escapedSecret reports whether a string or key in j, valid JSON without
// credential material as written, holds some once its escapes are
// decoded. Without a backslash every string in j is a part of j as
// written.
func escapedSecret(j string) bool {
	if !strings.Contains(j, `\`) {
		return false
	}
	d := json.NewDecoder(strings.NewReader(j))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return true // cannot tell: fail closed
	}
	var holds func(any) bool
	holds = func(v any) bool {
		switch t := v.(type) {
		case string:
			return lease.SecretShaped(t)
		case []any:
			for _, e := range t {
				if holds(e) {
					return true
				}
			}
		case map[string]any:
			for k, e := range t {
				if lease.SecretShaped(k) || holds(e) {
					return true
				}
			}
		}
		return false
	}
	return holds(v)
}

// screenedValue is a value of kind Any as anyValue checked it: its JSON
// for the JSON handler (MarshalJSON), and for the text handler and slog's
// default (MarshalText, String) its text: a JSON string's content, a byte
// slice's bytes, else the JSON.
type screenedValue struct{ json, text string }

func (v screenedValue) MarshalJSON() ([]byte, error) { return []byte(v.json), nil }
func (v screenedValue) MarshalText() ([]byte, error) { return []byte(v.text), nil }
func (v screenedValue) String() string               { return v.text }

// text calls f (an Error method, a marshaller), whose panic — a nil
// receiver, a bug — becomes text instead of reaching the code that logged.
func text(f func() string) (s string) {
	defer func() {
		if p := recover(); p != nil {
			s = fmt.Sprintf("!PANIC: %v", p)
		}
	}()
	return f()
}
