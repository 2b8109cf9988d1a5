package valkey

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

// ErrNamespaceOpen is returned by OpenClosed for a namespace that is not
// closed: recovery decides only for a namespace no lease operation can
// change meanwhile (Seal closes one after a failover).
var ErrNamespaceOpen = lease.ErrNamespaceOpen

// Closed is a closed namespace awaiting recovery verification
// (lease.ClosedNamespace).
type Closed struct {
	s    *Store
	gate string
}

var _ lease.ClosedNamespace = (*Closed)(nil)

// openClosed opens the namespace for recovery, on a connection of its
// own. It must be closed by a restore or a Seal (ErrNamespaceOpen
// otherwise).
func openClosed(ctx context.Context, o Options) (*Closed, error) {
	s, err := Open(ctx, o)
	if err != nil {
		return nil, err
	}
	g := s.gateValue(ctx)
	if kind, _, _ := strings.Cut(g, ":"); kind != gateRestored && kind != gateFailover {
		s.Close()
		if g != "" {
			return nil, lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed (%s), not for recovery", gateReason(g))
		}
		return nil, ErrNamespaceOpen
	}
	return &Closed{s: s, gate: g}, nil
}

// Close closes the connection; the namespace stays as it is.
func (c *Closed) Close() error { return c.s.Close() }

// State reads the closed namespace: its restore marker, epoch, counters,
// high-water marks and active records. Malformed values fail closed.
func (c *Closed) State(ctx context.Context) (lease.RestoredState, error) {
	s := c.s
	st := lease.RestoredState{Counters: map[string]uint64{}, HighWater: map[string]uint64{}}
	if m, ok := strings.CutPrefix(c.gate, gateRestored+":"); ok {
		if err := json.Unmarshal([]byte(m), &st.Marker); err != nil {
			return st, lease.Errorf(lease.CodeCorrupt, "restore marker is corrupt")
		}
	}
	if v, err := s.client.Do(ctx, s.client.B().Get().Key(s.keys.epoch()).Build()).ToString(); err == nil {
		n, ok := tokenValue(v)
		if !ok {
			return st, lease.Errorf(lease.CodeCorrupt, "recovery epoch is malformed")
		}
		st.Epoch = n
	} else if !vk.IsValkeyNil(err) {
		return st, s.failure(call{fn: "recovery"}, err)
	}
	tags, err := c.tags(ctx, "counter")
	if err != nil {
		return st, err
	}
	for _, tag := range tags {
		v, err := s.client.Do(ctx, s.client.B().Get().Key(s.keys.counter(tag)).Build()).ToString()
		if err != nil {
			return st, s.failure(call{fn: "recovery"}, err)
		}
		n, ok := tokenValue(v)
		if !ok {
			return st, lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
		}
		st.Counters[lease.KeyPrefix+tag] = n
	}
	if tags, err = c.tags(ctx, "marks"); err != nil {
		return st, err
	}
	for _, tag := range tags {
		m, err := s.client.Do(ctx, s.client.B().Hgetall().Key(s.keys.marks(tag)).Build()).AsStrMap()
		if err != nil {
			return st, s.failure(call{fn: "recovery"}, err)
		}
		for _, v := range m {
			n, ok := tokenValue(v)
			if !ok {
				return st, lease.Errorf(lease.CodeCorrupt, "a high-water mark is malformed")
			}
			st.HighWater[lease.KeyPrefix+tag] = max(st.HighWater[lease.KeyPrefix+tag], n)
		}
	}
	st.Active, err = c.actives(ctx)
	return st, err
}

// tags lists the identities (hash tags) holding a key of kind.
func (c *Closed) tags(ctx context.Context, kind string) ([]string, error) {
	keys, err := c.s.scanKeys(ctx, "{*}:"+kind)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		tag, ok := strings.CutSuffix(strings.TrimPrefix(k, "{"), "}:"+kind)
		if !ok || !validTag(tag) {
			return nil, lease.Errorf(lease.CodeCorrupt, "namespace key %q is outside the lease layout", k)
		}
		out = append(out, tag)
	}
	return out, nil
}

// actives strictly reads every active record.
func (c *Closed) actives(ctx context.Context) ([]*lease.Record, error) {
	tags, err := c.tags(ctx, "active")
	if err != nil {
		return nil, err
	}
	var out []*lease.Record
	for _, tag := range tags {
		raw, err := c.s.client.Do(ctx, c.s.client.B().Get().Key(c.s.keys.active(tag)).Build()).AsBytes()
		if vk.IsValkeyNil(err) {
			continue // reclaimed since the scan
		}
		if err != nil {
			return nil, c.s.failure(call{fn: "recovery"}, err)
		}
		rec, err := c.s.decodeRecord(raw, lease.KeyPrefix+tag)
		if err != nil {
			return nil, lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
		}
		out = append(out, rec)
	}
	return out, nil
}

// Finish applies plan (see lease.ClosedNamespace): counters raised, every
// active lease ended through the library's archive path, then the floor,
// epoch and recovery record written and the gate opened in one step. Each
// step is conditional on the namespace still being closed; a Finish that
// fails part-way leaves it closed and can run again.
func (c *Closed) Finish(ctx context.Context, plan lease.RecoveryPlan) (lease.RecoveryResult, error) {
	s := c.s
	var res lease.RecoveryResult
	if err := plan.Check(); err != nil {
		return res, err
	}
	keys := make([]string, 0, len(plan.Counters))
	for k := range plan.Counters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rep, err := s.fcall(ctx, call{fn: "recover_raise", mutation: true,
			keys: []string{s.keys.counter(tagOf(k)), s.keys.gate()}, args: []string{utoa(plan.Counters[k]), c.gate}})
		if err != nil {
			return res, err
		}
		switch rep.status {
		case "ok":
			if rep.at(0) == "1" {
				res.Raised++
			}
		case "exhausted":
			return res, lease.Errorf(lease.CodeCounterExhausted, "recovery epoch would exceed the fencing token limit")
		case "corrupt":
			return res, lease.Errorf(lease.CodeCorrupt, "a fencing counter is malformed")
		default:
			return res, recoveryRefused(rep)
		}
	}
	reason, _ := json.Marshal(plan.Reason)
	actives, err := c.actives(ctx)
	if err != nil {
		return res, err
	}
	var none lease.Identity
	for _, rec := range actives {
		tag := tagOf(rec.LockKey)
		args := append(s.commonArgs(lease.UnixMilli(0), rec.LockKey, tag, none, s.opts.IdempotencyRetention), rec.LeaseID, string(reason), lease.RecoveryPrincipal, c.gate, s.writeFormat())
		rep, err := s.fcall(ctx, call{fn: "recover_end", mutation: true, keys: s.commonKeys(tag, s.keys.quarantine(tag)), args: args})
		if err != nil {
			return res, err
		}
		switch rep.status {
		case "revoked":
			res.Revoked = append(res.Revoked, rec.LeaseID)
		case "expired":
			res.Expired = append(res.Expired, rec.LeaseID)
		case "noop":
		case "corrupt":
			return res, lease.Errorf(lease.CodeCorrupt, "a restored active record is corrupt")
		default:
			return res, recoveryRefused(rep)
		}
		res.At = rep.now
	}
	record, _ := json.Marshal(map[string]any{"at": time.Now().UTC(), "epoch": plan.Epoch, "floor": plan.Floor,
		"reason": plan.Reason, "raised": res.Raised, "revoked": len(res.Revoked), "closed_by": c.gate})
	if err := s.reopen(ctx, c.gate, plan.Floor, plan.Epoch, string(record)); err != nil {
		return res, err
	}
	return res, nil
}

func recoveryRefused(rep reply) error {
	if rep.status == "gate" {
		return lease.Errorf(lease.CodeBackendUnavailable, "the namespace gate changed during recovery (reopened, or closed by someone else)")
	}
	return lease.Errorf(lease.CodeBackendUnavailable, "recovery step refused (%s)", rep.status)
}
