package bolt

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

func s35a2Open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatalf("open %s: %v", filepath.Base(path), err)
	}
	return s
}

func s35a2Meta(t *testing.T, path string) (redoLog []byte, applied uint64) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bbolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		redoLog = m.Get(keyRedoLog)
		if v := m.Get(keyRedoApplied); len(v) == 8 {
			applied = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return redoLog, applied
}

// FINDING. A cleanly closed file needs no log (a copy of the file alone
// is whole). Moved away alone, written and closed cleanly under another
// name, then moved back, it sits beside its old log: every record there
// is one the tree applied long ago. Open refuses it with lease_corrupt
// ("the log ends at k before the tree's m"): a whole, cleanly closed
// file no longer opens at its own name. The same happens with a hard
// link written through and closed cleanly.
func TestS35A2CleanFileBackBesideItsStaleLog(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"move", "hardlink"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			path, other := filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")
			s := s35a2Open(t, path)
			first := engineAcquire(t, s, "stale1", 3)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if how == "move" {
				if err := os.Rename(path, other); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Link(path, other); err != nil {
				t.Fatal(err)
			}
			s = s35a2Open(t, other)
			second := engineAcquire(t, s, "stale2", 3)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if mark, applied := s35a2Meta(t, other); mark != nil {
				t.Fatalf("after a clean close the tree still names a log (applied %d)", applied)
			}
			if how == "move" {
				if err := os.Rename(other, path); err != nil {
					t.Fatal(err)
				}
			}
			s, err := Open(path, Options{ReapInterval: -1})
			if err != nil {
				t.Fatalf("open of a whole, cleanly closed file beside its old (fully applied) log: %v", err)
			}
			defer s.Close()
			s35eCheckAcked(t, s, append(first, second...), how)
			_ = ctx
		})
	}
}

// s35a2TearNewestMeta makes the newest bbolt meta page fail its
// checksum, as a crash while it was written leaves it.
func s35a2TearNewestMeta(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 128)
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	ps := int64(binary.LittleEndian.Uint32(head[24:]))
	txid := func(off int64) uint64 {
		b := make([]byte, 8)
		if _, err := f.ReadAt(b, off+64); err != nil {
			t.Fatal(err)
		}
		return binary.LittleEndian.Uint64(b)
	}
	newest := int64(0)
	if txid(ps) > txid(0) {
		newest = ps
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, newest+72); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, newest+72); err != nil {
		t.Fatal(err)
	}
}

// Close's two clean commits: the newest meta page torn (crash while the
// second was written), bbolt falls back one commit -- still clean. The
// file then opens alone (moved away from its log) with every write.
func TestS35A2CleanCloseTornMetaStillClean(t *testing.T) {
	dir := t.TempDir()
	path, moved := filepath.Join(dir, "a.db"), filepath.Join(dir, "moved.db")
	s := s35a2Open(t, path)
	leases := engineAcquire(t, s, "torn", 4)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s35a2TearNewestMeta(t, path)
	if mark, _ := s35a2Meta(t, path); mark != nil {
		t.Fatal("one commit back from a clean close names the log")
	}
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	s, err := Open(moved, Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("open of the cleanly closed file alone: %v", err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, leases, "torn-meta")
}

// A crash after Open marked the tree (redo_log) but before any append:
// the file reopens by its own name; by another name (moved alone) it is
// refused, and that refusal changes nothing -- it still opens by its own
// name afterwards with every earlier write.
func TestS35A2CrashAfterMarkBeforeFirstAppend(t *testing.T) {
	dir := t.TempDir()
	path, moved := filepath.Join(dir, "a.db"), filepath.Join(dir, "moved.db")
	s := s35a2Open(t, path)
	leases := engineAcquire(t, s, "mark", 3)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = s35a2Open(t, path)
	crash(t, s)
	if mark, _ := s35a2Meta(t, path); mark == nil {
		t.Fatal("an open store's tree does not name its log")
	}
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(moved, Options{ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("unclean file alone: %v, want lease_corrupt", err)
	}
	if err := os.Rename(moved, path); err != nil {
		t.Fatal(err)
	}
	s = s35a2Open(t, path)
	defer s.Close()
	s35eCheckAcked(t, s, leases, "mark")
}

// A crash while the log's id file was being made (id.tmp left, no id):
// a tree that never named a log opens and takes the new id; writes after
// it survive a crash.
func TestS35A2CrashDuringIDFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.db")
	s := s35a2Open(t, path)
	leases := engineAcquire(t, s, "idf", 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	logDir := RedoLogDir(path)
	if err := os.Remove(filepath.Join(logDir, "id")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(logDir, "id.tmp"), []byte{1, 2, 3}, 0o600); err != nil {
		t.Fatal(err)
	}
	s = s35a2Open(t, path)
	more := engineAcquire(t, s, "idf2", 2)
	crash(t, s)
	s = s35a2Open(t, path)
	defer s.Close()
	s35eCheckAcked(t, s, append(leases, more...), "idfile")
}

// An unclean file whose log dir lost its id (replaced by another log
// dir, e.g. the whole log removed and a fresh one made) is refused, not
// opened without the acknowledged writes only the old log held.
func TestS35A2UncleanFileWithFreshLogRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.db")
	s := s35a2Open(t, path)
	engineAcquire(t, s, "fresh", 3)
	crash(t, s)
	if err := os.RemoveAll(RedoLogDir(path)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("unclean file without its log: %v, want lease_corrupt", err)
	}
	// And a second try (the first made a fresh log dir with an id) too.
	if _, err := Open(path, Options{ReapInterval: -1}); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("second open of the unclean file without its log: %v, want lease_corrupt", err)
	}
}

// Symlink: a dirty file opened through a symlink finds its log; the
// symlink replaced by one to another directory's name of the same file
// (directory symlink) does too.
func TestS35A2SymlinkedDirectory(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	s := s35a2Open(t, filepath.Join(link, "a.db"))
	leases := engineAcquire(t, s, "dirlink", 3)
	crash(t, s)
	s = s35a2Open(t, filepath.Join(real, "a.db"))
	more := engineAcquire(t, s, "dirlink2", 2)
	crash(t, s)
	s = s35a2Open(t, filepath.Join(link, "a.db"))
	defer s.Close()
	s35eCheckAcked(t, s, append(leases, more...), "dirlink")
}
