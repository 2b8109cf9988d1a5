package valkey

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/bsm/redislock"
	goredis "github.com/redis/go-redis/v9"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// BenchmarkLease measures, in one run on one harness server (AOF on,
// appendfsync always), at 1 and 50 concurrent callers:
//
//	floor-read        FCALL_RO of a function that only reads TIME (the
//	                  library's clock), through the store's client
//	floor-write       FCALL of a function that reads TIME and INCRs one
//	                  scratch key (the library's probe): only writes pay
//	                  the AOF fsync, so this is the floor of a mutation
//	acquire+release   one Acquire then one Release, each goroutine on its
//	                  own identity (no contention); one op = one pair
//	renew             Renew of a held lease
//	authorize-commit  AuthorizeCommit, a new commit id each time
//	inspect           Inspect by identity of a held lease (a read)
//	redislock         github.com/bsm/redislock Obtain+Release on the same
//	                  server (go-redis client; no fencing, no idempotency);
//	                  one op = one pair
//	contract-writes   the server commands of one acquire and one release,
//	                  the same commands with values of the same sizes, in
//	                  two FCALLs of a bench-only library that does nothing
//	                  else (no checks, no record built): the floor of any
//	                  design that makes this contract's writes with one
//	                  function per transition; one op = one pair
//	lean-writes       the same for a leaner layout the store does not
//	                  have: counter and active record in one hash per
//	                  identity, evidence that refers to the record (see
//	                  bench_lean_acquire); what that layout would allow
//	lean-deferred     lean-writes with the release's index and schedule
//	                  removals left to a batched sweep, 16 leases a call
//
// Each reports ops/s and two cost ratios, against floors measured in the
// same run at the same concurrency (a pair counts as two operations):
//
//	x_a      cost per operation over floor-read's: the floor (a),
//	         a bare FCALL that only reads TIME
//	x_floor  cost per operation over its own kind's floor: floor-write for
//	         mutations (a write pays the AOF fsync, (a) does not), and
//	         floor-read, so (a), for reads
//
// redislock reports both too: a lock with no contract at all, on the same
// server, shows what any mutation costs over (a). acquire+release also
// reports x_redislock, its cost over a redislock pair's. Diagnostics: scripts/op is the server's
// count of script calls (FCALL, FCALL_RO, EVALSHA, EVAL) per op, so round
// trips; srv_us/op their server execution time per op (INFO commandstats,
// without the fsync); aof_B/op the AOF bytes written per op. The table at
// the end repeats the numbers. The server's automatic AOF rewrite is off
// for the run (see below); everything else is the harness configuration.
func BenchmarkLease(b *testing.B) {
	r := testenv.StartRedis(b)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	o := leasetest.StoreOptions()
	o.Logger = quiet
	// Format 3 (`starlease serve --valkey-compact-records`), as the peer
	// benchmark: each goroutine keeps its identity, so every release trims
	// its oldest history entry, which in formats 5 and 6 first rewrites
	// the evidence referring to it. Format 6 is leaner per active lease
	// (the scale benchmark) but slower here, with EagerDetach too (which
	// writes that evidence whole at once: about 130 script µs per pair at
	// 50 against format 6's 160 and format 3's 100).
	s := open(b, r, Options{StoreOptions: o, CompactRecords: true})
	// No automatic AOF rewrite (a fork and a rewrite in the background,
	// at 64 MB): it would land in whichever benchmark crosses the size and
	// reset the AOF size aof_B/op is measured from. appendfsync stays
	// always.
	if err := s.client.Do(bg, s.client.B().ConfigSet().ParameterValue().ParameterValue("auto-aof-rewrite-percentage", "0").Build()).Error(); err != nil {
		b.Fatal(err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr(), PoolSize: 64, Protocol: 3})
	b.Cleanup(func() { rdb.Close() })
	locks := redislock.New(rdb)
	if err := s.client.Do(bg, s.client.B().FunctionLoad().Replace().FunctionCode(benchWritesLibrary).Build()).Error(); err != nil {
		b.Fatal(err)
	}

	res := &benchResults{ops: map[string]float64{}}
	for _, conc := range []int{1, 50} {
		for _, bm := range leaseBenches(s, locks) {
			name := fmt.Sprintf("%s/goroutines=%d", bm.name, conc)
			b.Run(name, func(b *testing.B) {
				ops := runConcurrent(b, s, conc, bm.worker)
				res.set(bm.name, conc, ops)
				b.ReportMetric(ops, "ops/s")
				if f := res.get(bm.floor, conc); bm.floor != "" && f > 0 {
					b.ReportMetric(f/(bm.floorOps*ops), "x_floor")
				}
				if a := res.get("floor-read", conc); bm.floor != "" && a > 0 {
					b.ReportMetric(a/(bm.floorOps*ops), "x_a")
				}
				if pairVsRedislock[bm.name] {
					if rl := res.get("redislock", conc); rl > 0 {
						b.ReportMetric(rl/ops, "x_redislock")
					}
				}
			})
		}
	}
	res.print(os.Stdout)
}

// leaseBench is one measured operation.
type leaseBench struct {
	name string
	// floor names the floor benchmark, floorOps how many floor ops one op
	// is worth (2 for a pair of mutations).
	floor    string
	floorOps float64
	// worker prepares goroutine g's state (untimed) and returns its op.
	worker func(b *testing.B, g int) func() error
}

// benchAcquire is an acquire request without metadata, with the longest
// lifetime, so renewals never reach it.
func benchAcquire(id lease.Identity) lease.AcquireRequest {
	req := acquireReq(id)
	req.Metadata = nil
	req.MaximumLifetime = lease.MaxLifetime
	return req
}

func leaseBenches(s *Store, locks *redislock.Client) []leaseBench {
	hold := func(b *testing.B) *lease.Record {
		a, err := s.Acquire(bg, benchAcquire(newIdentity()))
		if err != nil {
			b.Fatal(err)
		}
		return a.Lease
	}
	// Built per call, as the adapter builds its commands.
	clock := call{fn: "clock", ro: true}
	probe := call{fn: "probe", keys: []string{s.keys.probe()}}
	return []leaseBench{
		{name: "floor-read", worker: func(*testing.B, int) func() error {
			return func() error { _, err := s.client.Do(bg, s.build(clock)).ToArray(); return err }
		}},
		{name: "floor-write", worker: func(*testing.B, int) func() error {
			return func() error { _, err := s.client.Do(bg, s.build(probe)).ToArray(); return err }
		}},
		{name: "redislock", floor: "floor-write", floorOps: 2, worker: func(_ *testing.B, g int) func() error {
			key := "bench:redislock:" + randomPrefix() + ":" + strconv.Itoa(g)
			return func() error {
				l, err := locks.Obtain(bg, key, 30*time.Second, nil)
				if err != nil {
					return err
				}
				return l.Release(bg)
			}
		}},
		{name: "acquire+release", floor: "floor-write", floorOps: 2, worker: func(*testing.B, int) func() error {
			id := newIdentity()
			return func() error {
				a, err := s.Acquire(bg, benchAcquire(id))
				if err != nil {
					return err
				}
				_, err = s.Release(bg, releaseReq(a.Lease))
				return err
			}
		}},
		{name: "contract-writes", floor: "floor-write", floorOps: 2, worker: func(*testing.B, int) func() error {
			return contractWrites(s)
		}},
		{name: "lean-writes", floor: "floor-write", floorOps: 2, worker: func(*testing.B, int) func() error {
			return leanWrites(s, false)
		}},
		{name: "lean-deferred", floor: "floor-write", floorOps: 2, worker: func(*testing.B, int) func() error {
			return leanWrites(s, true)
		}},
		{name: "renew", floor: "floor-write", floorOps: 1, worker: func(b *testing.B, _ int) func() error {
			l := hold(b)
			return func() error { _, err := s.Renew(bg, renewReq(l)); return err }
		}},
		{name: "authorize-commit", floor: "floor-write", floorOps: 1, worker: func(b *testing.B, _ int) func() error {
			l := hold(b)
			return func() error { _, err := s.AuthorizeCommit(bg, commitReq(l)); return err }
		}},
		{name: "inspect", floor: "floor-read", floorOps: 1, worker: func(b *testing.B, _ int) func() error {
			id := hold(b).Identity()
			return func() error {
				_, err := s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
				return err
			}
		}},
	}
}

// runConcurrent runs b.N ops on conc goroutines (exactly conc, each with
// its own state from worker) and returns ops per second. It reports the
// server-side diagnostics as metrics.
func runConcurrent(b *testing.B, s *Store, conc int, worker func(*testing.B, int) func() error) float64 {
	ops := make([]func() error, conc)
	for g := range ops {
		ops[g] = worker(b, g)
	}
	before := serverStats(b, s, true)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func(op func() error) {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}(ops[g])
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if p := firstErr.Load(); p != nil {
		b.Fatalf("op failed: %v", *p)
	}
	after := serverStats(b, s, false)
	n := float64(b.N)
	b.ReportMetric(float64(after.scripts)/n, "scripts/op")
	b.ReportMetric(float64(after.usec)/n, "srv_us/op")
	b.ReportMetric(float64(after.aof-before.aof)/n, "aof_B/op")
	return n / elapsed.Seconds()
}

// stats are the server's counters: script calls and their CPU time since
// the last reset, and the AOF size.
type stats struct {
	scripts, usec, aof int64
}

func serverStats(b testing.TB, s *Store, reset bool) stats {
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	c := s.client
	if reset {
		if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Section("persistence").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	var st stats
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "aof_current_size:"); ok {
			st.aof, _ = strconv.ParseInt(v, 10, 64)
		}
		name, fields, ok := strings.Cut(line, ":")
		switch name {
		case "cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro":
		default:
			continue
		}
		if !ok {
			continue
		}
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.scripts += n
			case "usec":
				st.usec += n
			}
		}
	}
	return st
}

// benchResults collects ops/s by benchmark and concurrency; the last
// (longest) run of each sub-benchmark wins.
type benchResults struct {
	mu  sync.Mutex
	ops map[string]float64
}

func (r *benchResults) key(name string, conc int) string { return name + "\x00" + strconv.Itoa(conc) }

func (r *benchResults) set(name string, conc int, ops float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops[r.key(name, conc)] = ops
}

func (r *benchResults) get(name string, conc int) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ops[r.key(name, conc)]
}

// pairVsRedislock are the pair rows that report their cost over a
// redislock pair's.
var pairVsRedislock = map[string]bool{"acquire+release": true, "contract-writes": true, "lean-writes": true, "lean-deferred": true}

// print writes the summary table: ops/s, the cost ratio to the op's floor
// and, for acquire+release, to redislock.
func (r *benchResults) print(out io.Writer) {
	floors := map[string]struct {
		name string
		n    float64
	}{
		"redislock": {"floor-write", 2}, "acquire+release": {"floor-write", 2}, "renew": {"floor-write", 1},
		"authorize-commit": {"floor-write", 1}, "inspect": {"floor-read", 1}, "contract-writes": {"floor-write", 2},
		"lean-writes": {"floor-write", 2}, "lean-deferred": {"floor-write", 2},
	}
	order := []string{"floor-read", "floor-write", "redislock", "contract-writes", "lean-writes", "lean-deferred", "acquire+release", "renew",
		"authorize-commit", "inspect"}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "operation\tgoroutines\tops/s\tx_a\tx_floor\tfloor\tx_redislock\t")
	for _, conc := range []int{1, 50} {
		for _, name := range order {
			ops := r.get(name, conc)
			if ops == 0 {
				continue
			}
			vsA, ratio, floor, vsLock := "-", "-", "-", "-"
			if f, ok := floors[name]; ok {
				if fo := r.get(f.name, conc); fo > 0 {
					ratio = fmt.Sprintf("%.2f", fo/(f.n*ops))
					floor = fmt.Sprintf("%g×%s", f.n, f.name)
				}
				if a := r.get("floor-read", conc); a > 0 {
					vsA = fmt.Sprintf("%.2f", a/(f.n*ops))
				}
			}
			if pairVsRedislock[name] {
				if rl := r.get("redislock", conc); rl > 0 {
					vsLock = fmt.Sprintf("%.2f", rl/ops)
				}
			}
			fmt.Fprintf(w, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t\n", name, conc, ops, vsA, ratio, floor, vsLock)
		}
	}
	w.Flush()
}

// benchWritesLibrary makes exactly the server commands an acquire and a
// release make (library.lua, on the usual path: no gate, no evidence, no
// predecessor, history at its cap) and nothing else: no checks, and each
// value it writes is the lease id and a fixed padding, one new string per
// value as the library builds each value once. KEYS 1 active, 2 history,
// 3 index, 4 expiry schedule, 5 acquire's evidence, 6 release's evidence,
// 7 gate, 8 counter, 9 lease-id lookup, 10 counter floor. ARGV 1 hash
// tag, 2 lease id, 3 history cap.
const benchWritesLibrary = `#!lua name=starlease_bench_writes
-- Paddings to the sizes a pair without metadata writes in format 3:
-- record 398 bytes, evidence 384, history entry 449, expiry member 78, index
-- members 95, 177 and 135 (lease ids are 32 bytes).
-- (Built on first use: the string library is not reachable at load time.)
local PADS = {}
local function pad(n)
  local v = PADS[n]
  if not v then
    v = string.rep('r', n - 32)
    PADS[n] = v
  end
  return v
end
local function types(keys)
  redis.call('TYPE', keys[2])
  redis.call('TYPE', keys[3])
  redis.call('TYPE', keys[4])
end
-- index adds a lease's schedule (KEYS 4) and index (KEYS 3) members,
-- unindex removes them, and push_history pushes its history entry (KEYS
-- 2) under the cap.
local function index(keys, id)
  redis.call('ZADD', keys[4], '1', id .. pad(78))
  redis.call('ZADD', keys[3], '0', id .. pad(95), '0', id .. pad(177), '0', id .. pad(135))
end
local function unindex(keys, id)
  redis.call('ZREM', keys[3], id .. pad(95), id .. pad(177), id .. pad(135))
  redis.call('ZREM', keys[4], id .. pad(78))
end
local function push_history(keys, id, cap)
  if redis.call('LPUSH', keys[2], id .. pad(449)) > tonumber(cap) then redis.call('LTRIM', keys[2], 0, tonumber(cap) - 1) end
  redis.call('PEXPIRE', keys[2], '604800000')
end
redis.register_function('bench_acquire_writes', function(keys, args)
  local id = args[2]
  redis.call('TIME')
  redis.call('EXISTS', keys[7], keys[5])
  types(keys)
  redis.call('GET', keys[1])
  redis.call('GET', keys[8])
  redis.call('GET', keys[10])
  redis.call('SET', keys[9], args[1], 'NX', 'PX', '604800000')
  redis.call('INCR', keys[8])
  local rec = id .. pad(398)
  redis.call('SET', keys[1], rec, 'PX', '604800000')
  index(keys, id)
  redis.call('SET', keys[5], id .. pad(384), 'PX', '604800000')
  return { 'ok', '1', rec }
end)
redis.register_function('bench_release_writes', function(keys, args)
  local id = args[2]
  redis.call('TIME')
  redis.call('EXISTS', keys[7], keys[6])
  types(keys)
  redis.call('GET', keys[1])
  redis.call('PTTL', keys[1])
  local rec = id .. pad(398)
  push_history(keys, id, args[3])
  redis.call('DEL', keys[1])
  unindex(keys, id)
  redis.call('SET', keys[6], id .. pad(384), 'PX', '604800000')
  return { 'ok', '1', rec }
end)
-- bench_lean_acquire and bench_lean_release make the writes of a leaner
-- layout the store does not have (yet), the same way: an identity's
-- counter and active record are two fields of one hash, evidence refers
-- to the record (120 bytes, as bolt's version 3), and the physical TTL of
-- the active record is gone (the reaper alone reclaims it). With ARGV 4
-- 'deferred', the release leaves its index and schedule members, and
-- bench_lean_sweep removes those of 16 leases in two calls, as a reaper
-- would. KEYS 1 the identity's hash, 2 history, 3 index, 4 expiry
-- schedule, 5 acquire's evidence, 6 release's evidence, 7 gate, 8 lease-id
-- lookup, 9 counter floor. ARGV 1 hash tag, 2 lease id, 3 history cap.
redis.register_function('bench_lean_acquire', function(keys, args)
  local id = args[2]
  redis.call('TIME')
  redis.call('EXISTS', keys[7], keys[5])
  redis.call('TYPE', keys[3])
  redis.call('TYPE', keys[4])
  redis.call('HMGET', keys[1], 'c', 'a')
  redis.call('GET', keys[9])
  redis.call('SET', keys[8], args[1], 'NX', 'PX', '604800000')
  local rec = id .. pad(398)
  redis.call('HSET', keys[1], 'c', '1', 'a', rec)
  index(keys, id)
  redis.call('SET', keys[5], id .. pad(120), 'PX', '604800000')
  return { 'ok', '1', rec }
end)
redis.register_function('bench_lean_release', function(keys, args)
  local id = args[2]
  redis.call('TIME')
  redis.call('EXISTS', keys[7], keys[6])
  types(keys)
  local rec = redis.call('HGET', keys[1], 'a')
  push_history(keys, id, args[3])
  redis.call('HDEL', keys[1], 'a')
  if args[4] ~= 'deferred' then unindex(keys, id) end
  redis.call('SET', keys[6], id .. pad(120), 'PX', '604800000')
  return { 'ok', '1', rec }
end)
redis.register_function('bench_lean_sweep', function(keys, args)
  local index, expiry = {}, {}
  for i = 1, #args do
    local id = args[i]
    index[#index + 1] = id .. pad(95)
    index[#index + 1] = id .. pad(177)
    index[#index + 1] = id .. pad(135)
    expiry[#expiry + 1] = id .. pad(78)
  end
  redis.call('ZREM', keys[1], unpack(index))
  redis.call('ZREM', keys[2], unpack(expiry))
  return { 'ok' }
end)
`

// contractWrites returns one goroutine's contract-writes op: a pair on
// its own identity with a new lease id and new request ids each time, as
// acquire+release does.
func contractWrites(s *Store) func() error {
	tag := tagOf(lease.KeyPrefix + uid("") + strings.Repeat("x", 27))
	k := s.keys
	histCap := strconv.Itoa(s.opts.HistoryPerIdentity)
	fcall := benchFcall(s)
	return func() error {
		leaseID := "lease_" + ulidLike()
		keys := []string{k.active(tag), k.history(tag), k.index(), k.expiry(), k.idem(tag, digestLike()),
			k.idem(tag, digestLike()), k.gate(), k.counter(tag), k.leaseLookup(leaseID), k.counterFloor()}
		args := []string{tag, leaseID, histCap}
		if err := fcall("bench_acquire_writes", keys, args); err != nil {
			return err
		}
		return fcall("bench_release_writes", keys, args)
	}
}

// benchFcall calls a function of the bench library on s's client.
func benchFcall(s *Store) func(fn string, keys, args []string) error {
	return func(fn string, keys, args []string) error {
		return s.client.Do(bg, s.client.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).Error()
	}
}

// leanWrites returns one goroutine's lean-writes op (lean-deferred if
// deferred): a pair on its own identity, as contractWrites, in the leaner
// layout of bench_lean_acquire; deferred, every 16th pair also sweeps the
// members the last 16 releases left.
func leanWrites(s *Store, deferred bool) func() error {
	tag := tagOf(lease.KeyPrefix + uid("") + strings.Repeat("x", 27))
	k := s.keys
	histCap := strconv.Itoa(s.opts.HistoryPerIdentity)
	mode := ""
	if deferred {
		mode = "deferred"
	}
	fcall := benchFcall(s)
	var swept []string
	return func() error {
		leaseID := "lease_" + ulidLike()
		keys := []string{k.of(tag, "lean"), k.history(tag), k.index(), k.expiry(), k.idem(tag, digestLike()),
			k.idem(tag, digestLike()), k.gate(), k.leaseLookup(leaseID), k.counterFloor()}
		args := []string{tag, leaseID, histCap, mode}
		if err := fcall("bench_lean_acquire", keys, args); err != nil {
			return err
		}
		if err := fcall("bench_lean_release", keys, args); err != nil {
			return err
		}
		if !deferred {
			return nil
		}
		if swept = append(swept, leaseID); len(swept) < 16 {
			return nil
		}
		defer func() { swept = swept[:0] }()
		return fcall("bench_lean_sweep", []string{k.index(), k.expiry()}, swept)
	}
}

// ulidLike is 26 random characters, as long as a lease id's ULID;
// digestLike 43, as long as an evidence key's request digest.
func ulidLike() string   { return strings.ToUpper(uid(""))[:16] + "0123456789" }
func digestLike() string { return strings.Repeat(uid(""), 3)[:43] }
