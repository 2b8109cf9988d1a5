package auth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
)

// KeyPrefix starts every API key of format version 1.
const KeyPrefix = "star_sk_v1_"

const (
	// CredentialIDLen is the length of a credential id: a ULID.
	CredentialIDLen = 26
	// SecretLen is the number of random bytes in a key's secret.
	SecretLen = 32
	// KeyLen is the exact length of an API key.
	KeyLen = len(KeyPrefix) + CredentialIDLen + 1 + 2*SecretLen
)

// ErrMalformedKey reports a string that is not an API key of the v1 format.
// It never carries the input.
var ErrMalformedKey = errors.New("auth: malformed API key")

// Secret is the secret part of an API key. It formats as "[redacted]" under
// every fmt verb and in JSON, so it cannot leak through a log line by
// accident; use Bytes or KeyString to reach the material.
type Secret [SecretLen]byte

const redacted = "[redacted]"

// String returns "[redacted]".
func (Secret) String() string { return redacted }

// Format writes "[redacted]" for every verb.
func (Secret) Format(f fmt.State, _ rune) { io.WriteString(f, redacted) }

// MarshalJSON writes "[redacted]".
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// Bytes returns a copy of the secret's bytes.
func (s Secret) Bytes() []byte { b := make([]byte, SecretLen); copy(b, s[:]); return b }

// NewSecret draws a secret from crypto/rand.
func NewSecret() (Secret, error) {
	var s Secret
	if _, err := io.ReadFull(rand.Reader, s[:]); err != nil {
		return Secret{}, errors.New("auth: no randomness for a secret")
	}
	return s, nil
}

// NewCredentialID returns a new credential id: a ULID whose time part is now.
func NewCredentialID(now time.Time) (string, error) {
	id, err := ulid.New(ulid.Timestamp(now), rand.Reader)
	if err != nil {
		return "", errors.New("auth: cannot make a credential id")
	}
	return id.String(), nil
}

// FormatKey assembles the API key of a credential id and a secret.
func FormatKey(id string, secret Secret) string {
	return KeyPrefix + id + "_" + hex.EncodeToString(secret[:])
}

// ValidCredentialID reports whether id is a credential id exactly as this
// package prints them: 26 upper-case Crockford base32 characters whose value
// fits 128 bits (a first character of at most '7').
func ValidCredentialID(id string) bool {
	if len(id) != CredentialIDLen || id[0] > '7' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !isCrockford(id[i]) {
			return false
		}
	}
	return true
}

func isCrockford(c byte) bool {
	switch {
	case c >= '0' && c <= '9':
		return true
	case c >= 'A' && c <= 'Z':
		return c != 'I' && c != 'L' && c != 'O' && c != 'U'
	}
	return false
}

// ParseKey splits an API key into its credential id and secret. It is
// strict: the exact prefix, a valid upper-case ULID, one underscore and
// exactly 64 lower-case hex characters, nothing before or after. Every
// failure is ErrMalformedKey, which never contains the input.
func ParseKey(key string) (id string, secret Secret, err error) {
	if len(key) != KeyLen || key[:len(KeyPrefix)] != KeyPrefix {
		return "", Secret{}, ErrMalformedKey
	}
	rest := key[len(KeyPrefix):]
	id, sep, hexSecret := rest[:CredentialIDLen], rest[CredentialIDLen], rest[CredentialIDLen+1:]
	if !ValidCredentialID(id) || sep != '_' {
		return "", Secret{}, ErrMalformedKey
	}
	if !lease.LowerHex(hexSecret) {
		return "", Secret{}, ErrMalformedKey
	}
	if _, err := hex.Decode(secret[:], []byte(hexSecret)); err != nil {
		return "", Secret{}, ErrMalformedKey
	}
	return id, secret, nil
}
