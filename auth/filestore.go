package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/starintel/starlease/internal/syncdir"
)

// FileStore keeps each credential in its own file, DIR/<id>.json, holding
// exactly the bytes of EncodeCredential. Files are written to a temporary
// name, fsynced and then linked (create) or renamed (update) into place, so
// a reader never sees a partial record and several processes — a running
// server and the keys command — can use one directory without a lock: a
// server re-reads the file on every request (no cache), so a key created,
// revoked or rotated by another process takes effect on the next request.
type FileStore struct {
	dir     string
	mu      sync.Mutex // serializes writers within this process
	closed  atomic.Bool
	decodes Decodes
}

var _ Store = (*FileStore)(nil)

// OpenFileStore opens (creating 0700 if needed) the credential directory.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: cannot create the credential directory", ErrUnavailable)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: the credential directory is not a directory", ErrUnavailable)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("%w: cannot restrict the credential directory", ErrUnavailable)
		}
	}
	return &FileStore{dir: dir}, nil
}

func (s *FileStore) path(id string) (string, error) {
	if s.closed.Load() {
		return "", fmt.Errorf("%w: store is closed", ErrUnavailable)
	}
	if !ValidCredentialID(id) {
		return "", ErrNotFound
	}
	return filepath.Join(s.dir, id+".json"), nil
}

// lock serializes writers across processes (an flock on DIR/.lock) and
// within this one, so Revoke and Rotate are atomic read-modify-writes.
func (s *FileStore) lock() (func(), error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: cannot lock the credential directory", ErrUnavailable)
	}
	return func() { f.Close(); s.mu.Unlock() }, nil // closing releases the flock
}

// Create implements Store.
func (s *FileStore) Create(ctx context.Context, c Credential) error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return s.create(c)
}

func (s *FileStore) create(c Credential) error {
	rec, err := EncodeCredential(c)
	if err != nil {
		return err
	}
	final, err := s.path(c.ID)
	if err != nil {
		return err
	}
	tmp, err := s.writeTemp(rec)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return ErrExists
		}
		return fmt.Errorf("%w: cannot store the credential", ErrUnavailable)
	}
	return s.syncDir()
}

// Get implements Store.
func (s *FileStore) Get(ctx context.Context, id string) (Credential, error) {
	p, err := s.path(id)
	if err != nil {
		return Credential{}, err
	}
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	b, err := readSmallFile(p, (*bp)[:0])
	*bp = b[:0] // a grown buffer is kept for the next read
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Credential{}, ErrNotFound
		}
		return Credential{}, fmt.Errorf("%w: cannot read the credential", ErrUnavailable)
	}
	return s.decodes.Decode(id, b) // Decode keeps no reference to b
}

// maxCredentialFile bounds what Get reads: EncodeCredential writes a few
// hundred bytes, so a larger file is not a credential and is refused
// rather than read whole on every request.
const maxCredentialFile = 64 << 10

var (
	errCredentialFileTooLarge = errors.New("credential file too large")
	errNotRegular             = errors.New("credential path is not a regular file")
)

// readBufs holds the buffers Get reads credential files into, one per
// concurrent request, so a read allocates nothing.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// readSmallFile appends the regular file at p to buf with open, fstat,
// read and close alone. os.ReadFile also sets the descriptor non-blocking
// and tries to register it with the poller (which a regular file refuses):
// about half of its cost, paid on every authenticated request, since the
// store keeps no cache. Anything but a regular file is refused
// (errNotRegular) before a read: a FIFO opened non-blocking does not wait
// for a writer, and a device or a FIFO could otherwise hold a request,
// and the thread its blocking read runs on, for as long as it likes.
func readSmallFile(p string, buf []byte) ([]byte, error) {
	var fd int
	var err error
	for {
		fd, err = syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return buf, &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return buf, &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return buf, errNotRegular
	}
	for {
		if len(buf) == cap(buf) {
			buf = growReadBuf(buf)
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == syscall.EINTR:
		case err != nil:
			return buf, &os.PathError{Op: "read", Path: p, Err: err}
		case n == 0:
			return buf, nil
		default:
			buf = buf[:len(buf)+n]
			if len(buf) >= maxCredentialFile {
				return buf, errCredentialFileTooLarge
			}
		}
	}
}

// growReadBuf makes room in a full read buffer: it doubles it, from at
// least 512 bytes.
func growReadBuf(buf []byte) []byte { return slices.Grow(buf, max(cap(buf), 512)) }

// List implements Store.
func (s *FileStore) List(ctx context.Context, after string, limit int) ([]Credential, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("%w: store is closed", ErrUnavailable)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot list credentials", ErrUnavailable)
	}
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && e.Type().IsRegular() && ValidCredentialID(id) && id > after {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := []Credential{}
	for _, id := range ids[:min(len(ids), clampLimit(limit))] {
		c, err := s.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Revoke implements Store.
func (s *FileStore) Revoke(ctx context.Context, id string, at time.Time) (Credential, error) {
	unlock, err := s.lock()
	if err != nil {
		return Credential{}, err
	}
	defer unlock()
	cur, err := s.Get(ctx, id)
	if err != nil || !cur.RevokedAt.IsZero() {
		return cur, err
	}
	c := revokedCopy(cur, at, "")
	return c, s.replace(c)
}

// Rotate implements Store. Under the writer lock the new credential is
// created first, then the old one revoked: a crash in between leaves both
// usable (rotate again), never neither.
func (s *FileStore) Rotate(ctx context.Context, oldID string, at time.Time, next Credential) (Credential, error) {
	unlock, err := s.lock()
	if err != nil {
		return Credential{}, err
	}
	defer unlock()
	cur, err := s.Get(ctx, oldID)
	if err != nil {
		return Credential{}, err
	}
	if !cur.RevokedAt.IsZero() {
		return Credential{}, ErrRevoked
	}
	if next.ID == oldID {
		return Credential{}, ErrExists
	}
	if err := s.create(next); err != nil {
		return Credential{}, err
	}
	old := revokedCopy(cur, at, next.ID)
	return old, s.replace(old)
}

// replace atomically overwrites an existing credential's file.
func (s *FileStore) replace(c Credential) error {
	rec, err := EncodeCredential(c)
	if err != nil {
		return err
	}
	final, err := s.path(c.ID)
	if err != nil {
		return err
	}
	tmp, err := s.writeTemp(rec)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%w: cannot update the credential", ErrUnavailable)
	}
	return s.syncDir()
}

func (s *FileStore) writeTemp(rec []byte) (string, error) {
	f, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return "", fmt.Errorf("%w: cannot write the credential", ErrUnavailable)
	}
	_, werr := f.Write(rec)
	serr := f.Sync()
	cerr := f.Close()
	if werr != nil || serr != nil || cerr != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("%w: cannot write the credential", ErrUnavailable)
	}
	return f.Name(), nil
}

func (s *FileStore) syncDir() error {
	if err := syncdir.Sync(s.dir); err != nil {
		return fmt.Errorf("%w: cannot sync the credential directory", ErrUnavailable)
	}
	return nil
}

// Close implements Store; later calls fail with ErrUnavailable.
func (s *FileStore) Close() error {
	s.closed.Store(true)
	return nil
}
