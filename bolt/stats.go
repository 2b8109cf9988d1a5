package bolt

import (
	"context"

	"github.com/starintel/starlease/internal/layered"
)

// ActiveLeases counts active records, including expired ones the reaper has
// not archived yet (at most one reap interval old) and corrupt ones. It
// walks the keys of every identity, so it suits a metrics scrape, not a hot
// path.
func (s *Store) ActiveLeases(ctx context.Context) (int64, error) {
	var n int64
	err := s.view(ctx, func(tx *layered.View) error {
		return eachOfKind(tx, kindActive, func(string, []byte, []byte) error { n++; return nil })
	})
	return n, err
}
