package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterr "go.etcd.io/bbolt/errors"
)

// boltSchema is the layout version of the credential file.
const boltSchema = "1"

var (
	bucketCredentials = []byte("credentials") // credential id → record v1
	bucketCredMeta    = []byte("meta")        // "schema" → boltSchema
	keyCredSchema     = []byte("schema")
)

// ErrStoreLocked reports that another process holds the credential file
// (bbolt allows one writer process): typically a running server while a
// CLI command tries to open the same data directory.
var ErrStoreLocked = errors.New("auth: credential store file is in use by another process")

// BoltStore is the embedded credential store: one bbolt file (by convention
// DIR/credentials.db, separate from the lease file), bucket "credentials"
// mapping a credential id to its strict JSON record. Every write is one
// fsynced transaction. Safe for concurrent use.
type BoltStore struct {
	db     *bbolt.DB
	closed atomic.Bool
}

var _ Store = (*BoltStore)(nil)

// OpenBoltStore opens (creating if needed, mode 0600) the credential file at
// path. A file held by another process fails after one second with
// ErrStoreLocked.
func OpenBoltStore(path string) (*BoltStore, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, bolterr.ErrTimeout) {
			return nil, ErrStoreLocked
		}
		return nil, fmt.Errorf("%w: cannot open the credential file: %s", ErrUnavailable, classifyBolt(err))
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketCredentials); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketCredMeta)
		if err != nil {
			return err
		}
		switch v := meta.Get(keyCredSchema); {
		case v == nil:
			return meta.Put(keyCredSchema, []byte(boltSchema))
		case string(v) != boltSchema:
			return ErrCorrupt
		}
		return nil
	}); err != nil {
		db.Close()
		if errors.Is(err, ErrCorrupt) {
			return nil, fmt.Errorf("%w: unsupported credential file schema", ErrCorrupt)
		}
		return nil, fmt.Errorf("%w: cannot initialize the credential file: %s", ErrUnavailable, classifyBolt(err))
	}
	return &BoltStore{db: db}, nil
}

// classifyBolt names a storage error's class without its text.
func classifyBolt(err error) string {
	switch {
	case errors.Is(err, bolterr.ErrDatabaseNotOpen):
		return "not open"
	case errors.Is(err, bolterr.ErrDatabaseReadOnly):
		return "read only"
	case errors.Is(err, bolterr.ErrInvalid), errors.Is(err, bolterr.ErrChecksum), errors.Is(err, bolterr.ErrVersionMismatch):
		return "invalid file"
	default:
		return "i/o error"
	}
}

// known lets the store's own sentinel errors through and hides the rest.
func known(err error) error {
	for _, e := range []error{ErrNotFound, ErrExists, ErrRevoked, ErrCorrupt, ErrUnavailable} {
		if errors.Is(err, e) {
			return err
		}
	}
	return ErrUnavailable
}

func (s *BoltStore) view(ctx context.Context, fn func(b *bbolt.Bucket) error) error {
	if s.closed.Load() || ctx.Err() != nil {
		return ErrUnavailable
	}
	err := s.db.View(func(tx *bbolt.Tx) error { return fn(tx.Bucket(bucketCredentials)) })
	if err != nil {
		return known(err)
	}
	return nil
}

func (s *BoltStore) update(ctx context.Context, fn func(b *bbolt.Bucket) error) error {
	if s.closed.Load() || ctx.Err() != nil {
		return ErrUnavailable
	}
	err := s.db.Update(func(tx *bbolt.Tx) error { return fn(tx.Bucket(bucketCredentials)) })
	if err != nil {
		return known(err)
	}
	return nil
}

// getIn decodes the record of id; bbolt's bytes are valid only inside the
// transaction, and DecodeCredential copies what it keeps.
func getIn(b *bbolt.Bucket, id string) (Credential, error) {
	v := b.Get([]byte(id))
	if v == nil {
		return Credential{}, ErrNotFound
	}
	return DecodeCredential(v)
}

// Create implements Store.
func (s *BoltStore) Create(ctx context.Context, c Credential) error {
	rec, err := EncodeCredential(c)
	if err != nil {
		return err
	}
	return s.update(ctx, func(b *bbolt.Bucket) error {
		if b.Get([]byte(c.ID)) != nil {
			return ErrExists
		}
		return b.Put([]byte(c.ID), rec)
	})
}

// Get implements Store.
func (s *BoltStore) Get(ctx context.Context, id string) (Credential, error) {
	var c Credential
	err := s.view(ctx, func(b *bbolt.Bucket) (err error) {
		c, err = getIn(b, id)
		return err
	})
	return c, err
}

// List implements Store.
func (s *BoltStore) List(ctx context.Context, after string, limit int) ([]Credential, error) {
	limit = clampLimit(limit)
	var out []Credential
	err := s.view(ctx, func(b *bbolt.Bucket) error {
		out = out[:0]
		cur := b.Cursor()
		k, v := cur.Seek([]byte(after))
		if k != nil && bytes.Equal(k, []byte(after)) {
			k, v = cur.Next()
		}
		for ; k != nil && len(out) < limit; k, v = cur.Next() {
			c, err := DecodeCredential(v)
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []Credential{}
	}
	return out, nil
}

// Revoke implements Store.
func (s *BoltStore) Revoke(ctx context.Context, id string, at time.Time) (Credential, error) {
	var c Credential
	err := s.update(ctx, func(b *bbolt.Bucket) error {
		cur, err := getIn(b, id)
		if err != nil {
			return err
		}
		c = cur
		if !cur.RevokedAt.IsZero() {
			return nil
		}
		c = revokedCopy(cur, at, "")
		rec, err := EncodeCredential(c)
		if err != nil {
			return err
		}
		return b.Put([]byte(id), rec)
	})
	if err != nil {
		return Credential{}, err
	}
	return c, nil
}

// Rotate implements Store.
func (s *BoltStore) Rotate(ctx context.Context, oldID string, at time.Time, next Credential) (Credential, error) {
	nrec, err := EncodeCredential(next)
	if err != nil {
		return Credential{}, err
	}
	var old Credential
	err = s.update(ctx, func(b *bbolt.Bucket) error {
		cur, err := getIn(b, oldID)
		if err != nil {
			return err
		}
		if !cur.RevokedAt.IsZero() {
			return ErrRevoked
		}
		if next.ID == oldID || b.Get([]byte(next.ID)) != nil {
			return ErrExists
		}
		old = revokedCopy(cur, at, next.ID)
		orec, err := EncodeCredential(old)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(oldID), orec); err != nil {
			return err
		}
		return b.Put([]byte(next.ID), nrec)
	})
	if err != nil {
		return Credential{}, err
	}
	return old, nil
}

// Close closes the file; later calls fail with ErrUnavailable.
func (s *BoltStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("%w: close failed: %s", ErrUnavailable, classifyBolt(err))
	}
	return nil
}
