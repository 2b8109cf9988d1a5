package etcd

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/lease"
)

// txn is one attempt of a transition: reads at one revision, recorded with
// the mod revision each key had (0: absent), and buffered writes, committed
// by one etcd transaction that compares every key read. Its reads see its
// own writes.
type txn struct {
	s      *Store
	ctx    context.Context
	rev    int64 // the snapshot's revision, 0 before the first read
	seen   map[string]seenKey
	writes map[string][]byte // nil value: delete
	order  []string
	// clocks are the identity-time keys the attempt raises (stamp): their
	// compare is "not past the value written", not an unchanged mod
	// revision, so answers that only record a time do not void each
	// other (they would all retry, one per round, under contention).
	clocks map[string]bool
}

type seenKey struct {
	val []byte
	mod int64
}

func (s *Store) newTxn(ctx context.Context) *txn {
	return &txn{s: s, ctx: ctx, seen: map[string]seenKey{}, writes: map[string][]byte{}, clocks: map[string]bool{}}
}

// errRead marks a failed read: nothing was written, so the transition did
// not happen (backend_unavailable, never outcome_unknown).
type errRead struct{ err error }

func (e errRead) Error() string { return "read: " + e.err.Error() }
func (e errRead) Unwrap() error { return e.err }

// fetch reads the keys not read yet, all in one round trip, at the
// snapshot's revision (the first fetch fixes it).
func (t *txn) fetch(keys ...string) error {
	var ops []clientv3.Op
	var want []string
	for _, k := range keys {
		if _, ok := t.seen[k]; ok {
			continue
		}
		if _, ok := t.writes[k]; ok {
			continue
		}
		var opts []clientv3.OpOption
		if t.rev > 0 {
			opts = append(opts, clientv3.WithRev(t.rev))
		}
		ops = append(ops, clientv3.OpGet(k, opts...))
		want = append(want, k)
	}
	if len(ops) == 0 {
		return nil
	}
	ctx, cancel := t.s.bound(t.ctx)
	defer cancel()
	r, err := t.s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return errRead{err}
	}
	if t.rev == 0 {
		t.rev = r.Header.Revision
	}
	for i, resp := range r.Responses {
		kvs := resp.GetResponseRange().Kvs
		if len(kvs) == 0 {
			t.seen[want[i]] = seenKey{}
			continue
		}
		// A key that exists is never nil, even with an empty value: nil
		// means absent throughout.
		v := kvs[0].Value
		if v == nil {
			v = []byte{}
		}
		t.seen[want[i]] = seenKey{val: v, mod: kvs[0].ModRevision}
	}
	return nil
}

// get returns the value of key (nil if absent), reading it if needed.
func (t *txn) get(key string) ([]byte, error) {
	if v, ok := t.writes[key]; ok {
		return v, nil
	}
	if err := t.fetch(key); err != nil {
		return nil, err
	}
	return t.seen[key].val, nil
}

// getU64 reads an 8-byte counter (0 if absent); ok is false if malformed.
func (t *txn) getU64(key string) (uint64, bool, error) {
	v, err := t.get(key)
	if err != nil {
		return 0, false, err
	}
	n, ok := readU64(v)
	return n, ok, nil
}

func (t *txn) put(key string, v []byte) {
	if v == nil {
		v = []byte{}
	}
	if _, ok := t.writes[key]; !ok {
		t.order = append(t.order, key)
	}
	t.writes[key] = v
}

func (t *txn) del(key string) {
	if _, ok := t.writes[key]; !ok {
		t.order = append(t.order, key)
	}
	t.writes[key] = nil
}

// dirty reports whether the attempt has writes to commit.
func (t *txn) dirty() bool { return len(t.order) > 0 }

// errCommit marks a failed commit: the transaction may have been applied
// (outcome unknown).
type errCommit struct{ err error }

func (e errCommit) Error() string { return "commit: " + e.err.Error() }
func (e errCommit) Unwrap() error { return e.err }

// commit applies the writes if every key read still has the mod revision
// seen. ok is false if one changed: the attempt is void, nothing written.
func (t *txn) commit() (bool, error) {
	if !t.dirty() {
		return true, nil
	}
	cmps := make([]clientv3.Cmp, 0, len(t.seen))
	for k, v := range t.seen {
		if w, ok := t.writes[k]; ok && t.clocks[k] && v.mod != 0 && len(w) == 8 {
			// The identity's time may have been raised since the read,
			// to at most this attempt's time: every decision made at
			// this time still holds. Later is a lost compare (8-byte
			// big-endian values compare as numbers).
			next := binary.BigEndian.Uint64(w) + 1
			cmps = append(cmps, clientv3.Compare(clientv3.Value(k), "<", string(u64(next))))
			continue
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", v.mod))
	}
	ops := make([]clientv3.Op, 0, len(t.order))
	for _, k := range t.order {
		if v := t.writes[k]; v == nil {
			ops = append(ops, clientv3.OpDelete(k))
		} else {
			ops = append(ops, clientv3.OpPut(k, string(v)))
		}
	}
	ctx, cancel := t.s.bound(t.ctx)
	defer cancel()
	r, err := t.s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, errCommit{err}
	}
	return r.Succeeded, nil
}

// refusal is a typed answer decided by an attempt. Unlike a storage error
// it does not void the attempt: what the attempt wrote (an expired lease
// archived, the identity's time, a quarantine mark) is committed with it.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

// refuse marks err, a typed answer, as a refusal; nil stays nil. Anything
// else passes unchanged: a storage error (a failed read must void the
// attempt and be classified, never reach the caller raw) or a refusal
// already made.
func refuse(err error) error {
	var le *lease.Error
	if _, done := err.(refusal); err == nil || done || !errors.As(err, &le) {
		return err
	}
	return refusal{err}
}

// retryPause bounds the backoff between attempts that lost a compare.
const retryPause = 20 * time.Millisecond

// change runs fn in attempts until one commits (or refuses and commits
// what it wrote), within ctx: a lost compare retries from a fresh read.
func change[T any](s *Store, ctx context.Context, fn func(*txn) (T, error)) (T, error) {
	return attempt(s, ctx, true, fn)
}

// observe is change for a read that may record what it observed (the
// identity's time, when it saw an expiry): a failed commit of that record
// is backend_unavailable, since the read's answer was not given.
func observe[T any](s *Store, ctx context.Context, fn func(*txn) (T, error)) (T, error) {
	return attempt(s, ctx, false, fn)
}

// attempt runs fn until an attempt commits; mutating says whether a
// failed commit is outcome_unknown.
func attempt[T any](s *Store, ctx context.Context, mutating bool, fn func(*txn) (T, error)) (T, error) {
	var zero T
	if err := s.begin(ctx); err != nil {
		return zero, err
	}
	if err := s.refuseIfAhead(); err != nil {
		return zero, err
	}
	begun := time.Now()
	for n := 0; ; n++ {
		t := s.newTxn(ctx)
		res, err := fn(t)
		var r refusal
		refused := errors.As(err, &r)
		if err != nil && !refused {
			if s.sendAgain(ctx, err, begun) {
				continue
			}
			return zero, s.failure(err, false)
		}
		ok, cerr := t.commit()
		if cerr != nil {
			if s.sendAgain(ctx, cerr, begun) {
				continue
			}
			// A member without a leader refused it: not submitted.
			return zero, s.failure(cerr, mutating && !noLeader(cerr))
		}
		if ok {
			if refused {
				return zero, r.err
			}
			return res, nil
		}
		// Lost a compare: someone else changed what this attempt read.
		pause := min(time.Duration(n+1)*time.Millisecond, retryPause)
		select {
		case <-ctx.Done():
			// Nothing of this operation was committed: every attempt
			// lost its compare.
			return zero, lease.Errorf(lease.CodeBackendUnavailable, "the etcd transaction kept losing to concurrent writers until the deadline")
		case <-time.After(pause):
		}
	}
}

// sendAgain reports, after waiting a little, whether an attempt that
// failed with err is to be made again: when a member refused its request
// because it has no leader (every call requires one, see bound), the
// request was not processed, and the client sends the next one to another
// member; a member cut off from the others thereby costs a round trip, not
// the whole call. Within the call's context and the store's OpTimeout
// from the first attempt (no member with a leader: quorum is lost).
func (s *Store) sendAgain(ctx context.Context, err error, begun time.Time) bool {
	if !noLeader(err) || time.Since(begun) >= s.opTimeout {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(retryPause):
		return true
	}
}

// noLeader reports whether err is a member's refusal of a request because
// it has no leader.
func noLeader(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if rpctypes.ErrorDesc(e) == rpctypes.ErrNoLeader.Error() {
			return true
		}
	}
	return false
}

// failure maps an error of an attempt to the typed answer: a *lease.Error
// passes through, a failed read is backend_unavailable, a failed commit
// (submitted: it may have been applied) outcome_unknown.
func (s *Store) failure(err error, submitted bool) error {
	var le *lease.Error
	if errors.As(err, &le) {
		return le
	}
	if s.closed.Load() {
		return lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	if submitted {
		s.log.Error("etcd transaction failed after submission", "error_class", classify(err))
		return lease.Errorf(lease.CodeOutcomeUnknown, "the etcd transaction failed after submission (%s); resolve by request id", classify(err))
	}
	s.log.Warn("etcd read failed", "error_class", classify(err))
	return lease.Errorf(lease.CodeBackendUnavailable, "the etcd cluster is unavailable (%s)", classify(err))
}
