package bolt

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/starintel/starlease/backupfile"
)

// Namespace is a bolt store file as backup, restore and recovery reach it
// (the Backend of package recovery, which valkey.Namespace implements with
// the same names). It is a path, not an open store: a restore's target
// must not exist yet, and bbolt admits one opener per file. Backup opens
// the store on first use and keeps it until Close; OpenClosed opens one of
// its own. Stores are opened without a reaper: a tool's, not a server's.
// Not safe for concurrent use.
type Namespace struct {
	path string
	o    Options
	s    *Store
}

// NewNamespace returns the namespace of the store file at path.
func NewNamespace(path string, o Options) *Namespace {
	o.ReapInterval = -1
	return &Namespace{path: path, o: o}
}

// Name is the backend recorded in the backups it writes.
func (n *Namespace) Name() string { return BackendName }

// Open opens the existing store file. A path without one is an error
// matching fs.ErrNotExist: Open of the package would create a store there.
func (n *Namespace) Open(context.Context) error {
	if n.s != nil {
		return nil
	}
	// Any failure to see the file means there is no store to back up.
	if _, err := os.Stat(n.path); err != nil {
		return fmt.Errorf("bolt: no store file at %s: %w", n.path, fs.ErrNotExist)
	}
	s, err := Open(n.path, n.o)
	if err != nil {
		return err
	}
	n.s = s
	return nil
}

// Backup opens the store (see Open) and writes its snapshot; see
// Store.Backup.
func (n *Namespace) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error) {
	if err := n.Open(ctx); err != nil {
		return backupfile.Header{}, err
	}
	return n.s.Backup(ctx, w, sections...)
}

// Close closes the store Open opened, if any; the namespace can be opened
// again.
func (n *Namespace) Close() error {
	s := n.s
	n.s = nil
	if s == nil {
		return nil
	}
	return s.Close()
}
