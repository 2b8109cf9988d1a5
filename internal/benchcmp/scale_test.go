package benchcmp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// BenchmarkScale measures how cost grows with the work, on bolt and on
// Valkey (a fresh redis-server per N, AOF with appendfsync always), the
// Valkey namespace in format 8 with EagerDetach ("valkey") and, as the
// baseline its bytes are compared with in the same run, one left in
// version 1 ("valkey-v1", no format switch); STARLEASE_SCALE_BACKENDS,
// comma-separated, keeps some of them. A store preloaded with N active leases
// (STARLEASE_SCALE_NS, default 0,10000,100000; distinct identities over
// 10 owners and 10 programs, which never expire during the run) then runs
// acquire+release pairs on other identities at 1 and 16 goroutines for
// STARLEASE_BENCH_ROW each (default 2s). It reports pairs/s, the ratio to
// N = 0, and the storage each active lease costs: the bolt file's growth
// (its size, and the disk blocks it holds: bbolt grows the file ahead of
// its pages, up to 16 MiB that hold no blocks), Valkey's used_memory and
// AOF growth, per preloaded lease; then, once they are all released, what
// each of them leaves behind for its retention (history, the evidence of
// both operations, lookups, the counter), one lease per identity: its
// acquisition's share plus its release's. The measured pairs run on 17
// identities of their own, each ending thousands of leases, so past
// HistoryPerIdentity every release trims an entry: what such a "hot" pair
// leaves behind is reported apart. For Valkey it also reports what the AOF
// holds once rewritten (BGREWRITEAOF: the steady-state disk, since the AOF
// grows by what is written and is compacted by its rewrite). Then 10,000 leases with a 5 s
// TTL expire at about the same time with the reaper running every second,
// while one writer keeps acquiring and releasing (bolt and format 8): it
// reports how long the active count takes to come back (expiries/s) and
// the writer's longest pair from the first expiry until then, beside the
// same writer's longest pair over 5 s on the same store just before, with
// the reaper running and nothing due: what the disk and the machine give a
// pair anyway, so that what the reaping adds can be told from it. Last,
// the scale goals, each from this run: throughput at the largest
// N over N = 0, reaping, and format 8's bytes over version 1's, for an
// ended lease and for a hot pair.
//
// The benchmark ignores b.N: run it with -benchtime 1x.
func BenchmarkScale(b *testing.B) {
	rowTime := envDuration(b, "STARLEASE_BENCH_ROW", 2*time.Second)
	ns := []int{0, 10000, 100000}
	if v := os.Getenv("STARLEASE_SCALE_NS"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				b.Fatalf("STARLEASE_SCALE_NS=%q: want non-negative integers", v)
			}
			ns = append(ns, n)
		}
	}
	type line struct {
		backend               string
		n                     int
		pairs1, pairs16       float64
		active, ended, paired perOne
		// Valkey only; else 0.
		activeRewritten, endedRewritten, pairRewritten float64
	}
	var lines []line
	type reapLine struct {
		backend   string
		perSec    float64
		maxWriter time.Duration
		control   time.Duration
	}
	var reaps []reapLine
	backends := []string{"bolt", "valkey", valkeyV1}
	if v := os.Getenv("STARLEASE_SCALE_BACKENDS"); v != "" {
		backends = strings.Split(v, ",")
		for i, be := range backends {
			be = strings.TrimSpace(be)
			backends[i] = be
			if be != "bolt" && be != "valkey" && be != valkeyV1 {
				b.Fatalf("STARLEASE_SCALE_BACKENDS=%q: want some of bolt, valkey and %s, comma-separated", v, valkeyV1)
			}
		}
	}
	for _, backend := range backends {
		for _, n := range ns {
			s, size, rewrite := openScaleStore(b, backend, time.Minute)
			// Valkey's AOF is rewritten at each step the rewritten figure
			// is taken between (zero for bolt, which keeps only what it
			// retains); every AOF growth is taken between rewrites.
			rewritten := func() int64 {
				if rewrite == nil {
					return 0
				}
				return rewrite()
			}
			empty := rewritten()
			before := size()
			held := preload(b, s, n)
			after := size()
			l := line{backend: backend, n: n}
			rewrittenAfter := rewritten()
			if n > 0 {
				l.active = growth(before, after, n)
				l.activeRewritten = float64(rewrittenAfter-empty) / float64(n)
			}
			unpaired := size()
			pairs := 0
			for _, conc := range []int{1, 16} {
				m, err := measure(storeRows(backend, s, false)[0], conc, rowTime)
				if err != nil {
					b.Fatalf("%s N=%d at %d goroutines: %v", backend, n, conc, err)
				}
				pairs += m.ops
				if conc == 1 {
					l.pairs1 = m.opsPerSec
				} else {
					l.pairs16 = m.opsPerSec
				}
			}
			// What a measured pair leaves behind: each goroutine keeps its
			// identity, so past HistoryPerIdentity every release trims
			// that identity's oldest entry (a hot identity).
			paired := size()
			rewrittenPaired := rewritten()
			if pairs > 0 {
				l.paired = growth(unpaired, paired, pairs)
				l.pairRewritten = float64(rewrittenPaired-rewrittenAfter) / float64(pairs)
			}
			if n > 0 {
				// What one preloaded lease leaves behind for its
				// retention (history, both operations' evidence, the
				// lease-id lookup and the counter), one lease per
				// identity: its acquisition's growth plus its release's.
				unreleased := size()
				releaseAll(b, s, held)
				ended := size()
				l.ended = l.active.plus(growth(unreleased, ended, n))
				l.endedRewritten = float64(rewrittenAfter-empty+rewritten()-rewrittenPaired) / float64(n)
			}
			lines = append(lines, l)
			s.Close()
		}
		if backend == valkeyV1 {
			continue // the bytes' baseline only
		}
		s, _, _ := openScaleStore(b, backend, time.Second)
		per, wait, control := reapBacklog(b, s, 10000)
		reaps = append(reaps, reapLine{backend, per, wait, control})
		s.Close()
	}
	least, most := slices.Min(ns), slices.Max(ns)
	at := func(backend string, n int) (line, bool) {
		for _, l := range lines {
			if l.backend == backend && l.n == n {
				return l, true
			}
		}
		return line{}, false
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "backend\tN active\tpairs/s 1 g\tx N=%d\tpairs/s 16 g\tx N=%d\tbytes/active lease\tallocated/active lease\tAOF/active lease\tAOF rewritten/active lease\t\n", least, least)
	for _, l := range lines {
		b0, _ := at(l.backend, least)
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%.2f\t%.0f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", l.backend, l.n, l.pairs1, l.pairs1/b0.pairs1,
			l.pairs16, l.pairs16/b0.pairs16, l.active.mem, l.active.disk, l.active.aof, l.activeRewritten)
	}
	w.Flush()
	fmt.Println()
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "backend\tN active\tbytes/ended lease\tallocated/ended lease\tAOF/ended lease\tAOF rewritten/ended lease\tbytes/hot pair\tallocated/hot pair\tAOF/hot pair\tAOF rewritten/hot pair\t\n")
	for _, l := range lines {
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", l.backend, l.n, l.ended.mem, l.ended.disk, l.ended.aof,
			l.endedRewritten, l.paired.mem, l.paired.disk, l.paired.aof, l.pairRewritten)
	}
	w.Flush()
	fmt.Println()
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "backend\t10,000 expiring: expiries/s\tlongest writer pair meanwhile (ms)\tlongest over 5 s before, nothing due (ms)\t\n")
	for _, r := range reaps {
		fmt.Fprintf(w, "%s\t%.0f\t%.1f\t%.1f\t\n", r.backend, r.perSec, float64(r.maxWriter.Microseconds())/1000,
			float64(r.control.Microseconds())/1000)
	}
	w.Flush()

	// The goals, each from this run's figures.
	var goals []scaleGoal
	for _, backend := range []string{"bolt", "valkey"} {
		l, ok := at(backend, most)
		b0, ok0 := at(backend, 0)
		if !ok || !ok0 || most == 0 {
			continue
		}
		goals = append(goals,
			ratioGoal(fmt.Sprintf("%s pairs/s at N=%d / N=0, 1 goroutine", backend, most), l.pairs1, b0.pairs1, 0.8, true),
			ratioGoal(fmt.Sprintf("%s pairs/s at N=%d / N=0, 16 goroutines", backend, most), l.pairs16, b0.pairs16, 0.8, true))
	}
	for _, r := range reaps {
		goals = append(goals,
			scaleGoal{r.backend + " expiries/s, 10,000 expiring", r.perSec, true, 1000, true},
			scaleGoal{r.backend + " longest writer pair while reaping (ms)", float64(r.maxWriter.Microseconds()) / 1000, true, 50, false})
	}
	for _, n := range ns {
		l, ok := at("valkey", n)
		v1, ok1 := at(valkeyV1, n)
		if !ok || !ok1 {
			continue
		}
		type figure struct {
			what      string
			got, base float64
		}
		var figures []figure
		if n > 0 {
			figures = append(figures,
				figure{"memory per active lease", l.active.mem, v1.active.mem},
				figure{"AOF written per active lease", l.active.aof, v1.active.aof},
				figure{"memory per ended lease", l.ended.mem, v1.ended.mem},
				figure{"AOF written per ended lease", l.ended.aof, v1.ended.aof},
				figure{"AOF rewritten per ended lease", l.endedRewritten, v1.endedRewritten})
		}
		if n == least {
			// The hot identities' pairs are alike at every N: once.
			figures = append(figures,
				figure{"memory per hot pair", l.paired.mem, v1.paired.mem},
				figure{"AOF written per hot pair", l.paired.aof, v1.paired.aof},
				figure{"AOF rewritten per hot pair", l.pairRewritten, v1.pairRewritten})
		}
		for _, f := range figures {
			goals = append(goals, ratioGoal(fmt.Sprintf("valkey format 8 / version 1 at N=%d: %s", n, f.what), f.got, f.base, 0.5, false))
		}
	}
	if len(goals) == 0 {
		return
	}
	fmt.Println()
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "goal\tmeasured\tgoal\tmet\t\n")
	for _, g := range goals {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", g.name, g.measured(), g.bound(), g.met())
	}
	w.Flush()
}

// valkeyV1 is the scale benchmark's Valkey namespace left in version 1,
// the baseline of format 8's bytes.
const valkeyV1 = "valkey-v1"

// scaleGoal is one of the scale goals: got against limit, a
// least value if atLeast, else a most value; a figure that is not valid
// (a ratio over nothing, or below zero: noise) is not met.
type scaleGoal struct {
	name    string
	got     float64
	valid   bool
	limit   float64
	atLeast bool
}

// ratioGoal is the goal that got / base meet limit.
func ratioGoal(name string, got, base, limit float64, atLeast bool) scaleGoal {
	return scaleGoal{name, got / base, base > 0 && got >= 0, limit, atLeast}
}

func (g scaleGoal) measured() string {
	if !g.valid {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", g.got)
}

func (g scaleGoal) bound() string {
	if g.atLeast {
		return fmt.Sprintf("≥ %g", g.limit)
	}
	return fmt.Sprintf("≤ %g", g.limit)
}

func (g scaleGoal) met() string {
	if g.valid && (g.atLeast && g.got >= g.limit || !g.atLeast && g.got <= g.limit) {
		return "yes"
	}
	return "no"
}

// storeSize is the storage a store holds: bytes (the bolt file's size,
// or Valkey's used_memory), the bolt file's allocated bytes, and Valkey's
// AOF bytes.
type storeSize struct{ mem, disk, aof int64 }

// perOne is storage per lease or per pair (storeSize's figures).
type perOne struct{ mem, disk, aof float64 }

// growth is the storage from a to b, per one of n.
func growth(a, b storeSize, n int) perOne {
	return perOne{float64(b.mem-a.mem) / float64(n), float64(b.disk-a.disk) / float64(n), float64(b.aof-a.aof) / float64(n)}
}

func (p perOne) plus(q perOne) perOne { return perOne{p.mem + q.mem, p.disk + q.disk, p.aof + q.aof} }

type scaleStore interface {
	operations
	Close() error
	ActiveLeases(context.Context) (int64, error)
}

// openScaleStore opens a store of backend and returns it with its size,
// and for Valkey rewrite, which rewrites the AOF and returns its size then
// (nil for bolt, whose file holds only what it retains).
func openScaleStore(b *testing.B, backend string, reap time.Duration) (scaleStore, func() storeSize, func() int64) {
	switch backend {
	case "bolt":
		path := filepath.Join(b.TempDir(), "starlease.db")
		s, err := bolt.Open(path, bolt.Options{StoreOptions: storeOptions(), ReapInterval: reap})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s, func() storeSize {
			fi, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				b.Fatal("no block count for the store file")
			}
			return storeSize{mem: fi.Size(), disk: st.Blocks * 512}
		}, nil
	default:
		r := testenv.StartRedis(b)
		// Format 8 detaching eagerly (the hot pairs' identities trim live
		// evidence), or (valkeyV1) no format switch: version 1.
		lean := backend == "valkey"
		s, err := valkey.Open(bg, valkey.Options{Addr: r.Addr(), StoreOptions: storeOptions(), ReapInterval: reap, CheckedEvidence: lean, EagerDetach: lean})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		// No automatic AOF rewrite: it would shrink the AOF the per-lease
		// figure is measured from.
		c := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
		b.Cleanup(func() { c.Close() })
		if err := c.ConfigSet(bg, "auto-aof-rewrite-percentage", "0").Err(); err != nil {
			b.Fatal(err)
		}
		return s, func() storeSize { return redisSize(b, c) }, func() int64 { return rewriteAOF(b, c) }
	}
}

// preload acquires n leases on distinct identities (10 owners' worth of
// programs) that outlive the run, 50 at a time.
func preload(b *testing.B, s operations, n int) []*lease.Record {
	held := make([]*lease.Record, n)
	inParallel(b, "preload", n, func(i int) error {
		id := identity()
		id.ProgramID = "program-" + strconv.Itoa(i%10)
		req := acquireReq(id)
		req.TTL = 10 * time.Minute
		req.Caller.PrincipalID = "prn_owner_" + strconv.Itoa(i/10%10)
		res, err := s.Acquire(bg, req)
		if err == nil {
			held[i] = res.Lease
		}
		return err
	})
	return held
}

// releaseAll releases every lease of held, 50 at a time.
func releaseAll(b *testing.B, s operations, held []*lease.Record) {
	inParallel(b, "release", len(held), func(i int) error {
		req := releaseReq(held[i])
		req.Caller.PrincipalID = held[i].OwnerPrincipalID
		_, err := s.Release(bg, req)
		return err
	})
}

// inParallel runs op for 0 ≤ i < n on 50 goroutines and fails b with
// the first error.
func inParallel(b *testing.B, what string, n int, op func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n) && failed.Load() == nil; i = next.Add(1) {
				if err := op(int(i - 1)); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		b.Fatalf("%s: %v", what, *p)
	}
}

// reapBacklog acquires n leases with a 5 s TTL, then waits for the
// reaper to bring the active count back to where it was, while one writer
// runs pairs; it returns expiries per second (from the last expiry to the
// count's return) and the writer's longest pair from the first expiry
// to the count's return, and, as a control, the writer's longest pair
// over 5 s before the leases were acquired.
func reapBacklog(b *testing.B, s scaleStore, n int) (perSec float64, longest, control time.Duration) {
	base, err := s.ActiveLeases(bg)
	if err != nil {
		b.Fatal(err)
	}
	writer := storeRows("writer", s, false)[0]
	op, err := writer.worker(0)
	if err != nil {
		b.Fatal(err)
	}
	stopControl := longestPair(b, op)
	time.Sleep(5 * time.Second)
	control = stopControl()

	const ttl = 5 * time.Second
	start := time.Now()
	inParallel(b, "acquire", n, func(int) error {
		req := acquireReq(identity())
		req.TTL = ttl
		_, err := s.Acquire(bg, req)
		return err
	})
	lastExpiry := time.Now().Add(ttl)
	if time.Since(start) > ttl {
		b.Logf("acquiring %d leases took %v, longer than their TTL: the first expired before the last was granted", n, time.Since(start))
	}
	// The writer is timed from the first expiry: before it, nothing is
	// due (the control's case), and a pair waits only for the disk.
	time.Sleep(time.Until(start.Add(ttl)))
	stop := longestPair(b, op)
	time.Sleep(time.Until(lastExpiry))
	deadline := time.Now().Add(10 * time.Minute)
	for {
		got, err := s.ActiveLeases(bg)
		if err != nil {
			b.Fatal(err)
		}
		if got <= base+1 { // the writer may hold one
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after 10 minutes %d of %d expired leases are still active", got-base, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(lastExpiry)
	return float64(n) / took.Seconds(), stop(), control
}

// longestPair runs op in a loop on a goroutine of its own until stop is
// called, which returns the longest op it timed.
func longestPair(b *testing.B, op func() error) (stop func() time.Duration) {
	var maxWait atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			t0 := time.Now()
			if err := op(); err != nil {
				b.Errorf("writer: %v", err)
				return
			}
			if d := int64(time.Since(t0)); d > maxWait.Load() {
				maxWait.Store(d)
			}
		}
	}()
	return func() time.Duration {
		close(done)
		wg.Wait()
		return time.Duration(maxWait.Load())
	}
}

// rewriteAOF rewrites the server's AOF (BGREWRITEAOF) and returns its size
// once the rewrite is done: what the AOF holds of the data, not what was
// written to it.
func rewriteAOF(b *testing.B, c *goredis.Client) int64 {
	ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
	defer cancel()
	if err := c.BgRewriteAOF(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	for {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			b.Fatal(err)
		}
		if strings.Contains(info, "aof_rewrite_in_progress:0") && strings.Contains(info, "aof_rewrite_scheduled:0") {
			if !strings.Contains(info, "aof_last_bgrewrite_status:ok") {
				b.Fatalf("AOF rewrite failed:\n%s", info)
			}
			return redisSize(b, c).aof
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisSize reads used_memory and aof_current_size.
func redisSize(b *testing.B, c *goredis.Client) storeSize {
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "memory", "persistence").Result()
	if err != nil {
		b.Fatal(err)
	}
	var st storeSize
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			st.mem, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(l, "aof_current_size:"); ok {
			st.aof, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return st
}
