package valkey

import (
	"context"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

// Stored formats. Evidence and history entries have two versions: 1, a
// copy of the record's JSON, which every build reads; and 2 ("compact",
// evidence.go), the facts one per line, about a third of the bytes, which
// only builds with evidence.go read. Instances of several builds share a
// namespace during a rolling deploy, so a namespace is written in version
// 1 until an operator switches it, once every instance reads version 2
// (EnableCompactFormat; `starlease serve --valkey-compact-format`). The
// switch is the key layout.format() holding "2", read at Open and at every
// reaper pass; it is one way (an instance of an older build would answer
// version 2 data as corrupt). Every build reads both versions.
const compactFormat = "2"

// writeFormat is the last ARGV of each call that keeps evidence or history
// (library.lua's context).
func (s *Store) writeFormat() string {
	if s.compact.Load() {
		return "compact"
	}
	return "v1"
}

// loadFormat reads the namespace's format switch. Unreadable, the store
// keeps the format it had: either is safe for this build's readers.
func (s *Store) loadFormat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := s.client.Do(ctx, s.client.B().Get().Key(s.keys.format()).Build()).ToString()
	switch {
	case err == nil:
		if v != compactFormat {
			s.log.Warn("unknown stored-format switch; writing version 1", "value_bytes", len(v))
		}
		s.compact.Store(v == compactFormat)
	case vk.IsValkeyNil(err):
		s.compact.Store(false)
	default:
		s.log.Warn("cannot read the stored-format switch", "error_class", classify(err))
	}
}

// EnableCompactFormat switches the namespace to writing evidence and
// history in version 2, for this store at once and for every other
// instance at its next reaper pass. Only once every instance sharing the
// namespace runs a build that reads version 2.
func (s *Store) EnableCompactFormat(ctx context.Context) error {
	if err := s.client.Do(ctx, s.client.B().Set().Key(s.keys.format()).Value(compactFormat).Build()).Error(); err != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "cannot switch the stored format: %s", classify(err))
	}
	s.compact.Store(true)
	s.log.Info("AUDIT lease namespace switched to the compact stored format")
	return nil
}
