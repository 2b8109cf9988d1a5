package leasetest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// forged is a valid active record of id owned by e.owner, as a backend would
// have written it, with token 3.
func (e *env) forged(id lease.Identity) *lease.Record {
	e.t.Helper()
	c, key := e.canon(id)
	now := lease.At(time.Now())
	r := &lease.Record{RecordVersion: lease.RecordVersion, LockKey: key, LeaseID: lease.NewLeaseID(now),
		OwnerPrincipalID: e.owner.PrincipalID, OwnerClientID: e.owner.ClientID, OwnerCredentialID: e.owner.CredentialID,
		ServiceInstanceID: e.instance, FencingToken: 3, AcquiredAt: now, RenewedAt: now, ExpiresAt: now.Add(Long),
		TTLMs: Long.Milliseconds(), MaximumLifetimeMs: (5 * time.Minute).Milliseconds(), ExecutionID: uid("execution_"),
		JobID: uid("job_"), TraceID: uid("trace_"), RequestID: uid("req_"), Metadata: lease.Metadata{}, State: lease.StateActive}
	r.SetIdentity(c)
	return r
}

// rawJSON encodes rec without validation, then applies edits to its
// top-level fields.
func rawJSON(rec *lease.Record, edits map[string]any) []byte {
	b, err := json.Marshal(rec)
	if err != nil {
		panic(err)
	}
	if len(edits) == 0 {
		return b
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	for k, v := range edits {
		m[k] = v
	}
	b, err = json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func (e *env) putRaw(key string, raw []byte) {
	e.t.Helper()
	if err := e.faults.PutRawActive(bg, key, raw); err != nil {
		e.t.Fatalf("put raw active record: %v", err)
	}
}

// corruption builds the raw bytes stored as e.id's active record, and the
// lease those bytes claim (requests name it).
type corruption struct {
	name string
	raw  func(e *env) ([]byte, *lease.Record)
}

func corruptions() []corruption {
	self := func(edits map[string]any) func(e *env) ([]byte, *lease.Record) {
		return func(e *env) ([]byte, *lease.Record) { f := e.forged(e.id); return rawJSON(f, edits), f }
	}
	return []corruption{
		{"bad_json", func(e *env) ([]byte, *lease.Record) {
			f := e.forged(e.id)
			b := rawJSON(f, nil)
			return b[:len(b)/2], f
		}},
		{"not_an_object", func(e *env) ([]byte, *lease.Record) { return []byte(`["v1"]`), e.forged(e.id) }},
		{"unknown_top_level_field", self(map[string]any{"owner_secret": "hunter2"})},
		{"duplicate_top_level_key", func(e *env) ([]byte, *lease.Record) {
			// A second "state" a lenient decoder would let win.
			f := e.forged(e.id)
			b := rawJSON(f, nil)
			return append(b[:len(b)-1], []byte(`,"state":"released"}`)...), f
		}},
		{"case_variant_key", func(e *env) ([]byte, *lease.Record) {
			f := e.forged(e.id)
			return []byte(strings.Replace(string(rawJSON(f, nil)), `"fencing_token"`, `"Fencing_Token"`, 1)), f
		}},
		{"record_version_2", self(map[string]any{"record_version": 2})},
		{"unknown_state", self(map[string]any{"state": "locked"})},
		{"fencing_token_out_of_range", self(map[string]any{"fencing_token": lease.MaxFencingToken + 1})},
		{"tuple_of_another_identity", func(e *env) ([]byte, *lease.Record) {
			// A valid record, but of another identity: its key is not ours.
			f := e.forged(e.otherTarget())
			return rawJSON(f, nil), f
		}},
		{"tuple_does_not_hash_to_lock_key", func(e *env) ([]byte, *lease.Record) {
			f := e.forged(e.otherTarget())
			f.LockKey = e.key
			return rawJSON(f, nil), f
		}},
		{"noncanonical_stored_tuple", func(e *env) ([]byte, *lease.Record) {
			f := e.forged(e.id)
			f.TenantID = strings.ToUpper(f.TenantID)
			return rawJSON(f, nil), f
		}},
		{"expired_looking_with_unknown_field", func(e *env) ([]byte, *lease.Record) {
			// Looking expired must not let anyone acquire over ambiguity.
			f := e.forged(e.id)
			f.AcquiredAt = f.AcquiredAt.Add(-time.Minute)
			f.RenewedAt, f.ExpiresAt = f.AcquiredAt, f.AcquiredAt.Add(time.Second)
			return rawJSON(f, map[string]any{"extra": true}), f
		}},
	}
}

// corruptOps are every operation on an identity whose active record is
// corrupt; h names the lease the corrupt bytes claim, on that identity.
func corruptOps(e *env, h held) []struct {
	name string
	call func() error
} {
	admin := lease.AdminRequest{Identity: h.Identity, LeaseID: h.LeaseID, FencingToken: h.Token,
		Reason: "conformance: corrupt record", Mutation: e.mutation(e.admin)}
	return []struct {
		name string
		call func() error
	}{
		{"acquire_by_other_owner", func() error {
			return errOf(e.st.Acquire(bg, e.acquireReqFor(h.Identity, newCaller("actor"))))
		}},
		{"acquire_by_claimed_owner", func() error { return errOf(e.st.Acquire(bg, e.acquireReqFor(h.Identity, h.Caller))) }},
		{"renew", func() error { return errOf(e.st.Renew(bg, h.renew(e))) }},
		{"release", func() error { return errOf(e.st.Release(bg, h.release(e))) }},
		{"inspect", func() error {
			return errOf(e.st.Inspect(bg, lease.InspectRequest{Identity: h.Identity, DeadlineAt: deadline(), Caller: e.owner}))
		}},
		{"force_release", func() error { a := admin; a.RequestID = uid("req_"); return errOf(e.st.ForceRelease(bg, a)) }},
		{"revoke", func() error { a := admin; a.RequestID = uid("req_"); return errOf(e.st.Revoke(bg, a)) }},
		{"commit", func() error { _, err := e.st.AuthorizeCommit(bg, h.commit("couchdb")); return err }},
	}
}

// malformed_corrupt_record: fail closed with a typed corrupt result, never
// overwrite, no acquisition over ambiguity; other identities unaffected.
func (s *suite) corruptRecords(t *testing.T) {
	for _, c := range corruptions() {
		s.leaf(t, c.name, func(e *env) {
			e.setCounter(e.key, 3)
			raw, claimed := c.raw(e)
			e.putRaw(e.key, raw)
			h := heldOf(claimed)
			h.Identity, h.Caller = e.id, e.owner
			// The backend's own expiry cleanup must not clear it either.
			e.expireIfCurrentKey(e.key, claimed.LeaseID, claimed.FencingToken)
			for round := 0; round < 2; round++ {
				for _, op := range corruptOps(e, h) {
					checkCode(e.t, op.name, op.call(), lease.CodeCorrupt)
				}
			}
			e.wantCounter(e.key, 3)
			res, err := e.st.History(bg, lease.HistoryRequest{Identity: e.id, DeadlineAt: deadline(), Caller: e.admin})
			if err != nil {
				mustCode(e.t, err, lease.CodeCorrupt)
			} else if len(res.Entries) != 0 {
				e.t.Fatalf("corrupt record produced terminal evidence: %s", js(res.Entries))
			}
			if got := e.list(lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: e.owner.PrincipalID}); len(got) != 0 {
				e.t.Fatalf("corrupt record listed as a live lease: %s", js(got))
			}
		})
	}
	s.leaf(t, "does_not_block_other_identity", func(e *env) {
		e.putRaw(e.key, []byte(`{"record_version":`))
		other := e.otherTarget()
		rec := e.mustAcquire(e.acquireReqFor(other, e.owner))
		if rec.FencingToken != 1 {
			e.t.Fatalf("token %d on a clean identity", rec.FencingToken)
		}
		rec = e.mustRenew(e.renewReq(rec))
		e.mustCommit(e.commitReq(rec, "couchdb"))
		e.mustRelease(e.releaseReq(rec))
		wantStrings(e.t, "history of the clean identity", e.historyStates(other), []string{rec.LeaseID + ":released"})
		_, err := e.inspect(e.id)
		mustCode(e.t, err, lease.CodeCorrupt)
		_, err = e.st.Acquire(bg, e.acquireReq())
		mustCode(e.t, err, lease.CodeCorrupt)
		e.wantCounter(e.key, 0)
	})
}

// counter_approaches_numeric_limit: refuse acquisition; never wrap or reuse.
func (s *suite) counterLimit(t *testing.T) {
	s.leaf(t, "last_token_is_issued_once", func(e *env) {
		e.setCounter(e.key, lease.MaxFencingToken-1)
		rec := e.grab()
		if rec.FencingToken != lease.MaxFencingToken {
			e.t.Fatalf("token %d, want the last token %d", rec.FencingToken, lease.MaxFencingToken)
		}
		e.mustRelease(e.releaseReq(rec))
		_, err := e.st.Acquire(bg, e.acquireReq())
		mustCode(e.t, err, lease.CodeCounterExhausted)
		e.wantCounter(e.key, lease.MaxFencingToken)
		e.noActive(e.id)
		wantStrings(e.t, "history", e.historyStates(e.id), []string{rec.LeaseID + ":released"})
	})
	s.leaf(t, "refuse_never_wrap", func(e *env) {
		e.setCounter(e.key, lease.MaxFencingToken)
		before := e.snap(e.id)
		r := e.acquireReq()
		for i := 0; i < 2; i++ { // the refusal is not stored: a retry is refused again
			_, err := e.st.Acquire(bg, r)
			mustCode(e.t, err, lease.CodeCounterExhausted)
		}
		_, err := e.lookup(lease.OpAcquire, e.id, r.Caller.PrincipalID, r.RequestID)
		mustCode(e.t, err, lease.CodeNotFound)
		e.unchanged(e.id, before)
		e.wantCounter(e.key, lease.MaxFencingToken)
	})
	s.leaf(t, "other_identity_unaffected", func(e *env) {
		e.setCounter(e.key, lease.MaxFencingToken)
		_, err := e.st.Acquire(bg, e.acquireReq())
		mustCode(e.t, err, lease.CodeCounterExhausted)
		other := e.mustAcquire(e.acquireReqFor(e.otherTarget(), e.owner))
		if other.FencingToken != 1 {
			e.t.Fatalf("token %d on another identity", other.FencingToken)
		}
	})
}
