package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/internal/syncdir"
	"github.com/starintel/starlease/lease"
)

// ErrRestoreTarget is returned when the restore target is not empty: a
// restore never replaces an existing namespace (that could roll its
// counters back). It matches backupfile.ErrRestoreTarget.
var ErrRestoreTarget = backupfile.TargetError("restore target already exists; restore only into an empty path")

// Restore verifies the backup read from r and restores it as the store at
// the namespace's path, which must not exist. The namespace is closed: the
// restored file's gate makes every mutation fail with
// lease_backend_unavailable (reads answer) until recovery verification
// (OpenClosed, Closed.Finish) clears it. Any verification failure restores
// nothing. A local restore is not interruptible: ctx is unused.
func (n *Namespace) Restore(_ context.Context, r io.Reader) (h backupfile.Header, err error) {
	path := n.path
	tmp := path + ".restoring"
	// A redo log left where the store goes would be redone into it (or,
	// being another file's, refuse it): the log is part of the target.
	for _, p := range []string{path, tmp, RedoLogDir(path)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			return backupfile.Header{}, fmt.Errorf("%w: %s", ErrRestoreTarget, p)
		}
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return backupfile.Header{}, fmt.Errorf("%w: %v", ErrRestoreTarget, err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	h, err = backupfile.Read(r, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return backupfile.Header{}, err
	}
	if err := backupfile.CheckBackend(h, BackendName); err != nil {
		return backupfile.Header{}, err
	}
	db, err := bbolt.Open(tmp, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return backupfile.Header{}, fmt.Errorf("restored snapshot does not open: %s", classify(err))
	}
	marker, _ := json.Marshal(lease.RestoreMarker{BackupCreatedAt: h.CreatedAt, BackupSHA256: h.PayloadSHA256, RestoredAt: time.Now().UTC()})
	err = db.Update(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || !readableSchema(string(meta.Get(keySchema))) {
			return errSchema
		}
		if err := meta.Put(keyGate, []byte(gateRestored)); err != nil {
			return err
		}
		// A new engine id: no redo log of the file the backup was taken
		// from is ever redone into the restored one.
		if err := meta.Delete(keyEngineID); err != nil {
			return err
		}
		// The backup's tree holds every write the backup covers; no log
		// goes with it.
		if err := meta.Delete(keyRedoLog); err != nil {
			return err
		}
		return meta.Put(keyRestored, marker)
	})
	cerr := db.Close()
	switch {
	case errors.Is(err, errSchema):
		return backupfile.Header{}, fmt.Errorf("the backup's store file has an unsupported schema version: %w", err)
	case err != nil:
		return backupfile.Header{}, fmt.Errorf("cannot mark the restored snapshot: %w", err)
	case cerr != nil:
		return backupfile.Header{}, fmt.Errorf("cannot close the restored snapshot: %w", cerr)
	}
	// The file takes the store's place only once closed: a crash before
	// leaves no store at path, never an open one.
	if err = os.Rename(tmp, path); err != nil {
		return backupfile.Header{}, err
	}
	_ = syncdir.Sync(filepath.Dir(path)) // the restored file is durable already; its name best effort
	audit.ScreenLogger(n.o.Logger, nil).Info("lease store restored; namespace closed until recovery verification",
		"backup_sha256", h.PayloadSHA256, "backup_created_at", h.CreatedAt)
	return h, nil
}
