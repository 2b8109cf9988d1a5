package valkey

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/starintel/starlease/lease"
)

// Idempotency evidence is stored in one of two versions (see remember in
// library.lua). Version 1, which older code wrote, is
// lease.IdempotencyRecord's JSON with a full copy of the record. Version 2
// ("ev2") holds only the facts of the result, one per line: a third of the
// bytes, written on every mutation. Readers accept both: expandEvidence
// rebuilds from version 2 exactly the version 1 bytes the library would
// have stored for the same result, and everything downstream (strict
// decoding, replay, lookup) runs on those bytes unchanged.

const ev2Prefix = "ev2\n"

// ev2 line numbers (0 is the version).
const (
	ev2Op = 1 + iota
	ev2Digest
	ev2Code
	ev2Backend
	ev2Tag
	ev2LeaseID
	ev2Owner
	ev2Client
	ev2Credential
	ev2Instance
	ev2Token
	ev2Acquired
	ev2Renewed
	ev2Expires
	ev2TTL
	ev2Lifetime
	ev2Execution
	ev2Job
	ev2Trace
	ev2Request
	ev2State
	ev2Metadata // the rest: metadata JSON
	ev2Lines
)

// expandEvidence returns stored evidence as version 1 bytes: version 1 as
// it is; version 2 rebuilt with id, the identity of the request it is read
// for (its evidence key's scope holds the lock key, so the stored record's
// tuple was this one). ok is false for anything that cannot be rebuilt
// into a well-formed document: a line with a quote, backslash or control
// byte, a number or timestamp that is not decimal digits, metadata that is
// not one JSON object. The caller's strict decoding then checks every
// value as it checks version 1.
func expandEvidence(raw string, id lease.Identity) (string, bool) {
	if !strings.HasPrefix(raw, ev2Prefix) {
		return raw, true
	}
	f := strings.SplitN(raw, "\n", ev2Lines)
	if len(f) != ev2Lines {
		return "", false
	}
	for i := ev2Op; i < ev2Metadata; i++ {
		if !plainText(f[i]) {
			return "", false
		}
	}
	for _, i := range []int{ev2Backend, ev2Token, ev2Acquired, ev2Renewed, ev2Expires, ev2TTL, ev2Lifetime} {
		if !digits(f[i]) {
			return "", false
		}
	}
	meta := f[ev2Metadata]
	if !strings.HasPrefix(meta, "{") || !json.Valid([]byte(meta)) {
		return "", false
	}
	for _, v := range []string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass} {
		if !plainText(v) {
			return "", false
		}
	}
	b := newRecordWriter(len(meta))
	b.add(`{"idempotency_version":1,"op":"`, f[ev2Op], `","digest":"`, f[ev2Digest], `","code":"`, f[ev2Code], `","lease":`)
	b.record(f[ev2Tag], [7]string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName,
		id.OperationClass}, f[ev2LeaseID:])
	b.add(`,"backend_time":"`, msText(f[ev2Backend]), `"}`)
	return b.String(), true
}

// recordWriter builds version 1 documents from stored facts.
type recordWriter struct{ strings.Builder }

func newRecordWriter(extra int) *recordWriter {
	b := &recordWriter{}
	b.Grow(1024 + extra)
	return b
}

func (b *recordWriter) add(parts ...string) {
	for _, s := range parts {
		b.WriteString(s)
	}
}

// record writes a record's JSON byte for byte as library.lua's encode
// does: tag is its lock key's hash tag, tuple its identity, f its facts
// from lease_id on, in the order evidence version 2 stores them (lease_id,
// owner_principal_id, owner_client_id, owner_credential_id,
// service_instance_id, fencing_token, acquired/renewed/expires ms, ttl_ms,
// maximum_lifetime_ms, execution_id, job_id, trace_id, request_id, state,
// metadata). The caller has checked every part with plainText or digits,
// and metadata is one JSON value.
func (b *recordWriter) record(tag string, tuple [7]string, f []string) {
	b.add(`{"record_version":1,"lock_key":"`, lease.KeyPrefix, tag,
		`","tenant_id":"`, tuple[0], `","program_id":"`, tuple[1], `","target_namespace":"`, tuple[2],
		`","target_id":"`, tuple[3], `","actor_name":"`, tuple[4], `","workflow_name":"`, tuple[5],
		`","operation_class":"`, tuple[6], `","lease_id":"`, f[0],
		`","owner_principal_id":"`, f[1], `","owner_client_id":"`, f[2],
		`","owner_credential_id":"`, f[3], `","service_instance_id":"`, f[4],
		`","fencing_token":`, f[5], `,"acquired_at":"`, msText(f[6]), `","renewed_at":"`, msText(f[7]),
		`","expires_at":"`, msText(f[8]), `","ttl_ms":`, f[9], `,"maximum_lifetime_ms":`, f[10],
		`,"execution_id":"`, f[11], `","job_id":"`, f[12], `","trace_id":"`, f[13],
		`","request_id":"`, f[14], `","metadata":`, f[16], `,"state":"`, f[15], `"}`)
}

// msText is a stored decimal ms as the record's timestamp text.
func msText(v string) string {
	ms, _ := strconv.ParseInt(v, 10, 64)
	return lease.UnixMilli(ms).String()
}

// History entries are stored in version 1 (lease.HistoryEntry's JSON, a
// copy of the record) or version 2 ("hv2", written now): the facts one per
// line, the identity tuple included (an entry is read by lease id alone).
// Lines: hv2, ended ms, ended_by, request_id, reason (JSON) and
// incident_id (” for none), hash tag, the tuple's seven components, then
// the record's facts as evidence version 2 stores them, metadata last.
const hv2Prefix = "hv2\n"

const (
	hv2Ended = 1 + iota
	hv2By
	hv2Request
	hv2Reason
	hv2Incident
	hv2Tag
	hv2Tuple                 // 7 lines
	hv2Record = hv2Tuple + 7 // 17 lines, metadata last
	hv2Lines  = hv2Record + 17
)

// expandHistory returns a stored history entry as version 1 bytes:
// version 1 as it is, version 2 rebuilt (ok false if it cannot be; see
// expandEvidence). Strict decoding of the result is the caller's.
func expandHistory(raw string) (string, bool) {
	if !strings.HasPrefix(raw, hv2Prefix) {
		return raw, true
	}
	f := strings.SplitN(raw, "\n", hv2Lines)
	if len(f) != hv2Lines {
		return "", false
	}
	for i := hv2Ended; i < hv2Lines-1; i++ {
		if i != hv2Reason && !plainText(f[i]) {
			return "", false
		}
	}
	rec := f[hv2Record:]
	for _, v := range []string{f[hv2Ended], rec[5], rec[6], rec[7], rec[8], rec[9], rec[10]} {
		if !digits(v) {
			return "", false
		}
	}
	meta, reason := rec[16], f[hv2Reason]
	if !strings.HasPrefix(meta, "{") || !json.Valid([]byte(meta)) {
		return "", false
	}
	// The reason is a JSON string (which may hold escaped quotes).
	if reason != "" && (!strings.HasPrefix(reason, `"`) || !json.Valid([]byte(reason))) {
		return "", false
	}
	b := newRecordWriter(len(meta) + len(reason))
	b.add(`{"history_version":1,"record":`)
	b.record(f[hv2Tag], [7]string(f[hv2Tuple:hv2Tuple+7]), rec)
	b.add(`,"ended_at":"`, msText(f[hv2Ended]), `"`)
	if v := f[hv2By]; v != "" {
		b.add(`,"ended_by":"`, v, `"`)
	}
	if v := f[hv2Request]; v != "" {
		b.add(`,"request_id":"`, v, `"`)
	}
	if reason != "" {
		b.add(`,"reason":`, reason)
	}
	if v := f[hv2Incident]; v != "" {
		b.add(`,"incident_id":"`, v, `"`)
	}
	b.add(`}`)
	return b.String(), true
}

// plainText reports a string written verbatim between JSON quotes that
// cannot end them or start an escape: no quote, backslash or control byte.
func plainText(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' || c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// digits reports 1 to 16 decimal digits (every number evidence holds is
// below 2^53).
func digits(s string) bool {
	// The library writes numbers without leading zeros; any other spelling
	// is not what it wrote (review 4).
	if s == "" || len(s) > 16 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
