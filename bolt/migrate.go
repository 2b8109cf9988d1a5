package bolt

import (
	"bytes"
	"encoding/binary"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// The per-kind buckets of schemas 1 and 2, which schema 3 keeps in
// bucketIdent. Only migrations read them.
var (
	legacyActive   = []byte("active")   // lock key → record v1
	legacyCounters = []byte("counters") // lock key → uint64
	legacyIdem     = []byte("idem")     // idempotency scope → evidence
	legacyHistory  = []byte("history")  // lock key ‖ 0 ‖ seq → terminal evidence
)

// readableSchema reports a schema this build opens: its own, or one that
// migrate brings to it (so a backup of it restores).
func readableSchema(v string) bool {
	switch v {
	case schemaVersion, schemaVersionV5, schemaVersionV4, schemaVersionV3, schemaVersionV2, schemaVersionV1:
		return true
	}
	return false
}

// migrate brings a file of an older schema to schemaVersion in the
// transaction that opens it, all or nothing: a migration that fails
// leaves the file as it was, and Open fails.
func migrate(tx *bbolt.Tx, from string) error {
	switch from {
	case schemaVersionV1:
		if err := migrateV1(tx); err != nil {
			return err
		}
		fallthrough
	case schemaVersionV2:
		if err := migrateV2(tx); err != nil {
			return err
		}
		fallthrough
	case schemaVersionV3, schemaVersionV4, schemaVersionV5:
		// Versions 4 to 6 only add forms of evidence, history and active
		// records; the version 1 values a file holds stay as they are
		// (readers take both).
	default:
		return errSchema
	}
	return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersion))
}

// migrateV1 builds schema 2's time indexes from the active records and the
// history (one pass each, once).
func migrateV1(tx *bbolt.Tx) error {
	aexp, hexp := tx.Bucket(bucketActiveExp), tx.Bucket(bucketHistoryExp)
	if err := forEachIn(tx, legacyActive, func(k, v []byte) error {
		if rec, err := lease.DecodeRecord(v); err == nil && rec.LockKey == string(k) {
			return aexp.Put(activeExpKey(rec), nil)
		}
		return nil // corrupt: never reaped, as before
	}); err != nil {
		return err
	}
	return forEachIn(tx, legacyHistory, func(k, v []byte) error {
		if h, err := lease.DecodeHistoryEntry(v); err == nil {
			return hexp.Put(historyExpKey(h.EndedAt, k), nil)
		}
		return nil
	})
}

// migrateV2 moves the per-kind buckets into bucketIdent and rewrites the
// time indexes that name their keys. Values move byte for byte, corrupt
// ones included (they stay quarantined where they are read). Evidence is
// placed under the lock key of the lease it holds; evidence that does not
// decode has no place, and the migration refuses the file rather than
// lose it (a retry of its request would run again).
func migrateV2(tx *bbolt.Tx) error {
	ident := tx.Bucket(bucketIdent)
	if err := forEachIn(tx, legacyActive, func(k, v []byte) error { return ident.Put(activeKey(string(k)), v) }); err != nil {
		return err
	}
	if err := forEachIn(tx, legacyCounters, func(k, v []byte) error { return ident.Put(counterKey(string(k)), v) }); err != nil {
		return err
	}
	if err := forEachIn(tx, legacyHistory, func(k, v []byte) error {
		lockKey, seq, ok := splitLegacyHistoryKey(k)
		if !ok {
			return lease.Errorf(lease.CodeCorrupt, "cannot migrate the store file: a history key is malformed")
		}
		return ident.Put(historyKey(lockKey, seq), v)
	}); err != nil {
		return err
	}
	// New history entries continue the old sequence, so an identity's
	// entries (and history page tokens) keep their order.
	if b := tx.Bucket(legacyHistory); b != nil && b.Sequence() > ident.Sequence() {
		if err := ident.SetSequence(b.Sequence()); err != nil {
			return err
		}
	}
	if err := rewriteIndex(tx.Bucket(bucketHistoryExp), func(old []byte) []byte {
		if lockKey, seq, ok := splitLegacyHistoryKey(old); ok {
			return historyKey(lockKey, seq)
		}
		return nil
	}); err != nil {
		return err
	}
	placed := map[string][]byte{}
	if err := forEachIn(tx, legacyIdem, func(k, v []byte) error {
		ev, err := lease.DecodeIdempotencyRecord(v)
		if err != nil {
			return lease.Errorf(lease.CodeCorrupt, "cannot migrate the store file: idempotency evidence is corrupt")
		}
		nk := idemKey(ev.Lease.LockKey, string(k))
		placed[string(k)] = nk
		return ident.Put(nk, v)
	}); err != nil {
		return err
	}
	if err := rewriteIndex(tx.Bucket(bucketIdemExp), func(scope []byte) []byte { return placed[string(scope)] }); err != nil {
		return err
	}
	for _, b := range [][]byte{legacyActive, legacyCounters, legacyHistory, legacyIdem} {
		if tx.Bucket(b) != nil {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
	}
	return nil
}

// forEachIn is ForEach over bucket name, which may not exist.
func forEachIn(tx *bbolt.Tx, name []byte, fn func(k, v []byte) error) error {
	b := tx.Bucket(name)
	if b == nil {
		return nil
	}
	return b.ForEach(fn)
}

// splitLegacyHistoryKey splits a schema 2 history key, lock key ‖ 0 ‖ seq.
func splitLegacyHistoryKey(k []byte) (string, uint64, bool) {
	i := bytes.IndexByte(k, 0)
	if i <= 0 || len(k)-i-1 != 8 {
		return "", 0, false
	}
	return string(k[:i]), binary.BigEndian.Uint64(k[i+1:]), true
}

// rewriteIndex replaces every entry ms ‖ key of a time index with ms ‖
// to(key); an entry to answers nil for is dropped (it names nothing).
func rewriteIndex(index *bbolt.Bucket, to func(key []byte) []byte) error {
	var old [][]byte
	if err := index.ForEach(func(k, _ []byte) error { old = append(old, bytes.Clone(k)); return nil }); err != nil {
		return err
	}
	for _, k := range old {
		if err := index.Delete(k); err != nil {
			return err
		}
	}
	for _, k := range old {
		if len(k) < 8 {
			continue
		}
		if nk := to(k[8:]); nk != nil {
			if err := index.Put(append(bytes.Clone(k[:8]), nk...), nil); err != nil {
				return err
			}
		}
	}
	return nil
}
