package etcd

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// BenchmarkLease measures, in one run on one harness cluster (three
// members, each fsyncing its WAL), at 1 and 50 concurrent callers, each
// goroutine on its own identity or key (no contention):
//
//	floor-get        one linearizable Get of one key: the floor of a read
//	floor            one Put then one Delete of one key (a few bytes): the
//	                 floor of a pair of writes; one op = one pair
//	mutex            concurrency.Mutex Lock then Unlock, one session per
//	                 goroutine (a Txn and a Delete; no fencing, no
//	                 idempotency); one op = one pair
//	reads-only       the read transactions of one acquire+release pair,
//	                 recorded from the store and replayed; one op = one pair
//	writes-only      the write transactions of one acquire+release pair,
//	                 recorded and replayed without the reads before them
//	                 (same keys, values and number of compares; each
//	                 compare made to hold); one op = one pair
//	acquire+release  one Acquire then one Release; one op = one pair
//	renew            Renew of a held lease
//	authorize-commit AuthorizeCommit of a held lease, a new commit id each
//	                 time
//	inspect          Inspect by identity of a held lease
//
// reads-only and writes-only split a pair's cost between its round trips.
// What acquire+release costs beyond their sum is the store's own work, and
// the wait of each of its reads for the member serving it to have applied
// the write just before (replayed reads follow no write, so never wait).
//
// Each reports ops/s (pairs/s for pairs) and cost ratios against the
// floors measured in the same run at the same concurrency: x_floor, the
// cost of an op over its floor's (a pair over a floor pair, a single write
// over half a floor pair, a read over a floor-get), and for pairs x_mutex,
// the cost over a mutex pair's. The goal is acquire+release at
// x_floor <= 1.5 and x_mutex < 1.
//
// Diagnostics, over the timed part only: rpcs/op the unary RPCs the client
// sent (retries of a lost compare included; the store's clock beat, a Put
// and a Get a second on the same client, adds a little), reads/op those
// that only read (a Range, or a Txn of ranges without compares: etcd
// serves them with a ReadIndex, no raft proposal), writes/op those that
// propose, req_B/op the bytes of their requests; fsync/op the leader's WAL
// fsyncs (below 1 per write when raft batches) and fsync_us their mean
// duration; srv_cpu_us/op the CPU time of the three members, cli_cpu_us/op
// that of this process (the store, the client, and the harness's peer
// proxies, which relay the members' raft traffic); other_cores the CPU
// other processes of the machine used meanwhile, in cores (a busy machine
// makes the run noisy); and leader_changes, only when the leader changed
// during the measurement.
//
// Measured one after the other, a floor and acquire+release can be a
// minute apart, and on a shared machine the load changes in a minute. So
// the last sub-benchmark, summary, measures every operation again at 1 and
// 50 goroutines interleaved: rounds in which each takes a turn of a
// fraction of -benchtime or three op latencies, whichever is longer (ops
// counted once every goroutine has finished one, so no turn measures its
// ramp), in a rotating order, so that all see the same load. It prints the
// table of ratios, with rpcs/op and the CPU per op of the same turns, and
// reports the ratios of acquire+release as x_floor_g1, x_mutex_g1,
// x_floor_g50 and x_mutex_g50.
//
// The store's reaper is off (nothing expires during the run) and the
// cluster's revision history is compacted before each sub-benchmark (and
// before each concurrency of the summary), so none pays for the history of
// the previous ones.
func BenchmarkLease(b *testing.B) {
	c := testenv.StartEtcdCluster(b, 3)
	rt := &rpcCounter{}
	cli := benchClient(b, c, rt)
	o := leasetest.StoreOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s := open(b, c, Options{Client: cli, ReapInterval: -1, StoreOptions: o})
	env := &benchEnv{c: c, cli: cli, rt: rt, s: s, scratch: "bench-" + randomPrefix() + "/"}

	res := &benchResults{m: map[string]benchMeasure{}}
	for _, conc := range []int{1, 50} {
		for _, bm := range env.benches() {
			b.Run(fmt.Sprintf("%s/goroutines=%d", bm.name, conc), func(b *testing.B) {
				m := env.run(b, conc, bm.worker)
				res.set(bm, conc, m)
				unit := "ops/s"
				if bm.pair {
					unit = "pairs/s"
				}
				b.ReportMetric(m.ops, unit)
				if x := res.xFloor(bm, conc); x > 0 {
					b.ReportMetric(x, "x_floor")
				}
				if x := res.xMutex(bm, conc); x > 0 {
					b.ReportMetric(x, "x_mutex")
				}
			})
		}
	}
	b.Run("summary", func(b *testing.B) {
		turn := summaryTurn()
		tab := &benchResults{m: map[string]benchMeasure{}}
		for _, conc := range []int{1, 50} {
			env.interleave(b, conc, env.benches(), summaryRounds, turn, tab)
		}
		tab.print(os.Stdout)
		for _, conc := range []int{1, 50} {
			pair := leaseBench{name: "acquire+release", pair: true}
			b.ReportMetric(tab.xFloor(pair, conc), "x_floor_g"+strconv.Itoa(conc))
			b.ReportMetric(tab.xMutex(pair, conc), "x_mutex_g"+strconv.Itoa(conc))
		}
	})
}

// summaryRounds is how many turns each operation takes in the summary.
const summaryRounds = 4

// summaryTurn is the length of one turn of the summary: a fifth of
// -benchtime, from 100 ms to 1 s (400 ms when -benchtime is a count).
func summaryTurn() time.Duration {
	d := 2 * time.Second
	if f := flag.Lookup("test.benchtime"); f != nil {
		if v, err := time.ParseDuration(f.Value.String()); err == nil {
			d = v
		}
	}
	return min(max(d/5, 100*time.Millisecond), time.Second)
}

// interleave measures benches at conc goroutines in rounds: in each round
// every bench takes one turn, the first in turn r being bench r (mod the
// count). A turn starts the bench's goroutines, waits until each has
// finished one op (at most 10 s), then counts the ops that finish within
// the next turn long, or three times that wait if longer; the goroutines
// then stop after their current op. Its results go to tab.
func (e *benchEnv) interleave(b *testing.B, conc int, benches []leaseBench, rounds int, turn time.Duration, tab *benchResults) {
	ops := make([][]func() error, len(benches))
	for i, bm := range benches {
		for g := 0; g < conc; g++ {
			op, done := bm.worker(b, g)
			ops[i] = append(ops[i], op)
			if done != nil {
				defer done()
			}
		}
	}
	e.compact(b)
	type total struct {
		n, rpcs                 int64
		window                  time.Duration
		srvCPU, cliCPU, busyCPU time.Duration
	}
	totals := make([]total, len(benches))
	for r := 0; r < rounds; r++ {
		for k := range benches {
			i := (r + k) % len(benches)
			var phase atomic.Int32 // 0 warming up, 1 counting, 2 stopping
			var started, counted atomic.Int64
			var firstErr atomic.Pointer[error]
			var wg sync.WaitGroup
			for g := 0; g < conc; g++ {
				wg.Add(1)
				go func(op func() error) {
					defer wg.Done()
					for first := true; phase.Load() < 2; first = false {
						if err := op(); err != nil {
							firstErr.CompareAndSwap(nil, &err)
							phase.Store(2)
							return
						}
						if phase.Load() == 1 {
							counted.Add(1)
						}
						if first {
							started.Add(1)
						}
					}
				}(ops[i][g])
			}
			warm := time.Now()
			for limit := warm.Add(10 * time.Second); started.Load() < int64(conc) && phase.Load() == 0 && time.Now().Before(limit); {
				time.Sleep(time.Millisecond)
			}
			// No member metrics here: a turn's samples must be quick, as
			// the ops go on meanwhile.
			before := e.sample(b, -1)
			phase.CompareAndSwap(0, 1)
			// The count is exact only at the edges' mercy: a turn lasts at
			// least three op latencies (the warm-up is one).
			time.Sleep(max(turn, 3*before.at.Sub(warm)))
			after := e.sample(b, -1)
			phase.Store(2)
			wg.Wait()
			if p := firstErr.Load(); p != nil {
				b.Fatalf("%s: op failed: %v", benches[i].name, *p)
			}
			t := &totals[i]
			t.n += counted.Load()
			t.window += after.at.Sub(before.at)
			t.rpcs += after.rpcs - before.rpcs
			t.srvCPU += after.srvCPU - before.srvCPU
			t.cliCPU += after.cliCPU - before.cliCPU
			t.busyCPU += after.busy - before.busy
		}
	}
	for i, bm := range benches {
		t := totals[i]
		if t.n == 0 || t.window <= 0 {
			continue
		}
		n := float64(t.n)
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / n }
		tab.set(bm, conc, benchMeasure{ops: n / t.window.Seconds(), rpcs: float64(t.rpcs) / n,
			srvCPU: us(t.srvCPU), cliCPU: us(t.cliCPU),
			otherCores: max(float64(t.busyCPU-t.srvCPU-t.cliCPU)/float64(t.window), 0)})
	}
}

// benchEnv is what every measurement shares: one cluster, one client (the
// store's), one store.
type benchEnv struct {
	c       *testenv.EtcdCluster
	cli     *clientv3.Client
	rt      *rpcCounter
	s       *Store
	scratch string // key prefix of the floors and the mutexes
}

// leaseBench is one measured operation.
type leaseBench struct {
	name string
	// pair: one op is two operations (a floor pair is the unit of cost);
	// read: its floor is floor-get.
	pair, read bool
	// worker prepares goroutine g's state (untimed) and returns its op and
	// what to undo after the run (nil for nothing).
	worker func(b testing.TB, g int) (op func() error, done func())
}

var benchCtx = context.Background()

func (e *benchEnv) benches() []leaseBench {
	s := e.s
	hold := func(b testing.TB) *lease.Record {
		a, err := s.Acquire(benchCtx, benchAcquire(benchIdentity()))
		if err != nil {
			b.Fatal(err)
		}
		return a.Lease
	}
	return []leaseBench{
		{name: "floor-get", read: true, worker: func(_ testing.TB, g int) (func() error, func()) {
			key := e.scratch + "get/" + strconv.Itoa(g)
			return func() error { _, err := e.cli.Get(benchCtx, key); return err }, nil
		}},
		{name: "floor", pair: true, worker: func(_ testing.TB, g int) (func() error, func()) {
			key := e.scratch + "floor/" + strconv.Itoa(g)
			return func() error {
				if _, err := e.cli.Put(benchCtx, key, "x"); err != nil {
					return err
				}
				_, err := e.cli.Delete(benchCtx, key)
				return err
			}, nil
		}},
		{name: "mutex", pair: true, worker: func(b testing.TB, g int) (func() error, func()) {
			sess, err := concurrency.NewSession(e.cli, concurrency.WithTTL(60))
			if err != nil {
				b.Fatal(err)
			}
			m := concurrency.NewMutex(sess, e.scratch+"mutex/"+randomPrefix()+"/"+strconv.Itoa(g))
			return func() error {
				if err := m.Lock(benchCtx); err != nil {
					return err
				}
				return m.Unlock(benchCtx)
			}, func() { _ = sess.Close() }
		}},
		{name: "reads-only", pair: true, worker: func(b testing.TB, _ int) (func() error, func()) {
			return e.replayPair(b, false), nil
		}},
		{name: "writes-only", pair: true, worker: func(b testing.TB, _ int) (func() error, func()) {
			return e.replayPair(b, true), nil
		}},
		{name: "acquire+release", pair: true, worker: func(testing.TB, int) (func() error, func()) {
			id := benchIdentity()
			return func() error {
				a, err := s.Acquire(benchCtx, benchAcquire(id))
				if err != nil {
					return err
				}
				_, err = s.Release(benchCtx, benchRelease(a.Lease))
				return err
			}, nil
		}},
		{name: "renew", worker: func(b testing.TB, _ int) (func() error, func()) {
			l := hold(b)
			return func() error { _, err := s.Renew(benchCtx, benchRenew(l)); return err }, nil
		}},
		{name: "authorize-commit", worker: func(b testing.TB, _ int) (func() error, func()) {
			l := hold(b)
			return func() error { _, err := s.AuthorizeCommit(benchCtx, benchCommit(l)); return err }, nil
		}},
		{name: "inspect", read: true, worker: func(b testing.TB, _ int) (func() error, func()) {
			id := hold(b).Identity()
			return func() error {
				_, err := s.Inspect(benchCtx, lease.InspectRequest{Identity: id, DeadlineAt: time.Now().Add(time.Minute)})
				return err
			}, nil
		}},
	}
}

// replayPair records the transactions of one acquire+release pair on a
// new identity, the write transactions (writes) or the read ones, and
// returns an op that sends them again, in order. A write's compares are
// kept on their keys, made to hold (mod revision > -1), so the server
// evaluates as many; a read reads the same keys at the newest revision.
func (e *benchEnv) replayPair(b testing.TB, writes bool) func() error {
	var recorded []*pb.TxnRequest
	e.rt.record(func(r *pb.TxnRequest) {
		if txnReadOnly(r) != writes {
			recorded = append(recorded, proto.Clone(r).(*pb.TxnRequest))
		}
	})
	a, err := e.s.Acquire(benchCtx, benchAcquire(benchIdentity()))
	if err == nil {
		_, err = e.s.Release(benchCtx, benchRelease(a.Lease))
	}
	e.rt.record(nil)
	if err != nil {
		b.Fatal(err)
	}
	if len(recorded) != 2 {
		b.Fatalf("recorded %d transactions of a pair (writes: %v), want 2", len(recorded), writes)
	}
	type replayTxn struct {
		cmps []clientv3.Cmp
		ops  []clientv3.Op
	}
	var replay []replayTxn
	for _, r := range recorded {
		var t replayTxn
		for _, c := range r.Compare {
			t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(string(c.Key)), ">", -1))
		}
		for _, op := range r.Success {
			if g := op.GetRequestRange(); g != nil && len(g.RangeEnd) == 0 {
				t.ops = append(t.ops, clientv3.OpGet(string(g.Key)))
			} else if p := op.GetRequestPut(); p != nil {
				t.ops = append(t.ops, clientv3.OpPut(string(p.Key), string(p.Value)))
			} else if d := op.GetRequestDeleteRange(); d != nil && len(d.RangeEnd) == 0 {
				t.ops = append(t.ops, clientv3.OpDelete(string(d.Key)))
			} else {
				b.Fatalf("unexpected op in a recorded transaction: %v", op)
			}
		}
		replay = append(replay, t)
	}
	return func() error {
		for _, t := range replay {
			r, err := e.cli.Txn(benchCtx).If(t.cmps...).Then(t.ops...).Commit()
			if err != nil {
				return err
			}
			if !r.Succeeded {
				return fmt.Errorf("replayed transaction did not succeed")
			}
		}
		return nil
	}
}

// benchMeasure is one measurement: ops/s and the diagnostics per op.
type benchMeasure struct {
	ops                              float64
	rpcs, srvCPU, cliCPU, otherCores float64
}

// run runs b.N ops on conc goroutines (each with its own state from
// worker) and returns ops per second, reporting the diagnostics.
func (e *benchEnv) run(b *testing.B, conc int, worker func(testing.TB, int) (func() error, func())) benchMeasure {
	ops := make([]func() error, conc)
	for g := range ops {
		op, done := worker(b, g)
		ops[g] = op
		if done != nil {
			defer done()
		}
	}
	e.compact(b)
	leader := e.c.Leader()
	before := e.sample(b, leader)
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
	after := e.sample(b, leader)
	n := float64(b.N)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / n }
	m := benchMeasure{ops: n / elapsed.Seconds(), rpcs: float64(after.rpcs-before.rpcs) / n,
		srvCPU: us(after.srvCPU - before.srvCPU), cliCPU: us(after.cliCPU - before.cliCPU)}
	if wall := after.at.Sub(before.at); wall > 0 {
		other := (after.busy - before.busy) - (after.srvCPU - before.srvCPU) - (after.cliCPU - before.cliCPU)
		m.otherCores = max(float64(other)/float64(wall), 0)
	}
	b.ReportMetric(m.rpcs, "rpcs/op")
	b.ReportMetric(float64(after.reads-before.reads)/n, "reads/op")
	b.ReportMetric(float64(after.writes-before.writes)/n, "writes/op")
	b.ReportMetric(float64(after.reqBytes-before.reqBytes)/n, "req_B/op")
	b.ReportMetric(float64(after.fsyncs-before.fsyncs)/n, "fsync/op")
	if f := after.fsyncs - before.fsyncs; f > 0 {
		b.ReportMetric(float64(after.fsyncTime-before.fsyncTime)/float64(time.Microsecond)/float64(f), "fsync_us")
	}
	b.ReportMetric(m.srvCPU, "srv_cpu_us/op")
	b.ReportMetric(m.cliCPU, "cli_cpu_us/op")
	b.ReportMetric(m.otherCores, "other_cores")
	if n := after.leaderChanges - before.leaderChanges; n > 0 || e.c.Leader() != leader {
		// An election during the run: its ops waited for it.
		b.Logf("the etcd leader changed during the measurement (%d changes seen by the old leader)", n)
		b.ReportMetric(float64(max(n, 1)), "leader_changes")
	}
	return m
}

// compact discards the cluster's revision history up to now and waits
// until the members have reclaimed it.
func (e *benchEnv) compact(b *testing.B) {
	ctx, cancel := context.WithTimeout(benchCtx, time.Minute)
	defer cancel()
	r, err := e.cli.Get(ctx, e.scratch+"compact")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.cli.Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil &&
		!strings.Contains(err.Error(), "compacted") {
		b.Fatal(err)
	}
}

// benchSample is the counters at one instant.
type benchSample struct {
	at                            time.Time
	rpcs, reads, writes, reqBytes int64
	fsyncs, leaderChanges         int64
	fsyncTime                     time.Duration
	// srvCPU, cliCPU: CPU time of the members and of this process; busy:
	// of the whole machine.
	srvCPU, cliCPU, busy time.Duration
}

func (e *benchEnv) sample(b *testing.B, leader int) benchSample {
	st := benchSample{at: time.Now(), busy: machineBusy(), rpcs: e.rt.rpcs.Load(), reads: e.rt.reads.Load(), writes: e.rt.writes.Load(), reqBytes: e.rt.bytes.Load()}
	for i := 0; i < e.c.Size(); i++ {
		st.srvCPU += procCPU(e.c.Member(i).Pid())
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		st.cliCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if leader >= 0 {
		st.fsyncs, st.fsyncTime, st.leaderChanges = memberMetrics(b, e.c.Member(leader).ClientURL())
	}
	return st
}

// procCPU is the user+system CPU time of process pid (0 if unknown).
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces): state is field 3,
	// utime 14, stime 15.
	_, rest, ok := strings.Cut(string(raw), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / userHZ
}

// machineBusy is the CPU time all processes of the machine have used (0
// if unknown): /proc/stat's first line, every column but idle and iowait.
func machineBusy() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// userHZ is the unit of /proc's CPU times on Linux.
const userHZ = 100

// memberMetrics reads a member's count of WAL fsyncs and their total
// duration, and its count of the leader changes it has seen.
func memberMetrics(b *testing.B, url string) (fsyncs int64, fsyncTime time.Duration, leaderChanges int64) {
	r, err := http.Get(url + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseFloat(v, 64)
		switch name {
		case "etcd_disk_wal_fsync_duration_seconds_count":
			fsyncs = int64(n)
		case "etcd_disk_wal_fsync_duration_seconds_sum":
			fsyncTime = time.Duration(n * float64(time.Second))
		case "etcd_server_leader_changes_seen_total":
			leaderChanges = int64(n)
		}
	}
	return fsyncs, fsyncTime, leaderChanges
}

// rpcCounter counts the unary RPCs of a client, by kind, and can hand
// every transaction request to a recorder.
type rpcCounter struct {
	rpcs, reads, writes, bytes atomic.Int64
	recorder                   atomic.Pointer[func(*pb.TxnRequest)]
}

// record hands every transaction request to f from now on (nil: stop).
// The recorder runs on the caller's goroutine, before the request is sent.
func (c *rpcCounter) record(f func(*pb.TxnRequest)) {
	if f == nil {
		c.recorder.Store(nil)
		return
	}
	c.recorder.Store(&f)
}

func (c *rpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.rpcs.Add(1)
	if m, ok := req.(proto.Message); ok {
		c.bytes.Add(int64(proto.Size(m)))
	}
	switch r := req.(type) {
	case *pb.RangeRequest:
		c.reads.Add(1)
	case *pb.PutRequest, *pb.DeleteRangeRequest:
		c.writes.Add(1)
	case *pb.TxnRequest:
		if txnReadOnly(r) {
			c.reads.Add(1)
		} else {
			c.writes.Add(1)
		}
		if f := c.recorder.Load(); f != nil {
			(*f)(r)
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// txnReadOnly is etcd's own test: no compares, only ranges.
func txnReadOnly(r *pb.TxnRequest) bool {
	if len(r.Compare) > 0 {
		return false
	}
	for _, op := range append(r.Success, r.Failure...) {
		if op.GetRequestRange() == nil {
			return false
		}
	}
	return true
}

// benchClient is a client configured as Dial configures the store's, with
// rt counting its RPCs; closed in cleanup.
func benchClient(b testing.TB, c *testenv.EtcdCluster, rt *rpcCounter) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            c.Endpoints(),
		DialTimeout:          5 * time.Second,
		Logger:               zap.NewNop(),
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		RejectOldCluster:     true,
		DialOptions:          []grpc.DialOption{grpc.WithChainUnaryInterceptor(rt.intercept)},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	return cli
}

// benchIdentity is a new identity; benchAcquire acquires it without
// metadata, for an hour (the summary holds leases for minutes), with the
// longest lifetime, so renewals never reach it.
func benchIdentity() lease.Identity {
	return lease.Identity{TenantID: "tenant-" + randomPrefix(), ProgramID: "program-" + randomPrefix(),
		TargetNamespace: "starintel-target", TargetID: "target_" + randomPrefix(), ActorName: "usernamegen",
		WorkflowName: "default", OperationClass: "default"}
}

var benchOwner = lease.Caller{PrincipalID: "prn_actor_1", ClientID: "client_1", CredentialID: "key_1"}

func benchMutation() lease.Mutation {
	return lease.Mutation{RequestID: "req_" + randomPrefix(), DeadlineAt: time.Now().Add(time.Minute), Caller: benchOwner}
}

func benchAcquire(id lease.Identity) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance_1", TTL: time.Hour,
		MaximumLifetime: lease.MaxLifetime, ExecutionID: "execution_" + randomPrefix(), JobID: "job_" + randomPrefix(),
		TraceID: "trace_" + randomPrefix(), Mutation: benchMutation()}
}

func benchRenew(r *lease.Record) lease.RenewRequest {
	return lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: benchMutation()}
}

func benchRelease(r *lease.Record) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: benchMutation()}
}

func benchCommit(r *lease.Record) lease.CommitRequest {
	return lease.CommitRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Sink: "couchdb", CommitID: "commit_" + randomPrefix(),
		ExecutionID: r.ExecutionID, JobID: r.JobID, TraceID: r.TraceID, Target: "doc:" + randomPrefix(),
		DeadlineAt: time.Now().Add(time.Minute), Caller: benchOwner}
}

// benchResults collects the measurements by benchmark and concurrency;
// the last (longest) run of each sub-benchmark wins.
type benchResults struct {
	mu    sync.Mutex
	m     map[string]benchMeasure
	order []leaseBench // as first measured
}

func (r *benchResults) key(name string, conc int) string { return name + "\x00" + strconv.Itoa(conc) }

func (r *benchResults) set(bm leaseBench, conc int, m benchMeasure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.ContainsFunc(r.order, func(o leaseBench) bool { return o.name == bm.name }) {
		r.order = append(r.order, bm)
	}
	r.m[r.key(bm.name, conc)] = m
}

func (r *benchResults) get(name string, conc int) benchMeasure {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[r.key(name, conc)]
}

// xFloor is bm's cost per op over its floor's (0 if not measured): a pair
// against a floor pair, a write against half a floor pair, a read against
// a floor-get.
func (r *benchResults) xFloor(bm leaseBench, conc int) float64 {
	floor, per := "floor", 1.0
	switch {
	case bm.name == "floor" || bm.name == "floor-get":
		return 0
	case bm.read:
		floor = "floor-get"
	case !bm.pair:
		per = 0.5
	}
	f, ops := r.get(floor, conc).ops, r.get(bm.name, conc).ops
	if f == 0 || ops == 0 {
		return 0
	}
	return f / (per * ops)
}

// xMutex is a pair's cost over a mutex pair's (0 for other ops).
func (r *benchResults) xMutex(bm leaseBench, conc int) float64 {
	m, ops := r.get("mutex", conc).ops, r.get(bm.name, conc).ops
	if !bm.pair || bm.name == "mutex" || m == 0 || ops == 0 {
		return 0
	}
	return m / ops
}

// print writes the summary table.
func (r *benchResults) print(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "operation\tgoroutines\tops/s\tx_floor\tx_mutex\trpcs/op\tsrv_cpu_us/op\tcli_cpu_us/op\tother_cores\t")
	for _, conc := range []int{1, 50} {
		for _, bm := range r.order {
			m := r.get(bm.name, conc)
			if m.ops == 0 {
				continue
			}
			xf, xm := "-", "-"
			if x := r.xFloor(bm, conc); x > 0 {
				xf = fmt.Sprintf("%.2f", x)
			}
			if x := r.xMutex(bm, conc); x > 0 {
				xm = fmt.Sprintf("%.2f", x)
			}
			fmt.Fprintf(w, "%s\t%d\t%.0f\t%s\t%s\t%.2f\t%.0f\t%.0f\t%.2f\t\n",
				bm.name, conc, m.ops, xf, xm, m.rpcs, m.srvCPU, m.cliCPU, m.otherCores)
		}
	}
	w.Flush()
	fmt.Fprintln(out, "interleaved; ops/s: pairs/s for floor, mutex, reads-only, writes-only and acquire+release")
	fmt.Fprintln(out, "x_floor: cost per op over the floor's (a pair over a put+delete pair, a write over half one, a read over a get); goal for acquire+release <= 1.50")
	fmt.Fprintln(out, "x_mutex: a pair's cost over a concurrency.Mutex Lock+Unlock pair's; goal < 1.00")
}
