package valkey

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

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
	ts := func(i int) string {
		ms, _ := strconv.ParseInt(f[i], 10, 64)
		return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
	}
	// Byte for byte library.lua's encode and the version 1 layout.
	var b strings.Builder
	b.Grow(1024 + len(meta))
	for _, s := range []string{
		`{"idempotency_version":1,"op":"`, f[ev2Op], `","digest":"`, f[ev2Digest], `","code":"`, f[ev2Code],
		`","lease":{"record_version":1,"lock_key":"`, lease.KeyPrefix, f[ev2Tag],
		`","tenant_id":"`, id.TenantID, `","program_id":"`, id.ProgramID, `","target_namespace":"`, id.TargetNamespace,
		`","target_id":"`, id.TargetID, `","actor_name":"`, id.ActorName, `","workflow_name":"`, id.WorkflowName,
		`","operation_class":"`, id.OperationClass, `","lease_id":"`, f[ev2LeaseID],
		`","owner_principal_id":"`, f[ev2Owner], `","owner_client_id":"`, f[ev2Client],
		`","owner_credential_id":"`, f[ev2Credential], `","service_instance_id":"`, f[ev2Instance],
		`","fencing_token":`, f[ev2Token], `,"acquired_at":"`, ts(ev2Acquired), `","renewed_at":"`, ts(ev2Renewed),
		`","expires_at":"`, ts(ev2Expires), `","ttl_ms":`, f[ev2TTL], `,"maximum_lifetime_ms":`, f[ev2Lifetime],
		`,"execution_id":"`, f[ev2Execution], `","job_id":"`, f[ev2Job], `","trace_id":"`, f[ev2Trace],
		`","request_id":"`, f[ev2Request], `","metadata":`, meta, `,"state":"`, f[ev2State],
		`"},"backend_time":"`, ts(ev2Backend), `"}`,
	} {
		b.WriteString(s)
	}
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
	if s == "" || len(s) > 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
