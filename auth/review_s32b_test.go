package auth

// Review s32b: further attacks on FileStore.Get's credential file read
// (9f229f9 and 196dcff: readSmallFile opens O_RDONLY|O_CLOEXEC|O_NONBLOCK|
// O_NOCTTY, fstats, refuses anything but a regular file and reads into a
// pooled buffer), beyond review s32's (auth/review_s32_test.go).
//
// Linux only. A missing precondition fails the test; nothing is skipped.
// (The review also served credential files from a FUSE file system of its
// own, to see open flags and EAGAIN, ENOENT, short reads and stalls from
// read: those attacks held, and are not kept, since they need a mount.)
//
// Every Get error is also checked through the Authenticator: it returns
// exactly ErrUnavailable or exactly ErrInvalidCredential (never the
// store's error), which httpapi (server.go, wrap) answers with the fixed
// 503 lease_backend_unavailable body or the fixed 401 invalid_credential
// body; so no text of a Get error reaches a client. Get's error texts are
// checked anyway (s32bCheckGetErr), since List, Revoke and Rotate return
// them to the keys command.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// s32bOldGet is FileStore.Get before 9f229f9 (os.ReadFile), with its own
// Decodes: what the same situation gave before these commits.
func s32bOldGet(s *FileStore, id string) (Credential, error) {
	p, err := s.path(id)
	if err != nil {
		return Credential{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Credential{}, ErrNotFound
		}
		return Credential{}, fmt.Errorf("%w: cannot read the credential", ErrUnavailable)
	}
	var d Decodes
	return d.Decode(id, b)
}

type s32bResult struct {
	c   Credential
	err error
}

func s32bGet(t *testing.T, s *FileStore, id, what string) (Credential, error) {
	t.Helper()
	r := s32Within(t, what, func() s32bResult { c, err := s.Get(context.Background(), id); return s32bResult{c, err} })
	return r.c, r.err
}

// s32bCheckGetErr checks that err is exactly of class want (and of no
// other class), and that its text shows neither the store's path, the id,
// the errno, nor any record bytes.
func s32bCheckGetErr(t *testing.T, what string, err error, s *FileStore, id string, want error, recs ...[]byte) {
	t.Helper()
	leaks := []string{id, "permission", "denied", "no such", "device", "temporarily", "would block", "socket", "regular"}
	for _, rec := range recs {
		var r record
		if err := json.Unmarshal(rec, &r); err == nil {
			leaks = append(leaks, r.Salt, r.Verifier, r.AuthorityMAC, r.PrincipalID)
		}
	}
	s32CheckErr(t, what, err, s, want, leaks...)
}

// s32bCheckAuth authenticates key and checks the result is exactly want
// (the bare sentinel, so httpapi answers its fixed body) with the audit
// reason wantReason, and no principal.
func s32bCheckAuth(t *testing.T, a *Authenticator, key, what string, want error, wantReason Reason) {
	t.Helper()
	type res struct {
		p   Principal
		f   Failure
		err error
	}
	r := s32Within(t, what, func() res {
		p, f, err := a.AuthenticateDetail(context.Background(), bearer(key))
		return res{p, f, err}
	})
	if r.err != want || r.f.Reason != wantReason || r.p.ID != "" || r.p.CredentialID != "" {
		t.Fatalf("%s: Authenticate gave %v (reason %q, principal %q), want exactly %v (reason %q)",
			what, r.err, r.f.Reason, r.p.ID, want, wantReason)
	}
	if id, _, err := ParseKey(key); err != nil || r.f.CredentialID != id {
		t.Fatalf("%s: the failure names credential %q", what, r.f.CredentialID)
	}
}

// 1. O_NONBLOCK is observable on a regular file: when another open file
// description holds a write lease (fcntl F_SETLEASE, F_WRLCK: what Samba
// and NFS servers take), open(2) with O_NONBLOCK fails at once with
// EWOULDBLOCK, where a blocking open waits until the holder gives the
// lease up (or /proc/sys/fs/lease-break-time, 45 s by default, passes).
// Get fails closed at once: ErrUnavailable (503), never not-found nor a
// credential; the key works again once the lease is gone. Before 9f229f9
// (os.ReadFile, a blocking open) Get waited, holding an OS thread in
// open(2) as the FIFO did in read(2): shown by s32bOldGet below.
func TestReviewS32bWriteLeaseFailsClosedAtOnce(t *testing.T) {
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	rec := s32Encode(t, c)
	path := filepath.Join(s.dir, c.ID+".json")
	if got, err := s.Get(context.Background(), c.ID); err != nil || !bytes.Equal(s32Encode(t, got), rec) {
		t.Fatalf("Get before the lease: %v", err) // the memo now holds the record
	}

	lfd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(lfd)
	if _, err := fcntl(lfd, syscall.F_SETLEASE, syscall.F_WRLCK); err != nil {
		t.Fatalf("cannot take a write lease on the credential file: %v", err)
	}
	leased := true
	unlease := func() {
		if leased {
			if _, err := fcntl(lfd, syscall.F_SETLEASE, syscall.F_UNLCK); err != nil {
				t.Errorf("releasing the lease: %v", err)
			}
			leased = false
		}
	}
	defer unlease()

	// The raw read: EWOULDBLOCK from open, not from read.
	r := s32Within(t, "readSmallFile of a leased file", func() s32bResult {
		_, err := readSmallFile(path, nil)
		return s32bResult{err: err}
	})
	var pe *os.PathError
	if !errors.As(r.err, &pe) || pe.Op != "open" || !errors.Is(r.err, syscall.EWOULDBLOCK) {
		t.Fatalf("readSmallFile of a leased file: %v, want open: EWOULDBLOCK", r.err)
	}
	for i := range 3 {
		_, err := s32bGet(t, s, c.ID, "Get of a leased file")
		s32bCheckGetErr(t, fmt.Sprintf("Get %d of a leased file", i), err, s, c.ID, ErrUnavailable, rec)
	}
	s32bCheckAuth(t, a, key, "Authenticate while leased", ErrUnavailable, ReasonUnavailable)

	// Before 9f229f9: the blocking open waits for the lease holder.
	old := make(chan error, 1)
	go func() { _, err := s32bOldGet(s, c.ID); old <- err }()
	select {
	case err := <-old:
		t.Fatalf("the old Get (os.ReadFile) of a leased file returned (%v): expected it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlease()
	if err := s32Within(t, "old Get after the lease went", func() error { return <-old }); err != nil {
		t.Fatalf("old Get after the lease went: %v", err)
	}
	if got, err := s32bGet(t, s, c.ID, "Get after the lease"); err != nil || !bytes.Equal(s32Encode(t, got), rec) {
		t.Fatalf("Get after the lease went: %v", err)
	}
	if _, err := newAuth(t, s, nil).Authenticate(context.Background(), bearer(key)); err != nil {
		t.Fatalf("Authenticate after the lease went: %v", err)
	}
}

func fcntl(fd int, cmd, arg int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), uintptr(arg))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// 2. The Fstat-then-Read window. The descriptor is fixed, so the type
// fstat saw is the type read reads: another process renaming, at the
// credential path, the record, a FIFO with a silent writer and a FIFO
// with no writer in turn (hard links of three fixed inodes) never makes a
// Get block, read a FIFO, or answer anything but the exact record or
// ErrUnavailable — never not-found (the path always exists) nor corrupt
// (an empty read of the writerless FIFO would decode as corrupt).
func TestReviewS32bFIFOAndRecordSwappedAtThePath(t *testing.T) {
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	rec := s32Encode(t, c)
	path := filepath.Join(s.dir, c.ID+".json")
	reg, fifoW, fifoN := filepath.Join(s.dir, ".s32b-reg"), filepath.Join(s.dir, ".s32b-fifo-w"), filepath.Join(s.dir, ".s32b-fifo-n")
	if err := os.Link(path, reg); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{fifoW, fifoN} {
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	wfd, err := syscall.Open(fifoW, syscall.O_RDWR|syscall.O_CLOEXEC, 0) // the silent writer
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(wfd)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		srcs := []string{reg, fifoW, reg, fifoN}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tmp := filepath.Join(s.dir, fmt.Sprintf(".s32b-tmp-%d", i))
			if err := os.Link(srcs[i%len(srcs)], tmp); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Error(err)
				return
			}
			os.Remove(tmp) // left if path already was this inode
		}
	}()
	var ok, unavailable atomic.Int64
	errs := make(chan string, 4)
	var readers sync.WaitGroup
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for range 3000 {
				got, err := s.Get(context.Background(), c.ID)
				switch {
				case err == nil && bytes.Equal(s32Encode(t, got), rec):
					ok.Add(1)
				case err != nil && errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrCorrupt):
					unavailable.Add(1)
				default:
					errs <- fmt.Sprintf("Get while the path swaps between a record and FIFOs: %v", err)
					return
				}
			}
		}()
	}
	s32Within(t, "Gets while the path swaps", func() bool { readers.Wait(); return true })
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	t.Logf("record %d, unavailable %d", ok.Load(), unavailable.Load())
	if ok.Load() == 0 || unavailable.Load() == 0 {
		t.Fatalf("the race was not exercised: record %d, unavailable %d", ok.Load(), unavailable.Load())
	}
	// And each FIFO alone, deterministically.
	for _, f := range []string{fifoW, fifoN} {
		tmp := filepath.Join(s.dir, ".s32b-one")
		os.Remove(tmp)
		if err := os.Link(f, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		_, err := s32bGet(t, s, c.ID, "Get of "+filepath.Base(f))
		s32bCheckGetErr(t, "Get of "+filepath.Base(f), err, s, c.ID, ErrUnavailable, rec)
	}
}

// 3. A truncated record never decodes: every strict prefix of a valid
// record (a short read followed by EOF, a write cut short), and the
// record with anything before or after it, is ErrCorrupt through Get
// (the memo holding the whole record, so a prefix is compared against
// it first) and 401 invalid_credential (reason corrupt_record) through
// the Authenticator with the right key. The whole record still reads.
func TestReviewS32bTruncatedRecordNeverAccepted(t *testing.T) {
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), TTL: time.Hour, Label: "trunc"})
	rec := s32Encode(t, c)
	var bad [][]byte
	for n := range len(rec) {
		bad = append(bad, rec[:n])
	}
	bad = append(bad, append(slicesClone(rec), '\n'), append(slicesClone(rec), ' '), append([]byte(" "), rec...),
		append(slicesClone(rec), rec...), append(slicesClone(rec), 0), append(slicesClone(rec), '}'))
	for i, b := range bad {
		s32Replace(t, s, c.ID, rec)
		if got, err := s.Get(context.Background(), c.ID); err != nil || !bytes.Equal(s32Encode(t, got), rec) {
			t.Fatalf("Get of the whole record: %v", err)
		}
		s32Replace(t, s, c.ID, b)
		_, err := s.Get(context.Background(), c.ID)
		s32bCheckGetErr(t, fmt.Sprintf("Get of damaged record %d (%d of %d bytes)", i, len(b), len(rec)), err, s, c.ID, ErrCorrupt, rec)
		if i%64 == 0 || i >= len(rec) {
			s32bCheckAuth(t, a, key, fmt.Sprintf("Authenticate with damaged record %d", i), ErrInvalidCredential, ReasonCorrupt)
		}
		if _, err := s32bOldGet(s, c.ID); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("old Get of damaged record %d: %v, want ErrCorrupt as now", i, err)
		}
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// 4. A credential's file replaced by a symlink to, a hard link to, or a
// copy of another credential's file in the same directory: Get of the
// first id is ErrCorrupt (DecodeStored's id check), never the other
// credential, with both ids' decodes in the memo; the first key is 401
// (corrupt_record), the second still authenticates. The same as before
// 9f229f9 (os.ReadFile followed symlinks too; the decoder is unchanged).
func TestReviewS32bPathToAnotherCredential(t *testing.T) {
	s := openFileStore(t)
	a := newAuth(t, s, nil)
	keyA, ca := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), PrincipalID: "prn_a"})
	keyB, cb := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), PrincipalID: "prn_b", Class: ClassAdministrator,
		Capabilities: []Capability{CapForceRelease, CapLease}})
	recA, recB := s32Encode(t, ca), s32Encode(t, cb)
	pathA, pathB := filepath.Join(s.dir, ca.ID+".json"), filepath.Join(s.dir, cb.ID+".json")
	saved := filepath.Join(t.TempDir(), "a.json")
	if err := os.WriteFile(saved, recA, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, how := range []struct {
		name string
		do   func() error
	}{
		{"relative symlink", func() error { return os.Symlink(filepath.Base(pathB), pathA) }},
		{"absolute symlink", func() error { return os.Symlink(pathB, pathA) }},
		{"symlink chain", func() error {
			mid := filepath.Join(s.dir, ".s32b-mid")
			os.Remove(mid)
			if err := os.Symlink(pathB, mid); err != nil {
				return err
			}
			return os.Symlink(mid, pathA)
		}},
		{"hard link", func() error { return os.Link(pathB, pathA) }},
		{"copy", func() error { return os.WriteFile(pathA, recB, 0o600) }},
	} {
		// Both decodes in the memo first.
		for _, c := range []Credential{ca, cb} {
			if _, err := s.Get(context.Background(), c.ID); err != nil {
				t.Fatalf("%s: Get before: %v", how.name, err)
			}
		}
		if err := os.Remove(pathA); err != nil {
			t.Fatal(err)
		}
		if err := how.do(); err != nil {
			t.Fatalf("%s: %v", how.name, err)
		}
		got, err := s.Get(context.Background(), ca.ID)
		if err == nil || got.PrincipalID == cb.PrincipalID {
			t.Fatalf("%s: Get of %s through another credential's file gave principal %q, class %q (err %v)",
				how.name, ca.ID, got.PrincipalID, got.Class, err)
		}
		s32bCheckGetErr(t, how.name, err, s, ca.ID, ErrCorrupt, recA, recB)
		if _, err := s32bOldGet(s, ca.ID); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: old Get: %v, want ErrCorrupt as now", how.name, err)
		}
		s32bCheckAuth(t, a, keyA, how.name+": A's key", ErrInvalidCredential, ReasonCorrupt)
		if p, err := a.Authenticate(context.Background(), bearer(keyB)); err != nil || p.ID != "prn_b" || p.CredentialID != cb.ID {
			t.Fatalf("%s: B's key: %v, %q", how.name, err, p.ID)
		}
		if got, err := s.Get(context.Background(), cb.ID); err != nil || !bytes.Equal(s32Encode(t, got), recB) {
			t.Fatalf("%s: Get of B: %v", how.name, err)
		}
		// Put A back.
		if err := os.Remove(pathA); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(saved, pathA); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Authenticate(context.Background(), bearer(keyA)); err != nil {
			t.Fatalf("%s: A's key after A is back: %v", how.name, err)
		}
		if err := os.Remove(pathA); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pathA, recA, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// 5. A socket at a credential path (and a symlink to one): open(2) fails
// with ENXIO, before any fstat or read, also with a listener accepting;
// Get answers ErrUnavailable at once, as before 9f229f9.
func TestReviewS32bSocketAtCredentialPath(t *testing.T) {
	base, err := os.MkdirTemp("", "s32b") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	s, err := OpenFileStore(filepath.Join(base, "c"))
	if err != nil {
		t.Fatal(err)
	}
	a := newAuth(t, s, nil)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	rec := s32Encode(t, c)
	path := filepath.Join(s.dir, c.ID+".json")
	other := filepath.Join(base, "sock")
	for _, sock := range []string{path, other} {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatalf("cannot bind a socket at %s: %v", sock, err)
		}
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Write([]byte("SECRETMARK"))
				conn.Close()
			}
		}()
		if sock == other {
			if err := os.Symlink(other, path); err != nil {
				t.Fatal(err)
			}
		}
		fi, err := os.Lstat(sock)
		if err != nil || fi.Mode().Type() != fs.ModeSocket {
			t.Fatalf("no socket at %s: %v", sock, err)
		}
		r := s32Within(t, "readSmallFile of a socket", func() s32bResult { _, err := readSmallFile(path, nil); return s32bResult{err: err} })
		var pe *os.PathError
		if !errors.As(r.err, &pe) || pe.Op != "open" || !errors.Is(r.err, syscall.ENXIO) {
			t.Fatalf("readSmallFile of a socket: %v, want open: ENXIO", r.err)
		}
		_, err = s32bGet(t, s, c.ID, "Get of a socket")
		s32bCheckGetErr(t, "Get of a socket", err, s, c.ID, ErrUnavailable, rec)
		if _, err := s32bOldGet(s, c.ID); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) {
			t.Fatalf("old Get of a socket: %v, want ErrUnavailable as now", err)
		}
		s32bCheckAuth(t, a, key, "Authenticate with a socket at the path", ErrUnavailable, ReasonUnavailable)
		l.Close()
		os.Remove(sock)
		os.Remove(path)
	}
}

// 6. A credential directory without search permission, and a credential
// file without read permission, for the server's user: Get of an existing
// id and of a missing one are both ErrUnavailable (503), never not-found
// (an unknown key) and never a credential; search permission alone
// suffices. The test runs as root, so it drops to uid 65534 for file
// access on one locked thread (setfsuid clears CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH on that thread) and checks the drop took effect.
func TestReviewS32bNoSearchPermission(t *testing.T) {
	// Root bypasses permissions: as root, the test drops them on one
	// thread; as anyone else, the owner's own permissions apply.
	root := os.Getuid() == 0
	base, err := os.MkdirTemp("", "s32b-perm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(base, "c"), 0o700); os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := OpenFileStore(filepath.Join(base, "c"))
	if err != nil {
		t.Fatal(err)
	}
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	rec := s32Encode(t, c)
	path := filepath.Join(s.dir, c.ID+".json")
	missing := "01ARZ3NDEKTSV4RRFFQ69G5FAV"
	if root {
		const nobody = 65534
		for _, p := range []string{s.dir, path} {
			if err := os.Chown(p, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
		// This goroutine keeps its thread to the end: it exits with it.
		runtime.LockOSThread()
		setfsuid := func(uid int) { syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(uid), 0, 0) }
		setfsuid(nobody)
		defer setfsuid(0)
		if cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); cur != nobody {
			t.Fatalf("fsuid is %d, want %d", cur, nobody)
		}
	}
	chmod := func(p string, m uint32) {
		t.Helper()
		if err := syscall.Chmod(p, m); err != nil { // the owner (nobody) may
			t.Fatal(err)
		}
	}
	get := func(id string) (Credential, error) { return s.Get(context.Background(), id) }

	// Control: the owner reads, with search permission alone too.
	for _, m := range []uint32{0o700, 0o300, 0o100} {
		chmod(s.dir, m)
		if got, err := get(c.ID); err != nil || !bytes.Equal(s32Encode(t, got), rec) {
			t.Fatalf("dir %o: Get as the owner: %v", m, err)
		}
		if _, err := get(missing); !errors.Is(err, ErrNotFound) {
			t.Fatalf("dir %o: Get of a missing id: %v, want ErrNotFound", m, err)
		}
	}
	// No search permission.
	for _, m := range []uint32{0o600, 0o400, 0o000} {
		chmod(s.dir, m)
		if _, err := readSmallFile(path, nil); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("dir %o: readSmallFile: %v, want EACCES (as root: did the privilege drop take effect?)", m, err)
		}
		for _, id := range []string{c.ID, missing} {
			_, err := get(id)
			s32bCheckGetErr(t, fmt.Sprintf("dir %o, id %s", m, id), err, s, id, ErrUnavailable, rec)
			if _, err := s32bOldGet(s, id); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) {
				t.Fatalf("dir %o: old Get: %v, want ErrUnavailable as now", m, err)
			}
		}
	}
	// A file without read permission.
	chmod(s.dir, 0o700)
	for _, m := range []uint32{0o000, 0o200, 0o100} {
		chmod(path, m)
		if _, err := readSmallFile(path, nil); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("file %o: readSmallFile: %v, want EACCES", m, err)
		}
		_, err := get(c.ID)
		s32bCheckGetErr(t, fmt.Sprintf("file %o", m), err, s, c.ID, ErrUnavailable, rec)
	}
	chmod(path, 0o600)
	if got, err := get(c.ID); err != nil || !bytes.Equal(s32Encode(t, got), rec) {
		t.Fatalf("Get after permissions are back: %v", err)
	}
}
