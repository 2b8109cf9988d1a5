package bolt

import (
	"context"

	bbolt "go.etcd.io/bbolt"
)

// ActiveLeases counts active records, including expired ones the reaper has
// not archived yet (at most one reap interval old), by their entries in the
// expiry index, which has one per record written. It walks the index's
// pages, so it suits a metrics scrape, not a hot path.
func (s *Store) ActiveLeases(ctx context.Context) (int64, error) {
	var n int64
	err := s.view(ctx, func(tx *bbolt.Tx) error {
		n = int64(tx.Bucket(bucketActiveExp).Stats().KeyN)
		return nil
	})
	return n, err
}
