package lease

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Evidence version 4 ("ev4", lean, by reference; bolt from schema 11)
// keeps of an acquisition's or a release's evidence only what no record
// of its lease holds: the operation as one letter, the digest (base64url,
// 43 bytes instead of 64 hex), a check of the version 1 bytes it stands
// for (their SHA-256 cut to 72 bits, base64url, 12 bytes), the fencing
// token that names the
// lease within the lock key (the counter never gives one twice), and for
// an acquisition the TTL it granted. Everything else is derived from the
// record found under the request's lock key with that token (the active
// record, else its history entry):
//
//	acquire  ev4\na\n<digest>\n<check>\n<token>\n<ttl ms>
//	         code lease_acquired; backend time = acquired_at; the result
//	         is the record with renewed_at = acquired_at, ttl_ms = <ttl>,
//	         expires_at = LeaseExpiry(acquired_at, ttl, acquired_at,
//	         maximum_lifetime) and state active (what a renewal or the
//	         end changed, undone)
//	release  ev4\nr\n<digest>\n<check>\n<token>
//	         code lease_released; backend time = the entry's ended_at; the
//	         result is the history entry's record, which must be released
//
// A writer stores it only when the rebuild from the very record it keeps
// gives back exactly the version 1 bytes (LeanEvidence); readers decode
// the rebuilt bytes strictly, as for every version. The check stands in
// for the lease id version 3 named, and goes further: a record damaged in
// any fact the evidence takes from it (its lease id too) no longer
// rebuilds bytes of that check, and the evidence fails closed instead of
// answering with the damage. A hash, not a CRC: damage can be made to
// keep a CRC (review of session 44: a lease id changed in one bit and an
// execution id edited to match), but not a 72-bit SHA-256 prefix.

// EvidenceLeanPrefix starts every version 4 evidence value.
const EvidenceLeanPrefix = "ev4\n"

// The operation letters of version 4.
const (
	ev4Acquire = "a"
	ev4Release = "r"
)

// ev4 line numbers (0 is the version); an acquisition has ev4Lines
// lines, a release one fewer (no TTL).
const (
	ev4Op = 1 + iota
	ev4Digest
	ev4Check
	ev4Token
	ev4TTL
	ev4Lines
)

// LeanEvidence returns e as version 4 evidence when that rebuilds from
// e's own record (an acquisition's as granted; a release's record, ended
// at e's backend time) into exactly e's version 1 encoding; ok is false
// otherwise, and the caller stores another version.
func LeanEvidence(e *IdempotencyRecord) (b []byte, ok bool) {
	if !leanShaped(e) {
		return nil, false
	}
	check, ok := leanCheckOf(e)
	if !ok {
		return nil, false
	}
	return appendLeanShaped(make([]byte, 0, len(EvidenceLeanPrefix)+2+43+1+leanCheckChars+1+16+1+16), EvidenceLeanPrefix, e, check), true
}

// leanShaped reports whether e can be stored in version 4's shape: the
// rebuild from its own record differs from e only in what that shape
// derives (its code among them), so e rebuilds exactly when those facts
// are e's. Checked on the struct, so that a commit encodes version 1
// once (for version 4's check), not twice.
func leanShaped(e *IdempotencyRecord) bool {
	r := e.Lease
	if r == nil || !isSHA256Hex(e.Digest) || opLetter(e.Op) == "" {
		return false
	}
	derived, ok := leanFactsOf(e.Op, r.TTLMs, r, e.BackendTime)
	// (A number a reader would refuse, too.)
	return ok && derived.are(e) && leanNumber(r.FencingToken) && r.TTLMs >= 0 && leanNumber(uint64(r.TTLMs))
}

// appendLeanShaped appends e in version 4's shape to v: prefix, the
// operation's letter, the digest in base64url, named (version 4's check,
// version 5's lease id), the token and an acquisition's TTL. e must be
// leanShaped.
func appendLeanShaped(v []byte, prefix string, e *IdempotencyRecord, named string) []byte {
	v = append(append(append(v, prefix...), opLetter(e.Op)...), '\n')
	v = append(appendLeanDigest(v, e.Digest), '\n') // lower-case hex, checked by leanShaped
	v = append(append(v, named...), '\n')
	v = strconv.AppendUint(v, e.Lease.FencingToken, 10)
	if e.Op == OpAcquire {
		v = strconv.AppendInt(append(v, '\n'), e.Lease.TTLMs, 10)
	}
	return v
}

// leanNumber reports a number version 4 spells in at most 16 digits, as a
// reader requires (digits).
func leanNumber(n uint64) bool { return n < 1e16 }

// leanCheckOf is the check of e's version 1 encoding; ok is false if e
// does not encode. Encoded into a pooled buffer: a commit makes one per
// acquisition and per release, and only its hash is kept.
func leanCheckOf(e *IdempotencyRecord) (check string, ok bool) {
	if e.validate(false) != nil {
		return "", false
	}
	buf := leanBuffers.Get().(*[]byte)
	defer leanBuffers.Put(buf)
	v1, err := appendIdempotencyRecord((*buf)[:0], e)
	if err != nil {
		return "", false
	}
	*buf = v1[:0]
	return leanCheck(v1), true
}

var leanBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1536); return &b }}

// LeanEvidenceToken is the operation and fencing token version 4
// evidence raw names; ok is false for a value that is not well-formed
// version 4 (see leanLines).
func LeanEvidenceToken(raw string) (op Op, token uint64, ok bool) {
	f, ok := leanLines(raw)
	if !ok {
		return "", 0, false
	}
	token, _ = strconv.ParseUint(f[ev4Token], 10, 64)
	return opOfLetter(f[ev4Op]), token, true
}

// leanLines splits version 4 evidence strictly: the prefix, a known
// operation letter, a 43-byte canonical base64url digest of 32 bytes, a
// 12-byte base64url check of 9 bytes, a token and (acquisition
// only) a TTL in canonical decimal; a missing or extra line fails, as the
// last number then holds a newline.
func leanLines(raw string) (f [ev4Lines]string, ok bool) {
	return leanShapedLines(raw, EvidenceLeanPrefix, func(check string) bool {
		c, err := base64.RawURLEncoding.Strict().DecodeString(check)
		return err == nil && len(c) == leanCheckBytes && len(check) == leanCheckChars
	})
}

// leanShapedLines splits evidence of version 4's shape (version 4 itself,
// or version 5, which has the lease id on the check's line) strictly, as
// leanLines describes, with prefix and the check's line tested by named.
func leanShapedLines(raw, prefix string, named func(string) bool) (f [ev4Lines]string, ok bool) {
	if !strings.HasPrefix(raw, prefix) {
		return f, false
	}
	n := ev4Lines
	if strings.HasPrefix(raw[len(prefix):], ev4Release+"\n") {
		n = ev4TTL
	}
	if !splitLines(raw, f[:n]) || opOfLetter(f[ev4Op]) == "" || !digits(f[ev4Token]) || (n == ev4Lines && !digits(f[ev4TTL])) {
		return f, false
	}
	if _, ok := leanDigest(f[ev4Digest]); !ok {
		return f, false
	}
	return f, named(f[ev4Check])
}

// leanCheck is version 4's check of v1, the version 1 bytes it stands
// for, as stored: the first leanCheckBytes of their SHA-256 in base64url.
func leanCheck(v1 []byte) string {
	sum := sha256.Sum256(v1)
	return base64.RawURLEncoding.EncodeToString(sum[:leanCheckBytes])
}

// A check is 72 bits: 12 base64url characters, none of them padding.
const (
	leanCheckBytes = 9
	leanCheckChars = 12
)

// opLetter is opOfLetter's inverse: "" for an operation version 4's shape
// does not store.
func opLetter(op Op) string {
	switch op {
	case OpAcquire:
		return ev4Acquire
	case OpRelease:
		return ev4Release
	}
	return ""
}

func opOfLetter(l string) Op {
	switch l {
	case ev4Acquire:
		return OpAcquire
	case ev4Release:
		return OpRelease
	}
	return ""
}

// appendLeanDigest appends to v the base64url form of hexDigest, 64
// lower-case hex digits (checked by the caller): leanDigest's inverse.
func appendLeanDigest(v []byte, hexDigest string) []byte {
	var digest [32]byte
	hex.Decode(digest[:], []byte(hexDigest))
	return base64.RawURLEncoding.AppendEncode(v, digest[:])
}

// leanDigest is the hex digest of its base64url form d, which must be the
// canonical spelling of 32 bytes (Strict: no stray bits in the last
// character).
func leanDigest(d string) (string, bool) {
	if len(d) != 43 {
		return "", false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(d)
	if err != nil || len(b) != 32 {
		return "", false
	}
	return hex.EncodeToString(b), true
}

// LeanReferredEvidence rebuilds version 4 evidence raw with rec, the
// record found under the request's lock key with the token raw names
// (an acquisition's: active or ended; a release's: its history entry's,
// which ended at endedAt). ok is false if raw is not well-formed version
// 4, rec is not a record it can be rebuilt from, or the rebuilt evidence
// does not encode to bytes of raw's check. Strict decoding of its
// encoding is the caller's.
func LeanReferredEvidence(raw string, rec *Record, endedAt Timestamp) (*IdempotencyRecord, bool) {
	e, _, ok := leanRebuilt(raw, rec, endedAt)
	return e, ok
}

// ExpandLeanEvidence returns version 4 evidence raw, rebuilt with rec and
// endedAt (see LeanReferredEvidence), as version 1 bytes; ok is false if
// it cannot be rebuilt. Strict decoding of the result is the caller's.
func ExpandLeanEvidence(raw string, rec *Record, endedAt Timestamp) (string, bool) {
	_, v1, ok := leanRebuilt(raw, rec, endedAt)
	return v1, ok
}

// leanRebuilt is LeanReferredEvidence with the version 1 bytes it encodes.
func leanRebuilt(raw string, rec *Record, endedAt Timestamp) (*IdempotencyRecord, string, bool) {
	f, ok := leanLines(raw)
	if !ok {
		return nil, "", false
	}
	e, b, ok := leanShapedRebuilt(f, rec, endedAt)
	if !ok || leanCheck(b) != f[ev4Check] {
		return nil, "", false
	}
	return e, string(b), true
}

// leanShapedRebuilt rebuilds evidence of version 4's shape, split into f,
// with rec (its token must be f's) and endedAt, and encodes it: what
// version 4 and version 5 derive alike. Their own line (the check, the
// lease id) is the caller's to compare.
func leanShapedRebuilt(f [ev4Lines]string, rec *Record, endedAt Timestamp) (*IdempotencyRecord, []byte, bool) {
	if rec == nil {
		return nil, nil, false
	}
	token, _ := strconv.ParseUint(f[ev4Token], 10, 64)
	digest, _ := leanDigest(f[ev4Digest])
	if rec.FencingToken != token {
		return nil, nil, false
	}
	op := opOfLetter(f[ev4Op])
	ttl, _ := strconv.ParseInt(f[ev4TTL], 10, 64) // 0 for a release, which has none
	derived, ok := leanFactsOf(op, ttl, rec, endedAt)
	if !ok {
		return nil, nil, false
	}
	e := &IdempotencyRecord{Version: IdempotencyVersion, Op: op, Digest: digest, Code: derived.code,
		Lease: rec.Clone(), BackendTime: derived.backendTime}
	e.Lease.RenewedAt, e.Lease.ExpiresAt, e.Lease.TTLMs, e.Lease.State = derived.renewedAt, derived.expiresAt, derived.ttlMs, derived.state
	b, err := e.Encode()
	if err != nil {
		return nil, nil, false
	}
	return e, b, true
}

// DetachedLeanEvidence returns version 4 evidence raw in version 2 (the
// facts, no longer by reference), spliced from hist, the stored history
// entry of its lease (version 3 under lockKey, or version 2), whose
// removal it outlives; id is the entry's identity, which the caller
// decoded hist into (strictly: the splice relies on it). ok is false if
// raw or hist is not of those versions, hist is not its lease's entry,
// or the version 2 evidence does not expand to bytes of raw's check; the
// caller then rebuilds it (LeanReferredEvidence) or leaves it.
func DetachedLeanEvidence(raw, hist, lockKey string, id Identity) ([]byte, bool) {
	e, ok := leanLines(raw)
	if !ok {
		return nil, false
	}
	var h [Hv2Lines]string
	switch {
	case strings.HasPrefix(hist, HistoryV3Prefix):
		h, ok = historyV3Lines(hist, lockKey)
	case strings.HasPrefix(hist, HistoryV2Prefix):
		ok = splitLines(hist, h[:])
	default:
		ok = false
	}
	if !ok {
		return nil, false
	}
	f := entryFacts(&h)
	if *f.at(Ev2Token) != e[ev4Token] || !digits(*f.at(Ev2Acquired)) || !digits(*f.at(Ev2Lifetime)) {
		return nil, false
	}
	// What version 4 derives (leanFactsOf), from the entry's lines: an
	// acquisition's answer at acquired_at with the expiry its TTL gave, a
	// release's at the entry's end with the entry's own.
	op := opOfLetter(e[ev4Op])
	backend, expires, ttl := h[Hv2Ended], *f.at(Ev2Expires), *f.at(Ev2TTL)
	if op == OpAcquire {
		acquired, _ := strconv.ParseInt(*f.at(Ev2Acquired), 10, 64)
		granted, _ := strconv.ParseInt(e[ev4TTL], 10, 64)
		lifetime, _ := strconv.ParseInt(*f.at(Ev2Lifetime), 10, 64)
		backend, ttl = *f.at(Ev2Acquired), e[ev4TTL]
		expires = msOf(LeaseExpiry(UnixMilli(acquired), time.Duration(granted)*time.Millisecond, UnixMilli(acquired),
			time.Duration(lifetime)*time.Millisecond))
	}
	digest, _ := leanDigest(e[ev4Digest])
	b, ok := f.spliced(h[Hv2Tag], op, digest, string(op.SuccessCode()), backend, expires, ttl)
	if !ok {
		return nil, false
	}
	buf := leanBuffers.Get().(*[]byte)
	defer leanBuffers.Put(buf)
	w := collector(*buf)
	expands := expandEvidence(w, string(b), id)
	*buf = w.collected[:0]
	if !expands || leanCheck(w.collected) != e[ev4Check] {
		return nil, false
	}
	return b, true
}

// leanFacts are what version 4 derives from the record of its lease: the
// answered record differs from the record found only in these. An
// acquisition's undoes what renewals and the end changed; a release's is
// its history entry's record, answered at the entry's end.
type leanFacts struct {
	code                              Code
	backendTime, renewedAt, expiresAt Timestamp
	ttlMs                             int64
	state                             State
}

// leanFactsOf derives them for op from rec (ttl: the acquisition's, from
// the evidence; endedAt: the history entry's end); ok is false where rec
// cannot be the record of such an answer (a release's record not
// released, an operation version 4 does not store).
func leanFactsOf(op Op, ttl int64, rec *Record, endedAt Timestamp) (f leanFacts, ok bool) {
	switch op {
	case OpAcquire:
		return leanFacts{code: CodeAcquired, backendTime: rec.AcquiredAt, renewedAt: rec.AcquiredAt,
			expiresAt: LeaseExpiry(rec.AcquiredAt, time.Duration(ttl)*time.Millisecond, rec.AcquiredAt,
				time.Duration(rec.MaximumLifetimeMs)*time.Millisecond),
			ttlMs: ttl, state: StateActive}, true
	case OpRelease:
		if rec.State != StateReleased {
			return f, false
		}
		return leanFacts{code: CodeReleased, backendTime: endedAt, renewedAt: rec.RenewedAt, expiresAt: rec.ExpiresAt,
			ttlMs: rec.TTLMs, state: StateReleased}, true
	}
	return f, false
}

// are reports whether e holds exactly these facts (timestamps are whole
// milliseconds, as encoded).
func (f leanFacts) are(e *IdempotencyRecord) bool {
	r := e.Lease
	return e.Version == IdempotencyVersion && e.Code == f.code && e.BackendTime.UnixMilli() == f.backendTime.UnixMilli() &&
		r.RenewedAt.UnixMilli() == f.renewedAt.UnixMilli() && r.ExpiresAt.UnixMilli() == f.expiresAt.UnixMilli() &&
		r.TTLMs == f.ttlMs && r.State == f.state
}
