package recovery

import (
	"context"
	"io"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// Backend is a lease namespace as backup, restore and recovery drive it:
// bolt.Namespace and valkey.Namespace implement it with the same names.
//
// It is defined here, by its user, and the backends implement it without
// importing this package, so they stay below every package that serves
// leases. That is why its types come from lease and backupfile:
// lease.ClosedNamespace, which OpenClosed returns, is the steps Verify
// drives.
type Backend interface {
	// Name is the backend recorded in the backups it writes.
	Name() string
	// Open reaches the namespace's existing store, as Backup does by
	// itself, so a caller can fail before preparing anything else. A
	// store that is not there is an error matching fs.ErrNotExist.
	Open(ctx context.Context) error
	// Backup writes one consistent snapshot of the namespace to w, with
	// sections after it (the credentials, when they live outside the
	// namespace), as a backupfile container.
	Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error)
	// Restore verifies the backup read from r and restores it into the
	// namespace, which must be empty (an error matching
	// backupfile.ErrRestoreTarget otherwise, and nothing restored). The
	// namespace stays closed, every mutation refused, until Verify.
	Restore(ctx context.Context, r io.Reader) (backupfile.Header, error)
	// OpenClosed opens the namespace, closed by Restore or a seal, for
	// Verify. It fails with a *lease.Error, or, for a namespace that is
	// open, possibly with a plain error: the operator must restore into it
	// or seal it first.
	OpenClosed(ctx context.Context) (lease.ClosedNamespace, error)
	// Close releases what Open reached; the namespace is not changed.
	Close() error
}

// Sealer is a Backend whose namespace can be closed after a failover (a
// replica promoted), so Verify can raise its counters before any lease
// operation runs on it. It reports whether it closed the namespace: one
// already closed for recovery stays as it is.
type Sealer interface {
	Seal(ctx context.Context) (bool, error)
}

// Auditor is a Backend whose namespace holds its own audit stream, where
// a Site without an audit file records the recovery steps.
type Auditor interface {
	AuditSink(ctx context.Context) (audit.Sink, error)
}
