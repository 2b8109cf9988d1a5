package lease

import (
	"strings"
	"unicode/utf8"
)

// SecretShaped reports whether v holds what may be credential material:
// an API key prefix ("star_sk_"), a bearer authorization ("bearer "), both
// without regard to case, or a run of 64 or more hex digits (the form of a
// key's secret part, which is also the form of a SHA-256 digest: the two
// cannot be told apart, so both count).
//
// It is the one rule for values that must not be stored as given: request
// metadata holding such a value is refused (ValidateMetadata), and an audit
// event replaces such a value by a keyed hash (package audit).
func SecretShaped(v string) bool {
	return containsLower(v, "star_sk_") || containsLower(v, "bearer ") || HexRun(v, 64)
}

// HexRun reports whether v holds n or more hex digits in a row.
func HexRun(v string, n int) bool {
	run := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' {
			if run++; run >= n {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

// secretKeyWords are what a metadata key naming a credential contains,
// compared with its separators (". _ : -") removed.
var secretKeyWords = []string{"password", "passwd", "passphrase", "secret", "token", "apikey",
	"authorization", "bearer", "privatekey", "accesskey", "cookie"}

// secretKey reports whether a (canonical, lower-case) metadata key names a
// credential: "password", "client_secret", "api-key", "x.authorization".
func secretKey(k string) bool {
	compact := strings.Map(func(r rune) rune {
		if strings.ContainsRune("._:-", r) {
			return -1
		}
		return r
	}, k)
	for _, w := range secretKeyWords {
		if strings.Contains(compact, w) {
			return true
		}
	}
	return false
}

// checkMetadataSecretFree refuses metadata that holds, or is named to hold,
// credential material. The error names the field only, never the value.
func checkMetadataSecretFree(m Metadata) error {
	for k, v := range m {
		if secretKey(k) || SecretShaped(k) {
			return Invalid("metadata", "must not hold credentials or secrets: a key names a credential")
		}
		if s, ok := v.(string); ok && SecretShaped(s) {
			return Invalid("metadata", "must not hold credentials or secrets: a value looks like credential material (star_sk_, bearer, or 64 hex digits)")
		}
	}
	return nil
}

// containsLower is strings.Contains(strings.ToLower(v), word) for an ASCII
// lower-case word, without the lower-case copy when v is ASCII (where
// ToLower changes only A to Z): every opaque id and most audited values are.
func containsLower(v, word string) bool {
	// Lower-casing maps letters to letters and leaves every other ASCII
	// byte as it is, so a value without the word's first non-letter byte
	// ("_", " ") cannot match; most values are ruled out by one
	// IndexByte, which runs far faster than the loops below.
	for i := 0; i < len(word); i++ {
		if c := word[i]; c < 'a' || c > 'z' {
			if c < utf8.RuneSelf && strings.IndexByte(v, c) < 0 {
				return false
			}
			break
		}
	}
	for i := 0; i < len(v); i++ {
		if v[i] >= utf8.RuneSelf {
			return strings.Contains(strings.ToLower(v), word)
		}
	}
	for i := 0; i+len(word) <= len(v); i++ {
		j := 0
		for ; j < len(word); j++ {
			c := v[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != word[j] {
				break
			}
		}
		if j == len(word) {
			return true
		}
	}
	return false
}
