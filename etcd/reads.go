package etcd

import (
	"context"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/lease"
)

// readAt opens a read of one identity: its keys and more in one
// linearizable round trip, and backend time for it; past the deadline it
// refuses. The read records its time like a transition (see "Backend
// time"), except in a closed namespace, which still answers reads but
// changes nothing.
func (s *Store) readAt(t *txn, lockKey string, due lease.Timestamp, more ...string) (lease.Timestamp, error) {
	if err := t.fetch(s.identityKeys(lockKey, more...)...); err != nil {
		return lease.Timestamp{}, err
	}
	recorded, _ := readU64(t.seen[s.keys.time(lockKey)].val)
	now := s.identityTime(int64(recorded))
	if err := s.pastDeadline(due); err != nil {
		return now, err
	}
	if t.seen[s.keys.gate()].val == nil {
		s.stamp(t, lockKey, now)
	}
	return now, nil
}

// Inspect reads the lease of an identity (active, or expired if its time
// has passed) or a lease by id (active or terminal).
func (s *Store) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	req, lockKey, err := lease.PrepareInspect(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	due := lease.Deadline(ctx, req.DeadlineAt)
	return observe(s, ctx, func(t *txn) (lease.Result, error) {
		key := lockKey
		if req.LeaseID != "" {
			v, err := t.get(s.keys.leaseID(req.LeaseID))
			if err != nil {
				return lease.Result{}, err
			}
			k, _, ok := parseLeaseLocation(v)
			if !ok {
				// Unknown (or an entry that does not parse): not found,
				// decided at this server's clock.
				return lease.Result{}, refuse(lease.NotFound(lease.UnixMilli(s.clock())))
			}
			key = k
		}
		now, err := s.readAt(t, key, due)
		if err != nil {
			return lease.Result{}, refuse(err)
		}
		res := lease.Result{Code: lease.CodeInspected, BackendTime: now}
		cur, err := s.loadActive(t, key)
		switch {
		case err != nil:
			return res, err
		case cur != nil && (req.LeaseID == "" || cur.LeaseID == req.LeaseID):
			res.Lease = cur.ObservedAt(now)
			return res, nil
		case req.LeaseID == "":
			return res, refuse(lease.NotFound(now))
		}
		h, err := s.findHistory(t, key, req.LeaseID)
		if err != nil {
			return res, err
		}
		if h != nil {
			res.Lease = h.Record
			return res, nil
		}
		return res, refuse(lease.NotFound(now))
	})
}

// List pages through unexpired active leases of one filter in lease-id
// order: range reads of the filter's index prefix, and the records they
// name read at the same revision, so a page costs O(page size).
func (s *Store) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	pg, err := lease.PrepareList(req, s.opts)
	if err != nil {
		return lease.ListResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return lease.ListResult{}, err
	}
	now := lease.UnixMilli(s.clock())
	if err := s.pastDeadline(lease.Deadline(ctx, req.DeadlineAt)); err != nil {
		return lease.ListResult{}, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	out := lease.ListResult{Leases: []*lease.Record{}, BackendTime: now}
	prefix := s.keys.indexPrefix(pg.Filter)
	from := prefix
	if pg.After != "" {
		from = prefix + pg.After + "\x00"
	}
	budget := 4*pg.Size + 64
	var rev int64
	last := ""
	for budget > 0 {
		// At most listChunk entries a round: each costs two reads of the
		// records' transaction (etcd allows 128 operations in one).
		opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
			clientv3.WithLimit(int64(min(pg.Size-len(out.Leases)+1, budget, listChunk)))}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		r, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return lease.ListResult{}, s.failure(err, false)
		}
		if rev == 0 {
			rev = r.Header.Revision
		}
		ops := make([]clientv3.Op, 0, 2*len(r.Kvs))
		for _, kv := range r.Kvs {
			ops = append(ops, clientv3.OpGet(s.keys.active(string(kv.Value)), clientv3.WithRev(rev)),
				clientv3.OpGet(s.keys.time(string(kv.Value)), clientv3.WithRev(rev)))
		}
		var recs *clientv3.TxnResponse
		if len(ops) > 0 {
			if recs, err = s.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return lease.ListResult{}, s.failure(err, false)
			}
		}
		for i, kv := range r.Kvs {
			if len(out.Leases) == pg.Size || budget == 0 {
				out.NextPageToken = pg.NextPageToken(last)
				return out, nil
			}
			budget--
			last = string(kv.Key[len(prefix):])
			got := recs.Responses[2*i].GetResponseRange().Kvs
			if len(got) == 0 {
				continue // ended since: not listed
			}
			rec, err := lease.DecodeRecord(got[0].Value)
			if err != nil {
				lease.CorruptState(s.log, lease.Identity{}, "record listed by an index is corrupt")
				continue
			}
			// Expiry at the identity's time where it is ahead of this
			// clock: a lease another server reported expired is not
			// listed here as active.
			at := now
			if tk := recs.Responses[2*i+1].GetResponseRange().Kvs; len(tk) == 1 {
				if recorded, ok := readU64(tk[0].Value); ok && int64(recorded) > at.UnixMilli() {
					at = lease.UnixMilli(int64(recorded))
				}
			}
			if rec.LeaseID != last || !pg.Filter.Selects(rec) || !rec.LiveAt(at) {
				continue
			}
			out.Leases = append(out.Leases, rec)
		}
		if !r.More {
			return out, nil
		}
		from = prefix + last + "\x00"
	}
	out.NextPageToken = pg.NextPageToken(last)
	return out, nil
}

// listChunk bounds the index entries List reads in one round.
const listChunk = 60

// History pages through an identity's terminal evidence, newest first.
func (s *Store) History(ctx context.Context, req lease.HistoryRequest) (lease.HistoryResult, error) {
	pg, err := lease.PrepareHistory(req, s.opts)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return lease.HistoryResult{}, err
	}
	now := lease.UnixMilli(s.clock())
	if err := s.pastDeadline(lease.Deadline(ctx, req.DeadlineAt)); err != nil {
		return lease.HistoryResult{}, err
	}
	prefix := s.keys.historyPrefix(pg.LockKey)
	end := clientv3.GetPrefixRangeEnd(prefix)
	if pg.After != "" {
		seq, err := strconv.ParseUint(pg.After, 10, 64)
		if err != nil || seq == 0 {
			return lease.HistoryResult{}, lease.Invalid("page_token", "malformed")
		}
		// Resume at the entry the token names, or the next older one if
		// retention removed it.
		end = s.keys.history(pg.LockKey, seq) + "\x00"
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Get(ctx, prefix, clientv3.WithRange(end), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend),
		clientv3.WithLimit(int64(pg.Size+1)))
	if err != nil {
		return lease.HistoryResult{}, s.failure(err, false)
	}
	out := lease.HistoryResult{Entries: []lease.HistoryEntry{}, BackendTime: now}
	for _, kv := range r.Kvs {
		if len(out.Entries) == pg.Size {
			seq, err := strconv.ParseUint(string(kv.Key[len(prefix):]), 16, 64)
			if err != nil {
				return out, lease.CorruptState(s.log, pg.Identity, "history key is malformed")
			}
			out.NextPageToken = pg.NextPageToken(strconv.FormatUint(seq, 10))
			return out, nil
		}
		h, err := lease.DecodeHistoryEntry(kv.Value)
		if err != nil || h.Record.LockKey != pg.LockKey {
			// Another identity's entry is not this one's to show.
			lease.CorruptState(s.log, pg.Identity, "history entry is corrupt")
			continue
		}
		out.Entries = append(out.Entries, *h)
	}
	return out, nil
}

// LookupRequest returns the stored result of a mutation by its request id.
func (s *Store) LookupRequest(ctx context.Context, req lease.LookupRequest) (lease.Result, error) {
	p, err := lease.PrepareLookup(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	due := lease.Deadline(ctx, req.DeadlineAt)
	return observe(s, ctx, func(t *txn) (lease.Result, error) {
		now, err := s.readAt(t, p.LockKey, due, s.keys.idem(p.Scope))
		if err != nil {
			return lease.Result{}, refuse(err)
		}
		v := t.seen[s.keys.idem(p.Scope)].val
		if v == nil || isTombstone(v) {
			// Not found is final: a tombstone in the evidence's place
			// makes an attempt of this request still in flight (its
			// bytes held up in the network) lose its compare, so it can
			// no longer commit after this answer. A retry by the client
			// reads the tombstone and runs as a new attempt.
			if v == nil && t.seen[s.keys.gate()].val == nil {
				s.tombstone(t, p.Scope, now)
			}
			return lease.Result{}, refuse(lease.RequestNotFound(now))
		}
		var observedErr error
		res, ok := p.Lookup(v, func(orig *lease.Record) (*lease.Record, error) {
			cur, err := s.currentOf(t, orig, now)
			if err != nil {
				observedErr = err
				return nil, err
			}
			return cur, nil
		})
		if _, isRead := observedErr.(errRead); isRead {
			return lease.Result{}, observedErr
		}
		if !ok {
			return lease.Result{}, refuse(lease.CorruptState(s.log, p.Identity, "idempotency evidence is corrupt"))
		}
		return res, nil
	})
}
