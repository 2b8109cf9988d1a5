// Package race is the backend-neutral race suite of the lease-store
// protocol with a linearizability check, shaped like etcd's
// tests/robustness: many workers acquire, renew, release, force-release,
// revoke, authorize commits and inspect on a few identities with short
// TTLs (traffic.go); every operation is recorded with its call and return
// time, request and answer, including the backend time of the decision
// (history.go); the history is checked with porcupine against a sequential
// model of the contract partitioned by identity (model.go), and the safety
// invariants are asserted directly on the answers (invariants.go). A failed
// check writes porcupine's HTML visualization and the history to a
// directory named in the failure (report.go).
//
// A backend's tests call Run with a fresh store opened with
// leasetest.StoreOptions():
//
//	func TestRace(t *testing.T) {
//		race.Run(t, openStore(t), race.Options{})
//	}
package race

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/starintel/starlease/lease"
)

// Options bound a run. Zero values take the defaults.
type Options struct {
	// Identities is how many identities the workers contend on (default 3).
	Identities int
	// Workers is how many goroutines issue operations (default 16).
	Workers int
	// OpsPerWorker bounds each worker's operations (default 150).
	OpsPerWorker int
	// Duration bounds the traffic's wall time (default 3 s); the traffic
	// stops at whichever bound comes first.
	Duration time.Duration
	// TTL is the lease TTL, varied by a quarter either way (default 200
	// ms), short so that leases expire during the run.
	TTL time.Duration
	// MaxLifetime is the acquisitions' maximum lifetime (default 2×TTL),
	// short so that renewals reach it.
	MaxLifetime time.Duration
	// CheckTimeout bounds porcupine's search (default 30 s); a search that
	// times out fails the run.
	CheckTimeout time.Duration
	// ReportDir receives the visualization and history of a failed run
	// (default: a new os.TempDir()/starlease-race-* directory, which
	// outlives the test).
	ReportDir string
	// Seed seeds the operation mix (default: random, logged).
	Seed uint64
	// CallTimeout is the deadline of each call, from when it is sent
	// (default 5 s). Tests of servers with skewed clocks lengthen it: a
	// server whose clock runs ahead sees every deadline that much sooner.
	CallTimeout time.Duration
	// Stop, if not nil, ends the traffic when closed, as Duration would
	// (operations under way finish; none is canceled). Tests that inject
	// faults during the traffic set a long Duration and close Stop once
	// the faults are over.
	Stop <-chan struct{}
	// ResolveByLookup makes a worker resolve an outcome_unknown mutation
	// (acquire, renew, release, force-release, revoke) by LookupRequest
	// with its request id first: a stored result is the answer; only when
	// the lookup finds none is the same request sent again. Commits are
	// resolved by sending the same commit id again, as always.
	ResolveByLookup bool
}

func (o Options) withDefaults() Options {
	if o.Identities <= 0 {
		o.Identities = 3
	}
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.OpsPerWorker <= 0 {
		o.OpsPerWorker = 150
	}
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.TTL <= 0 {
		o.TTL = 200 * time.Millisecond
	}
	o.TTL = o.TTL.Truncate(time.Millisecond)
	if o.MaxLifetime < o.TTL*5/4+time.Millisecond {
		o.MaxLifetime = 2 * o.TTL
	}
	o.MaxLifetime = o.MaxLifetime.Truncate(time.Millisecond)
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Second
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = 30 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	return o
}

// Record runs the traffic against store and returns its history.
func Record(ctx context.Context, store lease.Store, opts Options) *History {
	return RecordStores(ctx, []lease.Store{store}, opts)
}

// RecordStores runs the traffic against several stores that share one
// backend, as several starlease servers in front of one cluster do: each
// operation goes to a store picked at random, and each retry that resolves
// an outcome_unknown to the next store. It returns the history.
func RecordStores(ctx context.Context, stores []lease.Store, opts Options) *History {
	opts = opts.withDefaults()
	h := NewHistory(opts.Identities)
	start := time.Now()
	traffic(ctx, stores, opts, h)
	h.Elapsed = time.Since(start)
	return h
}

// Report is the verdict on a history.
type Report struct {
	// Result is porcupine's verdict.
	Result porcupine.CheckResult
	// Problems are the failures, each a complete message.
	Problems []string
	// Visualization is the path of the HTML visualization, if one was written.
	Visualization string
	Stats         Stats
	CheckTime     time.Duration
}

// Check checks a history: linearizability against the model, and the
// invariants. It writes the visualization when either fails.
func Check(h *History, opts Options) Report {
	opts = opts.withDefaults()
	var rep Report
	tainted := h.Tainted()
	for _, ident := range slices.Sorted(maps.Keys(tainted)) {
		rep.Problems = append(rep.Problems, fmt.Sprintf("identity %d not checked: %s", ident, tainted[ident]))
	}
	var ops []porcupine.Operation
	for _, op := range h.Operations() {
		if _, bad := tainted[op.Input.(Input).Ident]; !bad {
			ops = append(ops, op)
		}
	}
	var base int64
	for _, op := range ops {
		if t := decisionMs(op.Input.(Input), op.Output.(Output)); t != 0 && (base == 0 || t < base) {
			base = t
		}
	}
	model := Model(base)
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, opts.CheckTimeout)
	rep.CheckTime = time.Since(start)
	rep.Result = res
	violations, stats := checkInvariants(ops)
	if h.Writes != nil {
		violations = append(violations, h.Writes.check()...)
		stats.WritesLanded, stats.WritesRefused, stats.MisusesRefused = h.Writes.counts()
	}
	rep.Stats = stats

	var lin []string
	switch res {
	case porcupine.Unknown:
		lin = append(lin, fmt.Sprintf("porcupine could not decide linearizability of %d operations within %v: "+
			"treat as a failure; shrink Workers, OpsPerWorker or Duration", len(ops), opts.CheckTimeout))
	case porcupine.Illegal:
		parts := partition(ops)
		partials := info.PartialLinearizations()
		for p, part := range parts {
			var longest []int
			if p < len(partials) {
				for _, l := range partials[p] {
					if len(l) > len(longest) {
						longest = l
					}
				}
			}
			if len(longest) == len(part) {
				continue
			}
			ident := part[0].Input.(Input).Ident
			lin = append(lin, fmt.Sprintf("identity %d (%d operations) is not linearizable: %s",
				ident, len(part), explain(base, part, longest)))
		}
		if len(lin) == 0 {
			lin = append(lin, "porcupine found the history not linearizable")
		}
	}
	if len(lin) > 0 || len(violations) > 0 {
		var notes []porcupine.Annotation
		for _, v := range violations {
			notes = append(notes, porcupine.Annotation{Tag: "invariant", Description: "invariant violated", Details: v})
		}
		path, err := writeReport(opts.ReportDir, model, info, h, notes)
		where := "visualization: " + path
		if err != nil {
			where = fmt.Sprintf("visualization not written: %v", err)
		}
		rep.Visualization = path
		for _, l := range lin {
			rep.Problems = append(rep.Problems, l+"\n  "+where)
		}
		for _, v := range violations {
			rep.Problems = append(rep.Problems, "invariant: "+v+"\n  "+where)
		}
	}
	return rep
}

// coverage reports what a run failed to exercise: a race suite that never
// saw a conflict or a loss proves nothing about them. required answers come
// from any backend at any speed; wanted ones need a holder to act before its
// lease expires, which a backend slower than the TTL under load cannot give.
func coverage(s Stats) (required, wanted []string) {
	for _, c := range []struct {
		key  string
		must bool
	}{
		{"acquire " + string(lease.CodeAcquired), true},
		{"acquire " + string(lease.CodeConflict), true},
		{"renew " + string(lease.CodeLost), true},
		{"commit " + string(lease.CodeLost), true},
		{"renew " + string(lease.CodeRenewed), false},
		{"commit " + string(lease.CodeCommitAuthorized), false},
		{"release " + string(lease.CodeReleased), false},
	} {
		switch {
		case s.Codes[c.key] > 0:
		case c.must:
			required = append(required, c.key)
		default:
			wanted = append(wanted, c.key)
		}
	}
	return required, wanted
}

// Summary is a one-paragraph account of what the run did.
func (r Report) Summary(h *History, o Options) string {
	s := r.Stats
	var b strings.Builder
	fmt.Fprintf(&b, "%d operations by %d workers on %d identities in %v (seed %d); porcupine %s in %v; "+
		"%d leases (%d ended explicitly, %d expired or still live), %d renewals (%d capped by the maximum lifetime), "+
		"%d accepted commits (guarded writes: %d landed, %d refused by a higher token or a later commit, %d misused guards refused); "+
		"%d outcome_unknown resolved (%d found by %d lookups); median latency %v",
		s.Ops, o.Workers, o.Identities, h.Elapsed.Round(time.Millisecond), o.Seed, r.Result,
		r.CheckTime.Round(time.Millisecond), s.Leases, s.Ended, s.Expired, s.Renewals, s.Capped, s.Commits,
		s.WritesLanded, s.WritesRefused, s.MisusesRefused, s.Resolved, s.ResolvedByLookup, s.Lookups, s.MedianLatency)
	b.WriteString("\n  answers:")
	for _, k := range slices.Sorted(maps.Keys(s.Codes)) {
		fmt.Fprintf(&b, " %s=%d", strings.ReplaceAll(k, " ", ":"), s.Codes[k])
	}
	return b.String()
}

// Run drives store with the traffic, checks the history, and reports every
// problem with t.Errorf. The store must be fresh or at least not used by
// anything else during the run.
func Run(t *testing.T, store lease.Store, opts Options) {
	t.Helper()
	opts = opts.withDefaults()
	h := Record(context.Background(), store, opts)
	rep := Check(h, opts)
	t.Logf("race: %s", rep.Summary(h, opts))
	for _, p := range rep.Problems {
		t.Errorf("race: %s", p)
	}
	required, wanted := coverage(rep.Stats)
	if len(required) > 0 {
		t.Errorf("race: the traffic never got these answers, so it proves nothing about them: %s",
			strings.Join(required, ", "))
	}
	if len(wanted) > 0 {
		t.Logf("race: WARNING: the traffic never got %s: operations took %v at the median against a TTL of %v; "+
			"the run proves nothing about them (is the machine overloaded?)",
			strings.Join(wanted, ", "), rep.Stats.MedianLatency, opts.TTL)
	}
}
