package lease

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sync"
)

// IsOwnEncoding reports whether b, already decoded into v without error
// (unknown fields refused, no trailing data), is exactly v's own encoding
// (json.Marshal), optionally followed by one newline. Such bytes hold no
// duplicate or case-variant key, since the encoder writes each declared
// name once and as declared, so DecodeStrict's further parse would find
// nothing and may be skipped: the bodies the Go client sends and the
// answers the server writes are all of this kind. A raw member
// (json.RawMessage) re-encodes as it came, duplicate keys and all, so a
// value holding a non-empty one is never taken as its own encoding.
func IsOwnEncoding(b []byte, v any) bool {
	if holdsRaw(reflect.ValueOf(v)) {
		return false
	}
	enc, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return bytes.Equal(enc, b) || len(b) == len(enc)+1 && b[len(enc)] == '\n' && bytes.Equal(enc, b[:len(enc)])
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// holdsRaw reports whether v holds a non-empty json.RawMessage anywhere.
// It walks only into types that can hold one (mayHoldRaw).
func holdsRaw(v reflect.Value) bool {
	if !v.IsValid() || !mayHoldRaw(v.Type()) {
		return false
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && holdsRaw(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if holdsRaw(v.Field(i)) {
				return true
			}
		}
	case reflect.Slice:
		if v.Type() == rawMessageType {
			return v.Len() > 0
		}
		fallthrough
	case reflect.Array:
		for i := range v.Len() {
			if holdsRaw(v.Index(i)) {
				return true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if holdsRaw(it.Value()) {
				return true
			}
		}
	}
	return false
}

var rawTypes sync.Map // reflect.Type → bool

// mayHoldRaw reports whether a value of type t can hold a json.RawMessage.
// An interface may hold anything.
func mayHoldRaw(t reflect.Type) bool {
	if m, ok := rawTypes.Load(t); ok {
		return m.(bool)
	}
	m := typeHoldsRaw(t, map[reflect.Type]bool{})
	rawTypes.Store(t, m)
	return m
}

func typeHoldsRaw(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == rawMessageType {
		return true
	}
	if seen[t] {
		return false // a cycle adds nothing the first visit did not find
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return typeHoldsRaw(t.Elem(), seen)
	case reflect.Map:
		return typeHoldsRaw(t.Key(), seen) || typeHoldsRaw(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if typeHoldsRaw(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}
