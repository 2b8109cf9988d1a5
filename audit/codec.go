package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Marshal validates e and encodes it as one line of JSON (without the
// newline). The encoding has exactly the fields of Fields. Every sink
// encodes with Marshal, so it is the floor of redaction: a value that may
// be credential material and was not redacted with a key by the event's
// builder is replaced by Redacted here, never written and never a reason
// to refuse the event.
func Marshal(e Event) ([]byte, error) {
	floorRedact(&e)
	if err := e.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("audit: encode event: %w", err)
	}
	if len(b) > MaxEventBytes {
		return nil, invalid("event", "encoded event too large")
	}
	return b, nil
}

// Unmarshal decodes one event strictly: a single JSON object of at most
// MaxEventBytes, no unknown or duplicate fields, no null or nested values,
// no trailing data, and a valid event (Validate).
func Unmarshal(b []byte) (Event, error) {
	var e Event
	if len(b) > MaxEventBytes {
		return e, errors.New("audit: event too large")
	}
	if err := checkFlatObject(b); err != nil {
		return e, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return Event{}, fmt.Errorf("audit: decode event: %s", safeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return Event{}, errors.New("audit: decode event: trailing data")
	}
	if err := e.Validate(); err != nil {
		return Event{}, err
	}
	if err := e.checkStoredSecretFree(); err != nil {
		return Event{}, err
	}
	return e, nil
}

// checkFlatObject checks b is one JSON object whose values are all strings,
// numbers or booleans, with no key twice (encoding/json would silently keep
// the last of two).
func checkFlatObject(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errors.New("audit: decode event: not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errors.New("audit: decode event: malformed JSON")
		}
		k, _ := t.(string)
		if seen[k] {
			return fmt.Errorf("audit: decode event: duplicate field %q", k)
		}
		seen[k] = true
		v, err := dec.Token()
		if err != nil {
			return errors.New("audit: decode event: malformed JSON")
		}
		switch v.(type) {
		case string, json.Number, bool:
		default:
			return fmt.Errorf("audit: decode event: field %q must be a string, number or boolean", k)
		}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return errors.New("audit: decode event: malformed JSON")
	}
	return nil
}

// safeJSONError names the problem without echoing input values.
func safeJSONError(err error) string {
	var ute *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &ute):
		return "field " + ute.Field + " has the wrong type"
	case errors.As(err, &se):
		return "malformed JSON"
	default:
		// DisallowUnknownFields: `json: unknown field "name"`; field names of
		// a flat object already passed checkFlatObject's scan.
		return err.Error()
	}
}

// ReadFile reads a JSON-lines audit file strictly: every line is exactly one
// valid event (Unmarshal), every line ends with a newline, no blank lines.
// An error names the line number.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadAll(f)
}

// ReadAll is ReadFile over a reader.
func ReadAll(r io.Reader) ([]Event, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Event
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return out, fmt.Errorf("audit: line %d: longer than %d bytes", n, MaxEventBytes)
		}
		if err == io.EOF {
			if len(line) > 0 {
				return out, fmt.Errorf("audit: line %d: no final newline (torn write?)", n)
			}
			return out, nil
		}
		if err != nil {
			return out, err
		}
		e, err := Unmarshal(line[:len(line)-1])
		if err != nil {
			return out, fmt.Errorf("audit: line %d: %w", n, err)
		}
		out = append(out, e)
	}
}
