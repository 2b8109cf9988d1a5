package race

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/starintel/starlease/lease"
)

// This file is the sequential model of the contract for one lock identity
// (etcd's tests/robustness/model, for leases). It is deterministic: the next
// state is a function of the state, the request and the answer.
//
// Backend time is an input. Expiry is no client's action, so every step
// first applies expiry at the operation's backend time (an active lease whose
// expires_at <= that time is expired), then the transition. Backend times
// must not go backwards in linearization order: an operation linearized after
// another cannot have a smaller backend time.
//
// Rules, at backend time t after expiry:
//   - acquire succeeds iff no live lease; the token is above the counter
//     (strictly increasing; gaps are allowed, as the contract allows); the
//     lease id is new; acquired_at = renewed_at = t; expires_at =
//     t + min(ttl, maximum lifetime). lease_conflict iff a live lease.
//   - renew and release succeed iff the live lease matches lease id, token,
//     owner principal and service instance exactly; otherwise lease_lost.
//     Renew sets renewed_at = t, expires_at = min(t + ttl, acquired_at +
//     maximum lifetime) and keeps the token.
//   - force-release and revoke succeed iff the live lease has the observed
//     lease id and token; otherwise lease_lost.
//   - authorize-commit succeeds iff the exact live lease matches (as renew)
//     and its token is at least the sink's high-water mark, which it raises;
//     commit_rejected only for a token below the mark; lease_lost only when
//     the exact lease is not live.
//   - inspect by identity returns the live lease, or not_found, or the most
//     recent lease in state expired once it has expired; inspect by lease id
//     returns the live lease, a terminal lease in its terminal state, or
//     not_found for a lease that is not live (history retention).
//
// Answers that made no decision (backend_unavailable, rate_limited and
// deadline_exceeded, which the contract defines as "did not start") change
// nothing. An answer that reports a decision without a backend time is a
// contract violation. Outcome-unknown answers never reach the model: the
// traffic resolves them by retrying with the same request id, and an
// identity with an unresolved one is reported and not checked (see
// traffic.go). A replayed answer is the original operation's result and is
// linearized at its original decision time.

// Held is the active lease as the model knows it.
type Held struct {
	LeaseID       string
	Owner         string
	Instance      string
	Token         uint64
	AcquiredMs    int64
	RenewedMs     int64
	ExpiresMs     int64
	TTLMs         int64
	MaxLifetimeMs int64
}

// Mark is a sink's fencing high-water mark.
type Mark struct {
	Sink  string
	Token uint64
}

// State is the model state of one identity. It is immutable: Step returns
// a new State and never changes the one it is given.
type State struct {
	// Active is the active lease, nil if none (as of Last).
	Active *Held
	// Latest is the lease id of the most recent acquisition.
	Latest string
	// Counter is the highest token granted.
	Counter uint64
	// Marks are the sinks' high-water marks, sorted by sink.
	Marks []Mark
	// Ended are the terminal lease ids with their terminal state.
	Ended *ended
	// Last is the backend time (Unix ms) of the last linearized decision.
	Last int64
}

// ended is a persistent set of terminal leases: a list sharing its tail
// between states, with an order-independent hash for equality checks.
type ended struct {
	id    string
	state lease.State
	next  *ended
	n     int
	hash  uint64
}

func entryHash(id string, st lease.State) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(st))
	return h.Sum64()
}

func (e *ended) len() int {
	if e == nil {
		return 0
	}
	return e.n
}

func (e *ended) sum() uint64 {
	if e == nil {
		return 0
	}
	return e.hash
}

func (e *ended) get(id string) (lease.State, bool) {
	for p := e; p != nil; p = p.next {
		if p.id == id {
			return p.state, true
		}
	}
	return "", false
}

func (e *ended) with(id string, st lease.State) *ended {
	return &ended{id: id, state: st, next: e, n: e.len() + 1, hash: e.sum() ^ entryHash(id, st)}
}

func (e *ended) equal(o *ended) bool {
	if e == o {
		return true
	}
	if e.len() != o.len() || e.sum() != o.sum() {
		return false
	}
	m := make(map[string]lease.State, e.len())
	for p := e; p != nil; p = p.next {
		m[p.id] = p.state
	}
	for p := o; p != nil; p = p.next {
		if st, ok := m[p.id]; !ok || st != p.state {
			return false
		}
	}
	return true
}

// Equal reports whether two states are the same.
func (s State) Equal(o State) bool {
	if s.Latest != o.Latest || s.Counter != o.Counter || s.Last != o.Last {
		return false
	}
	if (s.Active == nil) != (o.Active == nil) || (s.Active != nil && *s.Active != *o.Active) {
		return false
	}
	return slices.Equal(s.Marks, o.Marks) && s.Ended.equal(o.Ended)
}

// Hash is consistent with Equal.
func (s State) Hash() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%d|%d|", s.Latest, s.Counter, s.Last)
	if a := s.Active; a != nil {
		fmt.Fprintf(h, "%s|%s|%s|%d|%d|%d|%d|%d|%d|", a.LeaseID, a.Owner, a.Instance, a.Token,
			a.AcquiredMs, a.RenewedMs, a.ExpiresMs, a.TTLMs, a.MaxLifetimeMs)
	}
	for _, m := range s.Marks {
		fmt.Fprintf(h, "%s=%d|", m.Sink, m.Token)
	}
	return h.Sum64() ^ s.Ended.sum()
}

func (s State) mark(sink string) uint64 {
	for _, m := range s.Marks {
		if m.Sink == sink {
			return m.Token
		}
	}
	return 0
}

func (s State) withMark(sink string, token uint64) []Mark {
	out := make([]Mark, 0, len(s.Marks)+1)
	done := false
	for _, m := range s.Marks {
		switch {
		case m.Sink == sink:
			out = append(out, Mark{sink, token})
			done = true
		case !done && m.Sink > sink:
			out = append(out, Mark{sink, token}, m)
			done = true
		default:
			out = append(out, m)
		}
	}
	if !done {
		out = append(out, Mark{sink, token})
	}
	return out
}

// at applies expiry at backend time t and advances Last.
func (s State) at(t int64) State {
	if s.Active != nil && s.Active.ExpiresMs <= t {
		s.Ended = s.Ended.with(s.Active.LeaseID, lease.StateExpired)
		s.Active = nil
	}
	s.Last = t
	return s
}

// matches reports whether the live lease is the one the request names: lease
// id and token, and with owner also the owner principal and instance.
func (s State) matches(in Input, owner bool) bool {
	a := s.Active
	if a == nil || a.LeaseID != in.LeaseID || a.Token != in.Token {
		return false
	}
	return !owner || (a.Owner == in.Owner && a.Instance == in.Instance)
}

// decisionMs is when the operation linearized: its backend time, or for a
// replayed answer the original decision's time where the answer carries it.
func decisionMs(in Input, out Output) int64 {
	if out.Replayed {
		switch {
		case in.Kind == KindAcquire && out.Lease != nil:
			return out.Lease.AcquiredMs
		case in.Kind == KindRenew && out.Lease != nil:
			return out.Lease.RenewedMs
		case in.Kind == KindCommit && out.Commit != nil:
			return out.Commit.AcceptedMs
		}
	}
	return out.BackendMs
}

// noDecision are answers that report the operation did not start.
func noDecision(c lease.Code) bool {
	return c == lease.CodeBackendUnavailable || c == lease.CodeRateLimited || c == lease.CodeDeadlineExceeded
}

// Step is the model's transition: the state after the operation, or an error
// saying why the answer is impossible in state s.
func Step(s State, in Input, out Output) (State, error) {
	t := decisionMs(in, out)
	if noDecision(out.Code) && t == 0 {
		return s, nil
	}
	if t == 0 {
		return s, fmt.Errorf("%s without a backend time", out.Code)
	}
	if t < s.Last {
		return s, fmt.Errorf("backend time %d is %d ms before the backend time of an operation linearized earlier",
			t, s.Last-t)
	}
	s = s.at(t)
	if noDecision(out.Code) {
		return s, nil
	}
	switch in.Kind {
	case KindAcquire:
		return stepAcquire(s, in, out, t)
	case KindRenew:
		return stepRenew(s, in, out, t)
	case KindRelease:
		return stepEnd(s, in, out, true, lease.CodeReleased, lease.StateReleased)
	case KindForceRelease:
		return stepEnd(s, in, out, false, lease.CodeForceReleased, lease.StateReleased)
	case KindRevoke:
		return stepEnd(s, in, out, false, lease.CodeRevoked, lease.StateRevoked)
	case KindCommit:
		return stepCommit(s, in, out, t)
	case KindInspect:
		return stepInspect(s, out, t)
	case KindInspectID:
		return stepInspectID(s, in, out)
	}
	return s, fmt.Errorf("unknown operation %q", in.Kind)
}

func unexpected(in Input, out Output) error {
	return fmt.Errorf("%s answered %s, which the contract does not allow here", in.Kind, out.Code)
}

// diff lists the fields of got that differ from want.
func diff(got *LeaseView, want Held, state lease.State) error {
	if got == nil {
		return fmt.Errorf("success without a lease record")
	}
	var bad []string
	check := func(name string, g, w any) {
		if g != w {
			bad = append(bad, fmt.Sprintf("%s %v, want %v", name, g, w))
		}
	}
	check("lease_id", got.LeaseID, want.LeaseID)
	check("token", got.Token, want.Token)
	check("owner", got.Owner, want.Owner)
	check("instance", got.Instance, want.Instance)
	check("acquired_at", got.AcquiredMs, want.AcquiredMs)
	check("renewed_at", got.RenewedMs, want.RenewedMs)
	check("expires_at", got.ExpiresMs, want.ExpiresMs)
	check("ttl_ms", got.TTLMs, want.TTLMs)
	check("maximum_lifetime_ms", got.MaxLifetimeMs, want.MaxLifetimeMs)
	check("state", got.State, state)
	if len(bad) > 0 {
		return fmt.Errorf("returned record differs from the model: %s", strings.Join(bad, "; "))
	}
	return nil
}

func stepAcquire(s State, in Input, out Output, t int64) (State, error) {
	switch out.Code {
	case lease.CodeConflict:
		if s.Active == nil {
			return s, fmt.Errorf("lease_conflict, but no lease is live at %d", t)
		}
		return s, nil
	case lease.CodeAcquired:
		if a := s.Active; a != nil {
			return s, fmt.Errorf("acquired while lease %s (token %d, expires %d) is live", short(a.LeaseID), a.Token, a.ExpiresMs)
		}
		v := out.Lease
		if v == nil {
			return s, fmt.Errorf("acquired without a lease record")
		}
		if v.Token <= s.Counter {
			return s, fmt.Errorf("token %d is not above the counter %d", v.Token, s.Counter)
		}
		if _, seen := s.Ended.get(v.LeaseID); seen || v.LeaseID == "" || v.LeaseID == s.Latest {
			return s, fmt.Errorf("lease id %q is not new", v.LeaseID)
		}
		want := Held{LeaseID: v.LeaseID, Owner: in.Owner, Instance: in.Instance, Token: v.Token,
			AcquiredMs: t, RenewedMs: t, ExpiresMs: t + min(in.TTLMs, in.MaxLifetimeMs),
			TTLMs: in.TTLMs, MaxLifetimeMs: in.MaxLifetimeMs}
		if err := diff(v, want, lease.StateActive); err != nil {
			return s, err
		}
		s.Active, s.Latest, s.Counter = &want, v.LeaseID, v.Token
		return s, nil
	}
	return s, unexpected(in, out)
}

func stepRenew(s State, in Input, out Output, t int64) (State, error) {
	match := s.matches(in, true)
	switch out.Code {
	case lease.CodeLost:
		if match {
			return s, fmt.Errorf("lease_lost, but the exact lease is live until %d", s.Active.ExpiresMs)
		}
		return s, nil
	case lease.CodeRenewed:
		if !match {
			return s, fmt.Errorf("renewed, but %s", notHeld(s, in, true))
		}
		a := *s.Active
		ttl := in.TTLMs
		if ttl == 0 {
			ttl = a.TTLMs
		}
		a.RenewedMs, a.ExpiresMs, a.TTLMs = t, min(t+ttl, a.AcquiredMs+a.MaxLifetimeMs), ttl
		if err := diff(out.Lease, a, lease.StateActive); err != nil {
			return s, err
		}
		s.Active = &a
		return s, nil
	}
	return s, unexpected(in, out)
}

// stepEnd is release (owner true), force-release and revoke.
func stepEnd(s State, in Input, out Output, owner bool, code lease.Code, state lease.State) (State, error) {
	match := s.matches(in, owner)
	switch out.Code {
	case lease.CodeLost:
		if match {
			return s, fmt.Errorf("lease_lost, but the lease is live until %d", s.Active.ExpiresMs)
		}
		return s, nil
	case code:
		if !match {
			return s, fmt.Errorf("%s, but %s", code, notHeld(s, in, owner))
		}
		if err := diff(out.Lease, *s.Active, state); err != nil {
			return s, err
		}
		s.Ended = s.Ended.with(s.Active.LeaseID, state)
		s.Active = nil
		return s, nil
	}
	return s, unexpected(in, out)
}

func stepCommit(s State, in Input, out Output, t int64) (State, error) {
	match := s.matches(in, true)
	mark := s.mark(in.Sink)
	switch out.Code {
	case lease.CodeLost:
		if match {
			return s, fmt.Errorf("lease_lost, but the exact lease is live until %d", s.Active.ExpiresMs)
		}
		return s, nil
	case lease.CodeCommitRejected:
		if in.Token >= mark {
			return s, fmt.Errorf("commit_rejected, but token %d is not below the %s mark %d", in.Token, in.Sink, mark)
		}
		return s, nil
	case lease.CodeCommitAuthorized:
		if !match {
			return s, fmt.Errorf("commit authorized, but %s", notHeld(s, in, true))
		}
		if in.Token < mark {
			return s, fmt.Errorf("commit authorized with token %d below the %s mark %d", in.Token, in.Sink, mark)
		}
		c := out.Commit
		if c == nil || c.LeaseID != in.LeaseID || c.Token != in.Token || c.Sink != in.Sink || c.AcceptedMs != t {
			return s, fmt.Errorf("accepted commit %+v does not match the request at %d", c, t)
		}
		if !out.Replayed && out.BackendMs != c.AcceptedMs {
			return s, fmt.Errorf("accepted_at %d differs from the backend time %d", c.AcceptedMs, out.BackendMs)
		}
		s.Marks = s.withMark(in.Sink, in.Token)
		return s, nil
	}
	return s, unexpected(in, out)
}

func stepInspect(s State, out Output, t int64) (State, error) {
	switch out.Code {
	case lease.CodeNotFound:
		if a := s.Active; a != nil {
			return s, fmt.Errorf("not_found, but lease %s is live until %d", short(a.LeaseID), a.ExpiresMs)
		}
		return s, nil
	case lease.CodeInspected:
		v := out.Lease
		if v == nil {
			return s, fmt.Errorf("inspected without a lease record")
		}
		if s.Active != nil {
			return s, diff(v, *s.Active, lease.StateActive)
		}
		st, ok := s.Ended.get(v.LeaseID)
		if v.State != lease.StateExpired || v.LeaseID != s.Latest || !ok || st != lease.StateExpired || v.ExpiresMs > t {
			return s, fmt.Errorf("inspect saw lease %s in state %s (expires %d), but no lease is live and the latest lease %s is %s",
				short(v.LeaseID), v.State, v.ExpiresMs, short(s.Latest), stateOr(st, ok))
		}
		return s, nil
	}
	return s, fmt.Errorf("inspect answered %s", out.Code)
}

func stepInspectID(s State, in Input, out Output) (State, error) {
	live := s.Active != nil && s.Active.LeaseID == in.LeaseID
	switch out.Code {
	case lease.CodeNotFound:
		if live {
			return s, fmt.Errorf("not_found, but lease %s is live until %d", short(in.LeaseID), s.Active.ExpiresMs)
		}
		return s, nil
	case lease.CodeInspected:
		v := out.Lease
		if v == nil || v.LeaseID != in.LeaseID || v.Token != in.Token {
			return s, fmt.Errorf("inspect by id returned another lease")
		}
		if live {
			return s, diff(v, *s.Active, lease.StateActive)
		}
		st, ok := s.Ended.get(in.LeaseID)
		if !ok || v.State != st {
			return s, fmt.Errorf("inspect by id saw lease %s in state %s, the model has it %s",
				short(in.LeaseID), v.State, stateOr(st, ok))
		}
		return s, nil
	}
	return s, fmt.Errorf("inspect answered %s", out.Code)
}

func stateOr(st lease.State, ok bool) string {
	if !ok {
		return "never granted"
	}
	return string(st)
}

// notHeld explains why a request does not match the live lease.
func notHeld(s State, in Input, owner bool) string {
	a := s.Active
	switch {
	case a == nil:
		if st, ok := s.Ended.get(in.LeaseID); ok {
			return fmt.Sprintf("lease %s is %s and no lease is live", short(in.LeaseID), st)
		}
		return "no lease is live"
	case a.LeaseID != in.LeaseID || a.Token != in.Token:
		return fmt.Sprintf("the live lease is %s#%d, not %s#%d", short(a.LeaseID), a.Token, short(in.LeaseID), in.Token)
	case owner && a.Owner != in.Owner:
		return "the caller is not the owner"
	default:
		return "the service instance differs"
	}
}

// short abbreviates a lease id to its last 6 characters.
func short(id string) string {
	if len(id) > 6 {
		return "…" + id[len(id)-6:]
	}
	if id == "" {
		return "-"
	}
	return id
}

// partition splits a history by identity: the contract's state is per lock
// key, and operations on different keys commute.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	by := map[int][]porcupine.Operation{}
	var keys []int
	for _, op := range history {
		k := op.Input.(Input).Ident
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], op)
	}
	slices.Sort(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}

// Model is the porcupine model of the contract, partitioned by identity.
// Times in descriptions are milliseconds after base (Unix ms).
func Model(base int64) porcupine.Model {
	return porcupine.Model{
		Partition: partition,
		Init:      func() any { return State{} },
		Step: func(state, input, output any) (bool, any) {
			next, err := Step(state.(State), input.(Input), output.(Output))
			if err != nil {
				return false, state
			}
			return true, next
		},
		Equal:             func(a, b any) bool { return a.(State).Equal(b.(State)) },
		Hash:              func(s any) uint64 { return s.(State).Hash() },
		DescribeOperation: func(in, out any) string { return describeOp(base, in.(Input), out.(Output)) },
		DescribeState:     func(s any) string { return describeState(base, s.(State)) },
	}
}

func rel(base, ms int64) string {
	if ms == 0 {
		return "-"
	}
	return fmt.Sprintf("+%d", ms-base)
}

func describeOp(base int64, in Input, out Output) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", in.Kind)
	if in.LeaseID != "" {
		fmt.Fprintf(&b, " %s#%d", short(in.LeaseID), in.Token)
	}
	if in.Sink != "" {
		fmt.Fprintf(&b, " sink=%s", in.Sink)
	}
	if in.TTLMs != 0 {
		fmt.Fprintf(&b, " ttl=%d", in.TTLMs)
	}
	if in.Owner != "" {
		fmt.Fprintf(&b, " by %s/%s", short(in.Owner), short(in.Instance))
	}
	fmt.Fprintf(&b, " → %s @%s", out.Code, rel(base, decisionMs(in, out)))
	if out.Replayed {
		b.WriteString(" (replayed)")
	}
	if v := out.Lease; v != nil {
		fmt.Fprintf(&b, " [%s#%d %s renewed %s expires %s]", short(v.LeaseID), v.Token, v.State,
			rel(base, v.RenewedMs), rel(base, v.ExpiresMs))
	}
	if c := out.Commit; c != nil && out.Code == lease.CodeCommitAuthorized {
		fmt.Fprintf(&b, " [accepted %s#%d at %s]", short(c.LeaseID), c.Token, rel(base, c.AcceptedMs))
	}
	return b.String()
}

func describeState(base int64, s State) string {
	var b strings.Builder
	if a := s.Active; a != nil {
		fmt.Fprintf(&b, "active %s#%d by %s/%s renewed %s expires %s", short(a.LeaseID), a.Token,
			short(a.Owner), short(a.Instance), rel(base, a.RenewedMs), rel(base, a.ExpiresMs))
	} else {
		b.WriteString("no live lease")
	}
	fmt.Fprintf(&b, "; counter %d; latest %s", s.Counter, short(s.Latest))
	if len(s.Marks) > 0 {
		b.WriteString("; marks")
		for _, m := range s.Marks {
			fmt.Fprintf(&b, " %s=%d", m.Sink, m.Token)
		}
	}
	fmt.Fprintf(&b, "; %d ended; at %s", s.Ended.len(), rel(base, s.Last))
	return b.String()
}
