package bolt

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// Closed is a restored namespace awaiting recovery verification
// (lease.ClosedNamespace). It offers only what recovery needs: the
// restored state and the one transaction that raises counters, ends
// restored leases and reopens.
type Closed struct {
	s *Store
}

var _ lease.ClosedNamespace = (*Closed)(nil)

// OpenClosed opens the restored store at the namespace's path for
// recovery, on a store of its own. Its gate must still be closed by the
// restore.
func (n *Namespace) OpenClosed(context.Context) (lease.ClosedNamespace, error) {
	if _, err := os.Stat(n.path); err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "no store at the restore path")
	}
	s, err := Open(n.path, n.o)
	if err != nil {
		return nil, err
	}
	if s.gate != gateRestored {
		s.Close()
		return nil, lease.Errorf(lease.CodeCorrupt, "file is not a restored namespace awaiting verification")
	}
	return &Closed{s: s}, nil
}

// Close closes the store without reopening the namespace.
func (c *Closed) Close() error { return c.s.Close() }

// State reads the restored state in one read transaction. Malformed
// counters, marks or records fail closed.
func (c *Closed) State(ctx context.Context) (lease.RestoredState, error) {
	st := lease.RestoredState{Counters: map[string]uint64{}, HighWater: map[string]uint64{}}
	err := c.s.view(ctx, func(tx *layered.View) error {
		meta := tx.Bucket(bucketMeta)
		if err := json.Unmarshal(meta.Get(keyRestored), &st.Marker); err != nil {
			return lease.Errorf(lease.CodeCorrupt, "restore marker is corrupt")
		}
		if v := meta.Get(keyEpoch); len(v) == 8 {
			st.Epoch = binary.BigEndian.Uint64(v)
		}
		if err := eachOfKind(tx, kindCounter, func(lockKey string, _, v []byte) error {
			if len(v) != 8 {
				return lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
			}
			st.Counters[lockKey] = binary.BigEndian.Uint64(v)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketHighWater).ForEach(func(k, v []byte) error {
			i := indexOf(k, 0)
			if len(v) != 8 || i < 0 {
				return lease.Errorf(lease.CodeCorrupt, "a high-water mark is malformed")
			}
			key := string(k[:i])
			st.HighWater[key] = max(st.HighWater[key], binary.BigEndian.Uint64(v))
			return nil
		}); err != nil {
			return err
		}
		return eachOfKind(tx, kindActive, func(lockKey string, _, v []byte) error {
			rec, err := lease.DecodeStoredRecord(v)
			if err != nil || rec.LockKey != lockKey {
				return lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
			}
			st.Active = append(st.Active, rec)
			return nil
		})
	})
	return st, err
}

func indexOf(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// Finish applies plan in one write transaction — raise counters, end every
// restored active lease through the normal archive path (revoked with
// plan.Reason if live, expired if already expired: a restored TTL is never
// resurrected), clear the restored mark and the gate — reopening the
// namespace. r is closed afterwards.
func (c *Closed) Finish(ctx context.Context, plan lease.RecoveryPlan) (lease.RecoveryResult, error) {
	var res lease.RecoveryResult
	if err := c.s.begin(ctx); err != nil {
		return lease.RecoveryResult{}, err
	}
	if err := plan.Check(); err != nil {
		return lease.RecoveryResult{}, err
	}
	// Not mutate: a refusal here must roll the whole transaction back.
	if err := c.s.sync(); err != nil {
		return lease.RecoveryResult{}, c.s.storageReadError(err)
	}
	err := c.s.group.engine.exclusive(func(btx *bbolt.Tx, id int) error {
		return directAs(btx, id, func(tx *layered.View) error {
			res = lease.RecoveryResult{}
			now := c.s.clock(tx)
			res.At = now
			ident := tx.Bucket(bucketIdent)
			for key, want := range plan.Counters {
				var cur uint64
				if v := ident.Get(counterKey(key)); v != nil {
					if len(v) != 8 {
						return lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
					}
					cur = binary.BigEndian.Uint64(v)
				}
				if want > cur {
					if err := ident.Put(counterKey(key), u64(want)); err != nil {
						return err
					}
					res.Raised++
				}
			}
			var active []*lease.Record
			if err := eachOfKind(tx, kindActive, func(lockKey string, _, v []byte) error {
				rec, err := lease.DecodeStoredRecord(v)
				if err != nil || rec.LockKey != lockKey {
					return lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
				}
				active = append(active, rec)
				return nil
			}); err != nil {
				return err
			}
			for _, rec := range active {
				e := plan.Ending(rec, now)
				if err := c.s.archive(tx, rec, e.State, e.At, ended{by: e.By, reason: e.Reason}); err != nil {
					return err
				}
				res.Note(rec.LeaseID, e)
			}
			meta := tx.Bucket(bucketMeta)
			if plan.Epoch > 0 {
				if err := meta.Put(keyEpoch, u64(plan.Epoch)); err != nil {
					return err
				}
			}
			floor, ok := counterFloor(tx)
			if !ok {
				return lease.Errorf(lease.CodeCorrupt, "the counter floor is malformed")
			}
			if plan.Floor > floor {
				if err := meta.Put(keyCounterFloor, u64(plan.Floor)); err != nil {
					return err
				}
			}
			rec, _ := json.Marshal(map[string]any{"at": now, "epoch": plan.Epoch, "reason": plan.Reason,
				"raised": res.Raised, "revoked": len(res.Revoked), "restore": json.RawMessage(meta.Get(keyRestored))})
			if err := meta.Put(keyRecovery, rec); err != nil {
				return err
			}
			if err := meta.Delete(keyRestored); err != nil {
				return err
			}
			return meta.Delete(keyGate)
		})
	})
	if err != nil {
		var le *lease.Error
		if !errors.As(err, &le) {
			err = lease.Errorf(lease.CodeBackendUnavailable, "recovery transaction failed")
		}
		return lease.RecoveryResult{}, err
	}
	// Committed: the namespace is open whatever closing the file says.
	if err := c.s.Close(); err != nil {
		c.s.log.Error("closing the recovered store failed", "code", lease.CodeOf(err))
	}
	return res, nil
}

// counterFloor is the namespace's counter floor (0 before any recovery
// epoch): no acquisition gets a token at or below it.
//
// A floor of the wrong length is corrupt (ok false): reading it as 0 would
// drop a recovery epoch's guarantee silently.
func counterFloor(tx *layered.View) (floor uint64, ok bool) {
	v := tx.Bucket(bucketMeta).Get(keyCounterFloor)
	switch len(v) {
	case 0:
		return 0, true
	case 8:
		return binary.BigEndian.Uint64(v), true
	}
	return 0, false
}
