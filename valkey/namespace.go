package valkey

import (
	"context"
	"io"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// Namespace is a Valkey namespace as backup, restore and recovery reach it
// (the Backend of package recovery, which bolt.Namespace implements with
// the same names): options, connected on first use and until Close, so a
// tool connects only once it needs the server. OpenClosed connects on its
// own. Connections run no reaper: a tool's, not a server's. Not safe for
// concurrent use.
type Namespace struct {
	o Options
	s *Store
}

// NewNamespace returns the namespace o reaches.
func NewNamespace(o Options) *Namespace {
	o.ReapInterval = -1
	// A tool takes the namespace's stored format as it is (a backup
	// carries its switch): switching it would write into a restore's
	// empty target, or change a closed namespace.
	o.CompactFormat, o.CompactRecords, o.EmbeddedEvidence = false, false, false
	return &Namespace{o: o}
}

// Name is the backend recorded in the backups it writes.
func (n *Namespace) Name() string { return BackendName }

// Open connects (see Open of the package), unless connected already.
func (n *Namespace) Open(ctx context.Context) error {
	if n.s != nil {
		return nil
	}
	s, err := Open(ctx, n.o)
	if err != nil {
		return err
	}
	n.s = s
	return nil
}

// Backup connects and backs the namespace up; see Store.Backup.
func (n *Namespace) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error) {
	if err := n.Open(ctx); err != nil {
		return backupfile.Header{}, err
	}
	return n.s.Backup(ctx, w, sections...)
}

// Restore connects and restores the backup read from r into the
// namespace, which must be empty; see Store.Restore.
func (n *Namespace) Restore(ctx context.Context, r io.Reader) (backupfile.Header, error) {
	if err := n.Open(ctx); err != nil {
		return backupfile.Header{}, err
	}
	return n.s.Restore(ctx, r)
}

// Seal connects and closes the namespace after a failover; see
// Store.Seal.
func (n *Namespace) Seal(ctx context.Context) (bool, error) {
	if err := n.Open(ctx); err != nil {
		return false, err
	}
	return n.s.Seal(ctx)
}

// OpenClosed opens the namespace for recovery on a connection of its own.
// It must be closed by a restore or a Seal: an open namespace is refused
// with ErrNamespaceOpen, the one error here that is not a *lease.Error
// (the operator's to fix, not the backend's).
func (n *Namespace) OpenClosed(ctx context.Context) (lease.ClosedNamespace, error) {
	c, err := openClosed(ctx, n.o)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AuditSink connects and returns the namespace's audit stream (see
// Store.AuditSink), where the recovery steps are recorded.
func (n *Namespace) AuditSink(ctx context.Context) (audit.Sink, error) {
	if err := n.Open(ctx); err != nil {
		return nil, err
	}
	return n.s.AuditSink(AuditOptions{}), nil
}

// Close closes the connection Open made, if any; the namespace can be
// opened again.
func (n *Namespace) Close() error {
	s := n.s
	n.s = nil
	if s == nil {
		return nil
	}
	return s.Close()
}
