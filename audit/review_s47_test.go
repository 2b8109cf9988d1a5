package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
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

type secretBytes []byte

// changingStringer gives a clean text on its first String call and a
// secret after: a screen that checks one call and lets the handler make
// another would pass the secret.
type changingStringer struct{ calls *int }

func (c changingStringer) String() string {
	if *c.calls++; *c.calls == 1 {
		return "ok"
	}
	return "bearer " + reviewSecret
}

// A value of kind Any is written as the text the screen checked, never
// rendered again by the handler: its JSON, or that JSON's redacted form if
// the JSON, the marshalling error's text or a byte slice's bytes hold
// credential material. So the text handler and slog's default no longer
// write a byte slice's bytes, fields JSON leaves out, a Stringer's String
// or a TextMarshaler's text as given; the JSON handler no longer writes a
// failing marshaller's error as given; a cyclic value is its marshalling
// error, not a stack overflow.
func TestLogHandlerScreensWhatEachHandlerWrites(t *testing.T) {
	type unexported struct{ id string }
	type withErr struct{ Err error }
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	calls := 0
	// Written in their redacted form.
	carried := map[string]any{
		"bytes":         []byte(reviewSecret),
		"named_bytes":   secretBytes(reviewSecret),
		"marshal_error": secretMarshalError{},
		"text":          secretText{},
	}
	// Written as their JSON, which does not hold the secret (or, for
	// invalid JSON bytes, the marshalling error, which does not either).
	hidden := map[string]any{
		"raw_message": json.RawMessage("bearer " + reviewSecret),
		"unexported":  unexported{reviewSecret},
		"ptr_struct":  &unexported{reviewSecret},
		"err_field":   withErr{errors.New(reviewSecret)},
		"stringer":    secretStringer{},
		"changing":    changingStringer{&calls},
		"cyclic":      cyclic,
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
		for _, values := range []map[string]any{carried, hidden} {
			for vname, v := range values {
				buf.Reset()
				l.Warn("m", "v", v)
				line := buf.String()
				if line == "" || strings.Contains(line, reviewSecret) || strings.Contains(strings.ToLower(line), "bearer ") {
					t.Errorf("%s handler, %s: line %q, want no secret", hname, vname, strings.TrimSpace(line))
				}
				if _, ok := carried[vname]; ok && !strings.Contains(line, Redacted) {
					t.Errorf("%s handler, %s: no redacted form in %q", hname, vname, strings.TrimSpace(line))
				}
			}
		}
	}
	if calls != 0 {
		t.Errorf("String was called %d times; the screen writes the JSON it checked", calls)
	}
}

// A value that is clean keeps the JSON handler's form: a struct its JSON
// object, a named string its string, a named number its number.
func TestLogHandlerKeepsCleanAnyValuesAsJSON(t *testing.T) {
	type label string
	type token uint64
	var buf bytes.Buffer
	ScreenLogger(slog.New(slog.NewJSONHandler(&buf, nil)), nil).Info("m",
		"struct", struct {
			A string
			B []int
		}{"x<y", []int{1, 2}}, "label", label("tenant-a"), "token", token(42), "nil", nil)
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	st, _ := got["struct"].(map[string]any)
	if st == nil || st["A"] != "x<y" || fmt.Sprint(st["B"]) != "[1 2]" || got["label"] != "tenant-a" || got["token"] != 42.0 ||
		got["nil"] != nil || !strings.Contains(buf.String(), `"nil":null`) {
		t.Fatalf("clean values changed form: %s", buf.String())
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

type escapedMarshaller struct{}

func (escapedMarshaller) MarshalJSON() ([]byte, error) {
	return []byte(`{"key":"star\u005fsk_abc","auth":"Bearer\u0020abc"}`), nil
}

// JSON escapes do not hide credential material: a value whose JSON spells
// "star_sk_" or "bearer " with \u escapes reads as them to whoever parses
// the log, so it is written in its redacted form, by every handler.
func TestLogHandlerDecodesJSONEscapesBeforeChecking(t *testing.T) {
	values := map[string]any{
		"marshaller":  escapedMarshaller{},
		"raw_message": json.RawMessage(`"star\u005Fsk_live"`),
		"key":         json.RawMessage(`{"Bearer\u0020x":1}`),
	}
	logEach(values, func(hname, vname, line string) {
		if !strings.Contains(line, "v="+Redacted) && !strings.Contains(line, `"v":"`+Redacted+`"`) {
			t.Errorf("%s handler, %s: %q, want v redacted", hname, vname, line)
		}
	})
}

// logEach logs each of values as "v" through a screened JSON handler and
// a screened text handler, and gives check each line.
func logEach(values map[string]any, check func(handler, value, line string)) {
	var buf bytes.Buffer
	for hname, l := range map[string]*slog.Logger{
		"json": ScreenLogger(slog.New(slog.NewJSONHandler(&buf, nil)), nil),
		"text": ScreenLogger(slog.New(slog.NewTextHandler(&buf, nil)), nil),
	} {
		for vname, v := range values {
			buf.Reset()
			l.Info("m", "v", v)
			check(hname, vname, strings.TrimSpace(buf.String()))
		}
	}
}

// The text handler and slog's default write a clean value of kind Any as
// the text the screen checked, readable: a byte slice as its bytes, a
// value whose JSON is a string (net.IP) as that string, a number as it is.
func TestLogHandlerTextFormsStayReadable(t *testing.T) {
	type count int
	var buf bytes.Buffer
	ScreenLogger(slog.New(slog.NewTextHandler(&buf, nil)), nil).Info("m",
		"bytes", []byte("hello world"), "ip", net.ParseIP("10.0.0.1"), "n", count(5), "list", []string{"a", "b"})
	line := buf.String()
	for _, want := range []string{`bytes="hello world"`, `ip=10.0.0.1`, `n=5`, `list="[\"a\",\"b\"]"`} {
		if !strings.Contains(line, want) {
			t.Errorf("text line %q lacks %s", strings.TrimSpace(line), want)
		}
	}
	buf.Reset()
	ScreenLogger(slog.New(slog.NewJSONHandler(&buf, nil)), nil).Info("m", "bytes", []byte("hi"), "ip", net.ParseIP("10.0.0.1"))
	if line := buf.String(); !strings.Contains(line, `"bytes":"aGk="`) || !strings.Contains(line, `"ip":"10.0.0.1"`) {
		t.Errorf("JSON line %q: want the JSON handler's own forms", strings.TrimSpace(line))
	}
}

type textOf string

func (t textOf) MarshalText() ([]byte, error) { return []byte(t), nil }

// A handler's quoting writes a byte or rune as hex digits (\x00, \u200b,
// \ufffd), which join the hex digits after it: a value whose quoted form
// holds 64 hex digits in a row is written in its redacted form, though
// the value itself holds fewer.
func TestLogHandlerScreensTheQuotedForm(t *testing.T) {
	hex62 := reviewSecret[:62]
	values := map[string]any{
		"bytes_nul":      []byte("\x00" + hex62),
		"bytes_invalid":  []byte("\xff" + hex62),
		"string_invalid": "\xff" + reviewSecret[:60],
		"string_nul":     "\x00" + reviewSecret[:60],
		"text_zwsp":      textOf("\u200b" + reviewSecret[:60]),
		"map_key_del":    map[string]int{"\x7f" + hex62: 1},
	}
	logEach(values, func(hname, vname, line string) {
		if lease.SecretShaped(line) {
			t.Errorf("%s handler, %s: %q holds 64 hex digits in a row", hname, vname, line)
		}
	})
	var buf bytes.Buffer
	ScreenLogger(slog.New(slog.NewTextHandler(&buf, nil)), nil).Info("m", "v", "caf\u00e9 "+hex62)
	if !strings.Contains(buf.String(), hex62) {
		t.Errorf("a value whose quoted form adds no hex digits is redacted: %q", buf.String())
	}
}

// slog's JSON handler writes a control byte other than tab, newline and
// carriage return as \u00XX (encoding/json writes \b and \f), so a
// backspace or form feed before 60 hex digits made 64 in a row in its
// line, wherever the value stood: the screen checks the lines slog's own
// handlers write.
func TestLogHandlerScreensSlogsOwnEscapes(t *testing.T) {
	for _, c := range []string{"\b", "\f", "\x01", "\x1f", "\u2028", "\xff"} {
		v := c + reviewSecret[:60]
		var buf bytes.Buffer
		for hname, l := range map[string]*slog.Logger{
			"json": ScreenLogger(slog.New(slog.NewJSONHandler(&buf, nil)), nil),
			"text": ScreenLogger(slog.New(slog.NewTextHandler(&buf, nil)), nil),
		} {
			buf.Reset()
			l.WithGroup(v).Info(v, v, v, "err", errors.New(v), "named", textOf(v))
			if line := buf.String(); lease.SecretShaped(line) {
				t.Errorf("%s handler, %q before 60 hex digits: %q holds 64 in a row", hname, c, line)
			}
		}
	}
}

// The text handler quotes a key together with a group prefix that needs
// quoting, and quoting writes DEL as \x7f, which a key alone does not
// need; strconv.Quote writes a non-printable rune above U+FFFF as eight
// hex digits (\U000e0001). Either joined the key's own hex digits into 64
// in a row.
func TestLogHandlerScreensKeysQuotedWithTheirGroup(t *testing.T) {
	for _, k := range []string{"\x7f" + reviewSecret[:62], "\U000e0001" + reviewSecret[:56]} {
		var buf bytes.Buffer
		ScreenLogger(slog.New(slog.NewTextHandler(&buf, nil)), nil).WithGroup("a b").Info("m", k, 1, slog.Group("g=", k, 2))
		if line := buf.String(); lease.SecretShaped(line) {
			t.Errorf("key %q: %q holds 64 hex digits in a row", k[:4], line)
		}
	}
}
