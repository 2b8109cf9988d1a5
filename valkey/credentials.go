package valkey

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/auth"
)

// credLibrarySource is the credential store's function library. Create and
// the compare-and-set that Revoke and Rotate are built on each run as one
// atomic function; every check that can fail runs before the first write.
// Records are built and checked in Go (auth.EncodeCredential,
// auth.DecodeCredential); the functions only compare and store bytes.
//
//go:embed credentials.lua
var credLibrarySource string

var credLibrary = newLibrary("cred", credLibrarySource)

// callAux runs function fn of l with FCALL and returns its string reply. A
// library missing from the server (never loaded, or flushed) is loaded
// and the call made again: the function did not run, so that is safe.
func (s *Store) callAux(ctx context.Context, l *library, fn string, keys, args []string) (string, error) {
	build := func() vk.Completed {
		return s.client.B().Fcall().Function(l.prefix + fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	v, err := s.client.Do(ctx, build()).ToString()
	if functionMissing(err) {
		if lerr := l.load(ctx, s.client); lerr != nil {
			return "", lerr
		}
		v, err = s.client.Do(ctx, build()).ToString()
	}
	return v, err
}

// bounded gives ctx a deadline of d if it has none, so no call waits for
// a silent server forever.
func bounded(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// Credential keys; see the package documentation.
func (k layout) credential(id string) string { return k.ns + ":cred:" + id }
func (k layout) credIndex() string           { return k.ns + ":cred:index" }

// CredentialStore is auth.Store on the lease backend's Valkey server, so
// several servers in front of one Valkey share their API keys: a key
// created, revoked or rotated through any of them (or the keys command)
// applies to the next request on all of them. There is no cache; Get reads
// the record every time.
//
// Layout (ns is Options.KeyPrefix): ns:cred:<id> holds exactly the bytes
// of auth.EncodeCredential, without a TTL; ns:cred:index is a sorted set
// (score 0, member the credential id) that List pages with ZRANGEBYLEX.
// Create is SET NX plus the index entry in one function; Revoke and Rotate
// read the record, build the new one in Go and store it with a
// compare-and-set function (retried if another writer got there first), so
// each is atomic and, of concurrent rotations of one credential, exactly
// one wins. Writes are refused (ErrUnavailable) while the server's
// durability is not verified, as lease mutations are: a revocation must
// survive a crash.
//
// Errors are auth's: ErrNotFound, ErrExists, ErrRevoked, ErrCorrupt (a
// record that does not decode strictly, or a key of the wrong type) and
// ErrUnavailable for everything else, without backend detail. Safe for
// concurrent use.
type CredentialStore struct {
	s       *Store
	owned   bool // Close closes s
	closed  atomic.Bool
	decodes auth.Decodes
}

var _ auth.Store = (*CredentialStore)(nil)

// CredentialStore returns the credential store on s's server and
// namespace, sharing s's connections. Closing it does not close s; closing
// s makes it unavailable.
func (s *Store) CredentialStore() *CredentialStore { return &CredentialStore{s: s} }

// OpenCredentialStore connects with o (as Open does, without the reaper)
// and returns a credential store that owns the connection: for tools that
// manage credentials without serving leases, such as the keys command.
func OpenCredentialStore(ctx context.Context, o Options) (*CredentialStore, error) {
	o.ReapInterval = -1
	s, err := Open(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", auth.ErrUnavailable, err)
	}
	return &CredentialStore{s: s, owned: true}, nil
}

// credMaxSwaps bounds the compare-and-set retries of Revoke and Rotate; it
// is only reached if other writers keep changing the record.
const credMaxSwaps = 16

// credCallTimeout bounds a call whose context has no deadline.
const credCallTimeout = 5 * time.Second

func (c *CredentialStore) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if c.closed.Load() || c.s.closed.Load() {
		return nil, nil, fmt.Errorf("%w: store is closed", auth.ErrUnavailable)
	}
	if ctx.Err() != nil {
		return nil, nil, fmt.Errorf("%w: deadline", auth.ErrUnavailable)
	}
	ctx, cancel := bounded(ctx, credCallTimeout)
	return ctx, cancel, nil
}

// writable refuses writes on a server not verified durable.
func (c *CredentialStore) writable(ctx context.Context) error {
	if err := c.s.writable(ctx); err != nil {
		return fmt.Errorf("%w: backend durability is not verified", auth.ErrUnavailable)
	}
	return nil
}

// failure maps a client error to an auth error without its text.
func (c *CredentialStore) failure(err error) error {
	if ve, ok := vk.IsValkeyErr(err); ok && strings.HasPrefix(ve.Error(), "WRONGTYPE") {
		return fmt.Errorf("%w: credential key of the wrong type", auth.ErrCorrupt)
	}
	return fmt.Errorf("%w: %s", auth.ErrUnavailable, classify(err))
}

// read returns the raw record of id ("" and ErrNotFound if none).
func (c *CredentialStore) read(ctx context.Context, id string) (string, error) {
	if !auth.ValidCredentialID(id) {
		return "", auth.ErrNotFound
	}
	raw, err := c.s.client.Do(ctx, c.s.client.B().Get().Key(c.s.keys.credential(id)).Build()).ToString()
	if vk.IsValkeyNil(err) {
		return "", auth.ErrNotFound
	}
	if err != nil {
		return "", c.failure(err)
	}
	return raw, nil
}

// Create implements auth.Store.
func (c *CredentialStore) Create(ctx context.Context, cr auth.Credential) error {
	rec, err := auth.EncodeCredential(cr)
	if err != nil {
		return err
	}
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if err := c.writable(ctx); err != nil {
		return err
	}
	st, err := c.s.callAux(ctx, credLibrary, "create",
		[]string{c.s.keys.credential(cr.ID), c.s.keys.credIndex()}, []string{cr.ID, string(rec)})
	if err != nil {
		return c.failure(err)
	}
	switch st {
	case "ok":
		return nil
	case "exists":
		return auth.ErrExists
	case "corrupt":
		return fmt.Errorf("%w: credential key of the wrong type", auth.ErrCorrupt)
	}
	return fmt.Errorf("%w: malformed backend reply", auth.ErrUnavailable)
}

// Get implements auth.Store.
func (c *CredentialStore) Get(ctx context.Context, id string) (auth.Credential, error) {
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return auth.Credential{}, err
	}
	defer cancel()
	raw, err := c.read(ctx, id)
	if err != nil {
		return auth.Credential{}, err
	}
	return c.decodes.Decode(id, []byte(raw))
}

// List implements auth.Store: one ZRANGEBYLEX on the index after the
// cursor, then the records in one pipeline. An index entry without a
// record is skipped (nothing deletes credentials, so it is not expected).
func (c *CredentialStore) List(ctx context.Context, after string, limit int) ([]auth.Credential, error) {
	switch {
	case limit <= 0:
		limit = auth.DefaultListLimit
	case limit > auth.MaxListLimit:
		limit = auth.MaxListLimit
	}
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	lower := "-"
	if after != "" {
		lower = "(" + after
	}
	cl := c.s.client
	ids, err := cl.Do(ctx, cl.B().Zrangebylex().Key(c.s.keys.credIndex()).Min(lower).Max("+").Limit(0, int64(limit)).Build()).AsStrSlice()
	if err != nil {
		return nil, c.failure(err)
	}
	out := []auth.Credential{}
	cmds := make(vk.Commands, 0, len(ids))
	for _, id := range ids {
		if !auth.ValidCredentialID(id) {
			return nil, fmt.Errorf("%w: malformed credential index entry", auth.ErrCorrupt)
		}
		cmds = append(cmds, cl.B().Get().Key(c.s.keys.credential(id)).Build())
	}
	if len(cmds) == 0 {
		return out, nil
	}
	for i, res := range cl.DoMulti(ctx, cmds...) {
		raw, err := res.ToString()
		if vk.IsValkeyNil(err) {
			continue
		}
		if err != nil {
			return nil, c.failure(err)
		}
		cr, err := auth.DecodeStored(ids[i], []byte(raw))
		if err != nil {
			return nil, err
		}
		out = append(out, cr)
	}
	return out, nil
}

// revoked returns cr revoked at at with replacement next (first
// revocation wins), as the other stores do.
func revoked(cr auth.Credential, at time.Time, next string) auth.Credential {
	if cr.RevokedAt.IsZero() {
		if at.IsZero() {
			at = time.Now()
		}
		cr.RevokedAt = at.UTC().Truncate(time.Millisecond)
		cr.ReplacedBy = next
	}
	return cr
}

// swap stores replacement over id if it still holds expected; with next
// set it also creates next in the same step. It reports whether the
// record had changed (the caller reads again).
func (c *CredentialStore) swap(ctx context.Context, id, expected string, replacement []byte, next *auth.Credential, nextRec []byte) (changed bool, err error) {
	keys := []string{c.s.keys.credential(id), c.s.keys.credIndex()}
	args := []string{expected, string(replacement)}
	if next != nil {
		keys = append(keys, c.s.keys.credential(next.ID))
		args = append(args, next.ID, string(nextRec))
	}
	st, err := c.s.callAux(ctx, credLibrary, "swap", keys, args)
	if err != nil {
		return false, c.failure(err)
	}
	switch st {
	case "ok":
		return false, nil
	case "changed":
		return true, nil
	case "notfound":
		return false, auth.ErrNotFound
	case "exists":
		return false, auth.ErrExists
	case "corrupt":
		return false, fmt.Errorf("%w: credential key of the wrong type", auth.ErrCorrupt)
	}
	return false, fmt.Errorf("%w: malformed backend reply", auth.ErrUnavailable)
}

// Revoke implements auth.Store.
func (c *CredentialStore) Revoke(ctx context.Context, id string, at time.Time) (auth.Credential, error) {
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return auth.Credential{}, err
	}
	defer cancel()
	for range credMaxSwaps {
		raw, err := c.read(ctx, id)
		if err != nil {
			return auth.Credential{}, err
		}
		cur, err := auth.DecodeStored(id, []byte(raw))
		if err != nil {
			return auth.Credential{}, err
		}
		if !cur.RevokedAt.IsZero() {
			return cur, nil
		}
		if err := c.writable(ctx); err != nil {
			return auth.Credential{}, err
		}
		nc := revoked(cur, at, "")
		rec, err := auth.EncodeCredential(nc)
		if err != nil {
			return auth.Credential{}, err
		}
		changed, err := c.swap(ctx, id, raw, rec, nil, nil)
		if err != nil {
			return auth.Credential{}, err
		}
		if !changed {
			return nc, nil
		}
	}
	return auth.Credential{}, fmt.Errorf("%w: the credential kept changing", auth.ErrUnavailable)
}

// Rotate implements auth.Store.
func (c *CredentialStore) Rotate(ctx context.Context, oldID string, at time.Time, next auth.Credential) (auth.Credential, error) {
	nrec, err := auth.EncodeCredential(next)
	if err != nil {
		return auth.Credential{}, err
	}
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return auth.Credential{}, err
	}
	defer cancel()
	for range credMaxSwaps {
		raw, err := c.read(ctx, oldID)
		if err != nil {
			return auth.Credential{}, err
		}
		cur, err := auth.DecodeStored(oldID, []byte(raw))
		if err != nil {
			return auth.Credential{}, err
		}
		if !cur.RevokedAt.IsZero() {
			return auth.Credential{}, auth.ErrRevoked
		}
		if next.ID == oldID {
			return auth.Credential{}, auth.ErrExists
		}
		if err := c.writable(ctx); err != nil {
			return auth.Credential{}, err
		}
		old := revoked(cur, at, next.ID)
		orec, err := auth.EncodeCredential(old)
		if err != nil {
			return auth.Credential{}, err
		}
		changed, err := c.swap(ctx, oldID, raw, orec, &next, nrec)
		if err != nil {
			return auth.Credential{}, err
		}
		if !changed {
			return old, nil
		}
	}
	return auth.Credential{}, fmt.Errorf("%w: the credential kept changing", auth.ErrUnavailable)
}

// Close implements auth.Store; later calls fail with ErrUnavailable. A
// store from OpenCredentialStore also closes its connection.
func (c *CredentialStore) Close() error {
	if c.closed.Swap(true) || !c.owned {
		return nil
	}
	return c.s.Close()
}
