package auth

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ReadSecretFile reads a file holding a secret (the pepper, an API key, a
// URL with a password) with the pepper file's checks, the one definition of
// them: path must name an existing regular file (a symbolic link to one is
// followed) that grants no permission to group or others (mode 0600 or
// 0400); a file with any of the bits 0077 set is refused. The checks are
// made on the open descriptor, so a file swapped after them is never the
// one read. One trailing "\n" or "\r\n" is removed; what remains must be at
// most max bytes.
//
// what names the file in errors ("pepper file", "API key file"); no error
// contains the file's content. A missing file's error matches
// fs.ErrNotExist.
func ReadSecretFile(path, what string, max int) ([]byte, error) {
	// A first look before opening: opening a FIFO or device could block or
	// have effects.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", what)
	}
	// O_NONBLOCK: the path may have become a FIFO since that look; the
	// descriptor's own checks below refuse it, and nothing blocks first.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("%s does not exist: %w", what, fs.ErrNotExist)
		case errors.Is(err, fs.ErrPermission):
			return nil, fmt.Errorf("%s is not readable by this process", what)
		}
		return nil, fmt.Errorf("cannot open the %s", what)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot stat the %s", what)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", what)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s permissions %#o allow access by group or others; it must be readable by its owner only (chmod 600)", what, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+3))
	if err != nil {
		return nil, fmt.Errorf("cannot read the %s", what)
	}
	switch {
	case len(b) >= 2 && b[len(b)-2] == '\r' && b[len(b)-1] == '\n':
		b = b[:len(b)-2]
	case len(b) >= 1 && b[len(b)-1] == '\n':
		b = b[:len(b)-1]
	}
	if len(b) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", what, max)
	}
	return b, nil
}
