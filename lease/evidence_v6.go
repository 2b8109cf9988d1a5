package lease

import "strings"

// Evidence version 6 ("ev6", whole and checked; Valkey from format 8) is
// version 2 without its hash tag line, with the digest in base64url and
// a check on the line after the version:
//
//	ev6\n<check>\n<op>\n<digest>\n<code>\n<backend ms>\n<version 2's lines after the tag>
//
// Version 2 keeps the hash tag because it holds no identity tuple: a copy
// of it under another identity's key would rebuild a record of that
// identity's tuple, and the tag (the record's lock key) is what makes
// strict decoding refuse it. Version 6 binds more than the identity
// instead: its check is the first 16 hex digits of the SHA-1 of the
// evidence's idempotency scope (the name of its key, derived from the
// operation, the lock key, the principal and the request id), a newline,
// and the lines after the check (the server's library has SHA-1, not
// SHA-256: redis.sha1hex). The reader passes the scope of the request it
// answers, so a copy under any other key (another identity's, another
// operation's, another request's of the same body, another principal's)
// or any damage to a line fails the check and answers corrupt, where
// version 2 answered another request's result or a conflict, and could
// not tell damage to a number from the number. A check, not a MAC: it
// guards against damage and misplaced values, not against a writer of
// the store.
//
// It is what the store writes where version 2 is whole: evidence that
// does not refer to a history entry, and the rewrite of evidence that did
// before its entry is trimmed. About 50 bytes less than version 2 per
// value (the tag line, 44 bytes, and 21 of the digest's, against the
// check's 17).

// EvidenceWholePrefix starts every version 6 evidence value.
const EvidenceWholePrefix = "ev6\n"

// Version 6's check is version 5's: 64 bits in hex.
const wholeCheckChars = leanIDCheckChars

// WholeEvidence returns e as version 6 evidence stored under scope, for a
// request for id (e's lease's identity), when it is evidence version 2
// carries exactly (CompactEvidence) with a digest of 64 lower-case hex
// digits, and scope is one (ValidScope, as the library's writer checks);
// ok is false otherwise, and the caller stores another version.
func WholeEvidence(e *IdempotencyRecord, id Identity, scope string) (b []byte, ok bool) {
	if !ValidScope(scope) {
		return nil, false
	}
	v2, err := CompactEvidence(e, id)
	if err != nil || !strings.HasPrefix(string(v2), EvidenceV2Prefix) {
		return nil, false
	}
	return wholeOfV2(string(v2), scope)
}

// wholeOfV2 is version 6 of v2, version 2 evidence, stored under scope:
// its tag line left out, its digest in base64url.
func wholeOfV2(v2, scope string) ([]byte, bool) {
	var f [Ev2Tag + 2]string // version .. tag, and the rest
	if !splitLines(v2, f[:]) || !isSHA256Hex(f[Ev2Digest]) {
		return nil, false
	}
	rest := make([]byte, 0, len(v2))
	rest = append(append(rest, f[Ev2Op]...), '\n')
	rest = append(appendLeanDigest(rest, f[Ev2Digest]), '\n')
	rest = append(append(rest, f[Ev2Code]...), '\n')
	rest = append(append(rest, f[Ev2Backend]...), '\n')
	rest = append(rest, f[Ev2Tag+1]...)
	out := make([]byte, 0, len(EvidenceWholePrefix)+wholeCheckChars+1+len(rest))
	out = append(append(append(out, EvidenceWholePrefix...), wholeCheck(scope, string(rest))...), '\n')
	return append(out, rest...), true
}

// wholeCheck is version 6's check of rest, its lines after the check,
// stored under scope: version 5's hash, with the scope where version 5
// has its history entry.
func wholeCheck(scope, rest string) string { return leanIDCheck(scope, rest) }

// ExpandEvidenceFor returns stored evidence read for p, the request it
// answers, as version 1 bytes: version 6 checked against p's scope and
// brought back to version 2's lines with the hash tag of p's lock key,
// then rebuilt as ExpandEvidence rebuilds version 2; every other version
// as ExpandEvidence returns it. ok is false for version 6 that is not
// well-formed, or whose check is not that of p's scope and its lines.
func ExpandEvidenceFor(raw string, p Prepared) (string, bool) {
	if !strings.HasPrefix(raw, EvidenceWholePrefix) {
		return ExpandEvidence(raw, p.Identity)
	}
	v2, ok := wholeAsV2(raw, p.LockKey, p.Scope)
	if !ok {
		return "", false
	}
	return ExpandEvidence(v2, p.Identity)
}

// wholeAsV2 is version 6 evidence raw, stored under scope within lockKey,
// as the version 2 lines it stands for; false unless its check is that of
// scope and its lines and its digest is the canonical base64url of 32
// bytes.
func wholeAsV2(raw, lockKey, scope string) (string, bool) {
	tag, ok := strings.CutPrefix(lockKey, KeyPrefix)
	if !ok || tag == "" || scope == "" || !strings.HasPrefix(raw, EvidenceWholePrefix) {
		return "", false
	}
	var f [7]string // version, check, op, digest, code, backend, the rest
	if !splitLines(raw, f[:]) {
		return "", false
	}
	check := f[1]
	if len(check) != wholeCheckChars || !LowerHex(check) ||
		wholeCheck(scope, raw[len(EvidenceWholePrefix)+wholeCheckChars+1:]) != check {
		return "", false
	}
	digest, ok := leanDigest(f[3])
	if !ok {
		return "", false
	}
	return EvidenceV2Prefix + f[2] + "\n" + digest + "\n" + f[4] + "\n" + f[5] + "\n" + tag + "\n" + f[6], true
}
