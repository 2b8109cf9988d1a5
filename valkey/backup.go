package valkey

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

// A backup is consistent for the whole namespace, not only per identity:
// it closes the gate, reads every key of the namespace (SCAN), and reopens
// the gate only if it still holds its own closing, so nothing changed while
// it read. Mutations are refused (retryably) for the backup's duration.

// BackendName is the backend recorded in Valkey backups.
const BackendName = "valkey"

// DefaultBackupPause bounds a backup's pause of mutations: a backup not
// finished by then fails, and the namespace reopens by itself.
const DefaultBackupPause = time.Minute

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
	{regexp.MustCompile(`^(lease|outbox|outbox_dead|outbox_dead_entry|cred):[A-Za-z0-9_.:-]+$`), "string"},
	{regexp.MustCompile(`^(counter_floor|epoch|outbox_seq)$`), "counter"},
	{regexp.MustCompile(`^(last_recovery|format)$`), "string"},
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
// for Options.BackupPause. sections are carried after the snapshot, each
// verified like it on restore.
func (s *Store) Backup(ctx context.Context, w io.Writer, sections ...backupfile.SectionData) (backupfile.Header, error) {
	if err := s.writable(ctx); err != nil {
		return backupfile.Header{}, err
	}
	gate := gateBackup + ":" + lease.NewLeaseID(lease.At(time.Now()))
	ok, err := s.setNX(ctx, gate, s.backupPause)
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
		func(w io.Writer) error { _, err := w.Write(payload.Bytes()); return err }, sections...)
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
