package lease

import (
	"bytes"
	"strconv"
	"strings"
)

// History version 3 ("hv3"; bolt from schema 11, which keeps each entry
// under a key that holds its lock key) is version 2 without what that key
// or the entry's own lines already say:
//   - no hash tag line: the reader passes the lock key of the entry's key;
//   - ended_by "=" when it is the owner principal (a release by its owner);
//   - renewed_at empty when it is acquired_at, else ms after acquired_at;
//   - expires_at and ended_at as ms after acquired_at;
//   - the state as one letter (a, e, r, v).
//
// Lines: hv3, ended (ms after acquired), ended_by, request_id, reason,
// incident_id, the tuple's seven components, then the record's facts as
// version 2 orders them, metadata last. Like every compact form it is
// written only when expanding it gives back exactly the version 1 bytes
// (CompactHistoryAt), and read strictly: each shortening has one spelling
// (the owner spelled out where "=" would do, a renewal 0 ms after the
// acquisition, a number with a leading zero all fail). Valkey keeps
// version 2: its readers take no lock key.
const HistoryV3Prefix = "hv3\n"

// History version 3 line numbers (0 is the version).
const (
	hv3Ended = 1 + iota
	hv3By
	hv3Request
	hv3Reason
	hv3Incident
	hv3Tuple                 // 7 lines
	hv3Record = hv3Tuple + 7 // 17 lines, metadata last
	hv3Lines  = hv3Record + 17
)

// The facts' lines within a record (from lease_id on), as facts writes them.
const (
	factLeaseID  = 0
	factOwner    = 1
	factAcquired = 6
	factRenewed  = 7
	factExpires  = 8
	factTTL      = 9
	factLifetime = 10
	factState    = 15
)

// The state letters of version 3.
var (
	stateLetters = map[State]string{StateActive: "a", StateExpired: "e", StateReleased: "r", StateRevoked: "v"}
	letterStates = map[string]State{"a": StateActive, "e": StateExpired, "r": StateReleased, "v": StateRevoked}
)

// CompactHistoryAt returns h as a stored history entry for a store that
// keeps it under a key holding h's lock key: version 3 when ExpandHistoryAt
// with that lock key gives back exactly h's version 1 encoding, else what
// CompactHistory stores (version 2 or 1).
func CompactHistoryAt(h *HistoryEntry) ([]byte, error) {
	v1, err := h.Encode()
	if err != nil {
		return nil, err
	}
	r := h.Record
	acquired := r.AcquiredAt.UnixMilli()
	after := func(t Timestamp) string { return strconv.FormatInt(t.UnixMilli()-acquired, 10) }
	by := h.EndedBy
	if by != "" && by == r.OwnerPrincipalID {
		by = "="
	}
	renewed := renewalLine(acquired, r.RenewedAt.UnixMilli())
	state, ok := stateLetters[r.State]
	meta := []byte("{}")
	if len(r.Metadata) > 0 {
		if meta, err = r.Metadata.MarshalJSON(); err != nil {
			ok = false
		}
	}
	if !ok {
		return CompactHistory(h)
	}
	var reason []byte
	if h.Reason != "" {
		reason = appendStringField(nil, "", h.Reason)
	}
	b := newRecordWriter(metadataRoom)
	b.add(HistoryV3Prefix, after(h.EndedAt), "\n", by, "\n", h.RequestID, "\n", string(reason), "\n", h.IncidentID,
		"\n", r.TenantID, "\n", r.ProgramID, "\n", r.TargetNamespace, "\n", r.TargetID, "\n", r.ActorName,
		"\n", r.WorkflowName, "\n", r.OperationClass,
		"\n", r.LeaseID, "\n", r.OwnerPrincipalID, "\n", r.OwnerClientID, "\n", r.OwnerCredentialID,
		"\n", r.ServiceInstanceID, "\n", strconv.FormatUint(r.FencingToken, 10),
		"\n", strconv.FormatInt(acquired, 10), "\n", renewed, "\n", after(r.ExpiresAt),
		"\n", strconv.FormatInt(r.TTLMs, 10), "\n", strconv.FormatInt(r.MaximumLifetimeMs, 10),
		"\n", r.ExecutionID, "\n", r.JobID, "\n", r.TraceID, "\n", r.RequestID, "\n", state,
		"\n", string(meta))
	// orVersion1 gives v1 back where version 3 does not rebuild it; version
	// 2 may still.
	if v3 := b.orVersion1(v1, func(m *recordWriter, v3 string) bool { return expandHistoryV3(m, v3, r.LockKey) }); bytes.HasPrefix(v3, []byte(HistoryV3Prefix)) {
		return v3, nil
	}
	return CompactHistory(h)
}

// ExpandHistoryAt returns a stored history entry, found under a key that
// holds lockKey, as version 1 bytes: version 3 rebuilt with lockKey,
// versions 1 and 2 as ExpandHistory does (ok false if it cannot be).
// Strict decoding of the result is the caller's: it checks that the
// entry's tuple hashes to lockKey, so an entry under another identity's
// key fails.
func ExpandHistoryAt(raw, lockKey string) (string, bool) {
	if !strings.HasPrefix(raw, HistoryV3Prefix) {
		return ExpandHistory(raw)
	}
	return expanded(raw, func(b *recordWriter) bool { return expandHistoryV3(b, raw, lockKey) })
}

// DecodeStoredHistoryAt strictly decodes a stored history entry of any
// version found under a key that holds lockKey (see ExpandHistoryAt); one
// that cannot be rebuilt is corrupt.
func DecodeStoredHistoryAt(raw []byte, lockKey string) (*HistoryEntry, error) {
	if !strings.HasPrefix(string(raw), HistoryV3Prefix) {
		return DecodeStoredHistory(raw)
	}
	return decodeEitherVersion(raw, HistoryV3Prefix, func(s string) (string, bool) { return ExpandHistoryAt(s, lockKey) },
		DecodeHistoryEntry, "history: version 3 entry is malformed")
}

// expandHistoryV3 writes to b the version 1 bytes of raw, a version 3
// history entry under lockKey: its lines brought back to version 2's,
// then expanded as those are; false if they cannot be rebuilt, or a
// shortening is not spelled the one way the writer spells it.
func expandHistoryV3(b *recordWriter, raw, lockKey string) bool {
	f, ok := historyV3Lines(raw, lockKey)
	return ok && expandHistoryLines(b, &f)
}

// historyV3Lines brings the lines of raw, a version 3 history entry under
// lockKey, back to version 2's; false if a shortening is not spelled the
// one way the writer spells it (the lines themselves are checked where
// they are expanded).
func historyV3Lines(raw, lockKey string) (f [Hv2Lines]string, ok bool) {
	var g [hv3Lines]string
	tag, ok := strings.CutPrefix(lockKey, KeyPrefix)
	if !ok || tag == "" || !strings.HasPrefix(raw, HistoryV3Prefix) || !splitLines(raw, g[:]) {
		return f, false
	}
	rec := g[hv3Record:]
	if !digits(rec[factAcquired]) || !digits(g[hv3Ended]) || !digits(rec[factExpires]) {
		return f, false
	}
	state, ok := letterStates[rec[factState]]
	if !ok {
		return f, false
	}
	acquired, _ := strconv.ParseInt(rec[factAcquired], 10, 64)
	renewed, ok := renewalFrom(rec[factRenewed], acquired)
	if !ok {
		return f, false
	}
	at := func(delta string) string {
		d, _ := strconv.ParseInt(delta, 10, 64)
		return strconv.FormatInt(acquired+d, 10)
	}
	f[Hv2Ended], f[Hv2By], f[Hv2Request], f[Hv2Reason], f[Hv2Incident] = at(g[hv3Ended]), g[hv3By], g[hv3Request], g[hv3Reason], g[hv3Incident]
	switch by := g[hv3By]; {
	case by == "=":
		f[Hv2By] = rec[factOwner]
	case by != "" && by == rec[factOwner]:
		return f, false // the writer spells the owner "="
	}
	f[Hv2Tag] = tag
	copy(f[Hv2Tuple:Hv2Record], g[hv3Tuple:hv3Record])
	facts := f[Hv2Record:]
	copy(facts, rec)
	facts[factRenewed] = strconv.FormatInt(renewed, 10)
	facts[factExpires] = at(rec[factExpires])
	facts[factState] = string(state)
	return f, true
}

// renewalLine is renewed_at as the versions that shorten it write it
// (history version 3, record version 4): empty when it is acquired_at,
// else ms after it.
func renewalLine(acquired, renewed int64) string {
	if renewed == acquired {
		return ""
	}
	return strconv.FormatInt(renewed-acquired, 10)
}

// renewalFrom is renewed_at from line, as renewalLine spells it; false for
// any other spelling (a renewal 0 ms after, a leading zero, a sign).
func renewalFrom(line string, acquired int64) (int64, bool) {
	if line == "" {
		return acquired, true
	}
	if !digits(line) || line == "0" {
		return 0, false
	}
	d, _ := strconv.ParseInt(line, 10, 64)
	return acquired + d, true
}
