package valkey

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// ErrRestoreTarget is returned when the restore target namespace holds any
// key: a restore never merges into or replaces a namespace (that could
// roll its counters back). It matches backupfile.ErrRestoreTarget.
var ErrRestoreTarget = backupfile.TargetError("restore target namespace is not empty; restore only into an empty namespace")

// readPayload strictly reads a backup payload: JSON lines of dumpEntry,
// each checked against the layout, no key twice.
func readPayload(b []byte) ([]dumpEntry, error) {
	var out []dumpEntry
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var e dumpEntry
		if err := dec.Decode(&e); err != nil || dec.More() {
			return nil, fmt.Errorf("backup entry is malformed")
		}
		if err := e.check(); err != nil {
			return nil, err
		}
		if seen[e.Key] {
			return nil, fmt.Errorf("backup holds key %q twice", e.Key)
		}
		seen[e.Key] = true
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("backup payload is malformed: %v", err)
	}
	return out, nil
}

// Restore verifies the backup read from r and restores it into this
// store's namespace, which must be empty. The namespace is closed first
// (its gate holds the restore's marker) and stays closed — every mutation
// refused with lease_backend_unavailable — until recovery verification
// (Namespace.OpenClosed, then recovery.Verify) reopens it. Keys whose expiry has
// passed at backend time are not restored. A backup that fails
// verification restores nothing; a restore that fails after its first
// write leaves the namespace closed with part of the backup (empty it and
// restore again); recovery (Namespace.OpenClosed) refuses it.
func (s *Store) Restore(ctx context.Context, r io.Reader) (backupfile.Header, error) {
	var payload bytes.Buffer
	h, err := backupfile.Read(r, &payload)
	if err != nil {
		return backupfile.Header{}, err
	}
	if err := backupfile.CheckBackend(h, BackendName); err != nil {
		return backupfile.Header{}, err
	}
	entries, err := readPayload(payload.Bytes())
	if err != nil {
		return backupfile.Header{}, err
	}
	if err := s.writable(ctx); err != nil {
		return backupfile.Header{}, err
	}
	marker, _ := json.Marshal(lease.RestoreMarker{BackupCreatedAt: h.CreatedAt, BackupSHA256: h.PayloadSHA256, RestoredAt: time.Now().UTC()})
	// Checked before closing too, so a restore aimed at a live namespace
	// does not pause it at all.
	if err := s.mustBeEmpty(ctx, ""); err != nil {
		return backupfile.Header{}, err
	}
	restoring := gateRestoring + ":" + string(marker)
	ok, err := s.setNX(ctx, restoring, 0)
	if err != nil {
		return backupfile.Header{}, err
	}
	if !ok {
		return backupfile.Header{}, fmt.Errorf("%w: it is closed (%s)", ErrRestoreTarget, gateReason(s.gateValue(ctx)))
	}
	// Until the target is known empty, a failure opens the namespace again
	// as it was (not on ctx, which may be what failed).
	undo := func(cause error) error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := s.reopen(rctx, restoring, 0, 0, ""); err != nil {
			return fmt.Errorf("%w; and the namespace could not be reopened (its gate holds a restoring marker; delete %s once it is known empty): %v",
				cause, s.keys.gate(), lease.AsError(err).Reason)
		}
		return cause
	}
	if err := s.mustBeEmpty(ctx, "gate"); err != nil {
		return backupfile.Header{}, undo(err)
	}
	now, err := s.backendTime(ctx)
	if err != nil {
		return backupfile.Header{}, undo(err)
	}
	// From the first write on, a failure leaves the namespace closed as
	// "restoring", which recovery refuses: empty it and restore again.
	for _, e := range entries {
		if e.ExpireAt != 0 && e.ExpireAt <= now.UnixMilli() {
			continue
		}
		if err := s.restoreKey(ctx, e); err != nil {
			return backupfile.Header{}, err
		}
	}
	// Complete: only now may recovery take the namespace.
	rep, err := s.fcall(ctx, call{fn: "regate", mutation: true, keys: []string{s.keys.gate()},
		args: []string{restoring, gateRestored + ":" + string(marker)}})
	if err != nil {
		return backupfile.Header{}, err
	}
	if rep.status != "ok" {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "the namespace gate changed during the restore")
	}
	s.log.Info("lease namespace restored; closed until recovery verification", "backup_sha256", h.PayloadSHA256, "keys", len(entries))
	return h, nil
}

// mustBeEmpty refuses a namespace holding any key but except.
func (s *Store) mustBeEmpty(ctx context.Context, except string) error {
	keys, err := s.scanKeys(ctx, "*")
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k != except {
			return fmt.Errorf("%w: it holds %s:%s", ErrRestoreTarget, s.keys.ns, k)
		}
	}
	return nil
}

func (s *Store) restoreKey(ctx context.Context, e dumpEntry) error {
	full := s.keys.ns + ":" + e.Key
	c := s.client
	var cmds vk.Commands
	switch e.Type {
	case "string":
		cmds = append(cmds, c.B().Set().Key(full).Value(string(e.String)).Build())
	case "list":
		for _, v := range e.List {
			cmds = append(cmds, c.B().Rpush().Key(full).Element(string(v)).Build())
		}
	case "hash":
		for f, v := range e.Hash {
			cmds = append(cmds, c.B().Hset().Key(full).FieldValue().FieldValue(f, string(v)).Build())
		}
	case "zset":
		for _, z := range e.Zset {
			cmds = append(cmds, c.B().Zadd().Key(full).ScoreMember().ScoreMember(z.Score, string(z.Member)).Build())
		}
	}
	if e.ExpireAt != 0 {
		cmds = append(cmds, c.B().Pexpireat().Key(full).MillisecondsTimestamp(e.ExpireAt).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return s.failure(call{fn: "restore", mutation: true}, err)
		}
	}
	return nil
}
