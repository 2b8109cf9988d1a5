package race

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/starintel/starlease/lease"
)

// Kind names a recorded operation.
type Kind string

// The recorded operations. InspectID is Inspect by lease id.
const (
	KindAcquire      Kind = "acquire"
	KindRenew        Kind = "renew"
	KindRelease      Kind = "release"
	KindForceRelease Kind = "force_release"
	KindRevoke       Kind = "revoke"
	KindCommit       Kind = "commit"
	KindInspect      Kind = "inspect"
	KindInspectID    Kind = "inspect_id"
)

// Input is what a worker asked: the request fields the model needs. Ident
// (the identity's index) is the partition key: one identity, one lock key.
type Input struct {
	Kind     Kind   `json:"kind"`
	Ident    int    `json:"ident"`
	Owner    string `json:"owner,omitempty"` // caller principal
	Instance string `json:"instance,omitempty"`
	LeaseID  string `json:"lease_id,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	// TTLMs is the requested TTL (acquire; renew, where 0 keeps the lease's).
	TTLMs         int64  `json:"ttl_ms,omitempty"`
	MaxLifetimeMs int64  `json:"max_lifetime_ms,omitempty"`
	Sink          string `json:"sink,omitempty"`
	// RequestID is the request id of a mutation or the commit id of a commit.
	RequestID string `json:"request_id,omitempty"`
}

// LeaseView is the part of a returned record the model checks.
type LeaseView struct {
	LeaseID       string      `json:"lease_id"`
	Owner         string      `json:"owner"`
	Instance      string      `json:"instance"`
	Token         uint64      `json:"token"`
	AcquiredMs    int64       `json:"acquired_ms"`
	RenewedMs     int64       `json:"renewed_ms"`
	ExpiresMs     int64       `json:"expires_ms"`
	TTLMs         int64       `json:"ttl_ms"`
	MaxLifetimeMs int64       `json:"max_lifetime_ms"`
	State         lease.State `json:"state"`
}

// CommitView is the part of an accepted commit the model checks.
type CommitView struct {
	Sink       string `json:"sink"`
	LeaseID    string `json:"lease_id"`
	Token      uint64 `json:"token"`
	AcceptedMs int64  `json:"accepted_ms"`
}

// Output is what the backend answered. BackendMs is the backend time of the
// decision in Unix milliseconds (Result.BackendTime, CommitResult.BackendTime
// or lease.Error.BackendTime), 0 when the backend reported none.
type Output struct {
	Code      lease.Code  `json:"code"`
	BackendMs int64       `json:"backend_ms,omitempty"`
	Replayed  bool        `json:"replayed,omitempty"`
	Lease     *LeaseView  `json:"lease,omitempty"`
	Commit    *CommitView `json:"commit,omitempty"`
	Reason    string      `json:"reason,omitempty"`
	// Attempts counts the calls made to resolve an outcome_unknown with the
	// same request id (1 when the first answer was definite).
	Attempts int `json:"attempts,omitempty"`
	// Lookups counts the LookupRequest calls made to resolve an
	// outcome_unknown (Options.ResolveByLookup); ByLookup reports that one
	// found the answer (the original result).
	Lookups  int  `json:"lookups,omitempty"`
	ByLookup bool `json:"by_lookup,omitempty"`
}

func msOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func viewOf(r *lease.Record) *LeaseView {
	if r == nil {
		return nil
	}
	return &LeaseView{LeaseID: r.LeaseID, Owner: r.OwnerPrincipalID, Instance: r.ServiceInstanceID,
		Token: r.FencingToken, AcquiredMs: r.AcquiredAt.UnixMilli(), RenewedMs: r.RenewedAt.UnixMilli(),
		ExpiresMs: r.ExpiresAt.UnixMilli(), TTLMs: r.TTLMs, MaxLifetimeMs: r.MaximumLifetimeMs, State: r.State}
}

// resultOutput converts a Store answer to an Output.
func resultOutput(res lease.Result, err error) Output {
	if err != nil {
		return errorOutput(err)
	}
	var ms int64
	if !res.BackendTime.IsZero() {
		ms = res.BackendTime.UnixMilli()
	}
	return Output{Code: res.Code, BackendMs: ms, Replayed: res.Replayed, Lease: viewOf(res.Lease)}
}

func commitOutput(res lease.CommitResult, err error) Output {
	if err != nil {
		return errorOutput(err)
	}
	var ms int64
	if !res.BackendTime.IsZero() {
		ms = res.BackendTime.UnixMilli()
	}
	c := res.Commit
	return Output{Code: res.Code, BackendMs: ms, Replayed: res.Replayed,
		Commit: &CommitView{Sink: c.Sink, LeaseID: c.LeaseID, Token: c.FencingToken, AcceptedMs: msOfTS(c.AcceptedAt)}}
}

func msOfTS(ts lease.Timestamp) int64 {
	if ts.IsZero() {
		return 0
	}
	return ts.UnixMilli()
}

func errorOutput(err error) Output {
	le := lease.AsError(err)
	return Output{Code: le.Code, BackendMs: msOf(le.BackendTime), Reason: le.Reason}
}

// Ack is a success the traffic was told of, with the request that got it,
// for tests that read acknowledged results back after the run (a store
// must not lose them, whatever happened to the backend): an acquisition
// (Acquire and Lease) or an accepted commit (Commit and Accepted).
type Ack struct {
	Ident    int
	Acquire  *lease.AcquireRequest
	Lease    *lease.Record
	Commit   *lease.CommitRequest
	Accepted *lease.Commit
}

// History is a recorded run: every completed operation with its call and
// return times (nanoseconds on the monotonic clock since the run started),
// input and output, as porcupine checks them.
type History struct {
	// Writes are the guarded sink writes made after authorizations; Check
	// verifies each accepted one against its authorization.
	Writes *guardedWrites

	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	acks  []Ack
	// tainted maps an identity to why its history cannot be checked (an
	// outcome_unknown that retries with the same request id did not resolve).
	tainted map[int]string
	// Identities is how many identities (partitions) the run used.
	Identities int
	// Elapsed is the wall time of the traffic.
	Elapsed time.Duration
}

// NewHistory starts an empty history whose clock starts now.
func NewHistory(identities int) *History {
	return &History{start: time.Now(), tainted: map[int]string{}, Identities: identities}
}

// now is the monotonic time since the history started, in nanoseconds.
func (h *History) now() int64 { return int64(time.Since(h.start)) }

// Add records one completed operation.
func (h *History) Add(client int, in Input, call int64, out Output, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret,
		Metadata: in.RequestID})
}

// ack records an acknowledged acquisition or commit.
func (h *History) ack(a Ack) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acks = append(h.acks, a)
}

// Acks returns the acknowledged acquisitions and commits, in the order
// they were acknowledged.
func (h *History) Acks() []Ack {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.acks)
}

// Taint marks an identity's history as uncheckable.
func (h *History) Taint(ident int, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.tainted[ident]; !ok {
		h.tainted[ident] = why
	}
}

// Operations returns a copy of the recorded operations, ordered by call time.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := slices.Clone(h.ops)
	slices.SortStableFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	return ops
}

// Tainted returns the identities whose history cannot be checked, and why.
func (h *History) Tainted() map[int]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[int]string, len(h.tainted))
	for k, v := range h.tainted {
		out[k] = v
	}
	return out
}

// jsonOp is one operation as written to history.json.
type jsonOp struct {
	Client int    `json:"client"`
	CallNs int64  `json:"call_ns"`
	RetNs  int64  `json:"return_ns"`
	Input  Input  `json:"input"`
	Output Output `json:"output"`
}

// MarshalJSON writes the history for triage, one operation per element.
func (h *History) MarshalJSON() ([]byte, error) {
	ops := h.Operations()
	out := make([]jsonOp, 0, len(ops))
	for _, op := range ops {
		in, ok1 := op.Input.(Input)
		o, ok2 := op.Output.(Output)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("race: foreign operation in history")
		}
		out = append(out, jsonOp{Client: op.ClientId, CallNs: op.Call, RetNs: op.Return, Input: in, Output: o})
	}
	return json.Marshal(out)
}
