package benchcmp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/bsm/redislock"
	goredis "github.com/redis/go-redis/v9"
	bbolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

// BenchmarkPeers runs every row below at 1 and 50 goroutines for
// STARLEASE_BENCH_ROW each (default 2s), in STARLEASE_BENCH_ROUNDS rounds
// (default 3), interleaved so each round measures every row within a
// minute of the others, and prints one table: ops/s per round, p50 and p99
// latency of the middle round, the bytes the row's server dirtied on
// disk per op in the middle round, and the goals as ratios taken
// within each round. One op of a pair row is a whole acquire+release (or
// Lock+Unlock, Obtain+Release, put+delete).
//
// Servers: a real redis-server with AOF and appendfsync always (the
// harness's), one etcd member of the version go.mod pins with its default
// fsync, and bbolt files in a temporary directory; all on this machine.
// Every identity is its own (no contention). STARLEASE_BENCH_ONLY, a
// regular expression, keeps only the matching rows (for -cpuprofile).
//
// The benchmark ignores b.N: run it with -benchtime 1x (make bench does).
func BenchmarkPeers(b *testing.B) {
	rowTime := envDuration(b, "STARLEASE_BENCH_ROW", 2*time.Second)
	rounds := envInt(b, "STARLEASE_BENCH_ROUNDS", 3)
	var only *regexp.Regexp
	if v := os.Getenv("STARLEASE_BENCH_ONLY"); v != "" {
		only = regexp.MustCompile(v)
	}
	rows := setupRows(b)
	if only != nil {
		rows = slices.DeleteFunc(rows, func(r row) bool { return !only.MatchString(r.name) })
	}
	concs := []int{1, 50, 64}
	res := newResults()
	// Warm up connections, sessions and the files' first pages, untimed.
	for _, r := range rows {
		if _, err := measure(r, 50, 300*time.Millisecond); err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
	}
	schedule := goalPeersAdjacent(rows)
	for round := 0; round < rounds; round++ {
		for _, conc := range concs {
			for _, r := range schedule {
				if !r.runsAt(conc) {
					continue
				}
				m, err := measure(r, conc, rowTime)
				if err != nil {
					b.Fatalf("%s at %d goroutines: %v", r.name, conc, err)
				}
				res.add(r.name, conc, m)
			}
		}
		fmt.Fprintf(os.Stderr, "round %d of %d done\n", round+1, rounds)
	}
	res.print(os.Stdout, rows, concs, rounds)
}

// peerGoals are the goals: ratios of two rows, each at a
// concurrency.
var peerGoals = []struct {
	what    string
	a       string
	ca      int
	b       string
	cb      int
	atLeast float64
	// atMost, when set, makes the goal an upper bound on b/a (a cost
	// ratio) instead of a lower bound on a/b.
	atMost float64
}{
	{"bolt pairs / etcd Mutex pairs, 50 goroutines", "starlease bolt acquire+release", 50, "etcd Mutex", 50, 1.0, 0},
	{"bolt pairs at 50 / bolt pairs at 1", "starlease bolt acquire+release", 50, "starlease bolt acquire+release", 1, 8.0, 0},
	{"valkey pairs / redislock pairs, 50 goroutines", "starlease valkey acquire+release", 50, "redislock", 50, 0.5, 0},
	{"valkey pairs / redislock pairs, 1 goroutine", "starlease valkey acquire+release", 1, "redislock", 1, 0.8, 0},
	{"valkey pairs / etcd Mutex pairs, 50 goroutines", "starlease valkey acquire+release", 50, "etcd Mutex", 50, 1.5, 0},
	{"serve (HTTP) cost per pair / bolt store's, 64 clients", "starlease serve (HTTP, bolt) acquire+release", 64, "starlease bolt acquire+release", 64, 0, 1.5},
}

// peerFloors are ratios of a row to its floor: what no design of that
// kind gets under on this machine, beside the goal it bounds.
var peerFloors = []struct {
	what  string
	a     string
	ca    int
	b     string
	cb    int
	bound string
}{
	// Costs add: serve's pair is at least the store's and bare HTTP's,
	// so its goal leaves HTTP at most half the store's cost.
	{"bare HTTP cost per pair / bolt store's, 64 clients", "starlease bolt acquire+release", 64, "floor HTTP (net/http, serve's bytes)", 64,
		"serve's goal leaves ≤ 0.5"},
	// A store on bbolt scales from 1 to 50 goroutines no further than
	// bbolt's own writes do.
	{"bbolt put+delete at 50 / at 1", "floor bbolt put+delete", 50, "floor bbolt put+delete", 1,
		"bolt's 50/1 goal asks ≥ 8"},
}

// goalPeersAdjacent is the order rows are measured in within a round: the
// rows of peerGoals and then of peerFloors first, in the order they name
// them, then the others as listed. The goals name their pairs so that each runs back to
// back (bolt, etcd Mutex, valkey, redislock; serve and bolt are the only
// rows at 64): this disk's speed drifts over tens of seconds, and a ratio
// of rows measured a dozen rows apart mostly measured that. The table
// keeps the listed order.
func goalPeersAdjacent(rows []row) []row {
	var names []string
	// A ratio of one row to itself (at two concurrencies) needs no
	// neighbour.
	add := func(a, b string) {
		if a == b {
			return
		}
		for _, n := range []string{a, b} {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	for _, g := range peerGoals {
		add(g.a, g.b)
	}
	for _, f := range peerFloors {
		add(f.a, f.b)
	}
	var first, rest []row
	for _, name := range names {
		if i := slices.IndexFunc(rows, func(r row) bool { return r.name == name }); i >= 0 {
			first = append(first, rows[i])
		}
	}
	for _, r := range rows {
		if !slices.Contains(names, r.name) {
			rest = append(rest, r)
		}
	}
	return append(first, rest...)
}

// row is one measured operation; worker builds goroutine g's op (untimed).
type row struct {
	name   string
	worker func(g int) (func() error, error)
	// concs are the concurrencies the row runs at; nil means 1 and 50.
	concs []int
	// pid is the process that holds the row's data (nil: this one),
	// whose disk writes the row is charged.
	pid func() int
}

// onServer charges rows' disk writes to the process pid returns.
func onServer(rows []row, pid func() int) []row {
	for i := range rows {
		rows[i].pid = pid
	}
	return rows
}

// writtenBytes is the bytes process pid (0: this one) has dirtied in the
// page cache so far (/proc/PID/io write_bytes: counted when a clean page
// turns dirty, so a page rewritten before it reaches the disk counts
// once). It shows how much each design asks of the disk per op. For a
// store that writes pages (bbolt, etcd) it barely moves between runs,
// unlike ops/s; for an append-only file fsynced per write (the AOF) the
// tail page counts once per fsync, so it also follows how many writes
// shared one.
func writtenBytes(pid int) (uint64, error) {
	name := procFile(pid, "io")
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, fmt.Errorf("disk writes per op need %s: %w", name, err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no write_bytes in %s", name)
}

// cpuTime is the CPU (user and system) process pid (0: this one) has used
// so far, from /proc/PID/stat in USER_HZ ticks (100 per second on Linux).
// Beside ops/s, which shows what the machine let a design do, CPU per op
// shows what the design costs (client and server; see rowCPU).
func cpuTime(pid int) (time.Duration, error) {
	name := procFile(pid, "stat")
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, fmt.Errorf("CPU per op needs %s: %w", name, err)
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one (state is field 3, utime 14, stime 15).
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("%s: unexpected format", name)
	}
	var ticks uint64
	for _, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// rowCPU is the CPU this process and the row's server (pid, 0: none)
// have used so far: client and server together, since either may be
// where a design spends.
func rowCPU(pid int) (time.Duration, error) {
	self, err := cpuTime(0)
	if err != nil || pid == 0 {
		return self, err
	}
	server, err := cpuTime(pid)
	return self + server, err
}

// procFile is the /proc file of process pid (0: this one).
func procFile(pid int, file string) string {
	if pid == 0 {
		return "/proc/self/" + file
	}
	return "/proc/" + strconv.Itoa(pid) + "/" + file
}

func (r row) runsAt(conc int) bool {
	if r.concs == nil {
		return conc == 1 || conc == 50
	}
	return slices.Contains(r.concs, conc)
}

var (
	bg    = context.Background()
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
	seq   atomic.Int64
)

// uid is unique within the run and across runs on one server, and of
// one length for the run (its sequence padded to 6 base-36 digits), so
// rows measured later do not store longer ids.
func uid(prefix string) string {
	n := strconv.FormatInt(seq.Add(1), 36)
	return prefix + strconv.FormatInt(time.Now().UnixNano(), 36) + "_" + strings.Repeat("0", max(0, 6-len(n))) + n
}

func storeOptions() lease.StoreOptions {
	classes, err := lease.NewOperationClasses("default")
	if err != nil {
		panic(err)
	}
	return lease.StoreOptions{OperationClasses: classes, Logger: quiet}
}

func identity() lease.Identity {
	return lease.Identity{TenantID: "tenant-bench", ProgramID: "program-bench", TargetNamespace: "starintel-target",
		TargetID: uid("target_"), ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
}

var caller = lease.Caller{PrincipalID: "prn_bench", ClientID: "client_bench", CredentialID: "key_bench"}

func mutation() lease.Mutation {
	return lease.Mutation{RequestID: uid("req_"), DeadlineAt: time.Now().Add(30 * time.Second), Caller: caller}
}

func acquireReq(id lease.Identity) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance_bench", TTL: 30 * time.Second,
		MaximumLifetime: lease.MaxLifetime, ExecutionID: uid("execution_"), JobID: uid("job_"),
		Mutation: mutation()}
}

func releaseReq(r *lease.Record) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: mutation()}
}

// storeRows are the contract's operations on one starlease store.
// operations is what storeRows calls: a lease.Store, or the HTTP client's
// LeaseStore.
type operations interface {
	Acquire(context.Context, lease.AcquireRequest) (lease.Result, error)
	Renew(context.Context, lease.RenewRequest) (lease.Result, error)
	Release(context.Context, lease.ReleaseRequest) (lease.Result, error)
	Inspect(context.Context, lease.InspectRequest) (lease.Result, error)
	AuthorizeCommit(context.Context, lease.CommitRequest) (lease.CommitResult, error)
}

func storeRows(system string, s operations, extra bool) []row {
	hold := func() (*lease.Record, error) {
		a, err := s.Acquire(bg, acquireReq(identity()))
		if err != nil {
			return nil, err
		}
		return a.Lease, nil
	}
	rows := []row{{name: system + " acquire+release", worker: func(int) (func() error, error) {
		id := identity()
		return func() error {
			a, err := s.Acquire(bg, acquireReq(id))
			if err != nil {
				return err
			}
			_, err = s.Release(bg, releaseReq(a.Lease))
			return err
		}, nil
	}}}
	if !extra {
		return rows
	}
	return append(rows,
		row{name: system + " renew", worker: func(int) (func() error, error) {
			l, err := hold()
			return func() error {
				_, err := s.Renew(bg, lease.RenewRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
					ServiceInstanceID: l.ServiceInstanceID, Mutation: mutation()})
				return err
			}, err
		}},
		row{name: system + " authorize-commit", worker: func(int) (func() error, error) {
			l, err := hold()
			return func() error {
				_, err := s.AuthorizeCommit(bg, lease.CommitRequest{Identity: l.Identity(), LeaseID: l.LeaseID,
					FencingToken: l.FencingToken, ServiceInstanceID: l.ServiceInstanceID, Sink: "couchdb",
					CommitID: uid("commit_"), ExecutionID: l.ExecutionID, JobID: l.JobID, Target: uid("doc:"),
					DeadlineAt: time.Now().Add(30 * time.Second), Caller: caller})
				return err
			}, err
		}},
		row{name: system + " inspect", worker: func(int) (func() error, error) {
			l, err := hold()
			return func() error {
				_, err := s.Inspect(bg, lease.InspectRequest{Identity: l.Identity(), DeadlineAt: time.Now().Add(30 * time.Second)})
				return err
			}, err
		}},
	)
}

// serveRows runs starlease serve on its default backend (bolt, with its
// file audit sink) with policy limits out of the way, and measures pairs
// through the Go client over loopback HTTP: what the adapter, the service
// and the audit add to the store's own cost; then that pair's bytes over
// bare net/http (httpFloorRow), what HTTP alone adds.
func serveRows(b *testing.B) []row {
	srv := testenv.StartStarlease(b, testenv.BuildStarlease(b), "--principal-rate", "1000000", "--target-rate", "1000000", "--max-lifetime", lease.MaxLifetime.String(),
		"--max-concurrent", "4096", "--max-active-per-principal", "100000")
	key, _ := srv.CreateKey(caller.PrincipalID, "service_instance", "targets:lease,targets:read", "tenant:*,program:*")
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	c, err := client.New(srv.URL(), key, client.WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	rows := onServer(storeRows("starlease serve (HTTP, bolt)", c.LeaseStore(caller.PrincipalID), false), srv.Pid)
	rows[0].concs = []int{1, 50, 64}
	// One pair's bytes, for the floor.
	rec := &recorder{next: hc.Transport}
	rc, err := client.New(srv.URL(), key, client.WithHTTPClient(&http.Client{Transport: rec}))
	if err != nil {
		b.Fatal(err)
	}
	ls := rc.LeaseStore(caller.PrincipalID)
	a, err := ls.Acquire(bg, acquireReq(identity()))
	if err == nil {
		_, err = ls.Release(bg, releaseReq(a.Lease))
	}
	if err != nil || len(rec.got) != 2 {
		b.Fatalf("recording one pair through serve: %v (%d exchanges)", err, len(rec.got))
	}
	return append(rows, httpFloorRow(b, rec.got))
}

// setupRows starts the servers and opens every system.
func setupRows(b *testing.B) []row {
	dir := b.TempDir()

	boltStore, err := bolt.Open(filepath.Join(dir, "starlease.db"), bolt.Options{StoreOptions: storeOptions()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { boltStore.Close() })
	// The store's page size, so the floor is like for like.
	floorDB, err := bbolt.Open(filepath.Join(dir, "floor.db"), 0o600, &bbolt.Options{PageSize: bolt.PageSize})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { floorDB.Close() })
	floorDB.MaxBatchDelay = 2 * time.Millisecond
	if err := floorDB.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("k")); return err }); err != nil {
		b.Fatal(err)
	}

	redis := testenv.StartRedis(b)
	// The namespace switched to format 3, compact evidence, history and
	// records, as a deployment runs once every instance has this build.
	// Not format 6: its releases on an identity with a full history
	// rewrite the evidence the trimmed entry refers to, which every
	// release here does; with EagerDetach it writes that evidence whole at
	// once, which costs less but still more than format 3.
	valkeyStore, err := valkey.Open(bg, valkey.Options{Addr: redis.Addr(), StoreOptions: storeOptions(), CompactRecords: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { valkeyStore.Close() })
	rdb := goredis.NewClient(&goredis.Options{Addr: redis.Addr(), PoolSize: 64, Protocol: 3})
	b.Cleanup(func() { rdb.Close() })
	locks := redislock.New(rdb)

	cluster := testenv.StartEtcdCluster(b, 1)
	cli := cluster.Client()
	etcdStore, err := etcd.Open(bg, etcd.Options{Endpoints: cluster.Endpoints(), StoreOptions: storeOptions()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { etcdStore.Close() })

	rows := storeRows("starlease bolt", boltStore, true)
	rows[0].concs = []int{1, 50, 64}
	rows = append(rows, serveRows(b)...)
	// As the store does: a transaction of its own when alone, shared
	// through Batch (one fsync) when others are in flight.
	var floorInflight atomic.Int64
	floorTx := func(fn func(*bbolt.Tx) error) error {
		defer floorInflight.Add(-1)
		if floorInflight.Add(1) == 1 {
			return floorDB.Update(fn)
		}
		return floorDB.Batch(fn)
	}
	rows = append(rows, row{name: "floor bbolt put+delete", worker: func(int) (func() error, error) {
		key := []byte(uid("floor_"))
		return func() error {
			if err := floorTx(func(t *bbolt.Tx) error { return t.Bucket([]byte("k")).Put(key, []byte("held")) }); err != nil {
				return err
			}
			return floorTx(func(t *bbolt.Tx) error { return t.Bucket([]byte("k")).Delete(key) })
		}, nil
	}})
	rows = append(rows, onServer(append(storeRows("starlease valkey", valkeyStore, true),
		row{name: "redislock", worker: func(g int) (func() error, error) {
			key := uid("bench:redislock:")
			return func() error {
				l, err := locks.Obtain(bg, key, 30*time.Second, nil)
				if err != nil {
					return err
				}
				return l.Release(bg)
			}, nil
		}},
		row{name: "floor valkey SET+DEL", worker: func(g int) (func() error, error) {
			key := uid("bench:floor:")
			return func() error {
				if err := rdb.Set(bg, key, "held", 30*time.Second).Err(); err != nil {
					return err
				}
				return rdb.Del(bg, key).Err()
			}, nil
		}},
	), redis.Pid)...)
	rows = append(rows, onServer(append(storeRows("starlease etcd", etcdStore, false),
		row{name: "etcd Mutex", worker: func(g int) (func() error, error) {
			sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
			if err != nil {
				return nil, err
			}
			b.Cleanup(func() { sess.Close() })
			m := concurrency.NewMutex(sess, uid("bench/mutex/"))
			return func() error {
				if err := m.Lock(bg); err != nil {
					return err
				}
				return m.Unlock(bg)
			}, nil
		}},
		row{name: "floor etcd put+delete", worker: func(g int) (func() error, error) {
			key := uid("bench/floor/")
			return func() error {
				if _, err := cli.Put(bg, key, "held"); err != nil {
					return err
				}
				_, err := cli.Delete(bg, key)
				return err
			}, nil
		}},
	), cluster.Member(0).Pid)...)
	return rows
}

// measurement is one row at one concurrency in one round.
type measurement struct {
	ops       int
	opsPerSec float64
	p50, p99  time.Duration
	diskPerOp float64       // bytes dirtied by the row's server per op
	cpuPerOp  time.Duration // CPU of this process and the row's server per op
}

// measure runs conc goroutines, each with its own op from r.worker, for d.
func measure(r row, conc int, d time.Duration) (measurement, error) {
	ops := make([]func() error, conc)
	for g := range ops {
		op, err := r.worker(g)
		if err != nil {
			return measurement{}, err
		}
		ops[g] = op
	}
	pid := 0
	if r.pid != nil {
		// 0 here is a server not running, not this process.
		if pid = r.pid(); pid == 0 {
			return measurement{}, fmt.Errorf("%s: its server is not running", r.name)
		}
	}
	written, err := writtenBytes(pid)
	if err != nil {
		return measurement{}, err
	}
	cpu, err := rowCPU(pid)
	if err != nil {
		return measurement{}, err
	}
	lat := make([][]time.Duration, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for g := range ops {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				if err := ops[g](); err != nil {
					errs[g] = err
					return
				}
				lat[g] = append(lat[g], time.Since(t0))
			}
		}(g)
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := writtenBytes(pid)
	if err != nil {
		return measurement{}, err
	}
	cpuAfter, err := rowCPU(pid)
	if err != nil {
		return measurement{}, err
	}
	for _, err := range errs {
		if err != nil {
			return measurement{}, err
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return measurement{}, fmt.Errorf("no op finished in %v", d)
	}
	q := func(p float64) time.Duration { return all[min(len(all)-1, int(math.Ceil(p*float64(len(all))))-1)] }
	return measurement{ops: len(all), opsPerSec: float64(len(all)) / elapsed.Seconds(), p50: q(0.50), p99: q(0.99),
		diskPerOp: float64(after-written) / float64(len(all)), cpuPerOp: (cpuAfter - cpu) / time.Duration(len(all))}, nil
}

type results struct {
	m map[string][]measurement
}

func newResults() *results { return &results{m: map[string][]measurement{}} }

func key(name string, conc int) string { return name + "@" + strconv.Itoa(conc) }

func (r *results) add(name string, conc int, m measurement) {
	r.m[key(name, conc)] = append(r.m[key(name, conc)], m)
}

// ratio is a/b in each round (0 where either is missing).
func (r *results) ratio(a string, ca int, bName string, cb int, rounds int) []float64 {
	x, y := r.m[key(a, ca)], r.m[key(bName, cb)]
	out := make([]float64, 0, rounds)
	for i := 0; i < rounds && i < len(x) && i < len(y); i++ {
		out = append(out, x[i].opsPerSec/y[i].opsPerSec)
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func (r *results) print(out io.Writer, rows []row, concs []int, rounds int) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "system / operation\tgoroutines\tops/s per round\tmedian\tp50 ms\tp99 ms\tdisk KB/op\tCPU µs/op\t\n")
	for _, conc := range concs {
		for _, rw := range rows {
			ms := r.m[key(rw.name, conc)]
			if len(ms) == 0 {
				continue
			}
			per := make([]string, len(ms))
			vals := make([]float64, len(ms))
			for i, m := range ms {
				per[i] = fmt.Sprintf("%.0f", m.opsPerSec)
				vals[i] = m.opsPerSec
			}
			mid := ms[len(ms)/2]
			fmt.Fprintf(w, "%s\t%d\t%s\t%.0f\t%.2f\t%.2f\t%.1f\t%.0f\t\n", rw.name, conc, strings.Join(per, " / "), median(vals),
				float64(mid.p50.Microseconds())/1000, float64(mid.p99.Microseconds())/1000, mid.diskPerOp/1000,
				float64(mid.cpuPerOp.Nanoseconds())/1000)
		}
	}
	w.Flush()
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "goal\tper round\tmedian\tgoal\tmet\t\n")
	for _, g := range peerGoals {
		v := r.ratio(g.a, g.ca, g.b, g.cb, rounds)
		if len(v) == 0 {
			continue
		}
		bound, ok := fmt.Sprintf("≥ %.1f", g.atLeast), func(x float64) bool { return x >= g.atLeast }
		if g.atMost > 0 {
			for i := range v {
				v[i] = 1 / v[i] // a's cost over b's
			}
			bound, ok = fmt.Sprintf("≤ %.1f", g.atMost), func(x float64) bool { return x <= g.atMost }
		}
		met := "yes"
		if slices.ContainsFunc(v, func(x float64) bool { return !ok(x) }) {
			met = "no"
			if ok(median(v)) {
				met = "median only"
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%s\t%s\t\n", g.what, perRound(v), median(v), bound, met)
	}
	w.Flush()
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "floor\tper round\tmedian\tbound\t\n")
	for _, f := range peerFloors {
		v := r.ratio(f.a, f.ca, f.b, f.cb, rounds)
		if len(v) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%s\t\n", f.what, perRound(v), median(v), f.bound)
	}
	w.Flush()
}

// perRound is a ratio's value in each round, as the tables print it.
func perRound(v []float64) string {
	per := make([]string, len(v))
	for i, x := range v {
		per[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(per, " / ")
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration", name, v)
	}
	return d
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// The measuring order keeps every row once and puts each goal's rows back
// to back.
func TestGoalPeersAdjacent(t *testing.T) {
	var rows []row
	for _, n := range []string{"starlease bolt acquire+release", "starlease bolt renew", "starlease serve (HTTP, bolt) acquire+release",
		"floor bbolt put+delete", "starlease valkey acquire+release", "redislock", "starlease etcd acquire+release", "etcd Mutex"} {
		rows = append(rows, row{name: n})
	}
	got := goalPeersAdjacent(rows)
	var names []string
	for _, r := range got {
		names = append(names, r.name)
	}
	want := []string{"starlease bolt acquire+release", "etcd Mutex", "starlease valkey acquire+release", "redislock",
		"starlease serve (HTTP, bolt) acquire+release", "starlease bolt renew", "floor bbolt put+delete", "starlease etcd acquire+release"}
	if !slices.Equal(names, want) {
		t.Fatalf("measuring order %q, want %q", names, want)
	}
	// STARLEASE_BENCH_ONLY may leave some goal rows out.
	if got := goalPeersAdjacent(rows[:2]); len(got) != 2 || got[0].name != rows[0].name || got[1].name != rows[1].name {
		t.Fatalf("order of a filtered table: %v", got)
	}
}

// writtenBytes counts what a write and its fsync dirtied, in this process
// and in another one.
func TestWrittenBytes(t *testing.T) {
	before, err := writtenBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "written"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 256<<10)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	after, err := writtenBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 256<<10 {
		t.Fatalf("write_bytes grew by %d after a 256 KiB write and fsync, want at least 256 KiB", after-before)
	}
	dir := t.TempDir()
	// A process's counter takes in its children's once it has reaped
	// them: sh's includes head's after head exits.
	childReaches(t, "head -c 131072 /dev/zero > "+filepath.Join(dir, "child")+" && sync && sleep 30", writtenBytes, 128<<10)
}

// childReaches starts sh running script and waits up to 10 s for
// read(its pid) to reach want; the child is killed when the test ends.
func childReaches[T int64 | uint64 | time.Duration](t *testing.T, script string, read func(pid int) (T, error), want T) int {
	t.Helper()
	child := exec.Command("sh", "-c", script)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := read(child.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if n >= want {
			return child.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child of %q stayed at %v for 10 s, want at least %v", script, n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cpuTime counts CPU spent, in this process and in another one.
func TestCPUTime(t *testing.T) {
	// The busy loop runs until the kernel's other account of this
	// process's CPU (getrusage) has grown by 300 ms: on a busy machine a
	// loop of 300 ms of wall time may get far less CPU than that.
	used := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, err := cpuTime(0)
	if err != nil {
		t.Fatal(err)
	}
	start, deadline := used(), time.Now().Add(time.Minute)
	for used()-start < 300*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("this process got %v of CPU in a minute of busy looping", used()-start)
		}
	}
	after, err := cpuTime(0)
	if err != nil {
		t.Fatal(err)
	}
	// Both count the same CPU; /proc in ticks of 10 ms, and other
	// goroutines may add to it.
	if after-before < 250*time.Millisecond {
		t.Fatalf("CPU grew by %v while getrusage counted 300 ms, want at least 250 ms", after-before)
	}
	pid := childReaches(t, "while :; do :; done", cpuTime, 100*time.Millisecond)
	both, err := rowCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if both < after+100*time.Millisecond {
		t.Fatalf("this process and the child together: %v, want at least this process's %v and the child's 100 ms", both, after)
	}
}
