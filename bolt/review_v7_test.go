package bolt

// Review of schema 7 (commit 1a791ca), part 2: tests against the schema 7
// build. The differential tests compare with what the schema 6 build
// observed on the same file (testdata/review7, written by the f8e39a3
// tree running review_v7_script_test.go's r7Build, r7Observe, r7Recover).

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// r7Data is testdata/review7/name, stored gzipped.
func r7Data(t *testing.T, name string) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata/review7", name+".gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func r7Want(t *testing.T, name string) []string {
	t.Helper()
	return strings.Split(strings.TrimSuffix(string(r7Data(t, name)), "\n"), "\n")
}

func r7Compare(t *testing.T, what string, got, want []string) {
	t.Helper()
	bad := 0
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			if bad < 10 {
				t.Errorf("%s line %d:\n  schema 7: %.400s\n  schema 6: %.400s", what, i+1, g, w)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d lines differ (schema 7 %d lines, schema 6 %d)", what, bad, len(want), len(got), len(want))
	}
}

// r7CopyFile copies the store file src (a path, or a testdata/review7
// name) to a temporary directory.
func r7CopyFile(t *testing.T, src string) string {
	t.Helper()
	var raw []byte
	if name, ok := strings.CutPrefix(src, "testdata/review7/"); ok {
		raw = r7Data(t, name)
	} else {
		var err error
		if raw, err = os.ReadFile(src); err != nil {
			t.Fatal(err)
		}
	}
	return tempStoreFile(t, raw)
}

// The schema 6 build's file, migrated by opening it, answers every read,
// replay, conflict, new mutation, commit, reap and later read exactly as
// the schema 6 build answered them on the same file (7,500 observations:
// inspect by identity and by lease id, history pages and their tokens,
// lookups, List of every filter at page sizes 1, 2 and 50 past 80 stale
// index entries, quarantine, high-water marks, the reaper over retention).
func TestReview7DifferentialMigratedFile(t *testing.T) {
	c := &clock{t: r7ObserveAt}
	s, err := Open(r7CopyFile(t, "testdata/review7/v6.db"), r7Opts(c))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r7Compare(t, "observe", r7Observe(t, s, c), r7Want(t, "observe.txt"))
}

// The same story written by the schema 7 build itself observes the same.
func TestReview7DifferentialNativeFile(t *testing.T) {
	c := &clock{t: r7Base}
	path := filepath.Join(t.TempDir(), "v7.db")
	s, err := Open(path, r7Opts(c))
	if err != nil {
		t.Fatal(err)
	}
	w, backup := r7Build(t, s, c)
	s.Close()
	r7Compare(t, "build", w.out, r7Want(t, "build.txt"))
	c2 := &clock{t: r7ObserveAt}
	s2, err := Open(r7CopyFile(t, path), r7Opts(c2))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	r7Compare(t, "observe", r7Observe(t, s2, c2), r7Want(t, "observe.txt"))
	r7Compare(t, "recover", r7Recover(t, backup, t.TempDir()), r7Want(t, "recover.txt"))
}

// A backup the schema 6 build took restores into a closed namespace that
// recovery reads (every counter, high-water mark and active record) and
// finishes exactly as the schema 6 build does.
func TestReview7RecoverFromSchema6Backup(t *testing.T) {
	raw := r7Data(t, "v6.backup")
	r7Compare(t, "recover", r7Recover(t, raw, t.TempDir()), r7Want(t, "recover.txt"))
}

// Packing is a bijection on lock keys and scopes: unpack(pack(k)) == k,
// distinct keys pack distinctly, ident keys of different kinds and
// identities never share a prefix that a scan uses.
func TestReview7PackRoundTrip(t *testing.T) {
	seen := map[string]string{}
	for i := range 3000 {
		id := r7Ident("prog-1", fmt.Sprintf("x-%d", i))
		_, k, err := lease.CanonicalLockKey(id, leasetest.StoreOptions().OperationClasses)
		if err != nil {
			t.Fatal(err)
		}
		p := packLockKey(k)
		if len(p) != packedLen || unpackLockKey(p) != k {
			t.Fatalf("%s packs to %x, unpacks to %s", k, p, unpackLockKey(p))
		}
		if other, dup := seen[string(p)]; dup {
			t.Fatalf("%s and %s pack alike", k, other)
		}
		seen[string(p)] = k
		scope := lease.IdempotencyScope(lease.OpAcquire, k, "prn", fmt.Sprint(i))
		if b, ok := digestOfText(scope); !ok || base64.RawURLEncoding.EncodeToString(b) != scope {
			t.Fatalf("scope %s does not round-trip", scope)
		}
		for _, kk := range [][]byte{activeKey(k), counterKey(k), historyKey(k, uint64(i)), idemKey(k, scope)} {
			lk, _, ok := splitIdentKey(kk)
			if !ok || lk != k {
				t.Fatalf("split %x: %s %v", kk, lk, ok)
			}
			if bytes.HasPrefix(kk, historyPrefix(k)) != (kk[packedLen] == kindHistory) {
				t.Fatalf("history prefix of %x", kk)
			}
		}
	}
	// A non-canonical spelling (a trailing-bit variant) is no lock key
	// and must not reach the canonical key's facts.
	k := testLockKey(t)
	last := k[len(k)-1]
	for _, r := range base64URLAlphabet {
		v := k[:len(k)-1] + string(r)
		if byte(r) != last && bytes.Equal(packLockKey(v), packLockKey(k)) {
			t.Fatalf("%s packs like %s", v, k)
		}
	}
}

const base64URLAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// A text that is no lock key finds nothing, even KeyPrefix + the canonical
// JSON whose SHA-256 is an identity's packed key (review: packLockKey
// packed such text to its SHA-256, which aliased that identity's facts;
// latent, as every lock key reaching the store is derived by
// CanonicalLockKey or checked by CheckLockKey first).
func TestReview7PackOfForeignTextAliases(t *testing.T) {
	k := testLockKey(t)
	id := testIdentity
	id.WorkflowName, id.OperationClass = "default", "default"
	json := fmt.Sprintf(`["v1",%q,%q,%q,%q,%q,%q,%q]`, id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID,
		id.ActorName, id.WorkflowName, id.OperationClass)
	sum := sha256.Sum256([]byte(json))
	if lease.KeyPrefix+base64.RawURLEncoding.EncodeToString(sum[:]) != k {
		t.Fatalf("canonical JSON guess %s is not the lock key's preimage", json)
	}
	forged := lease.KeyPrefix + json
	if lease.CheckLockKey(forged) == nil {
		t.Fatalf("CheckLockKey accepts %s", forged)
	}
	if bytes.Equal(packLockKey(forged), packLockKey(k)) {
		t.Errorf("packLockKey(%q) == packLockKey(%q): a text that is no lock key reaches the identity's facts "+
			"(activeKey, counterKey, idemKey, history all alias)", forged, k)
	}
}

// History pages, trimming and inspect-by-lease-id on identities whose
// packed keys start or end with 0x00 or 0xff, share their first two
// bytes, or hold 0xff 0xff, with history sequences crossing 0xffff →
// 0x10000 and entries of all identities interleaved in sequence order.
func TestReview7HistoryPagingAtKeyEdges(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: r7Base}
	o := r7Opts(c)
	o.HistoryPerIdentity = 40
	s, err := Open(filepath.Join(t.TempDir(), "s.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Sequences cross 0xff → 0x100 and 0xffff → 0x10000 (a 0xff byte in
	// the sequence; seekLast increments the kind byte, never these).
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).SetSequence(0xfff0) }); err != nil {
		t.Fatal(err)
	}
	w := newR7World(t, s, c)
	targets := r7Targets(t)
	want := map[int][]string{} // identity → its lease labels, newest first
	for round := range 12 {
		for i, target := range targets {
			r := w.acquire(r7Ident("prog-1", target), "prn-a", fmt.Sprintf("h-%d-%d", i, round), time.Hour)
			w.release(r, fmt.Sprintf("hr-%d-%d", i, round))
			want[i] = append([]string{w.label(r.LeaseID)}, want[i]...)
		}
	}
	for i, target := range targets {
		id := r7Ident("prog-1", target)
		for _, size := range []int{1, 2, 5, 12, 50} {
			var got []string
			tok := ""
			for page := 0; ; page++ {
				h, err := s.History(ctx, lease.HistoryRequest{Identity: id, PageSize: size, PageToken: tok, DeadlineAt: r7Far})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range h.Entries {
					if e.Record.TargetID != target {
						t.Fatalf("history of %s lists %s's entry", target, e.Record.TargetID)
					}
					got = append(got, w.label(e.Record.LeaseID))
				}
				if tok = h.NextPageToken; tok == "" || page > 100 {
					break
				}
			}
			if strings.Join(got, ",") != strings.Join(want[i], ",") {
				t.Fatalf("history of %s (%x…) at page size %d: %v, want %v", target, r7Digest(t, id)[:2], size, got, want[i])
			}
		}
		// Inspect by lease id finds each ended lease in its identity's
		// history (findHistory).
		for _, l := range want[i] {
			var lid string
			for id, lab := range w.labels {
				if lab == l {
					lid = id
				}
			}
			in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: lid, DeadlineAt: r7Far})
			if err != nil || in.Lease.LeaseID != lid || in.Lease.State != lease.StateReleased || in.Lease.TargetID != target {
				t.Fatalf("inspect %s: %v %+v", l, err, in.Lease)
			}
		}
	}
	// Trimming to fewer per identity keeps each identity's newest only.
	s.opts.HistoryPerIdentity = 3
	for i, target := range targets {
		r := w.acquire(r7Ident("prog-1", target), "prn-a", fmt.Sprintf("t-%d", i), time.Hour)
		w.release(r, fmt.Sprintf("tr-%d", i))
		h, err := s.History(ctx, lease.HistoryRequest{Identity: r7Ident("prog-1", target), DeadlineAt: r7Far})
		if err != nil || len(h.Entries) != 3 || h.Entries[0].Record.LeaseID != r.LeaseID {
			t.Fatalf("trimmed history of %s: %v %d entries", target, err, len(h.Entries))
		}
		if kk := countHistory(t, s, r.LockKey); kk != 3 {
			t.Fatalf("history entries of %s after trim: %d", target, kk)
		}
	}
}

func countHistory(t *testing.T, s *Store, lockKey string) int {
	n := 0
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdent).ForEach(func(k, _ []byte) error {
			if bytes.HasPrefix(k, historyPrefix(lockKey)) {
				n++
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// r7PutRaw writes entries into a copy of the schema 6 fixture with bbolt
// directly, as a schema 6 file could hold them.
func r7PutRaw(t *testing.T, puts ...[3][]byte) string {
	t.Helper()
	path, _ := openSchema6Fixture(t)
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, p := range puts {
			if err := tx.Bucket(p[0]).Put(p[1], p[2]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	return path
}

// Shapes of schema 6 ident keys the existing refusal test does not try.
// Each would be moved to a schema 7 key of no known shape (or under a
// different spelling of the lock key) if the migration took it; it must
// refuse the file and leave it as it was.
func TestReview7MigrationRefusesMoreMalformedKeys(t *testing.T) {
	lk := testLockKey(t)
	d := strings.TrimPrefix(lk, lease.KeyPrefix)
	// The same 32 bytes spelled with nonzero trailing bits: no lock key.
	var variant string
	for _, r := range base64URLAlphabet {
		v := d[:len(d)-1] + string(r)
		if v != d {
			if b, err := base64.RawURLEncoding.DecodeString(v); err == nil && bytes.Equal(b, packLockKey(lk)) {
				variant = v
				break
			}
		}
	}
	if variant == "" {
		t.Fatal("no trailing-bit variant")
	}
	scope := lease.IdempotencyScope(lease.OpAcquire, lk, "prn", "r")
	for name, k := range map[string][]byte{
		"history key with a 4-byte sequence": v6IdentKey(lk, kindHistory, "\x00\x00\x00\x01"),
		"history key with a 9-byte sequence": v6IdentKey(lk, kindHistory, "\x00\x00\x00\x00\x00\x00\x00\x00\x01"),
		"active key with a tail":             v6IdentKey(lk, kindActive, "x"),
		"counter key with a tail":            v6IdentKey(lk, kindCounter, "\x00"),
		"idem scope with trailing bits":      v6IdentKey(lk, kindIdem, scope[:len(scope)-1]+"_"),
		"lock key with trailing bits":        v6IdentKey(lease.KeyPrefix+variant, kindCounter, ""),
		"lock key in another version":        v6IdentKey("starintel:target-lease:v2:"+d, kindCounter, ""),
	} {
		t.Run(name, func(t *testing.T) {
			path := r7PutRaw(t, [3][]byte{bucketIdent, k, u64(7)})
			want := layoutOf(t, path)
			if _, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
				t.Fatalf("open with %q: %v, want corrupt", k, err)
			}
			got := layoutOf(t, path)
			for b, entries := range want {
				for kk, v := range entries {
					if got[b][kk] != v {
						t.Fatalf("%s[%q] changed by a refused migration", b, kk)
					}
				}
			}
		})
	}
}

// The migration drops time index entries that name nothing: idem_exp
// entries of evidence whose scope is no digest (review: they were kept,
// rewritten to a packed key of no known shape), as history_exp and
// active_exp entries of no schema 6 shape are.
func TestReview7MigrationDropsTimeIndexEntriesThatNameNothing(t *testing.T) {
	lk := testLockKey(t)
	ms := u64(uint64(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()))
	path := r7PutRaw(t,
		[3][]byte{bucketIdemExp, append(bytes.Clone(ms), v6IdentKey(lk, kindIdem, "short")...), nil},
		[3][]byte{bucketIdemExp, append(bytes.Clone(ms), v6IdentKey(lk, kindIdem, strings.Repeat("!", 43))...), nil},
		[3][]byte{bucketHistoryExp, append(bytes.Clone(ms), v6IdentKey(lk, kindHistory, "\x01")...), nil},
		[3][]byte{bucketActiveExp, append(bytes.Clone(ms), "not-a-lock-key"...), nil},
	)
	s, err := Open(path, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketIdemExp, bucketHistoryExp} {
			wantKind := map[string]byte{string(bucketIdemExp): kindIdem, string(bucketHistoryExp): kindHistory}[string(b)]
			wantLen := map[string]int{string(bucketIdemExp): 8 + packedLen + 1 + packedLen, string(bucketHistoryExp): 8 + packedLen + 1 + 8}[string(b)]
			if err := tx.Bucket(b).ForEach(func(k, _ []byte) error {
				if len(k) != wantLen || k[8+packedLen] != wantKind {
					t.Errorf("%s keeps an entry of no schema 7 shape: %x (%d bytes)", b, k, len(k))
				} else if tx.Bucket(bucketIdent).Get(k[8:]) == nil {
					t.Errorf("%s keeps an entry naming no ident key: %x", b, k)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketActiveExp).ForEach(func(k, _ []byte) error {
			if len(k) != 8+packedLen {
				t.Errorf("active_exp keeps %x", k)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
}

// The backup header's per-kind counts of a migrated file equal what the
// schema 6 file held (counted in its own layout), and a lease-id lookup
// too short to hold a packed key answers not_found rather than a panic or
// another identity's lease.
func TestReview7BackupCountsAndShortLookup(t *testing.T) {
	path := r7CopyFile(t, "testdata/review7/v6.db")
	want := map[string]int64{}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[byte]string{kindCounter: "counters", kindIdem: "idem", kindActive: "active", kindHistory: "history"}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdent).ForEach(func(k, _ []byte) error {
			i := bytes.IndexByte(k, 0)
			want[kinds[k[i+1]]]++
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{bucketLeases, bucketHighWater, bucketCommits} {
		_ = db.View(func(tx *bbolt.Tx) error { want[string(b)] = int64(tx.Bucket(b).Stats().KeyN); return nil })
	}
	db.Close()
	c := &clock{t: r7ObserveAt}
	s, err := Open(path, r7Opts(c))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var buf bytes.Buffer
	h, err := s.Backup(context.Background(), &buf)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if h.Counts[k] != v {
			t.Errorf("backup count %s: %d, schema 6 file held %d", k, h.Counts[k], v)
		}
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketLeases).Put([]byte("lease_short"), []byte("active\x000"))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: "lease_short", DeadlineAt: r7Far}); lease.CodeOf(err) != lease.CodeNotFound {
		t.Fatalf("inspect of a short lookup: %v", err)
	}
}
