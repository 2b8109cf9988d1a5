package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"strconv"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// read runs fn in one read transaction at its backend time (readTx), after
// the deadline check. fn returns typed errors directly: a read has nothing
// to roll back.
func read[T any](s *Store, ctx context.Context, due lease.Timestamp, fn func(*layered.View, lease.Timestamp) (T, error)) (T, error) {
	var zero T
	if err := s.begin(ctx); err != nil {
		return zero, err
	}
	tx, release, now, err := s.readTx()
	if err != nil {
		return zero, s.storageReadError(err)
	}
	defer release()
	if err := lease.PastDeadline(now, due); err != nil {
		return zero, err
	}
	return fn(tx, now)
}

// Inspect reads the lease of an identity (active, or expired if its time
// has passed) or a lease by id (active or terminal).
func (s *Store) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	req, lockKey, err := lease.PrepareInspect(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return read(s, ctx, lease.Deadline(ctx, req.DeadlineAt), func(tx *layered.View, now lease.Timestamp) (lease.Result, error) {
		res := lease.Result{Code: lease.CodeInspected, BackendTime: now}
		key := lockKey
		if req.LeaseID != "" {
			var ok bool
			if key, ok = leaseLockKey(tx.Bucket(bucketLeases), req.LeaseID); !ok {
				return res, lease.NotFound(now)
			}
		}
		cur, err := s.loadActive(tx, key)
		switch {
		case err != nil:
			return res, err
		case cur != nil && (req.LeaseID == "" || cur.LeaseID == req.LeaseID):
			res.Lease = cur.ObservedAt(now)
			return res, nil
		case req.LeaseID == "":
			return res, lease.NotFound(now)
		}
		if h := findHistory(tx, key, req.LeaseID); h != nil {
			res.Lease = h.Record
			return res, nil
		}
		return res, lease.NotFound(now)
	})
}

// List pages through unexpired active leases of one filter in lease-id
// order. It walks only the filter's index range, and at most a bounded
// number of stale entries per page, so a page costs O(page size).
func (s *Store) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	pg, err := lease.PrepareList(req, s.opts)
	if err != nil {
		return lease.ListResult{}, err
	}
	f, after, size := pg.Filter, pg.After, pg.Size
	return read(s, ctx, lease.Deadline(ctx, req.DeadlineAt), func(tx *layered.View, now lease.Timestamp) (lease.ListResult, error) {
		out := lease.ListResult{Leases: []*lease.Record{}, BackendTime: now}
		prefix := append(join(string(f.By), f.Value), 0)
		c, leases, ident := tx.Bucket(bucketIndex).Cursor(), tx.Bucket(bucketLeases), tx.Bucket(bucketIdent)
		k, _ := c.Seek(prefix)
		if after != "" {
			k, _ = c.Seek(append(bytes.Clone(prefix), after...))
			if k != nil && string(k[len(prefix):]) == after {
				k, _ = c.Next()
			}
		}
		budget := 4*size + 64
		last := ""
		for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(out.Leases) == size || budget == 0 {
				out.NextPageToken = pg.NextPageToken(last)
				return out, nil
			}
			budget--
			last = string(k[len(prefix):])
			lockKey, ok := leaseLockKey(leases, last)
			if !ok {
				continue // no lookup (ended and retired): not listed
			}
			rec, err := s.loadActiveFrom(tx, ident, lockKey)
			if err != nil || rec == nil || rec.LeaseID != last || !f.Selects(rec) || !rec.LiveAt(now) {
				continue // corrupt (already alerted), ended or expired: not listed
			}
			out.Leases = append(out.Leases, rec)
		}
		return out, nil
	})
}

// History pages through an identity's terminal evidence, newest first.
func (s *Store) History(ctx context.Context, req lease.HistoryRequest) (lease.HistoryResult, error) {
	pg, err := lease.PrepareHistory(req, s.opts)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	lockKey, after, size := pg.LockKey, pg.After, pg.Size
	return read(s, ctx, lease.Deadline(ctx, req.DeadlineAt), func(tx *layered.View, now lease.Timestamp) (lease.HistoryResult, error) {
		out := lease.HistoryResult{Entries: []lease.HistoryEntry{}, BackendTime: now}
		prefix := historyPrefix(lockKey)
		c := tx.Bucket(bucketIdent).Cursor()
		k, v := seekLast(c, prefix)
		if after != "" {
			seq, err := strconv.ParseUint(after, 10, 64)
			if err != nil {
				return out, lease.Invalid("page_token", "malformed")
			}
			// Resume at the entry the token names, or the next older one if
			// retention removed it.
			from := append(bytes.Clone(prefix), u64(seq)...)
			if k, v = c.Seek(from); k == nil {
				k, v = c.Last()
			} else if !bytes.Equal(k, from) {
				k, v = c.Prev()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
			if len(out.Entries) == size {
				seq := binary.BigEndian.Uint64(k[len(prefix):])
				out.NextPageToken = pg.NextPageToken(strconv.FormatUint(seq, 10))
				return out, nil
			}
			h, err := lease.DecodeStoredHistoryAt(v, lockKey)
			if err != nil || h.Record.LockKey != lockKey {
				// Another identity's entry is not this one's to show.
				s.quarantine(tx, lockKey, pg.Identity, "history entry is corrupt")
				continue
			}
			out.Entries = append(out.Entries, *h)
		}
		return out, nil
	})
}

// LookupRequest returns the stored result of a mutation by its request id.
func (s *Store) LookupRequest(ctx context.Context, req lease.LookupRequest) (lease.Result, error) {
	p, err := lease.PrepareLookup(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return read(s, ctx, lease.Deadline(ctx, req.DeadlineAt), func(tx *layered.View, now lease.Timestamp) (lease.Result, error) {
		v, ended, ok := s.storedEvidence(tx, p)
		if v == nil && ok {
			return lease.Result{}, lease.RequestNotFound(now)
		}
		res, found := lease.Result{}, false
		if ok {
			res, found = p.Lookup(v, func(orig *lease.Record) (*lease.Record, error) { return s.currentOf(tx, orig, now, ended) })
		}
		if !found {
			return lease.Result{}, s.quarantine(tx, p.LockKey, p.Identity, "idempotency evidence is corrupt")
		}
		return res, nil
	})
}
