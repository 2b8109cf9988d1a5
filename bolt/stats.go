package bolt

import (
	"context"

	bbolt "go.etcd.io/bbolt"
)

// ActiveLeases counts active records, including expired ones the reaper has
// not archived yet (at most one reap interval old). It walks the bucket's
// pages, so it suits a metrics scrape, not a hot path.
func (s *Store) ActiveLeases(ctx context.Context) (int64, error) {
	var n int64
	err := s.view(ctx, func(tx *bbolt.Tx) error {
		n = int64(tx.Bucket(bucketActive).Stats().KeyN)
		return nil
	})
	return n, err
}
