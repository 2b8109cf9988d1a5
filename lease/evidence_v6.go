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
// strict decoding refuse it. Version 6 keeps the tag in its check
// instead: the first 16 hex digits of the SHA-1 of the lock key's hash
// tag, a newline, and the lines after the check (the server's library
// has SHA-1, not SHA-256: redis.sha1hex). The reader passes the lock key
// of the request it answers, so a copy under another identity's key, or
// any damage to a line, fails the check and answers corrupt; version 2
// could not tell damage to a number from the number. A check, not a MAC:
// it guards against damage, not against a writer of the store.
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

// WholeEvidence returns e as version 6 evidence, for a request for id
// (e's lease's identity), when it is evidence version 2 carries exactly
// (CompactEvidence) with a digest of 64 lower-case hex digits; ok is
// false otherwise, and the caller stores another version.
func WholeEvidence(e *IdempotencyRecord, id Identity) (b []byte, ok bool) {
	v2, err := CompactEvidence(e, id)
	if err != nil || !strings.HasPrefix(string(v2), EvidenceV2Prefix) {
		return nil, false
	}
	return wholeOfV2(string(v2))
}

// wholeOfV2 is version 6 of v2, version 2 evidence: its tag line taken
// into the check, its digest in base64url.
func wholeOfV2(v2 string) ([]byte, bool) {
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
	out = append(append(append(out, EvidenceWholePrefix...), wholeCheck(f[Ev2Tag], string(rest))...), '\n')
	return append(out, rest...), true
}

// wholeCheck is version 6's check of rest, its lines after the check,
// stored under the identity whose lock key's hash tag is tag: version 5's
// hash, with the tag where version 5 has its history entry.
func wholeCheck(tag, rest string) string { return leanIDCheck(tag, rest) }

// ExpandEvidenceAt returns stored evidence read for a request for id,
// whose lock key is lockKey, as version 1 bytes: version 6 checked
// against lockKey's hash tag and brought back to version 2's lines, then
// rebuilt as ExpandEvidence rebuilds version 2; every other version as
// ExpandEvidence returns it. ok is false for version 6 that is not
// well-formed, or whose check is not that of lockKey and its lines.
func ExpandEvidenceAt(raw string, id Identity, lockKey string) (string, bool) {
	if !strings.HasPrefix(raw, EvidenceWholePrefix) {
		return ExpandEvidence(raw, id)
	}
	v2, ok := wholeAsV2(raw, lockKey)
	if !ok {
		return "", false
	}
	return ExpandEvidence(v2, id)
}

// wholeAsV2 is version 6 evidence raw, stored under lockKey, as the
// version 2 lines it stands for; false unless its check is that of
// lockKey's hash tag and its lines and its digest is the canonical
// base64url of 32 bytes.
func wholeAsV2(raw, lockKey string) (string, bool) {
	tag, ok := strings.CutPrefix(lockKey, KeyPrefix)
	if !ok || tag == "" || !strings.HasPrefix(raw, EvidenceWholePrefix) {
		return "", false
	}
	var f [7]string // version, check, op, digest, code, backend, the rest
	if !splitLines(raw, f[:]) {
		return "", false
	}
	check := f[1]
	if len(check) != wholeCheckChars || !LowerHex(check) ||
		wholeCheck(tag, raw[len(EvidenceWholePrefix)+wholeCheckChars+1:]) != check {
		return "", false
	}
	digest, ok := leanDigest(f[3])
	if !ok {
		return "", false
	}
	return EvidenceV2Prefix + f[2] + "\n" + digest + "\n" + f[4] + "\n" + f[5] + "\n" + tag + "\n" + f[6], true
}
