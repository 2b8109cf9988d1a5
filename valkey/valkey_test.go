package valkey

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

var bg = context.Background()

func uid(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

func newIdentity() lease.Identity {
	return lease.Identity{TenantID: uid("tenant-"), ProgramID: uid("program-"), TargetNamespace: "starintel-target",
		TargetID: uid("target_"), ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
}

func lockKey(t testing.TB, id lease.Identity) string {
	t.Helper()
	_, k, err := lease.CanonicalLockKey(id, leasetest.StoreOptions().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var owner = lease.Caller{PrincipalID: "prn_actor_1", ClientID: "client_1", CredentialID: "key_1"}

func far() time.Time { return time.Now().Add(10 * time.Second) }

func acquireReq(id lease.Identity) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance_1", TTL: 30 * time.Second,
		MaximumLifetime: 5 * time.Minute, ExecutionID: uid("execution_"), JobID: uid("job_"), TraceID: uid("trace_"),
		Metadata: lease.Metadata{"purpose": `quote " backslash \ <tag> & ünïcödé`, "n": 1.5, "ok": true, "nothing": nil},
		Mutation: lease.Mutation{RequestID: uid("req_"), DeadlineAt: far(), Caller: owner}}
}

func renewReq(r *lease.Record) lease.RenewRequest {
	return lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: uid("req_"), DeadlineAt: far(), Caller: owner}}
}

func releaseReq(r *lease.Record) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: uid("req_"), DeadlineAt: far(), Caller: owner}}
}

func adminReq(r *lease.Record) lease.AdminRequest {
	return lease.AdminRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		Reason: `operator said "stop" <now> & then`, IncidentID: "inc-1",
		Mutation: lease.Mutation{RequestID: uid("req_"), DeadlineAt: far(), Caller: lease.Caller{PrincipalID: "prn_admin_1"}}}
}

func commitReq(r *lease.Record) lease.CommitRequest {
	return lease.CommitRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Sink: "couchdb", CommitID: uid("commit_"), ExecutionID: r.ExecutionID,
		JobID: r.JobID, TraceID: r.TraceID, Target: uid("doc:"), DeadlineAt: far(), Caller: owner}
}

func mustCode(t *testing.T, err error, want lease.Code) {
	t.Helper()
	var le *lease.Error
	if !errors.As(err, &le) {
		t.Fatalf("got %T %v, want *lease.Error %s", err, err, want)
	}
	if le.Code != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

func get(t *testing.T, s *Store, key string) (string, bool) {
	t.Helper()
	v, err := s.client.Do(bg, s.client.B().Get().Key(key).Build()).ToString()
	if vk.IsValkeyNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

// sharedServer starts a durable server for one test.
func sharedServer(t *testing.T) *testenv.Redis {
	t.Helper()
	return testenv.StartRedis(t)
}

// The stored bytes of every kind of evidence are exactly what lease's own
// encoders produce, and decode strictly.
// Format 3 stores active records in version 2: exactly lease.CompactRecord's
// bytes, which DecodeStoredRecord reads back as the record.
func TestStoredBytesAreCanonical(t *testing.T) {
	for _, format := range []string{"", compactFormat, compactRecords} {
		t.Run(map[string]string{"": "version1", compactFormat: "compact", compactRecords: "compact_records"}[format], func(t *testing.T) {
			storedBytesAreCanonical(t, format)
		})
	}
}

// storedRecordWant is the stored form of rec in s's namespace format.
func storedRecordWant(t *testing.T, s *Store, rec *lease.Record) string {
	t.Helper()
	want, err := rec.Encode()
	if s.writes(compactRecords) {
		want, err = lease.CompactRecord(rec)
		if !bytes.HasPrefix(want, []byte(lease.RecordV2Prefix)) {
			t.Fatalf("the record has no version 2 form: %s", want)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(want)
}

func storedBytesAreCanonical(t *testing.T, format string) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	switch format {
	case compactFormat:
		if err := s.EnableCompactFormat(bg); err != nil {
			t.Fatal(err)
		}
	case compactRecords:
		if err := s.EnableCompactRecords(bg); err != nil {
			t.Fatal(err)
		}
	}
	id := newIdentity()
	tag := tagOf(lockKey(t, id))
	req := acquireReq(id)
	res, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := get(t, s, s.keys.active(tag))
	if !ok {
		t.Fatal("no active key")
	}
	if want := storedRecordWant(t, s, res.Lease); raw != want {
		t.Fatalf("stored record differs from its encoding:\n got  %s\n want %s", raw, want)
	}
	if got, err := lease.DecodeStoredRecord([]byte(raw)); err != nil || !reflect.DeepEqual(got, res.Lease) {
		t.Fatalf("stored record fails strict decoding: %+v %v", got, err)
	}
	if pttl, _ := s.client.Do(bg, s.client.B().Pttl().Key(s.keys.active(tag)).Build()).AsInt64(); pttl <= 0 {
		t.Fatalf("active key PTTL %d, want a TTL", pttl)
	}

	// Renew keeps the metadata bytes and re-encodes canonically.
	rn, err := s.Renew(bg, renewReq(res.Lease))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = get(t, s, s.keys.active(tag))
	if want := storedRecordWant(t, s, rn.Lease); raw != want {
		t.Fatalf("renewed record differs from its encoding:\n got  %s\n want %s", raw, want)
	}

	// Idempotency evidence.
	p := lease.IdempotencyScope(lease.OpAcquire, lockKey(t, id), owner.PrincipalID, req.RequestID)
	evRaw, ok := get(t, s, s.keys.idem(tag, p))
	if !ok {
		t.Fatal("no idempotency evidence")
	}
	// Stored in the namespace's format; a compact (version 2) one expands
	// to the canonical version 1 document, held to the same checks.
	if strings.HasPrefix(evRaw, lease.EvidenceV2Prefix) != s.writes(compactFormat) {
		t.Fatalf("evidence not in the namespace's format (compact %v): %q", s.writes(compactFormat), evRaw)
	}
	evRaw, ok = lease.ExpandEvidence(evRaw, res.Lease.Identity())
	if !ok {
		t.Fatal("evidence does not expand")
	}
	ev, err := lease.DecodeIdempotencyRecord([]byte(evRaw))
	if err != nil {
		t.Fatalf("evidence fails strict decoding: %v", err)
	}
	if b, _ := ev.Encode(); string(b) != evRaw {
		t.Fatalf("evidence differs from IdempotencyRecord.Encode:\n got  %s\n want %s", evRaw, b)
	}

	// Accepted commit.
	creq := commitReq(rn.Lease)
	cr, err := s.AuthorizeCommit(bg, creq)
	if err != nil {
		t.Fatal(err)
	}
	_, pc, _ := lease.PrepareCommit(creq, s.opts)
	cRaw, _ := get(t, s, s.keys.commit(tag, pc.Scope))
	if b, _ := lease.EncodeCommit(cr.Commit); string(b) != cRaw {
		t.Fatalf("commit differs from EncodeCommit:\n got  %s\n want %s", cRaw, b)
	}

	// History entry, with an administrator reason that needs escaping.
	if _, err := s.Revoke(bg, adminReq(rn.Lease)); err != nil {
		t.Fatal(err)
	}
	h := onlyHistoryEntry(t, s, tag)
	if h.Reason != adminReq(rn.Lease).Reason || h.IncidentID != "inc-1" || h.Record.State != lease.StateRevoked {
		t.Fatalf("history entry: %+v", h)
	}
	if _, ok := get(t, s, s.keys.active(tag)); ok {
		t.Fatal("active key survived revoke")
	}
}

// The function library's date arithmetic agrees with Go's on instants
// around leap days, century years and the epoch: records holding them are
// accepted and read back unchanged.
func TestTimestampsRoundTrip(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	for _, at := range []string{
		"1970-01-01T00:00:00.000Z", "2000-02-29T12:34:56.789Z", "2026-08-05T12:00:00.000Z", "2028-02-29T23:59:59.999Z",
		"2100-02-28T23:59:59.999Z", "2400-02-29T00:00:00.001Z", "2099-12-31T23:59:59.999Z", "9998-12-31T00:00:00.000Z",
	} {
		id := newIdentity()
		key := lockKey(t, id)
		acq, _ := lease.ParseTimestamp(at)
		rec := &lease.Record{RecordVersion: 1, LockKey: key, LeaseID: uid("lease_"), OwnerPrincipalID: "prn_1",
			OwnerClientID: "client_1", OwnerCredentialID: "key_1", ServiceInstanceID: "instance_1", FencingToken: 7,
			AcquiredAt: acq, RenewedAt: acq.Add(time.Second), ExpiresAt: acq.Add(24 * time.Hour), TTLMs: 86400000,
			MaximumLifetimeMs: 604800000, ExecutionID: "e", JobID: "j", RequestID: "r", State: lease.StateActive}
		rec.SetIdentity(lease.Identity{TenantID: id.TenantID, ProgramID: id.ProgramID, TargetNamespace: id.TargetNamespace,
			TargetID: id.TargetID, ActorName: id.ActorName, WorkflowName: "default", OperationClass: "default"})
		b, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		// Written with a TTL from now: the instants may lie in the past.
		if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.active(tagOf(key))).Value(string(b)).Px(time.Hour).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		res, err := s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
		if err != nil {
			t.Fatalf("%s: inspect: %v", at, err)
		}
		res.Lease.State = lease.StateActive // reported expired when in the past
		if got, _ := res.Lease.Encode(); !bytes.Equal(got, b) {
			t.Fatalf("%s: read back\n got  %s\n want %s", at, got, b)
		}
	}
}

// Corrupt active values fail closed on every operation, are never
// overwritten, and do not block a different identity.
func TestCorruptValuesFailClosed(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	f := faults{s}
	for _, c := range []struct {
		name  string
		raw   func(good []byte, foreign []byte) []byte
		noTTL bool
	}{
		{name: "bad_json", raw: func(g, _ []byte) []byte { return []byte(`{"record_version":1,`) }},
		{name: "not_an_object", raw: func(g, _ []byte) []byte { return []byte(`[1,2,3]`) }},
		{name: "version_2", raw: func(g, _ []byte) []byte {
			return bytes.Replace(g, []byte(`"record_version":1`), []byte(`"record_version":2`), 1)
		}},
		{name: "unknown_field", raw: func(g, _ []byte) []byte { return bytes.Replace(g, []byte(`,"state"`), []byte(`,"extra":1,"state"`), 1) }},
		{name: "reordered_fields", raw: nil}, // built below: needs the lock key
		{name: "foreign_tuple", raw: func(_, foreign []byte) []byte { return foreign }},
		{name: "no_ttl", raw: func(g, _ []byte) []byte { return g }, noTTL: true},
		{name: "trailing_data", raw: func(g, _ []byte) []byte { return append(append([]byte{}, g...), ' ') }},
		{name: "big_token", raw: func(g, _ []byte) []byte {
			return bytes.Replace(g, []byte(`"fencing_token":1,`), []byte(`"fencing_token":9007199254740993,`), 1)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			id, other := newIdentity(), newIdentity()
			key := lockKey(t, id)
			tag := tagOf(key)
			good, err := s.Acquire(bg, acquireReq(id))
			if err != nil {
				t.Fatal(err)
			}
			goodRaw, _ := good.Lease.Encode()
			fr := good.Lease.Clone()
			fr.SetIdentity(other)
			fr.LockKey = lockKey(t, other)
			foreign, _ := fr.Encode()
			var raw []byte
			if c.raw != nil {
				raw = c.raw(goodRaw, foreign)
			} else {
				// Valid JSON holding a valid record, but not in the layout
				// every writer writes: the library and lease.DecodeRecord
				// both fail closed.
				raw = bytes.Replace(goodRaw, []byte(`{"record_version":1,"lock_key":`+quote(key)+`,`),
					[]byte(`{"lock_key":`+quote(key)+`,"record_version":1,`), 1)
				if _, err := lease.DecodeRecord(raw); err == nil || lease.AsError(err).Code != lease.CodeCorrupt {
					t.Fatalf("lease.DecodeRecord of a reordered record: %v, want corrupt", err)
				}
			}
			if c.noTTL {
				if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.active(tag)).Value(string(raw)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			} else if err := f.PutRawActive(bg, key, raw); err != nil {
				t.Fatal(err)
			}
			before, _ := f.Counter(bg, key)
			rec := good.Lease

			_, err = s.Acquire(bg, acquireReq(id))
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.Renew(bg, renewReq(rec))
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.Release(bg, releaseReq(rec))
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.ForceRelease(bg, adminReq(rec))
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.Revoke(bg, adminReq(rec))
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.AuthorizeCommit(bg, commitReq(rec))
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
			mustCode(t, err, lease.CodeCorrupt)
			_, err = s.Inspect(bg, lease.InspectRequest{LeaseID: rec.LeaseID, DeadlineAt: far()})
			mustCode(t, err, lease.CodeCorrupt)
			if err := f.ExpireIfCurrent(bg, key, rec.LeaseID, rec.FencingToken); err != nil {
				t.Fatalf("expire cleanup: %v", err)
			}

			// Nothing was overwritten: the value, the counter, no history.
			if now, _ := get(t, s, s.keys.active(tag)); now != string(raw) {
				t.Fatalf("corrupt value was overwritten:\n got  %s\n want %s", now, raw)
			}
			if after, _ := f.Counter(bg, key); after != before {
				t.Fatalf("counter moved from %d to %d", before, after)
			}
			if n, _ := s.client.Do(bg, s.client.B().Llen().Key(s.keys.history(tag)).Build()).AsInt64(); n != 0 {
				t.Fatalf("history grew to %d", n)
			}
			if q, ok := get(t, s, s.keys.quarantine(tag)); !ok || q == "" {
				t.Fatal("no quarantine marker")
			}
			// The original acquire's evidence still replays.
			ar := acquireReq(id)
			ar.RequestID = rec.RequestID
			ar.ExecutionID, ar.JobID, ar.TraceID = rec.ExecutionID, rec.JobID, rec.TraceID
			lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: id, PrincipalID: owner.PrincipalID,
				RequestID: rec.RequestID, DeadlineAt: far()})
			if err != nil || lr.Lease.LeaseID != rec.LeaseID {
				t.Fatalf("evidence lookup: %v", err)
			}

			// A different identity is unaffected.
			o, err := s.Acquire(bg, acquireReq(other))
			if err != nil {
				t.Fatalf("other identity: %v", err)
			}
			if _, err := s.Release(bg, releaseReq(o.Lease)); err != nil {
				t.Fatalf("other identity release: %v", err)
			}
		})
	}
}

func quote(s string) string { return `"` + s + `"` }

// Keys holding the wrong type fail closed as corrupt, not as raw errors.
func TestWrongTypeKeysFailClosed(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	for _, c := range []struct {
		name string
		key  func(tag string) string
	}{
		{"active_is_a_list", func(tag string) string { return s.keys.active(tag) }},
		{"history_is_a_string", func(tag string) string { return s.keys.history(tag) }},
		{"counter_is_a_list", func(tag string) string { return s.keys.counter(tag) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := newIdentity()
			key := c.key(tagOf(lockKey(t, id)))
			var cmd vk.Completed
			if strings.HasSuffix(c.name, "list") {
				cmd = s.client.B().Lpush().Key(key).Element("x").Build()
			} else {
				cmd = s.client.B().Set().Key(key).Value("x").Build()
			}
			if err := s.client.Do(bg, cmd).Error(); err != nil {
				t.Fatal(err)
			}
			_, err := s.Acquire(bg, acquireReq(id))
			mustCode(t, err, lease.CodeCorrupt)
		})
	}
}

// The function library remembers records it wrote or decoded by their
// exact bytes; those bytes stored under another identity still fail closed
// (the lock key and tuple are checked on every read), and a lease whose
// bytes were copied elsewhere keeps working.
func TestRememberedBytesUnderAnotherIdentity(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	f := faults{s}
	a1, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	id2 := newIdentity()
	a2, err := s.Acquire(bg, acquireReq(id2))
	if err != nil {
		t.Fatal(err)
	}
	raw1, ok := get(t, s, s.keys.active(tagOf(a1.Lease.LockKey)))
	if !ok {
		t.Fatal("no active record")
	}
	if err := f.PutRawActive(bg, a2.Lease.LockKey, []byte(raw1)); err != nil {
		t.Fatal(err)
	}
	_, err = s.Renew(bg, renewReq(a2.Lease))
	mustCode(t, err, lease.CodeCorrupt)
	_, err = s.Inspect(bg, lease.InspectRequest{Identity: id2, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	_, err = s.Release(bg, releaseReq(a2.Lease))
	mustCode(t, err, lease.CodeCorrupt)
	if now, _ := get(t, s, s.keys.active(tagOf(a2.Lease.LockKey))); now != raw1 {
		t.Fatal("corrupt value was overwritten")
	}
	r1, err := s.Renew(bg, renewReq(a1.Lease))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(bg, releaseReq(r1.Lease)); err != nil {
		t.Fatal(err)
	}
}

// A new lease id already in use (an 80-bit random collision) refuses the
// acquisition before anything changes, also over an expired predecessor.
func TestLeaseIDCollisionChangesNothing(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	f := faults{s}
	taken := lease.NewLeaseID(lease.At(time.Now()))
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.leaseLookup(taken)).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, expired := range []bool{false, true} {
		id := newIdentity()
		if expired {
			a, err := s.Acquire(bg, acquireReq(id))
			if err != nil {
				t.Fatal(err)
			}
			putExpired(t, f, a.Lease)
		}
		before := snapshot(t, s, "")
		s.leaseIDs = func(lease.Timestamp) string { return taken }
		_, err := s.Acquire(bg, acquireReq(id))
		s.leaseIDs = nil
		mustCode(t, err, lease.CodeBackendUnavailable)
		if after := snapshot(t, s, ""); !maps.Equal(before, after) {
			t.Fatalf("expired=%v: a refused acquisition changed the namespace:\n before %q\n after  %q", expired, before, after)
		}
		if _, err := s.Acquire(bg, acquireReq(id)); err != nil {
			t.Fatalf("expired=%v: acquire with a fresh id: %v", expired, err)
		}
	}
}

// Renew and commit check the types of only the keys they may write, but
// still before the first write: a wrong type fails closed as corrupt and
// changes nothing (a quarantine marker aside), on the live path and on the
// path that archives an expired lease.
func TestWrongTypeKeysFailClosedOnHeldLease(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	f := faults{s}
	renew := func(rec *lease.Record) error { _, err := s.Renew(bg, renewReq(rec)); return err }
	commit := func(rec *lease.Record) error { _, err := s.AuthorizeCommit(bg, commitReq(rec)); return err }
	for _, c := range []struct {
		name    string
		key     func(tag string) string
		expired bool
		op      func(rec *lease.Record) error
	}{
		{"renew_schedule_is_a_string", func(string) string { return s.keys.expiry() }, false, renew},
		{"commit_marks_is_a_string", func(tag string) string { return s.keys.marks(tag) }, false, commit},
		{"renew_expired_history_is_a_string", func(tag string) string { return s.keys.history(tag) }, true, renew},
		{"renew_expired_index_is_a_string", func(string) string { return s.keys.index() }, true, renew},
		{"commit_expired_history_is_a_string", func(tag string) string { return s.keys.history(tag) }, true, commit},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := newIdentity()
			key := lockKey(t, id)
			a, err := s.Acquire(bg, acquireReq(id))
			if err != nil {
				t.Fatal(err)
			}
			rec := a.Lease
			if c.expired {
				rec = putExpired(t, f, rec)
			}
			wrong := c.key(tagOf(key))
			if err := s.client.Do(bg, s.client.B().Del().Key(wrong).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := s.client.Do(bg, s.client.B().Set().Key(wrong).Value("x").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, s, s.keys.quarantine(tagOf(key)))
			mustCode(t, c.op(rec), lease.CodeCorrupt)
			after := snapshot(t, s, s.keys.quarantine(tagOf(key)))
			if !maps.Equal(before, after) {
				t.Fatalf("a refused operation changed the namespace:\n before %q\n after  %q", before, after)
			}
			if q, ok := get(t, s, s.keys.quarantine(tagOf(key))); !ok || q == "" {
				t.Fatal("no quarantine marker")
			}
			if err := s.client.Do(bg, s.client.B().Del().Key(wrong).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// snapshot is every key of the server but skip, with its serialized value
// and expiry.
func snapshot(t *testing.T, s *Store, skip string) map[string]string {
	t.Helper()
	keys, err := s.client.Do(bg, s.client.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		if k == skip {
			continue
		}
		v, err := s.client.Do(bg, s.client.B().Dump().Key(k).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := s.client.Do(bg, s.client.B().Pexpiretime().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v + "|" + strconv.FormatInt(ttl, 10)
	}
	return out
}

// A server that may lose acknowledged writes is unsuitable: Health says so
// and every mutation is refused, reads still work.
func TestDurabilityCheck(t *testing.T) {
	// An evicting server loses keys with no error: a lease, a lookup,
	// evidence (volatile policies) or a fencing counter (allkeys).
	for _, cfg := range []testenv.RedisConfig{{AppendFsync: "everysec"}, {NoAppendOnly: true},
		{Extra: []string{"maxmemory-policy volatile-lru"}}, {Extra: []string{"maxmemory 64mb", "maxmemory-policy allkeys-lru"}}} {
		r := testenv.StartRedisWith(t, cfg)
		for _, allow := range []bool{false, true} {
			s := open(t, r, Options{StoreOptions: leasetest.StoreOptions(), AllowUnverifiedDurability: allow})
			h := s.Health(bg)
			if h.Status != lease.HealthUnsuitable {
				t.Fatalf("%+v allow=%v: health %+v, want unsuitable", cfg, allow, h)
			}
			id := newIdentity()
			_, err := s.Acquire(bg, acquireReq(id))
			mustCode(t, err, lease.CodeBackendUnavailable)
			_, err = s.AuthorizeCommit(bg, commitReq(&lease.Record{LeaseID: "lease_x", FencingToken: 1,
				ServiceInstanceID: "i", ExecutionID: "e", JobID: "j", TenantID: id.TenantID, ProgramID: id.ProgramID,
				TargetNamespace: id.TargetNamespace, TargetID: id.TargetID, ActorName: id.ActorName}))
			mustCode(t, err, lease.CodeBackendUnavailable)
			_, err = s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
			mustCode(t, err, lease.CodeNotFound)
		}
	}
	good := open(t, sharedServer(t), Options{})
	if h := good.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("durable server: %+v", h)
	}
}

// documentedACL is the ACL rule of the package documentation (doc.go),
// read from the source so the documentation and the tests cannot drift.
func documentedACL(t testing.TB, password string) string {
	return testenv.DocumentedACL(t, "doc.go", password)
}

// aclServer starts a server whose only non-default user is the documented
// least-privilege one, and writes its password to a file.
func aclServer(t testing.TB, extra ...string) (*testenv.Redis, string) {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("lease-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	acl := append([]string{"user default on nopass ~* &* +@all", documentedACL(t, "lease-secret")}, extra...)
	return testenv.StartRedisWith(t, testenv.RedisConfig{ACL: acl}), pw
}

// The least-privilege ACL is enough for every operation (the whole
// conformance suite runs under it too); a user without CONFIG is
// unsuitable unless the operator vouches for durability; the password
// comes from a file.
func TestACL(t *testing.T) {
	noConfig := strings.Replace(strings.Replace(documentedACL(t, "other-secret"), "user starlease", "user noconfig", 1),
		"+config|get ", "", 1)
	r, pw := aclServer(t, noConfig)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease", StoreOptions: leasetest.StoreOptions()})
	if h := s.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("health under ACL: %+v", h)
	}
	lifecycle(t, s)

	other := filepath.Join(t.TempDir(), "other")
	os.WriteFile(other, []byte("other-secret"), 0o600)
	n := open(t, r, Options{Username: "noconfig", PasswordFile: other, KeyPrefix: "starlease"})
	if h := n.Health(bg); h.Status != lease.HealthUnsuitable {
		t.Fatalf("without CONFIG: %+v, want unsuitable", h)
	}
	_, err := n.Acquire(bg, acquireReq(newIdentity()))
	mustCode(t, err, lease.CodeBackendUnavailable)
	v := open(t, r, Options{Username: "noconfig", PasswordFile: other, KeyPrefix: "starlease", AllowUnverifiedDurability: true,
		StoreOptions: leasetest.StoreOptions()})
	if h := v.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("vouched durability: %+v", h)
	}
	lifecycle(t, v)

	// A namespace outside the ACL's key pattern is refused, typed.
	w := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "elsewhere", StoreOptions: leasetest.StoreOptions()})
	_, err = w.Acquire(bg, acquireReq(newIdentity()))
	mustCode(t, err, lease.CodeBackendUnavailable)

	// The password file is read on each new connection, so a rotation
	// (server and file) needs no restart.
	admin, err := vk.NewClient(vk.ClientOption{InitAddress: []string{r.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, cmd := range []vk.Completed{
		admin.B().Arbitrary("ACL", "SETUSER").Args("starlease", "resetpass", ">rotated-secret").Build(),
		admin.B().ClientKill().User("starlease").Build(),
	} {
		if err := admin.Do(bg, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(pw, []byte("rotated-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A call on a killed connection fails once per pooled connection;
	// reads on random identities reach every connection.
	for i, ok := 0, 0; ok < 8; i++ {
		_, err = s.Inspect(bg, lease.InspectRequest{Identity: newIdentity(), DeadlineAt: far()})
		if ok++; lease.CodeOf(err) != lease.CodeNotFound {
			ok = 0
		}
		if i == 40 {
			t.Fatalf("no answer with the rotated password: %v", err)
		}
	}
	lifecycle(t, s)

	// A wrong password fails Open without echoing it.
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("not-the-password"), 0o600)
	_, err = Open(bg, Options{Addr: r.Addr(), Username: "starlease", PasswordFile: bad})
	mustCode(t, err, lease.CodeBackendUnavailable)
	if strings.Contains(err.Error(), "not-the-password") || strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("error leaks detail: %v", err)
	}
	_, err = Open(bg, Options{Addr: r.Addr(), Username: "starlease", PasswordFile: filepath.Join(t.TempDir(), "missing")})
	mustCode(t, err, lease.CodeBackendUnavailable)
}

// putExpired stores a copy of rec, expired 5 s ago, as its identity's
// active record, and returns the copy.
func putExpired(t *testing.T, f faults, rec *lease.Record) *lease.Record {
	t.Helper()
	rec = rec.Clone()
	now := time.Now()
	rec.AcquiredAt, rec.RenewedAt, rec.ExpiresAt = lease.At(now.Add(-10*time.Second)), lease.At(now.Add(-10*time.Second)), lease.At(now.Add(-5*time.Second))
	raw, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.PutRawActive(bg, rec.LockKey, raw); err != nil {
		t.Fatal(err)
	}
	return rec
}

// lifecycle runs every operation once and checks their results.
func lifecycle(t *testing.T, s *Store) {
	t.Helper()
	id := newIdentity()
	a, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	rn, err := s.Renew(bg, renewReq(a.Lease))
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if _, err := s.AuthorizeCommit(bg, commitReq(rn.Lease)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	l, err := s.List(bg, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, DeadlineAt: far()})
	if err != nil || len(l.Leases) == 0 {
		t.Fatalf("list: %v %d", err, len(l.Leases))
	}
	if _, err := s.Release(bg, releaseReq(rn.Lease)); err != nil {
		t.Fatalf("release: %v", err)
	}
	if r, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far()}); err != nil || r.Lease.State != lease.StateReleased {
		t.Fatalf("inspect by id: %v", err)
	}
	if h, err := s.History(bg, lease.HistoryRequest{Identity: id, DeadlineAt: far()}); err != nil || len(h.Entries) != 1 {
		t.Fatalf("history: %v", err)
	}
	b, err := s.Acquire(bg, acquireReq(id))
	if err != nil || b.Lease.FencingToken != 2 {
		t.Fatalf("reacquire: %v", err)
	}
	if _, err := s.Revoke(bg, adminReq(b.Lease)); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: id, PrincipalID: owner.PrincipalID,
		RequestID: b.Lease.RequestID, DeadlineAt: far()})
	if err != nil || lr.Current == nil || lr.Current.State != lease.StateRevoked {
		t.Fatalf("lookup: %v %+v", err, lr)
	}
	if err := s.reap(bg); err != nil {
		t.Fatalf("reap: %v", err)
	}
}

// Transport failures are typed: refused before sending is
// backend_unavailable; a command submitted and not answered in time is
// outcome_unknown, and LookupRequest resolves it to the truth.
func TestTransportFailures(t *testing.T) {
	_, err := Open(bg, Options{Addr: "127.0.0.1:1"})
	mustCode(t, err, lease.CodeBackendUnavailable)

	r := testenv.StartRedis(t)
	s := open(t, r, Options{StoreOptions: leasetest.StoreOptions(), ReplyGrace: 300 * time.Millisecond})

	// Writes paused on the server: the function is submitted and waits.
	admin, err := vk.NewClient(vk.ClientOption{InitAddress: []string{r.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.Do(bg, admin.B().ClientPause().Timeout(1500).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	id := newIdentity()
	req := acquireReq(id)
	req.DeadlineAt = time.Now().Add(200 * time.Millisecond)
	_, err = s.Acquire(bg, req)
	mustCode(t, err, lease.CodeOutcomeUnknown)
	if err := admin.Do(bg, admin.B().ClientUnpause().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// The function ran after its deadline, so it refused: the truth is
	// "not committed", and a lookup says so.
	lookup := lease.LookupRequest{Op: lease.OpAcquire, Identity: id, PrincipalID: owner.PrincipalID, RequestID: req.RequestID, DeadlineAt: far()}
	limit := time.Now().Add(3 * time.Second)
	for {
		_, err = s.LookupRequest(bg, lookup)
		if lease.CodeOf(err) == lease.CodeNotFound || time.Now().After(limit) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustCode(t, err, lease.CodeNotFound)

	// A committed acquire is found by the lookup with the original lease.
	req2 := acquireReq(id)
	a, err := s.Acquire(bg, req2)
	if err != nil {
		t.Fatal(err)
	}
	lookup.RequestID = req2.RequestID
	lr, err := s.LookupRequest(bg, lookup)
	if err != nil || lr.Lease.LeaseID != a.Lease.LeaseID || !lr.Replayed {
		t.Fatalf("lookup of a committed acquire: %v %+v", err, lr)
	}

	// Server gone: the connection cannot be made, nothing was sent.
	r.Kill9()
	// A call may still go out on a pooled connection that just died
	// (outcome unknown, at most once per connection); after that nothing
	// can be sent and every call is backend_unavailable.
	for _, op := range []func() error{
		func() error { _, err := s.Acquire(bg, acquireReq(newIdentity())); return err },
		func() error { _, err := s.Renew(bg, renewReq(a.Lease)); return err },
		func() error {
			_, err := s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
			return err
		},
	} {
		err := op()
		for i := 0; i < 4 && lease.CodeOf(err) == lease.CodeOutcomeUnknown; i++ {
			err = op()
		}
		mustCode(t, err, lease.CodeBackendUnavailable)
		if strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "refused") {
			t.Fatalf("error leaks transport detail: %v", err)
		}
	}
	if h := s.Health(bg); h.Status != lease.HealthUnavailable {
		t.Fatalf("health with the server down: %+v", h)
	}

	// Restarted on the same AOF: the counter and evidence survived.
	r.Restart()
	// The first call may still go out on a connection that died with the
	// old server (outcome unknown); the same request again resolves it.
	replay, err := s.Acquire(bg, req2)
	for i := 0; i < 4 && lease.CodeOf(err) == lease.CodeOutcomeUnknown; i++ {
		replay, err = s.Acquire(bg, req2)
	}
	if err != nil || !replay.Replayed || replay.Lease.FencingToken != a.Lease.FencingToken {
		t.Fatalf("replay after restart: %v %+v", err, replay)
	}
	// A read may also meet a connection that died with the old server; it
	// changes nothing, so reading again is safe.
	n, err := (faults{s}).Counter(bg, lockKey(t, id))
	for i := 0; i < 4 && err != nil; i++ {
		n, err = (faults{s}).Counter(bg, lockKey(t, id))
	}
	if err != nil || n != a.Lease.FencingToken {
		t.Fatalf("counter after restart %d (%v), want %d", n, err, a.Lease.FencingToken)
	}

	// A context already done never reaches the server.
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err = s.Acquire(ctx, acquireReq(newIdentity()))
	mustCode(t, err, lease.CodeDeadlineExceeded)
}

// The reaper archives expired leases conditionally: their expiry reaches
// history, they leave the List index and the schedule, and a renewed
// lease is left alone.
func TestReaper(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	id, live := newIdentity(), newIdentity()
	short := acquireReq(id)
	short.TTL = 200 * time.Millisecond
	a, err := s.Acquire(bg, short)
	if err != nil {
		t.Fatal(err)
	}
	keep, err := s.Acquire(bg, acquireReq(live))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := s.reap(bg); err != nil {
		t.Fatal(err)
	}
	h, err := s.History(bg, lease.HistoryRequest{Identity: id, DeadlineAt: far()})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.State != lease.StateExpired || h.Entries[0].EndedAt != a.Lease.ExpiresAt {
		t.Fatalf("history after reap: %v %+v", err, h.Entries)
	}
	if n, _ := s.client.Do(bg, s.client.B().Zcard().Key(s.keys.expiry()).Build()).AsInt64(); n != 1 {
		t.Fatalf("schedule holds %d entries, want only the live lease", n)
	}
	if n, _ := s.client.Do(bg, s.client.B().Zcard().Key(s.keys.index()).Build()).AsInt64(); n != 3 {
		t.Fatalf("index holds %d entries, want the live lease's 3", n)
	}
	if _, err := s.Renew(bg, renewReq(keep.Lease)); err != nil {
		t.Fatalf("live lease: %v", err)
	}
}

// TLS verifies the server against the configured CA; an unverifiable
// certificate or disabled verification is refused.
func TestTLS(t *testing.T) {
	r := testenv.StartRedisWith(t, testenv.RedisConfig{TLS: true})
	s := open(t, r, Options{TLS: r.ClientTLS(), StoreOptions: leasetest.StoreOptions()})
	if h := s.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("health over TLS: %+v", h)
	}
	lifecycle(t, s)

	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	_, err := Open(ctx, Options{Addr: r.Addr(), TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	mustCode(t, err, lease.CodeBackendUnavailable)
	if !strings.Contains(err.Error(), "tls certificate not verified") {
		t.Fatalf("untrusted certificate: %v", err)
	}
	// The CA as a file: what the command line passes.
	f := open(t, r, Options{TLSCAFile: r.CAFile(), StoreOptions: leasetest.StoreOptions()})
	if h := f.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("health over TLS with a CA file: %+v", h)
	}
	_, err = Open(ctx, Options{Addr: r.Addr(), TLSCAFile: r.CAFile(), TLSServerName: "elsewhere.invalid"})
	mustCode(t, err, lease.CodeBackendUnavailable)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	_, err = Open(ctx, Options{Addr: r.Addr(), TLSCAFile: notPEM})
	mustCode(t, err, lease.CodeInvalidRequest)
	insecure := r.ClientTLS()
	insecure.InsecureSkipVerify = true
	_, err = Open(ctx, Options{Addr: r.Addr(), TLS: insecure})
	mustCode(t, err, lease.CodeInvalidRequest)
}

// onlyHistoryEntry reads the identity's history, which must hold exactly
// one entry, in exactly HistoryEntry.Encode's bytes.
func onlyHistoryEntry(t *testing.T, s *Store, tag string) *lease.HistoryEntry {
	t.Helper()
	entries, err := s.client.Do(bg, s.client.B().Lrange().Key(s.keys.history(tag)).Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil || len(entries) != 1 {
		t.Fatalf("history: %v %d", err, len(entries))
	}
	// Stored in the namespace's format; a compact (version 2) one expands
	// to the canonical version 1 entry, held to the same checks.
	if strings.HasPrefix(entries[0], lease.HistoryV2Prefix) != s.writes(compactFormat) {
		t.Fatalf("history entry not in the namespace's format (compact %v): %q", s.writes(compactFormat), entries[0])
	}
	var ok bool
	if entries[0], ok = lease.ExpandHistory(entries[0]); !ok {
		t.Fatal("history entry does not expand")
	}
	h, err := lease.DecodeHistoryEntry([]byte(entries[0]))
	if err != nil {
		t.Fatalf("history entry fails strict decoding: %v", err)
	}
	if b, _ := h.Encode(); string(b) != entries[0] {
		t.Fatalf("history differs from HistoryEntry.Encode:\n got  %s\n want %s", entries[0], b)
	}
	return h
}

// One reaper pass works off a backlog larger than one read of the
// schedule: every lease that expired together reaches history.
func TestReaperWorksOffBacklog(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1})
	const n = reapBatch + 88
	ids := make([]lease.Identity, n)
	for i := range ids {
		ids[i] = newIdentity()
		req := acquireReq(ids[i])
		req.TTL = 300 * time.Millisecond
		if _, err := s.Acquire(bg, req); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(400 * time.Millisecond)
	if err := s.reap(bg); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.client.Do(bg, s.client.B().Zcard().Key(s.keys.expiry()).Build()).AsInt64(); n != 0 {
		t.Fatalf("schedule holds %d entries after one pass, want 0", n)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		h, err := s.History(bg, lease.HistoryRequest{Identity: ids[i], DeadlineAt: far()})
		if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.State != lease.StateExpired {
			t.Fatalf("history of lease %d after one pass: %v %+v", i, err, h.Entries)
		}
	}
}
