package auth

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Found by review (low): ReadSecretFile's first look (os.Stat, "opening a FIFO
// could block") and its os.Open are two lookups of the path: a path that
// names a regular file at the Stat and a FIFO at the Open (a symlink
// swapped in between, by anyone who can write the directory holding the
// link) blocks the open with no writer, forever: the CLI hangs past its
// --timeout, the server never starts. Opening with O_NONBLOCK (and then
// checking the descriptor, as the function already does) removes the race.
func TestReview16SecretFileStatOpenRace(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "reg")
	if err := os.WriteFile(reg, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	link := filepath.Join(dir, "key")
	if err := os.Symlink(reg, link); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		tmp := filepath.Join(dir, "tmp")
		for i := 0; !stop.Load(); i++ {
			target := reg
			if i%2 == 1 {
				target = fifo
			}
			os.Remove(tmp)
			if os.Symlink(target, tmp) == nil {
				os.Rename(tmp, link)
			}
		}
	}()
	defer func() { stop.Store(true); <-swapped }()

	deadline := time.Now().Add(10 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		done := make(chan error, 1)
		go func() { _, err := ReadSecretFile(link, "API key file", 1024); done <- err }()
		select {
		case <-done:
			continue
		case <-time.After(2 * time.Second):
		}
		// Blocked in open(2) on the FIFO: unblock it by opening the
		// FIFO's other end, then report.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		<-done
		t.Fatalf("ReadSecretFile blocked for 2 s on a FIFO swapped in after its Stat (attempt %d)", n+1)
	}
	t.Log("the race was not hit in 10 s")
}
