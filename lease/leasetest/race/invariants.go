package race

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/starintel/starlease/lease"
)

// This file asserts the contract's safety invariants directly on the
// recorded answers, independent of the model and of porcupine's search:
//
//   - at most one unexpired holder per identity at any backend time: each
//     lease holds [acquired_at, end) where end is the expires_at of its
//     latest successful acquire or renew, clipped at the backend time of a
//     successful release, force-release or revoke; the intervals of an
//     identity's leases must not overlap;
//   - every success on a lease (renew, release, force-release, revoke,
//     commit) happens while it holds: at or after acquired_at, before the
//     expires_at in force, and not after it ended; a lease ends at most once;
//   - tokens strictly increase per identity in order of acquisition backend
//     time, and no token is handed out twice;
//   - per identity and sink, no accepted commit has a token below one
//     accepted earlier (ordered by accepted_at).
//
// Backend times have millisecond resolution, so events in the same
// millisecond are not ordered against each other.

// extension is a successful acquire or renew: from t the lease holds until
// expires. call and ret are the operation's real-time call and return,
// which order extensions of the same millisecond.
type extension struct {
	t, expires int64
	renew      bool
	call, ret  int64
}

// after reports whether e is in force over o: decided later in backend
// time or, in the same millisecond, invoked after o returned (real-time
// order is linearization order); two overlapping calls in one millisecond
// cannot be ordered, and the larger expires_at is assumed, which can only
// make a hold look longer.
func (e *extension) after(o *extension) bool {
	switch {
	case e.t != o.t:
		return e.t > o.t
	case e.call > o.ret:
		return true
	case o.call > e.ret:
		return false
	}
	return e.expires > o.expires
}

// use is a success that requires the lease to hold at t.
type use struct {
	t    int64
	what string
}

type life struct {
	id       string
	token    uint64
	acquired int64
	ext      []extension
	uses     []use
	ends     []int64
	end      int64 // computed
}

// expiresAt is the expires_at in force at t for a use (self excluded): the
// latest extension at or before t, the largest one among ties.
func (l *life) expiresAt(t int64, self *extension) (int64, bool) {
	var best *extension
	for i := range l.ext {
		e := &l.ext[i]
		if e == self || e.t > t {
			continue
		}
		if best == nil || e.after(best) {
			best = e
		}
	}
	if best == nil {
		return 0, false
	}
	return best.expires, true
}

type commitAt struct {
	id       string
	token    uint64
	accepted int64
}

// Stats summarizes what a run exercised.
type Stats struct {
	Ops      int
	Codes    map[string]int // "kind code" -> count
	Leases   int            // distinct leases granted
	Ended    int            // leases ended by release, force-release or revoke
	Expired  int            // leases not ended explicitly (they expired or were live at the end)
	Renewals int
	Capped   int // renewals whose expires_at the maximum lifetime capped
	Commits  int
	Resolved int // operations whose outcome_unknown a retry with the same request id resolved
	// ResolvedByLookup are those of Resolved that LookupRequest resolved;
	// Lookups counts the LookupRequest calls made to resolve them.
	ResolvedByLookup, Lookups int
	// Guarded sink writes after authorizations: landed, refused by a
	// higher token, and misuses of a guard (another document or body)
	// refused.
	WritesLanded, WritesRefused, MisusesRefused int
	// MedianLatency is the median time from call to return.
	MedianLatency time.Duration
}

// checkInvariants returns the invariant violations of a history and what
// the history exercised.
func checkInvariants(ops []porcupine.Operation) ([]string, Stats) {
	st := Stats{Ops: len(ops), Codes: map[string]int{}}
	if len(ops) > 0 {
		lat := make([]int64, len(ops))
		for i, op := range ops {
			lat[i] = op.Return - op.Call
		}
		slices.Sort(lat)
		st.MedianLatency = time.Duration(lat[len(lat)/2]).Round(time.Microsecond)
	}
	leases := map[int]map[string]*life{}
	commits := map[int]map[string]map[string]commitAt{} // ident -> sink -> commit id
	var bad []string
	failf := func(ident int, format string, args ...any) {
		bad = append(bad, fmt.Sprintf("identity %d: ", ident)+fmt.Sprintf(format, args...))
	}
	lifeOf := func(ident int, id string) *life {
		if leases[ident] == nil {
			leases[ident] = map[string]*life{}
		}
		return leases[ident][id]
	}
	// Acquisitions first, so every other success finds its lease.
	for _, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		st.Codes[string(in.Kind)+" "+string(out.Code)]++
		st.Lookups += out.Lookups
		if out.Attempts > 1 {
			st.Resolved++
			if out.ByLookup {
				st.ResolvedByLookup++
			}
		}
		if in.Kind != KindAcquire || out.Code != lease.CodeAcquired || out.Lease == nil {
			continue
		}
		v := out.Lease
		if l := lifeOf(in.Ident, v.LeaseID); l != nil {
			if l.token != v.Token || l.acquired != v.AcquiredMs {
				failf(in.Ident, "lease %s answered twice with different token or acquired_at (%d@%d, %d@%d)",
					v.LeaseID, l.token, l.acquired, v.Token, v.AcquiredMs)
			}
			continue
		}
		leases[in.Ident][v.LeaseID] = &life{id: v.LeaseID, token: v.Token, acquired: v.AcquiredMs,
			ext: []extension{{t: v.AcquiredMs, expires: v.ExpiresMs, call: op.Call, ret: op.Return}}}
	}
	for i, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		t := decisionMs(in, out)
		var l *life
		if in.LeaseID != "" {
			l = lifeOf(in.Ident, in.LeaseID)
		}
		success := false
		switch {
		case in.Kind == KindRenew && out.Code == lease.CodeRenewed && out.Lease != nil:
			success = true
			if l != nil {
				l.ext = append(l.ext, extension{t: t, expires: out.Lease.ExpiresMs, renew: true, call: op.Call, ret: op.Return})
			}
			st.Renewals++
			if v := out.Lease; v.ExpiresMs == v.AcquiredMs+v.MaxLifetimeMs {
				st.Capped++
			}
		case (in.Kind == KindRelease && out.Code == lease.CodeReleased) ||
			(in.Kind == KindForceRelease && out.Code == lease.CodeForceReleased) ||
			(in.Kind == KindRevoke && out.Code == lease.CodeRevoked):
			success = true
			if l != nil {
				l.ends = append(l.ends, t)
				l.uses = append(l.uses, use{t, string(in.Kind)})
			}
		case in.Kind == KindCommit && out.Code == lease.CodeCommitAuthorized && out.Commit != nil:
			success = true
			if l != nil {
				l.uses = append(l.uses, use{t, "commit"})
			}
			if commits[in.Ident] == nil {
				commits[in.Ident] = map[string]map[string]commitAt{}
			}
			if commits[in.Ident][in.Sink] == nil {
				commits[in.Ident][in.Sink] = map[string]commitAt{}
			}
			// A replay (same commit id) is the same commit.
			id := in.RequestID
			if id == "" {
				id = fmt.Sprintf("#%d", i)
			}
			commits[in.Ident][in.Sink][id] = commitAt{id: id, token: in.Token, accepted: out.Commit.AcceptedMs}
		}
		if success && l == nil {
			failf(in.Ident, "%s of lease %s succeeded, but no acquisition of it was answered", in.Kind, in.LeaseID)
		}
	}

	idents := make([]int, 0, len(leases))
	for ident := range leases {
		idents = append(idents, ident)
	}
	slices.Sort(idents)
	for _, ident := range idents {
		var all []*life
		for _, l := range leases[ident] {
			all = append(all, l)
		}
		slices.SortFunc(all, func(a, b *life) int {
			return cmp.Or(cmp.Compare(a.acquired, b.acquired), cmp.Compare(a.token, b.token), cmp.Compare(a.id, b.id))
		})
		st.Leases += len(all)
		byToken := map[uint64]string{}
		for _, l := range all {
			if other, dup := byToken[l.token]; dup {
				failf(ident, "token %d handed out twice: leases %s and %s", l.token, other, l.id)
			}
			byToken[l.token] = l.id
			checkLife(ident, l, failf)
			if len(l.ends) > 0 {
				st.Ended++
			} else {
				st.Expired++
			}
		}
		// Tokens strictly increase in acquisition order; overlapping holds.
		var prevMaxToken uint64
		var prevLease string
		var groupT int64 = -1
		var groupMax uint64
		var groupLease string
		var holder *life
		for _, l := range all {
			if l.acquired != groupT {
				if groupMax > prevMaxToken {
					prevMaxToken, prevLease = groupMax, groupLease
				}
				groupT = l.acquired
			}
			if l.token <= prevMaxToken {
				failf(ident, "token %d of lease %s acquired at %d is not above token %d of lease %s acquired earlier",
					l.token, l.id, l.acquired, prevMaxToken, prevLease)
			}
			if l.token > groupMax {
				groupMax, groupLease = l.token, l.id
			}
			if holder != nil && l.acquired < holder.end {
				failf(ident, "lease %s (token %d) acquired at %d while lease %s (token %d) holds until %d",
					l.id, l.token, l.acquired, holder.id, holder.token, holder.end)
			}
			if holder == nil || l.end > holder.end {
				holder = l
			}
		}
	}

	cidents := make([]int, 0, len(commits))
	for ident := range commits {
		cidents = append(cidents, ident)
	}
	slices.Sort(cidents)
	for _, ident := range cidents {
		sinks := make([]string, 0, len(commits[ident]))
		for sink := range commits[ident] {
			sinks = append(sinks, sink)
		}
		slices.Sort(sinks)
		for _, sink := range sinks {
			var cs []commitAt
			for _, c := range commits[ident][sink] {
				cs = append(cs, c)
			}
			st.Commits += len(cs)
			slices.SortFunc(cs, func(a, b commitAt) int {
				return cmp.Or(cmp.Compare(a.accepted, b.accepted), cmp.Compare(a.token, b.token), cmp.Compare(a.id, b.id))
			})
			var earlier, group commitAt
			groupT := int64(-1)
			for _, c := range cs {
				if c.accepted != groupT {
					if group.token > earlier.token {
						earlier = group
					}
					groupT = c.accepted
				}
				if c.token < earlier.token {
					failf(ident, "sink %s accepted commit %s with token %d at %d after commit %s with token %d at %d",
						sink, c.id, c.token, c.accepted, earlier.id, earlier.token, earlier.accepted)
				}
				if c.token > group.token || group.id == "" {
					group = c
				}
			}
		}
	}
	return bad, st
}

// checkLife checks the successes on one lease and computes its end.
func checkLife(ident int, l *life, failf func(int, string, ...any)) {
	slices.Sort(l.ends)
	if len(l.ends) > 1 {
		failf(ident, "lease %s ended %d times (at %v)", l.id, len(l.ends), l.ends)
	}
	for i := range l.ext {
		e := &l.ext[i]
		if !e.renew {
			continue
		}
		if exp, ok := l.expiresAt(e.t, e); !ok || e.t < l.acquired || e.t >= exp {
			failf(ident, "lease %s renewed at %d, but it held only from %d until %d", l.id, e.t, l.acquired, exp)
		}
		if len(l.ends) > 0 && e.t > l.ends[0] {
			failf(ident, "lease %s renewed at %d after it ended at %d", l.id, e.t, l.ends[0])
		}
	}
	for _, u := range l.uses {
		if exp, ok := l.expiresAt(u.t, nil); !ok || u.t < l.acquired || u.t >= exp {
			failf(ident, "%s of lease %s succeeded at %d, but it held only from %d until %d", u.what, l.id, u.t, l.acquired, exp)
		}
		if len(l.ends) > 0 && u.t > l.ends[0] {
			failf(ident, "%s of lease %s succeeded at %d after it ended at %d", u.what, l.id, u.t, l.ends[0])
		}
	}
	// The hold ends at the expires_at of the latest extension, or earlier
	// at its explicit end.
	last := &l.ext[0]
	for i := range l.ext[1:] {
		if e := &l.ext[i+1]; e.after(last) {
			last = e
		}
	}
	l.end = last.expires
	if len(l.ends) > 0 && l.ends[0] < l.end {
		l.end = l.ends[0]
	}
}
