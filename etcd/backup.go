package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// A backup is the whole prefix at one etcd revision: paged range reads,
// the first of them linearizable (it fixes the revision), every later one
// pinned to that revision. etcd's MVCC serves every page from the same
// snapshot, so lease operations go on while it reads and nothing is
// paused. The revision must outlive the read: a compaction past it fails
// the backup, which is then taken again.
//
// Credentials (cred/) travel in the payload, as Valkey's do: they live in
// the prefix, and a restored prefix without them would lock every client
// out. The audit stream (audit/) does not: it is append-only evidence a
// restore must not roll back, and it stays where it is. The gate and the
// restore marker are the prefix's recovery state, never carried: a
// restore writes its own. Nor are the clocks the servers publish.

// entry is one key of a backup payload (one JSON line): its name within
// the prefix and its value, both bytes (base64 in JSON), since keys hold
// NUL separators and values binary counters.
type entry struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

// valueRule is what a backup requires of a family's values.
type valueRule uint8

const (
	anyValue   valueRule = iota
	u64Value             // 8 bytes, big-endian
	tokenValue           // 8 bytes, at most lease.MaxFencingToken
)

// family is what a backup knows of the keys under one first segment of
// the prefix: the name the backup header counts them by, the rule of
// their values, and whether the rest of the key begins with a lock key
// (up to a NUL), which is checked.
type family struct {
	count   string
	rule    valueRule
	lockKey bool
}

// families are the prefix's key families (see the package comment); a key
// outside them fails a backup and a restore closed. Counters and
// high-water marks are checked strictly: recovery decides on them.
var families = map[string]family{
	"a":    {"active", anyValue, true},
	"c":    {"counter", tokenValue, true},
	"t":    {"time", anyValue, false}, // a malformed time is rewritten by the next transition
	"i":    {"idempotency", anyValue, false},
	"k":    {"commit", anyValue, false},
	"w":    {"high_water", tokenValue, true},
	"s":    {"commit_seq", u64Value, false},
	"hs":   {"history_seq", u64Value, false},
	"h":    {"history", anyValue, false},
	"l":    {"lease", anyValue, false},
	"x":    {"index", anyValue, false},
	"q":    {"quarantine", anyValue, false},
	"o":    {"outbox", anyValue, false},
	"oi":   {"outbox_id", anyValue, false},
	"od":   {"outbox_dead", anyValue, false},
	"ae":   {"expiry", anyValue, false},
	"ie":   {"expiry", anyValue, false},
	"ke":   {"expiry", anyValue, false},
	"he":   {"expiry", anyValue, false},
	"cred": {"credential", anyValue, false},
}

// metaKeys are the keys under meta/ a backup carries.
var metaKeys = map[string]valueRule{
	"schema": anyValue, "floor": tokenValue, "epoch": u64Value, "outbox_seq": u64Value,
	"outbox_usage": anyValue, "dead_seq": u64Value, "dead_count": u64Value, "last_recovery": anyValue,
}

// skipped reports a key (within the prefix) a backup leaves out. The
// servers' published clocks (meta/clock/) go too: each lives under an etcd
// lease of its server, and restored without one it would never expire.
func skipped(key string) bool {
	return key == "meta/gate" || key == "meta/restored" || strings.HasPrefix(key, "audit/") ||
		strings.HasPrefix(key, "meta/clock/")
}

// checkEntry validates a key (within the prefix) to carry and its value
// against the layout, and names the count it falls under. Errors are
// corrupt and name the family, never the key (it holds a lock key).
func checkEntry(key string, v []byte) (string, error) {
	fam, rest, ok := strings.Cut(key, "/")
	if !ok || rest == "" {
		return "", lease.Errorf(lease.CodeCorrupt, "the prefix holds a key outside the lease layout")
	}
	var f family
	if fam == "meta" {
		rule, known := metaKeys[rest]
		if !known {
			return "", lease.Errorf(lease.CodeCorrupt, "the prefix holds an unknown meta/ key")
		}
		if rest == "schema" && string(v) != schemaVersion {
			return "", lease.Errorf(lease.CodeCorrupt, "the backup's layout version is not %s", schemaVersion)
		}
		f = family{count: "meta", rule: rule}
	} else if f, ok = families[fam]; !ok {
		return "", lease.Errorf(lease.CodeCorrupt, "the prefix holds a key outside the lease layout (%s/)", strings.ToValidUTF8(fam[:min(len(fam), 16)], "?"))
	}
	if f.lockKey {
		lk, _, _ := strings.Cut(rest, "\x00")
		if lease.CheckLockKey(lk) != nil {
			return "", lease.Errorf(lease.CodeCorrupt, "a %s key (%s/) names a malformed lock key", f.count, fam)
		}
	}
	if f.rule != anyValue {
		n, ok := readU64(v)
		if !ok || v == nil || (f.rule == tokenValue && n > lease.MaxFencingToken) {
			return "", lease.Errorf(lease.CodeCorrupt, "a %s value (%s/) is malformed", f.count, fam)
		}
	}
	return f.count, nil
}

// scanPage is how many keys one range read of a backup or a recovery
// returns (a var: tests make pages small).
var scanPage int64 = 256

// scanHook, if set, runs between two pages of a scan (tests only).
var scanHook func()

// scan calls fn with every key under prefix and its value, in key order,
// in paged range reads at revision rev: 0 means the current revision,
// fixed by the first read, which is linearizable. It returns the revision
// read. With keysOnly the values are nil.
func (s *Store) scan(ctx context.Context, prefix string, rev int64, keysOnly bool, fn func(key string, value []byte) error) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(scanPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		cctx, cancel := s.bound(ctx)
		r, err := s.cli.Get(cctx, from, opts...)
		cancel()
		if err != nil {
			return rev, s.readFailure(err)
		}
		if rev == 0 {
			rev = r.Header.Revision
		}
		for _, kv := range r.Kvs {
			if err := fn(string(kv.Key), kv.Value); err != nil {
				return rev, err
			}
		}
		if !r.More || len(r.Kvs) == 0 {
			return rev, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
		if scanHook != nil {
			scanHook()
		}
	}
}

// readFailure maps a failed read; a revision compacted while it was read
// is said so (the read is taken again, at a newer one).
func (s *Store) readFailure(err error) error {
	if strings.Contains(err.Error(), "required revision has been compacted") {
		return lease.Errorf(lease.CodeBackendUnavailable, "the etcd revision being read was compacted meanwhile; run it again")
	}
	return s.failure(err, false)
}

// Backup writes the whole prefix at one etcd revision as a versioned,
// checksummed backup file: counters, idempotency and commit evidence,
// active records, history, high-water marks, identity times, List indexes,
// expiry indexes, the outbox, lease-id lookups, the counter floor and
// epoch, and the credentials (verifiers only: the store never holds a
// secret); not the audit stream. Lease operations go on meanwhile. A
// prefix closed for recovery is refused: its counters are not yet
// decided. sections are carried after the snapshot, each verified like it
// on restore.
func (s *Store) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error) {
	if err := s.begin(ctx); err != nil {
		return backupfile.Header{}, err
	}
	// The gate's read fixes the revision every page is read at.
	gate, _, rev, err := s.gateKV(ctx)
	if err != nil {
		return backupfile.Header{}, err
	}
	if gate != nil {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed (%s); cannot back it up", gate)
	}
	var payload bytes.Buffer
	enc := json.NewEncoder(&payload)
	counts := map[string]int64{}
	schema := false
	if _, err := s.scan(ctx, s.keys.p, rev, false, func(key string, v []byte) error {
		rel := key[len(s.keys.p):]
		if skipped(rel) {
			return nil
		}
		count, err := checkEntry(rel, v)
		if err != nil {
			return err
		}
		schema = schema || rel == "meta/schema"
		counts[count]++
		return enc.Encode(entry{Key: []byte(rel), Value: v})
	}); err != nil {
		return backupfile.Header{}, err
	}
	if !schema {
		return backupfile.Header{}, lease.Errorf(lease.CodeCorrupt, "the prefix has lost its layout version")
	}
	h, err := backupfile.Write(w, backupfile.Header{Backend: BackendName, CreatedAt: s.now().UTC(), Counts: counts},
		func(w io.Writer) error { _, err := w.Write(payload.Bytes()); return err }, sections...)
	if err != nil {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "cannot write the backup: %v", err)
	}
	s.log.Info("lease store backup taken", "backend", BackendName, "revision", rev, "payload_sha256", h.PayloadSHA256,
		"counters", counts["counter"], "active", counts["active"])
	return h, nil
}

// gateKV reads the gate linearizably: its value (nil when open), its mod
// revision, and the revision of the read.
func (s *Store) gateKV(ctx context.Context) (value []byte, mod, rev int64, err error) {
	cctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Get(cctx, s.keys.gate())
	if err != nil {
		return nil, 0, 0, s.failure(err, false)
	}
	if len(r.Kvs) == 1 {
		value, mod = r.Kvs[0].Value, r.Kvs[0].ModRevision
		if value == nil {
			value = []byte{}
		}
	}
	return value, mod, r.Header.Revision, nil
}
