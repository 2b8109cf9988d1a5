package lease

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// Evidence version 5 ("ev5", lean by lease id; Valkey from format 7) is
// version 4's lines with the lease id on the line of version 4's check,
// and a check of its own last: for a store whose atomic step cannot
// compute version 4's check (Valkey's function library has no SHA-256)
// but writes the history entry the evidence refers to in the same step.
// It names its lease as version 3 does, by lease id and fencing token:
//
//	acquire  ev5\na\n<digest>\n<lease id>\n<token>\n<ttl ms>\n<check>
//	release  ev5\nr\n<digest>\n<lease id>\n<token>\n<check>
//
// Everything else is derived from that lease's history entry as version 4
// derives it from its record (leanFactsOf): an acquisition's backend time
// is its acquired_at, its expires_at LeaseExpiry of the TTL it granted; a
// release's backend time is the entry's ended_at, its result the entry's
// record, which must be released. A writer stores it only when that
// rebuild gives back exactly the evidence (LeanIDEvidence); readers
// decode the rebuilt bytes strictly, as for every version.
//
// The check is the first 16 hex digits of the SHA-1 of the entry's bytes
// as stored, a newline, and the evidence's lines before the check (the
// server's library has SHA-1: redis.sha1hex). A history entry is never
// rewritten in place, so any damage to the entry (a fact the answer is
// derived from, or any other) or to the evidence's own lines (its TTL)
// fails closed instead of answering with the damage, as version 4's check
// does; version 3 checked only the lease id, token, expires_at and ttl_ms.
// A check, not a MAC: it guards against damage, not against a writer of
// the store, who could write any evidence.

// EvidenceLeanIDPrefix starts every version 5 evidence value.
const EvidenceLeanIDPrefix = "ev5\n"

// leanIDCheckChars is the length of version 5's check: 64 bits in hex.
const leanIDCheckChars = 16

// LeanIDEvidence returns e as version 5 evidence referring to entry, the
// bytes of its lease's history entry as stored, when that rebuilds from
// e's own record (an acquisition's as granted; a release's record, ended
// at e's backend time) into exactly e; ok is false otherwise (and for e
// that does not encode), and the caller stores another version.
func LeanIDEvidence(e *IdempotencyRecord, entry string) (b []byte, ok bool) {
	if !leanShaped(e) || !leanLeaseID(e.Lease.LeaseID) || e.validate(false) != nil {
		return nil, false
	}
	body := appendLeanShaped(nil, EvidenceLeanIDPrefix, e, e.Lease.LeaseID)
	return append(append(body, '\n'), leanIDCheck(entry, string(body))...), true
}

// leanIDCheck is version 5's check of body, its lines before the check,
// referring to entry.
func leanIDCheck(entry, body string) string {
	h := sha1.New()
	h.Write([]byte(entry))
	h.Write([]byte{'\n'})
	h.Write([]byte(body))
	return hex.EncodeToString(h.Sum(nil))[:leanIDCheckChars]
}

// leanLeaseID reports a lease id version 5 can hold on its line: one that
// is not empty and holds no newline (a record's lease id is a validated
// identifier; this only keeps the lines apart).
func leanLeaseID(id string) bool { return id != "" && plainText(id) }

// leanIDLines splits version 5 evidence strictly: its lines before the
// check as leanShapedLines does, and the check, 16 lower-case hex digits;
// body is the value without its last line.
func leanIDLines(raw string) (f [ev4Lines]string, body, check string, ok bool) {
	i := strings.LastIndexByte(raw, '\n')
	if i < 0 {
		return f, "", "", false
	}
	body, check = raw[:i], raw[i+1:]
	if len(check) != leanIDCheckChars || !LowerHex(check) {
		return f, "", "", false
	}
	f, ok = leanShapedLines(body, EvidenceLeanIDPrefix, leanLeaseID)
	return f, body, check, ok
}

// LeanIDLeaseID is the operation and lease id version 5 evidence raw
// names; ok is false for a value that is not well-formed version 5.
func LeanIDLeaseID(raw string) (op Op, leaseID string, ok bool) {
	f, _, _, ok := leanIDLines(raw)
	if !ok {
		return "", "", false
	}
	return opOfLetter(f[ev4Op]), f[ev4Check], true
}

// ExpandLeanIDEvidence returns version 5 evidence raw, rebuilt with rec,
// the record of entry, the history entry of the lease it names (lease id
// and fencing token) as stored, which ended at endedAt, as version 1
// bytes; ok is false if raw is not well-formed version 5, its check is
// not that of entry and its own lines, rec is not that lease's, or the
// rebuilt evidence does not encode. Strict decoding of the result is the
// caller's.
func ExpandLeanIDEvidence(raw, entry string, rec *Record, endedAt Timestamp) (string, bool) {
	f, body, check, ok := leanIDLines(raw)
	if !ok || rec == nil || rec.LeaseID != f[ev4Check] || leanIDCheck(entry, body) != check {
		return "", false
	}
	_, b, ok := leanShapedRebuilt(f, rec, endedAt)
	return string(b), ok
}
