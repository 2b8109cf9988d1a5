package bolt

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// BackendName is the backend recorded in bolt backups.
const BackendName = "bolt"

var (
	// keyRestored holds the restore marker of a restored namespace.
	keyRestored = []byte("restored_unverified")
	// keyGate closes the namespace while it exists: every mutation is
	// refused (lease_backend_unavailable), reads answer. Restore sets it;
	// only recovery's Finish clears it.
	keyGate  = []byte("gate")
	keyEpoch = []byte("epoch")
	// keyCounterFloor is the recovery epoch's floor under every counter.
	keyCounterFloor = []byte("counter_floor")
	keyRecovery     = []byte("last_recovery")
)

// gateRestored is the gate of a restored namespace.
const gateRestored = "restored from a backup, awaiting recovery verification"

// Backup writes one consistent point-in-time snapshot of the store (one
// read transaction) as a versioned, checksummed backup file: counters,
// idempotency evidence, active records, history, lease states, high-water
// marks, accepted commits, the outbox and the backend clock.
//
// sections are carried after the snapshot (e.g. the credentials, which
// live outside the store), each verified like it on restore.
func (s *Store) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error) {
	if err := s.begin(ctx); err != nil {
		return backupfile.Header{}, err
	}
	// The snapshot is the tree's: it must hold every write acknowledged
	// before the backup began.
	if err := s.sync(); err != nil {
		return backupfile.Header{}, s.storageReadError(err)
	}
	tx, err := s.db.Begin(false)
	if err != nil {
		return backupfile.Header{}, s.storageReadError(err)
	}
	defer tx.Rollback()
	var m backupfile.Header
	counts := map[string]int64{}
	for _, b := range [][]byte{bucketLeases, bucketHighWater, bucketCommits, bucketOutbox, bucketOutboxDead} {
		counts[string(b)] = int64(tx.Bucket(b).Stats().KeyN)
	}
	// The header keeps the per-kind counts of the schema 2 buckets.
	kinds := map[byte]string{kindCounter: "counters", kindIdem: "idem", kindActive: "active", kindHistory: "history"}
	for _, name := range kinds {
		counts[name] = 0
	}
	if err := tx.Bucket(bucketIdent).ForEach(func(k, _ []byte) error {
		if _, kind, ok := splitIdentKey(k); ok && kinds[kind] != "" {
			counts[kinds[kind]]++
		}
		return nil
	}); err != nil {
		return backupfile.Header{}, s.storageReadError(err)
	}
	// The snapshot is copied once, beside the store file, and the backup
	// reads that copy twice (hash, then emit): tx.WriteTo copies free
	// pages too, which concurrent writers reuse, so two passes over the
	// live file differ on a busy store.
	snap, err := os.CreateTemp(filepath.Dir(s.db.Path()), ".backup-snapshot-*")
	if err != nil {
		s.log.Error("lease store backup failed", "error", err)
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "backup failed: no room for the snapshot beside the store file")
	}
	defer func() { snap.Close(); os.Remove(snap.Name()) }()
	if _, err = tx.WriteTo(snap); err == nil {
		m, err = backupfile.Write(w, backupfile.Header{Backend: BackendName, CreatedAt: s.now().UTC(), Counts: counts},
			func(w io.Writer) error { _, err := io.Copy(w, io.NewSectionReader(snap, 0, 1<<62)); return err }, sections...)
	}
	if err != nil {
		s.log.Error("lease store backup failed", "error", err)
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "backup failed")
	}
	s.log.Info("AUDIT lease store backup taken", "backend", BackendName, "payload_sha256", m.PayloadSHA256,
		"payload_bytes", m.PayloadBytes, "counters", counts["counters"], "active", counts["active"])
	return m, nil
}
