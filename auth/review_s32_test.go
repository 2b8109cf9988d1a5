package auth

// Review s32: attacks on FileStore.Get's credential file read (9f229f9:
// readSmallFile, raw open/read/close into a sync.Pool buffer, refusing
// files of maxCredentialFile bytes or more).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// s32Replace writes rec to a temporary file and renames it over the
// credential's file, as another process's FileStore.replace does.
func s32Replace(t testing.TB, s *FileStore, id string, rec []byte) {
	t.Helper()
	tmp := filepath.Join(s.dir, fmt.Sprintf(".s32-%d", time.Now().UnixNano()))
	if err := os.WriteFile(tmp, rec, 0o600); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, id+".json")); err != nil {
		t.Error(err)
	}
}

func s32Encode(t testing.TB, c Credential) []byte {
	t.Helper()
	rec, err := EncodeCredential(c)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// s32Variants returns n valid records of c's id, all of the same length:
// even ones active, odd ones revoked, labels padded so every record has
// the length of the longest. Same-length variants are what a memo that
// kept a reference to the pooled read buffer would confuse.
func s32Variants(t testing.TB, c Credential, n int) [][]byte {
	t.Helper()
	at := c.CreatedAt.Add(time.Minute)
	var cs []Credential
	for i := range n {
		v := c
		if i%2 == 1 {
			v = revokedCopy(c, at.Add(time.Duration(i)*time.Millisecond), "")
		}
		v.Label = fmt.Sprintf("v%d", i)
		cs = append(cs, v)
	}
	longest := 0
	for _, v := range cs {
		longest = max(longest, len(s32Encode(t, v)))
	}
	var out [][]byte
	for _, v := range cs {
		v.Label += strings.Repeat("p", longest-len(s32Encode(t, v)))
		rec := s32Encode(t, v)
		if len(rec) != longest {
			t.Fatalf("variant of %d bytes, want %d", len(rec), longest)
		}
		out = append(out, rec)
	}
	return out
}

// Another process renames a new record into place, then this server's Get
// runs: it must see exactly the record renamed last, also when the old and
// new record have the same length (a memo aliasing the pooled buffer
// would then compare the new bytes with themselves and serve the old
// decode: a revoked key would keep working). Checked through the
// Authenticator too.
func TestReviewS32RenameSeenOnNextGet(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	clk := &clock{t: time.Now().UTC()}
	a := newAuth(t, s, clk.now)
	key, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	vs := s32Variants(t, c, 4)
	for i := range 200 {
		k := i % len(vs)
		s32Replace(t, s, c.ID, vs[k])
		got, err := s.Get(ctx, c.ID)
		if err != nil {
			t.Fatalf("round %d: Get: %v", i, err)
		}
		if rec := s32Encode(t, got); !bytes.Equal(rec, vs[k]) {
			t.Fatalf("round %d: Get returned another record than the one renamed into place (revoked=%v, want revoked=%v)", i, !got.RevokedAt.IsZero(), k%2 == 1)
		}
		_, err = a.Authenticate(ctx, bearer(key))
		if wantOK := k%2 == 0; (err == nil) != wantOK {
			t.Fatalf("round %d: authenticate after rename of a record with revoked=%v: %v", i, !wantOK, err)
		}
	}
	// A real revocation by another process's store.
	other, err := OpenFileStore(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	s32Replace(t, s, c.ID, vs[0])
	if _, err := a.Authenticate(ctx, bearer(key)); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Revoke(ctx, c.ID, clk.t); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, bearer(key)); !errors.Is(err, ErrInvalidCredential) {
		t.Fatalf("authenticate after another process revoked the key: %v", err)
	}
}

// Concurrent Gets of one credential while another process renames
// variants into place, and of other credentials at the same time (sharing
// the pool): every Get returns exactly one whole record — never an error,
// never a mix of two files' bytes, never another credential's — and a Get
// that starts after a rename returned sees that rename or a later one.
func TestReviewS32ConcurrentRenamesNeverMix(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	vs := s32Variants(t, c, 3)
	// Records of other lengths too, so reads of c cross growth points of
	// the pooled buffers others grew.
	big := c
	big.Label = strings.Repeat("L", MaxLabelBytes)
	vs = append(vs, s32Encode(t, big))
	var others []Credential
	var otherRecs [][]byte
	for i := range 6 {
		req := IssueRequest{Scope: mustScope(t, everything), Label: strings.Repeat("o", 20*i)}
		if i%2 == 1 {
			sc, err := ScopeOf(s32Grants(64)...)
			if err != nil {
				t.Fatal(err)
			}
			req.Scope = sc
		}
		_, o := issueT(t, s, req)
		others = append(others, o)
		otherRecs = append(otherRecs, s32Encode(t, o))
	}

	var written atomic.Int64 // the last rename that returned
	written.Store(-1)
	s32Replace(t, s, c.ID, vs[0])
	written.Store(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := int64(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s32Replace(t, s, c.ID, vs[i%int64(len(vs))])
			written.Store(i)
		}
	}()
	errs := make(chan string, 16)
	var readers sync.WaitGroup
	for g := range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for i := range 1500 {
				if g%2 == 1 {
					j := (g + i) % len(others)
					got, err := s.Get(ctx, others[j].ID)
					if err != nil || !bytes.Equal(s32Encode(t, got), otherRecs[j]) {
						errs <- fmt.Sprintf("Get of another credential: %v, or its fields changed", err)
						return
					}
					continue
				}
				v0 := written.Load()
				got, err := s.Get(ctx, c.ID)
				v1 := written.Load()
				if err != nil {
					errs <- fmt.Sprintf("Get during renames: %v", err)
					return
				}
				rec := s32Encode(t, got)
				k := slices.IndexFunc(vs, func(v []byte) bool { return bytes.Equal(v, rec) })
				if k < 0 {
					errs <- "Get during renames returned a record that was never written"
					return
				}
				if v1+1-v0 < int64(len(vs)) {
					ok := false
					for w := v0; w <= v1+1; w++ {
						ok = ok || int(w%int64(len(vs))) == k
					}
					if !ok {
						errs <- fmt.Sprintf("Get started after rename %d returned variant %d, written before it", v0, k)
						return
					}
				}
			}
		}()
	}
	readers.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// s32Grants is n target-namespace grants of 256 bytes each.
func s32Grants(n int) []string {
	gs := []string{"tenant:*", "program:*"}
	for i := range n - 2 {
		gs = append(gs, fmt.Sprintf("target-namespace:%03d%s", i, strings.Repeat("n", 253)))
	}
	return gs
}

// A credential returned by Get, and an error returned by Get, keep no
// reference to the pooled buffer: after other Gets (concurrent ones, of
// larger records) reuse and overwrite every pooled buffer, and after the
// pool's buffers are scribbled over directly, both are unchanged; and the
// memo still serves the right record.
func TestReviewS32PooledBufferNotRetained(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	_, small := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), Label: "small"})
	sc, err := ScopeOf(s32Grants(64)...)
	if err != nil {
		t.Fatal(err)
	}
	_, large := issueT(t, s, IssueRequest{Scope: sc, Label: strings.Repeat("<", MaxLabelBytes)})
	smallRec, largeRec := s32Encode(t, small), s32Encode(t, large)
	_, bad := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	junk := bytes.Repeat([]byte(`{"salt":"SECRETMARK`), 30)
	if err := os.WriteFile(filepath.Join(s.dir, bad.ID+".json"), junk, 0o600); err != nil {
		t.Fatal(err)
	}

	got, err := s.Get(ctx, small.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, badErr := s.Get(ctx, bad.ID)
	if badErr == nil {
		t.Fatal("Get of junk succeeded")
	}
	badText := badErr.Error()

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if _, err := s.Get(ctx, large.ID); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Scribble over whatever buffers the pool holds now.
	var held []*[]byte
	for range 64 {
		bp := readBufs.Get().(*[]byte)
		b := (*bp)[:cap(*bp)]
		for i := range b {
			b[i] = 0xff
		}
		held = append(held, bp)
	}
	for _, bp := range held {
		readBufs.Put(bp)
	}
	if rec := s32Encode(t, got); !bytes.Equal(rec, smallRec) {
		t.Fatal("a credential Get returned changed after later Gets reused the read buffers")
	}
	if badErr.Error() != badText || strings.Contains(badText, "SECRETMARK") {
		t.Fatalf("a Get error changed or shows the file: %q then %q", badText, badErr.Error())
	}
	for _, want := range []struct {
		id  string
		rec []byte
	}{{small.ID, smallRec}, {large.ID, largeRec}, {small.ID, smallRec}} {
		got, err := s.Get(ctx, want.id)
		if err != nil || !bytes.Equal(s32Encode(t, got), want.rec) {
			t.Fatalf("Get after the pool was scribbled over: %v, or another record", err)
		}
	}
}

// s32GrowthPoints lists the capacities a pooled buffer passes through as
// readSmallFile grows it from the pool's first buffer, up to the limit.
func s32GrowthPoints() []int {
	b := *readBufs.New().(*[]byte)
	var caps []int
	for cap(b) < 2*maxCredentialFile {
		caps = append(caps, cap(b))
		b = growReadBuf(b[:cap(b)])
	}
	return caps
}

// Files at, just below and just above every growth point of the pooled
// buffer and the limit, read by a Get (from whatever buffer the pool
// gives, grown or not) and by readSmallFile from a dirty grown buffer:
// below the limit the whole file is read, exactly as os.ReadFile reads it
// (Get: ErrCorrupt for junk, never unavailable); at and above the limit it
// is refused as unavailable (never not-found nor corrupt); and a valid
// credential still reads right after each.
func TestReviewS32SizesAroundGrowthPointsAndLimit(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	_, victim := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	path := filepath.Join(s.dir, victim.ID+".json")
	crec := s32Encode(t, c)
	var sizes []int
	for _, g := range s32GrowthPoints() {
		sizes = append(sizes, g-1, g, g+1)
	}
	sizes = append(sizes, 0, 1, maxCredentialFile-1, maxCredentialFile, maxCredentialFile+1, 3*maxCredentialFile, 1<<20)
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	dirty := bytes.Repeat([]byte{0xee}, 3*maxCredentialFile)
	for _, n := range sizes {
		content := make([]byte, n)
		for i := range content {
			content[i] = byte('A' + (i*7+n)%26)
		}
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(path)
		for _, start := range [][]byte{dirty[:0:5000], dirty[:0:maxCredentialFile], dirty[: 0 : maxCredentialFile-1], dirty[:0]} {
			got, err := readSmallFile(path, start)
			switch {
			case n < maxCredentialFile && (err != nil || !bytes.Equal(got, want)):
				t.Fatalf("%d bytes, buffer cap %d: %v, or %d bytes not the file's", n, cap(start), err, len(got))
			case n >= maxCredentialFile && !errors.Is(err, errCredentialFileTooLarge):
				t.Fatalf("%d bytes, buffer cap %d: %v, want errCredentialFileTooLarge", n, cap(start), err)
			}
		}
		for range 3 {
			_, err := s.Get(ctx, victim.ID)
			switch {
			case n < maxCredentialFile && !errors.Is(err, ErrCorrupt):
				t.Fatalf("Get of %d junk bytes: %v, want ErrCorrupt (read whole)", n, err)
			case n >= maxCredentialFile && (!errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt)):
				t.Fatalf("Get of %d bytes: %v, want ErrUnavailable only", n, err)
			}
			if got, err := s.Get(ctx, c.ID); err != nil || !bytes.Equal(s32Encode(t, got), crec) {
				t.Fatalf("Get after a read of %d bytes: %v, or another record", n, err)
			}
		}
	}
}

// The largest record Issue can write is well below the limit: no valid
// credential is refused as too large. Longest ids, 64 grants of 256 bytes,
// a label of characters JSON escapes six-fold, every capability.
func TestReviewS32LargestRecordBelowLimit(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	sc, err := ScopeOf(s32Grants(64)...)
	if err != nil {
		t.Fatal(err)
	}
	_, c := issueT(t, s, IssueRequest{
		PrincipalID: strings.Repeat("p", 256), ClientID: strings.Repeat("c", 256),
		Class: ClassAdministrator, Capabilities: Capabilities(), Scope: sc,
		Label: strings.Repeat("<", MaxLabelBytes), TTL: time.Hour,
	})
	c = revokedCopy(c, c.CreatedAt.Add(time.Second), c.ID[:len(c.ID)-1]+"Z")
	rec := s32Encode(t, c)
	if len(rec)*2 > maxCredentialFile {
		t.Fatalf("largest record is %d bytes, too near the %d-byte limit", len(rec), maxCredentialFile)
	}
	s32Replace(t, s, c.ID, rec)
	got, err := s.Get(ctx, c.ID)
	if err != nil || !bytes.Equal(s32Encode(t, got), rec) {
		t.Fatalf("Get of the largest record: %v", err)
	}
}

// s32CheckErr checks a Get error's class (want, and no other), and that
// its text shows neither the path nor any of the file's bytes, nor any of
// more.
func s32CheckErr(t *testing.T, what string, err error, s *FileStore, want error, more ...string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
	for _, other := range []error{ErrNotFound, ErrUnavailable, ErrCorrupt} {
		if other != want && errors.Is(err, other) {
			t.Fatalf("%s: %v is also %v", what, err, other)
		}
	}
	text := err.Error()
	leaks := append([]string{s.dir, ".json", "SECRETMARK", "/dev/", "no such file", "directory", "symbolic", "too large", "not a"}, more...)
	if base := filepath.Base(s.dir); len(base) >= 4 { // a short name is in any text
		leaks = append(leaks, base)
	}
	for _, leak := range leaks {
		if leak != "" && strings.Contains(text, leak) {
			t.Fatalf("%s: error text %q shows %q", what, text, leak)
		}
	}
}

// What sits at a credential's path when it is not a regular file the
// store wrote: a directory, symlinks (to the right file, dangling, a loop,
// to /dev/zero or /dev/urandom), a FIFO fed without end. Every one is
// answered promptly, ErrNotFound only where nothing exists, ErrUnavailable
// for everything unreadable or too large, without the path or file bytes
// in the error text, and with bounded memory (os.ReadFile read /dev/zero
// and the endless FIFO until memory ran out).
func TestReviewS32SpecialFilesAtACredentialPath(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	crec := s32Encode(t, c)
	path := filepath.Join(s.dir, c.ID+".json")
	elsewhere := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(elsewhere, crec, 0o600); err != nil {
		t.Fatal(err)
	}
	put := func(make func() error) {
		t.Helper()
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if err := make(); err != nil {
			t.Fatal(err)
		}
	}
	get := func(what string) error {
		t.Helper()
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		err := s32Within(t, what+": Get", func() error { _, err := s.Get(ctx, c.ID); return err })
		runtime.ReadMemStats(&ms1)
		if d := ms1.TotalAlloc - ms0.TotalAlloc; d > 4<<20 {
			t.Fatalf("%s: Get allocated %d bytes", what, d)
		}
		return err
	}

	put(func() error { return os.Symlink(elsewhere, path) })
	if got, err := s.Get(ctx, c.ID); err != nil || !bytes.Equal(s32Encode(t, got), crec) {
		t.Fatalf("symlink to the record: %v (os.ReadFile followed it too)", err)
	}
	put(func() error { return os.Mkdir(path, 0o700) })
	s32CheckErr(t, "directory", get("directory"), s, ErrUnavailable)
	put(func() error { return os.Symlink(filepath.Join(s.dir, "nothing"), path) })
	s32CheckErr(t, "dangling symlink", get("dangling symlink"), s, ErrNotFound)
	put(func() error { return os.Symlink(path, path) })
	s32CheckErr(t, "symlink loop", get("symlink loop"), s, ErrUnavailable)
	for _, dev := range []string{"/dev/zero", "/dev/urandom"} {
		if _, err := os.Stat(dev); err != nil {
			continue
		}
		put(func() error { return os.Symlink(dev, path) })
		s32CheckErr(t, dev, get(dev), s, ErrUnavailable)
	}
	put(func() error { return os.WriteFile(path, bytes.Repeat([]byte("SECRETMARK"), 7000), 0o600) })
	s32CheckErr(t, "too large", get("too large"), s, ErrUnavailable)
	put(func() error { return os.WriteFile(path, []byte("SECRETMARK"), 0o600) })
	s32CheckErr(t, "junk", get("junk"), s, ErrCorrupt)

	// A FIFO with a writer that never stops.
	put(func() error { return syscall.Mkfifo(path, 0o600) })
	w, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		chunk := bytes.Repeat([]byte("SECRETMARK"), 400)
		for {
			select {
			case <-stop:
				return
			default:
			}
			w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			w.Write(chunk)
		}
	}()
	s32CheckErr(t, "endless FIFO", get("endless FIFO"), s, ErrUnavailable)
	close(stop)
	<-fed
	w.Close()

	// The directory itself replaced by a file: unavailable.
	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s32CheckErr(t, "store dir is a file", get("store dir is a file"), s, ErrUnavailable)
}

// A credential path that is a FIFO whose writer stays silent (opened by
// a process that never writes). os.ReadFile parked each Get in the poller
// until the writer went; the first readSmallFile blocked in read(2),
// holding an OS thread per stuck request, so a flood of them would have
// grown the thread count up to the runtime's limit, which kills the
// server. Now a FIFO is not a regular file: every Get is refused at once
// as unavailable (never not-found), and none holds a thread.
func TestReviewS32SilentFIFODoesNotPinThreads(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	path := filepath.Join(s.dir, c.ID+".json")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// The silent writer (O_RDWR: opening does not wait for a reader).
	wfd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if wfd >= 0 {
			syscall.Close(wfd)
		}
	}()
	threads := func() int {
		es, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatalf("counting threads: %v", err)
		}
		return len(es)
	}
	before := threads()
	const stuck = 64
	var wg sync.WaitGroup
	results := make(chan error, stuck)
	for range stuck {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Get(ctx, c.ID)
			results <- err
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a hang detector, not a timing
		t.Fatalf("Gets of a FIFO with a silent writer still wait (%d OS threads, %d before)", threads(), before)
	}
	close(results)
	for err := range results {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Get of a FIFO: %v, want ErrUnavailable", err)
		}
	}
	if during := threads(); during-before > stuck/2 {
		t.Errorf("%d Gets of a FIFO left %d more OS threads (%d before, %d after)", stuck, during-before, before, during)
	}
	// A FIFO with no writer at all: os.ReadFile waited in open for one.
	if err := syscall.Close(wfd); err != nil {
		t.Fatal(err)
	}
	wfd = -1
	err = s32Within(t, "Get of a FIFO with no writer", func() error { _, err := s.Get(ctx, c.ID); return err })
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get of a FIFO with no writer: %v, want ErrUnavailable", err)
	}
}

// A file that grows while it is read — appended to by another process
// past the limit, then cut back — gives only the exact credential, or
// ErrCorrupt, or ErrUnavailable: never another record, never not-found,
// and once past the limit it is refused.
func TestReviewS32FileGrowingWhileRead(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
	crec := s32Encode(t, c)
	path := filepath.Join(s.dir, c.ID+".json")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		chunk := bytes.Repeat([]byte(" "), 3000)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for off := int64(len(crec)); off < 2*maxCredentialFile; off += int64(len(chunk)) {
				if _, err := f.WriteAt(chunk, off); err != nil {
					t.Error(err)
					return
				}
			}
			if err := f.Truncate(int64(len(crec))); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	counts := map[string]int{}
	for range 2000 {
		got, err := s.Get(ctx, c.ID)
		switch {
		case err == nil:
			if !bytes.Equal(s32Encode(t, got), crec) {
				t.Fatal("a growing file decoded to another record")
			}
			counts["ok"]++
		case errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotFound):
			counts["corrupt"]++
		case errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNotFound):
			counts["unavailable"]++
		default:
			t.Fatalf("Get of a growing file: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("outcomes: %v", counts)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, maxCredentialFile))
	f.Close()
	if _, err := s.Get(ctx, c.ID); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get of a record grown past the limit: %v", err)
	}
}

// s32FDs counts this process's open descriptors.
func s32FDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting descriptors: %v", err)
	}
	return len(es)
}

// Every path through Get — found, missing, corrupt, too large, a
// directory, a symlink loop, /dev/zero, a closed store — leaves no
// descriptor open.
func TestReviewS32NoDescriptorLeaks(t *testing.T) {
	ctx := context.Background()
	s := openFileStore(t)
	ids := map[string]func(p string) error{}
	add := func(name string, mk func(p string) error) {
		_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything)})
		ids[c.ID] = mk
	}
	add("found", func(string) error { return nil })
	add("missing", os.Remove)
	add("corrupt", func(p string) error { return os.WriteFile(p, []byte("{}"), 0o600) })
	add("too large", func(p string) error { return os.WriteFile(p, make([]byte, 3*maxCredentialFile), 0o600) })
	add("directory", func(p string) error { os.Remove(p); return os.Mkdir(p, 0o700) })
	add("loop", func(p string) error { os.Remove(p); return os.Symlink(p, p) })
	add("zero", func(p string) error { os.Remove(p); return os.Symlink("/dev/zero", p) })
	for id, mk := range ids {
		if err := mk(filepath.Join(s.dir, id+".json")); err != nil {
			t.Fatal(err)
		}
	}
	run := func() {
		for id := range ids {
			s.Get(ctx, id)
		}
		s.Get(ctx, "not-an-id")
	}
	run() // warm up anything opened once
	before := s32FDs(t)
	for range 100 {
		run()
	}
	if after := s32FDs(t); after != before {
		t.Fatalf("%d descriptors open before 100 rounds of Gets, %d after", before, after)
	}
	s.Close()
	for range 10 {
		run()
	}
	if after := s32FDs(t); after != before {
		t.Fatalf("%d descriptors open before Gets on a closed store, %d after", before, after)
	}
}

// Signals delivered while readSmallFile reads. (EINTR itself cannot be
// forced: Go installs every handler with SA_RESTART, so open and read
// restart in the kernel; readSmallFile retries EINTR anyway.) Under a
// flood of signals, files of every size around the buffer's growth points
// read back exactly.
func TestReviewS32SignalsDuringRead(t *testing.T) {
	dir := t.TempDir()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-sigs:
			default:
				syscall.Kill(syscall.Getpid(), syscall.SIGUSR1)
				time.Sleep(100 * time.Microsecond)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	for i, n := range []int{100, 511, 512, 2048, 2049, 11200, maxCredentialFile - 1} {
		p := filepath.Join(dir, fmt.Sprint("f", i))
		want := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		if err := os.WriteFile(p, want, 0o600); err != nil {
			t.Fatal(err)
		}
		for range 200 {
			b, err := readSmallFile(p, make([]byte, 0, 100))
			if err != nil || !bytes.Equal(b, want) {
				t.Fatalf("read under signals: %v, %d bytes of %d", err, len(b), n)
			}
		}
	}
}

// s32Within runs f, failing the test if it has not returned in 10 s (a
// hang detector, not a timing).
func s32Within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: did not return within 10 s", what)
		panic("unreachable")
	}
}
