package client

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"sync"
	"unicode/utf8"

	"github.com/starintel/starlease/lease"
)

// decodeStrict is lease.DecodeStrict(b, out) for a fresh *out, in one
// parse when it can: a body that decodes strictly (unknown fields refused,
// no trailing data) and is exactly out's own encoding (json.Marshal, then
// at most the newline the server ends bodies with) has no duplicate or
// case-variant key, since the encoder writes each declared name once and
// as declared; that is every answer of the server. Anything else, errors
// included, takes lease.DecodeStrict from a fresh *out, so its verdict
// and error stand. A type that can hold a json.RawMessage (re-encoded as
// it came, duplicates and all) always does.
func decodeStrict[T any](b []byte, out *T) error {
	if !mayHoldRaw(reflect.TypeFor[T]()) && utf8.Valid(b) {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if dec.Decode(out) == nil {
			if _, err := dec.Token(); err == io.EOF {
				if enc, err := json.Marshal(out); err == nil && (bytes.Equal(enc, b) ||
					len(b) == len(enc)+1 && b[len(enc)] == '\n' && bytes.Equal(enc, b[:len(enc)])) {
					return nil
				}
			}
		}
	}
	var zero T
	*out = zero
	return lease.DecodeStrict(b, out)
}

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	rawTypes       sync.Map // reflect.Type → bool
)

func mayHoldRaw(t reflect.Type) bool {
	if m, ok := rawTypes.Load(t); ok {
		return m.(bool)
	}
	m := holdsRaw(t, map[reflect.Type]bool{})
	rawTypes.Store(t, m)
	return m
}

// holdsRaw reports whether a value of type t can hold a json.RawMessage;
// an interface can hold anything.
func holdsRaw(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == rawMessageType || t.Kind() == reflect.Interface {
		return true
	}
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return holdsRaw(t.Elem(), seen)
	case reflect.Map:
		return holdsRaw(t.Key(), seen) || holdsRaw(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsRaw(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}
