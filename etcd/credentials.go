package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Credential keys: cred/<id> holds exactly the bytes of
// auth.EncodeCredential. Credential ids are ULIDs of one length, so the
// keys' order is the ids' order and List is a range read: no index.
func (l layout) credPrefix() string          { return l.p + "cred/" }
func (l layout) credential(id string) string { return l.credPrefix() + id }

// CredentialStore is auth.Store on the lease backend's etcd cluster, so
// several servers in front of one cluster share their API keys: a key
// created, revoked or rotated through any of them (or the keys command)
// applies to the next request on all of them. There is no cache; Get is a
// linearizable read of the record every time.
//
// Every change is one etcd transaction that compares what it read: Create
// stores the record only if its key has never been written
// (create revision 0); Revoke and Rotate read the record, build the new one
// in Go and commit it only if the record's mod revision is still the one
// read (Rotate also only if the new id's key is still absent), reading
// afresh when another writer got there first. Of concurrent rotations of
// one credential exactly one wins. An etcd write is acknowledged once a
// quorum of members has it in its fsynced log, so a revocation survives
// the loss of any minority of members, the leader included.
//
// The namespace's gate (a closed namespace after a restore) does not stop
// credential changes: revocations made since a backup must be re-applied
// before the servers take traffic.
//
// Errors are auth's: ErrNotFound, ErrExists, ErrRevoked, ErrCorrupt (a
// record that does not decode strictly, or one stored under another id)
// and ErrUnavailable for everything else, with the class of the failure
// but never an endpoint or a record. Safe for concurrent use.
type CredentialStore struct {
	s       *Store
	owned   bool // Close closes s
	closed  atomic.Bool
	decodes auth.Decodes
}

var _ auth.Store = (*CredentialStore)(nil)

// CredentialStore returns the credential store in s's prefix, on s's
// client. Closing it does not close s; closing s makes it unavailable.
func (s *Store) CredentialStore() *CredentialStore { return &CredentialStore{s: s} }

// OpenCredentialStore connects with o (as Open does, without the reaper)
// and returns a credential store that owns the connection: for tools that
// manage credentials without serving leases, such as the keys command.
func OpenCredentialStore(ctx context.Context, o Options) (*CredentialStore, error) {
	o.ReapInterval = -1
	s, err := Open(ctx, o)
	if err != nil {
		if lease.CodeOf(err) == lease.CodeInvalidRequest {
			return nil, err // bad options, not an unavailable store
		}
		return nil, fmt.Errorf("%w: %v", auth.ErrUnavailable, err)
	}
	return &CredentialStore{s: s, owned: true}, nil
}

// credMaxSwaps bounds the compare-and-swap attempts of Revoke and Rotate;
// it is only reached if other writers keep changing the record.
const credMaxSwaps = 16

func (c *CredentialStore) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if c.closed.Load() || c.s.closed.Load() {
		return nil, nil, fmt.Errorf("%w: store is closed", auth.ErrUnavailable)
	}
	if ctx.Err() != nil {
		return nil, nil, fmt.Errorf("%w: deadline", auth.ErrUnavailable)
	}
	ctx, cancel := c.s.bound(ctx)
	return ctx, cancel, nil
}

// failure maps a client error to ErrUnavailable with its class only (the
// client's text can name endpoints).
func (c *CredentialStore) failure(err error) error {
	if c.s.closed.Load() {
		return fmt.Errorf("%w: store is closed", auth.ErrUnavailable)
	}
	var cerr errCommit
	if errors.As(err, &cerr) {
		// The change may have been applied: the caller reads it back.
		return fmt.Errorf("%w: the etcd transaction failed after submission (%s)", auth.ErrUnavailable, classify(err))
	}
	return fmt.Errorf("%w: %s", auth.ErrUnavailable, classify(err))
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
	k := c.s.keys.credential(cr.ID)
	r, err := c.s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(rec))).Commit()
	if err != nil {
		return c.failure(errCommit{err})
	}
	if !r.Succeeded {
		return auth.ErrExists
	}
	return nil
}

// Get implements auth.Store.
func (c *CredentialStore) Get(ctx context.Context, id string) (auth.Credential, error) {
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return auth.Credential{}, err
	}
	defer cancel()
	if !auth.ValidCredentialID(id) {
		return auth.Credential{}, auth.ErrNotFound
	}
	r, err := c.s.cli.Get(ctx, c.s.keys.credential(id))
	if err != nil {
		return auth.Credential{}, c.failure(err)
	}
	if len(r.Kvs) == 0 {
		return auth.Credential{}, auth.ErrNotFound
	}
	return c.decodes.Decode(id, r.Kvs[0].Value)
}

// List implements auth.Store: one range read of the records after the
// cursor, in key (id) order. A key under cred/ that is not a credential
// id fails the listing closed, as a record that does not decode does.
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
	prefix := c.s.keys.credPrefix()
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	if after != "" {
		// The first key after prefix+after; the range end keeps any
		// cursor inside the prefix.
		from = prefix + after + "\x00"
	}
	r, err := c.s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, c.failure(err)
	}
	out := []auth.Credential{}
	for _, kv := range r.Kvs {
		id := string(kv.Key[len(prefix):])
		if !auth.ValidCredentialID(id) {
			return nil, fmt.Errorf("%w: a key under the credential prefix is not a credential id", auth.ErrCorrupt)
		}
		cr, err := auth.DecodeStored(id, kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, cr)
	}
	return out, nil
}

// revoked returns cr revoked at at with replacement next (the first
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

// swap runs decide in compare-and-swap attempts: each reads keys at one
// revision, decide returns the writes (key → record) or a refusal, and
// the writes commit only if every key read is unchanged. A lost compare
// reads afresh.
func (c *CredentialStore) swap(ctx context.Context, keys []string, decide func(*txn) error) error {
	for range credMaxSwaps {
		t := c.s.newTxn(ctx)
		if err := t.fetch(keys...); err != nil {
			return c.failure(err)
		}
		if err := decide(t); err != nil {
			return err
		}
		ok, err := t.commit()
		if err != nil {
			return c.failure(err)
		}
		if ok {
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%w: the credential kept changing", auth.ErrUnavailable)
}

// current decodes the record of id read by t: ErrNotFound if none.
func (c *CredentialStore) current(t *txn, id string) (auth.Credential, error) {
	k := c.s.keys.credential(id)
	if err := t.fetch(k); err != nil {
		return auth.Credential{}, c.failure(err)
	}
	// By mod revision, not value: an existing key with an empty value
	// reads as a nil value, and is corrupt, not absent.
	if t.seen[k].mod == 0 {
		return auth.Credential{}, auth.ErrNotFound
	}
	return auth.DecodeStored(id, t.seen[k].val)
}

// Revoke implements auth.Store.
func (c *CredentialStore) Revoke(ctx context.Context, id string, at time.Time) (auth.Credential, error) {
	ctx, cancel, err := c.begin(ctx)
	if err != nil {
		return auth.Credential{}, err
	}
	defer cancel()
	if !auth.ValidCredentialID(id) {
		return auth.Credential{}, auth.ErrNotFound
	}
	var out auth.Credential
	err = c.swap(ctx, []string{c.s.keys.credential(id)}, func(t *txn) error {
		cur, err := c.current(t, id)
		if err != nil {
			return err
		}
		out = cur
		if !cur.RevokedAt.IsZero() {
			return nil // nothing to write: the first revocation stands
		}
		out = revoked(cur, at, "")
		rec, err := auth.EncodeCredential(out)
		if err != nil {
			return err
		}
		t.put(c.s.keys.credential(id), rec)
		return nil
	})
	if err != nil {
		return auth.Credential{}, err
	}
	return out, nil
}

// Rotate implements auth.Store: the old record revoked and the new one
// created in one transaction, which also requires the new id's key to be
// still absent.
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
	if !auth.ValidCredentialID(oldID) {
		return auth.Credential{}, auth.ErrNotFound
	}
	oldKey, nextKey := c.s.keys.credential(oldID), c.s.keys.credential(next.ID)
	var out auth.Credential
	err = c.swap(ctx, []string{oldKey, nextKey}, func(t *txn) error {
		cur, err := c.current(t, oldID)
		if err != nil {
			return err
		}
		if !cur.RevokedAt.IsZero() {
			return auth.ErrRevoked
		}
		if next.ID == oldID || t.seen[nextKey].mod != 0 {
			return auth.ErrExists
		}
		out = revoked(cur, at, next.ID)
		orec, err := auth.EncodeCredential(out)
		if err != nil {
			return err
		}
		t.put(oldKey, orec)
		t.put(nextKey, nrec)
		return nil
	})
	if err != nil {
		return auth.Credential{}, err
	}
	return out, nil
}

// Close implements auth.Store; later calls fail with ErrUnavailable. A
// store from OpenCredentialStore also closes its connection.
func (c *CredentialStore) Close() error {
	if c.closed.Swap(true) || !c.owned {
		return nil
	}
	return c.s.Close()
}
