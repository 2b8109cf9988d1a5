package lease

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tests of evidence version 6 ("ev6", whole and checked; Valkey from
// stored format 8): WholeEvidence and ExpandEvidenceFor. Expectations are
// computed here from the format's description (version 2's lines, the
// digest in base64url, SHA-1 over the idempotency scope the value is
// stored under and the lines after the check), not by the code under
// test.

// v6KeyPrefix is the lock key prefix, spelled out so that the expected
// check does not depend on the package's constant.
const v6KeyPrefix = "starintel:target-lease:v1:"

// v6GoldenScope is the idempotency scope of acquisitionEvidence's own
// acquisition (IdempotencyScope of acquire, its lock key, prn_actor_01,
// request_01), computed outside Go (python3: hashlib.sha256 over the
// length-prefixed fields, base64.urlsafe_b64encode unpadded).
const v6GoldenScope = "zJVjWNZZld9C7yTN7mH4tCurYC-UkQW56FpgzhlQEko"

// v6GoldenAcq is acquisitionEvidence in version 6 stored under
// v6GoldenScope, built and checked outside Go (python3: hashlib.sha1,
// base64.urlsafe_b64encode) from its version 2 lines, so that the
// spelling can never change silently.
const v6GoldenAcq = "ev6\ne109f51ad626521b\nacquire\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s\nlease_acquired\n1785931200000\n" +
	"lease_01\nprn_actor_01\nclient_01\nkey_01\ninstance_01\n42\n1785931200000\n1785931200000\n1785931230000\n30000\n300000\n" +
	"execution_01\njob_01\ntrace_01\nrequest_01\nactive\n{\"attempt\":2,\"source\":\"scheduler\"}"

// v6Check is version 6's check, computed here: the first 16 lower-case
// hex digits of the SHA-1 of scope (the idempotency scope the value is
// stored under), a newline and rest (the lines after the check).
func v6Check(scope, rest string) string {
	sum := sha1.Sum([]byte(scope + "\n" + rest))
	return hex.EncodeToString(sum[:])[:16]
}

// v6Scope is the idempotency scope these tests store e under: that of a
// request of e's operation on e's lock key by its lease's owner with its
// lease's request id (an acquisition's own; for another operation a
// request id of the same derivation).
func v6Scope(e *IdempotencyRecord) string {
	return IdempotencyScope(e.Op, e.Lease.LockKey, e.Lease.OwnerPrincipalID, e.Lease.RequestID)
}

// v6For is the request e, stored under v6Scope(e), answers, as
// ExpandEvidenceFor reads it for.
func v6For(e *IdempotencyRecord) Prepared {
	return Prepared{Op: e.Op, Identity: e.Lease.Identity(), LockKey: e.Lease.LockKey, Scope: v6Scope(e)}
}

// v6At is the request for id whose lock key is lockKey that e's request
// would be there: its scope derived from lockKey, as every request's is.
func v6At(e *IdempotencyRecord, id Identity, lockKey string) Prepared {
	return Prepared{Op: e.Op, Identity: id, LockKey: lockKey,
		Scope: IdempotencyScope(e.Op, lockKey, e.Lease.OwnerPrincipalID, e.Lease.RequestID)}
}

// v6Tag is the hash tag of lockKey.
func v6Tag(t testing.TB, lockKey string) string {
	t.Helper()
	tag, ok := strings.CutPrefix(lockKey, v6KeyPrefix)
	if !ok || len(tag) != 43 {
		t.Fatalf("setup: lock key %q", lockKey)
	}
	return tag
}

// v6Expected is e in version 6 stored under scope as the format describes
// it, from e's version 2 (CompactEvidence, pinned by its own tests): the
// tag line dropped, the check over scope, the digest in base64url.
func v6Expected(t testing.TB, e *IdempotencyRecord, scope string) string {
	t.Helper()
	v2, err := CompactEvidence(e, e.Lease.Identity())
	if err != nil || !strings.HasPrefix(string(v2), "ev2\n") {
		t.Fatalf("setup: %s evidence has no version 2: %.12q %v", e.Op, v2, err)
	}
	f := strings.SplitN(string(v2), "\n", 7) // ev2, op, digest, code, backend, tag, the rest
	raw, err := hex.DecodeString(f[2])
	if err != nil || len(raw) != 32 {
		t.Fatalf("setup: digest %q", f[2])
	}
	if f[5] != v6Tag(t, e.Lease.LockKey) {
		t.Fatalf("setup: version 2's tag %q is not the lock key's", f[5])
	}
	rest := f[1] + "\n" + base64.RawURLEncoding.EncodeToString(raw) + "\n" + f[3] + "\n" + f[4] + "\n" + f[6]
	return "ev6\n" + v6Check(scope, rest) + "\n" + rest
}

// v6Recheck is v, version 6 lines, with its check recomputed over its
// lines after the check for scope: damage the check no longer shows.
func v6Recheck(v, scope string) string {
	f := strings.SplitN(v, "\n", 3)
	if len(f) != 3 {
		return v
	}
	return f[0] + "\n" + v6Check(scope, f[2]) + "\n" + f[2]
}

// v6Whole is the whole evidence of the store's writers, one of each
// operation and state it writes whole: an acquisition as granted (what
// write_out and detach write), a renewal, a release, a force-release and
// a revocation (remember; a release when eager or not by reference).
func v6Whole() map[string]*IdempotencyRecord {
	renew := validIdem()
	renew.Op, renew.Code = OpRenew, CodeRenewed
	renew.BackendTime = renew.Lease.RenewedAt
	ended := func(op Op, st State) *IdempotencyRecord {
		e := releaseEvidence()
		e.Op, e.Code = op, op.SuccessCode()
		e.Lease.State = st
		// fb×32 is "-_v7…" in base64url: a digest whose standard
		// base64 spelling differs.
		e.Digest = strings.Repeat("fb", 32)
		return e
	}
	return map[string]*IdempotencyRecord{
		"acquire":       acquisitionEvidence(),
		"renew":         renew,
		"release":       releaseEvidence(),
		"force_release": ended(OpForceRelease, StateReleased),
		"revoke":        ended(OpRevoke, StateRevoked),
	}
}

// mustV6Expand checks raw, e's version 6 stored under v6Scope(e),
// expands for e's request (its identity, lock key and that scope) into
// exactly e's version 1 bytes, which decode strictly into e's facts and
// encode back to the same bytes.
func mustV6Expand(t *testing.T, what, raw string, e *IdempotencyRecord) {
	t.Helper()
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, ok := ExpandEvidenceFor(raw, v6For(e))
	if !ok || got != string(want) {
		t.Fatalf("%s: expanded %v\n%s\nwant\n%s", what, ok, got, want)
	}
	dec, err := DecodeIdempotencyRecord([]byte(got))
	if err != nil {
		t.Fatalf("%s: the expansion does not decode strictly: %v", what, err)
	}
	again, err := dec.Encode()
	if err != nil || !bytes.Equal(again, want) {
		t.Fatalf("%s: decoded and encoded again: %s %v", what, again, err)
	}
	if dec.Op != e.Op || dec.Code != e.Code || dec.Digest != e.Digest || dec.BackendTime.UnixMilli() != e.BackendTime.UnixMilli() ||
		dec.Lease.LockKey != e.Lease.LockKey || dec.Lease.LeaseID != e.Lease.LeaseID || dec.Lease.FencingToken != e.Lease.FencingToken ||
		dec.Lease.State != e.Lease.State || dec.Lease.TTLMs != e.Lease.TTLMs || dec.Lease.ExpiresAt.UnixMilli() != e.Lease.ExpiresAt.UnixMilli() {
		t.Fatalf("%s: decoded %+v\nwant %+v", what, dec, e)
	}
}

// WholeEvidence writes exactly the bytes the format describes, for every
// operation and state the store writes whole, every metadata shape
// (including values that spell lines and JSON), a unicode tuple and the
// largest token; ExpandEvidenceFor rebuilds exactly e's version 1 bytes
// from them, which decode strictly. The check is the SHA-1 computed here,
// over the scope the value is stored under; version 6 is version 2 less
// 48 bytes (the tag line's 44, the digest's 21, against the check line's
// 17). One value, and its scope, are pinned as computed outside Go.
func TestWholeEvidenceV6RoundTrip(t *testing.T) {
	gold := acquisitionEvidence()
	if scope := v6Scope(gold); scope != v6GoldenScope || scope != gold.Lease.AcquisitionScope() {
		t.Fatalf("acquisitionEvidence's scope %q, want %q", scope, v6GoldenScope)
	}
	if raw, ok := WholeEvidence(gold, gold.Lease.Identity(), v6GoldenScope); !ok || string(raw) != v6GoldenAcq {
		t.Fatalf("WholeEvidence of acquisitionEvidence: %v\n%q\nwant\n%q", ok, raw, v6GoldenAcq)
	}
	if EvidenceWholePrefix != "ev6\n" {
		t.Fatalf("prefix %q", EvidenceWholePrefix)
	}
	metas := []Metadata{nil, {}, {"a": "b", "n": 1.5, "t": true, "z": nil},
		{"nl": "a\nb\r\nc", "lines": "\nlease_01\nev6\nacquire\n", "quote": `"},"state":"released"` + "\n",
			"check": strings.Repeat("0", 16), "seps": "\u2028\u2029\u0085", "uni": "ünïcödé 😀", "bs": `\\n \"`}}
	unicode := contractIdentity()
	unicode.TenantID = "é"
	n := 0
	for name, base := range v6Whole() {
		for mi, meta := range metas {
			for _, variant := range []string{"", "unicode tuple", "largest token"} {
				e := *base
				e.Lease = base.Lease.Clone()
				e.Lease.Metadata = meta
				switch variant {
				case "unicode tuple":
					e.Lease.SetIdentity(unicode)
					e.Lease.LockKey = independentKey(t, unicode)
				case "largest token":
					e.Lease.FencingToken = MaxFencingToken
				}
				what := name + ", metadata " + strconv.Itoa(mi) + " " + variant
				raw, ok := WholeEvidence(&e, e.Lease.Identity(), v6Scope(&e))
				want := v6Expected(t, &e, v6Scope(&e))
				if !ok || string(raw) != want {
					t.Fatalf("%s: WholeEvidence %v\n%q\nwant\n%q", what, ok, raw, want)
				}
				v2, _ := CompactEvidence(&e, e.Lease.Identity())
				if len(raw) != len(v2)-48 {
					t.Errorf("%s: %d bytes, version 2 %d: want 48 less", what, len(raw), len(v2))
				}
				f := strings.SplitN(string(raw), "\n", 7)
				if f[0] != "ev6" || f[2] != string(e.Op) || f[4] != string(e.Code) ||
					f[5] != strconv.FormatInt(e.BackendTime.UnixMilli(), 10) || !strings.HasPrefix(f[6], e.Lease.LeaseID+"\n") {
					t.Fatalf("%s: lines %q", what, f[:6])
				}
				mustV6Expand(t, what, string(raw), &e)
				// Version 2 of the same evidence reads as before, whatever
				// the lock key and scope given.
				for _, lk := range []string{e.Lease.LockKey, "", "x"} {
					for _, scope := range []string{v6Scope(&e), "", "x"} {
						got, ok := ExpandEvidenceFor(string(v2), Prepared{Op: e.Op, Identity: e.Lease.Identity(), LockKey: lk, Scope: scope})
						if v1, _ := e.Encode(); !ok || got != string(v1) {
							t.Fatalf("%s: version 2 under lock key %q, scope %q: %v %s", what, lk, scope, ok, got)
						}
					}
				}
				n++
			}
		}
	}
	t.Logf("%d values round-tripped", n)
}

// Every digest is spelled as the canonical base64url of its 32 bytes (the
// last character's two low bits zero) and round-trips.
func TestWholeEvidenceV6Digests(t *testing.T) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	digests := []string{strings.Repeat("00", 32), strings.Repeat("ff", 32), strings.Repeat("0123456789abcdef", 4)}
	for i := 0; i < 64; i++ {
		sum := sha256.Sum256([]byte{byte(i)})
		digests = append(digests, hex.EncodeToString(sum[:]))
	}
	for _, d := range digests {
		e := releaseEvidence()
		e.Digest = d
		raw, ok := WholeEvidence(e, e.Lease.Identity(), v6Scope(e))
		if !ok {
			t.Fatalf("digest %s: no version 6", d)
		}
		line := strings.Split(string(raw), "\n")[3]
		b, _ := hex.DecodeString(d)
		if line != base64.RawURLEncoding.EncodeToString(b) || len(line) != 43 || strings.IndexByte(alphabet, line[42])&3 != 0 {
			t.Fatalf("digest %s spelled %q", d, line)
		}
		mustV6Expand(t, "digest "+d, string(raw), e)
	}
}

// WholeEvidence writes only what version 2 carries exactly: evidence
// that Encode refuses (a refusal's code such as a conflict, another
// operation's code, an unknown operation, another version, no lease, a
// value that is not plain, a digest that is not 64 lower-case hex
// digits) and evidence CompactEvidence stores in version 1 (read for a
// tuple other than the lease's) get ok false and no bytes. wholeOfV2
// refuses a version 2 value whose digest is not 64 lower-case hex digits,
// or that is not version 2's lines.
func TestWholeEvidenceV6Refuses(t *testing.T) {
	for name, edit := range map[string]func(e *IdempotencyRecord){
		"a conflict's code":            func(e *IdempotencyRecord) { e.Code = CodeConflict },
		"a lost lease's code":          func(e *IdempotencyRecord) { e.Code = CodeLost },
		"an idempotency conflict code": func(e *IdempotencyRecord) { e.Code = CodeIdempotencyConflict },
		"another operation's code": func(e *IdempotencyRecord) {
			e.Code = map[bool]Code{true: CodeAcquired, false: CodeRenewed}[e.Op == OpRenew]
		},
		"an unknown operation":         func(e *IdempotencyRecord) { e.Op = "steal" },
		"no operation":                 func(e *IdempotencyRecord) { e.Op = "" },
		"another version":              func(e *IdempotencyRecord) { e.Version = 2 },
		"no lease":                     func(e *IdempotencyRecord) { e.Lease = nil },
		"a quote in the execution id":  func(e *IdempotencyRecord) { e.Lease.ExecutionID = `exec"x` },
		"a newline in the job id":      func(e *IdempotencyRecord) { e.Lease.JobID = "job\nx" },
		"a backslash in the trace id":  func(e *IdempotencyRecord) { e.Lease.TraceID = `trace\x` },
		"digest upper-case":            func(e *IdempotencyRecord) { e.Digest = strings.ToUpper(e.Digest) },
		"digest one upper-case letter": func(e *IdempotencyRecord) { e.Digest = "A" + e.Digest[1:] },
		"digest of 63 digits":          func(e *IdempotencyRecord) { e.Digest = e.Digest[1:] },
		"digest of 65 digits":          func(e *IdempotencyRecord) { e.Digest += "a" },
		"digest not hex":               func(e *IdempotencyRecord) { e.Digest = "g" + e.Digest[1:] },
		"digest in base64url":          func(e *IdempotencyRecord) { e.Digest = strings.Repeat("q6ur", 10) + "q6s" },
		"no digest":                    func(e *IdempotencyRecord) { e.Digest = "" },
	} {
		for op, base := range v6Whole() {
			e := *base
			if base.Lease != nil {
				e.Lease = base.Lease.Clone()
			}
			edit(&e)
			id := base.Lease.Identity()
			if raw, ok := WholeEvidence(&e, id, v6Scope(base)); ok || raw != nil {
				t.Errorf("%s, %s: version 6 %q", op, name, raw)
			}
		}
	}
	// A scope that is not one (the library's writer checks it too, and
	// writes version 2 instead).
	for op, e := range v6Whole() {
		good := v6Scope(e)
		for _, scope := range []string{"", good[1:], good + "A", good[:42] + "=", good[:42] + "/"} {
			if raw, ok := WholeEvidence(e, e.Lease.Identity(), scope); ok || raw != nil {
				t.Errorf("%s, scope %q: version 6 %q", op, scope, raw)
			}
		}
	}
	// A tuple other than the lease's: version 1 in CompactEvidence, none
	// here.
	for op, e := range v6Whole() {
		other := e.Lease.Identity()
		other.TargetID = "target_other"
		v1, _ := e.Encode()
		if b, err := CompactEvidence(e, other); err != nil || !bytes.Equal(b, v1) {
			t.Fatalf("setup: %s for another tuple: %.12q %v, want version 1", op, b, err)
		}
		if raw, ok := WholeEvidence(e, other, v6Scope(e)); ok || raw != nil {
			t.Errorf("%s for another tuple: version 6 %q", op, raw)
		}
	}
	// wholeOfV2 on version 2 lines it cannot carry.
	e := acquisitionEvidence()
	v2, _ := CompactEvidence(e, e.Lease.Identity())
	good := string(v2)
	if _, ok := wholeOfV2(good, v6Scope(e)); !ok {
		t.Fatal("setup: wholeOfV2 refused version 2")
	}
	d := e.Digest
	for name, bad := range map[string]string{
		"digest upper-case":   strings.Replace(good, d, strings.ToUpper(d), 1),
		"digest of 63 digits": strings.Replace(good, d, d[1:], 1),
		"digest not hex":      strings.Replace(good, d, "g"+d[1:], 1),
		"no digest":           strings.Replace(good, d, "", 1),
		"fewer lines":         "ev2\nacquire\n" + d + "\nlease_acquired",
	} {
		if raw, ok := wholeOfV2(bad, v6Scope(e)); ok || raw != nil {
			t.Errorf("wholeOfV2, %s: %q", name, raw)
		}
	}
}

// v6Refused checks ExpandEvidenceFor answers nothing for raw read for p.
func v6Refused(t *testing.T, what, raw string, p Prepared) {
	t.Helper()
	if got, ok := ExpandEvidenceFor(raw, p); ok || got != "" {
		t.Errorf("%s: %q expanded as %s", what, raw, got)
	}
}

// v6NotAnswer checks raw, read for p, is never an answer:
// ExpandEvidenceFor refuses it, or (only where raw is not version 6, so
// that it passes through as ExpandEvidence reads it, and where
// passThrough says so) what it gives does not decode strictly.
func v6NotAnswer(t *testing.T, what, raw string, p Prepared, passThrough bool) {
	t.Helper()
	id := p.Identity
	got, ok := ExpandEvidenceFor(raw, p)
	if !passThrough {
		if ok || got != "" {
			t.Errorf("%s: %q expanded as %s", what, raw, got)
		}
		return
	}
	if strings.HasPrefix(raw, "ev6\n") {
		t.Fatalf("setup: %s is version 6", what)
	}
	want, wantOK := ExpandEvidence(raw, id)
	if got != want || ok != wantOK {
		t.Errorf("%s: ExpandEvidenceFor %v %q, ExpandEvidence %v %q", what, ok, got, wantOK, want)
	}
	if ok {
		if _, err := DecodeIdempotencyRecord([]byte(got)); err == nil {
			t.Errorf("%s: %q decoded as evidence", what, raw)
		}
	}
}

// Any single damage to a version 6 value answers nothing: every byte
// after the version line changed (to its neighbour, its other case, a
// digit), every line removed or doubled, a line added anywhere, a
// trailing newline, space or CR; the check line malformed (upper
// case, 15 or 17 digits, the full SHA-1, not hex, empty) or well-formed
// but not this value's (computed over the lock key's hash tag instead of
// the scope, as format 8 first had it, over the lock key, without the
// newline, over another identity's scope, over the scope of another
// request, operation or principal of the same identity, over the lines
// and a newline); the digest spelled with stray bits in its last
// character, in standard base64, padded, or one character short or long,
// even with its check recomputed for the right scope (the reader wants
// the one canonical spelling). Damage to the version line itself (a byte
// changed, CRLF) makes it another version, which passes through as
// ExpandEvidence reads it and never decodes.
func TestExpandEvidenceForV6Damage(t *testing.T) {
	for op, e := range v6Whole() {
		scope := v6Scope(e)
		raw, ok := WholeEvidence(e, e.Lease.Identity(), scope)
		if !ok {
			t.Fatalf("setup: %s", op)
		}
		v := string(raw)
		p, lk := v6For(e), e.Lease.LockKey
		tag := v6Tag(t, lk)
		mustV6Expand(t, op, v, e)
		lines := strings.Split(v, "\n")
		join := func(l []string) string { return strings.Join(l, "\n") }

		// Every byte from the check on, changed three ways.
		for i := len("ev6\n"); i < len(v); i++ {
			for _, c := range []byte{v[i] ^ 1, v[i] ^ 0x20, '0'} {
				if c == v[i] {
					continue
				}
				v6Refused(t, op+": byte "+strconv.Itoa(i)+" changed", v[:i]+string(c)+v[i+1:], p)
			}
		}
		// The version line changed: another version.
		for i := 0; i < len("ev6\n"); i++ {
			for _, c := range []byte{v[i] ^ 1, v[i] ^ 0x20, '2', '5'} {
				if c != v[i] {
					v6NotAnswer(t, op+": version byte "+strconv.Itoa(i), v[:i]+string(c)+v[i+1:], p, true)
				}
			}
		}
		// In CRLF its first line is "ev6\r": another version too.
		v6NotAnswer(t, op+": CRLF", strings.ReplaceAll(v, "\n", "\r\n"), p, true)
		// Lines removed, doubled, added.
		for i := range lines {
			removed := join(append(append([]string{}, lines[:i]...), lines[i+1:]...))
			doubled := join(append(append(append([]string{}, lines[:i+1]...), lines[i]), lines[i+1:]...))
			added := join(append(append(append([]string{}, lines[:i]...), "1"), lines[i:]...))
			v6NotAnswer(t, op+": line "+strconv.Itoa(i)+" removed", removed, p, i == 0)
			v6NotAnswer(t, op+": line "+strconv.Itoa(i)+" doubled", doubled, p, false)
			v6NotAnswer(t, op+": a line before line "+strconv.Itoa(i), added, p, i == 0)
		}
		check := lines[1]
		if len(check) != 16 || check != v6Check(scope, join(lines[2:])) {
			t.Fatalf("setup: %s: check %q", op, check)
		}
		withCheck := func(c string) string { return join(append([]string{"ev6", c}, lines[2:]...)) }
		up := strings.ToUpper(check)
		if up == check {
			up = "A" + check[1:]
		}
		other := contractIdentity()
		other.TargetID = "target_other"
		digest := lines[3]
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		stray := digest[:42] + string(alphabet[strings.IndexByte(alphabet, digest[42])|1])
		withDigest := func(d string) string {
			l := append([]string{}, lines...)
			l[3] = d
			return join(l)
		}
		for name, bad := range map[string]string{
			"a trailing newline":                              v + "\n",
			"a trailing space":                                v + " ",
			"a trailing CR":                                   v + "\r",
			"a leading newline in the check":                  withCheck("\n" + check),
			"check upper-case":                                withCheck(up),
			"check of 15 digits":                              withCheck(check[:15]),
			"check of 17 digits":                              withCheck(check + "0"),
			"check the full SHA-1":                            withCheck(fullSHA1(scope, join(lines[2:]))),
			"check not hex":                                   withCheck(check[:15] + "g"),
			"check empty":                                     withCheck(""),
			"check over the tag":                              withCheck(v6Check(tag, join(lines[2:]))),
			"check over the lock key":                         withCheck(v6Check(lk, join(lines[2:]))),
			"check over no scope":                             withCheck(v6Check("", join(lines[2:]))),
			"check without the newline":                       withCheck(hex.EncodeToString(func() []byte { s := sha1.Sum([]byte(scope + join(lines[2:]))); return s[:] }())[:16]),
			"check over another identity":                     withCheck(v6Check(v6At(e, other, independentKey(t, other)).Scope, join(lines[2:]))),
			"check over another request id":                   withCheck(v6Check(IdempotencyScope(e.Op, lk, e.Lease.OwnerPrincipalID, "req_other"), join(lines[2:]))),
			"check over another principal":                    withCheck(v6Check(IdempotencyScope(e.Op, lk, "prn_other", e.Lease.RequestID), join(lines[2:]))),
			"check over another operation":                    withCheck(v6Check(IdempotencyScope(map[bool]Op{true: OpRenew, false: OpAcquire}[e.Op == OpAcquire], lk, e.Lease.OwnerPrincipalID, e.Lease.RequestID), join(lines[2:]))),
			"check over the lines and \\n":                    withCheck(v6Check(scope, join(lines[2:])+"\n")),
			"check over version 2":                            withCheck(v6Check(scope, strings.SplitN(v6V2(t, e), "\n", 2)[1])),
			"digest with stray bits":                          withDigest(stray),
			"digest with stray bits, rechecked for the scope": v6Recheck(withDigest(stray), scope),
			"digest in standard base64, rechecked":            v6Recheck(withDigest(strings.NewReplacer("-", "+", "_", "/").Replace(digest)), scope),
			"digest padded, rechecked":                        v6Recheck(withDigest(digest+"="), scope),
			"digest short, rechecked":                         v6Recheck(withDigest(digest[:42]), scope),
			"digest long, rechecked":                          v6Recheck(withDigest(digest+"A"), scope),
			"digest in hex, rechecked":                        v6Recheck(withDigest(e.Digest), scope),
		} {
			if bad == v {
				// Standard base64 spells a digest without - or _ the same.
				if name == "digest in standard base64, rechecked" {
					continue
				}
				t.Fatalf("setup: %s: %s is the value", op, name)
			}
			v6Refused(t, op+": "+name, bad, p)
		}
	}
}

// v6V2 is e's version 2 value.
func v6V2(t testing.TB, e *IdempotencyRecord) string {
	t.Helper()
	v2, err := CompactEvidence(e, e.Lease.Identity())
	if err != nil {
		t.Fatal(err)
	}
	return string(v2)
}

// Version 6 is read only under the lock key it was written for: a copy
// under another identity's key (read for that identity), the value read
// with another identity's lock key, or with a lock key that is empty,
// only the prefix, the tag alone, under another prefix or version, or
// with a byte added (each read with the scope that lock key derives, as
// every request's is), answers nothing. Read with its own scope but one
// of those lock keys (a request no preparation gives) it is never an
// answer either: refused, or rebuilt with that lock key's tag into a
// record that does not decode strictly. Read for another identity with
// the right lock key and scope the check passes, and it is strict
// decoding that refuses the rebuilt record (its tuple does not hash to
// its lock key): asserted as such.
func TestExpandEvidenceForV6OtherLockKey(t *testing.T) {
	other := contractIdentity()
	other.TargetID = "target_other"
	otherKey := independentKey(t, other)
	for op, e := range v6Whole() {
		raw, ok := WholeEvidence(e, e.Lease.Identity(), v6Scope(e))
		if !ok {
			t.Fatalf("setup: %s", op)
		}
		v, id, lk := string(raw), e.Lease.Identity(), e.Lease.LockKey
		tag := v6Tag(t, lk)
		v6Refused(t, op+": under another identity's key", v, v6At(e, other, otherKey))
		v6Refused(t, op+": another identity's lock key", v, v6At(e, id, otherKey))
		v6NeverAnswers(t, op+": another identity's lock key, its own scope", v, Prepared{Op: e.Op, Identity: id, LockKey: otherKey, Scope: v6Scope(e)})
		for name, k := range map[string]string{
			"empty":                    "",
			"the prefix alone":         v6KeyPrefix,
			"the tag alone":            tag,
			"another prefix":           "starintel:other-lease:v1:" + tag,
			"prefix version 2":         "starintel:target-lease:v2:" + tag,
			"prefix upper-case":        strings.ToUpper(v6KeyPrefix) + tag,
			"a trailing space":         lk + " ",
			"a leading space":          " " + lk,
			"the tag's last byte gone": lk[:len(lk)-1],
			"the tag doubled":          lk + tag,
		} {
			v6Refused(t, op+": lock key "+name, v, v6At(e, id, k))
			v6NeverAnswers(t, op+": lock key "+name+", its own scope", v, Prepared{Op: e.Op, Identity: id, LockKey: k, Scope: v6Scope(e)})
		}
		// The right lock key and scope, another identity's tuple: the
		// check passes; the rebuilt record's tuple does not hash to its
		// lock key.
		got, ok := ExpandEvidenceFor(v, Prepared{Op: e.Op, Identity: other, LockKey: lk, Scope: v6Scope(e)})
		if !ok {
			t.Fatalf("%s: read for another tuple under its own lock key: refused before strict decoding", op)
		}
		if _, err := DecodeIdempotencyRecord([]byte(got)); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: read for another tuple decoded: %v", op, err)
		}
		// Rewritten for the other identity's scope (a forger's copy): it
		// is the other's evidence, and no longer reads under this lock key.
		forged := v6Recheck(v, v6At(e, other, otherKey).Scope)
		v6Refused(t, op+": checked for another identity, read here", forged, v6For(e))
	}
}

// v6NeverAnswers checks raw read for p is no answer: refused, or rebuilt
// into bytes that do not decode strictly (the store answers corrupt).
func v6NeverAnswers(t *testing.T, what, raw string, p Prepared) {
	t.Helper()
	got, ok := ExpandEvidenceFor(raw, p)
	if !ok {
		return
	}
	if _, err := DecodeIdempotencyRecord([]byte(got)); err == nil {
		t.Errorf("%s: %q decoded as evidence: %s", what, raw, got)
	}
}

// Everything that is not version 6 reads exactly as ExpandEvidence reads
// it, whatever lock key and scope are given (they are version 6's alone): versions 1 to
// 5, values that look like version 6 but are not ("ev6" without its
// newline, in CRLF, upper-case, after a space), and garbage. Version 6
// is no version before it: an older reader (ExpandEvidence) passes it
// through as version 1, which never decodes, and the by-reference readers
// refuse it.
func TestExpandEvidenceForV6OtherVersions(t *testing.T) {
	e := acquisitionEvidence()
	id, lk := e.Lease.Identity(), e.Lease.LockKey
	v1, _ := e.Encode()
	v2 := v6V2(t, e)
	v3, ok3 := ReferringEvidence(e)
	v4, ok4 := LeanEvidence(e)
	v5, ok5 := LeanIDEvidence(e, "hv4 entry")
	v6, ok6 := WholeEvidence(e, id, v6Scope(e))
	if !ok3 || !ok4 || !ok5 || !ok6 {
		t.Fatal("setup: a version is missing")
	}
	for name, raw := range map[string]string{
		"v1": string(v1), "v2": v2, "v3": string(v3), "v4": string(v4), "v5": string(v5),
		"v2 damaged":              strings.Replace(v2, "\n42\n", "\n042\n", 1),
		"empty":                   "",
		"ev6 alone":               "ev6",
		"ev6 in CRLF":             strings.ReplaceAll(string(v6), "\n", "\r\n"),
		"EV6":                     "EV6" + string(v6[3:]),
		"a space before":          " " + string(v6),
		"v6 lines as version 2":   "ev2" + string(v6[3:]),
		"garbage":                 "\x00\xff{",
		"json of another version": strings.Replace(string(v1), `"idempotency_version":1`, `"idempotency_version":6`, 1),
	} {
		want, wantOK := ExpandEvidence(raw, id)
		for _, k := range []string{lk, "", "x", v6KeyPrefix} {
			for _, scope := range []string{v6Scope(e), "", "x"} {
				if got, ok := ExpandEvidenceFor(raw, Prepared{Op: e.Op, Identity: id, LockKey: k, Scope: scope}); got != want || ok != wantOK {
					t.Errorf("%s under lock key %q, scope %q: %v %q, ExpandEvidence %v %q", name, k, scope, ok, got, wantOK, want)
				}
			}
		}
	}
	// An older reader of version 6.
	if got, ok := ExpandEvidence(string(v6), id); !ok || got != string(v6) {
		t.Fatalf("ExpandEvidence of version 6: %v %q, want it passed through", ok, got)
	}
	if _, err := DecodeIdempotencyRecord(v6); CodeOf(err) != CodeCorrupt {
		t.Fatalf("version 6 decoded as version 1: %v", err)
	}
	if _, ok := ReferredLeaseID(string(v6)); ok {
		t.Error("version 6 read as version 3")
	}
	if _, _, ok := LeanEvidenceToken(string(v6)); ok {
		t.Error("version 6 read as version 4")
	}
	if _, _, ok := LeanIDLeaseID(string(v6)); ok {
		t.Error("version 6 read as version 5")
	}
	// And the renewed lease's record does not rebuild it as version 5.
	if _, ok := ExpandLeanIDEvidence(string(v6), "hv4 entry", Renewed(e.Lease, time.Minute, e.Lease.AcquiredAt.Add(time.Second)), e.BackendTime); ok {
		t.Error("version 6 rebuilt as version 5")
	}
}
