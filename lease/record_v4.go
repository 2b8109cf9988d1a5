package lease

import (
	"strconv"
	"strings"
)

// Record version 4 ("rv4", Valkey stored format 6) is version 3 without
// what its own lines already say. It keeps the hash tag line, which the
// reader checks against the lock key of the key it read: the server's
// library reads some records without a tuple to compare (the reaper,
// inspect by id) and cannot hash one, so the tag is what refuses a record
// copied under another identity's key there, and tags are unkeyed hashes
// of caller-chosen tuples, so only the whole tag is safe from chosen
// collisions. Beyond version 3 it has:
//   - the digest in base64url (43 characters) instead of hex (64);
//   - renewed_at empty when it is acquired_at, else ms after acquired_at;
//   - expires_at empty when it is min(renewed_at + ttl_ms, acquired_at +
//     maximum_lifetime_ms), the expiry every acquire and renewal gives,
//     else ms after acquired_at;
//   - no state line: a record carrying its acquisition's evidence is
//     active;
//   - the lease id without LeaseIDPrefix (a record whose id lacks it has
//     no version 4 form);
//   - metadata empty when it is {}.
//
// Lines: rv4, the tag, digest, scope, the acquisition's ttl_ms ("" while
// it is the record's own), the tuple's seven components, then the
// record's facts as version 2 orders them without the state, metadata
// last. Each shortening has one spelling (a renewal 0 ms after the
// acquisition, an expiry spelled out where it is the derived one, a digest
// with stray low bits, {} spelled out all fail), so the bytes are
// canonical: a record has one version 4 form.
const RecordV4Prefix = "rv4\n"

// Record version 4 line numbers (0 is the version).
const (
	rv4Tag = 1 + iota
	rv4Digest
	rv4Scope
	rv4TTL
	rv4Tuple                // 7 lines
	rv4Facts = rv4Tuple + 7 // version 2's facts without the state: 15 lines, metadata last
	rv4Lines = rv4Facts + 15 + 1
)

// LeanRecord returns r, an active record, in version 4 with e; an error if
// r has no version 3 form (EmbeddingRecord) or version 4 does not give it
// back exactly.
func LeanRecord(r *Record, e EmbeddedEvidence) ([]byte, error) {
	v3, err := EmbeddingRecord(r, e)
	if err != nil {
		return nil, err
	}
	var f [rv3Lines]string
	if !splitLines(string(v3), f[:]) {
		return nil, Errorf(CodeInvalidRequest, "record: no version 4 form")
	}
	facts := f[rv3Facts:]
	if !strings.HasPrefix(r.LeaseID, LeaseIDPrefix) {
		return nil, Errorf(CodeInvalidRequest, "record: no version 4 form")
	}
	acquired, renewed, expires := r.AcquiredAt.UnixMilli(), r.RenewedAt.UnixMilli(), r.ExpiresAt.UnixMilli()
	after := func(t int64) string { return strconv.FormatInt(t-acquired, 10) }
	renewedLine, expiresLine := renewalLine(acquired, renewed), ""
	if expires != derivedExpiry(acquired, renewed, r.TTLMs, r.MaximumLifetimeMs) {
		expiresLine = after(expires)
	}
	var b strings.Builder
	b.Grow(len(v3))
	b.WriteString(RecordV4Prefix + f[rv3Tag] + "\n" + string(appendLeanDigest(nil, e.Digest)) + "\n" +
		f[rv3Scope] + "\n" + f[rv3TTL] + "\n")
	for _, l := range f[rv3Tuple:rv3Facts] {
		b.WriteString(l + "\n")
	}
	for i, l := range facts[:factState] {
		switch i {
		case factLeaseID:
			l = l[len(LeaseIDPrefix):]
		case factRenewed:
			l = renewedLine
		case factExpires:
			l = expiresLine
		}
		b.WriteString(l + "\n")
	}
	if meta := facts[factState+1]; meta != "{}" {
		b.WriteString(meta)
	}
	v4 := b.String()
	if back, ok := ExpandLeanRecord(v4, r.LockKey); !ok || back != string(v3) {
		return nil, Errorf(CodeInvalidRequest, "record: no version 4 form")
	}
	return []byte(v4), nil
}

// derivedExpiry is the expiry acquire and renew give a lease (LeaseExpiry),
// in ms: renewed + ttl, capped at acquired + the maximum lifetime.
func derivedExpiry(acquired, renewed, ttl, lifetime int64) int64 {
	return min(renewed+ttl, acquired+lifetime)
}

// ExpandLeanRecord returns a stored record found under a key that holds
// lockKey: version 4 rebuilt as version 3 (ok false if its tag is not
// lockKey's, or a shortening is not spelled the one way LeanRecord spells
// it), any other version as it is. Strict decoding of the result is the
// caller's (DecodeEmbeddingRecord): it checks that the record's tuple
// hashes to its tag.
func ExpandLeanRecord(raw, lockKey string) (string, bool) {
	if !strings.HasPrefix(raw, RecordV4Prefix) {
		return raw, true
	}
	var g [rv4Lines]string
	tag, ok := strings.CutPrefix(lockKey, KeyPrefix)
	if !ok || tag == "" || !splitLines(raw, g[:]) || g[rv4Tag] != tag {
		return "", false
	}
	digest, ok := leanDigest(g[rv4Digest])
	facts := g[rv4Facts:]
	if !ok || !digits(facts[factAcquired]) || !digits(facts[factTTL]) || !digits(facts[factLifetime]) ||
		(facts[factExpires] != "" && !digits(facts[factExpires])) {
		return "", false
	}
	num := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	acquired := num(facts[factAcquired])
	renewed, ok := renewalFrom(facts[factRenewed], acquired)
	if !ok {
		return "", false
	}
	expires := derivedExpiry(acquired, renewed, num(facts[factTTL]), num(facts[factLifetime]))
	if facts[factExpires] != "" {
		if acquired+num(facts[factExpires]) == expires {
			return "", false // the writer leaves the derived expiry out
		}
		expires = acquired + num(facts[factExpires])
	}
	var b strings.Builder
	b.Grow(len(raw) + 96)
	b.WriteString(RecordV3Prefix + digest + "\n" + g[rv4Scope] + "\n" + g[rv4TTL] + "\n" + tag + "\n")
	for _, l := range g[rv4Tuple:rv4Facts] {
		b.WriteString(l + "\n")
	}
	for i, l := range facts[:factState] {
		switch i {
		case factLeaseID:
			l = LeaseIDPrefix + l
		case factRenewed:
			l = strconv.FormatInt(renewed, 10)
		case factExpires:
			l = strconv.FormatInt(expires, 10)
		}
		b.WriteString(l + "\n")
	}
	meta := facts[factState]
	switch meta {
	case "{}":
		return "", false // the writer leaves empty metadata out
	case "":
		meta = "{}"
	}
	b.WriteString(string(StateActive) + "\n" + meta)
	return b.String(), true
}

// DecodeEmbeddingRecordAt strictly decodes a stored record of any version
// found under a key that holds lockKey (version 4 through
// ExpandLeanRecord), as DecodeEmbeddingRecord does; one that cannot be
// rebuilt is corrupt.
func DecodeEmbeddingRecordAt(raw []byte, lockKey string) (*Record, *EmbeddedEvidence, error) {
	v3, ok := ExpandLeanRecord(string(raw), lockKey)
	if !ok {
		return nil, nil, corrupt("record: version 4 is malformed")
	}
	return DecodeEmbeddingRecord([]byte(v3))
}
