package etcd

import (
	"context"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/lease"
)

// Reaping consumes the time indexes from their oldest end, in bounded
// transactions, so a pass costs what is due and never walks what is not:
// ae/ (active leases by expires_at), ie/ and ke/ (idempotency and commit
// evidence by retention end), he/ (history by ended_at). It is storage
// reclamation, never a source of truth: every operation already treats an
// expired record as expired. Several servers may reap the same prefix;
// every step is conditional on what it read, so they only repeat work.

const (
	// reapExpireGroup is how many expired leases one transaction archives
	// (each archive is about a dozen operations; etcd's default limit is
	// 128 per transaction).
	reapExpireGroup = 8
	// reapDropGroup is how many index entries one transaction drops.
	reapDropGroup = 40
)

// reap runs one pass until nothing is due or ctx ends.
func (s *Store) reap(ctx context.Context) error {
	// A server ahead would expire leases and drop evidence early.
	if err := s.refuseIfAhead(); err != nil {
		return err
	}
	// Nor does a closed namespace lose evidence before its verification.
	if gate, err := s.gate(ctx); err != nil || gate != "" {
		if err != nil {
			return s.failure(err, false)
		}
		return lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed: %s", gate)
	}
	for {
		n, err := s.reapExpired(ctx)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	cutoff := s.clock()
	for _, d := range []struct {
		kind   string
		data   func(rest string) []string
		cutoff int64
	}{
		{idemExpiry, func(rest string) []string { return []string{s.keys.idem(rest)} }, cutoff},
		{commitExpiry, func(rest string) []string { return []string{s.keys.commit(rest)} }, cutoff},
		{historyExpiry, nil, cutoff - s.opts.HistoryRetention.Milliseconds()},
	} {
		for {
			n, err := s.dropDue(ctx, d.kind, d.cutoff, d.data)
			if err != nil {
				return err
			}
			if n == 0 {
				break
			}
		}
	}
	return nil
}

// due reads up to limit entries of the kind's index due at cutoff (ms).
func (s *Store) due(ctx context.Context, kind string, cutoff int64, limit int) (*clientv3.GetResponse, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	from := s.keys.expiryPrefix(kind)
	r, err := s.cli.Get(ctx, from, clientv3.WithRange(s.keys.expiry(kind, cutoff+1, "")), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, s.failure(err, false)
	}
	return r, nil
}

// reapExpired archives up to one group of leases whose expires_at passed
// this server's clock, each only if it is still the identity's active
// lease and expired at its backend time. It returns how many index
// entries it consumed.
func (s *Store) reapExpired(ctx context.Context) (int, error) {
	r, err := s.due(ctx, activeExpiry, s.clock(), reapExpireGroup)
	if err != nil || len(r.Kvs) == 0 {
		return 0, err
	}
	type stale struct {
		key, lockKey, leaseID string
		token                 uint64
	}
	var group []stale
	prefix := s.keys.expiryPrefix(activeExpiry)
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		lockKey, _, _ := strings.Cut(k[len(prefix)+17:], "/") // past "<16 hex ms>/"
		leaseID, tok, _ := strings.Cut(string(kv.Value), "\x00")
		token, _ := strconv.ParseUint(tok, 10, 64)
		group = append(group, stale{k, lockKey, leaseID, token})
	}
	_, err = change(s, ctx, func(t *txn) (struct{}, error) {
		var keys []string
		for _, e := range group {
			keys = append(keys, e.key)
			keys = append(keys, s.identityKeys(e.lockKey)...)
		}
		if err := t.fetch(keys...); err != nil {
			return struct{}{}, err
		}
		for _, e := range group {
			if err := s.expireOne(t, e.lockKey, e.leaseID, e.token); err != nil {
				return struct{}{}, err
			}
			// An index entry whose lease is gone or was renewed (a stale
			// entry) goes as well.
			if t.seen[e.key].val != nil {
				t.del(e.key)
			}
		}
		return struct{}{}, nil
	})
	return len(group), err
}

// expireOne archives lockKey's active lease in attempt t if it is still
// leaseID with token and expired at the identity's backend time; it never
// touches a successor or a corrupt record.
func (s *Store) expireOne(t *txn, lockKey, leaseID string, token uint64) error {
	if gate := t.seen[s.keys.gate()].val; gate != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed: %s", gate)
	}
	recorded, _ := readU64(t.seen[s.keys.time(lockKey)].val)
	now := s.identityTime(int64(recorded))
	v := t.seen[s.keys.active(lockKey)].val
	if v == nil {
		return nil
	}
	cur, err := lease.DecodeRecord(v)
	if err != nil || cur.LockKey != lockKey || cur.LeaseID != leaseID || cur.FencingToken != token || cur.LiveAt(now) {
		return nil
	}
	if err := s.archive(t, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
		return err
	}
	s.stamp(t, lockKey, now)
	return nil
}

// expireIfCurrent is the delayed expiry cleanup of one lease (the
// conformance suite's fault hook drives it).
func (s *Store) expireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	_, err := change(s, ctx, func(t *txn) (struct{}, error) {
		if err := t.fetch(s.identityKeys(lockKey)...); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, s.expireOne(t, lockKey, leaseID, token)
	})
	return err
}

// dropDue deletes up to one group of index entries of kind due at cutoff
// and the data they stand for, each only if its index entry is still the
// one read (so data rewritten since, under a new index entry, stays). For
// history (data nil) the entry's key names the history entry and its value
// the lease id. It returns how many entries it read.
func (s *Store) dropDue(ctx context.Context, kind string, cutoff int64, data func(rest string) []string) (int, error) {
	r, err := s.due(ctx, kind, cutoff, reapDropGroup)
	if err != nil || len(r.Kvs) == 0 {
		return 0, err
	}
	prefix := s.keys.expiryPrefix(kind)
	ops := make([]clientv3.Op, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		rest := k[len(prefix)+17:] // past "<16 hex ms>/"
		var victims []string
		del := []clientv3.Op{clientv3.OpDelete(k)}
		if data != nil {
			victims = data(rest)
		} else {
			lockKey, seq, _ := strings.Cut(rest, "/")
			victims = []string{s.keys.historyPrefix(lockKey) + seq}
			// The lease-id entry goes only if it locates this history
			// entry: a damaged index entry naming another lease (of
			// another identity, or live) leaves that lease's entry alone.
			// Sequence 0 locates no history entry (they start at 1): it is
			// a live lease's location.
			if seq != hex16(0) {
				idKey := s.keys.leaseID(string(kv.Value))
				del = append(del, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(idKey), "=", lockKey+"\x00"+seq)},
					[]clientv3.Op{clientv3.OpDelete(idKey)}, nil))
			}
		}
		for _, v := range victims {
			del = append(del, clientv3.OpDelete(v))
		}
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)}, del, nil))
	}
	cctx, cancel := s.bound(ctx)
	defer cancel()
	if _, err := s.cli.Txn(cctx).Then(ops...).Commit(); err != nil {
		return 0, s.failure(err, false)
	}
	return len(r.Kvs), nil
}
