package lease

import (
	"strconv"
	"strings"
)

// Evidence version 3 ("ev3", by reference) is the evidence of an
// acquisition or a release without a copy of its record: a store that
// keeps the record in the same transaction (the active record, then its
// history entry) stores only what the record does not keep for good, and
// rebuilds the rest from the record. Of the acquired record, a renewal
// changes renewed_at, expires_at and ttl_ms, and the end changes state;
// every other fact stays. So version 3 holds the operation, digest, code
// and backend time of version 2, the lease id and fencing token that name
// the record, and the result's expires_at and ttl_ms: an acquisition's
// record is rebuilt with those, renewed_at its acquired_at and state
// active; a release's result is its history entry's record itself, which
// must have them and be released. Readers rebuild version 1 from it and a
// record of the same lease (ExpandReferringEvidence) and decode that
// strictly, as for every version. A store that drops the record while
// the evidence lasts first rewrites the evidence in a self-contained
// version (ReferredEvidence, then CompactEvidence).

// EvidenceRefPrefix starts every version 3 evidence value.
const EvidenceRefPrefix = "ev3\n"

// Evidence version 3 line numbers (0 is the version).
const (
	ev3Op = 1 + iota
	ev3Digest
	ev3Code
	ev3Backend
	ev3LeaseID
	ev3Token
	ev3Expires
	ev3TTL
	ev3Lines
)

// ReferringEvidence returns e as version 3 evidence if it is evidence
// version 3 carries: an acquisition's of the lease as granted (renewed_at
// and backend_time its acquired_at, state active), or a release's. ok is
// false for any other, which the caller stores in another version.
func ReferringEvidence(e *IdempotencyRecord) (b []byte, ok bool) {
	r := e.Lease
	switch {
	case r == nil || !isSHA256Hex(e.Digest):
		return nil, false
	case e.Op == OpAcquire && e.Code == CodeAcquired && r.State == StateActive &&
		r.RenewedAt.UnixMilli() == r.AcquiredAt.UnixMilli() && e.BackendTime.UnixMilli() == r.AcquiredAt.UnixMilli():
	case e.Op == OpRelease && e.Code == CodeReleased && r.State == StateReleased:
	default:
		return nil, false
	}
	return []byte(EvidenceRefPrefix + string(e.Op) + "\n" + e.Digest + "\n" + string(e.Code) + "\n" + msOf(e.BackendTime) +
		"\n" + r.LeaseID + "\n" + strconv.FormatUint(r.FencingToken, 10) + "\n" + msOf(r.ExpiresAt) +
		"\n" + strconv.FormatInt(r.TTLMs, 10)), true
}

// ReferredLeaseID is the lease id version 3 evidence names; ok is false
// for a value that is not version 3.
func ReferredLeaseID(raw string) (id string, ok bool) {
	var f [ev3Lines]string
	if !strings.HasPrefix(raw, EvidenceRefPrefix) || !splitLines(raw, f[:]) {
		return "", false
	}
	return f[ev3LeaseID], true
}

// ReferredEvidence rebuilds version 3 evidence raw with rec, a record of
// the lease it names (its lease id and fencing token must be the ones raw
// names: for an acquisition active or ended, for a release its history
// entry's). ok is false if raw is not well-formed version 3 or rec is not
// its lease's. The evidence is not validated: encoding or strictly
// decoding it does that.
func ReferredEvidence(raw string, rec *Record) (e *IdempotencyRecord, ok bool) {
	var f [ev3Lines]string
	if rec == nil || !strings.HasPrefix(raw, EvidenceRefPrefix) || !splitLines(raw, f[:]) {
		return nil, false
	}
	for _, i := range []int{ev3Backend, ev3Token, ev3Expires, ev3TTL} {
		if !digits(f[i]) {
			return nil, false
		}
	}
	backend, _ := strconv.ParseInt(f[ev3Backend], 10, 64)
	token, _ := strconv.ParseUint(f[ev3Token], 10, 64)
	expires, _ := strconv.ParseInt(f[ev3Expires], 10, 64)
	ttl, _ := strconv.ParseInt(f[ev3TTL], 10, 64)
	if rec.LeaseID != f[ev3LeaseID] || rec.FencingToken != token {
		return nil, false
	}
	result := rec.Clone()
	switch Op(f[ev3Op]) {
	case OpAcquire:
		result.RenewedAt, result.ExpiresAt, result.TTLMs, result.State = result.AcquiredAt, UnixMilli(expires), ttl, StateActive
	case OpRelease:
		if rec.State != StateReleased || rec.ExpiresAt.UnixMilli() != expires || rec.TTLMs != ttl {
			return nil, false
		}
	default:
		return nil, false
	}
	return &IdempotencyRecord{Version: IdempotencyVersion, Op: Op(f[ev3Op]), Digest: f[ev3Digest], Code: Code(f[ev3Code]),
		Lease: result, BackendTime: UnixMilli(backend)}, true
}

// ExpandReferringEvidence returns version 3 evidence raw, rebuilt with
// rec (see ReferredEvidence), as version 1 bytes; ok is false if it
// cannot be rebuilt into evidence that encodes. Strict decoding of the
// result is the caller's.
func ExpandReferringEvidence(raw string, rec *Record) (string, bool) {
	e, ok := ReferredEvidence(raw, rec)
	if !ok {
		return "", false
	}
	b, err := e.Encode()
	return string(b), err == nil
}

// DetachedEvidence rewrites version 3 evidence raw in version 2 from
// hist, the stored history entry of its lease in version 2, whose record
// lines are the facts version 2 evidence holds, in the same order: the
// same lines, changed as ReferredEvidence changes the record (an
// acquisition's renewed_at, expires_at, ttl_ms and state), so version 2
// expands to the very document ReferredEvidence's record encodes
// (TestDetachedEvidenceExpandsAsReferred), without encoding and checking
// it again. hist must be an entry the caller strictly decoded
// (DecodeStoredHistory) and found under raw's lock key: its lines are not
// checked here, only that it is version 2 of raw's lease as
// ReferredEvidence requires (review s40d: damaged lines of an entry that
// does not decode can still splice into readable evidence). ok is false
// otherwise, and for raw that is not version 3; the caller then takes
// ReferredEvidence and CompactEvidence.
func DetachedEvidence(raw, hist string) ([]byte, bool) {
	var e [ev3Lines]string
	var h [Hv2Lines]string
	if !strings.HasPrefix(raw, EvidenceRefPrefix) || !splitLines(raw, e[:]) ||
		!strings.HasPrefix(hist, HistoryV2Prefix) || !splitLines(hist, h[:]) {
		return nil, false
	}
	f := entryFacts(&h)
	if *f.at(Ev2LeaseID) != e[ev3LeaseID] || *f.at(Ev2Token) != e[ev3Token] {
		return nil, false
	}
	return f.spliced(h[Hv2Tag], Op(e[ev3Op]), e[ev3Digest], e[ev3Code], e[ev3Backend], e[ev3Expires], e[ev3TTL])
}

// evidenceFacts are a history entry's record lines as evidence version 2
// numbers them, from its lease id on (entryFacts).
type evidenceFacts [Ev2Lines - Ev2LeaseID]string

// entryFacts are the record lines of h, a history entry's lines as
// version 2 numbers them.
func entryFacts(h *[Hv2Lines]string) (f evidenceFacts) {
	copy(f[:], h[Hv2Record:])
	return f
}

// at is the fact on evidence version 2's line.
func (f *evidenceFacts) at(line int) *string { return &f[line-Ev2LeaseID] }

// spliced is version 2 evidence of op's answer (digest, code, backend
// time) from f, the facts of its lease's history entry, whose hash tag is
// tag: an acquisition's with renewed_at its acquired_at, the answer's
// expires_at and ttl_ms and state active; a release's the entry's record
// as it ended, which must be released with that expires_at and ttl_ms.
// ok is false for another operation, or a release the entry does not end
// so. Version 3's and version 4's detaching share it.
func (f evidenceFacts) spliced(tag string, op Op, digest, code, backend, expires, ttl string) ([]byte, bool) {
	switch op {
	case OpAcquire:
		*f.at(Ev2Renewed), *f.at(Ev2Expires), *f.at(Ev2TTL), *f.at(Ev2State) = *f.at(Ev2Acquired), expires, ttl, string(StateActive)
	case OpRelease:
		if *f.at(Ev2State) != string(StateReleased) || *f.at(Ev2Expires) != expires || *f.at(Ev2TTL) != ttl {
			return nil, false
		}
	default:
		return nil, false
	}
	return []byte(EvidenceV2Prefix + string(op) + "\n" + digest + "\n" + code + "\n" + backend + "\n" + tag +
		"\n" + strings.Join(f[:], "\n")), true
}
