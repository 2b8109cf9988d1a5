package bolt

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// faults reaches into the file to create states no client request can.
type faults struct{ s *Store }

func (f faults) Counter(ctx context.Context, lockKey string) (uint64, error) {
	var n uint64
	err := f.s.view(ctx, func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketCounters).Get([]byte(lockKey)); len(v) == 8 {
			n = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return n, err
}

func (f faults) SetCounter(ctx context.Context, lockKey string, value uint64) error {
	return f.s.mutate(ctx, func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketCounters).Put([]byte(lockKey), u64(value))
	})
}

func (f faults) PutRawActive(ctx context.Context, lockKey string, raw []byte) error {
	return f.s.mutate(ctx, func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketActive).Put([]byte(lockKey), raw)
	})
}

func (f faults) ExpireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	return f.s.expireIfCurrent(ctx, lockKey, leaseID, token)
}

func openTemp(t testing.TB, o Options) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "starlease.db"), o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
