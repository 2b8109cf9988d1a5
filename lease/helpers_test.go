package lease

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"
	"unicode/utf8"
)

// Fixed instants of the contract example: 2026-08-05T12:00:00.000Z and friends.
const (
	msAcquired = int64(1785931200000) // 2026-08-05T12:00:00.000Z
	msRenewed  = msAcquired + 20_000  // 2026-08-05T12:00:20.000Z
	msExpires  = msAcquired + 50_000  // 2026-08-05T12:00:50.000Z
)

// goldenContractKey is the lock key of contractIdentity, computed outside Go
// (python3 hashlib/json and openssl) and pinned so the key function can never
// silently change.
const goldenContractKey = "starintel:target-lease:v1:6UMHT_RTstSuGcqfVUzB0pc9lxli2lxUAbN_RNKMpBY"

// contractIdentity is the canonical identity of the contract's example record.
func contractIdentity() Identity {
	return Identity{
		TenantID:        "tenant-main",
		ProgramID:       "program-a",
		TargetNamespace: "starintel-target",
		TargetID:        "target_01",
		ActorName:       "usernamegen",
		WorkflowName:    "default",
		OperationClass:  "default",
	}
}

// independentKey derives the lock key of an already-canonical identity without
// calling any code under test.
func independentKey(t testing.TB, id Identity) string {
	t.Helper()
	b, err := json.Marshal([]string{"v1", id.TenantID, id.ProgramID, id.TargetNamespace,
		id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass})
	if err != nil {
		t.Fatalf("marshal tuple: %v", err)
	}
	sum := sha256.Sum256(b)
	return "starintel:target-lease:v1:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// validRecord is the contract's example record, valid under the strict decoder.
func validRecord() *Record {
	r := &Record{
		RecordVersion:     1,
		LockKey:           goldenContractKey,
		LeaseID:           "lease_01",
		OwnerPrincipalID:  "prn_actor_01",
		OwnerClientID:     "client_01",
		OwnerCredentialID: "key_01",
		ServiceInstanceID: "instance_01",
		FencingToken:      42,
		AcquiredAt:        UnixMilli(msAcquired),
		RenewedAt:         UnixMilli(msRenewed),
		ExpiresAt:         UnixMilli(msExpires),
		TTLMs:             30000,
		MaximumLifetimeMs: 300000,
		ExecutionID:       "execution_01",
		JobID:             "job_01",
		TraceID:           "trace_01",
		RequestID:         "request_01",
		Metadata:          Metadata{},
		State:             StateActive,
	}
	r.SetIdentity(contractIdentity())
	return r
}

// goldenRecordJSON is the exact encoding of validRecord(): the contract's
// field order, millisecond UTC timestamps, metadata as an empty object.
const goldenRecordJSON = `{"record_version":1,"lock_key":"starintel:target-lease:v1:6UMHT_RTstSuGcqfVUzB0pc9lxli2lxUAbN_RNKMpBY",` +
	`"tenant_id":"tenant-main","program_id":"program-a","target_namespace":"starintel-target","target_id":"target_01",` +
	`"actor_name":"usernamegen","workflow_name":"default","operation_class":"default","lease_id":"lease_01",` +
	`"owner_principal_id":"prn_actor_01","owner_client_id":"client_01","owner_credential_id":"key_01",` +
	`"service_instance_id":"instance_01","fencing_token":42,"acquired_at":"2026-08-05T12:00:00.000Z",` +
	`"renewed_at":"2026-08-05T12:00:20.000Z","expires_at":"2026-08-05T12:00:50.000Z","ttl_ms":30000,` +
	`"maximum_lifetime_ms":300000,"execution_id":"execution_01","job_id":"job_01","trace_id":"trace_01",` +
	`"request_id":"request_01","metadata":{},"state":"active"}`

// recordMap returns the valid record as a generic JSON object to mutate.
func recordMap(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(goldenRecordJSON), &m); err != nil {
		t.Fatalf("unmarshal golden record: %v", err)
	}
	return m
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

// wantErr asserts err is an *Error with the code, field and reason given
// (reason "" means: do not check the reason).
func wantErr(t testing.TB, err error, code Code, field, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %s field=%q", code, field)
	}
	var le *Error
	if !errors.As(err, &le) {
		t.Fatalf("got %T %v, want *Error", err, err)
	}
	if le.Code != code || le.Field != field {
		t.Fatalf("got code=%s field=%q reason=%q, want code=%s field=%q", le.Code, le.Field, le.Reason, code, field)
	}
	if reason != "" && le.Reason != reason {
		t.Fatalf("got reason %q, want %q", le.Reason, reason)
	}
}

// wantCorrupt asserts err is a corrupt-record *Error with the exact reason.
func wantCorrupt(t testing.TB, err error, reason string) {
	t.Helper()
	wantErr(t, err, CodeCorrupt, "", reason)
}

var fixedDeadline = time.Date(2026, 8, 5, 12, 0, 5, 0, time.UTC)

func testCaller() Caller {
	return Caller{PrincipalID: "prn_actor_01", PrincipalClass: "actor", ClientID: "client_01",
		CredentialID: "key_01", CorrelationID: "corr_01"}
}

func testMutation() Mutation {
	return Mutation{RequestID: "request_01", DeadlineAt: fixedDeadline, Caller: testCaller()}
}

// normMeta makes a decoded nil metadata comparable with an encoded-then-decoded
// empty object.
func normMeta(r *Record) *Record {
	c := r.Clone()
	if c.Metadata == nil {
		c.Metadata = Metadata{}
	}
	return c
}

// spellings checks stored values of one version 2 form against their
// reader: each is refused as corrupt, or decodes to a value whose compact
// form gives back exactly those (valid UTF-8) bytes, so no second
// spelling of a value is ever accepted. It counts both outcomes.
type spellings[T any] struct {
	decode            func([]byte) (T, error)
	compact           func(T) ([]byte, error)
	accepted, refused int
}

func (c *spellings[T]) check(t *testing.T, m []byte) {
	t.Helper()
	v, err := c.decode(m)
	if err != nil {
		if CodeOf(err) != CodeCorrupt {
			t.Fatalf("%q: %v, want corrupt", m, err)
		}
		c.refused++
		return
	}
	c.accepted++
	again, cerr := c.compact(v)
	if cerr != nil || !bytes.Equal(again, m) {
		t.Fatalf("a second spelling is accepted:\nstored    %q\ncanonical %q (%v)", m, again, cerr)
	}
	if !utf8.Valid(m) {
		t.Fatalf("invalid UTF-8 accepted: %q", m)
	}
}
