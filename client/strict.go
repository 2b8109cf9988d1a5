package client

import (
	"bytes"
	"encoding/json"
	"io"
	"unicode/utf8"

	"github.com/starintel/starlease/lease"
)

// decodeStrict is lease.DecodeStrict(b, out) for a fresh *out, in one
// parse when it can: a body that decodes strictly (unknown fields refused,
// no trailing data) and is exactly out's own encoding (lease.IsOwnEncoding:
// json.Marshal, then at most the newline the server ends bodies with) has
// no duplicate or case-variant key; that is every answer of the server.
// Anything else, errors included, takes lease.DecodeStrict from a fresh
// *out, so its verdict and error stand.
func decodeStrict[T any](b []byte, out *T) error {
	if utf8.Valid(b) {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if dec.Decode(out) == nil {
			if _, err := dec.Token(); err == io.EOF && lease.IsOwnEncoding(b, out) {
				return nil
			}
		}
	}
	var zero T
	*out = zero
	return lease.DecodeStrict(b, out)
}
