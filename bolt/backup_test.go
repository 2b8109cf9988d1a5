package bolt

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
)

func TestBackupRestoreStaysClosed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "a.db"), Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Acquire(ctx, acquireReq("req-1", time.Minute, time.Now().Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	m, err := s.Backup(ctx, &buf)
	if err != nil || m.Counts["counters"] != 1 || m.Backend != "bolt" {
		t.Fatalf("backup: %v %+v", err, m)
	}

	// A flipped payload byte is refused and nothing is restored.
	bad := bytes.Clone(buf.Bytes())
	bad[len(bad)-100] ^= 1
	target := filepath.Join(dir, "b.db")
	ns := NewNamespace(target, Options{})
	if _, err := ns.Restore(ctx, bytes.NewReader(bad)); !errors.Is(err, backupfile.ErrChecksum) {
		t.Fatalf("corrupt restore: %v", err)
	}
	for _, p := range []string{target, target + ".restoring"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left behind: %v", p, err)
		}
	}

	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	// The namespace is closed: every mutation is refused and changes
	// nothing; reads answer; Health says why.
	closed, err := Open(target, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("open restored: %v", err)
	}
	if _, err := closed.Acquire(ctx, acquireReq("req-2", time.Minute, time.Now().Add(time.Minute))); code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire in a restored namespace: %v", err)
	}
	if _, err := closed.Acquire(ctx, acquireReq("req-1", time.Minute, time.Now().Add(time.Minute))); code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("replay in a restored namespace: %v", err)
	}
	if h := closed.Health(ctx); h.Status != lease.HealthDegraded {
		t.Fatalf("health of a restored namespace: %+v", h)
	}
	ins, err := closed.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: time.Now().Add(time.Minute)})
	if err != nil || ins.Lease == nil {
		t.Fatalf("inspect in a restored namespace: %+v %v", ins, err)
	}
	closed.Close()
	// Never restore over an existing namespace.
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); !errors.Is(err, ErrRestoreTarget) {
		t.Fatalf("restore over existing: %v", err)
	}
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); !errors.Is(err, backupfile.ErrRestoreTarget) {
		t.Fatalf("restore over existing, as any backend's refusal: %v", err)
	}
	if _, err := NewNamespace(filepath.Join(dir, "a.db"), Options{}).Restore(ctx, bytes.NewReader(buf.Bytes())); !errors.Is(err, ErrRestoreTarget) {
		t.Fatalf("restore over live store: %v", err)
	}
	r, err := ns.OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx)
	if err != nil || len(st.Active) != 1 || st.Marker.BackupSHA256 != m.PayloadSHA256 {
		t.Fatalf("state: %v %+v", err, st)
	}
	r.Close()
}

// A malformed counter floor fails acquisitions closed instead of reading
// as no floor.
func TestMalformedCounterFloorFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s, err := Open(path, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyCounterFloor, []byte{1, 2, 3}) }); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Acquire(context.Background(), acquireReq("req-1", time.Minute, time.Now().Add(time.Minute))); code(err) != lease.CodeCorrupt {
		t.Fatalf("acquire with a malformed floor: %v", err)
	}
}

// A backup of a store file of a schema this build does not know is
// refused for what it is, and nothing is restored (the error said
// "cannot close the restored snapshot").
func TestRestoreRefusesAnUnknownSchema(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.db")
	s, err := Open(src, Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte(futureSchema(t))) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	target := filepath.Join(dir, "restored.db")
	_, err = NewNamespace(target, Options{}).Restore(context.Background(), bytes.NewReader(rhBackup(t, src, time.Now())))
	if !errors.Is(err, errSchema) || !strings.Contains(err.Error(), "unsupported schema version") || strings.Contains(err.Error(), "close") {
		t.Fatalf("restore of a backup of a future schema: %v", err)
	}
	for _, p := range []string{target, target + ".restoring"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s exists after a refused restore: %v", p, err)
		}
	}
}
