package lease

// Evidence version 5 ("ev5", lean by lease id; Valkey from format 7) is
// version 4 with the lease id on the line that holds version 4's check:
// for a store whose atomic step cannot compute that check (Valkey's
// function library has no SHA-256) but keeps the record it refers to in
// the same step, as version 3 does. It names its lease as version 3 does,
// by lease id and fencing token, and stores no more of it than version 4:
//
//	acquire  ev5\na\n<digest>\n<lease id>\n<token>\n<ttl ms>
//	release  ev5\nr\n<digest>\n<lease id>\n<token>
//
// Everything else is derived from the history entry of that lease as
// version 4 derives it (leanFactsOf): an acquisition's backend time is
// its acquired_at, its expires_at LeaseExpiry of the TTL it granted; a
// release's backend time is the entry's ended_at, its result the entry's
// record, which must be released. A writer stores it only when that
// rebuild gives back exactly the evidence (LeanIDEvidence); readers
// decode the rebuilt bytes strictly, as for every version. Against a
// damaged entry it checks what version 3 checks, the lease id and token:
// version 3's expires_at and ttl_ms, which a release's entry had to
// repeat, are left out with the rest of what the entry holds.

// EvidenceLeanIDPrefix starts every version 5 evidence value.
const EvidenceLeanIDPrefix = "ev5\n"

// LeanIDEvidence returns e as version 5 evidence when that rebuilds from
// e's own record (an acquisition's as granted; a release's record, ended
// at e's backend time) into exactly e; ok is false otherwise (and for e
// that does not encode), and the caller stores another version.
func LeanIDEvidence(e *IdempotencyRecord) (b []byte, ok bool) {
	if !leanShaped(e) || !leanLeaseID(e.Lease.LeaseID) || e.validate(false) != nil {
		return nil, false
	}
	return appendLeanShaped(nil, EvidenceLeanIDPrefix, e, e.Lease.LeaseID), true
}

// leanLeaseID reports a lease id version 5 can hold on its line: one that
// is not empty and holds no newline (a record's lease id is a validated
// identifier; this only keeps the lines apart).
func leanLeaseID(id string) bool { return id != "" && plainText(id) }

// leanIDLines splits version 5 evidence strictly (leanShapedLines).
func leanIDLines(raw string) ([ev4Lines]string, bool) {
	return leanShapedLines(raw, EvidenceLeanIDPrefix, leanLeaseID)
}

// LeanIDLeaseID is the operation and lease id version 5 evidence raw
// names; ok is false for a value that is not well-formed version 5.
func LeanIDLeaseID(raw string) (op Op, leaseID string, ok bool) {
	f, ok := leanIDLines(raw)
	if !ok {
		return "", "", false
	}
	return opOfLetter(f[ev4Op]), f[ev4Check], true
}

// ExpandLeanIDEvidence returns version 5 evidence raw, rebuilt with rec,
// the record of the history entry of the lease it names (lease id and
// fencing token), which ended at endedAt, as version 1 bytes; ok is false
// if raw is not well-formed version 5, rec is not that lease's, or the
// rebuilt evidence does not encode. Strict decoding of the result is the
// caller's.
func ExpandLeanIDEvidence(raw string, rec *Record, endedAt Timestamp) (string, bool) {
	f, ok := leanIDLines(raw)
	if !ok || rec == nil || rec.LeaseID != f[ev4Check] {
		return "", false
	}
	_, b, ok := leanShapedRebuilt(f, rec, endedAt)
	return string(b), ok
}
