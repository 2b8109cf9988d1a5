package lease

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// Idempotency evidence is stored in one of two versions. Version 1 is
// IdempotencyRecord's JSON with a full copy of the record. Version 2
// ("ev2") holds only the facts of the result, one per line: a third of the
// bytes, written on every mutation (by the Valkey library's remember and
// by CompactEvidence). Readers accept both: ExpandEvidence rebuilds from
// version 2 exactly the version 1 bytes stored for the same result, and
// everything downstream (strict decoding, replay, lookup) runs on those
// bytes unchanged.

// EvidenceV2Prefix starts every version 2 evidence value.
const EvidenceV2Prefix = "ev2\n"

// Evidence version 2 line numbers (0 is the version).
const (
	Ev2Op = 1 + iota
	Ev2Digest
	Ev2Code
	Ev2Backend
	Ev2Tag
	Ev2LeaseID
	Ev2Owner
	Ev2Client
	Ev2Credential
	Ev2Instance
	Ev2Token
	Ev2Acquired
	Ev2Renewed
	Ev2Expires
	Ev2TTL
	Ev2Lifetime
	Ev2Execution
	Ev2Job
	Ev2Trace
	Ev2Request
	Ev2State
	Ev2Metadata // the rest: metadata JSON
	Ev2Lines
)

// ExpandEvidence returns stored evidence as version 1 bytes: version 1 as
// it is; version 2 rebuilt with id, the identity of the request it is read
// for (its evidence key's scope holds the lock key, so the stored record's
// tuple was this one). ok is false for anything that cannot be rebuilt
// into a well-formed document: a line with a quote, backslash or control
// byte, a number or timestamp that is not decimal digits, metadata that is
// not one JSON object. The caller's strict decoding then checks every
// value as it checks version 1.
func ExpandEvidence(raw string, id Identity) (string, bool) {
	if !strings.HasPrefix(raw, EvidenceV2Prefix) {
		return raw, true
	}
	return expanded(raw, func(b *recordWriter) bool { return expandEvidence(b, raw, id) })
}

// expanded runs expand into a new writer: the document it wrote, or ok
// false.
func expanded(raw string, expand func(*recordWriter) bool) (string, bool) {
	b := newRecordWriter(len(raw))
	if !expand(b) {
		return "", false
	}
	return b.String(), true
}

// expandEvidence writes to b the version 1 bytes of raw, version 2
// evidence read for id; false if they cannot be rebuilt (ExpandEvidence).
func expandEvidence(b *recordWriter, raw string, id Identity) bool {
	var f [Ev2Lines]string
	if !strings.HasPrefix(raw, EvidenceV2Prefix) || !splitLines(raw, f[:]) {
		return false
	}
	for i := Ev2Op; i < Ev2Metadata; i++ {
		if !plainText(f[i]) {
			return false
		}
	}
	for _, i := range []int{Ev2Backend, Ev2Token, Ev2Acquired, Ev2Renewed, Ev2Expires, Ev2TTL, Ev2Lifetime} {
		if !digits(f[i]) {
			return false
		}
	}
	meta := f[Ev2Metadata]
	if !strings.HasPrefix(meta, "{") || !json.Valid([]byte(meta)) {
		return false
	}
	for _, v := range []string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass} {
		if !plainText(v) {
			return false
		}
	}
	b.add(`{"idempotency_version":1,"op":"`, f[Ev2Op], `","digest":"`, f[Ev2Digest], `","code":"`, f[Ev2Code], `","lease":`)
	b.record(f[Ev2Tag], [7]string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName,
		id.OperationClass}, f[Ev2LeaseID:])
	b.add(`,"backend_time":"`, msText(f[Ev2Backend]), `"}`)
	return true
}

// CompactEvidence returns e as stored evidence in version 2, for a
// request for id (which must be e's lease's identity: readers rebuild the
// tuple from the request). It is version 2 only when ExpandEvidence gives
// back exactly e's version 1 encoding from it; anything version 2 cannot
// carry (a value that is not plain text, a tuple other than id) is stored
// in version 1, which every reader also accepts.
func CompactEvidence(e *IdempotencyRecord, id Identity) ([]byte, error) {
	v1, err := e.Encode()
	if err != nil {
		return nil, err
	}
	b := newRecordWriter(metadataRoom)
	b.add(EvidenceV2Prefix, string(e.Op), "\n", e.Digest, "\n", string(e.Code), "\n", msOf(e.BackendTime), "\n",
		lockKeyTag(e.Lease), "\n")
	if !b.facts(e.Lease) {
		return v1, nil
	}
	return b.orVersion1(v1, func(m *recordWriter, v2 string) bool { return expandEvidence(m, v2, id) }), nil
}

// orVersion1 returns the version 2 value b holds when expand gives back
// exactly v1 from it, and v1 otherwise: what every compact writer stores.
// expand writes to a matcher, which compares as it goes instead of
// building the document again.
func (b *recordWriter) orVersion1(v1 []byte, expand func(m *recordWriter, v2 string) bool) []byte {
	v2 := b.String()
	if m := matcher(v1); !expand(m, v2) || !m.matched() {
		return v1
	}
	return []byte(v2)
}

// splitLines is strings.SplitN(s, "\n", len(f)) into f, without
// allocating; false unless it gives exactly len(f) parts.
func splitLines(s string, f []string) bool {
	last := len(f) - 1
	for i := range last {
		j := strings.IndexByte(s, '\n')
		if j < 0 {
			return false
		}
		f[i], s = s[:j], s[j+1:]
	}
	f[last] = s
	return true
}

// decodeEitherVersion strictly decodes a stored value of either version: one
// starting with prefix (version 2) is rebuilt by expand and then decoded
// as version 1; one that cannot be rebuilt is corrupt (why).
func decodeEitherVersion[T any](raw []byte, prefix string, expand func(string) (string, bool), decode func([]byte) (T, error),
	why string) (T, error) {
	if !bytes.HasPrefix(raw, []byte(prefix)) {
		return decode(raw)
	}
	v1, ok := expand(string(raw))
	if !ok {
		var zero T
		return zero, corrupt(why)
	}
	return decode([]byte(v1))
}

// metadataRoom is what a writer reserves for metadata and reason text.
const metadataRoom = 512

func msOf(t Timestamp) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func lockKeyTag(r *Record) string {
	tag, _ := strings.CutPrefix(r.LockKey, KeyPrefix)
	return tag
}

// facts writes r's facts from lease_id on, one per line in the order both
// version 2 forms store them (see record), metadata JSON last; false if
// the metadata does not encode.
func (b *recordWriter) facts(r *Record) bool {
	meta := []byte("{}")
	if len(r.Metadata) > 0 {
		var err error
		if meta, err = r.Metadata.MarshalJSON(); err != nil {
			return false
		}
	}
	b.add(r.LeaseID, "\n", r.OwnerPrincipalID, "\n", r.OwnerClientID, "\n", r.OwnerCredentialID,
		"\n", r.ServiceInstanceID, "\n", strconv.FormatUint(r.FencingToken, 10),
		"\n", msOf(r.AcquiredAt), "\n", msOf(r.RenewedAt), "\n", msOf(r.ExpiresAt),
		"\n", strconv.FormatInt(r.TTLMs, 10), "\n", strconv.FormatInt(r.MaximumLifetimeMs, 10),
		"\n", r.ExecutionID, "\n", r.JobID, "\n", r.TraceID, "\n", r.RequestID, "\n", string(r.State),
		"\n", string(meta))
	return true
}

// recordWriter builds version 1 documents from stored facts or, made by
// matcher, only checks that the same writes spell one given document
// exactly: a check runs the very code a build does.
type recordWriter struct {
	strings.Builder
	matching   bool
	want       []byte // matching: the document the writes must spell
	off        int    // matching: how much of want they have spelled
	differs    bool   // matching: a write did not spell want
	collecting bool
	collected  []byte // collecting: the writes (to be hashed: version 4's check)
}

func newRecordWriter(extra int) *recordWriter {
	b := &recordWriter{}
	b.Grow(1024 + extra)
	return b
}

// matcher is a recordWriter that compares its writes with want.
func matcher(want []byte) *recordWriter { return &recordWriter{matching: true, want: want} }

// collector is a recordWriter that appends its writes to buf's room (a
// pooled buffer: they are only hashed, not kept as a document).
func collector(buf []byte) *recordWriter { return &recordWriter{collecting: true, collected: buf[:0]} }

func (b *recordWriter) add(parts ...string) {
	for _, s := range parts {
		if b.collecting {
			b.collected = append(b.collected, s...)
			continue
		}
		if !b.matching {
			b.WriteString(s)
			continue
		}
		if b.differs || len(b.want)-b.off < len(s) || string(b.want[b.off:b.off+len(s)]) != s {
			b.differs = true
			return
		}
		b.off += len(s)
	}
}

// matched reports that a matcher's writes spelled exactly its document.
func (b *recordWriter) matched() bool { return b.matching && !b.differs && b.off == len(b.want) }

// record writes a record's JSON byte for byte as library.lua's encode
// does: tag is its lock key's hash tag, tuple its identity, f its facts
// from lease_id on, in the order evidence version 2 stores them (lease_id,
// owner_principal_id, owner_client_id, owner_credential_id,
// service_instance_id, fencing_token, acquired/renewed/expires ms, ttl_ms,
// maximum_lifetime_ms, execution_id, job_id, trace_id, request_id, state,
// metadata). The caller has checked every part with plainText or digits,
// and metadata is one JSON value.
func (b *recordWriter) record(tag string, tuple [7]string, f []string) {
	b.add(`{"record_version":1,"lock_key":"`, KeyPrefix, tag,
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
	return UnixMilli(ms).String()
}

// History entries are stored in version 1 (lease.HistoryEntry's JSON, a
// copy of the record) or version 2 ("hv2", written now): the facts one per
// line, the identity tuple included (an entry is read by lease id alone).
// Lines: hv2, ended ms, ended_by, request_id, reason (JSON) and
// incident_id (” for none), hash tag, the tuple's seven components, then
// the record's facts as evidence version 2 stores them, metadata last.
const HistoryV2Prefix = "hv2\n"

// History version 2 line numbers (0 is the version).
const (
	Hv2Ended = 1 + iota
	Hv2By
	Hv2Request
	Hv2Reason
	Hv2Incident
	Hv2Tag
	Hv2Tuple                 // 7 lines
	Hv2Record = Hv2Tuple + 7 // 17 lines, metadata last
	Hv2Lines  = Hv2Record + 17
)

// ExpandHistory returns a stored history entry as version 1 bytes:
// version 1 as it is, version 2 rebuilt (ok false if it cannot be; see
// ExpandEvidence). Strict decoding of the result is the caller's.
func ExpandHistory(raw string) (string, bool) {
	if !strings.HasPrefix(raw, HistoryV2Prefix) {
		return raw, true
	}
	return expanded(raw, func(b *recordWriter) bool { return expandHistory(b, raw) })
}

// expandHistory writes to b the version 1 bytes of raw, a version 2
// history entry; false if they cannot be rebuilt (ExpandHistory).
func expandHistory(b *recordWriter, raw string) bool {
	var f [Hv2Lines]string
	if !strings.HasPrefix(raw, HistoryV2Prefix) || !splitLines(raw, f[:]) {
		return false
	}
	return expandHistoryLines(b, &f)
}

// expandHistoryLines writes to b the version 1 bytes of a history entry
// whose lines, as version 2 numbers them, are f (history version 3
// rebuilds those first); false if they cannot be rebuilt.
func expandHistoryLines(b *recordWriter, f *[Hv2Lines]string) bool {
	for _, i := range []int{Hv2Ended, Hv2By, Hv2Request, Hv2Incident} {
		if !plainText(f[i]) {
			return false
		}
	}
	if !digits(f[Hv2Ended]) || !recordLinesOK(f[Hv2Tag:]) {
		return false
	}
	// The reason is a JSON string (which may hold escaped quotes).
	reason := f[Hv2Reason]
	if reason != "" && (!strings.HasPrefix(reason, `"`) || !json.Valid([]byte(reason))) {
		return false
	}
	b.add(`{"history_version":1,"record":`)
	b.record(f[Hv2Tag], [7]string(f[Hv2Tuple:Hv2Tuple+7]), f[Hv2Record:])
	b.add(`,"ended_at":"`, msText(f[Hv2Ended]), `"`)
	if v := f[Hv2By]; v != "" {
		b.add(`,"ended_by":"`, v, `"`)
	}
	if v := f[Hv2Request]; v != "" {
		b.add(`,"request_id":"`, v, `"`)
	}
	if reason != "" {
		b.add(`,"reason":`, reason)
	}
	if v := f[Hv2Incident]; v != "" {
		b.add(`,"incident_id":"`, v, `"`)
	}
	b.add(`}`)
	return true
}

// CompactHistory returns h as a stored history entry in version 2. It is
// version 2 only when ExpandHistory gives back exactly h's version 1
// encoding from it; anything else is stored in version 1, which every
// reader also accepts.
func CompactHistory(h *HistoryEntry) ([]byte, error) {
	v1, err := h.Encode()
	if err != nil {
		return nil, err
	}
	r := h.Record
	var reason []byte
	if h.Reason != "" {
		reason = appendStringField(nil, "", h.Reason)
	}
	b := newRecordWriter(metadataRoom)
	b.add(HistoryV2Prefix, msOf(h.EndedAt), "\n", h.EndedBy, "\n", h.RequestID, "\n", string(reason), "\n", h.IncidentID, "\n")
	if !b.identified(r) {
		return v1, nil
	}
	return b.orVersion1(v1, expandHistory), nil
}

// DecodeStoredHistory strictly decodes a stored history entry of either
// version: version 2 is rebuilt (ExpandHistory) and then decoded as
// version 1; one that cannot be rebuilt is corrupt.
func DecodeStoredHistory(raw []byte) (*HistoryEntry, error) {
	return decodeEitherVersion(raw, HistoryV2Prefix, ExpandHistory, DecodeHistoryEntry, "history: version 2 entry is malformed")
}

// recordLinesOK checks the lines of a record in version 2 (a history
// entry's from Hv2Tag, a record's from Rv2Tag): hash tag, tuple and facts
// plain text, its numbers decimal digits, metadata (the last) one JSON
// object.
func recordLinesOK(f []string) bool {
	for _, v := range f[:len(f)-1] {
		if !plainText(v) {
			return false
		}
	}
	rec := f[Rv2Record-Rv2Tag:] // the facts, after the tag and the tuple
	for _, v := range rec[5:11] {
		if !digits(v) {
			return false
		}
	}
	meta := rec[16]
	return strings.HasPrefix(meta, "{") && json.Valid([]byte(meta))
}

// identified writes r's hash tag, tuple and facts, one per line, as both
// history version 2 and record version 2 store them; false if the
// metadata does not encode.
func (b *recordWriter) identified(r *Record) bool {
	b.add(lockKeyTag(r), "\n", r.TenantID, "\n", r.ProgramID, "\n", r.TargetNamespace, "\n", r.TargetID, "\n", r.ActorName,
		"\n", r.WorkflowName, "\n", r.OperationClass, "\n")
	return b.facts(r)
}

// Active records are stored (by bolt, from schema 6) in version 1 (the
// record's JSON, Record.Encode) or version 2 ("rv2"): the hash tag, the
// tuple's seven components and the record's facts one per line, as a
// history entry of version 2 holds them without its ending lines; about
// half the bytes. Readers take both (DecodeStoredRecord).
const RecordV2Prefix = "rv2\n"

// Record version 2 line numbers (0 is the version).
const (
	Rv2Tag    = 1 + iota
	Rv2Tuple                 // 7 lines
	Rv2Record = Rv2Tuple + 7 // 17 lines, metadata last
	Rv2Lines  = Rv2Record + 17
)

// ExpandRecord returns a stored record as version 1 bytes: version 1 as it
// is, version 2 rebuilt (ok false if it cannot be; see ExpandEvidence).
// Strict decoding of the result is the caller's.
func ExpandRecord(raw string) (string, bool) {
	if !strings.HasPrefix(raw, RecordV2Prefix) {
		return raw, true
	}
	return expanded(raw, func(b *recordWriter) bool { return expandRecord(b, raw) })
}

// expandRecord writes to b the version 1 bytes of raw, a version 2
// record; false if they cannot be rebuilt (ExpandRecord).
func expandRecord(b *recordWriter, raw string) bool {
	var f [Rv2Lines]string
	if !strings.HasPrefix(raw, RecordV2Prefix) || !splitLines(raw, f[:]) || !recordLinesOK(f[Rv2Tag:]) {
		return false
	}
	b.record(f[Rv2Tag], [7]string(f[Rv2Tuple:Rv2Tuple+7]), f[Rv2Record:])
	return true
}

// CompactRecord returns r as a stored record in version 2. It is version
// 2 only when ExpandRecord gives back exactly r's version 1 encoding from
// it; anything else is stored in version 1, which every reader also
// accepts.
func CompactRecord(r *Record) ([]byte, error) {
	v1, err := r.Encode()
	if err != nil {
		return nil, err
	}
	b := newRecordWriter(metadataRoom)
	b.add(RecordV2Prefix)
	if !b.identified(r) {
		return v1, nil
	}
	return b.orVersion1(v1, expandRecord), nil
}

// DecodeStoredRecord strictly decodes a stored record of either version:
// version 2 is rebuilt (ExpandRecord) and then decoded as version 1; one
// that cannot be rebuilt is corrupt.
func DecodeStoredRecord(raw []byte) (*Record, error) {
	return decodeEitherVersion(raw, RecordV2Prefix, ExpandRecord, DecodeRecord, "record: version 2 is malformed")
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
