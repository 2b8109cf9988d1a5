package audit

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/starintel/starlease/lease"
)

// LogHandler is a slog.Handler that writes, in place of every value a log
// record carries that may be credential material (lease.SecretShaped: its
// message, each attribute's string, an error's or a Stringer's text, in
// groups too), the form its Redactor gives that value in audit events. A
// log line can take values from callers and stores (an identity's 64-hex
// target id in an ALERT, an error's text); this keeps them out of logs as
// audit keeps them out of events, and keeps the two correlatable. A value
// already in a redacted form is written as it is.
type LogHandler struct {
	next slog.Handler
	r    *Redactor
}

// NewLogHandler wraps next with r (nil: the unkeyed form, Redacted).
func NewLogHandler(next slog.Handler, r *Redactor) *LogHandler { return &LogHandler{next: next, r: r} }

// Enabled implements slog.Handler.
func (h *LogHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *LogHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.screen(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs implements slog.Handler.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	screened := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		screened[i] = h.attr(a)
	}
	return &LogHandler{next: h.next.WithAttrs(screened), r: h.r}
}

// WithGroup implements slog.Handler.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	return &LogHandler{next: h.next.WithGroup(name), r: h.r}
}

func (h *LogHandler) screen(v string) string {
	if lease.SecretShaped(v) {
		return h.r.Value(v)
	}
	return v
}

func (h *LogHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.screen(v.String()))
	case slog.KindGroup:
		group := v.Group()
		screened := make([]slog.Attr, len(group))
		for i, g := range group {
			screened[i] = h.attr(g)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(screened...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, h.screen(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, h.screen(x.String()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
