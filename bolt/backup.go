package bolt

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// Manifest describes a backup: the header of the backup file.
type Manifest = backupfile.Header

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

// ErrRestoreTarget is returned when the restore target is not empty: a
// restore never replaces an existing namespace (that could roll its
// counters back).
var ErrRestoreTarget = errors.New("restore target already exists; restore only into an empty path")

// Backup writes one consistent point-in-time snapshot of the store (one
// read transaction) as a versioned, checksummed backup file: counters,
// idempotency evidence, active records, history, lease states, high-water
// marks, accepted commits, the outbox and the backend clock.
//
// sections are carried after the snapshot (e.g. the credentials, which
// live outside the store), each verified like it on restore.
func (s *Store) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (Manifest, error) {
	if err := s.begin(ctx); err != nil {
		return Manifest{}, err
	}
	tx, err := s.db.Begin(false)
	if err != nil {
		return Manifest{}, s.storageReadError(err)
	}
	defer tx.Rollback()
	counts := map[string]int64{}
	for _, b := range [][]byte{bucketCounters, bucketIdem, bucketActive, bucketHistory, bucketLeases,
		bucketHighWater, bucketCommits, bucketOutbox, bucketOutboxDead} {
		counts[string(b)] = int64(tx.Bucket(b).Stats().KeyN)
	}
	m, err := backupfile.Write(w, Manifest{Backend: BackendName, CreatedAt: s.now().UTC(), Counts: counts},
		func(w io.Writer) error { _, err := tx.WriteTo(w); return err }, sections...)
	if err != nil {
		s.log.Error("lease store backup failed", "error", err)
		return Manifest{}, lease.Errorf(lease.CodeBackendUnavailable, "backup failed")
	}
	s.log.Info("AUDIT lease store backup taken", "backend", BackendName, "payload_sha256", m.PayloadSHA256,
		"payload_bytes", m.PayloadBytes, "counters", counts["counters"], "active", counts["active"])
	return m, nil
}

// RestoreMarker is stored in the meta bucket of a restored namespace.
type RestoreMarker = lease.RestoreMarker

// Restore verifies the backup read from r and restores it as the store at
// path, which must not exist. The namespace is closed: the restored file's
// gate makes every mutation fail with lease_backend_unavailable (reads
// answer) until recovery verification (OpenRestored, Restored.Finish)
// clears it. Any verification failure restores nothing.
func Restore(r io.Reader, path string) (err error) {
	tmp := path + ".restoring"
	for _, p := range []string{path, tmp} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %s", ErrRestoreTarget, p)
		}
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRestoreTarget, err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	h, err := backupfile.Read(r, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if h.Backend != BackendName {
		return fmt.Errorf("backup is of backend %q, not %q", h.Backend, BackendName)
	}
	db, err := bbolt.Open(tmp, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("restored snapshot does not open: %s", classify(err))
	}
	marker, _ := json.Marshal(RestoreMarker{BackupCreatedAt: h.CreatedAt, BackupSHA256: h.PayloadSHA256, RestoredAt: time.Now().UTC()})
	err = db.Update(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || string(meta.Get(keySchema)) != schemaVersion {
			return errSchema
		}
		if err := meta.Put(keyGate, []byte(gateRestored)); err != nil {
			return err
		}
		return meta.Put(keyRestored, marker)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cannot close the restored snapshot: %w", err)
	}
	// The file takes the store's place only once closed: a crash before
	// leaves no store at path, never an open one.
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	syncDir(filepath.Dir(path))
	slog.Default().Info("lease store restored; namespace closed until recovery verification",
		"backup_sha256", h.PayloadSHA256, "backup_created_at", h.CreatedAt)
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Restored is a restored namespace awaiting recovery verification. It
// offers only what recovery needs: the restored state and the one
// transaction that raises counters, ends restored leases and reopens.
type Restored struct {
	s *Store
}

// OpenRestored opens the restored store at path for recovery. Its gate
// must still be closed by the restore.
func OpenRestored(path string, o Options) (*Restored, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "no store at the restore path")
	}
	o.ReapInterval = -1
	s, err := Open(path, o)
	if err != nil {
		return nil, err
	}
	if s.gate != gateRestored {
		s.Close()
		return nil, lease.Errorf(lease.CodeCorrupt, "file is not a restored namespace awaiting verification")
	}
	return &Restored{s: s}, nil
}

// Close closes the store without reopening the namespace.
func (r *Restored) Close() error { return r.s.Close() }

// RestoredState is what a restored snapshot holds that recovery decides on.
type RestoredState = lease.RestoredState

var _ lease.ClosedNamespace = (*Restored)(nil)

// State reads the restored state in one read transaction. Malformed
// counters, marks or records fail closed.
func (r *Restored) State(ctx context.Context) (RestoredState, error) {
	st := RestoredState{Counters: map[string]uint64{}, HighWater: map[string]uint64{}}
	err := r.s.view(ctx, func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := json.Unmarshal(meta.Get(keyRestored), &st.Marker); err != nil {
			return lease.Errorf(lease.CodeCorrupt, "restore marker is corrupt")
		}
		if v := meta.Get(keyEpoch); len(v) == 8 {
			st.Epoch = binary.BigEndian.Uint64(v)
		}
		if err := tx.Bucket(bucketCounters).ForEach(func(k, v []byte) error {
			if len(v) != 8 {
				return lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
			}
			st.Counters[string(k)] = binary.BigEndian.Uint64(v)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketHighWater).ForEach(func(k, v []byte) error {
			i := indexOf(k, 0)
			if len(v) != 8 || i < 0 {
				return lease.Errorf(lease.CodeCorrupt, "a high-water mark is malformed")
			}
			key := string(k[:i])
			st.HighWater[key] = max(st.HighWater[key], binary.BigEndian.Uint64(v))
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketActive).ForEach(func(k, v []byte) error {
			rec, err := lease.DecodeRecord(v)
			if err != nil || rec.LockKey != string(k) {
				return lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
			}
			st.Active = append(st.Active, rec)
			return nil
		})
	})
	return st, err
}

func indexOf(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// FinishPlan is recovery's decision for a restored namespace.
type FinishPlan = lease.RecoveryPlan

// FinishResult reports what Finish changed.
type FinishResult = lease.RecoveryResult

// Finish applies plan in one write transaction — raise counters, end every
// restored active lease through the normal archive path (revoked with
// plan.Reason if live, expired if already expired: a restored TTL is never
// resurrected), clear the restored mark and the gate — reopening the
// namespace. r is closed afterwards.
func (r *Restored) Finish(ctx context.Context, plan FinishPlan) (FinishResult, error) {
	var res FinishResult
	if err := r.s.begin(ctx); err != nil {
		return FinishResult{}, err
	}
	// Not mutate: a refusal here must roll the whole transaction back.
	err := r.s.db.Update(func(tx *bbolt.Tx) error {
		res = FinishResult{}
		now := r.s.clock(tx)
		res.At = now
		counters := tx.Bucket(bucketCounters)
		for key, want := range plan.Counters {
			if want > lease.MaxFencingToken {
				return lease.Errorf(lease.CodeCounterExhausted, "recovery epoch would exceed the fencing token limit")
			}
			var cur uint64
			if v := counters.Get([]byte(key)); v != nil {
				if len(v) != 8 {
					return lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
				}
				cur = binary.BigEndian.Uint64(v)
			}
			if want > cur {
				if err := counters.Put([]byte(key), u64(want)); err != nil {
					return err
				}
				res.Raised++
			}
		}
		var active []*lease.Record
		if err := tx.Bucket(bucketActive).ForEach(func(k, v []byte) error {
			rec, err := lease.DecodeRecord(v)
			if err != nil || rec.LockKey != string(k) {
				return lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
			}
			active = append(active, rec)
			return nil
		}); err != nil {
			return err
		}
		for _, rec := range active {
			var err error
			if rec.LiveAt(now) {
				err = r.s.archive(tx, rec, lease.StateRevoked, now, ended{by: lease.RecoveryPrincipal, reason: plan.Reason})
				res.Revoked = append(res.Revoked, rec.LeaseID)
			} else {
				err = r.s.archive(tx, rec, lease.StateExpired, rec.ExpiresAt, ended{})
				res.Expired = append(res.Expired, rec.LeaseID)
			}
			if err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if plan.Epoch > 0 {
			if err := meta.Put(keyEpoch, u64(plan.Epoch)); err != nil {
				return err
			}
		}
		floor, ok := counterFloor(tx)
		if !ok {
			return lease.Errorf(lease.CodeCorrupt, "the counter floor is malformed")
		}
		if plan.Floor > floor {
			if err := meta.Put(keyCounterFloor, u64(plan.Floor)); err != nil {
				return err
			}
		}
		rec, _ := json.Marshal(map[string]any{"at": now, "epoch": plan.Epoch, "reason": plan.Reason,
			"raised": res.Raised, "revoked": len(res.Revoked), "restore": json.RawMessage(meta.Get(keyRestored))})
		if err := meta.Put(keyRecovery, rec); err != nil {
			return err
		}
		if err := meta.Delete(keyRestored); err != nil {
			return err
		}
		return meta.Delete(keyGate)
	})
	if err != nil {
		var le *lease.Error
		if !errors.As(err, &le) {
			err = lease.Errorf(lease.CodeBackendUnavailable, "recovery transaction failed")
		}
		return FinishResult{}, err
	}
	// Committed: the namespace is open whatever closing the file says.
	if err := r.s.Close(); err != nil {
		r.s.log.Error("closing the recovered store failed", "code", lease.CodeOf(err))
	}
	return res, nil
}

// counterFloor is the namespace's counter floor (0 before any recovery
// epoch): no acquisition gets a token at or below it.
//
// A floor of the wrong length is corrupt (ok false): reading it as 0 would
// drop a recovery epoch's guarantee silently.
func counterFloor(tx *bbolt.Tx) (floor uint64, ok bool) {
	v := tx.Bucket(bucketMeta).Get(keyCounterFloor)
	switch len(v) {
	case 0:
		return 0, true
	case 8:
		return binary.BigEndian.Uint64(v), true
	}
	return 0, false
}
