package rabbitmq_test

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/rabbitmq"
)

// canonicalKey is the real lock key of target n.
// prefixOnly has the lock-key prefix but is no lock key.
const prefixOnly = lease.KeyPrefix + "key-1"

func canonicalKey(t *testing.T, n int) string {
	t.Helper()
	_, k, err := lease.CanonicalLockKey(lease.Identity{TenantID: "tenant-main", ProgramID: "program-a",
		TargetNamespace: "starintel-target", TargetID: fmt.Sprintf("target-%d", n), ActorName: "usernamegen"},
		lease.DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCheckLockKey(t *testing.T) {
	k := canonicalKey(t, 1)
	if err := rabbitmq.CheckLockKey(k); err != nil {
		t.Fatalf("canonical key %q refused: %v", k, err)
	}
	// The same digest with non-zero padding bits: base64 decoders that are
	// not strict accept it as the same 32 bytes.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, k[len(k)-1])
	loose := k[:len(k)-1] + string(alphabet[last+1])
	for name, bad := range map[string]string{
		"empty":             "",
		"prefix only":       lease.KeyPrefix,
		"short":             lease.KeyPrefix + "key-1",
		"digest, no prefix": strings.TrimPrefix(k, lease.KeyPrefix),
		"other prefix":      strings.Replace(k, ":v1:", ":v2:", 1),
		"one char more":     k + "A",
		"one char less":     k[:len(k)-1],
		"padded":            k[:len(k)-1] + "=",
		"std alphabet":      k[:len(k)-1] + "+",
		"padding bits set":  loose,
		"trailing space":    k + " ",
	} {
		if err := rabbitmq.CheckLockKey(bad); err == nil {
			t.Errorf("%s: %q accepted", name, bad)
		}
	}
}

func TestDeduperMarks(t *testing.T) {
	d := rabbitmq.NewDeduper(rabbitmq.DeduperOptions{MaxLockKeys: 3})
	a, b, c, e := canonicalKey(t, 1), canonicalKey(t, 2), canonicalKey(t, 3), canonicalKey(t, 4)
	for _, del := range []struct {
		id, key, lease string
		token          int64
	}{
		{"m1", a, "lease-3", 3},
		{"m2", a, "lease-7", 7},
		{"m3", a, "lease-5", 5}, // stale: dropped, the mark stays 7
		{"m4", b, "lease-2", 2},
		{"m5", prefixOnly, "lease-40", 40}, // not a lock key: unfenced, not tracked
	} {
		d.Check(delivery(del.id, del.key, del.lease, del.token))
	}
	want := map[string]uint64{a: 7, b: 2}
	if got := d.Marks(); !maps.Equal(got, want) {
		t.Fatalf("marks %v, want %v", got, want)
	}
	if d.Len() != 2 || d.Highest(prefixOnly) != 0 {
		t.Fatalf("the prefix-only key is tracked: len %d", d.Len())
	}
	// A fourth key evicts the least recently seen (a): its mark is gone
	// from the export, which is why a consumer merges with its file.
	d.Check(delivery("m6", c, "lease-1", 1))
	d.Check(delivery("m7", e, "lease-9", 9))
	if got := d.Marks(); !maps.Equal(got, map[string]uint64{b: 2, c: 1, e: 9}) {
		t.Fatalf("marks after eviction %v", got)
	}
	// The export is a copy.
	m := d.Marks()
	m[c] = 1000
	if d.Highest(c) != 1 || d.Marks()[c] != 1 {
		t.Fatal("Marks returned the Deduper's own state")
	}
}

func TestMarksFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "consumer.marks")
	a, b := canonicalKey(t, 1), canonicalKey(t, 2)
	marks := map[string]uint64{a: lease.MaxFencingToken, b: 1}
	if err := rabbitmq.WriteMarksFile(path, marks); err != nil {
		t.Fatal(err)
	}
	got, err := rabbitmq.ReadMarksFile(path)
	if err != nil || !maps.Equal(got, marks) {
		t.Fatalf("read back %v, %v; want %v", got, err, marks)
	}
	raw, _ := os.ReadFile(path)
	first, second := a, b
	if b < a {
		first, second = b, a
	}
	wantRaw := fmt.Sprintf("{%q:%d,%q:%d}\n", first, marks[first], second, marks[second])
	if string(raw) != wantRaw {
		t.Fatalf("file %q, want %q", raw, wantRaw)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	// Overwriting replaces the whole file; an empty map is "{}".
	if err := rabbitmq.WriteMarksFile(path, nil); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(path); string(raw) != "{}\n" {
		t.Fatalf("empty marks file %q", raw)
	}
	if got, err := rabbitmq.ReadMarksFile(path); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("empty marks read as %v, %v", got, err)
	}
	// No temporary file is left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "consumer.marks" {
		t.Fatalf("directory holds %v", ents)
	}
}

func TestWriteMarksFileRefusesBadMarks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "consumer.marks")
	good := map[string]uint64{canonicalKey(t, 1): 5}
	if err := rabbitmq.WriteMarksFile(path, good); err != nil {
		t.Fatal(err)
	}
	for name, marks := range map[string]map[string]uint64{
		"prefix-only key": {canonicalKey(t, 1): 6, prefixOnly: 6},
		"zero token":      {canonicalKey(t, 2): 0},
		"token above max": {canonicalKey(t, 2): lease.MaxFencingToken + 1},
	} {
		err := rabbitmq.WriteMarksFile(path, marks)
		var me *rabbitmq.MarksError
		if !errors.As(err, &me) || !errors.Is(err, rabbitmq.ErrMalformedMarks) || me.Path != path || me.LockKey == "" {
			t.Errorf("%s: err %v, want a *MarksError naming the entry", name, err)
		}
	}
	// The refused writes left the old file alone and no temporary file.
	if got, err := rabbitmq.ReadMarksFile(path); err != nil || !maps.Equal(got, good) {
		t.Fatalf("file after refused writes: %v, %v", got, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %v", ents)
	}
}

func TestReadMarksFileStrict(t *testing.T) {
	dir := t.TempDir()
	k, k2 := canonicalKey(t, 1), canonicalKey(t, 2)
	for name, content := range map[string]string{
		"empty file":       "",
		"whitespace":       " \n",
		"null":             "null",
		"array":            fmt.Sprintf("[%q, 5]", k),
		"number":           "5",
		"not json":         "k=5",
		"truncated":        fmt.Sprintf("{%q:5", k),
		"trailing object":  fmt.Sprintf("{%q:5}{}", k),
		"trailing garbage": fmt.Sprintf("{%q:5}x", k),
		"duplicate key":    fmt.Sprintf("{%q:5,%q:6}", k, k),
		"token string":     fmt.Sprintf("{%q:\"5\"}", k),
		"token fraction":   fmt.Sprintf("{%q:5.0}", k),
		"token exponent":   fmt.Sprintf("{%q:5e0}", k),
		"token negative":   fmt.Sprintf("{%q:-5}", k),
		"token zero":       fmt.Sprintf("{%q:0}", k),
		"token 2^53":       fmt.Sprintf("{%q:9007199254740992}", k),
		"token 2^64":       fmt.Sprintf("{%q:18446744073709551616}", k),
		"token null":       fmt.Sprintf("{%q:null}", k),
		"token bool":       fmt.Sprintf("{%q:true}", k),
		"token object":     fmt.Sprintf("{%q:{\"fencing_token\":5}}", k),
		"token array":      fmt.Sprintf("{%q:[5]}", k),
		"prefix-only key":  fmt.Sprintf("{%q:5}", prefixOnly),
		"raw key":          `{"target-1":5}`,
		"one bad among ok": fmt.Sprintf("{%q:5,%q:5}", k2, k+"x"),
		"nested marks":     fmt.Sprintf("{\"marks\":{%q:5}}", k),
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := rabbitmq.ReadMarksFile(path)
		var me *rabbitmq.MarksError
		if !errors.As(err, &me) || !errors.Is(err, rabbitmq.ErrMalformedMarks) || me.Path != path || got != nil {
			t.Errorf("%s: %q read as %v, %v; want a *MarksError", name, content, got, err)
		}
	}
	// The largest token and surrounding whitespace are fine (control).
	path := filepath.Join(dir, "control")
	os.WriteFile(path, []byte(fmt.Sprintf(" {\n %q : 9007199254740991 ,\n %q:1 }\n", k, k2)), 0o600)
	if got, err := rabbitmq.ReadMarksFile(path); err != nil || !maps.Equal(got, map[string]uint64{k: lease.MaxFencingToken, k2: 1}) {
		t.Fatalf("control: %v, %v", got, err)
	}
	// A missing file is an I/O error, not a malformed one.
	_, err := rabbitmq.ReadMarksFile(filepath.Join(dir, "missing"))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, rabbitmq.ErrMalformedMarks) {
		t.Fatalf("missing file: %v", err)
	}
}
