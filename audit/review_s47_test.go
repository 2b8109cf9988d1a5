package audit

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"testing"
)

// Probes of the review of ScreenLogger, kept as regression tests.

var reviewSecret = strings.Repeat("0123456789abcdef", 4)

type secretStringer struct{}

func (secretStringer) String() string { return "bearer " + reviewSecret }

type secretMarshalError struct{}

func (secretMarshalError) MarshalJSON() ([]byte, error) {
	return nil, fmt.Errorf("cannot encode %s", reviewSecret)
}

type secretText struct{}

func (secretText) MarshalText() ([]byte, error) { return []byte("id " + reviewSecret), nil }

// A value of kind Any is screened by every text a handler writes for it,
// not by its JSON alone: the text handler and slog's default write a byte
// slice's bytes, fields JSON leaves out, a Stringer's String and a
// TextMarshaler's text; the JSON handler writes a failing marshaller's
// error. Each is written in its redacted form, never as given.
func TestLogHandlerScreensWhatEachHandlerWrites(t *testing.T) {
	type unexported struct{ id string }
	type withErr struct{ Err error }
	values := map[string]any{
		"bytes":         []byte(reviewSecret),
		"unexported":    unexported{reviewSecret},
		"ptr_struct":    &unexported{reviewSecret},
		"err_field":     withErr{errors.New(reviewSecret)},
		"stringer":      secretStringer{},
		"marshal_error": secretMarshalError{},
		"text":          secretText{},
	}
	var buf bytes.Buffer
	handlers := map[string]func() *slog.Logger{
		"json": func() *slog.Logger { return slog.New(slog.NewJSONHandler(&buf, nil)) },
		"text": func() *slog.Logger { return slog.New(slog.NewTextHandler(&buf, nil)) },
		"default": func() *slog.Logger {
			prevOut, prevFlags, prevDefault := log.Writer(), log.Flags(), slog.Default()
			t.Cleanup(func() { log.SetOutput(prevOut); log.SetFlags(prevFlags); slog.SetDefault(prevDefault) })
			log.SetOutput(&buf)
			slog.SetDefault(slog.New(slog.Default().Handler()))
			return nil // ScreenLogger's nil: slog's default
		},
	}
	for hname, logger := range handlers {
		l := ScreenLogger(logger(), nil)
		for vname, v := range values {
			buf.Reset()
			l.Warn("m", "v", v)
			line := buf.String()
			if line == "" || strings.Contains(line, reviewSecret) || strings.Contains(strings.ToLower(line), "bearer ") {
				t.Errorf("%s handler, %s: line %q, want the value redacted", hname, vname, strings.TrimSpace(line))
			}
			if !strings.Contains(line, Redacted) {
				t.Errorf("%s handler, %s: no redacted form in %q", hname, vname, strings.TrimSpace(line))
			}
		}
	}
}

// A LogHandler with no handler to write to is never kept: ScreenLogger
// gives slog's default, screened, so an ALERT is neither lost nor a
// panic; and such a handler used directly writes nothing, without panic.
func TestScreenLoggerReplacesALogHandlerWithoutNext(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	ScreenLogger(slog.New(&LogHandler{}), nil).Error("ALERT corrupt lease state", "target_id", reviewSecret)
	if line := buf.String(); !strings.Contains(line, "ALERT corrupt lease state") || strings.Contains(line, reviewSecret) {
		t.Fatalf("line %q, want the ALERT on slog's default, screened", line)
	}
	slog.New(&LogHandler{}).With("a", 1).WithGroup("g").Error("dropped")
	slog.New(NewLogHandler(nil, nil)).Error("dropped")
}
