package bolt

import (
	"bytes"
	"encoding/binary"
	"slices"

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
	case schemaVersion, schemaVersionV10, schemaVersionV9, schemaVersionV8, schemaVersionV7, schemaVersionV6, schemaVersionV5, schemaVersionV4, schemaVersionV3, schemaVersionV2, schemaVersionV1:
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
		fallthrough
	case schemaVersionV6:
		if err := migrateV6(tx); err != nil {
			return err
		}
		fallthrough
	case schemaVersionV7:
		// Version 8 changes no value (it adds the redo log).
		fallthrough
	case schemaVersionV8:
		// Version 9 adds history counts, which archive makes when it
		// first finds none.
		fallthrough
	case schemaVersionV9:
		// Version 10 adds a form of evidence; the version 2 evidence a
		// file holds stays as it is (readers take both).
		fallthrough
	case schemaVersionV10:
		// Version 11 adds a form of evidence and one of history entries;
		// the version 3 evidence and version 2 entries a file holds stay
		// as they are (readers take every version).
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
			return aexp.Put(timeIndexKey(rec.ExpiresAt, []byte(rec.LockKey)), nil) // schema 2's text lock key
		}
		return nil // corrupt: never reaped, as before
	}); err != nil {
		return err
	}
	return forEachIn(tx, legacyHistory, func(k, v []byte) error {
		if h, err := lease.DecodeHistoryEntry(v); err == nil {
			return hexp.Put(timeIndexKey(h.EndedAt, k), nil)
		}
		return nil
	})
}

// migrateV2 moves the per-kind buckets into bucketIdent (in the schema 6
// layout, which migrateV6 then packs) and rewrites the
// time indexes that name their keys. Values move byte for byte, corrupt
// ones included (they stay quarantined where they are read). Evidence is
// placed under the lock key of the lease it holds; evidence that does not
// decode has no place, and the migration refuses the file rather than
// lose it (a retry of its request would run again).
func migrateV2(tx *bbolt.Tx) error {
	ident := tx.Bucket(bucketIdent)
	if err := forEachIn(tx, legacyActive, func(k, v []byte) error { return ident.Put(v6IdentKey(string(k), kindActive, ""), v) }); err != nil {
		return err
	}
	if err := forEachIn(tx, legacyCounters, func(k, v []byte) error { return ident.Put(v6IdentKey(string(k), kindCounter, ""), v) }); err != nil {
		return err
	}
	if err := forEachIn(tx, legacyHistory, func(k, v []byte) error {
		lockKey, seq, ok := splitLegacyHistoryKey(k)
		if !ok {
			return lease.Errorf(lease.CodeCorrupt, "cannot migrate the store file: a history key is malformed")
		}
		return ident.Put(v6IdentKey(lockKey, kindHistory, string(u64(seq))), v)
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
	if err := rewriteIndex(tx, bucketHistoryExp, func(old []byte) []byte {
		if lockKey, seq, ok := splitLegacyHistoryKey(old); ok {
			return v6IdentKey(lockKey, kindHistory, string(u64(seq)))
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
		nk := v6IdentKey(ev.Lease.LockKey, kindIdem, string(k))
		placed[string(k)] = nk
		return ident.Put(nk, v)
	}); err != nil {
		return err
	}
	if err := rewriteIndex(tx, bucketIdemExp, func(scope []byte) []byte { return placed[string(scope)] }); err != nil {
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

// rewriteIndex replaces every entry ms ‖ key of the time index name with
// ms ‖ to(key); an entry to answers nil for is dropped (it names nothing).
func rewriteIndex(tx *bbolt.Tx, name []byte, to func(key []byte) []byte) error {
	return rewriteBucket(tx, name, func(k, _ []byte) ([]byte, []byte, error) {
		if len(k) < 8 {
			return nil, nil, nil
		}
		if nk := to(k[8:]); nk != nil {
			return append(bytes.Clone(k[:8]), nk...), nil, nil
		}
		return nil, nil, nil
	})
}

// rewriteBucket replaces every entry k → v of bucket name with to(k, v),
// or drops it when to answers a nil key; an error of to fails the rewrite
// before anything changes. The bucket is rebuilt, not edited in place:
// its entries are put in key order into a new bucket of the same name and
// sequence, each leaf filled once (deleting and reinserting a large
// bucket's keys one by one took minutes), as full as storeFills lets its
// bucket be split, or full.
func rewriteBucket(tx *bbolt.Tx, name []byte, to func(k, v []byte) ([]byte, []byte, error)) error {
	type entry struct{ k, v []byte }
	var out []entry
	b := tx.Bucket(name)
	seq := b.Sequence()
	if err := b.ForEach(func(k, v []byte) error {
		nk, nv, err := to(k, v)
		if nk != nil {
			out = append(out, entry{bytes.Clone(nk), bytes.Clone(nv)})
		}
		return err
	}); err != nil {
		return err
	}
	slices.SortFunc(out, func(a, b entry) int { return bytes.Compare(a.k, b.k) })
	if err := tx.DeleteBucket(name); err != nil {
		return err
	}
	nb, err := tx.CreateBucket(name)
	if err != nil {
		return err
	}
	if err := nb.SetSequence(seq); err != nil {
		return err
	}
	nb.FillPercent = 1
	for _, f := range storeFills {
		if bytes.Equal(f.bucket, name) {
			nb.FillPercent = f.fill
		}
	}
	for _, e := range out {
		if err := nb.Put(e.k, e.v); err != nil {
			return err
		}
	}
	return nil
}

// The schema 6 layout, which migrations up to it write and migrateV6
// packs: lock keys and idempotency scopes as text, a 0 after the lock key.
func v6IdentKey(lockKey string, kind byte, rest string) []byte {
	return append(append([]byte(lockKey), 0, kind), rest...)
}

// migrateV6 packs the lock keys and scopes of the schema 6 layout (see
// ident.go): in ident keys and the time indexes that name them, the
// active-expiry index and the lease-id lookups; List index entries lose
// their copy of the lock key, which the lookup of their lease id holds.
// A key of no schema 6 shape refuses the file: nothing writes one, and
// one moved wrongly would lose an identity's facts.
func migrateV6(tx *bbolt.Tx) error {
	malformed := lease.Errorf(lease.CodeCorrupt, "cannot migrate the store file: a key is not of schema 6")
	pack := func(old []byte) ([]byte, bool) {
		i := bytes.IndexByte(old, 0)
		if i <= 0 || i+1 >= len(old) || lease.CheckLockKey(string(old[:i])) != nil {
			return nil, false
		}
		lockKey, kind, rest := string(old[:i]), old[i+1], old[i+2:]
		switch {
		case kind == kindIdem:
			if scope, ok := digestOfText(string(rest)); ok {
				return identKey(lockKey, kind, scope), true
			}
		case kind == kindHistory && len(rest) == 8, (kind == kindActive || kind == kindCounter) && len(rest) == 0:
			return identKey(lockKey, kind, rest), true
		}
		return nil, false
	}
	if err := rewriteBucket(tx, bucketIdent, func(k, v []byte) ([]byte, []byte, error) {
		if nk, ok := pack(k); ok {
			return nk, v, nil
		}
		return nil, nil, malformed
	}); err != nil {
		return err
	}
	for _, b := range [][]byte{bucketIdemExp, bucketHistoryExp} {
		if err := rewriteIndex(tx, b, func(old []byte) []byte {
			if nk, ok := pack(old); ok {
				return nk
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if err := rewriteIndex(tx, bucketActiveExp, func(lockKey []byte) []byte {
		if lease.CheckLockKey(string(lockKey)) != nil {
			return nil
		}
		return packLockKey(string(lockKey))
	}); err != nil {
		return err
	}
	if err := rewriteBucket(tx, bucketLeases, func(k, v []byte) ([]byte, []byte, error) {
		i := bytes.IndexByte(v, 0)
		if i <= 0 || lease.CheckLockKey(string(v[:i])) != nil {
			return nil, nil, malformed
		}
		return k, append(packLockKey(string(v[:i])), v[i+1:]...), nil
	}); err != nil {
		return err
	}
	return rewriteBucket(tx, bucketIndex, func(k, _ []byte) ([]byte, []byte, error) { return k, nil, nil })
}
