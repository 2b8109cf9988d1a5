package etcd

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/lease"
)

// The gate (meta/gate) closes the prefix: while it exists every lease
// mutation and the reaper refuse with lease_backend_unavailable, naming
// its value, and reads go on. Every transition compares the gate's mod
// revision, so one that read the prefix open cannot commit once it is
// closed. Its values, read by operators in those refusals:
const (
	// gateRestoring: a restore is writing, or stopped part-way; recovery
	// refuses it (its counters may be missing).
	gateRestoring = "a restore is writing, or stopped part-way (empty the key prefix and restore again)"
	// gateRestored: restored from a backup, awaiting recovery.
	gateRestored = "restored from a backup, awaiting recovery verification"
	// gateSealed: closed by Seal, awaiting recovery.
	gateSealed = "sealed, awaiting recovery verification"
)

func (l layout) lastRecovery() string    { return l.p + "meta/last_recovery" }
func (l layout) counterPrefix() string   { return l.p + "c/" }
func (l layout) highWaterPrefix() string { return l.p + "w/" }
func (l layout) activePrefix() string    { return l.p + "a/" }

// Recovery groups: etcd's default limit is 128 operations (and 128
// compares) per transaction. Raising a counter is one read, one compare
// and one put; ending a lease reads an identity's six keys and writes
// about a dozen (the archive path and the identity's time).
const (
	raiseGroup = 64
	endGroup   = 8
)

// finishHook, if set, runs after each step of Finish with the step's name
// ("raised", "ended"); an error stops Finish there (tests only).
var finishHook func(step string) error

// Seal closes an open prefix for recovery, so recovery can raise its
// counters before any lease operation runs on it again, and reports
// whether it closed it: one already closed for recovery stays as it is
// (false); one closed otherwise (a restore part-way) is refused. etcd
// itself never loses an acknowledged write, so a seal is for a prefix that
// came back some other way: a cluster restored from an etcd snapshot, or
// a mirror promoted after the source cluster was lost.
func (s *Store) Seal(ctx context.Context) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	cctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(s.keys.gate()), "=", 0)).
		Then(clientv3.OpPut(s.keys.gate(), gateSealed)).Else(clientv3.OpGet(s.keys.gate())).Commit()
	if err != nil {
		return false, lease.Errorf(lease.CodeOutcomeUnknown, "the seal may have been applied (%s); seal again", classify(err))
	}
	if r.Succeeded {
		s.log.Warn("lease namespace sealed; mutations are refused until recovery verification")
		return true, nil
	}
	var gate string
	if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		gate = string(kvs[0].Value)
	}
	if gate == gateRestored || gate == gateSealed {
		return false, nil
	}
	return false, lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed (%s), not for recovery; not sealed", gate)
}

// Closed is a closed prefix awaiting recovery verification
// (lease.ClosedNamespace). Every step it takes is conditional on the gate
// still being the closing it opened (its mod revision): a recovery whose
// prefix was reopened, or closed again by someone else, cannot act.
type Closed struct {
	c       *conn
	gate    string
	gateMod int64
}

var _ lease.ClosedNamespace = (*Closed)(nil)

// openClosed takes c's prefix for recovery: its gate must say restored or
// sealed.
func openClosed(ctx context.Context, c *conn) (*Closed, error) {
	v, mod, _, err := c.s.gateKV(ctx)
	switch {
	case err != nil:
		return nil, err
	case v == nil:
		return nil, lease.ErrNamespaceOpen
	case string(v) != gateRestored && string(v) != gateSealed:
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed (%s), not for recovery", v)
	}
	return &Closed{c: c, gate: string(v), gateMod: mod}, nil
}

// Close closes the connection; the prefix stays as it is.
func (c *Closed) Close() error { return c.c.close() }

// errGateChanged refuses a recovery step once the gate is no longer the
// closing the recovery opened.
func errGateChanged() error {
	return lease.Errorf(lease.CodeBackendUnavailable, "the namespace gate changed during recovery (reopened, or closed by someone else)")
}

// State reads the closed prefix at one revision: its restore marker,
// epoch, counters, high-water marks and active records. Malformed values
// fail closed.
func (c *Closed) State(ctx context.Context) (lease.RestoredState, error) {
	s := c.c.s
	st := lease.RestoredState{Counters: map[string]uint64{}, HighWater: map[string]uint64{}}
	if err := s.begin(ctx); err != nil {
		return st, err
	}
	cctx, cancel := s.bound(ctx)
	r, err := s.cli.Txn(cctx).Then(clientv3.OpGet(s.keys.gate()), clientv3.OpGet(s.keys.restored()), clientv3.OpGet(s.keys.epoch())).Commit()
	cancel()
	if err != nil {
		return st, s.failure(err, false)
	}
	rev := r.Header.Revision
	gate := r.Responses[0].GetResponseRange().Kvs
	if len(gate) != 1 || gate[0].ModRevision != c.gateMod {
		return st, errGateChanged()
	}
	if c.gate == gateRestored {
		m := r.Responses[1].GetResponseRange().Kvs
		if len(m) != 1 || lease.DecodeStrict(m[0].Value, &st.Marker) != nil || st.Marker.BackupSHA256 == "" {
			return st, lease.Errorf(lease.CodeCorrupt, "restore marker is corrupt")
		}
	}
	if e := r.Responses[2].GetResponseRange().Kvs; len(e) == 1 {
		n, ok := readU64(e[0].Value)
		if !ok || e[0].Value == nil {
			return st, lease.Errorf(lease.CodeCorrupt, "recovery epoch is malformed")
		}
		st.Epoch = n
	}
	if _, err := s.scan(ctx, s.keys.counterPrefix(), rev, false, func(key string, v []byte) error {
		lk := key[len(s.keys.counterPrefix()):]
		n, ok := tokenOf(v)
		if !ok || lease.CheckLockKey(lk) != nil {
			return lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
		}
		st.Counters[lk] = n
		return nil
	}); err != nil {
		return st, err
	}
	if _, err := s.scan(ctx, s.keys.highWaterPrefix(), rev, false, func(key string, v []byte) error {
		lk, _, _ := strings.Cut(key[len(s.keys.highWaterPrefix()):], "\x00")
		n, ok := tokenOf(v)
		if !ok || lease.CheckLockKey(lk) != nil {
			return lease.Errorf(lease.CodeCorrupt, "a high-water mark is malformed")
		}
		st.HighWater[lk] = max(st.HighWater[lk], n)
		return nil
	}); err != nil {
		return st, err
	}
	_, err = s.scan(ctx, s.keys.activePrefix(), rev, false, func(key string, v []byte) error {
		rec, err := lease.DecodeRecord(v)
		if err != nil || rec.LockKey != key[len(s.keys.activePrefix()):] {
			return lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
		}
		st.Active = append(st.Active, rec)
		return nil
	})
	return st, err
}

// tokenOf reads a stored counter or mark: 8 bytes, at most the token
// limit.
func tokenOf(v []byte) (uint64, bool) {
	n, ok := readU64(v)
	return n, ok && v != nil && n <= lease.MaxFencingToken
}

// Finish applies plan (see lease.ClosedNamespace) in bounded transactions,
// each conditional on the gate: counters raised (never lowered), then
// every active lease ended through the store's archive path (revoked by
// lease.RecoveryPrincipal if live at its identity's backend time, expired
// if not), then, in one last transaction that also finds no active record
// left, the floor raised, the epoch and the recovery's record written, the
// restore marker removed and the gate deleted. A Finish that fails
// part-way leaves the prefix closed; run again, it raises nothing twice
// and ends only what is still active.
func (c *Closed) Finish(ctx context.Context, plan lease.RecoveryPlan) (lease.RecoveryResult, error) {
	var res lease.RecoveryResult
	if err := plan.Check(); err != nil {
		return res, err
	}
	keys := make([]string, 0, len(plan.Counters))
	for k := range plan.Counters {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for group := range slices.Chunk(keys, raiseGroup) {
		n, err := c.raise(ctx, group, plan.Counters)
		if err != nil {
			return res, err
		}
		res.Raised += n
	}
	if err := c.step("raised"); err != nil {
		return res, err
	}
	var active []string
	s := c.c.s
	if _, err := s.scan(ctx, s.keys.activePrefix(), 0, true, func(key string, _ []byte) error {
		active = append(active, key[len(s.keys.activePrefix()):])
		return nil
	}); err != nil {
		return res, err
	}
	for group := range slices.Chunk(active, endGroup) {
		if err := c.end(ctx, group, plan, &res); err != nil {
			return res, err
		}
		if err := c.step("ended"); err != nil {
			return res, err
		}
	}
	return res, c.reopen(ctx, plan, &res)
}

func (c *Closed) step(name string) error {
	if finishHook == nil {
		return nil
	}
	return finishHook(name)
}

// held checks, in attempt t, that the gate is still the closing c opened;
// the attempt's commit compares it.
func (c *Closed) held(t *txn) error {
	if err := t.fetch(t.s.keys.gate()); err != nil {
		return err
	}
	if g := t.seen[t.s.keys.gate()]; g.val == nil || g.mod != c.gateMod {
		return errGateChanged()
	}
	return nil
}

// raise raises the counters of keys to at least want's, in one
// transaction; it returns how many it raised or created.
func (c *Closed) raise(ctx context.Context, keys []string, want map[string]uint64) (int, error) {
	s := c.c.s
	return change(s, ctx, func(t *txn) (int, error) {
		counters := make([]string, len(keys))
		for i, k := range keys {
			counters[i] = s.keys.counter(k)
		}
		if err := t.fetch(append(counters, s.keys.gate())...); err != nil {
			return 0, err
		}
		if err := c.held(t); err != nil {
			return 0, err
		}
		n := 0
		for i, k := range keys {
			cur, ok := readU64(t.seen[counters[i]].val)
			if !ok {
				return 0, lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
			}
			if want[k] > cur {
				t.put(counters[i], u64(want[k]))
				n++
			}
		}
		return n, nil
	})
}

// endedLease is a lease one end transaction ended.
type endedLease struct {
	id     string
	ending lease.RecoveryEnding
	now    lease.Timestamp // the identity's backend time it was ended at
}

// end ends the active leases of lockKeys in one transaction, each as
// plan.Ending says at its identity's backend time, and records them in
// res once committed. An identity without an active lease (ended by an
// earlier run) is skipped; anything malformed fails the whole group before
// it writes.
func (c *Closed) end(ctx context.Context, lockKeys []string, plan lease.RecoveryPlan, res *lease.RecoveryResult) error {
	s := c.c.s
	done, err := change(s, ctx, func(t *txn) ([]endedLease, error) {
		var keys []string
		for _, lk := range lockKeys {
			keys = append(keys, s.identityKeys(lk)...)
		}
		if err := t.fetch(keys...); err != nil {
			return nil, err
		}
		if err := c.held(t); err != nil {
			return nil, err
		}
		type target struct {
			rec *lease.Record
			now lease.Timestamp
		}
		var targets []target
		for _, lk := range lockKeys {
			v := t.seen[s.keys.active(lk)].val
			if v == nil {
				continue
			}
			rec, err := lease.DecodeRecord(v)
			if err != nil || rec.LockKey != lk {
				return nil, lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
			}
			if _, ok := readU64(t.seen[s.keys.historySeq(lk)].val); !ok {
				return nil, lease.Errorf(lease.CodeCorrupt, "a history sequence is malformed")
			}
			recorded, _ := readU64(t.seen[s.keys.time(lk)].val)
			targets = append(targets, target{rec, s.identityTime(int64(recorded))})
		}
		var out []endedLease
		for _, tg := range targets {
			e := plan.Ending(tg.rec, tg.now)
			if err := s.archive(t, tg.rec, e.State, e.At, ended{by: e.By, reason: e.Reason}); err != nil {
				return nil, err
			}
			s.stamp(t, tg.rec.LockKey, tg.now)
			out = append(out, endedLease{tg.rec.LeaseID, e, tg.now})
		}
		return out, nil
	})
	for _, d := range done {
		res.Note(d.id, d.ending)
		if res.At.Before(d.now) {
			res.At = d.now
		}
	}
	return err
}

// recoveryRecord is the last recovery's record (meta/last_recovery), for
// operators.
type recoveryRecord struct {
	At       time.Time       `json:"at"`
	Epoch    uint64          `json:"epoch"`
	Floor    uint64          `json:"floor"`
	Reason   string          `json:"reason"`
	Raised   int             `json:"raised"`
	Revoked  int             `json:"revoked"`
	Expired  int             `json:"expired"`
	ClosedBy string          `json:"closed_by"`
	Restore  json.RawMessage `json:"restore,omitempty"`
}

// reopen is Finish's last transaction: conditional on the gate, on the
// floor read, and on no active record being left, it raises the floor,
// records the epoch and the recovery, and deletes the restore marker and
// the gate.
func (c *Closed) reopen(ctx context.Context, plan lease.RecoveryPlan, res *lease.RecoveryResult) error {
	s := c.c.s
	for {
		cctx, cancel := s.bound(ctx)
		r, err := s.cli.Txn(cctx).Then(clientv3.OpGet(s.keys.gate()), clientv3.OpGet(s.keys.floor()),
			clientv3.OpGet(s.keys.restored())).Commit()
		cancel()
		if err != nil {
			return s.failure(err, false)
		}
		if g := r.Responses[0].GetResponseRange().Kvs; len(g) != 1 || g[0].ModRevision != c.gateMod {
			return errGateChanged()
		}
		var floor uint64
		var floorMod int64
		if f := r.Responses[1].GetResponseRange().Kvs; len(f) == 1 {
			var ok bool
			if floor, ok = tokenOf(f[0].Value); !ok {
				return lease.Errorf(lease.CodeCorrupt, "the counter floor is malformed")
			}
			floorMod = f[0].ModRevision
		}
		now := lease.UnixMilli(s.clock())
		if res.At.Before(now) {
			res.At = now
		}
		rec := recoveryRecord{At: res.At.Time(), Epoch: plan.Epoch, Floor: max(floor, plan.Floor), Reason: plan.Reason,
			Raised: res.Raised, Revoked: len(res.Revoked), Expired: len(res.Expired), ClosedBy: c.gate}
		if m := r.Responses[2].GetResponseRange().Kvs; len(m) == 1 {
			rec.Restore = m[0].Value
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		var ops []clientv3.Op
		if plan.Floor > floor {
			ops = append(ops, clientv3.OpPut(s.keys.floor(), string(u64(plan.Floor))))
		}
		if plan.Epoch > 0 {
			ops = append(ops, clientv3.OpPut(s.keys.epoch(), string(u64(plan.Epoch))))
		}
		ops = append(ops, clientv3.OpPut(s.keys.lastRecovery(), string(b)),
			clientv3.OpDelete(s.keys.restored()), clientv3.OpDelete(s.keys.gate()))
		cctx, cancel = s.bound(ctx)
		r, err = s.cli.Txn(cctx).If(
			clientv3.Compare(clientv3.ModRevision(s.keys.gate()), "=", c.gateMod),
			clientv3.Compare(clientv3.ModRevision(s.keys.floor()), "=", floorMod),
			// Nothing active is left: no restored TTL survives the reopening.
			clientv3.Compare(clientv3.CreateRevision(s.keys.activePrefix()), "=", 0).WithPrefix(),
		).Then(ops...).Else(clientv3.OpGet(s.keys.activePrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
		cancel()
		switch {
		case err != nil:
			return lease.Errorf(lease.CodeOutcomeUnknown,
				"the recovery's last step may have reopened the namespace (%s); run the recovery again: a closed namespace is recovered, an open one is done", classify(err))
		case r.Succeeded:
			s.log.Warn("lease namespace recovered and reopened", "epoch", plan.Epoch, "floor", rec.Floor,
				"raised", res.Raised, "revoked", len(res.Revoked), "expired", len(res.Expired))
			return nil
		case r.Responses[0].GetResponseRange().Count > 0:
			return lease.Errorf(lease.CodeBackendUnavailable, "an active lease appeared in the closed namespace during recovery; run the recovery again")
		}
		// The gate or the floor changed since read: read them again.
	}
}
