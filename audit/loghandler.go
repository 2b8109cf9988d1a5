package audit

import (
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"log/slog"
)

// LogHandler is a slog.Handler that writes, in place of every value a log
// record carries that may be credential material (lease.SecretShaped: its
// message, attribute keys, group names and values — a string, an error's
// text, anything else's JSON — in groups too), the form its Redactor gives
// that value in audit events. A log line can take values from callers and
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

// ScreenLogger is l (nil, or a LogHandler without next: slog.Default())
// writing through a LogHandler
// with r: l itself if it already does, so a logger serve screened with
// its pepper's key keeps that key. Every component that logs values
// callers chose (stores, service, executor, relays) screens its logger
// through it, so a library user's own logger is screened too (with nil,
// the unkeyed form). Only the logger's own handler is looked at: a
// LogHandler behind another handler is not seen, and its values are
// screened twice (a keyed form then hashes the outer's form): give the
// LogHandler itself.
func ScreenLogger(l *slog.Logger, r *Redactor) *slog.Logger {
	if l == nil || writesNowhere(l) {
		// A LogHandler without a handler to write to would drop the
		// lines, ALERTs included.
		l = slog.Default()
	}
	if _, ok := l.Handler().(*LogHandler); ok && !writesNowhere(l) {
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
	out := slog.NewRecord(rec.Time, rec.Level, h.r.Value(rec.Message), rec.PC)
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
	return &LogHandler{next: h.next.WithGroup(h.r.Value(name)), r: h.r}
}

func (h *LogHandler) attr(a slog.Attr) slog.Attr {
	key := h.r.Value(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(key, h.r.Value(v.String()))
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
			return slog.String(key, h.r.Value(text(err.Error)))
		}
		// Anything else (a slice, a map, a struct, a named string) is
		// kept as it is unless a text a handler writes for it holds
		// credential material: then it is that text's form.
		for _, t := range renderings(v.Any()) {
			if screened := h.r.Value(t); screened != t {
				return slog.String(key, screened)
			}
		}
	}
	return slog.Attr{Key: key, Value: v}
}

// renderings are the texts slog's handlers write for a value of kind Any:
// the JSON handler's (its JSON, or the marshalling error's text, which it
// writes on failure) and the text handler's and slog's default's (a
// TextMarshaler's text, a byte slice's bytes, else its %+v form, which
// shows fields JSON leaves out and calls String).
func renderings(x any) []string {
	asJSON := text(func() string {
		b, err := json.Marshal(x)
		if err != nil {
			return err.Error()
		}
		return string(b)
	})
	asText := text(func() string {
		switch t := x.(type) {
		case encoding.TextMarshaler:
			b, err := t.MarshalText()
			if err != nil {
				return err.Error()
			}
			return string(b)
		case []byte:
			return string(t)
		}
		return fmt.Sprintf("%+v", x)
	})
	return []string{asJSON, asText}
}

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
