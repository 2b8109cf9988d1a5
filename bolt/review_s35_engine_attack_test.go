package bolt

// Review attack on the engine (s35): redo log + deferred flush.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/internal/redolog"
	"github.com/starintel/starlease/lease"
)

// s35eSegments lists the redo segment files of the store at path, oldest
// first.
func s35eSegments(t *testing.T, path string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(RedoLogDir(path), "*.redo"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

// s35eCycle releases l and acquires its identity again (request id id):
// the next token of the identity.
func s35eCycle(t *testing.T, s *Store, l engineLease, id string) engineLease {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Release(ctx, releaseOfLease(l, "rel-"+id)); err != nil {
		t.Fatal(err)
	}
	req := l.req
	req.RequestID = id
	res, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lease.FencingToken <= l.res.Lease.FencingToken {
		t.Fatalf("token %d after %d", res.Lease.FencingToken, l.res.Lease.FencingToken)
	}
	return engineLease{req, res}
}

// s35eCheckAcked: every acknowledged lease in want is there with its
// token, and a new acquire of each identity (after a release) gets a
// token above every acknowledged one.
func s35eCheckAcked(t *testing.T, s *Store, want []engineLease, what string) {
	t.Helper()
	s35eCheckPresent(t, s, want, what)
	s35eCheckTokens(t, s, want, what)
}

func s35eCheckPresent(t *testing.T, s *Store, want []engineLease, what string) {
	t.Helper()
	ctx := context.Background()
	for i, l := range want {
		got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: s35Far})
		if err != nil {
			t.Errorf("%s: acknowledged lease %d (%s token %d) lost: %v", what, i, l.req.Identity.TargetID, l.res.Lease.FencingToken, err)
			continue
		}
		if got.Lease.FencingToken != l.res.Lease.FencingToken {
			t.Errorf("%s: lease %d token %d, acknowledged %d", what, i, got.Lease.FencingToken, l.res.Lease.FencingToken)
		}
	}
}

func s35eCheckTokens(t *testing.T, s *Store, want []engineLease, what string) {
	t.Helper()
	ctx := context.Background()
	for i, l := range want {
		if _, err := s.Release(ctx, releaseOfLease(l, fmt.Sprintf("s35e-check-rel-%s-%d", what, i))); err != nil && lease.CodeOf(err) != lease.CodeNotFound {
			t.Logf("%s: release %d: %v", what, i, err)
		}
		req := l.req
		req.RequestID = fmt.Sprintf("s35e-check-acq-%s-%d", what, i)
		res, err := s.Acquire(ctx, req)
		if err != nil {
			t.Errorf("%s: re-acquire %d: %v", what, i, err)
			continue
		}
		if res.Lease.FencingToken <= l.res.Lease.FencingToken {
			t.Errorf("%s: FENCING TOKEN REUSED/LOWERED for %s: new %d, acknowledged earlier %d",
				what, l.req.Identity.TargetID, res.Lease.FencingToken, l.res.Lease.FencingToken)
		}
	}
}

// ---------------------------------------------------------------------------
// Finding candidate: a crash during log segment rotation leaves the new
// segment file created but empty (O_CREATE done; fallocate and the salt
// not yet). Open takes that empty last segment as the one to append to,
// with no salt and at offset 0 (over where the salt belongs). The
// records appended there are acknowledged; at the next Open the first 8
// bytes of the first record are read as the salt, nothing checks, the
// segment reads as a torn tail and every record in it is dropped
// silently (and, the log then holding no record, it starts afresh).
func TestS35EngineEmptyRotatedSegmentKeepsLaterWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{ReapInterval: -1, FlushInterval: time.Hour}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	first := engineAcquire(t, s, "rot-a", 5)
	next := s.group.engine.log.Next()
	crash(t, s)
	// The crash hit newSegment right after its O_CREATE.
	empty := filepath.Join(RedoLogDir(path), fmt.Sprintf("%016x.redo", next))
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	s, err = Open(path, o)
	if err != nil {
		// Refusing the log is acceptable (nothing acknowledged is lost yet).
		t.Logf("open with the empty rotated segment: %v", err)
		return
	}
	s35eCheckPresent(t, s, first, "rotcrash")
	// Acknowledged after the reopen: cycle the first identity twice.
	l := s35eCycle(t, s, first[0], "rot-b-1")
	l = s35eCycle(t, s, l, "rot-b-2")
	second := append(engineAcquire(t, s, "rot-b", 5), l)
	crash(t, s)
	for _, f := range s35eSegments(t, path) {
		st, _ := os.Stat(f)
		t.Logf("segment %s: %d bytes", filepath.Base(f), st.Size())
	}

	s, err = Open(path, o)
	if err != nil {
		t.Fatalf("second reopen: %v", err)
	}
	defer s.Close()
	s35eCheckAcked(t, s, second, "crash2")
}

// ---------------------------------------------------------------------------
// Finding candidate: one damaged byte in the last segment's salt makes
// every record of that segment fail its checksum; Open reads this as a
// torn tail (no later record checks either, as all use the salt) and
// drops every acknowledged record of the segment silently, though the
// package promises that only damage confined to the last record reads as
// a torn write.
func TestS35EngineDamagedSaltFailsOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{ReapInterval: -1, FlushInterval: time.Hour}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "salt", 20)
	leases[0] = s35eCycle(t, s, leases[0], "salt-again")
	crash(t, s)
	segs := s35eSegments(t, path)
	f, err := os.OpenFile(segs[len(segs)-1], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 3); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10 // one bit
	if _, err := f.WriteAt(b, 3); err != nil {
		t.Fatal(err)
	}
	f.Close()

	s, err = Open(path, o)
	if err != nil {
		if lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("open: %v, want corrupt", err)
		}
		return // failing closed is the right answer
	}
	defer s.Close()
	t.Error("Open accepted a log whose last segment's salt is damaged")
	s35eCheckAcked(t, s, leases, "saltdamage")
}

// ---------------------------------------------------------------------------
// Truncation of the log dir's last segment at a record boundary, and
// removal of the whole log: documented as undetectable by the log; this
// only records what happens (it does not fail). A log truncated inside an
// older record fails Open (covered in redolog). Kept as documentation.
func TestS35EngineWholeLogRemovedIsSilent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{ReapInterval: -1, FlushInterval: time.Hour}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	leases := engineAcquire(t, s, "gone", 3)
	crash(t, s)
	if err := os.RemoveAll(RedoLogDir(path)); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, o)
	if err != nil {
		t.Logf("open without the log: %v (fails closed)", err)
		return
	}
	defer s.Close()
	lost := 0
	for _, l := range leases {
		if _, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: s35Far}); err != nil {
			lost++
		}
	}
	t.Logf("log removed by hand: Open succeeded, %d of %d acknowledged leases gone (documented limit)", lost, len(leases))
}

// ---------------------------------------------------------------------------
// Reads under frequent flushes and file growth (remaps) never mix two
// points in time: each batch moves a marker key (delete the old, put the
// new) and sets two keys to the same number; every reader view sees
// exactly one marker equal to both keys, never going back. Large values
// grow the file so flushes remap it while many readers hold transactions;
// Backup and Health run alongside. A watchdog turns a deadlock into a
// failure.
func TestS35EngineReadersNeverMixFlushes(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1, FlushInterval: time.Millisecond})
	e := s.group.engine
	const writes = 1500
	big := bytes.Repeat([]byte("v"), 48<<10)
	key := func(p string, n int) []byte { return []byte(fmt.Sprintf("s35e/%s/%08d", p, n)) }
	write := func(n int) error {
		return s.group.update(func(tx *layered.View) error {
			m := tx.Bucket(bucketMeta)
			if n > 0 {
				if err := m.Delete(key("mark", n-1)); err != nil {
					return err
				}
			}
			if err := m.Put(key("mark", n), nil); err != nil {
				return err
			}
			v := binary.BigEndian.AppendUint64(nil, uint64(n))
			if err := m.Put([]byte("s35e/a"), v); err != nil {
				return err
			}
			if err := m.Put([]byte("s35e/b"), v); err != nil {
				return err
			}
			// Grow: a big value per write, the one of 50 writes ago deleted.
			if err := m.Put(key("big", n), big); err != nil {
				return err
			}
			if n >= 50 {
				return m.Delete(key("big", n-50))
			}
			return nil
		})
	}
	if err := write(0); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
		stop.Store(true)
	}
	var reads atomic.Int64
	for r := 0; r < 12; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			last := -1
			for !stop.Load() {
				v, release, err := e.reader()
				if err != nil {
					fail(err)
					return
				}
				m := v.Bucket(bucketMeta)
				// Copies: bbolt's bytes are valid only until release.
				a, b := bytes.Clone(m.Get([]byte("s35e/a"))), bytes.Clone(m.Get([]byte("s35e/b")))
				var marks []string
				c := m.Cursor()
				for k, _ := c.Seek([]byte("s35e/mark/")); k != nil && bytes.HasPrefix(k, []byte("s35e/mark/")); k, _ = c.Next() {
					marks = append(marks, string(k))
				}
				bigs := 0
				c = m.Cursor()
				for k, _ := c.Seek([]byte("s35e/big/")); k != nil && bytes.HasPrefix(k, []byte("s35e/big/")); k, _ = c.Next() {
					bigs++
				}
				if r%3 == 0 {
					time.Sleep(time.Duration(rand.Intn(300)) * time.Microsecond) // hold the tx across flushes
				}
				release()
				reads.Add(1)
				if len(a) != 8 || !bytes.Equal(a, b) || len(marks) != 1 {
					fail(fmt.Errorf("reader %d: MIXED VIEW a=%x b=%x marks=%v", r, a, b, marks))
					return
				}
				n := int(binary.BigEndian.Uint64(a))
				if marks[0] != string(key("mark", n)) {
					fail(fmt.Errorf("reader %d: MIXED VIEW mark %s with a=%d", r, marks[0], n))
					return
				}
				if want := min(n+1, 50); bigs != want {
					fail(fmt.Errorf("reader %d: MIXED VIEW %d big values at %d, want %d", r, bigs, n, want))
					return
				}
				if n < last {
					fail(fmt.Errorf("reader %d: went back from %d to %d", r, last, n))
					return
				}
				last = n
			}
		}(r)
	}
	wg.Add(1)
	go func() { // Backup and Health alongside
		defer wg.Done()
		for !stop.Load() {
			if _, err := s.Backup(context.Background(), io.Discard); err != nil {
				fail(fmt.Errorf("backup: %v", err))
				return
			}
			if h := s.Health(context.Background()); h.Status != lease.HealthOK {
				fail(fmt.Errorf("health: %+v", h))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 1; n <= writes && !stop.Load(); n++ {
			if err := write(n); err != nil {
				fail(fmt.Errorf("write %d: %v", n, err))
				return
			}
		}
		stop.Store(true)
	}()
	select {
	case <-done:
	case <-time.After(120 * time.Second):
		t.Fatal("DEADLOCK: writes did not finish in 120s")
	}
	wgDone := make(chan struct{})
	go func() { wg.Wait(); close(wgDone) }()
	select {
	case <-wgDone:
	case <-time.After(60 * time.Second):
		t.Fatal("DEADLOCK: readers/backup did not finish")
	}
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	st, _ := os.Stat(s.db.Path())
	t.Logf("%d reads; file %d MiB", reads.Load(), st.Size()>>20)
}

// ---------------------------------------------------------------------------
// Public API under deferred flushes: one writer cycles one identity
// (release, acquire) while readers Inspect it by identity and List it;
// the token each reader sees never goes back.
func TestS35EngineInspectTokensMonotoneUnderFlushes(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1, FlushInterval: 2 * time.Millisecond})
	ctx := context.Background()
	l := engineAcquire(t, s, "mono", 1)[0]
	identity := l.req.Identity
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for r := 0; r < 6; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			var last uint64
			for !stop.Load() {
				res, err := s.Inspect(ctx, lease.InspectRequest{Identity: identity, DeadlineAt: s35Far})
				if err != nil {
					if lease.CodeOf(err) == lease.CodeNotFound {
						continue
					}
					errc <- err
					return
				}
				if tok := res.Lease.FencingToken; tok < last {
					errc <- fmt.Errorf("reader %d: token went back %d -> %d", r, last, tok)
					return
				} else {
					last = tok
				}
			}
		}(r)
	}
	for i := 0; i < 400; i++ {
		l = s35eCycle(t, s, l, fmt.Sprint("mono-", i))
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// ---------------------------------------------------------------------------
// kill -9 with deferred flushes: a child cycles identities (release,
// acquire: the token goes up by one each time) and prints each
// acknowledged token; it is killed at varying points (between appends
// and flushes, during flushes). Rounds alternate with a child that only
// opens the store (redo at Open) and is killed a few milliseconds in.
// After each, every acknowledged lease is there and a new acquire of
// each identity gets a token above every acknowledged one.

const s35eChildEnv = "STARLEASE_S35E_CRASH_CHILD"

func TestS35EngineCrashChild(t *testing.T) {
	path := os.Getenv(s35eChildEnv)
	if path == "" {
		t.Skip("child of TestS35EngineKill9")
	}
	mode := os.Getenv(s35eChildEnv + "_MODE")
	interval := DefaultFlushInterval
	if mode == "hour" {
		interval = time.Hour
	}
	s, err := Open(path, Options{ReapInterval: -1, FlushInterval: interval})
	if err != nil {
		fmt.Println("OPENERR", err)
		os.Exit(3)
	}
	fmt.Println("OPEN")
	if mode == "open" {
		time.Sleep(time.Hour)
	}
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
		mu.Unlock()
	}
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			target := fmt.Sprintf("s35e-g%d", g)
			round := os.Getenv(s35eChildEnv + "_ROUND")
			for k := 0; ; k++ {
				req := acquireReq(fmt.Sprintf("acq-%s-r%s-%d", target, round, k), time.Hour, far)
				req.Identity.TargetID = target
				req.Metadata = lease.Metadata{"pad": strings.Repeat("p", 100+k%900)}
				res, err := s.Acquire(ctx, req)
				if err != nil {
					if lease.CodeOf(err) == lease.CodeConflict {
						// Left active by an earlier round: release it by inspecting.
						cur, ierr := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far})
						if ierr == nil && cur.Lease != nil {
							_, _ = s.Release(ctx, lease.ReleaseRequest{Identity: req.Identity, LeaseID: cur.Lease.LeaseID,
								FencingToken: cur.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
								Mutation: lease.Mutation{RequestID: fmt.Sprintf("relx-%s-r%s-%d", target, round, k), DeadlineAt: far, Caller: req.Caller}})
						}
						continue
					}
					say("ERR %s %v", target, err)
					continue
				}
				say("ACK %s %s %d", target, res.Lease.LeaseID, res.Lease.FencingToken)
				rel := lease.ReleaseRequest{Identity: req.Identity, LeaseID: res.Lease.LeaseID,
					FencingToken: res.Lease.FencingToken, ServiceInstanceID: req.ServiceInstanceID,
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("rel-%s-r%s-%d", target, round, k), DeadlineAt: far, Caller: req.Caller}}
				if _, err := s.Release(ctx, rel); err == nil {
					say("REL %s %s", target, res.Lease.LeaseID)
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestS35EngineKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	path := filepath.Join(t.TempDir(), "starlease.db")
	maxTok := map[string]uint64{}
	acked := map[string]string{}     // lease id → target
	ackedBy := map[string][]string{} // target → its lease ids, in order
	released := map[string]bool{}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	rounds := 8
	if v, err := strconv.Atoi(os.Getenv("S35E_ROUNDS")); err == nil {
		rounds = v
	}
	for round := 0; round < rounds; round++ {
		mode := "default"
		if round%2 == 1 {
			mode = "hour" // everything stays in the log: the next open redoes it all
		}
		child := s35eExec(t, path, round, mode)
		sc := bufio.NewScanner(child.out)
		n, killAt := 0, 200+rng.Intn(1500)
		killed := false
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 4 && f[0] == "ACK":
				tok, _ := strconv.ParseUint(f[3], 10, 64)
				if tok <= maxTok[f[1]] {
					t.Errorf("round %d: %s acknowledged token %d after %d", round, f[1], tok, maxTok[f[1]])
				}
				maxTok[f[1]] = tok
				acked[f[2]] = f[1]
				ackedBy[f[1]] = append(ackedBy[f[1]], f[2])
				n++
			case len(f) == 3 && f[0] == "REL":
				released[f[2]] = true
			case len(f) > 0 && (f[0] == "OPENERR" || f[0] == "ERR"):
				t.Errorf("round %d child: %s", round, sc.Text())
			}
			if n >= killAt && !killed {
				killed = true
				child.kill()
			}
		}
		_ = child.cmd.Wait()
		if !killed {
			t.Fatalf("round %d: child exited before the kill (%d acks)", round, n)
		}
		if mode == "hour" {
			// Kill a child during its Open (the redo) a few times.
			for k := 0; k < 3; k++ {
				c := s35eExec(t, path, round, "open")
				time.Sleep(time.Duration(5+rng.Intn(60)) * time.Millisecond)
				c.kill()
				_ = c.cmd.Wait()
			}
		}
		s, err := Open(path, Options{ReapInterval: -1, FlushInterval: DefaultFlushInterval})
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		ctx := context.Background()
		checked := 0
		for id, target := range acked {
			// History keeps 64 ended leases per identity: check the last 40.
			if ids := ackedBy[target]; !slices.Contains(ids[max(0, len(ids)-40):], id) {
				continue
			}
			checked++
			res, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: id, DeadlineAt: s35Far})
			if err != nil {
				t.Fatalf("round %d: acknowledged lease %s of %s LOST: %v", round, id, target, err)
			}
			if released[id] && res.Lease.State != lease.StateReleased {
				t.Fatalf("round %d: acknowledged release of %s lost: %s", round, id, res.Lease.State)
			}
		}
		// Tokens: an active lease holds at least the last acknowledged
		// token; a new acquire gets a greater one.
		far := time.Now().Add(time.Hour)
		for target, tok := range maxTok {
			req := acquireReq(fmt.Sprintf("check-%s-%d", target, round), time.Hour, far)
			req.Identity.TargetID = target
			cur, ierr := s.Inspect(ctx, lease.InspectRequest{Identity: req.Identity, DeadlineAt: s35Far})
			if ierr == nil && cur.Lease != nil && cur.Lease.State == lease.StateActive {
				if cur.Lease.FencingToken < tok {
					t.Fatalf("round %d: %s active token %d below acknowledged %d", round, target, cur.Lease.FencingToken, tok)
				}
				l := engineLease{req, lease.Result{Lease: cur.Lease}}
				if _, err := s.Release(ctx, releaseOfLease(l, fmt.Sprintf("check-rel-%s-%d", target, round))); err != nil {
					t.Fatalf("round %d: release %s: %v", round, target, err)
				}
			}
			res, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatalf("round %d: acquire %s: %v", round, target, err)
			}
			if res.Lease.FencingToken <= tok {
				t.Fatalf("round %d: FENCING TOKEN REUSED for %s: %d after acknowledged %d", round, target, res.Lease.FencingToken, tok)
			}
			maxTok[target] = res.Lease.FencingToken
			l := engineLease{req, res}
			if _, err := s.Release(ctx, releaseOfLease(l, fmt.Sprintf("check-rel2-%s-%d", target, round))); err != nil {
				t.Fatalf("round %d: release %s: %v", round, target, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d (%s): killed after %d acks; %d leases checked", round, mode, n, checked)
	}
}

// s35eExec starts the crash child in the given mode.
func s35eExec(t *testing.T, path string, round int, mode string) crashChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestS35EngineCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), s35eChildEnv+"="+path, fmt.Sprintf("%s_ROUND=%d", s35eChildEnv, round), s35eChildEnv+"_MODE="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return crashChild{cmd: cmd, out: out}
}

// ---------------------------------------------------------------------------
// Finding candidate: the redo log is found by the path the store is
// opened by (path + ".redo"), the engine id by the file. The same file
// opened by two names (a symlink, a hard link, a moved data dir with a
// compatibility link) has two logs with the same engine id: writes
// acknowledged through one name and not flushed are missed when the
// store is opened by the other (lost silently), and are later redone
// over the newer state when it is opened by the first name again, as
// long as that log reaches past the tree's redo mark: a fencing token
// goes back.
func TestS35EngineLogFollowsTheFileNotThePath(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real.db")
	link := filepath.Join(dir, "link.db")
	o := Options{ReapInterval: -1, FlushInterval: time.Hour}
	s, err := Open(real, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	// Through the link: many acknowledged writes, then a crash.
	s, err = Open(link, o)
	if err != nil {
		t.Fatal(err)
	}
	l := engineAcquire(t, s, "alias", 1)[0]
	for i := 0; i < 6; i++ {
		l = s35eCycle(t, s, l, fmt.Sprint("alias-a-", i))
	}
	viaLink := l // token 7, acknowledged, only in link.db.redo
	crash(t, s)

	// Through the real name: the acknowledged lease must be there.
	s, err = Open(real, o)
	if err != nil {
		t.Logf("open by the other name refuses: %v", err)
		return
	}
	got, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: viaLink.res.Lease.LeaseID, DeadlineAt: s35Far})
	if err != nil {
		t.Errorf("ACKNOWLEDGED WRITE LOST: lease token %d acknowledged through %s is not there through %s: %v",
			viaLink.res.Lease.FencingToken, filepath.Base(link), filepath.Base(real), err)
	} else {
		// One log for both names: nothing was lost, so nothing stale
		// can be redone later either.
		t.Logf("present: %s token %d", got.Lease.State, got.Lease.FencingToken)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	// A new lease on the identity (token 1 here if the link's writes are
	// missing), closed cleanly: flushed, redo mark 2-ish.
	req := viaLink.req
	req.RequestID = "alias-b-0"
	res, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("acquire through %s: %v", real, err)
	}
	b := engineLease{req, res}
	b = s35eCycle(t, s, b, "alias-b-1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if b.res.Lease.FencingToken <= viaLink.res.Lease.FencingToken {
		t.Errorf("FENCING TOKEN REUSED: %d through %s after %d acknowledged through %s",
			b.res.Lease.FencingToken, filepath.Base(real), viaLink.res.Lease.FencingToken, filepath.Base(link))
	}

	// Through the link again: its old log is redone over the newer tree?
	s, err = Open(link, o)
	if err != nil {
		t.Logf("open by the link again refuses: %v", err)
		return
	}
	defer s.Close()
	cur, err := s.Inspect(context.Background(), lease.InspectRequest{Identity: b.req.Identity, DeadlineAt: s35Far})
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	t.Logf("after reopening by the link: %s token %d (lease %s; last written through %s: %s token %d)",
		cur.Lease.State, cur.Lease.FencingToken, cur.Lease.LeaseID, filepath.Base(real), b.res.Lease.LeaseID, b.res.Lease.FencingToken)
	if cur.Lease.LeaseID != b.res.Lease.LeaseID {
		t.Errorf("STALE REDO: the old log of %s was redone over writes made through %s: active lease %s token %d, want %s token %d",
			filepath.Base(link), filepath.Base(real), cur.Lease.LeaseID, cur.Lease.FencingToken, b.res.Lease.LeaseID, b.res.Lease.FencingToken)
	}
}

// ---------------------------------------------------------------------------
// Writes racing Close: every write acknowledged (before, during or after
// Close began) is there after reopen; none is acknowledged and lost.
func TestS35EngineWritesRacingCloseSurvive(t *testing.T) {
	for round := 0; round < 5; round++ {
		path := filepath.Join(t.TempDir(), "starlease.db")
		s, err := Open(path, Options{ReapInterval: -1, FlushInterval: DefaultFlushInterval})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var acked []engineLease
		var wg sync.WaitGroup
		far := time.Now().Add(time.Hour)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for k := 0; k < 200; k++ {
					req := acquireReq(fmt.Sprintf("close-%d-%d-%d", round, g, k), time.Hour, far)
					req.Identity.TargetID = fmt.Sprintf("close-%d-%d", g, k)
					res, err := s.Acquire(context.Background(), req)
					if err != nil {
						if lease.CodeOf(err) == lease.CodeOutcomeUnknown {
							t.Logf("outcome unknown during close: %v", err)
						}
						return
					}
					mu.Lock()
					acked = append(acked, engineLease{req, res})
					mu.Unlock()
				}
			}(g)
		}
		time.Sleep(time.Duration(20+round*15) * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		s, err = Open(path, Options{ReapInterval: -1, FlushInterval: DefaultFlushInterval})
		if err != nil {
			t.Fatal(err)
		}
		s35eCheckPresent(t, s, acked, fmt.Sprint("close", round))
		t.Logf("round %d: %d acknowledged, all present", round, len(acked))
		s.Close()
	}
}

// ---------------------------------------------------------------------------
// TestReviewS35ReadTimeNotAfterUnseenWrite in the deferred mode (the
// read's snapshot is the engine's published one, its time taken under
// tmu; the tree transaction begun after).
func TestS35EngineReadTimeNotAfterUnseenWriteDeferred(t *testing.T) {
	s35ReadTimeNotAfterUnseenWrite(t, DefaultFlushInterval)
}

// ---------------------------------------------------------------------------
// The rotation crash at the log level: a 0-byte last segment (newSegment
// killed after its O_CREATE) takes appends that a later Open drops.
func TestS35EngineRedologEmptyLastSegment(t *testing.T) {
	dir := t.TempDir()
	l, _, err := redolog.Open(dir, 1, redolog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := l.Append([]byte(fmt.Sprint("before-", i))); err != nil {
			t.Fatal(err)
		}
	}
	next := l.Next()
	l.Close()
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%016x.redo", next)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, recs, err := redolog.Open(dir, 1, redolog.Options{})
	if err != nil {
		t.Logf("open refuses the empty segment: %v", err)
		return
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	for i := 0; i < 3; i++ {
		if _, err := l.Append([]byte(fmt.Sprint("after-", i, "-", strings.Repeat("x", 40)))); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	l, recs, err = redolog.Open(dir, 1, redolog.Options{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer l.Close()
	if len(recs) != 6 {
		t.Errorf("ACKNOWLEDGED RECORDS LOST: %d records after reopen, want 6 (the 3 appended to the empty segment are gone)", len(recs))
	}
}

// ---------------------------------------------------------------------------
// Perf hazard: while flushes fail, every batch interval freezes one more
// layer, and readers go through all of them. A read must not copy or
// rebuild the layers: an Inspect of the oldest lease over ~1500 frozen
// layers allocates nothing per layer beyond one over a handful, and
// answers that lease; a List answers too. (What such a read costs in time is
// BenchmarkInspectManyFrozenLayers'.)
func TestS35EngineManyFrozenLayersReadCost(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1, FlushInterval: time.Nanosecond})
	e := s.group.engine
	failing := failFlushes(e)
	defer failing.Store(false)
	leases := engineAcquire(t, s, "layers", 5)
	few := frozenCount(e)
	fewAllocs, fewBytes := inspectCost(t, s, leases[0])
	engineAcquire(t, s, "more", 1495)
	many := frozenCount(e)
	manyAllocs, manyBytes := inspectCost(t, s, leases[0])
	t.Logf("Inspect: %d allocations, %d bytes over %d frozen layers; %d, %d over %d", manyAllocs, manyBytes, many, fewAllocs, fewBytes, few)
	if many < 1000 {
		t.Fatalf("only %d frozen layers after 1500 acquires while flushes fail", many)
	}
	// A cost per layer is at least one allocation or 8 bytes (a pointer)
	// for each of them; goroutines of earlier tests that still run add a
	// few allocations and some hundreds of bytes per read under load
	// (measured 7 and 440 in a CI check), more over the longer reads.
	if manyAllocs > fewAllocs+uint64(many)/10 || manyBytes > fewBytes+2*uint64(many) {
		t.Errorf("Inspect allocates %d times (%d bytes) over %d frozen layers, %d (%d) over %d", manyAllocs, manyBytes, many, fewAllocs, fewBytes, few)
	}
	first := leases[0].res.Lease
	l, err := s.List(context.Background(), lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: first.OwnerPrincipalID, PageSize: 100,
		DeadlineAt: s35Far, Caller: callerOfRecord(first)})
	if err != nil || len(l.Leases) != 100 {
		t.Errorf("list over %d frozen layers: %d leases, %v; want a full page of 100", many, len(l.Leases), err)
	}
}

// frozenCount is how many frozen layers e holds now.
func frozenCount(e *engine) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.frozen)
}

// inspectCost is the allocations and allocated bytes of one Inspect of l
// by lease id (each of which must answer l): the least of 5 rounds of 20,
// since the counters are the process's and goroutines of earlier tests
// may still allocate meanwhile, which only ever adds.
func inspectCost(t testing.TB, s *Store, l engineLease) (allocs, bytes uint64) {
	t.Helper()
	const rounds, runs = 5, 20
	// The flusher (retrying its failing flush) waits meanwhile.
	s.group.engine.flushMu.Lock()
	defer s.group.engine.flushMu.Unlock()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	allocs, bytes = math.MaxUint64, math.MaxUint64
	for range rounds {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			in, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: l.res.Lease.LeaseID, DeadlineAt: s35Far})
			if err != nil || in.Lease == nil || in.Lease.LeaseID != l.res.Lease.LeaseID {
				t.Fatalf("inspect %s: %+v, %v", l.res.Lease.LeaseID, in.Lease, err)
			}
		}
		runtime.ReadMemStats(&after)
		allocs = min(allocs, (after.Mallocs-before.Mallocs)/runs)
		bytes = min(bytes, (after.TotalAlloc-before.TotalAlloc)/runs)
	}
	return allocs, bytes
}
