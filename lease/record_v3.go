package lease

import (
	"strconv"
	"strings"
	"time"
)

// Record version 3 ("rv3", Valkey stored format 4) is an active record
// that also carries its acquisition's idempotency evidence, so no
// evidence key is written while the lease is active: while it is active,
// the record holds every fact of the acquire's result except the request
// digest, the idempotency scope (which names the evidence key the store
// writes when the lease ends) and, once a renewal changed it, the
// acquisition's ttl_ms. Lines: rv3, digest (64 lowercase hex), scope (43
// base64url), the acquisition's ttl_ms ("" while it is the record's own),
// then record version 2 from its hash tag on. Readers take every record
// version (DecodeAnyStoredRecord); the evidence comes from
// DecodeEmbeddingRecord.
const RecordV3Prefix = "rv3\n"

// Record version 3 line numbers (0 is the version).
const (
	rv3Digest = 1 + iota
	rv3Scope
	rv3TTL
	rv3Tag
	rv3Tuple                 // 7 lines
	rv3Facts = rv3Tuple + 7  // 17 lines, metadata last
	rv3Lines = rv3Facts + 17 // factState is the state within the facts
)

// EmbeddedEvidence is what a version 3 record holds of its acquisition
// beside the record itself.
type EmbeddedEvidence struct {
	Digest string // the acquire's request digest
	Scope  string // its idempotency scope (IdempotencyScope)
	TTLMs  int64  // the acquisition's ttl_ms
}

// EmbeddingRecord returns r, an active record, in version 3 with e; an
// error if r has no version 2 form or e is malformed (nothing a reader
// would refuse is written).
func EmbeddingRecord(r *Record, e EmbeddedEvidence) ([]byte, error) {
	v2, err := CompactRecord(r)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(string(v2), RecordV2Prefix) || r.State != StateActive || !e.wellFormed() {
		return nil, Errorf(CodeInvalidRequest, "record: no version 3 form")
	}
	ttl := ""
	if e.TTLMs != r.TTLMs {
		ttl = strconv.FormatInt(e.TTLMs, 10)
	}
	b := []byte(RecordV3Prefix + e.Digest + "\n" + e.Scope + "\n" + ttl + "\n" + string(v2[len(RecordV2Prefix):]))
	if _, got, err := DecodeEmbeddingRecord(b); err != nil || *got != e {
		return nil, Errorf(CodeInvalidRequest, "record: no version 3 form")
	}
	return b, nil
}

func (e EmbeddedEvidence) wellFormed() bool {
	return isSHA256Hex(e.Digest) && ValidScope(e.Scope) && e.TTLMs >= 1 && e.TTLMs <= MaxTTL.Milliseconds()
}

// ValidScope reports whether s can be an idempotency scope (43 base64url
// characters, IdempotencyScope's form): a stored scope is checked before
// it names a key.
func ValidScope(s string) bool {
	if len(s) != 43 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// DecodeEmbeddingRecord strictly decodes a stored record of any version;
// for version 3 it also returns the embedded evidence (nil for the
// others). A version 3 record must be active, its digest and scope
// well-formed and its acquisition ttl_ms canonical ("" when it is the
// record's own, else a decimal that differs from it), and its version 2
// part must decode as DecodeStoredRecord decodes; anything else is
// corrupt.
func DecodeEmbeddingRecord(raw []byte) (*Record, *EmbeddedEvidence, error) {
	s := string(raw)
	if !strings.HasPrefix(s, RecordV3Prefix) {
		rec, err := DecodeStoredRecord(raw)
		return rec, nil, err
	}
	var f [rv3Tag + 1]string // the last holds version 2's lines from the tag on
	if !splitLines(s, f[:]) {
		return nil, nil, corrupt("record: version 3 is malformed")
	}
	e := &EmbeddedEvidence{Digest: f[rv3Digest], Scope: f[rv3Scope]}
	if f[rv3TTL] != "" {
		if !digits(f[rv3TTL]) {
			return nil, nil, corrupt("record: version 3 ttl is malformed")
		}
		e.TTLMs, _ = strconv.ParseInt(f[rv3TTL], 10, 64)
	}
	rec, err := DecodeStoredRecord([]byte(RecordV2Prefix + f[rv3Tag]))
	if err != nil {
		return nil, nil, err
	}
	if f[rv3TTL] == "" {
		e.TTLMs = rec.TTLMs
	} else if e.TTLMs == rec.TTLMs {
		return nil, nil, corrupt("record: version 3 ttl is not canonical")
	}
	if !e.wellFormed() || rec.State != StateActive {
		return nil, nil, corrupt("record: version 3 is malformed")
	}
	return rec, e, nil
}

// DecodeAnyStoredRecord strictly decodes a stored record of any version
// (1, 2 or 3), the record alone.
func DecodeAnyStoredRecord(raw []byte) (*Record, error) {
	rec, _, err := DecodeEmbeddingRecord(raw)
	return rec, err
}

// Acquisition is the acquire's idempotency evidence e embedded in rec, a
// record of the lease it acquired, as version 1 bytes: the lease as
// granted (renewed_at and backend time its acquired_at, ttl_ms the
// acquisition's, expires_at acquired_at + min(ttl_ms, maximum lifetime),
// state active), exactly what the acquire answered and what an evidence
// key stores for it. Strict decoding of the result is the caller's.
func (e EmbeddedEvidence) Acquisition(rec *Record) ([]byte, error) {
	orig := rec.Clone()
	orig.RenewedAt, orig.TTLMs, orig.State = orig.AcquiredAt, e.TTLMs, StateActive
	orig.ExpiresAt = LeaseExpiry(orig.AcquiredAt, time.Duration(e.TTLMs)*time.Millisecond, orig.AcquiredAt,
		time.Duration(orig.MaximumLifetimeMs)*time.Millisecond)
	ev := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpAcquire, Digest: e.Digest, Code: CodeAcquired, Lease: orig,
		BackendTime: orig.AcquiredAt}
	return ev.Encode()
}
