package valkey

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/starintel/starlease/lease"
)

// reapBatch bounds one read of the expiry schedule; a pass reads batches
// until what is due is worked off (or its bounded context ends).
const reapBatch = 512

// reapParallel bounds the expiry calls a pass has in flight at once.
const reapParallel = 16

// reap is storage reclamation, never a source of truth: every operation
// already treats an expired record as expired. It archives leases whose
// expires_at has passed (each conditional on its lease id and token), so
// their expiry is recorded in history and they leave the List index.
// Idempotency, commit and history evidence expire by their own TTLs;
// counters and high-water marks never do.
func (s *Store) reap(ctx context.Context) error {
	if err := s.writable(ctx); err != nil {
		return err
	}
	s.loadFormat(ctx)
	if err := s.raiseWanted(ctx); err != nil {
		s.log.Warn("cannot switch the stored format", "reason", lease.AsError(err).Reason)
	}
	for ctx.Err() == nil {
		rep, err := s.fcall(ctx, call{fn: "due", ro: true, keys: []string{s.keys.expiry()}, args: []string{strconv.Itoa(reapBatch)}})
		if err != nil {
			return err
		}
		// Each expiry is its own function call, conditional on its lease
		// id and token and independent of the others, so several run at
		// once: the server fsyncs the AOF once for all the writes of one
		// event-loop turn, where one call at a time paid an fsync each
		// (about 1,000 expiries/s).
		var moved atomic.Int64
		var firstErr atomic.Pointer[error]
		sem := make(chan struct{}, reapParallel)
		var wg sync.WaitGroup
		for _, m := range rep.f {
			tag, leaseID, token, ok := expiryEntry(m)
			if !ok {
				s.log.Error("ALERT malformed expiry schedule entry skipped")
				continue
			}
			if firstErr.Load() != nil {
				break
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				done, err := s.expireOne(ctx, lease.KeyPrefix+tag, leaseID, token)
				switch {
				case err != nil:
					firstErr.CompareAndSwap(nil, &err)
				case done:
					moved.Add(1)
				}
			}()
		}
		wg.Wait()
		if p := firstErr.Load(); p != nil {
			return *p
		}
		// A short batch was everything due; a batch of entries the
		// function left in place (corrupt identities) would come back
		// unchanged.
		if len(rep.f) < reapBatch || moved.Load() == 0 {
			return nil
		}
	}
	return nil
}

// expiryEntry reads an expiry schedule member, tag ‖ 0 ‖ lease id ‖ 0 ‖
// token (every record version's): the expiry is conditional on both. ok
// is false for anything else.
func expiryEntry(m string) (tag, leaseID string, token uint64, ok bool) {
	parts := strings.Split(m, "\x00")
	if len(parts) != 3 || !validTag(parts[0]) || lease.CheckOpaqueID("lease_id", parts[1]) != nil {
		return "", "", 0, false
	}
	token, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || strconv.FormatUint(token, 10) != parts[2] {
		return "", "", 0, false
	}
	return parts[0], parts[1], token, true
}

// expireIfCurrent is the delayed expiry cleanup of one lease: the function
// archives the active record only if it still has this lease id and token
// and is expired at backend time, so a late cleanup never touches a
// successor. Corruption is alerted and left alone.
func (s *Store) expireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	_, err := s.expireOne(ctx, lockKey, leaseID, token)
	return err
}

// expireOne is expireIfCurrent reporting whether the schedule entry left
// the schedule (archived, or a stale entry removed).
func (s *Store) expireOne(ctx context.Context, lockKey, leaseID string, token uint64) (bool, error) {
	tag := tagOf(lockKey)
	var none lease.Identity
	// Slot 14: the idempotency retention, for the evidence a format 4
	// record carries (written out as the lease ends).
	args := append(s.commonArgs(lease.UnixMilli(0), lockKey, tag, none, s.opts.IdempotencyRetention), leaseID, utoa(token), s.writeFormat())
	// expire keeps no evidence: slot 5 repeats the quarantine key.
	rep, err := s.fcall(ctx, call{fn: "expire", mutation: true, keys: s.commonKeys(tag, s.keys.quarantine(tag)), args: args})
	if err != nil {
		return false, err
	}
	switch rep.status {
	case "corrupt":
		s.corrupt(none, rep.at(0))
		return false, nil
	case "closed":
		return false, s.closedNamespace(rep)
	case "live":
		return false, nil
	}
	return true, nil
}
