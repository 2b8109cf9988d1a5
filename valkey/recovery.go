package valkey

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// Backup, restore and recovery of a namespace.
//
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
//
// A backup is consistent for the whole namespace, not only per identity:
// it closes the gate, reads every key of the namespace (SCAN), and reopens
// the gate only if it still holds its own closing, so nothing changed while
// it read. Mutations are refused (retryably) for the backup's duration.

// BackendName is the backend recorded in Valkey backups.
const BackendName = "valkey"

// DefaultBackupPause bounds a backup's pause of mutations: a backup not
// finished by then fails, and the namespace reopens by itself.
const DefaultBackupPause = time.Minute

// ErrRestoreTarget is returned when the restore target namespace holds any
// key: a restore never merges into or replaces a namespace (that could
// roll its counters back).
var ErrRestoreTarget = errors.New("restore target namespace is not empty; restore only into an empty namespace")

// ErrNamespaceOpen is returned by OpenClosed for a namespace that is not
// closed: recovery decides only for a namespace no lease operation can
// change meanwhile (Seal closes one after a failover).
var ErrNamespaceOpen = errors.New("namespace is open; restore into it or Seal it before recovery")

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

// dumpEntry is one key of a backup payload (one JSON line): its name
// within the namespace, its type, its absolute expiry (ms, 0 for none) and
// its value. Values are bytes (base64 in JSON): index members are binary.
type dumpEntry struct {
	Key      string            `json:"key"`
	Type     string            `json:"type"`
	ExpireAt int64             `json:"expire_at_ms,omitempty"`
	String   []byte            `json:"string,omitempty"`
	List     [][]byte          `json:"list,omitempty"`
	Hash     map[string][]byte `json:"hash,omitempty"`
	Zset     []zmember         `json:"zset,omitempty"`
}

type zmember struct {
	Member []byte  `json:"member"`
	Score  float64 `json:"score"`
}

// keyKinds are the namespace's keys a backup carries, by the type each
// must hold. Anything else in the namespace fails a backup and a restore
// closed, except skippedKeys.
var keyKinds = []struct {
	re  *regexp.Regexp
	typ string
}{
	{regexp.MustCompile(`^\{[A-Za-z0-9_-]{43}\}:(active|quarantine|idem:[A-Za-z0-9_.:-]+|commit:[A-Za-z0-9_.:-]+)$`), "string"},
	{regexp.MustCompile(`^\{[A-Za-z0-9_-]{43}\}:(counter|cseq)$`), "counter"},
	{regexp.MustCompile(`^\{[A-Za-z0-9_-]{43}\}:history$`), "list"},
	{regexp.MustCompile(`^\{[A-Za-z0-9_-]{43}\}:marks$`), "marks"},
	{regexp.MustCompile(`^(index|expiry|outbox|outbox_dead|cred:index)$`), "zset"},
	{regexp.MustCompile(`^(lease|outbox|outbox_dead|cred):[A-Za-z0-9_.:-]+$`), "string"},
	{regexp.MustCompile(`^(counter_floor|epoch|outbox_seq)$`), "counter"},
	{regexp.MustCompile(`^last_recovery$`), "string"},
}

// skippedKeys are not carried: the gate and the probe are the adapter's
// own, and the audit stream is append-only evidence that a restore must
// not roll back (it stays where it is, or is archived on its own).
var skippedKeys = map[string]bool{"gate": true, "probe": true, "audit": true}

// kindOf names what a key (within the namespace) must hold, or "".
func kindOf(key string) string {
	for _, k := range keyKinds {
		if k.re.MatchString(key) {
			return k.typ
		}
	}
	return ""
}

// check validates an entry against the layout: a known key, its type, and
// for counters and marks, decimal values within the token range.
func (e dumpEntry) check() error {
	kind := kindOf(e.Key)
	want := kind
	if kind == "counter" {
		want = "string"
	}
	if kind == "marks" {
		want = "hash"
	}
	switch {
	case kind == "":
		return fmt.Errorf("backup holds a key outside the lease layout: %q", e.Key)
	case e.Type != want:
		return fmt.Errorf("backup key %q has type %q, want %q", e.Key, e.Type, want)
	case e.ExpireAt < 0:
		return fmt.Errorf("backup key %q has a negative expiry", e.Key)
	case kind == "counter":
		if _, ok := tokenValue(string(e.String)); !ok || e.ExpireAt != 0 {
			return fmt.Errorf("backup counter %q is malformed", e.Key)
		}
	case kind == "marks":
		for _, v := range e.Hash {
			if _, ok := tokenValue(string(v)); !ok {
				return fmt.Errorf("backup high-water mark %q is malformed", e.Key)
			}
		}
		if e.ExpireAt != 0 {
			return fmt.Errorf("backup high-water marks %q expire", e.Key)
		}
	}
	return nil
}

// tokenValue reads a stored counter or mark: decimal, at most 2^53-1.
func tokenValue(v string) (uint64, bool) {
	if v == "" || len(v) > 16 || strings.TrimLeft(v, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil && n <= lease.MaxFencingToken
}

// Backup writes a point-in-time snapshot of the whole namespace as a
// versioned, checksummed backup file: counters, idempotency and commit
// evidence, active records, history, high-water marks, the List index and
// expiry schedule, the outbox, lease-id lookups, the counter floor and
// epoch, and the credentials (verifiers only: the store never holds a
// secret). Mutations are paused (refused retryably) while it reads, at most
// for pause (0 means DefaultBackupPause).
func (s *Store) Backup(ctx context.Context, w io.Writer, pause time.Duration) (backupfile.Header, error) {
	if pause <= 0 {
		pause = DefaultBackupPause
	}
	if err := s.writable(ctx); err != nil {
		return backupfile.Header{}, err
	}
	gate := gateBackup + ":" + lease.NewLeaseID(lease.At(time.Now()))
	ok, err := s.setNX(ctx, gate, pause)
	if err != nil {
		return backupfile.Header{}, err
	}
	if !ok {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "namespace is closed (%s); cannot back it up", gateReason(s.gateValue(ctx)))
	}
	if s.backupHook != nil {
		s.backupHook()
	}
	entries, now, rerr := s.dump(ctx)
	// Reopen first, whatever happened: the pause must end as soon as
	// possible. Only a gate still holding this backup's closing proves
	// that nothing changed while the keys were read.
	// (Not on ctx: a backup cancelled mid-read must still reopen.)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	oerr := s.reopen(rctx, gate, 0, 0, "")
	cancel()
	if rerr != nil {
		return backupfile.Header{}, rerr
	}
	if oerr != nil {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "backup pause ended before the snapshot was read (%s); backup discarded", lease.AsError(oerr).Reason)
	}
	var payload bytes.Buffer
	counts := map[string]int64{}
	for _, e := range entries {
		b, err := json.Marshal(e)
		if err != nil {
			return backupfile.Header{}, err
		}
		payload.Write(b)
		payload.WriteByte('\n')
		counts[countName(e.Key)]++
	}
	h, err := backupfile.Write(w, backupfile.Header{Backend: BackendName, CreatedAt: now.Time().UTC(), Counts: counts},
		func(w io.Writer) error { _, err := w.Write(payload.Bytes()); return err })
	if err != nil {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "cannot write the backup: %v", err)
	}
	s.log.Info("lease store backup taken", "backend", BackendName, "keys", len(entries), "payload_sha256", h.PayloadSHA256)
	return h, nil
}

// countName groups keys for the backup header's counts.
func countName(key string) string {
	if strings.HasPrefix(key, "{") {
		_, kind, _ := strings.Cut(key, "}:")
		kind, _, _ = strings.Cut(kind, ":")
		return kind
	}
	kind, _, _ := strings.Cut(key, ":")
	return kind
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

// scanKeys lists the namespace's keys matching pattern (relative to it).
func (s *Store) scanKeys(ctx context.Context, pattern string) ([]string, error) {
	var out []string
	var cursor uint64
	prefix := s.keys.ns + ":"
	for {
		e, err := s.client.Do(ctx, s.client.B().Scan().Cursor(cursor).Match(prefix+pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return nil, s.failure(call{fn: "scan"}, err)
		}
		for _, k := range e.Elements {
			out = append(out, strings.TrimPrefix(k, prefix))
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	// SCAN may return a key more than once.
	slices.Sort(out)
	return slices.Compact(out), nil
}

// dump reads every key of the namespace (but skippedKeys) with its type,
// absolute expiry and value, and the backend time.
func (s *Store) dump(ctx context.Context) ([]dumpEntry, lease.Timestamp, error) {
	now, err := s.backendTime(ctx)
	if err != nil {
		return nil, lease.Timestamp{}, err
	}
	keys, err := s.scanKeys(ctx, "*")
	if err != nil {
		return nil, lease.Timestamp{}, err
	}
	out := make([]dumpEntry, 0, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), dumpBatch)
		batch, err := s.dumpBatch(ctx, keys[:n])
		if err != nil {
			return nil, lease.Timestamp{}, err
		}
		out = append(out, batch...)
		keys = keys[n:]
	}
	return out, now, nil
}

// dumpBatch is how many keys one pipeline reads: the pause of mutations
// lasts about two round trips per batch, not per key.
const dumpBatch = 512

// dumpBatch reads keys (but skippedKeys) with two pipelines: their types
// and absolute expiries, then their values. A key gone in between (an
// expiry) is left out.
func (s *Store) dumpBatch(ctx context.Context, keys []string) ([]dumpEntry, error) {
	c := s.client
	var meta vk.Commands
	var names []string
	for _, k := range keys {
		if skippedKeys[k] {
			continue
		}
		full := s.keys.ns + ":" + k
		names = append(names, k)
		meta = append(meta, c.B().Type().Key(full).Build(), c.B().Pexpiretime().Key(full).Build())
	}
	if len(meta) == 0 {
		return nil, nil
	}
	res := c.DoMulti(ctx, meta...)
	entries := make([]dumpEntry, 0, len(names))
	var reads vk.Commands
	for i, k := range names {
		typ, err := res[2*i].ToString()
		if err != nil {
			return nil, s.failure(call{fn: "backup"}, err)
		}
		exp, err := res[2*i+1].AsInt64()
		if err != nil {
			return nil, s.failure(call{fn: "backup"}, err)
		}
		full := s.keys.ns + ":" + k
		e := dumpEntry{Key: k, Type: typ, ExpireAt: max(exp, 0)}
		switch typ {
		case "none":
			continue
		case "string":
			reads = append(reads, c.B().Get().Key(full).Build())
		case "list":
			reads = append(reads, c.B().Lrange().Key(full).Start(0).Stop(-1).Build())
		case "hash":
			reads = append(reads, c.B().Hgetall().Key(full).Build())
		case "zset":
			reads = append(reads, c.B().Zrange().Key(full).Min("0").Max("-1").Withscores().Build())
		default:
			return nil, lease.Errorf(lease.CodeCorrupt, "namespace key %q has unsupported type %q", k, typ)
		}
		entries = append(entries, e)
	}
	if len(reads) == 0 {
		return nil, nil
	}
	out := entries[:0]
	for i, r := range c.DoMulti(ctx, reads...) {
		e := entries[i]
		var err error
		switch e.Type {
		case "string":
			if e.String, err = r.AsBytes(); vk.IsValkeyNil(err) {
				continue
			}
		case "list":
			var vs []string
			vs, err = r.AsStrSlice()
			for _, v := range vs {
				e.List = append(e.List, []byte(v))
			}
		case "hash":
			var m map[string]string
			m, err = r.AsStrMap()
			e.Hash = make(map[string][]byte, len(m))
			for f, v := range m {
				e.Hash[f] = []byte(v)
			}
		case "zset":
			var zs []vk.ZScore
			zs, err = r.AsZScores()
			for _, z := range zs {
				e.Zset = append(e.Zset, zmember{Member: []byte(z.Member), Score: z.Score})
			}
		}
		if err != nil {
			return nil, s.failure(call{fn: "backup"}, err)
		}
		if (e.Type == "list" && len(e.List) == 0) || (e.Type == "hash" && len(e.Hash) == 0) || (e.Type == "zset" && len(e.Zset) == 0) {
			continue // expired between the two pipelines
		}
		if err := e.check(); err != nil {
			return nil, lease.Errorf(lease.CodeCorrupt, "%v", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// backendTime reads the server's clock.
func (s *Store) backendTime(ctx context.Context) (lease.Timestamp, error) {
	rep, err := s.fcall(ctx, call{fn: "clock", ro: true})
	if err != nil {
		return lease.Timestamp{}, err
	}
	return rep.now, nil
}

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
// (OpenClosed, then recovery.Verify) reopens it. Keys whose expiry has
// passed at backend time are not restored. A backup that fails
// verification restores nothing; a restore that fails after its first
// write leaves the namespace closed with part of the backup (empty it and
// restore again); recovery (OpenClosed) refuses it.
func (s *Store) Restore(ctx context.Context, r io.Reader) (backupfile.Header, error) {
	var payload bytes.Buffer
	h, err := backupfile.Read(r, &payload)
	if err != nil {
		return backupfile.Header{}, err
	}
	if h.Backend != BackendName {
		return backupfile.Header{}, fmt.Errorf("backup is of backend %q, not %q", h.Backend, BackendName)
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

// Closed is a closed namespace awaiting recovery verification
// (lease.ClosedNamespace).
type Closed struct {
	s    *Store
	gate string
}

var _ lease.ClosedNamespace = (*Closed)(nil)

// OpenClosed opens the namespace for recovery. It must be closed by a
// restore or a Seal (ErrNamespaceOpen otherwise).
func OpenClosed(ctx context.Context, o Options) (*Closed, error) {
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
	keys := make([]string, 0, len(plan.Counters))
	for k := range plan.Counters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := lease.CheckLockKey(k); err != nil {
			return res, err
		}
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
		args := append(s.commonArgs(lease.UnixMilli(0), rec.LockKey, tag, none, 0), rec.LeaseID, string(reason), lease.RecoveryPrincipal, c.gate)
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
