package lease

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Review: attack on evidence version 6 (evidence_v6.go), the whole and
// checked evidence of Valkey's stored format 8: WholeEvidence (the Go
// writer) and ExpandEvidenceFor (the reader). The contract: a replay
// answers exactly the first answer or fails closed as corrupt, never a
// wrong result.

// ev6AttackIdentity is an identity whose components are all at the
// identifier limit (256 bytes), with its lock key computed apart from the
// code under test.
func ev6AttackIdentity(t *testing.T) (Identity, string) {
	t.Helper()
	long := func(p string) string { return p + strings.Repeat("x", MaxIdentifierBytes-len(p)) }
	id := Identity{TenantID: long("t"), ProgramID: long("p"), TargetNamespace: long("n"), TargetID: long("g"),
		ActorName: long("a"), WorkflowName: long("w"), OperationClass: "default"}
	classes, err := NewOperationClasses("default")
	if err != nil {
		t.Fatal(err)
	}
	canon, key, err := CanonicalLockKey(id, classes)
	if err != nil {
		t.Fatalf("the long identity is not canonical: %v", err)
	}
	if key != independentKey(t, canon) {
		t.Fatalf("lock key %s, want %s", key, independentKey(t, canon))
	}
	return canon, key
}

// ev6AttackEvidence is evidence of every shape version 6 is written for:
// an acquisition, a renewal, a release, a revocation and a force-release,
// on the contract's identity and on one whose components are all 256
// bytes, with ids at 256 bytes, the largest token, metadata of non-ASCII
// text and text that spells newlines, "ev6" and line-like content once
// JSON-escaped, and metadata at its byte limit.
func ev6AttackEvidence(t *testing.T) []*IdempotencyRecord {
	t.Helper()
	longID, longKey := ev6AttackIdentity(t)
	var out []*IdempotencyRecord
	add := func(e *IdempotencyRecord, edit func(r *Record)) {
		e = &IdempotencyRecord{Version: e.Version, Op: e.Op, Digest: e.Digest, Code: e.Code, Lease: e.Lease.Clone(), BackendTime: e.BackendTime}
		edit(e.Lease)
		out = append(out, e)
	}
	max := func(p string) string { return p + strings.Repeat("9", MaxIdentifierBytes-len(p)) }
	big := Metadata{}
	for i := 0; i < 20; i++ {
		big["k"+strconv.Itoa(i)] = strings.Repeat("é", 80)
	}
	edits := map[string]func(r *Record){
		"plain": func(r *Record) {},
		"long ids": func(r *Record) {
			r.OwnerPrincipalID, r.OwnerClientID, r.OwnerCredentialID = max("prn_"), max("client_"), max("key_")
			r.ServiceInstanceID, r.ExecutionID, r.JobID = max("instance_"), max("execution_"), max("job_")
			r.TraceID, r.RequestID = max("trace_"), max("req_")
		},
		"long identity": func(r *Record) { r.LockKey = longKey; r.SetIdentity(longID) },
		"largest token": func(r *Record) { r.FencingToken = MaxFencingToken },
		"line-like metadata": func(r *Record) {
			r.Metadata = Metadata{"a": "x\nev6\n0123456789abcdef\nrelease", "b": "\r\n\t\u2028\u2029\x00", "c": `"}` + "\n{",
				"d": "ünïcödé 漢字 🙂", "e": float64(-1.5e-7), "f": nil, "g": true}
		},
		"big metadata": func(r *Record) { r.Metadata = big },
	}
	acq := acquisitionEvidence()
	renew := acquisitionEvidence()
	renew.Op, renew.Code, renew.Digest = OpRenew, CodeRenewed, strings.Repeat("0f", 32)
	renew.Lease.RenewedAt = renew.Lease.AcquiredAt.Add(20 * time.Second)
	renew.Lease.ExpiresAt = renew.Lease.RenewedAt.Add(45 * time.Second)
	renew.Lease.TTLMs = 45000
	renew.BackendTime = renew.Lease.RenewedAt
	rel := releaseEvidence()
	revoke := releaseEvidence()
	revoke.Op, revoke.Code, revoke.Digest = OpRevoke, CodeRevoked, strings.Repeat("9a", 32)
	revoke.Lease.State = StateRevoked
	force := releaseEvidence()
	force.Op, force.Code, force.Digest = OpForceRelease, CodeForceReleased, strings.Repeat("e1", 32)
	for _, e := range []*IdempotencyRecord{acq, renew, rel, revoke, force} {
		for _, name := range []string{"plain", "long ids", "long identity", "largest token", "line-like metadata", "big metadata"} {
			add(e, edits[name])
		}
	}
	return out
}

// ev6Independent is e's version 6 bytes stored under scope (the
// idempotency scope its key is named by) as the format's comment spells
// them, computed apart from the code under test from version 2's lines:
// ev6, the first 16 hex of SHA-1(scope "\n" rest), then rest: version 2's
// lines from the operation on without the tag, the digest in base64url.
func ev6Independent(t *testing.T, v2, scope string) string {
	t.Helper()
	l := strings.SplitN(v2, "\n", Ev2Lines)
	if len(l) != Ev2Lines || l[0] != "ev2" {
		t.Fatalf("not version 2: %.20q", v2)
	}
	d, err := hex.DecodeString(l[Ev2Digest])
	if err != nil || len(d) != 32 {
		t.Fatalf("digest %q", l[Ev2Digest])
	}
	rest := strings.Join(append([]string{l[Ev2Op], base64.RawURLEncoding.EncodeToString(d), l[Ev2Code], l[Ev2Backend]},
		l[Ev2LeaseID:]...), "\n")
	sum := sha1.Sum([]byte(scope + "\n" + rest))
	return "ev6\n" + hex.EncodeToString(sum[:])[:16] + "\n" + rest
}

// Held: for every shape (long ids and identity components at 256 bytes,
// the largest token, metadata spelling newlines and "ev6" once escaped,
// non-ASCII, at its size limit, every operation) WholeEvidence writes
// exactly the bytes the format's comment describes (an encoder written
// here from that comment, apart from the code), and ExpandEvidenceFor
// reads them back, for their own request (lock key and scope), into
// exactly the first answer's version 1 bytes, which decode strictly;
// under another identity's lock key, a key of another prefix or a bare
// tag (each with the scope it derives), or for another request of the
// identity (another request id, principal or operation), it refuses.
func TestAttackEV6IndependentEncoding(t *testing.T) {
	other := independentKey(t, Identity{TenantID: "tenant-other", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target_01", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"})
	for i, e := range ev6AttackEvidence(t) {
		id := e.Lease.Identity()
		want, err := e.Encode()
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		v2, err := CompactEvidence(e, id)
		if err != nil || !strings.HasPrefix(string(v2), EvidenceV2Prefix) {
			t.Fatalf("%d %s: no version 2 (%v): %.30q", i, e.Op, err, v2)
		}
		scope := v6Scope(e)
		raw, ok := WholeEvidence(e, id, scope)
		if !ok || string(raw) != ev6Independent(t, string(v2), scope) {
			t.Fatalf("%d %s: WholeEvidence %v\n %q\nwant\n %q", i, e.Op, ok, raw, ev6Independent(t, string(v2), scope))
		}
		got, ok := ExpandEvidenceFor(string(raw), v6For(e))
		if !ok || got != string(want) {
			t.Fatalf("%d %s: read back %v\n%s\nwant\n%s", i, e.Op, ok, got, want)
		}
		back, err := DecodeIdempotencyRecord([]byte(got))
		if err != nil || back.Lease.LockKey != e.Lease.LockKey || back.Op != e.Op || back.Digest != e.Digest {
			t.Fatalf("%d %s: strict decoding %+v %v", i, e.Op, back, err)
		}
		for _, key := range []string{other, "other-prefix:" + strings.TrimPrefix(e.Lease.LockKey, KeyPrefix),
			strings.TrimPrefix(e.Lease.LockKey, KeyPrefix), KeyPrefix, ""} {
			if got, ok := ExpandEvidenceFor(string(raw), v6At(e, id, key)); ok {
				t.Fatalf("%d %s: read under lock key %q: %s", i, e.Op, key, got)
			}
		}
		lk, prn, rid := e.Lease.LockKey, e.Lease.OwnerPrincipalID, e.Lease.RequestID
		otherOp := map[bool]Op{true: OpRelease, false: OpAcquire}[e.Op == OpAcquire]
		for what, sc := range map[string]string{
			"another request id": IdempotencyScope(e.Op, lk, prn, rid+"x"),
			"another principal":  IdempotencyScope(e.Op, lk, "prn_other", rid),
			"another operation":  IdempotencyScope(otherOp, lk, prn, rid),
		} {
			if got, ok := ExpandEvidenceFor(string(raw), Prepared{Op: e.Op, Identity: id, LockKey: lk, Scope: sc}); ok {
				t.Fatalf("%d %s: read for %s: %s", i, e.Op, what, got)
			}
		}
		if len(raw) >= len(v2) {
			t.Fatalf("%d %s: version 6 is %d bytes, version 2 %d", i, e.Op, len(raw), len(v2))
		}
	}
}

// ev6Outcome is what reading raw for e's request (stored under
// v6Scope(e)) answers: "refused", or
// the version 1 bytes it rebuilds when they decode strictly ("refused"
// too when they do not: the store answers that corrupt).
func ev6Outcome(raw string, e *IdempotencyRecord) string {
	got, ok := ExpandEvidenceFor(raw, v6For(e))
	if !ok {
		return "refused"
	}
	if _, err := DecodeIdempotencyRecord([]byte(got)); err != nil {
		return "refused"
	}
	return got
}

// Held: every single-byte change of a version 6 value (each byte flipped
// in its lowest bit and in its case bit, replaced by a newline, a
// carriage return or a NUL, deleted, or doubled; and a byte inserted
// before it) is either refused (the store answers corrupt) or, where the
// change leaves the same answer, reads as exactly the first answer:
// never another result. Nothing panics.
func TestAttackEV6EveryByteDamage(t *testing.T) {
	for i, e := range ev6AttackEvidence(t) {
		if i%6 != 0 && i%6 != 4 { // plain and line-like metadata of each operation
			continue
		}
		raw, ok := WholeEvidence(e, e.Lease.Identity(), v6Scope(e))
		if !ok {
			t.Fatal("no version 6")
		}
		want, _ := e.Encode()
		s := string(raw)
		if got := ev6Outcome(s, e); got != string(want) {
			t.Fatalf("%s: the intact value read as %s", e.Op, got)
		}
		for p := 0; p < len(s); p++ {
			for _, bad := range []string{
				s[:p] + string(s[p]^0x01) + s[p+1:],
				s[:p] + string(s[p]^0x20) + s[p+1:],
				s[:p] + "\n" + s[p+1:],
				s[:p] + "\r" + s[p+1:],
				s[:p] + "\x00" + s[p+1:],
				s[:p] + s[p+1:],
				s[:p] + s[p:p+1] + s[p:],
				s[:p] + "\n" + s[p:],
				s[:p] + "0" + s[p:],
			} {
				if bad == s {
					continue
				}
				if got := ev6Outcome(bad, e); got != "refused" && got != string(want) {
					t.Fatalf("%s: damage at byte %d (%q) read as\n%s\nwant refused or\n%s", e.Op, p, bad[max(0, p-8):min(len(bad), p+8)], got, want)
				}
			}
		}
	}
}

// Held: values spliced from two genuine version 6 values of one identity
// (the first k lines of one, the rest of the other; and each value's
// check on the other's lines), read for the first's request, are refused
// unless they are the first: the check covers every line after it, and
// the scope of the request that reads it (so the second, stored under
// its own operation's key, is refused for the first's request too).
func TestAttackEV6SplicedValues(t *testing.T) {
	all := ev6AttackEvidence(t)
	pairs := [][2]*IdempotencyRecord{{all[0], all[6]}, {all[6], all[12]}, {all[12], all[18]}, {all[0], all[12]}, {all[18], all[24]}}
	for _, pr := range pairs {
		a, _ := WholeEvidence(pr[0], pr[0].Lease.Identity(), v6Scope(pr[0]))
		b, _ := WholeEvidence(pr[1], pr[1].Lease.Identity(), v6Scope(pr[1]))
		la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
		wa, _ := pr[0].Encode()
		for k := 1; k < min(len(la), len(lb)); k++ {
			for _, v := range []string{strings.Join(append(append([]string(nil), la[:k]...), lb[k:]...), "\n"),
				strings.Join(append(append([]string(nil), lb[:k]...), la[k:]...), "\n")} {
				got := ev6Outcome(v, pr[0])
				if got != "refused" && got != string(wa) {
					t.Fatalf("splice at line %d read as\n%s", k, got)
				}
				if v != string(a) && got != "refused" {
					t.Fatalf("a splice at line %d that is not the first value was read: %q", k, v)
				}
			}
		}
		if got := ev6Outcome(string(b), pr[0]); got != "refused" {
			t.Fatalf("%s evidence read for the %s request: %s", pr[1].Op, pr[0].Op, got)
		}
	}
}

// Held: the digest line must be the one canonical base64url spelling of
// 32 bytes and the check 16 lower-case hex digits. A digest with stray
// low bits in its last character, padded, in standard base64, or the
// check in upper case, each with a check recomputed over its own lines
// (so that only the reader's canonical rules can refuse it), is refused:
// no two accepted values spell one answer.
func TestAttackEV6OneSpellingPerAnswer(t *testing.T) {
	e := acquisitionEvidence()
	e.Digest = "fb" + strings.Repeat("ff", 30) + "f1" // base64url of it holds '_' and stray bits to set
	scope := v6Scope(e)
	raw, ok := WholeEvidence(e, e.Lease.Identity(), scope)
	if !ok {
		t.Fatal("no version 6")
	}
	l := strings.SplitN(string(raw), "\n", 7)
	rechecked := func(l []string) string {
		rest := strings.Join(l[2:], "\n")
		sum := sha1.Sum([]byte(scope + "\n" + rest))
		return "ev6\n" + hex.EncodeToString(sum[:])[:16] + "\n" + rest
	}
	if rechecked(l) != string(raw) {
		t.Fatalf("the check is not SHA-1 of the scope and the lines: %q", raw)
	}
	d := l[3]
	last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", d[42])
	stray := string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last|1])
	for name, digest := range map[string]string{
		"stray bits": d[:42] + stray,
		"padded":     d + "=",
		"standard":   strings.NewReplacer("-", "+", "_", "/").Replace(d),
		"hex":        e.Digest,
		"upper hex":  strings.ToUpper(e.Digest),
	} {
		if digest == d {
			t.Fatalf("%s: the same spelling", name)
		}
		m := append([]string(nil), l...)
		m[3] = digest
		if got := ev6Outcome(rechecked(m), e); got != "refused" {
			t.Fatalf("digest spelled %s read as %s", name, got)
		}
	}
	upper := "ev6\n" + strings.ToUpper(l[1]) + "\n" + strings.Join(l[2:], "\n")
	if upper != string(raw) {
		if got := ev6Outcome(upper, e); got != "refused" {
			t.Fatalf("an upper-case check read as %s", got)
		}
	}
}

// Held: random values headed "ev6\n" (random lines of random bytes, and
// genuine values cut at every length) never panic the reader, and none
// reads as an answer.
func TestAttackEV6GarbageNeverPanics(t *testing.T) {
	e := acquisitionEvidence()
	raw, _ := WholeEvidence(e, e.Lease.Identity(), v6Scope(e))
	want, _ := e.Encode()
	for n := 0; n < len(raw); n++ {
		if got := ev6Outcome(string(raw[:n]), e); got != "refused" {
			t.Fatalf("cut at %d read as %s", n, got)
		}
	}
	rng := rand.New(rand.NewSource(6))
	alphabet := "\n\n\nev6abcdef0123456789_-{}\":,\x00\r"
	for i := 0; i < 20000; i++ {
		b := []byte("ev6\n")
		for j := rng.Intn(200); j > 0; j-- {
			b = append(b, alphabet[rng.Intn(len(alphabet))])
		}
		if got := ev6Outcome(string(b), e); got != "refused" && got != string(want) {
			t.Fatalf("garbage %q read as %s", b, got)
		}
	}
}
