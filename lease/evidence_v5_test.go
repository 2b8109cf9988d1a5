package lease

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// Tests of evidence version 5 ("ev5", lean by lease id; Valkey from stored
// format 7): LeanIDEvidence, LeanIDLeaseID and ExpandLeanIDEvidence.

// b64Alphabet is base64url's alphabet: a character's index is its value.
const b64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// ev5AcqBody and ev5RelBody are the exact version 5 lines, before the
// check, of acquisitionEvidence and releaseEvidence: "ab"×32 and "cd"×32
// in base64url, lease_01, token 42 and (an acquisition's) the 30 s it
// granted. ev5Acq and ev5Rel are the whole values, checked against
// ev5Entry, the history entry of their lease.
var (
	ev5AcqDigest = strings.Repeat("q6ur", 10) + "q6s"
	ev5RelDigest = strings.Repeat("zc3N", 10) + "zc0"
	ev5AcqBody   = "ev5\na\n" + ev5AcqDigest + "\nlease_01\n42\n30000"
	ev5RelBody   = "ev5\nr\n" + ev5RelDigest + "\nlease_01\n42"
)

// ev5Check is version 5's check of body referring to entry, computed here
// as the format says, apart from the code under test: the first 16
// lower-case hex digits of the SHA-1 of entry, a newline and body.
func ev5Check(entry, body string) string {
	sum := sha1.Sum([]byte(entry + "\n" + body))
	return hex.EncodeToString(sum[:])[:16]
}

// ev5Checked is body with its check referring to entry: the whole value.
func ev5Checked(entry, body string) string { return body + "\n" + ev5Check(entry, body) }

// ev5EntryOf is the history entry of rec's lease as Valkey stores it in
// format 7 (history version 4: the acquisition's evidence scope, a
// released record's release scope, then version 2's lines without the
// tag), ended at endedAt by its owner (request req_rel). A record that
// has not ended (an acquisition's as granted) is entered as revoked at
// endedAt: an entry's record has always ended. The entry decodes back
// into rec's lease and endedAt, so it is one a reader takes.
func ev5EntryOf(t testing.TB, rec *Record, endedAt Timestamp) string {
	t.Helper()
	r := rec.Clone()
	if !r.State.Terminal() {
		r.State = StateRevoked
	}
	h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: r, EndedAt: endedAt, EndedBy: r.OwnerPrincipalID, RequestID: "req_rel"}
	v2, err := CompactHistory(h)
	if err != nil || !strings.HasPrefix(string(v2), HistoryV2Prefix) {
		t.Fatalf("setup: history entry of %+v: %.20q %v", r, v2, err)
	}
	lines := strings.SplitN(strings.TrimPrefix(string(v2), HistoryV2Prefix), "\n", 7)
	rel := ""
	if r.State == StateReleased {
		rel = h.EvidenceScope(OpRelease)
	}
	entry := HistoryScopedPrefix + h.EvidenceScope(OpAcquire) + "\n" + rel + "\n" + strings.Join(append(lines[:5:5], lines[6]), "\n")
	got, err := DecodeScopedHistory([]byte(entry), r.LockKey)
	if err != nil || got.Record.LeaseID != r.LeaseID || got.Record.FencingToken != r.FencingToken ||
		got.EndedAt.UnixMilli() != endedAt.UnixMilli() || got.Record.State != r.State {
		t.Fatalf("setup: the entry %q does not decode as written: %+v %v", entry, got, err)
	}
	return entry
}

// ev5Entry is the entry ev5Acq and ev5Rel refer to: releaseEvidence's
// lease's (acquisitionEvidence's lease but for its metadata), released at
// the release's backend time.
func ev5Entry(t testing.TB) string {
	t.Helper()
	r := releaseEvidence()
	return ev5EntryOf(t, r.Lease, r.BackendTime)
}

// ev5Acq and ev5Rel are the whole version 5 values of acquisitionEvidence
// and releaseEvidence, referring to ev5Entry.
func ev5Acq(t testing.TB) string { t.Helper(); return ev5Checked(ev5Entry(t), ev5AcqBody) }
func ev5Rel(t testing.TB) string { t.Helper(); return ev5Checked(ev5Entry(t), ev5RelBody) }

// mustV5Decode checks got, a rebuild, decodes strictly into evidence
// that encodes back to exactly want, the original's version 1 bytes, and
// holds the original's facts.
func mustV5Decode(t *testing.T, what, got string, want []byte, orig *IdempotencyRecord) {
	t.Helper()
	if got != string(want) {
		t.Fatalf("%s: rebuilt\n%s\nwant\n%s", what, got, want)
	}
	dec, err := DecodeIdempotencyRecord([]byte(got))
	if err != nil {
		t.Fatalf("%s: the rebuild does not decode strictly: %v", what, err)
	}
	again, err := dec.Encode()
	if err != nil || !bytes.Equal(again, want) {
		t.Fatalf("%s: decoded and encoded again: %s %v", what, again, err)
	}
	if dec.Op != orig.Op || dec.Digest != orig.Digest || dec.Code != orig.Code ||
		dec.BackendTime.UnixMilli() != orig.BackendTime.UnixMilli() || dec.Lease.LeaseID != orig.Lease.LeaseID ||
		dec.Lease.FencingToken != orig.Lease.FencingToken || dec.Lease.State != orig.Lease.State ||
		dec.Lease.TTLMs != orig.Lease.TTLMs || dec.Lease.ExpiresAt.UnixMilli() != orig.Lease.ExpiresAt.UnixMilli() ||
		dec.Lease.RenewedAt.UnixMilli() != orig.Lease.RenewedAt.UnixMilli() {
		t.Fatalf("%s: decoded %+v\nwant %+v", what, dec, orig)
	}
}

// An acquisition's version 5 evidence is the five lines it promises and
// its check, and rebuilds exactly the version 1 bytes of the original
// from any later record of the lease with the entry it refers to: as
// granted, renewed (with another TTL), or renewed and then ended in any
// state; the rebuild undoes the renewal. The check refers to the entry
// the evidence was written with: another entry's bytes rebuild nothing.
func TestLeanIDEvidenceV5AcquireRoundTrip(t *testing.T) {
	e := acquisitionEvidence()
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	entry := ev5Entry(t)
	raw, ok := LeanIDEvidence(e, entry)
	if !ok || string(raw) != ev5Acq(t) {
		t.Fatalf("LeanIDEvidence: %q, %v; want %q", raw, ok, ev5Acq(t))
	}
	if !strings.HasPrefix(string(raw), EvidenceLeanIDPrefix) || EvidenceLeanIDPrefix != "ev5\n" {
		t.Fatalf("prefix %q", EvidenceLeanIDPrefix)
	}
	if op, id, ok := LeanIDLeaseID(string(raw)); !ok || op != OpAcquire || id != "lease_01" {
		t.Fatalf("LeanIDLeaseID: %q %q %v", op, id, ok)
	}
	renewed := Renewed(e.Lease, 90*time.Second, e.Lease.AcquiredAt.Add(20*time.Second))
	twice := Renewed(renewed, 5*time.Second, e.Lease.AcquiredAt.Add(70*time.Second))
	capped := Renewed(renewed, 10*time.Minute, e.Lease.AcquiredAt.Add(80*time.Second)) // at the maximum lifetime
	if capped.ExpiresAt.UnixMilli() != e.Lease.AcquiredAt.UnixMilli()+e.Lease.MaximumLifetimeMs {
		t.Fatalf("setup: the renewal is not capped: %v", capped.ExpiresAt)
	}
	later := map[string]*Record{"as granted": e.Lease, "renewed": renewed, "renewed twice": twice, "renewed to the cap": capped}
	for _, base := range []*Record{renewed, twice, capped} {
		for _, st := range []State{StateReleased, StateExpired, StateRevoked} {
			ended := base.Clone()
			ended.State = st
			later["renewed at "+ended.RenewedAt.String()+", then "+string(st)] = ended
		}
	}
	for name, rec := range later {
		if rec.ExpiresAt.UnixMilli() == e.Lease.ExpiresAt.UnixMilli() && name != "as granted" {
			t.Fatalf("setup: %s did not change the expiry", name)
		}
		// The end time is not the acquisition's fact: any is the same.
		for _, endedAt := range []Timestamp{rec.RenewedAt, rec.RenewedAt.Add(time.Hour)} {
			// The evidence as written with this lease's entry: its lines
			// are the acquisition's, its check the entry's.
			recEntry := ev5EntryOf(t, rec, endedAt)
			raw, ok := LeanIDEvidence(e, recEntry)
			if !ok || string(raw) != ev5Checked(recEntry, ev5AcqBody) {
				t.Fatalf("%s: LeanIDEvidence %q %v, want %q", name, raw, ok, ev5Checked(recEntry, ev5AcqBody))
			}
			got, ok := ExpandLeanIDEvidence(string(raw), recEntry, rec, endedAt)
			if !ok {
				t.Fatalf("%s: not rebuilt", name)
			}
			mustV5Decode(t, name, got, want, e)
			// With any other entry's bytes, the check refuses it.
			if recEntry != entry {
				if got, ok := ExpandLeanIDEvidence(string(raw), entry, rec, endedAt); ok {
					t.Fatalf("%s: rebuilt with another entry's bytes: %s", name, got)
				}
			}
		}
	}
	// The record it is rebuilt from is left as it was.
	if renewed.State != StateActive || renewed.TTLMs != 90000 {
		t.Fatalf("the rebuild changed its record: %+v", renewed)
	}
}

// A release's version 5 evidence rebuilds exactly from the record its
// release left (its history entry's, renewed before it ended) and the
// entry's end, which is the answer's backend time, with the entry's
// bytes its check refers to.
func TestLeanIDEvidenceV5ReleaseRoundTrip(t *testing.T) {
	r := releaseEvidence()
	if r.Lease.RenewedAt.UnixMilli() == r.Lease.AcquiredAt.UnixMilli() {
		t.Fatal("setup: the released record was never renewed")
	}
	want, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	entry := ev5Entry(t)
	raw, ok := LeanIDEvidence(r, entry)
	if !ok || string(raw) != ev5Rel(t) {
		t.Fatalf("LeanIDEvidence of a release: %q, %v; want %q", raw, ok, ev5Rel(t))
	}
	if op, id, ok := LeanIDLeaseID(string(raw)); !ok || op != OpRelease || id != "lease_01" {
		t.Fatalf("LeanIDLeaseID: %q %q %v", op, id, ok)
	}
	got, ok := ExpandLeanIDEvidence(string(raw), entry, r.Lease.Clone(), r.BackendTime)
	if !ok {
		t.Fatal("release not rebuilt")
	}
	mustV5Decode(t, "release", got, want, r)

	// A release any time after its renewal, and of a record renewed to
	// its cap, round-trips too.
	capped := Renewed(validRecord(), 10*time.Minute, UnixMilli(msAcquired+60_000))
	capped.State = StateReleased
	for _, rel := range []*IdempotencyRecord{
		{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("0f", 32), Code: CodeReleased, Lease: r.Lease, BackendTime: r.Lease.RenewedAt},
		{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("ff", 32), Code: CodeReleased, Lease: capped, BackendTime: capped.ExpiresAt.Add(-time.Millisecond)},
	} {
		want, err := rel.Encode()
		if err != nil {
			t.Fatal(err)
		}
		relEntry := ev5EntryOf(t, rel.Lease, rel.BackendTime)
		raw, ok := LeanIDEvidence(rel, relEntry)
		if !ok {
			t.Fatalf("release at %v not in version 5", rel.BackendTime)
		}
		got, ok := ExpandLeanIDEvidence(string(raw), relEntry, rel.Lease.Clone(), rel.BackendTime)
		if !ok {
			t.Fatalf("release at %v not rebuilt", rel.BackendTime)
		}
		mustV5Decode(t, "release at "+rel.BackendTime.String(), got, want, rel)
		if got, ok := ExpandLeanIDEvidence(string(raw), entry, rel.Lease.Clone(), rel.BackendTime); ok {
			t.Fatalf("release at %v rebuilt with another entry's bytes: %s", rel.BackendTime, got)
		}
	}

	// The entry's end is the answer's backend time: another end is another
	// answer, never this one's bytes; and an entry that records another
	// end is other bytes, which the check refuses.
	if got, ok := ExpandLeanIDEvidence(string(raw), entry, r.Lease.Clone(), r.BackendTime.Add(time.Millisecond)); ok && got == string(want) {
		t.Fatal("rebuilt the same answer from another end")
	}
	later := r.BackendTime.Add(time.Millisecond)
	if got, ok := ExpandLeanIDEvidence(string(raw), ev5EntryOf(t, r.Lease, later), r.Lease.Clone(), later); ok {
		t.Fatalf("rebuilt from an entry that ended 1 ms later: %s", got)
	}
}

// Every digest round-trips through its base64url line, the last
// character's two low bits zero (the one spelling a reader accepts).
func TestLeanIDEvidenceV5Digests(t *testing.T) {
	digests := []string{strings.Repeat("00", 32), strings.Repeat("ff", 32), strings.Repeat("0123456789abcdef", 4)}
	for i := 0; i < 32; i++ {
		sum := sha256.Sum256([]byte{byte(i)})
		digests = append(digests, hex.EncodeToString(sum[:]))
	}
	entry := ev5Entry(t)
	for _, d := range digests {
		e := acquisitionEvidence()
		e.Digest = d
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		raw, ok := LeanIDEvidence(e, entry)
		if !ok {
			t.Fatalf("digest %s: not in version 5", d)
		}
		line := strings.Split(string(raw), "\n")[2]
		if len(line) != 43 || strings.IndexByte(b64Alphabet, line[42])&3 != 0 || strings.Trim(line, b64Alphabet) != "" {
			t.Fatalf("digest %s spelled %q", d, line)
		}
		got, ok := ExpandLeanIDEvidence(string(raw), entry, e.Lease, e.BackendTime)
		if !ok {
			t.Fatalf("digest %s: not rebuilt", d)
		}
		mustV5Decode(t, "digest "+d, got, want, e)
	}
}

// Only evidence whose rebuild gives back exactly the original is stored
// in version 5: the writer refuses (ok false) anything else, which is
// then stored in another version.
func TestLeanIDEvidenceV5OnlyWhenItRebuildsExactly(t *testing.T) {
	entry := ev5Entry(t)
	for name, edit := range map[string]func(e *IdempotencyRecord){
		"a renewal":              func(e *IdempotencyRecord) { e.Op, e.Code = OpRenew, CodeRenewed },
		"a revocation":           func(e *IdempotencyRecord) { e.Op, e.Code = OpRevoke, CodeRevoked },
		"a force-release":        func(e *IdempotencyRecord) { e.Op, e.Code = OpForceRelease, CodeForceReleased },
		"an unknown op":          func(e *IdempotencyRecord) { e.Op = "steal" },
		"no op":                  func(e *IdempotencyRecord) { e.Op = "" },
		"a conflict code":        func(e *IdempotencyRecord) { e.Code = CodeConflict },
		"a renewal's code":       func(e *IdempotencyRecord) { e.Code = CodeRenewed },
		"another version":        func(e *IdempotencyRecord) { e.Version = 2 },
		"renewed since acquired": func(e *IdempotencyRecord) { e.Lease.RenewedAt = e.Lease.AcquiredAt.Add(time.Second) },
		"renewed, backend then": func(e *IdempotencyRecord) {
			e.Lease = Renewed(e.Lease, 0, e.Lease.AcquiredAt.Add(time.Second))
			e.BackendTime = e.Lease.RenewedAt
		},
		"backend time not acquired": func(e *IdempotencyRecord) { e.BackendTime = e.BackendTime.Add(time.Millisecond) },
		"backend time before":       func(e *IdempotencyRecord) { e.BackendTime = e.BackendTime.Add(-time.Millisecond) },
		"expiry not as granted":     func(e *IdempotencyRecord) { e.Lease.ExpiresAt = e.Lease.ExpiresAt.Add(time.Millisecond) },
		"ttl not the expiry's":      func(e *IdempotencyRecord) { e.Lease.TTLMs++ },
		"released":                  func(e *IdempotencyRecord) { e.Lease.State = StateReleased },
		"expired":                   func(e *IdempotencyRecord) { e.Lease.State = StateExpired },
		"digest upper-case hex":     func(e *IdempotencyRecord) { e.Digest = strings.Repeat("AB", 32) },
		"digest not hex":            func(e *IdempotencyRecord) { e.Digest = strings.Repeat("zz", 32) },
		"digest in base64url":       func(e *IdempotencyRecord) { e.Digest = ev5AcqDigest },
		"digest too short":          func(e *IdempotencyRecord) { e.Digest = strings.Repeat("ab", 31) },
		"digest too long":           func(e *IdempotencyRecord) { e.Digest = strings.Repeat("ab", 33) },
		"digest with a line break":  func(e *IdempotencyRecord) { e.Digest = strings.Repeat("ab", 31) + "a\n" },
		"no digest":                 func(e *IdempotencyRecord) { e.Digest = "" },
		"no record":                 func(e *IdempotencyRecord) { e.Lease = nil },
		"no lease id":               func(e *IdempotencyRecord) { e.Lease.LeaseID = "" },
		"a lease id with a newline": func(e *IdempotencyRecord) { e.Lease.LeaseID = "lease_01\n43" },
		"a lease id with a CR":      func(e *IdempotencyRecord) { e.Lease.LeaseID = "lease_01\r" },
		"a lease id with a quote":   func(e *IdempotencyRecord) { e.Lease.LeaseID = `lease_"01` },
		"a token of 17 digits":      func(e *IdempotencyRecord) { e.Lease.FencingToken = 1e16 },
		"a ttl of 17 digits":        func(e *IdempotencyRecord) { e.Lease.TTLMs = 1e16 },
		"a negative ttl":            func(e *IdempotencyRecord) { e.Lease.TTLMs = -1 },
		"a record that is invalid":  func(e *IdempotencyRecord) { e.Lease.LockKey = strings.Repeat("0", 64) },
		"a backend time before 1970": func(e *IdempotencyRecord) {
			e.BackendTime, e.Lease.AcquiredAt, e.Lease.RenewedAt = UnixMilli(-1), UnixMilli(-1), UnixMilli(-1)
		},
	} {
		e := acquisitionEvidence()
		edit(e)
		if raw, ok := LeanIDEvidence(e, entry); ok {
			t.Errorf("acquisition, %s: stored in version 5: %q", name, raw)
		}
	}
	for name, edit := range map[string]func(e *IdempotencyRecord){
		"revoked":               func(e *IdempotencyRecord) { e.Lease.State = StateRevoked },
		"expired":               func(e *IdempotencyRecord) { e.Lease.State = StateExpired },
		"active":                func(e *IdempotencyRecord) { e.Lease.State = StateActive },
		"a revocation":          func(e *IdempotencyRecord) { e.Op, e.Code, e.Lease.State = OpRevoke, CodeRevoked, StateRevoked },
		"a force-release":       func(e *IdempotencyRecord) { e.Op, e.Code = OpForceRelease, CodeForceReleased },
		"an acquisition's code": func(e *IdempotencyRecord) { e.Code = CodeAcquired },
		"a conflict code":       func(e *IdempotencyRecord) { e.Code = CodeConflict },
		"digest not hex":        func(e *IdempotencyRecord) { e.Digest = strings.Repeat("g", 64) },
		"no lease id":           func(e *IdempotencyRecord) { e.Lease.LeaseID = "" },
		"a token of 17 digits":  func(e *IdempotencyRecord) { e.Lease.FencingToken = 1e16 },
		"no record":             func(e *IdempotencyRecord) { e.Lease = nil },
	} {
		r := releaseEvidence()
		edit(r)
		if raw, ok := LeanIDEvidence(r, entry); ok {
			t.Errorf("release, %s: stored in version 5: %q", name, raw)
		}
	}
}

// ev5StrayBits are the digest line d re-spelled with each of the three
// other values of its last character's two low bits: the same 32 bytes
// to a lenient decoder, damage to a strict one.
func ev5StrayBits(d string) []string {
	v := strings.IndexByte(b64Alphabet, d[42]) &^ 3
	var out []string
	for p := 0; p < 4; p++ {
		if c := b64Alphabet[v+p]; c != d[42] {
			out = append(out, d[:42]+string(c))
		}
	}
	return out
}

// Version 5 is read strictly: every malformation of its lines fails
// (LeanIDLeaseID and ExpandLeanIDEvidence both), never a guess, whether
// the value carries no check line or a check that is right for those
// lines and the entry (so that it is the lines that are refused, not
// the check); and a well-formed value, rightly checked, rebuilds only
// from its own lease's record: the lease id and token it names, a
// release's record released.
func TestLeanIDEvidenceV5StrictDecode(t *testing.T) {
	entry := ev5Entry(t)
	a, r := ev5AcqBody, ev5RelBody
	acqRec, relEv := acquisitionEvidence().Lease, releaseEvidence()
	if raw, ok := LeanIDEvidence(acquisitionEvidence(), entry); !ok || string(raw) != ev5Checked(entry, a) {
		t.Fatalf("setup: %q", raw)
	}
	if raw, ok := LeanIDEvidence(relEv, entry); !ok || string(raw) != ev5Checked(entry, r) {
		t.Fatalf("setup: %q", raw)
	}
	d, rd := ev5AcqDigest, ev5RelDigest
	tail := "\nlease_01\n42\n30000" // an acquisition's lines after its digest
	// The lines before the check.
	malformed := map[string]string{
		// The version line.
		"no prefix":              strings.TrimPrefix(a, "ev5\n"),
		"version 4's prefix":     "ev4" + strings.TrimPrefix(a, "ev5"),
		"version 3's prefix":     "ev3" + strings.TrimPrefix(a, "ev5"),
		"upper-case prefix":      "EV5" + strings.TrimPrefix(a, "ev5"),
		"prefix without newline": "ev5a\n" + d + tail,
		"prefix with a space":    "ev5 \na\n" + d + tail,
		"leading space":          " " + a,
		"leading newline":        "\n" + a,
		"prefix alone":           "ev5\n",
		"empty":                  "",
		"version 1 JSON":         `{"idempotency_version":1}`,
		// The operation line.
		"op x":                        "ev5\nx\n" + d + tail,
		"op upper-case A":             "ev5\nA\n" + d + tail,
		"op upper-case R":             "ev5\nR\n" + rd + "\nlease_01\n42",
		"op spelled out":              "ev5\nacquire\n" + d + tail,
		"release spelled out":         "ev5\nrelease\n" + rd + "\nlease_01\n42",
		"op empty":                    "ev5\n\n" + d + tail,
		"op of two letters":           "ev5\naa\n" + d + tail,
		"op with a space":             "ev5\na \n" + d + tail,
		"op with a CR":                "ev5\na\r\n" + d + tail,
		"renewal letter":              "ev5\nn\n" + d + tail,
		"release op, acquire's lines": "ev5\nr\n" + d + tail,
		"acquire op, release's lines": "ev5\na\n" + rd + "\nlease_01\n42",
		// The digest line.
		"digest 42 chars":           "ev5\na\n" + d[:42] + tail,
		"digest 44 chars":           "ev5\na\n" + d + "A" + tail,
		"digest in hex":             "ev5\na\n" + strings.Repeat("ab", 32) + tail,
		"digest padded":             "ev5\na\n" + d + "=" + tail,
		"digest padded in place":    "ev5\na\n" + d[:42] + "=" + tail,
		"digest in standard base64": "ev5\na\n" + strings.Repeat("q6ur", 9) + "q+ur" + d[40:] + tail,
		"digest with a slash":       "ev5\na\n" + "/" + d[1:] + tail,
		"digest with a space":       "ev5\na\n" + d[:20] + " " + d[21:] + tail,
		"digest with a CR":          "ev5\na\n" + d + "\r" + tail,
		"digest empty":              "ev5\na\n" + tail,
		"no digest line":            "ev5\na" + tail,
		// The lease id line (well-formed ids of another lease are below).
		"lease id empty":          "ev5\na\n" + d + "\n\n42\n30000",
		"lease id with a CR":      "ev5\na\n" + d + "\nlease_01\r\n42\n30000",
		"lease id with a tab":     "ev5\na\n" + d + "\nlease_01\t\n42\n30000",
		"lease id with a quote":   "ev5\na\n" + d + "\nlease_\"01\n42\n30000",
		"lease id, backslash":     "ev5\na\n" + d + "\nlease_\\01\n42\n30000",
		"no lease id line":        "ev5\na\n" + d + "\n42\n30000",
		"release, no lease id":    "ev5\nr\n" + rd + "\n42",
		"release, lease id empty": "ev5\nr\n" + rd + "\n\n42",
		// The token line.
		"token with a leading zero": "ev5\na\n" + d + "\nlease_01\n042\n30000",
		"token zero-padded to 16":   "ev5\na\n" + d + "\nlease_01\n0000000000000042\n30000",
		"token of 17 digits":        "ev5\na\n" + d + "\nlease_01\n10000000000000042\n30000",
		"token signed":              "ev5\na\n" + d + "\nlease_01\n+42\n30000",
		"token negative":            "ev5\na\n" + d + "\nlease_01\n-42\n30000",
		"token empty":               "ev5\na\n" + d + "\nlease_01\n\n30000",
		"token in hex":              "ev5\na\n" + d + "\nlease_01\n0x2a\n30000",
		"token with a space":        "ev5\na\n" + d + "\nlease_01\n42 \n30000",
		"token with a CR":           "ev5\na\n" + d + "\nlease_01\n42\r\n30000",
		"release token leading 0":   "ev5\nr\n" + rd + "\nlease_01\n042",
		"release token, CR":         "ev5\nr\n" + rd + "\nlease_01\n42\r",
		"release token, space":      "ev5\nr\n" + rd + "\nlease_01\n42 ",
		"release token 17 digits":   "ev5\nr\n" + rd + "\nlease_01\n10000000000000042",
		// The TTL line.
		"ttl with a leading zero": "ev5\na\n" + d + "\nlease_01\n42\n030000",
		"ttl of 17 digits":        "ev5\na\n" + d + "\nlease_01\n42\n10000000000030000",
		"ttl negative":            "ev5\na\n" + d + "\nlease_01\n42\n-30000",
		"ttl signed":              "ev5\na\n" + d + "\nlease_01\n42\n+30000",
		"ttl with a space":        "ev5\na\n" + d + "\nlease_01\n42\n30000 ",
		"ttl with a CR":           "ev5\na\n" + d + "\nlease_01\n42\n30000\r",
		"ttl in seconds":          "ev5\na\n" + d + "\nlease_01\n42\n30s",
		"ttl empty":               "ev5\na\n" + d + "\nlease_01\n42\n",
		// Missing or extra lines.
		"acquire without its ttl":  strings.TrimSuffix(a, "\n30000"),
		"release carrying a ttl":   r + "\n30000",
		"acquisition, extra line":  a + "\n1",
		"acquisition, empty line":  a + "\n",
		"release, extra line":      r + "\n1",
		"release, empty line":      r + "\n",
		"release without a token":  strings.TrimSuffix(r, "\n42"),
		"acquisition, line added":  "ev5\na\n" + d + "\nlease_01\nlease_01\n42\n30000",
		"release, line added":      "ev5\nr\n" + rd + "\nlease_01\nlease_01\n42",
		"acquisition in CRLF":      strings.ReplaceAll(a, "\n", "\r\n"),
		"release in CRLF":          strings.ReplaceAll(r, "\n", "\r\n"),
		"acquisition, trailing CR": a + "\r",
		"release, trailing space":  r + " ",
		"release, leading space":   " " + r,
	}
	for i, bad := range ev5StrayBits(d) {
		malformed["acquisition digest, stray bits "+string(rune('1'+i))] = "ev5\na\n" + bad + tail
	}
	for i, bad := range ev5StrayBits(rd) {
		malformed["release digest, stray bits "+string(rune('1'+i))] = "ev5\nr\n" + bad + "\nlease_01\n42"
	}
	if len(ev5StrayBits(d)) != 3 || len(ev5StrayBits(rd)) != 3 {
		t.Fatal("setup: stray bits")
	}
	records := []*Record{acqRec, relEv.Lease}
	for name, bad := range malformed {
		// Without a check line, and with the check of its lines.
		for _, v := range []string{bad, ev5Checked(entry, bad)} {
			if v == ev5Checked(entry, a) || v == ev5Checked(entry, r) {
				t.Fatalf("setup: %s is well-formed", name)
			}
			if op, id, ok := LeanIDLeaseID(v); ok {
				t.Errorf("%s: LeanIDLeaseID accepted %q as %s of %q", name, v, op, id)
			}
			for _, rec := range records {
				for _, at := range []Timestamp{rec.RenewedAt, relEv.BackendTime} {
					if got, ok := ExpandLeanIDEvidence(v, entry, rec, at); ok {
						t.Errorf("%s: %q rebuilt as %s", name, v, got)
					}
				}
			}
		}
	}

	// Well-formed, checked, but not of the record it is rebuilt from:
	// LeanIDLeaseID reads it (it names a lease), the rebuild refuses it.
	other := func(edit func(*Record)) *Record {
		c := acqRec.Clone()
		edit(c)
		return c
	}
	otherRel := func(edit func(*Record)) *Record {
		c := relEv.Lease.Clone()
		edit(c)
		return c
	}
	wellFormed := map[string]struct {
		raw string // the lines before the check
		rec *Record
	}{
		"acquisition, another lease id":        {"ev5\na\n" + d + "\nlease_02\n42\n30000", acqRec},
		"acquisition, lease id + space":        {"ev5\na\n" + d + "\nlease_01 \n42\n30000", acqRec},
		"acquisition, lease id upper-case":     {"ev5\na\n" + d + "\nLEASE_01\n42\n30000", acqRec},
		"acquisition, lease id without lease_": {"ev5\na\n" + d + "\n01\n42\n30000", acqRec},
		"acquisition, another token":           {"ev5\na\n" + d + "\nlease_01\n43\n30000", acqRec},
		"acquisition, token zero":              {"ev5\na\n" + d + "\nlease_01\n0\n30000", acqRec},
		"acquisition of another lease id":      {a, other(func(r *Record) { r.LeaseID = "lease_02" })},
		"acquisition of another token":         {a, other(func(r *Record) { r.FencingToken = 41 })},
		"release, another lease id":            {"ev5\nr\n" + rd + "\nlease_02\n42", relEv.Lease},
		"release, another token":               {"ev5\nr\n" + rd + "\nlease_01\n43", relEv.Lease},
		"release of another lease id":          {r, otherRel(func(r *Record) { r.LeaseID = "lease_02" })},
		"release of another token":             {r, otherRel(func(r *Record) { r.FencingToken = 43 })},
		"release of a revoked record":          {r, otherRel(func(r *Record) { r.State = StateRevoked })},
		"release of an expired record":         {r, otherRel(func(r *Record) { r.State = StateExpired })},
		"release of an active record":          {r, otherRel(func(r *Record) { r.State = StateActive })},
		"release of the acquired record":       {r, acqRec},
	}
	for name, c := range wellFormed {
		v := ev5Checked(entry, c.raw)
		if _, _, ok := LeanIDLeaseID(v); !ok {
			t.Errorf("%s: LeanIDLeaseID refused well-formed %q", name, v)
		}
		if got, ok := ExpandLeanIDEvidence(v, entry, c.rec, relEv.BackendTime); ok {
			t.Errorf("%s: %q rebuilt as %s", name, v, got)
		}
	}
	for _, raw := range []string{ev5Acq(t), ev5Rel(t)} {
		if got, ok := ExpandLeanIDEvidence(raw, entry, nil, relEv.BackendTime); ok {
			t.Errorf("%q rebuilt without a record: %s", raw, got)
		}
	}
	// An acquisition's own record rebuilds it; the release's does too (an
	// ended record of the same lease), which the acquisition's answer
	// then undoes.
	if _, ok := ExpandLeanIDEvidence(ev5Acq(t), entry, relEv.Lease, relEv.BackendTime); !ok {
		t.Error("an acquisition did not rebuild from its released record")
	}
}

// Version 5's check covers the history entry's bytes as stored and the
// evidence's own lines before it, and is 16 lower-case hex digits: the
// evidence rebuilds nothing with an entry one byte off (any byte changed,
// one added or removed), with lines other than those it was computed
// over (the TTL 30000 → 29999, or any other line), or with a check line
// that is malformed (15 or 17 digits, upper-case, not hex, missing) or
// another value. A malformed check line is not version 5 at all
// (LeanIDLeaseID refuses it too); a well-formed one that is wrong names
// its lease all the same (only the rebuild checks it). The check is the
// one computed outside Go for a fixed entry.
func TestLeanIDEvidenceV5Check(t *testing.T) {
	// Computed with sha1sum: printf 'hv4 fixed entry\n<body>' | sha1sum.
	for body, want := range map[string]string{ev5AcqBody: "96aad9aa23569527", ev5RelBody: "10b842d969fa32d0"} {
		if got := ev5Check("hv4 fixed entry", body); got != want {
			t.Fatalf("the test's own check of %q: %s, want %s", body, got, want)
		}
		e := acquisitionEvidence()
		if strings.HasPrefix(body, "ev5\nr\n") {
			e = releaseEvidence()
		}
		if raw, ok := LeanIDEvidence(e, "hv4 fixed entry"); !ok || string(raw) != body+"\n"+want {
			t.Fatalf("LeanIDEvidence with a fixed entry: %q %v, want the check %s", raw, ok, want)
		}
	}

	acq, rel := acquisitionEvidence(), releaseEvidence()
	// The acquisition's lease released a second after it was granted.
	acqEnded := acq.Lease.Clone()
	acqEnded.State = StateReleased
	acqAt := acq.BackendTime.Add(time.Second)
	for _, side := range []struct {
		name string
		e    *IdempotencyRecord
		// rec and at are the record and end of the entry it refers to.
		rec  *Record
		at   Timestamp
		body string
		// alts are other well-formed lines; rebuilds, if set, says they
		// rebuild (another answer) with their own check from the entry's
		// record, so that only the check refuses them with the original's.
		alts map[string]struct {
			body     string
			rebuilds bool
		}
	}{
		{"acquisition", acq, acqEnded, acqAt, ev5AcqBody, map[string]struct {
			body     string
			rebuilds bool
		}{
			"ttl 30000 -> 29999": {strings.TrimSuffix(ev5AcqBody, "30000") + "29999", true},
			"ttl 30000 -> 30001": {strings.TrimSuffix(ev5AcqBody, "30000") + "30001", true},
			"ttl 30000 -> 3000":  {strings.TrimSuffix(ev5AcqBody, "30000") + "3000", true},
			"another digest":     {"ev5\na\n" + ev5RelDigest + "\nlease_01\n42\n30000", true},
			"token 43":           {"ev5\na\n" + ev5AcqDigest + "\nlease_01\n43\n30000", false},
			"lease id lease_02":  {"ev5\na\n" + ev5AcqDigest + "\nlease_02\n42\n30000", false},
			"as a release":       {"ev5\nr\n" + ev5AcqDigest + "\nlease_01\n42", true},
		}},
		{"release", rel, rel.Lease, rel.BackendTime, ev5RelBody, map[string]struct {
			body     string
			rebuilds bool
		}{
			"another digest":               {"ev5\nr\n" + ev5AcqDigest + "\nlease_01\n42", true},
			"token 43":                     {"ev5\nr\n" + ev5RelDigest + "\nlease_01\n43", false},
			"lease id lease_02":            {"ev5\nr\n" + ev5RelDigest + "\nlease_02\n42", false},
			"as an acquisition":            {"ev5\na\n" + ev5RelDigest + "\nlease_01\n42\n30000", true},
			"as an acquisition, ttl 29999": {"ev5\na\n" + ev5RelDigest + "\nlease_01\n42\n29999", true},
		}},
	} {
		want, err := side.e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		entry := ev5EntryOf(t, side.rec, side.at)
		raw, ok := LeanIDEvidence(side.e, entry)
		v := string(raw)
		check := ev5Check(entry, side.body)
		if !ok || v != side.body+"\n"+check || len(check) != 16 || !LowerHex(check) {
			t.Fatalf("%s: LeanIDEvidence %q %v, want the lines and the check %s", side.name, v, ok, check)
		}
		// The entry's record and end rebuild it, with the entry's bytes.
		rebuild := func(v, entry string) (string, bool) {
			return ExpandLeanIDEvidence(v, entry, side.rec.Clone(), side.at)
		}
		if got, ok := rebuild(v, entry); !ok || got != string(want) {
			t.Fatalf("%s: not rebuilt: %v\n%s\nwant\n%s", side.name, ok, got, want)
		}

		// The entry one byte off: every byte changed, a byte added or
		// removed at either end, no entry.
		for i := 0; i < len(entry); i++ {
			for _, c := range []byte{entry[i] ^ 1, entry[i] ^ 0x20, '0'} {
				if c == entry[i] {
					continue
				}
				bad := entry[:i] + string(c) + entry[i+1:]
				if got, ok := rebuild(v, bad); ok {
					t.Fatalf("%s: rebuilt with the entry's byte %d %q changed to %q: %s", side.name, i, entry[i], c, got)
				}
			}
		}
		for name, bad := range map[string]string{
			"a byte added at the end":    entry + "\n",
			"a byte added at the start":  " " + entry,
			"the last byte removed":      entry[:len(entry)-1],
			"the first byte removed":     entry[1:],
			"a trailing CR":              entry + "\r",
			"no entry":                   "",
			"the lines of version 2":     strings.Replace(entry, HistoryScopedPrefix, HistoryV2Prefix, 1),
			"another end (1 ms later)":   ev5EntryOf(t, side.rec, side.at.Add(time.Millisecond)),
			"the entry's record revoked": ev5EntryOf(t, func() *Record { r := side.rec.Clone(); r.State = StateRevoked; return r }(), side.at),
		} {
			if bad == entry {
				t.Fatalf("setup: %s is the entry", name)
			}
			if got, ok := rebuild(v, bad); ok {
				t.Errorf("%s: rebuilt with the entry, %s: %s", side.name, name, got)
			}
		}
		// LeanIDLeaseID reads the lines; the entry is the rebuild's.
		if _, id, ok := LeanIDLeaseID(v); !ok || id != "lease_01" {
			t.Fatalf("%s: LeanIDLeaseID %q %v", side.name, id, ok)
		}

		// Other lines under the original check: refused. Checked with
		// their own, those the entry's record allows rebuild another
		// answer (the check is a check, not a MAC): it is the check that
		// refuses them.
		for name, alt := range side.alts {
			stale := alt.body + "\n" + check
			if _, _, ok := LeanIDLeaseID(stale); !ok {
				t.Errorf("%s, %s: LeanIDLeaseID refused well-formed %q", side.name, name, stale)
			}
			if got, ok := rebuild(stale, entry); ok {
				t.Errorf("%s, %s: rebuilt under the original's check: %s", side.name, name, got)
			}
			got, ok := rebuild(ev5Checked(entry, alt.body), entry)
			if ok != alt.rebuilds || (ok && got == string(want)) {
				t.Errorf("%s, %s: with its own check rebuilt %v (want %v): %s", side.name, name, ok, alt.rebuilds, got)
			}
		}

		// The check line malformed: not version 5.
		upper := strings.ToUpper(check)
		if upper == check {
			t.Fatalf("setup: the check %s has no letter", check)
		}
		for name, bad := range map[string]string{
			"15 digits":              side.body + "\n" + check[:15],
			"17 digits":              side.body + "\n" + check + "0",
			"17 digits, leading":     side.body + "\n0" + check,
			"upper-case hex":         side.body + "\n" + upper,
			"one upper-case letter":  side.body + "\n" + oneUpper(check),
			"not hex (g)":            side.body + "\n" + check[:15] + "g",
			"not hex (x)":            side.body + "\nx" + check[1:],
			"in base64url":           side.body + "\n" + strings.Repeat("A", 16),
			"0x prefix":              side.body + "\n0x" + check[:14],
			"missing":                side.body,
			"empty":                  side.body + "\n",
			"trailing space":         v + " ",
			"leading space":          side.body + "\n " + check[:15],
			"trailing CR":            v + "\r",
			"trailing newline":       v + "\n",
			"twice":                  v + "\n" + check,
			"the full SHA-1":         side.body + "\n" + fullSHA1(entry, side.body),
			"a CR before the check":  side.body + "\r\n" + check,
			"all of it in CRLF":      strings.ReplaceAll(v, "\n", "\r\n"),
			"no newline before it":   side.body + check,
			"its lines and no entry": side.body + "\n" + ev5Check("", side.body)[:15],
		} {
			if bad == v {
				t.Fatalf("setup: %s is the value", name)
			}
			if op, id, ok := LeanIDLeaseID(bad); ok {
				t.Errorf("%s, check %s: LeanIDLeaseID accepted %q as %s of %q", side.name, name, bad, op, id)
			}
			if got, ok := rebuild(bad, entry); ok {
				t.Errorf("%s, check %s: %q rebuilt as %s", side.name, name, bad, got)
			}
		}
		// Well-formed, but not the check: any one digit changed, the other
		// operation's, the check of no entry, of the entry's version 2
		// lines. It still names its lease; nothing rebuilds.
		wrong := map[string]string{
			"of no entry":         ev5Check("", side.body),
			"of the entry + \\n":  ev5Check(entry+"\n", side.body),
			"of the lines + \\n":  ev5Check(entry, side.body+"\n"),
			"of another lease":    ev5Check(strings.Replace(entry, "\nlease_01\n", "\nlease_02\n", 1), side.body),
			"the other operation": ev5Check(entry, map[bool]string{true: ev5RelBody, false: ev5AcqBody}[side.body == ev5AcqBody]),
		}
		for i := 0; i < len(check); i++ {
			c := "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", check[i])+1)%16]
			wrong["digit "+string(rune('a'+i))+" + 1"] = check[:i] + string(c) + check[i+1:]
		}
		for name, c := range wrong {
			if c == check || len(c) != 16 || !LowerHex(c) {
				t.Fatalf("setup: %s: %q", name, c)
			}
			bad := side.body + "\n" + c
			if _, id, ok := LeanIDLeaseID(bad); !ok || id != "lease_01" {
				t.Errorf("%s, check %s: LeanIDLeaseID %q %v", side.name, name, id, ok)
			}
			if got, ok := rebuild(bad, entry); ok {
				t.Errorf("%s, check %s: %q rebuilt as %s", side.name, name, bad, got)
			}
		}
	}
}

// oneUpper is c with its first letter upper-case.
func oneUpper(c string) string {
	i := strings.IndexAny(c, "abcdef")
	if i < 0 {
		return strings.ToUpper(c)
	}
	return c[:i] + strings.ToUpper(c[i:i+1]) + c[i+1:]
}

// fullSHA1 is the whole SHA-1 (40 hex digits) version 5's check is the
// first 16 of.
func fullSHA1(entry, body string) string {
	sum := sha1.Sum([]byte(entry + "\n" + body))
	return hex.EncodeToString(sum[:])
}

// Version 5 is none of the versions before it, and they are not version
// 5: an older reader (version 1, 2, 3 or 4) refuses it, and this one
// refuses theirs, so a value is only ever read as the version it is.
func TestLeanIDEvidenceV5IsItsOwnVersion(t *testing.T) {
	e, rel := acquisitionEvidence(), releaseEvidence()
	entry := ev5Entry(t)
	for _, raw := range []string{ev5Acq(t), ev5Rel(t)} {
		// An older reader takes what is not version 2 as version 1, which
		// its strict decoding refuses.
		if v1, ok := ExpandEvidence(raw, e.Lease.Identity()); ok {
			if _, err := DecodeIdempotencyRecord([]byte(v1)); err == nil {
				t.Errorf("%q read as version 1 or 2", raw)
			}
		}
		if _, ok := ReferredLeaseID(raw); ok {
			t.Errorf("%q read as version 3", raw)
		}
		if _, ok := ExpandReferringEvidence(raw, e.Lease); ok {
			t.Errorf("%q rebuilt as version 3", raw)
		}
		if _, _, ok := LeanEvidenceToken(raw); ok {
			t.Errorf("%q read as version 4", raw)
		}
		if _, ok := ExpandLeanEvidence(raw, rel.Lease, rel.BackendTime); ok {
			t.Errorf("%q rebuilt as version 4", raw)
		}
		if _, err := DecodeIdempotencyRecord([]byte(raw)); err == nil {
			t.Errorf("%q decoded as version 1", raw)
		}
	}
	v4, ok := LeanEvidence(e)
	if !ok {
		t.Fatal("setup: not in version 4")
	}
	v3, ok := ReferringEvidence(e)
	if !ok {
		t.Fatal("setup: not in version 3")
	}
	v1, _ := e.Encode()
	v2, err := CompactEvidence(e, e.Lease.Identity())
	if err != nil {
		t.Fatal(err)
	}
	// Version 4 with its check on the lease id's line, or its prefix
	// changed to version 5's, with or without a check of version 5's: a
	// version 4 check is no lease id.
	v4as5 := EvidenceLeanIDPrefix + strings.TrimPrefix(string(v4), EvidenceLeanPrefix)
	for name, raw := range map[string]string{"v1": string(v1), "v2": string(v2), "v3": string(v3), "v4": string(v4),
		"v4 as 5": v4as5, "v4 as 5, checked": ev5Checked(entry, v4as5)} {
		if got, ok := ExpandLeanIDEvidence(raw, entry, e.Lease, e.BackendTime); ok {
			t.Errorf("%s rebuilt as version 5: %s", name, got)
		}
		if _, _, ok := LeanIDLeaseID(raw); ok && name != "v4 as 5, checked" {
			t.Errorf("%s read as version 5", name)
		}
	}
	// Version 5 spells what version 4 does, the lease id for the check,
	// and its own check after.
	lines4, lines5 := strings.Split(string(v4), "\n"), strings.Split(ev5Acq(t), "\n")
	if len(lines4)+1 != len(lines5) || lines4[1] != lines5[1] || lines4[2] != lines5[2] || lines4[4] != lines5[4] ||
		lines4[5] != lines5[5] || lines5[3] != e.Lease.LeaseID || lines5[6] != ev5Check(entry, ev5AcqBody) {
		t.Fatalf("version 4 %q and 5 %q differ beyond the check's line", v4, ev5Acq(t))
	}
}
