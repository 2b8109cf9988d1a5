package etcd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// ErrRestoreTarget is returned when the restore target prefix holds any
// key but its layout version and the clocks servers (and the restore
// itself) publish there: a restore never merges into or replaces a prefix
// (that could roll its counters back). It matches
// backupfile.ErrRestoreTarget.
var ErrRestoreTarget = backupfile.TargetError("restore target key prefix is not empty; restore only into an empty prefix")

// Restore batches: etcd refuses a transaction of more than 128 operations
// or compares (--max-txn-ops) or of a request past 1.5 MiB
// (--max-request-bytes); a batch has one compare and one put per key, and
// the gate's compare.
const (
	restoreBatchKeys  = 64
	restoreBatchBytes = 1 << 20
)

// restoreHook, if set, runs before each batch with its index; an error
// stops the restore there (tests only: a crash part-way).
var restoreHook func(batch int) error

// readPayload strictly reads a backup payload: JSON lines of entry, keys
// in strictly increasing order (so none twice), each carried by a backup
// and checked against the layout, the layout version among them.
func readPayload(b []byte) ([]entry, error) {
	var out []entry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	schema := false
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var e entry
		if err := dec.Decode(&e); err != nil || dec.More() {
			return nil, lease.Errorf(lease.CodeCorrupt, "backup entry %d is malformed", len(out)+1)
		}
		key := string(e.Key)
		if n := len(out); n > 0 && string(out[n-1].Key) >= key {
			return nil, lease.Errorf(lease.CodeCorrupt, "backup entry %d is out of key order", n+1)
		}
		if skipped(key) {
			return nil, lease.Errorf(lease.CodeCorrupt, "backup holds keys a backup never carries (recovery state, clocks or audit stream)")
		}
		if _, err := checkEntry(key, e.Value); err != nil {
			return nil, err
		}
		schema = schema || key == "meta/schema"
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, lease.Errorf(lease.CodeCorrupt, "backup payload is malformed: %v", err)
	}
	if !schema {
		return nil, lease.Errorf(lease.CodeCorrupt, "backup lacks the layout version")
	}
	return out, nil
}

// Restore verifies the backup read from r and restores it into this
// store's prefix, which must hold nothing but its layout version
// (ErrRestoreTarget otherwise, and nothing written).
//
// Its first write, in the transaction that finds the prefix empty, closes
// the prefix (the gate, as "restoring") and records the restore marker:
// from then on every mutation is refused with lease_backend_unavailable,
// whatever happens to the restore. The keys follow in bounded
// transactions, each conditional on the gate still being this restore's,
// and only once all are written does the gate say "restored", which
// recovery (Namespace.OpenClosed, then recovery.Verify) accepts; reads
// answer meanwhile. A backup that fails verification restores nothing; a
// restore that stops part-way leaves the prefix closed as "restoring",
// which recovery refuses: empty the prefix and restore again.
func (s *Store) Restore(ctx context.Context, r io.Reader) (backupfile.Header, error) {
	var payload bytes.Buffer
	h, err := backupfile.Read(r, &payload)
	if err != nil {
		return backupfile.Header{}, err
	}
	if err := backupfile.CheckBackend(h, BackendName); err != nil {
		return backupfile.Header{}, err
	}
	entries, err := readPayload(payload.Bytes())
	if err != nil {
		return backupfile.Header{}, err
	}
	if err := s.begin(ctx); err != nil {
		return backupfile.Header{}, err
	}
	marker, err := json.Marshal(lease.RestoreMarker{BackupCreatedAt: h.CreatedAt, BackupSHA256: h.PayloadSHA256, RestoredAt: s.now().UTC()})
	if err != nil {
		return backupfile.Header{}, err
	}
	gateRev, err := s.closeForRestore(ctx, marker)
	if err != nil {
		return backupfile.Header{}, err
	}
	// The target holds the layout version already, the same (checked as
	// it was closed).
	entries = slices.DeleteFunc(entries, func(e entry) bool { return string(e.Key) == "meta/schema" })
	written := 0
	for batch := 0; written < len(entries); batch++ {
		n := restoreBatch(s.keys.p, entries[written:])
		if restoreHook != nil {
			if err := restoreHook(batch); err != nil {
				return backupfile.Header{}, partial(err.Error())
			}
		}
		if err := s.restoreKeys(ctx, gateRev, entries[written:written+n]); err != nil {
			return backupfile.Header{}, err
		}
		written += n
	}
	// Complete: only now may recovery take the prefix.
	cctx, cancel := s.bound(ctx)
	defer cancel()
	res, err := s.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(s.keys.gate()), "=", gateRev)).
		Then(clientv3.OpPut(s.keys.gate(), gateRestored)).Commit()
	switch {
	case err != nil:
		return backupfile.Header{}, partial("its last write failed: " + classify(err))
	case !res.Succeeded:
		return backupfile.Header{}, partial("the gate changed during the restore")
	}
	s.log.Info("lease namespace restored; closed until recovery verification", "backup_sha256", h.PayloadSHA256,
		"keys", len(entries), "revision", res.Header.Revision)
	return h, nil
}

// partial is the error of a restore that stopped after its first write.
func partial(why string) error {
	return lease.Errorf(lease.CodeBackendUnavailable, "the restore stopped part-way (%s); the prefix stays closed as restoring: empty it and restore again", why)
}

// closeForRestore closes the empty prefix for a restore and records its
// marker, in the one transaction that finds it empty. It returns the
// gate's mod revision, which every later write of the restore compares.
func (s *Store) closeForRestore(ctx context.Context, marker []byte) (int64, error) {
	p, schema, clocks := s.keys.p, s.keys.schema(), s.keys.clockPrefix()
	cctx, cancel := s.bound(ctx)
	defer cancel()
	// Empty but for the layout version and the clocks: no key in
	// [p, clocks), [end of clocks, schema) nor (schema, end of p).
	r, err := s.cli.Txn(cctx).If(
		clientv3.Compare(clientv3.Value(schema), "=", schemaVersion),
		clientv3.Compare(clientv3.CreateRevision(p), "=", 0).WithRange(clocks),
		clientv3.Compare(clientv3.CreateRevision(clientv3.GetPrefixRangeEnd(clocks)), "=", 0).WithRange(schema),
		clientv3.Compare(clientv3.CreateRevision(schema+"\x00"), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(p)),
	).Then(
		clientv3.OpPut(s.keys.gate(), gateRestoring),
		clientv3.OpPut(s.keys.restored(), string(marker)),
	).Else(
		clientv3.OpGet(p, clientv3.WithRange(clientv3.GetPrefixRangeEnd(p)), clientv3.WithKeysOnly(), clientv3.WithLimit(64)),
	).Commit()
	if err != nil {
		return 0, lease.Errorf(lease.CodeOutcomeUnknown,
			"the restore's first write may have been applied (%s): if the prefix is closed as restoring, empty it and restore again", classify(err))
	}
	if !r.Succeeded {
		for _, kv := range r.Responses[0].GetResponseRange().Kvs {
			if k := string(kv.Key); k != schema && !strings.HasPrefix(k, clocks) {
				fam, _, _ := bytes.Cut(kv.Key[len(p):], []byte("/"))
				return 0, fmt.Errorf("%w: it holds keys under %s/", ErrRestoreTarget, strings.ToValidUTF8(string(fam[:min(len(fam), 16)]), "?"))
			}
		}
		return 0, fmt.Errorf("%w: it holds keys (or its layout version changed)", ErrRestoreTarget)
	}
	return r.Header.Revision, nil
}

// restoreBatch is how many of entries the next restore transaction takes:
// at most restoreBatchKeys and restoreBatchBytes, at least one.
func restoreBatch(prefix string, entries []entry) int {
	size := 0
	for i, e := range entries {
		// The key travels twice: in its compare and in its put.
		size += 2*(len(prefix)+len(e.Key)) + len(e.Value) + 16
		if i > 0 && (i == restoreBatchKeys || size > restoreBatchBytes) {
			return i
		}
	}
	return len(entries)
}

// restoreKeys writes entries in one transaction, each only where no key
// is, and only while the gate is still this restore's.
func (s *Store) restoreKeys(ctx context.Context, gateRev int64, entries []entry) error {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.keys.gate()), "=", gateRev)}
	ops := make([]clientv3.Op, 0, len(entries))
	for _, e := range entries {
		k := s.keys.p + string(e.Key)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
		ops = append(ops, clientv3.OpPut(k, string(e.Value)))
	}
	cctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
	switch {
	case err != nil:
		return partial("a write failed: " + classify(err))
	case !r.Succeeded:
		return partial("the prefix changed during the restore")
	}
	return nil
}
