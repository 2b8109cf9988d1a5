package etcd

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// Namespace is an etcd key prefix as backup, restore and recovery reach it
// (the Backend of package recovery, which bolt.Namespace and
// valkey.Namespace implement with the same names): options, connected on
// first use and until Close, so a tool connects only once it needs the
// cluster. OpenClosed connects on its own. Connections run no reaper: a
// tool's, not a server's. Not safe for concurrent use.
type Namespace struct {
	o Options
	c *conn
}

// NewNamespace returns the namespace o reaches.
func NewNamespace(o Options) *Namespace {
	o.ReapInterval = -1
	return &Namespace{o: o}
}

// Name is the backend recorded in the backups it writes.
func (n *Namespace) Name() string { return BackendName }

// Open connects to the prefix's existing store, unless connected already.
// A prefix without one (no layout version) is an error matching
// fs.ErrNotExist: a backup or seal of a mistyped prefix must fail, not
// create a store there.
func (n *Namespace) Open(ctx context.Context) error {
	if n.c != nil {
		return nil
	}
	c, err := connect(ctx, n.o, false)
	if err != nil {
		return err
	}
	n.c = c
	return nil
}

// Backup connects and backs the prefix up; see Store.Backup.
func (n *Namespace) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error) {
	if err := n.Open(ctx); err != nil {
		return backupfile.Header{}, err
	}
	return n.c.s.Backup(ctx, w, sections...)
}

// Restore connects and restores the backup read from r into the prefix,
// which must be empty; see Store.Restore. The prefix need not hold a store
// yet.
func (n *Namespace) Restore(ctx context.Context, r io.Reader) (backupfile.Header, error) {
	if n.c == nil {
		c, err := connect(ctx, n.o, true)
		if err != nil {
			return backupfile.Header{}, err
		}
		n.c = c
	}
	return n.c.s.Restore(ctx, r)
}

// Seal connects and closes the prefix for recovery; see Store.Seal.
func (n *Namespace) Seal(ctx context.Context) (bool, error) {
	if err := n.Open(ctx); err != nil {
		return false, err
	}
	return n.c.s.Seal(ctx)
}

// OpenClosed opens the prefix for recovery on a connection of its own. It
// must be closed by a restore or a Seal: an open one is refused with
// lease.ErrNamespaceOpen, the one error here that is not a *lease.Error.
func (n *Namespace) OpenClosed(ctx context.Context) (lease.ClosedNamespace, error) {
	c, err := connect(ctx, n.o, false)
	if err != nil {
		if isNotExist(err) {
			return nil, lease.Errorf(lease.CodeBackendUnavailable, "no lease store under the key prefix; nothing to recover")
		}
		return nil, err
	}
	closed, err := openClosed(ctx, c)
	if err != nil {
		c.close()
		return nil, err
	}
	return closed, nil
}

// AuditSink connects and returns the prefix's audit stream (see
// Store.AuditSink), where the recovery steps are recorded beside the
// servers' events. It writes whether the prefix is open or closed.
func (n *Namespace) AuditSink(ctx context.Context) (audit.Sink, error) {
	if err := n.Open(ctx); err != nil {
		return nil, err
	}
	return n.c.s.AuditSink(AuditOptions{}), nil
}

// Close closes the connection Open made, if any; the prefix can be opened
// again.
func (n *Namespace) Close() error {
	c := n.c
	n.c = nil
	if c == nil {
		return nil
	}
	return c.close()
}

// conn is a store on a client of its own.
type conn struct {
	s   *Store
	cli *clientv3.Client
	own bool
}

func (c *conn) close() error {
	err := c.s.Close()
	if c.own {
		c.cli.Close()
	}
	return err
}

// errNoStore is the refusal of a prefix without a layout version.
type errNoStore string

func (e errNoStore) Error() string        { return string(e) }
func (e errNoStore) Is(target error) bool { return target == fs.ErrNotExist }

func isNotExist(err error) bool {
	_, ok := err.(errNoStore)
	return ok
}

// connect opens the store of o on a client it dials (or o.Client). Unless
// create, a prefix without a layout version is refused (errNoStore)
// before Open could write one.
func connect(ctx context.Context, o Options, create bool) (*conn, error) {
	ns := o.KeyPrefix
	if ns == "" {
		ns = DefaultKeyPrefix
	}
	if !keyPrefixRule.MatchString(ns) {
		return nil, lease.Invalid("key_prefix", "letters, digits and _:.- only, at most 64 bytes")
	}
	c := &conn{cli: o.Client}
	if c.cli == nil {
		var err error
		if c.cli, err = Dial(o); err != nil {
			return nil, err
		}
		c.own = true
	}
	fail := func(err error) (*conn, error) {
		if c.own {
			c.cli.Close()
		}
		return nil, err
	}
	if !create {
		cctx, cancel := context.WithTimeout(ctx, orDefault(o.OpTimeout, defaultOpTimeout))
		r, err := c.cli.Get(cctx, layout{p: ns + "/"}.schema(), clientv3.WithCountOnly())
		cancel()
		if err != nil {
			return fail(lease.Errorf(lease.CodeBackendUnavailable, "cannot reach the etcd cluster: %s", classify(err)))
		}
		if r.Count == 0 {
			return fail(errNoStore(fmt.Sprintf("etcd: no lease store under the key prefix %q", ns)))
		}
	}
	o.Client = c.cli
	s, err := Open(ctx, o)
	if err != nil {
		return fail(err)
	}
	c.s = s
	return c, nil
}

// defaultOpTimeout is Open's default per-call timeout (Options.OpTimeout).
const defaultOpTimeout = 5 * time.Second
