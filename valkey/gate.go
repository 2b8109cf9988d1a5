package valkey

import (
	"context"
	"strings"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

// The namespace gate (ns:gate) closes a namespace: while it exists every
// lease mutation function refuses with "closed" (lease_backend_unavailable)
// before reading anything else, and reads go on. Its value says why:
//
//	backup:<id>      a backup's pause of mutations (with a TTL, so a backup
//	                 that dies cannot keep the namespace closed)
//	restoring:<json> a restore is writing (or stopped part-way: recovery
//	                 refuses it; empty the namespace and restore again)
//	restored:<json>  restored from a backup, awaiting recovery verification
//	failover:<time>  closed by an operator after a replica's promotion,
//	                 awaiting recovery verification

const (
	gateBackup    = "backup"
	gateRestoring = "restoring"
	gateRestored  = "restored"
	gateFailover  = "failover"
)

// gateReason is the public reason of a gate value: its kind only.
func gateReason(v string) string {
	switch kind, _, _ := strings.Cut(v, ":"); kind {
	case gateBackup:
		return "a backup has paused mutations"
	case gateRestoring:
		return "a restore is writing, or stopped part-way (empty the namespace and restore again)"
	case gateRestored:
		return "restored from a backup, awaiting recovery verification"
	case gateFailover:
		return "failed over, awaiting recovery verification"
	}
	return "closed by an operator"
}

// setNX closes the gate with value unless it is already closed.
func (s *Store) setNX(ctx context.Context, value string, ttl time.Duration) (bool, error) {
	cmd := s.client.B().Set().Key(s.keys.gate()).Value(value).Nx()
	var err error
	if ttl > 0 {
		err = s.client.Do(ctx, cmd.PxMilliseconds(ttl.Milliseconds()).Build()).Error()
	} else {
		err = s.client.Do(ctx, cmd.Build()).Error()
	}
	if vk.IsValkeyNil(err) {
		return false, nil
	}
	if err != nil {
		return false, s.failure(call{fn: "gate"}, err)
	}
	return true, nil
}

// gateValue reads the gate: "" if the namespace is open.
func (s *Store) gateValue(ctx context.Context) string {
	v, _ := s.client.Do(ctx, s.client.B().Get().Key(s.keys.gate()).Build()).ToString()
	return v
}

// reopen deletes the gate if it still holds gate, recording a recovery.
func (s *Store) reopen(ctx context.Context, gate string, floor, epoch uint64, record string) error {
	rep, err := s.fcall(ctx, call{fn: "reopen", mutation: true,
		keys: []string{s.keys.gate(), s.keys.counterFloor(), s.keys.epoch(), s.keys.lastRecovery()},
		args: []string{gate, utoa(floor), utoa(epoch), record}})
	switch {
	case err != nil:
		return err
	case rep.status == "gate":
		return lease.Errorf(lease.CodeBackendUnavailable, "the namespace gate changed")
	case rep.status == "corrupt":
		return lease.Errorf(lease.CodeCorrupt, "the counter floor is malformed")
	case rep.status != "ok":
		return s.malformed(call{fn: "reopen", mutation: true})
	}
	return nil
}

// Seal closes an open namespace after a replica's promotion, so recovery
// can raise its counters before any lease operation runs on it, and
// reports whether it closed it: a namespace already closed for recovery
// stays as it is (false); one paused by a backup is refused.
func (s *Store) Seal(ctx context.Context) (bool, error) {
	if err := s.writable(ctx); err != nil {
		return false, err
	}
	ok, err := s.setNX(ctx, gateFailover+":"+time.Now().UTC().Format(time.RFC3339Nano), 0)
	if err != nil || ok {
		return ok, err
	}
	if g := s.gateValue(ctx); strings.HasPrefix(g, gateBackup+":") {
		return false, lease.Errorf(lease.CodeBackendUnavailable, "a backup has paused mutations; seal again when it has finished")
	}
	return false, nil
}
