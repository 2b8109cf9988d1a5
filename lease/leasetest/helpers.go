package leasetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// bg is the context of every call: the suite bounds calls with DeadlineAt,
// the contract's deadline, not with context cancellation.
var bg = context.Background()

// Long is the TTL of leases that must stay live for the whole subtest.
const Long = 30 * time.Second

// uid returns prefix followed by 16 random lower-case hex digits: valid both
// as an identity component and as an opaque id.
func uid(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// deadline is a finite deadline comfortably in the future.
func deadline() time.Time { return time.Now().Add(10 * time.Second) }

// past is a deadline that has already elapsed.
func past() time.Time { return time.Now().Add(-time.Second) }

// newIdentity returns a canonical identity no other subtest uses: its
// tenant, program and target are random, so list and history filters see
// only this subtest's leases.
func newIdentity() lease.Identity {
	return lease.Identity{
		TenantID:        uid("tenant-"),
		ProgramID:       uid("program-"),
		TargetNamespace: "starintel-target",
		TargetID:        uid("target_"),
		ActorName:       "usernamegen",
		WorkflowName:    "default",
		OperationClass:  "default",
	}
}

func newCaller(class string) lease.Caller {
	return lease.Caller{
		PrincipalID:    uid("prn_" + class + "_"),
		PrincipalClass: class,
		ClientID:       uid("client_"),
		CredentialID:   uid("key_"),
		CorrelationID:  uid("corr_"),
	}
}

// callerOf is the security context of a record's owner.
func callerOf(rec *lease.Record) lease.Caller {
	return lease.Caller{PrincipalID: rec.OwnerPrincipalID, PrincipalClass: "actor",
		ClientID: rec.OwnerClientID, CredentialID: rec.OwnerCredentialID, CorrelationID: uid("corr_")}
}

// suite is shared by every subtest of one Run.
type suite struct {
	shared     Backend
	newBackend Factory
	opts       lease.StoreOptions
}

// env is one subtest's world on a backend: its own identity, owner,
// administrator and service instance.
type env struct {
	t        *testing.T
	s        *suite
	st       lease.Store
	faults   Faults
	id       lease.Identity // canonical
	key      string
	owner    lease.Caller
	admin    lease.Caller
	instance string
	// seqs is the last commit seq seen per lock key: every accepted
	// commit's is higher.
	seqs map[string]uint64
}

func (s *suite) env(t *testing.T) *env { return s.envOn(t, s.shared) }

func (s *suite) envOn(t *testing.T, b Backend) *env {
	e := &env{t: t, s: s, st: b.Store, faults: b.Faults, id: newIdentity(),
		owner: newCaller("actor"), admin: newCaller("admin"), instance: uid("instance_")}
	e.key = e.keyOf(e.id)
	return e
}

// on returns a copy of e reporting to t.
func (e *env) on(t *testing.T) *env { c := *e; c.t = t; return &c }

// leaf registers a parallel leaf subtest with a fresh env on the shared backend.
func (s *suite) leaf(t *testing.T, name string, f func(e *env)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		f(s.env(t))
	})
}

// group registers a parallel group of subtests.
func group(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		f(t)
	})
}

// canon normalizes id with the suite's operation classes.
func (e *env) canon(id lease.Identity) (lease.Identity, string) {
	e.t.Helper()
	c, key, err := lease.CanonicalLockKey(id, e.s.opts.OperationClasses)
	if err != nil {
		e.t.Fatalf("identity %+v is not valid: %v", id, err)
	}
	return c, key
}

func (e *env) keyOf(id lease.Identity) string { _, k := e.canon(id); return k }

// otherTarget is a second identity in e's tenant and program.
func (e *env) otherTarget() lease.Identity {
	id := e.id
	id.TargetID = uid("target_")
	return id
}

func (e *env) mutation(c lease.Caller) lease.Mutation {
	return lease.Mutation{RequestID: uid("req_"), DeadlineAt: deadline(), Caller: c}
}

// acquireReq is a valid acquire of e.id by e.owner with a Long TTL.
func (e *env) acquireReq() lease.AcquireRequest {
	return e.acquireReqFor(e.id, e.owner)
}

func (e *env) acquireReqFor(id lease.Identity, c lease.Caller) lease.AcquireRequest {
	return lease.AcquireRequest{
		Identity:          id,
		ServiceInstanceID: e.instance,
		TTL:               Long,
		MaximumLifetime:   5 * time.Minute,
		ExecutionID:       uid("execution_"),
		JobID:             uid("job_"),
		TraceID:           uid("trace_"),
		Metadata:          lease.Metadata{"purpose": "conformance", "attempt": "1"},
		Mutation:          e.mutation(c),
	}
}

// held names one exact lease: what renew, release and commit requests share.
type held struct {
	Identity  lease.Identity
	LeaseID   string
	Token     uint64
	Instance  string
	Caller    lease.Caller
	Execution string
	Job       string
	Trace     string
}

func heldOf(rec *lease.Record) held {
	return held{Identity: rec.Identity(), LeaseID: rec.LeaseID, Token: rec.FencingToken,
		Instance: rec.ServiceInstanceID, Caller: callerOf(rec), Execution: rec.ExecutionID, Job: rec.JobID, Trace: rec.TraceID}
}

func (h held) renew(e *env) lease.RenewRequest {
	return lease.RenewRequest{Identity: h.Identity, LeaseID: h.LeaseID, FencingToken: h.Token,
		ServiceInstanceID: h.Instance, Mutation: e.mutation(h.Caller)}
}

func (h held) release(e *env) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: h.Identity, LeaseID: h.LeaseID, FencingToken: h.Token,
		ServiceInstanceID: h.Instance, Mutation: e.mutation(h.Caller)}
}

// commit authorizes a write of a fresh document with a fresh payload.
func (h held) commit(sink string) lease.CommitRequest {
	return lease.CommitRequest{Identity: h.Identity, LeaseID: h.LeaseID, FencingToken: h.Token,
		ServiceInstanceID: h.Instance, Sink: sink, CommitID: uid("commit_"), ExecutionID: h.Execution,
		JobID: h.Job, TraceID: h.Trace, Target: uid("doc:"), PayloadSHA256: payloadDigest(uid("body_")),
		DeadlineAt: deadline(), Caller: h.Caller}
}

// payloadDigest is the hex SHA-256 a sink computes of a payload.
func payloadDigest(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}

func (e *env) renewReq(rec *lease.Record) lease.RenewRequest     { return heldOf(rec).renew(e) }
func (e *env) releaseReq(rec *lease.Record) lease.ReleaseRequest { return heldOf(rec).release(e) }
func (e *env) commitReq(rec *lease.Record, sink string) lease.CommitRequest {
	return heldOf(rec).commit(sink)
}

// adminReq force-releases or revokes rec as e.admin.
func (e *env) adminReq(rec *lease.Record) lease.AdminRequest {
	return lease.AdminRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
		Reason: "conformance: operator action", Mutation: e.mutation(e.admin)}
}

// admin dispatches an administrative operation.
func (e *env) adminOp(op lease.Op, r lease.AdminRequest) (lease.Result, error) {
	if op == lease.OpRevoke {
		return e.st.Revoke(bg, r)
	}
	return e.st.ForceRelease(bg, r)
}

// adminOutcome is the code and terminal state of an administrative operation.
func adminOutcome(op lease.Op) (lease.Code, lease.State) {
	if op == lease.OpRevoke {
		return lease.CodeRevoked, lease.StateRevoked
	}
	return lease.CodeForceReleased, lease.StateReleased
}

// ---- outcomes --------------------------------------------------------------

// mustCode asserts err is a *lease.Error with code want.
func mustCode(t *testing.T, err error, want lease.Code) *lease.Error {
	t.Helper()
	le, ok := checkCode(t, "", err, want)
	if !ok {
		t.FailNow()
	}
	return le
}

// checkCode is mustCode without stopping the test; label prefixes messages.
func checkCode(t *testing.T, label string, err error, want lease.Code) (*lease.Error, bool) {
	t.Helper()
	if label != "" {
		label += ": "
	}
	if err == nil {
		t.Errorf("%sgot success, want %s", label, want)
		return nil, false
	}
	var le *lease.Error
	if !errors.As(err, &le) {
		t.Errorf("%serror %T (%v) is not a *lease.Error", label, err, err)
		return nil, false
	}
	if le.Code != want {
		t.Errorf("%sgot %v, want %s", label, err, want)
		return le, false
	}
	return le, true
}

// mustInvalid asserts an invalid_request naming field: exactly, a sub-field
// of it ("metadata.k"), or it qualified by its enclosing object
// ("lock_identity.tenant_id" for a list filter's "tenant_id").
func mustInvalid(t *testing.T, err error, field string) {
	t.Helper()
	le := mustCode(t, err, lease.CodeInvalidRequest)
	if le.Field == "" {
		t.Fatalf("invalid_request without a field: %v", err)
	}
	if le.Field != field && !strings.HasPrefix(le.Field, field+".") && !strings.HasSuffix(le.Field, "."+field) {
		t.Fatalf("invalid_request field %q, want %q (%v)", le.Field, field, err)
	}
}

// success asserts a first-time (not replayed) success with a lease.
func (e *env) success(op string, res lease.Result, err error, want lease.Code) *lease.Record {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v, want %s", op, err, want)
	}
	if res.Code != want {
		e.t.Fatalf("%s: code %q, want %q", op, res.Code, want)
	}
	if res.Lease == nil {
		e.t.Fatalf("%s: success without a lease", op)
	}
	if res.Replayed {
		e.t.Fatalf("%s: first attempt reported as replayed", op)
	}
	e.valid(op, res.Lease)
	return res.Lease
}

// replayed asserts a replay of original by the same request.
func (e *env) replayed(op string, res lease.Result, err error, want lease.Code, original *lease.Record) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s retry: %v, want replay of %s", op, err, want)
	}
	if res.Code != want || !res.Replayed {
		e.t.Fatalf("%s retry: code %q replayed=%v, want %q replayed", op, res.Code, res.Replayed, want)
	}
	if res.Lease == nil {
		e.t.Fatalf("%s retry: replay without the original lease", op)
	}
	sameRecord(e.t, op+" replay", res.Lease, original)
}

// valid asserts rec satisfies the record invariants (the strict decoder
// accepts its encoding).
func (e *env) valid(what string, rec *lease.Record) {
	e.t.Helper()
	b, err := rec.Encode()
	if err == nil {
		_, err = lease.DecodeRecord(b)
	}
	if err != nil {
		e.t.Fatalf("%s: returned record is not a valid v1 record: %v\n%s", what, err, js(rec))
	}
}

func (e *env) mustAcquire(r lease.AcquireRequest) *lease.Record {
	e.t.Helper()
	res, err := e.st.Acquire(bg, r)
	rec := e.success("acquire", res, err, lease.CodeAcquired)
	e.checkNewLease(rec, r)
	return rec
}

// grab acquires e.id for e.owner with a Long TTL.
func (e *env) grab() *lease.Record { e.t.Helper(); return e.mustAcquire(e.acquireReq()) }

// grabShort acquires e.id with TTL Short.
func (e *env) grabShort() *lease.Record {
	e.t.Helper()
	r := e.acquireReq()
	r.TTL = Short
	return e.mustAcquire(r)
}

// checkNewLease asserts every field of a fresh lease against its request.
func (e *env) checkNewLease(rec *lease.Record, r lease.AcquireRequest) {
	e.t.Helper()
	id, key := e.canon(r.Identity)
	var bad []string
	check := func(name string, got, want any) {
		if got != want {
			bad = append(bad, fmt.Sprintf("%s = %v, want %v", name, got, want))
		}
	}
	check("record_version", rec.RecordVersion, lease.RecordVersion)
	check("identity", rec.Identity(), id)
	check("lock_key", rec.LockKey, key)
	check("lease_id has prefix lease_", strings.HasPrefix(rec.LeaseID, "lease_"), true)
	check("owner_principal_id", rec.OwnerPrincipalID, r.Caller.PrincipalID)
	check("owner_client_id", rec.OwnerClientID, r.Caller.ClientID)
	check("owner_credential_id", rec.OwnerCredentialID, r.Caller.CredentialID)
	check("service_instance_id", rec.ServiceInstanceID, r.ServiceInstanceID)
	check("execution_id", rec.ExecutionID, r.ExecutionID)
	check("job_id", rec.JobID, r.JobID)
	check("trace_id", rec.TraceID, r.TraceID)
	check("request_id", rec.RequestID, r.RequestID)
	check("ttl_ms", rec.TTLMs, r.TTL.Milliseconds())
	check("maximum_lifetime_ms", rec.MaximumLifetimeMs, r.MaximumLifetime.Milliseconds())
	check("state", rec.State, lease.StateActive)
	check("renewed_at", rec.RenewedAt, rec.AcquiredAt)
	check("expires_at", rec.ExpiresAt, rec.AcquiredAt.Add(min(r.TTL, r.MaximumLifetime)))
	check("fencing_token in range", rec.FencingToken >= 1 && rec.FencingToken <= lease.MaxFencingToken, true)
	check("metadata", js(orEmpty(rec.Metadata)), js(orEmpty(r.Metadata)))
	if skew := time.Since(rec.AcquiredAt.Time()); skew > 5*time.Second || skew < -5*time.Second {
		bad = append(bad, fmt.Sprintf("acquired_at %v is %v away from the local clock", rec.AcquiredAt, skew))
	}
	if len(bad) > 0 {
		e.t.Fatalf("acquired record does not match its request:\n  %s\nrecord: %s", strings.Join(bad, "\n  "), js(rec))
	}
}

func orEmpty(m lease.Metadata) lease.Metadata {
	if m == nil {
		return lease.Metadata{}
	}
	return m
}

func (e *env) mustRenew(r lease.RenewRequest) *lease.Record {
	e.t.Helper()
	res, err := e.st.Renew(bg, r)
	rec := e.success("renew", res, err, lease.CodeRenewed)
	if rec.LeaseID != r.LeaseID || rec.FencingToken != r.FencingToken || rec.State != lease.StateActive {
		e.t.Fatalf("renew returned another lease or state: %s", js(rec))
	}
	return rec
}

func (e *env) mustRelease(r lease.ReleaseRequest) *lease.Record {
	e.t.Helper()
	res, err := e.st.Release(bg, r)
	rec := e.success("release", res, err, lease.CodeReleased)
	if rec.LeaseID != r.LeaseID || rec.FencingToken != r.FencingToken || rec.State != lease.StateReleased {
		e.t.Fatalf("release returned another lease or state: %s", js(rec))
	}
	return rec
}

func (e *env) mustAdmin(op lease.Op, r lease.AdminRequest) *lease.Record {
	e.t.Helper()
	code, state := adminOutcome(op)
	res, err := e.adminOp(op, r)
	rec := e.success(string(op), res, err, code)
	if rec.LeaseID != r.LeaseID || rec.FencingToken != r.FencingToken || rec.State != state {
		e.t.Fatalf("%s returned another lease or state: %s", op, js(rec))
	}
	return rec
}

func (e *env) mustCommit(r lease.CommitRequest) lease.Commit {
	e.t.Helper()
	res, err := e.st.AuthorizeCommit(bg, r)
	if err != nil {
		e.t.Fatalf("authorize commit: %v", err)
	}
	if res.Code != lease.CodeCommitAuthorized || res.Replayed {
		e.t.Fatalf("authorize commit: code %q replayed=%v, want first %s", res.Code, res.Replayed, lease.CodeCommitAuthorized)
	}
	c := res.Commit
	want := lease.Commit{Sink: r.Sink, CommitID: r.CommitID, LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ExecutionID: r.ExecutionID, JobID: r.JobID, TraceID: r.TraceID, Target: r.Target, PayloadSHA256: r.PayloadSHA256,
		Seq: c.Seq, AcceptedAt: c.AcceptedAt, Digest: c.Digest}
	_, key, _ := lease.CanonicalLockKey(r.Identity, StoreOptions().OperationClasses)
	if e.seqs == nil {
		e.seqs = map[string]uint64{}
	}
	if c.Seq <= e.seqs[key] || c.Seq > lease.MaxFencingToken {
		e.t.Fatalf("commit seq %d after %d: an identity's commit seq must strictly increase", c.Seq, e.seqs[key])
	}
	e.seqs[key] = c.Seq
	if r.Outbox != nil {
		// A publication is its own write: the message id and the body.
		want.Target, want.PayloadSHA256 = outboxMessageID(e.t, r), payloadDigest(string(r.Outbox.Body))
	}
	if c != want || c.AcceptedAt.IsZero() {
		e.t.Fatalf("accepted commit %+v does not match request, want %+v", c, want)
	}
	return c
}

// ---- reads -----------------------------------------------------------------

func (e *env) inspect(id lease.Identity) (*lease.Record, error) {
	e.t.Helper()
	res, err := e.st.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: deadline(), Caller: e.owner})
	if err != nil {
		return nil, err
	}
	if res.Code != lease.CodeInspected || res.Lease == nil {
		e.t.Fatalf("inspect: code %q lease %v, want %s with a lease", res.Code, res.Lease, lease.CodeInspected)
	}
	return res.Lease, nil
}

// active asserts id has a live active lease and returns it.
func (e *env) active(id lease.Identity) *lease.Record {
	e.t.Helper()
	rec, err := e.inspect(id)
	if err != nil {
		e.t.Fatalf("inspect %s: %v, want the active lease", id.TargetID, err)
	}
	if rec.State != lease.StateActive {
		e.t.Fatalf("inspect %s: state %s, want active", id.TargetID, rec.State)
	}
	e.valid("inspect", rec)
	return rec
}

// noActive asserts id has no live lease: not found, or an active-shaped
// record already reported as expired.
func (e *env) noActive(id lease.Identity) {
	e.t.Helper()
	rec, err := e.inspect(id)
	if err != nil {
		mustCode(e.t, err, lease.CodeNotFound)
		return
	}
	if rec.State != lease.StateExpired {
		e.t.Fatalf("inspect %s: %s lease %s, want none or expired", id.TargetID, rec.State, rec.LeaseID)
	}
}

func (e *env) inspectID(leaseID string) (*lease.Record, error) {
	e.t.Helper()
	res, err := e.st.Inspect(bg, lease.InspectRequest{LeaseID: leaseID, DeadlineAt: deadline(), Caller: e.owner})
	if err != nil {
		return nil, err
	}
	if res.Code != lease.CodeInspected || res.Lease == nil {
		e.t.Fatalf("inspect by id: code %q lease %v, want %s with a lease", res.Code, res.Lease, lease.CodeInspected)
	}
	return res.Lease, nil
}

// byID asserts the lease exists (active or terminal) and returns it.
func (e *env) byID(leaseID string) *lease.Record {
	e.t.Helper()
	rec, err := e.inspectID(leaseID)
	if err != nil {
		e.t.Fatalf("inspect lease %s: %v", leaseID, err)
	}
	if rec.LeaseID != leaseID {
		e.t.Fatalf("inspect lease %s returned lease %s", leaseID, rec.LeaseID)
	}
	return rec
}

// stateOf asserts the lease's state read back by id.
func (e *env) stateOf(leaseID string, want lease.State) *lease.Record {
	e.t.Helper()
	rec := e.byID(leaseID)
	if rec.State != want {
		e.t.Fatalf("lease %s: state %s, want %s", leaseID, rec.State, want)
	}
	return rec
}

func (e *env) counter(key string) uint64 {
	e.t.Helper()
	n, err := e.faults.Counter(bg, key)
	if err != nil {
		e.t.Fatalf("read counter: %v", err)
	}
	return n
}

func (e *env) setCounter(key string, v uint64) {
	e.t.Helper()
	if err := e.faults.SetCounter(bg, key, v); err != nil {
		e.t.Fatalf("set counter: %v", err)
	}
}

func (e *env) wantCounter(key string, want uint64) {
	e.t.Helper()
	if got := e.counter(key); got != want {
		e.t.Fatalf("fencing counter = %d, want %d", got, want)
	}
}

// history reads every page of id's terminal evidence, newest first.
func (e *env) history(id lease.Identity) []lease.HistoryEntry {
	e.t.Helper()
	var out []lease.HistoryEntry
	tok := ""
	for page := 0; ; page++ {
		if page > 100 {
			e.t.Fatalf("history does not terminate")
		}
		res, err := e.st.History(bg, lease.HistoryRequest{Identity: id, PageToken: tok, DeadlineAt: deadline(), Caller: e.admin})
		if err != nil {
			e.t.Fatalf("history: %v", err)
		}
		out = append(out, res.Entries...)
		if tok = res.NextPageToken; tok == "" {
			return out
		}
	}
}

// historyStates lists (lease id, state) of id's history, newest first.
func (e *env) historyStates(id lease.Identity) []string {
	e.t.Helper()
	var out []string
	for _, h := range e.history(id) {
		if h.Record == nil {
			e.t.Fatalf("history entry without a record: %+v", h)
		}
		out = append(out, h.Record.LeaseID+":"+string(h.Record.State))
	}
	return out
}

func wantStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// list reads every page of a list request.
func (e *env) list(r lease.ListRequest) []*lease.Record {
	e.t.Helper()
	var out []*lease.Record
	for page := 0; ; page++ {
		if page > 1000 {
			e.t.Fatalf("list does not terminate")
		}
		r.DeadlineAt = deadline()
		res, err := e.st.List(bg, r)
		if err != nil {
			e.t.Fatalf("list %+v: %v", r, err)
		}
		out = append(out, res.Leases...)
		if r.PageToken = res.NextPageToken; r.PageToken == "" {
			return out
		}
	}
}

func leaseIDs(recs []*lease.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.LeaseID
	}
	return out
}

// ---- state snapshots -------------------------------------------------------

// snap captures everything readable about id: counter, the inspected active
// lease (or the error code) and the history.
func (e *env) snap(id lease.Identity) string {
	e.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "counter=%d\n", e.counter(e.keyOf(id)))
	if rec, err := e.inspect(id); err != nil {
		fmt.Fprintf(&b, "active=%s\n", lease.CodeOf(err))
	} else {
		fmt.Fprintf(&b, "active=%s\n", js(rec))
	}
	for _, h := range e.history(id) {
		fmt.Fprintf(&b, "history=%s\n", js(h))
	}
	return b.String()
}

// unchanged asserts id reads back exactly as in before.
func (e *env) unchanged(id lease.Identity, before string) {
	e.t.Helper()
	if after := e.snap(id); after != before {
		e.t.Fatalf("state of %s changed:\nbefore:\n%s\nafter:\n%s", id.TargetID, before, after)
	}
}

// js renders v as JSON for comparison and messages; nil metadata renders as {}.
func js(v any) string {
	switch x := v.(type) {
	case *lease.Record:
		if x != nil && x.Metadata == nil {
			c := x.Clone()
			c.Metadata = lease.Metadata{}
			v = c
		}
	case lease.HistoryEntry:
		if x.Record != nil && x.Record.Metadata == nil {
			x.Record = x.Record.Clone()
			x.Record.Metadata = lease.Metadata{}
			v = x
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// sameRecord asserts two records are identical field by field.
func sameRecord(t *testing.T, what string, got, want *lease.Record) {
	t.Helper()
	if got == nil || want == nil {
		if got != want {
			t.Fatalf("%s: got %s, want %s", what, js(got), js(want))
		}
		return
	}
	if g, w := js(got), js(want); g != w {
		t.Fatalf("%s: records differ\n got  %s\n want %s", what, g, w)
	}
}

// waitExpired waits until the backend reports rec expired: sleep until just
// past expires_at by the local clock, then poll the backend's own view.
func (e *env) waitExpired(rec *lease.Record) {
	e.t.Helper()
	time.Sleep(time.Until(rec.ExpiresAt.Time()) + 10*time.Millisecond)
	limit := time.Now().Add(5 * time.Second)
	for {
		got := e.byID(rec.LeaseID)
		if got.State != lease.StateActive {
			if got.State != lease.StateExpired {
				e.t.Fatalf("lease %s: state %s while waiting for expiry", rec.LeaseID, got.State)
			}
			return
		}
		if time.Now().After(limit) {
			e.t.Fatalf("lease %s still active 5s after its expires_at %v", rec.LeaseID, rec.ExpiresAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outboxMessageID is the message id of r's publication as every backend
// derives it.
func outboxMessageID(t *testing.T, r lease.CommitRequest) string {
	t.Helper()
	_, p, err := lease.PrepareCommit(r, StoreOptions())
	if err != nil {
		t.Fatalf("prepare commit: %v", err)
	}
	return lease.OutboxMessageID(p.Scope)
}
