package bolt

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// The ident bucket holds every per-identity fact a lease mutation touches,
// keyed packed lock key ‖ kind ‖ rest, so an identity's facts sort
// together and one mutation rewrites one leaf for all of them: the store
// is bound by the pages each group commit writes, and the schema 2 layout
// (one bucket per kind, each keyed by a hash) dirtied four leaves per
// mutation for what is here one.
//
// Since schema 7 a lock key is stored packed: the 32 bytes of the SHA-256
// its text carries (lease.KeyPrefix and base64url of them), so the text's
// 69 bytes do not repeat in every key of the identity and every index
// entry naming it. Packed keys have one length, so no separator follows.
const (
	kindActive  = 'a' // → the active record
	kindCounter = 'c' // → uint64 fencing counter, never deleted
	kindHistory = 'h' // ‖ seq (uint64) → terminal evidence
	kindIdem    = 'i' // ‖ packed idempotency scope → evidence
	// kindHistoryCount → uint64 number of the identity's history entries
	// (schema 9), kept by every write that adds or drops one, so trimming
	// to HistoryPerIdentity need not walk them. Absent means not counted
	// yet (a file migrated from schema 8): the next archive counts once.
	kindHistoryCount = 'n'
)

const packedLen = sha256.Size

// packDigest is the 32 bytes whose unpadded base64url is text. Lock keys
// (lease.CheckLockKey) and idempotency scopes (lease.IdempotencyScope)
// always are such text, and every caller passes one; any other text packs
// to foreignPacked(text).
func packDigest(text string) []byte {
	if b, ok := digestOfText(text); ok {
		return b
	}
	return foreignPacked(text)
}

// foreignPacked is the packed form of a text that is no lock key or scope:
// 33 bytes, so that in every key it is part of, byte 32 is 0xff where each
// stored key has a kind or its end. No stored key has one as a part, so
// it finds nothing, whatever the text (a hash of it alone would alias the
// identity whose canonical tuple is that text).
func foreignPacked(text string) []byte {
	sum := sha256.Sum256([]byte(text))
	return append(sum[:], 0xff)
}

// digestOfText decodes text, the unpadded base64url of 32 bytes; ok is
// false for any other text.
func digestOfText(text string) (b []byte, ok bool) {
	if len(text) != base64.RawURLEncoding.EncodedLen(packedLen) {
		return nil, false
	}
	b = make([]byte, packedLen, packedLen+9) // room for a kind and a sequence
	if n, err := base64.RawURLEncoding.Strict().Decode(b, []byte(text)); err != nil || n != packedLen {
		return nil, false
	}
	return b, true
}

// packLockKey is lockKey's packed form.
func packLockKey(lockKey string) []byte {
	if d, ok := strings.CutPrefix(lockKey, lease.KeyPrefix); ok {
		return packDigest(d)
	}
	return foreignPacked(lockKey)
}

// unpackLockKey is the text of a packed lock key.
func unpackLockKey(packed []byte) string {
	return lease.KeyPrefix + base64.RawURLEncoding.EncodeToString(packed)
}

func identKey(lockKey string, kind byte, rest []byte) []byte {
	return packedIdentKey(packLockKey(lockKey), kind, rest)
}

// packedIdentKey is identKey of a packed lock key (which it extends: pass
// a copy unless it is the caller's own).
func packedIdentKey(packed []byte, kind byte, rest []byte) []byte {
	return append(append(packed, kind), rest...)
}

func activeKey(lockKey string) []byte { return identKey(lockKey, kindActive, nil) }

func counterKey(lockKey string) []byte { return identKey(lockKey, kindCounter, nil) }

func idemKey(lockKey, scope string) []byte { return identKey(lockKey, kindIdem, packDigest(scope)) }

// historyPrefix precedes the sequence number of each of lockKey's history
// entries.
func historyPrefix(lockKey string) []byte { return identKey(lockKey, kindHistory, nil) }

func historyKey(lockKey string, seq uint64) []byte {
	return append(historyPrefix(lockKey), u64(seq)...)
}

func historyCountKey(lockKey string) []byte { return identKey(lockKey, kindHistoryCount, nil) }

// historyCountKeyOf is the history count key of the identity whose ident
// key k is.
func historyCountKeyOf(k []byte) []byte {
	return packedIdentKey(bytes.Clone(k[:packedLen]), kindHistoryCount, nil)
}

// isIdemKey reports an evidence key: packed lock key ‖ kindIdem ‖ packed
// scope.
func isIdemKey(k []byte) bool {
	return len(k) == 2*packedLen+1 && k[packedLen] == kindIdem
}

// isHistoryKey reports a history entry's key: packed lock key ‖
// kindHistory ‖ sequence.
func isHistoryKey(k []byte) bool {
	return len(k) == packedLen+1+8 && k[packedLen] == kindHistory
}

// splitIdentKey returns the lock key and kind of an ident key; ok is false
// for a key of no known shape.
func splitIdentKey(k []byte) (lockKey string, kind byte, ok bool) {
	if len(k) <= packedLen {
		return "", 0, false
	}
	return unpackLockKey(k[:packedLen]), k[packedLen], true
}

// eachOfKind calls fn with the lock key and value of every ident entry of
// kind, in packed lock key order. It reads the whole bucket: for recovery and
// backups, not for requests.
func eachOfKind(tx *layered.View, kind byte, fn func(lockKey string, k, v []byte) error) error {
	return tx.Bucket(bucketIdent).ForEach(func(k, v []byte) error {
		if lockKey, kd, ok := splitIdentKey(k); ok && kd == kind {
			return fn(lockKey, k, v)
		}
		return nil
	})
}
