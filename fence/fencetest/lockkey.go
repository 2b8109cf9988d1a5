package fencetest

import (
	"crypto/sha256"
	"encoding/base64"

	"github.com/starintel/starlease/lease"
)

// LockKey is a well-formed lock key named by name, for tests that need
// distinct keys without building identities: the key prefix and the
// base64url SHA-256 of name, the shape lease.CheckLockKey accepts.
func LockKey(name string) string {
	sum := sha256.Sum256([]byte(name))
	return lease.KeyPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}
