package testenv

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// Tmpfs mounts a tmpfs of size bytes on a new directory of t and unmounts
// it in t.Cleanup: a real file system that fills up, for disk-full tests
// (ENOSPC from write, short writes), with nothing simulated. Mounting
// needs CAP_SYS_ADMIN (root on these machines). Where it is not permitted
// the test is skipped with the reason, loudly — except under CI (CI set
// and not "false"), where it fails: CI must run disk-full tests, not pass
// without them.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	opts := fmt.Sprintf("size=%d,mode=0700", size)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		msg := fmt.Sprintf("testenv: cannot mount a %d-byte tmpfs for a disk-full test (%v; needs CAP_SYS_ADMIN, e.g. root)", size, err)
		if ci := os.Getenv("CI"); ci != "" && ci != "false" {
			t.Fatalf("%s; CI=%q must run it", msg, ci)
		}
		t.Skipf("SKIPPED, NOT PASSED: %s", msg)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			// A process of the test still holds a file there: detach, so
			// the mount goes once it lets go.
			if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
				t.Errorf("testenv: unmount tmpfs %s: %v", dir, err)
			}
		}
	})
	return dir
}

// FillDisk writes zeros to path until the file system is full (ENOSPC)
// and returns how many bytes it wrote. Remove path to free the space.
func FillDisk(t testing.TB, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var total int64
	for {
		n, err := f.Write(buf)
		total += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("testenv: filling %s: %v", path, err)
			}
			break
		}
	}
	// Whatever a page-sized write could not take, a byte at a time can.
	for {
		if _, err := f.Write([]byte{0}); err != nil {
			break
		}
		total++
	}
	return total
}
