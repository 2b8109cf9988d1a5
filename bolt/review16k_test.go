package bolt

// Review attack on 16 KiB pages (commit f9279aa): kill -9 of a busy 16 KiB
// store, 4 KiB files (fresh and the schema 2 fixture) under load backed up
// and restored, a 16 KiB store's backup restored, and a full disk (bbolt's
// MaxSize) while a 16 KiB store grows.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

const r16ChildEnv = "STARLEASE_REVIEW16K_CHILD"

// A fixed deadline, the same in the child and the parent, so that a replay
// is the very same request.
var r16Far = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)

const r16Targets = 24

func r16Ident(prefix string, target int) lease.Identity {
	id := testIdentity
	id.TargetID = fmt.Sprintf("%s-t%d", prefix, target)
	return id
}

func r16Acquire(prefix, reqID string, target, pad int) lease.AcquireRequest {
	req := acquireReq(reqID, time.Hour, r16Far)
	req.Identity = r16Ident(prefix, target)
	req.Metadata = lease.Metadata{"pad": strings.Repeat("p", pad)}
	return req
}

func r16Renew(prefix, reqID string, target int, leaseID string, token uint64) lease.RenewRequest {
	return lease.RenewRequest{Identity: r16Ident(prefix, target), LeaseID: leaseID, FencingToken: token, TTL: 2 * time.Hour,
		ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: r16Far, Caller: acquireReq("", 0, r16Far).Caller}}
}

func r16Release(prefix, reqID string, target int, leaseID string, token uint64) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: r16Ident(prefix, target), LeaseID: leaseID, FencingToken: token,
		ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: r16Far, Caller: acquireReq("", 0, r16Far).Caller}}
}

func r16PageSize(t *testing.T, path string) int {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open %s read-only: %v", path, err)
	}
	defer db.Close()
	return db.Info().PageSize
}

// ---------------------------------------------------------------------------
// Attack 1: kill -9 of a 16 KiB-page store under 16 writers, repeated.

// TestReview16KCrashChild is the child: it acquires, renews and releases
// until killed, printing each acknowledged result (one write(2) a line,
// so a line reaches the pipe whole or not at all).
func TestReview16KCrashChild(t *testing.T) {
	s, round, say := inCrashChild(t, r16ChildEnv, "TestReview16KKill9Loop")
	fmt.Println("PAGESIZE", s.db.Info().PageSize)
	ctx := context.Background()
	for g := 0; g < 16; g++ {
		go func(g int) {
			for k := 0; ; k++ {
				target := (g*7 + k*5) % r16Targets
				pad := 100 + (g*131+k*17)%1500
				id := fmt.Sprintf("r%s-g%d-k%d", round, g, k)
				res, err := s.Acquire(ctx, r16Acquire("crash", "acq-"+id, target, pad))
				if err != nil {
					if code(err) != lease.CodeConflict {
						say("ERR acquire %s %v", id, err)
					}
					continue
				}
				l := res.Lease
				say("ACK acq-%s %d %d %s %d %s", id, target, pad, l.LeaseID, l.FencingToken, l.LockKey)
				if rn, err := s.Renew(ctx, r16Renew("crash", "ren-"+id, target, l.LeaseID, l.FencingToken)); err == nil {
					say("REN ren-%s %d %s %d", id, target, rn.Lease.LeaseID, rn.Lease.FencingToken)
				} else {
					say("ERR renew %s %v", id, err)
				}
				if _, err := s.Release(ctx, r16Release("crash", "rel-"+id, target, l.LeaseID, l.FencingToken)); err == nil {
					say("REL rel-%s %d %s %d", id, target, l.LeaseID, l.FencingToken)
				} else {
					say("ERR release %s %v", id, err)
				}
			}
		}(g)
	}
	select {}
}

type r16Ack struct {
	reqID, leaseID, lockKey string
	target, pad             int
	token                   uint64
}

func TestReview16KKill9Loop(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	rng := rand.New(rand.NewSource(16384))
	maxAcked := map[string]uint64{}  // lock key → highest acknowledged token
	recovered := map[string]uint64{} // lock key → counter read after the last kill
	var allAcks []r16Ack
	for round := 0; round < 7; round++ {
		child := startCrashChild(t, "TestReview16KCrashChild", r16ChildEnv, path, round)
		killAfter := time.Duration(30+rng.Intn(400)) * time.Millisecond
		var killOnce sync.Once
		kill := func() { killOnce.Do(child.kill) }
		safety := time.AfterFunc(15*time.Second, kill)
		var acks []r16Ack
		var rens, rels [][]string
		sc := bufio.NewScanner(child.out)
		started := false
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "PAGESIZE":
				if f[1] != strconv.Itoa(PageSize) && round == 0 {
					t.Errorf("round %d: the child's new file has %s-byte pages, want %d", round, f[1], PageSize)
				}
			case "ACK":
				if len(f) != 7 {
					t.Fatalf("malformed line %q", sc.Text())
				}
				tg, _ := strconv.Atoi(f[2])
				pad, _ := strconv.Atoi(f[3])
				tok, _ := strconv.ParseUint(f[5], 10, 64)
				a := r16Ack{reqID: f[1], target: tg, pad: pad, leaseID: f[4], token: tok, lockKey: f[6]}
				// Tokens of one identity are acknowledged in order (the
				// next holder acquires only after the previous released).
				if tok <= maxAcked[a.lockKey] || tok <= recovered[a.lockKey] {
					t.Errorf("round %d: %s acknowledged token %d for %s, not above the acknowledged %d / recovered counter %d",
						round, a.reqID, tok, a.lockKey, maxAcked[a.lockKey], recovered[a.lockKey])
				}
				maxAcked[a.lockKey] = max(maxAcked[a.lockKey], tok)
				acks = append(acks, a)
				if !started {
					started = true
					time.AfterFunc(killAfter, kill)
				}
			case "REN":
				rens = append(rens, f)
			case "REL":
				rels = append(rels, f)
			case "ERR", "OPENERR":
				t.Errorf("round %d: child: %s", round, sc.Text())
			}
		}
		_ = child.cmd.Wait()
		safety.Stop()
		if len(acks) == 0 {
			t.Fatalf("round %d: no acknowledged acquisition before the kill", round)
		}

		s, err := Open(path, Options{ReapInterval: -1})
		if err != nil {
			t.Fatalf("round %d: reopen after kill -9: %v", round, err)
		}
		if got := s.db.Info().PageSize; got != PageSize {
			t.Fatalf("round %d: page size after reopen %d, want %d", round, got, PageSize)
		}
		checkConsistent(t, s.db, fmt.Sprintf("round %d after kill -9", round))
		for lk, tok := range maxAcked {
			c, err := (faults{s}).Counter(ctx, lk)
			if err != nil {
				t.Fatal(err)
			}
			if c < tok {
				t.Fatalf("round %d: counter of %s went back to %d below the acknowledged token %d", round, lk, c, tok)
			}
			recovered[lk] = c
		}
		// Replay every acknowledged acquisition of this round and a sample
		// of earlier ones: the same lease and token from evidence.
		replay := append([]r16Ack(nil), acks...)
		for i := 0; i < 60 && len(allAcks) > 0; i++ {
			replay = append(replay, allAcks[rng.Intn(len(allAcks))])
		}
		for _, a := range replay {
			res, err := s.Acquire(ctx, r16Acquire("crash", a.reqID, a.target, a.pad))
			if err != nil || !res.Replayed || res.Lease == nil || res.Lease.LeaseID != a.leaseID || res.Lease.FencingToken != a.token {
				t.Fatalf("round %d: replay of acknowledged %s: %+v %v; want replay of lease %s token %d", round, a.reqID, res, err, a.leaseID, a.token)
			}
		}
		for _, f := range rens {
			tg, _ := strconv.Atoi(f[2])
			tok, _ := strconv.ParseUint(f[4], 10, 64)
			res, err := s.Renew(ctx, r16Renew("crash", f[1], tg, f[3], tok))
			if err != nil || !res.Replayed || res.Lease.LeaseID != f[3] || res.Lease.FencingToken != tok {
				t.Fatalf("round %d: replay of acknowledged renewal %s: %+v %v", round, f[1], res, err)
			}
		}
		lastRel := map[int][]string{}
		for _, f := range rels {
			tg, _ := strconv.Atoi(f[2])
			tok, _ := strconv.ParseUint(f[4], 10, 64)
			res, err := s.Release(ctx, r16Release("crash", f[1], tg, f[3], tok))
			if err != nil || !res.Replayed || res.Lease.LeaseID != f[3] {
				t.Fatalf("round %d: replay of acknowledged release %s: %+v %v", round, f[1], res, err)
			}
			lastRel[tg] = f
		}
		for _, f := range lastRel {
			res, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: f[3], DeadlineAt: r16Far})
			if err != nil || res.Lease.State != lease.StateReleased {
				t.Fatalf("round %d: acknowledged release %s lost: %+v %v", round, f[1], res, err)
			}
		}
		// Free the identities the dead child still held (acknowledged or
		// not), so the next round can take every one again.
		for tg := 0; tg < r16Targets; tg++ {
			res, err := s.Inspect(ctx, lease.InspectRequest{Identity: r16Ident("crash", tg), DeadlineAt: r16Far})
			if code(err) == lease.CodeNotFound {
				continue
			}
			if err != nil {
				t.Fatalf("round %d: inspect target %d: %v", round, tg, err)
			}
			if _, err := s.Release(ctx, r16Release("crash", fmt.Sprintf("cleanup-r%d-t%d", round, tg), tg, res.Lease.LeaseID, res.Lease.FencingToken)); err != nil {
				t.Fatalf("round %d: release leftover of target %d: %v", round, tg, err)
			}
		}
		s.Close()
		// Other tools open the file without the store's options.
		checkFile(t, path, &bbolt.Options{Timeout: time.Second})
		allAcks = append(allAcks, acks...)
		t.Logf("round %d: killed after %v: %d acquisitions, %d renewals, %d releases acknowledged; all intact", round, killAfter, len(acks), len(rens), len(rels))
	}
}

// ---------------------------------------------------------------------------
// Attacks 2 and 3: a store of either page size, under load, backed up (also
// mid-load) and restored: page size kept, counters, replays and history
// pages intact, and the restored store goes on.

type r16Call struct {
	name string
	redo func(s *Store) (lease.Result, error)
	want lease.Result
}

// r16Load runs writers on prefix's identities and returns every call made.
func r16Load(t *testing.T, s *Store, prefix, reqPrefix string, workers, perWorker int, during func()) []r16Call {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var calls []r16Call
	note := func(name string, redo func(s *Store) (lease.Result, error), res lease.Result) {
		mu.Lock()
		calls = append(calls, r16Call{name: name, redo: redo, want: res})
		mu.Unlock()
	}
	var wg sync.WaitGroup
	var failed sync.Once
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < perWorker; k++ {
				target := (g*3 + k) % 10
				pad := 50 + (g*97+k*31)%1800
				id := fmt.Sprintf("%s-g%d-k%d", reqPrefix, g, k)
				areq := r16Acquire(prefix, "acq-"+id, target, pad)
				res, err := s.Acquire(ctx, areq)
				if code(err) == lease.CodeConflict {
					continue
				}
				if err != nil {
					failed.Do(func() { t.Errorf("acquire %s: %v", id, err) })
					return
				}
				note("acquire "+id, func(s *Store) (lease.Result, error) { return s.Acquire(ctx, areq) }, res)
				l := res.Lease
				rreq := r16Renew(prefix, "ren-"+id, target, l.LeaseID, l.FencingToken)
				if res, err := s.Renew(ctx, rreq); err != nil {
					failed.Do(func() { t.Errorf("renew %s: %v", id, err) })
					return
				} else {
					note("renew "+id, func(s *Store) (lease.Result, error) { return s.Renew(ctx, rreq) }, res)
				}
				lreq := r16Release(prefix, "rel-"+id, target, l.LeaseID, l.FencingToken)
				if res, err := s.Release(ctx, lreq); err != nil {
					failed.Do(func() { t.Errorf("release %s: %v", id, err) })
					return
				} else {
					note("release "+id, func(s *Store) (lease.Result, error) { return s.Release(ctx, lreq) }, res)
				}
			}
		}(g)
	}
	if during != nil {
		during()
	}
	wg.Wait()
	return calls
}

func r16History(t *testing.T, s *Store, id lease.Identity) []string {
	t.Helper()
	var out []string
	tok := ""
	for {
		h, err := s.History(context.Background(), lease.HistoryRequest{Identity: id, PageSize: 3, PageToken: tok, DeadlineAt: r16Far})
		if err != nil {
			t.Fatalf("history of %s: %v", id.TargetID, err)
		}
		for _, e := range h.Entries {
			out = append(out, fmt.Sprintf("%s %s %s %s", e.Record.LeaseID, e.EndedAt, e.RequestID, encoded(t, e.Record)))
		}
		if h.NextPageToken == "" {
			return out
		}
		tok = h.NextPageToken
	}
}

func r16Replay(t *testing.T, s *Store, calls []r16Call, step string) {
	t.Helper()
	for _, c := range calls {
		got, err := c.redo(s)
		if err != nil {
			t.Fatalf("%s: replay of %s: %v", step, c.name, err)
		}
		if !got.Replayed || got.Code != c.want.Code || got.BackendTime != c.want.BackendTime ||
			encoded(t, got.Lease) != encoded(t, c.want.Lease) {
			t.Fatalf("%s: replay of %s:\n got  %s %s\n want %s %s", step, c.name, got.Code, encoded(t, got.Lease), c.want.Code, encoded(t, c.want.Lease))
		}
	}
}

func TestReview16KBackupRestoreUnderLoad(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, path string)
		want int
	}{
		{"fresh-4KiB", func(t *testing.T, path string) { createWithPageSize(t, path, 4096) }, 4096},
		{"schema2-fixture-4KiB", func(t *testing.T, path string) {
			raw, err := os.ReadFile("testdata/schema2.db")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}, 4096},
		{"new-16KiB", func(t *testing.T, path string) {}, PageSize},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			src := filepath.Join(dir, "starlease.db")
			c.make(t, src)
			s, err := Open(src, Options{ReapInterval: -1})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer s.Close()
			if got := s.db.Info().PageSize; got != c.want {
				t.Fatalf("page size %d, want %d", got, c.want)
			}
			// A backup taken while 12 writers run.
			var mid bytes.Buffer
			calls := r16Load(t, s, "bk", "bk", 10, 20, func() {
				time.Sleep(20 * time.Millisecond)
				if _, err := s.Backup(ctx, &mid); err != nil {
					t.Errorf("backup under load: %v", err)
				}
			})
			if t.Failed() {
				t.FailNow()
			}
			counters := map[string]uint64{}
			hist := map[int][]string{}
			for tg := 0; tg < 10; tg++ {
				id := r16Ident("bk", tg)
				_, lk, err := lease.CanonicalLockKey(id, s.opts.OperationClasses)
				if err != nil {
					t.Fatal(err)
				}
				if counters[lk], err = (faults{s}).Counter(ctx, lk); err != nil {
					t.Fatal(err)
				}
				hist[tg] = r16History(t, s, id)
			}
			var final bytes.Buffer
			h, err := s.Backup(ctx, &final)
			if err != nil {
				t.Fatalf("backup: %v", err)
			}

			// The mid-load backup restores into a consistent file of the
			// source's page size.
			midPath := filepath.Join(dir, "mid.db")
			if _, err := NewNamespace(midPath, Options{ReapInterval: -1}).Restore(ctx, bytes.NewReader(mid.Bytes())); err != nil {
				t.Fatalf("restore of the mid-load backup: %v", err)
			}
			if got := r16PageSize(t, midPath); got != c.want {
				t.Fatalf("mid-load restore has %d-byte pages, want %d", got, c.want)
			}
			mdb, err := bbolt.Open(midPath, 0o600, &bbolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			checkConsistent(t, mdb, "mid-load restore")
			mdb.Close()

			target := filepath.Join(dir, "restored.db")
			ns := NewNamespace(target, Options{ReapInterval: -1})
			if _, err := ns.Restore(ctx, bytes.NewReader(final.Bytes())); err != nil {
				t.Fatalf("restore: %v", err)
			}
			if got := r16PageSize(t, target); got != c.want {
				t.Fatalf("restored file has %d-byte pages, want the source's %d", got, c.want)
			}
			r, err := ns.OpenClosed(ctx)
			if err != nil {
				t.Fatal(err)
			}
			st, err := r.State(ctx)
			if err != nil || st.Marker.BackupSHA256 != h.PayloadSHA256 {
				t.Fatalf("state: %v %+v", err, st.Marker)
			}
			for lk, v := range counters {
				if st.Counters[lk] != v {
					t.Fatalf("restored counter of %s is %d, source %d", lk, st.Counters[lk], v)
				}
			}
			if _, err := r.Finish(ctx, lease.RecoveryPlan{Counters: st.Counters, Epoch: 1, Reason: "review16k"}); err != nil {
				t.Fatalf("finish: %v", err)
			}
			rs, err := Open(target, Options{ReapInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			if got := rs.db.Info().PageSize; got != c.want {
				t.Fatalf("reopened restored store has %d-byte pages, want %d", got, c.want)
			}
			r16Replay(t, rs, calls, "after restore")
			for tg := 0; tg < 10; tg++ {
				got := r16History(t, rs, r16Ident("bk", tg))
				if strings.Join(got, "\n") != strings.Join(hist[tg], "\n") {
					t.Fatalf("history of target %d differs after restore:\n got  %d entries\n want %d entries", tg, len(got), len(hist[tg]))
				}
			}
			// The restored store goes on under load; counters continue.
			more := r16Load(t, rs, "bk", "bk-after", 6, 8, nil)
			for _, cl := range more {
				if strings.HasPrefix(cl.name, "acquire ") && cl.want.Lease.FencingToken <= counters[cl.want.Lease.LockKey] {
					t.Fatalf("after restore %s got token %d, not above the restored counter %d", cl.name, cl.want.Lease.FencingToken, counters[cl.want.Lease.LockKey])
				}
			}
			r16Replay(t, rs, calls, "after restore and more load")
			r16Replay(t, rs, more, "after restore and more load")
			checkConsistent(t, rs.db, "restored store after load")
			t.Logf("%d calls before the backup, %d after the restore; %d-byte pages", len(calls), len(more), c.want)
		})
	}
}

// Attack 3b: a backup of a store whose payload is cut short of its last
// page is refused (the image is never opened); a store file (of either page
// size) whose newest meta page is torn (the last commit's meta write, never
// acknowledged) opens through the other meta page, which bbolt must find
// at the file's own page size although the store asks for 16 KiB pages (a
// 4 KiB file) or bbolt's defaults 4 KiB (restore.go, bbolt tools, on a
// 16 KiB file); every acknowledged call still replays.
func TestReview16KTornMetaAndCutBackup(t *testing.T) {
	for _, ps := range []int{4096, PageSize} {
		t.Run(fmt.Sprintf("page%d", ps), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			path := filepath.Join(dir, "a.db")
			createWithPageSize(t, path, ps)
			s, err := Open(path, Options{ReapInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			calls := r16Load(t, s, "dm", "dm", 4, 10, nil)
			var buf bytes.Buffer
			if _, err := s.Backup(ctx, &buf); err != nil {
				t.Fatal(err)
			}
			// One more write, whose commit the torn meta page below stands
			// for (never acknowledged, so it may be lost).
			if _, err := s.Acquire(ctx, r16Acquire("dm", "acq-dm-unacked", 0, 10)); err != nil && code(err) != lease.CodeConflict {
				t.Fatal(err)
			}
			s.Close()
			b := buf.Bytes()
			cut := bytes.Clone(b[:len(b)-ps/2])
			if _, err := NewNamespace(filepath.Join(dir, "cut.db"), Options{}).Restore(ctx, bytes.NewReader(cut)); err == nil {
				t.Fatal("a backup cut short restored")
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// The meta's txid: after the 16-byte page header, magic,
			// version, page size, flags, root bucket (16), freelist, pgid.
			txid := func(off int) uint64 { return binary.LittleEndian.Uint64(raw[off+64 : off+72]) }
			newest := 0
			if txid(ps) > txid(0) {
				newest = ps
			}
			for i := newest + 16; i < newest+128; i++ {
				raw[i] = 0
			}
			torn := filepath.Join(dir, "torn.db")
			if err := os.WriteFile(torn, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			if got := r16PageSize(t, torn); got != ps {
				t.Fatalf("bbolt's defaults see %d-byte pages in the torn file, want %d", got, ps)
			}
			ts, err := Open(torn, Options{ReapInterval: -1})
			if err != nil {
				t.Fatalf("a %d-byte-page file with a torn newest meta page (at %d) does not open: %v", ps, newest, err)
			}
			defer ts.Close()
			if got := ts.db.Info().PageSize; got != ps {
				t.Fatalf("torn file opened with %d-byte pages, want %d", got, ps)
			}
			checkConsistent(t, ts.db, "torn meta")
			r16Replay(t, ts, calls, "torn newest meta page")
		})
	}
}

// ---------------------------------------------------------------------------
// Attack 5: a full disk (bbolt's MaxSize: the file cannot grow) while a
// store of each page size grows under concurrent writers. Every refused
// write is an error and leaves nothing; acknowledged ones stay; once there
// is room again the store goes on, tokens one above the counters.
func TestReview16KFullDiskWhileGrowing(t *testing.T) {
	for _, ps := range []int{4096, PageSize} {
		t.Run(fmt.Sprintf("page%d", ps), func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "starlease.db")
			createWithPageSize(t, path, ps)
			s, err := Open(path, Options{ReapInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.db.Info().PageSize; got != ps {
				t.Fatalf("page size %d want %d", got, ps)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			s.db.MaxSize = int(fi.Size()) + 48*ps
			// Writes are durable in the redo log (preallocated) before the
			// file takes them: they are refused once what waits for the
			// file passes the engine's bound, made small here.
			s.group.engine.mu.Lock()
			s.group.engine.maxPending = 64 << 10
			s.group.engine.mu.Unlock()
			type out struct {
				req lease.AcquireRequest
				res lease.Result
				err error
			}
			const workers, per = 12, 40
			outs := make([][]out, workers)
			var wg sync.WaitGroup
			for g := 0; g < workers; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for k := 0; k < per; k++ {
						req := acquireReq(fmt.Sprintf("full-g%d-k%d", g, k), time.Hour, r16Far)
						req.Identity.TargetID = fmt.Sprintf("full-g%d-k%d", g, k)
						req.Metadata = lease.Metadata{"pad": strings.Repeat("zq", 1500)}
						res, err := s.Acquire(ctx, req)
						outs[g] = append(outs[g], out{req, res, err})
					}
				}(g)
			}
			wg.Wait()
			var ok, refused int
			for _, os := range outs {
				for _, o := range os {
					if o.err == nil {
						ok++
						continue
					}
					refused++
					if c := code(o.err); c != lease.CodeOutcomeUnknown && c != lease.CodeBackendUnavailable {
						t.Errorf("%s refused with %v, want outcome_unknown or backend_unavailable", o.req.RequestID, o.err)
					}
				}
			}
			if refused == 0 {
				t.Fatalf("no write was refused although the file could not grow (%d acknowledged)", ok)
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() > int64(s.db.MaxSize) {
				t.Fatalf("file grew past MaxSize: %v %d > %d", err, fi.Size(), s.db.MaxSize)
			}
			checkConsistent(t, s.db, "after the full disk")
			// Room again.
			s.db.MaxSize = 0
			for _, os := range outs {
				for _, o := range os {
					res, err := s.Acquire(ctx, o.req)
					if err != nil {
						t.Fatalf("%s after the disk has room: %v", o.req.RequestID, err)
					}
					if o.err == nil {
						if !res.Replayed || res.Lease.LeaseID != o.res.Lease.LeaseID || res.Lease.FencingToken != o.res.Lease.FencingToken {
							t.Fatalf("acknowledged %s lost after the full disk: %+v", o.req.RequestID, res)
						}
						continue
					}
					// A refused write left nothing: a fresh acquisition, token 1.
					if res.Replayed || res.Lease.FencingToken != 1 {
						t.Fatalf("refused %s left a trace: %+v", o.req.RequestID, res)
					}
				}
			}
			checkConsistent(t, s.db, "after room again")
			t.Logf("%d-byte pages: %d acknowledged, %d refused while the file could not grow", ps, ok, refused)
		})
	}
}
