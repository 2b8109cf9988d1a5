package bolt

import (
	"bytes"

	bbolt "go.etcd.io/bbolt"
)

// The ident bucket holds every per-identity fact a lease mutation touches,
// keyed lock key ‖ 0 ‖ kind ‖ rest. Lock keys are one fixed-length form
// without a 0 byte (lease.CheckLockKey), so an identity's facts sort
// together and one mutation rewrites one leaf for all of them: the store
// is bound by the pages each group commit writes, and the schema 2 layout
// (one bucket per kind, each keyed by a hash) dirtied four leaves per
// mutation for what is here one.
const (
	kindActive  = 'a' // → the active record
	kindCounter = 'c' // → uint64 fencing counter, never deleted
	kindHistory = 'h' // ‖ seq (uint64) → terminal evidence
	kindIdem    = 'i' // ‖ idempotency scope → evidence
)

func identKey(lockKey string, kind byte, rest string) []byte {
	k := make([]byte, 0, len(lockKey)+2+len(rest)+8)
	k = append(k, lockKey...)
	k = append(k, 0, kind)
	return append(k, rest...)
}

func activeKey(lockKey string) []byte { return identKey(lockKey, kindActive, "") }

func counterKey(lockKey string) []byte { return identKey(lockKey, kindCounter, "") }

func idemKey(lockKey, scope string) []byte { return identKey(lockKey, kindIdem, scope) }

// historyPrefix precedes the sequence number of each of lockKey's history
// entries.
func historyPrefix(lockKey string) []byte { return identKey(lockKey, kindHistory, "") }

func historyKey(lockKey string, seq uint64) []byte {
	return append(historyPrefix(lockKey), u64(seq)...)
}

// splitIdentKey returns the lock key and kind of an ident key; ok is false
// for a key of no known shape.
func splitIdentKey(k []byte) (lockKey string, kind byte, ok bool) {
	i := bytes.IndexByte(k, 0)
	if i <= 0 || i+1 >= len(k) {
		return "", 0, false
	}
	return string(k[:i]), k[i+1], true
}

// eachOfKind calls fn with the lock key and value of every ident entry of
// kind, in lock key order. It reads the whole bucket: for recovery and
// backups, not for requests.
func eachOfKind(tx *bbolt.Tx, kind byte, fn func(lockKey string, k, v []byte) error) error {
	return tx.Bucket(bucketIdent).ForEach(func(k, v []byte) error {
		if lockKey, kd, ok := splitIdentKey(k); ok && kd == kind {
			return fn(lockKey, k, v)
		}
		return nil
	})
}
