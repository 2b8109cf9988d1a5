package lease

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// sha72 is the check version 4 keeps of v1: the first 72 bits of its
// SHA-256, in base64url.
func sha72(v1 []byte) string {
	sum := sha256.Sum256(v1)
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// releaseEvidence is the evidence of validRecord's release 5 s after its
// renewal: its result is the record as it ended.
func releaseEvidence() *IdempotencyRecord {
	ended := validRecord()
	ended.State = StateReleased
	return &IdempotencyRecord{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("cd", 32), Code: CodeReleased,
		Lease: ended, BackendTime: ended.RenewedAt.Add(5 * time.Second)}
}

// Version 4 acquisition evidence is the five lines it promises and
// rebuilds exactly the version 1 bytes of the original from any later
// record of the lease: renewed, or ended in any state; a release's
// rebuilds from its ended record and the entry's ended_at.
func TestLeanEvidenceRoundTrip(t *testing.T) {
	e := acquisitionEvidence()
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := LeanEvidence(e)
	// ab×32 in base64url is "q6ur…q6s"; token 42, TTL 30 s.
	if wantRaw := "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + sha72(want) + "\n42\n30000"; !ok || string(raw) != wantRaw {
		t.Fatalf("LeanEvidence: %q, %v; want %q", raw, ok, wantRaw)
	}
	if op, token, ok := LeanEvidenceToken(string(raw)); !ok || op != OpAcquire || token != 42 {
		t.Fatalf("LeanEvidenceToken: %s %d %v", op, token, ok)
	}
	renewed := Renewed(e.Lease, 90*time.Second, e.Lease.AcquiredAt.Add(20*time.Second))
	later := []*Record{e.Lease, renewed}
	for _, st := range []State{StateReleased, StateExpired, StateRevoked} {
		ended := renewed.Clone()
		ended.State = st
		later = append(later, ended)
	}
	for _, rec := range later {
		got, ok := ExpandLeanEvidence(string(raw), rec, rec.RenewedAt.Add(time.Hour))
		if !ok || got != string(want) {
			t.Fatalf("rebuilt from the record in state %s renewed at %v:\n%s\nwant\n%s", rec.State, rec.RenewedAt, got, want)
		}
		if _, err := DecodeIdempotencyRecord([]byte(got)); err != nil {
			t.Fatal(err)
		}
	}

	r := releaseEvidence()
	want, err = r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	raw, ok = LeanEvidence(r)
	if wantRaw := "ev4\nr\n" + strings.Repeat("zc3N", 10) + "zc0\n" + sha72(want) + "\n42"; !ok || string(raw) != wantRaw {
		t.Fatalf("LeanEvidence of a release: %q, %v; want %q", raw, ok, wantRaw)
	}
	if got, ok := ExpandLeanEvidence(string(raw), r.Lease.Clone(), r.BackendTime); !ok || got != string(want) {
		t.Fatalf("release rebuilt:\n%s\nwant\n%s", got, want)
	}
	// Another end time, state or token is another release: never this one.
	if got, ok := ExpandLeanEvidence(string(raw), r.Lease.Clone(), r.BackendTime.Add(time.Millisecond)); ok {
		t.Errorf("release rebuilt from another ended_at: %s", got)
	}
	// A record damaged in a fact the evidence takes from it (here its
	// lease id, which version 3 named) fails the check.
	damaged := r.Lease.Clone()
	damaged.LeaseID = "leare_" + strings.TrimPrefix(damaged.LeaseID, "lease_")
	if got, ok := ExpandLeanEvidence(string(raw), damaged, r.BackendTime); ok {
		t.Errorf("release rebuilt from a damaged record: %s", got)
	}
	damaged = r.Lease.Clone()
	damaged.ExecutionID += "x"
	if got, ok := ExpandLeanEvidence(string(raw), damaged, r.BackendTime); ok {
		t.Errorf("release rebuilt from a record with another execution id: %s", got)
	}
	revoked := r.Lease.Clone()
	revoked.State = StateRevoked
	if got, ok := ExpandLeanEvidence(string(raw), revoked, r.BackendTime); ok {
		t.Errorf("release rebuilt from a revoked record: %s", got)
	}
	other := r.Lease.Clone()
	other.FencingToken++
	if got, ok := ExpandLeanEvidence(string(raw), other, r.BackendTime); ok {
		t.Errorf("release rebuilt from a record of another token: %s", got)
	}
	if _, ok := ExpandLeanEvidence(string(raw), nil, r.BackendTime); ok {
		t.Error("rebuilt without a record")
	}
}

// Only evidence whose rebuild gives back its exact version 1 bytes is
// stored in version 4: anything else goes to another version.
func TestLeanEvidenceOnlyWhenItRebuildsExactly(t *testing.T) {
	for name, edit := range map[string]func(e *IdempotencyRecord){
		"a renewal":                 func(e *IdempotencyRecord) { e.Op, e.Code = OpRenew, CodeRenewed },
		"a conflict code":           func(e *IdempotencyRecord) { e.Code = CodeConflict },
		"renewed since acquired":    func(e *IdempotencyRecord) { e.Lease.RenewedAt = e.Lease.AcquiredAt.Add(time.Second) },
		"backend time not acquired": func(e *IdempotencyRecord) { e.BackendTime = e.BackendTime.Add(time.Millisecond) },
		"expiry not as granted":     func(e *IdempotencyRecord) { e.Lease.ExpiresAt = e.Lease.ExpiresAt.Add(time.Millisecond) },
		"not active":                func(e *IdempotencyRecord) { e.Lease.State = StateReleased },
		"digest not lower-case hex": func(e *IdempotencyRecord) { e.Digest = strings.Repeat("AB", 32) },
		"digest too short":          func(e *IdempotencyRecord) { e.Digest = strings.Repeat("ab", 31) },
		"no record":                 func(e *IdempotencyRecord) { e.Lease = nil },
		"a token of 17 digits":      func(e *IdempotencyRecord) { e.Lease.FencingToken = 1e16 },
		"a record that is invalid":  func(e *IdempotencyRecord) { e.Lease.LockKey = strings.Repeat("0", 64) },
		"a backend time before 1970": func(e *IdempotencyRecord) {
			e.BackendTime, e.Lease.AcquiredAt, e.Lease.RenewedAt = UnixMilli(-1), UnixMilli(-1), UnixMilli(-1)
		},
	} {
		e := acquisitionEvidence()
		edit(e)
		if raw, ok := LeanEvidence(e); ok {
			t.Errorf("%s: stored in version 4: %q", name, raw)
		}
	}
	r := releaseEvidence()
	r.Lease.State = StateRevoked
	if raw, ok := LeanEvidence(r); ok {
		t.Errorf("a release of a record not released: %q", raw)
	}
	r = releaseEvidence()
	r.Op, r.Code = OpRevoke, CodeRevoked
	if raw, ok := LeanEvidence(r); ok {
		t.Errorf("a revocation's evidence in version 4: %q", raw)
	}
}

// Version 4 is read strictly: a missing or extra line, a digest of the
// wrong length or a non-canonical spelling, a number that is not
// canonical decimal, an unknown operation letter all fail (corrupt for
// the store that reads them), never a guess.
func TestLeanEvidenceStrictDecode(t *testing.T) {
	e := acquisitionEvidence()
	acq, ok := LeanEvidence(e)
	if !ok {
		t.Fatal("acquisition not in version 4")
	}
	rel, ok := LeanEvidence(releaseEvidence())
	if !ok {
		t.Fatal("release not in version 4")
	}
	a, r := string(acq), string(rel)
	d := strings.Repeat("q6ur", 10) + "q6s"
	ck := strings.Split(a, "\n")[3]
	if len(ck) != 12 {
		t.Fatalf("check %q", ck)
	}
	d += "\n" + ck // the digest and check lines, as the cases below keep them unless they break them
	for name, bad := range map[string]string{
		"truncated acquisition":       strings.TrimSuffix(a, "\n30000"),
		"no check":                    "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n42\n30000",
		"check too short":             "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + ck[:11] + "\n42\n30000",
		"check a CRC-32C":             "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + ck[:6] + "\n42\n30000",
		"check too long":              "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + ck + "A\n42\n30000",
		"check of other bytes":        "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + sha72([]byte("x")) + "\n42\n30000",
		"check in hex":                "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + "0a0b0c0d0e0f101112" + "\n42\n30000",
		"check in standard base64":    "ev4\na\n" + strings.Repeat("q6ur", 10) + "q6s\n" + "+" + ck[1:] + "\n42\n30000",
		"truncated release":           strings.TrimSuffix(r, "\n42"),
		"acquisition, extra line":     a + "\n1",
		"release, extra line":         r + "\n30000",
		"acquisition, empty line":     a + "\n",
		"digest too short":            "ev4\na\n" + d[:42] + d[43:] + "\n42\n30000",
		"digest too long":             "ev4\na\n" + d[:43] + "q" + d[43:] + "\n42\n30000",
		"digest in hex":               "ev4\na\n" + strings.Repeat("ab", 32) + "\n" + ck + "\n42\n30000",
		"digest with stray bits":      "ev4\na\n" + d[:42] + "t" + d[43:] + "\n42\n30000",
		"digest padded":               "ev4\na\n" + d[:41] + "s=" + d[43:] + "\n42\n30000",
		"digest in standard base64":   "ev4\na\n" + strings.Repeat("q6ur", 9) + "q+ur" + d[40:] + "\n42\n30000",
		"token with a leading zero":   "ev4\na\n" + d + "\n042\n30000",
		"token signed":                "ev4\na\n" + d + "\n+42\n30000",
		"token empty":                 "ev4\na\n" + d + "\n\n30000",
		"ttl with a leading zero":     "ev4\na\n" + d + "\n42\n030000",
		"ttl negative":                "ev4\na\n" + d + "\n42\n-30000",
		"ttl with a space":            "ev4\na\n" + d + "\n42\n30000 ",
		"wrong op letter":             "ev4\nx\n" + d + "\n42\n30000",
		"op spelled out":              "ev4\nacquire\n" + d + "\n42\n30000",
		"release op, acquire's lines": "ev4\nr\n" + d + "\n42\n30000",
		"acquire op, release's lines": "ev4\na\n" + d + "\n42",
		"another version":             "ev5\na\n" + d + "\n42\n30000",
	} {
		// A check of other bytes is well-formed: only the rebuild finds it wrong.
		if _, _, ok := LeanEvidenceToken(bad); ok && name != "check of other bytes" {
			t.Errorf("%s: LeanEvidenceToken accepted %q", name, bad)
		}
		for _, rec := range []*Record{e.Lease, releaseEvidence().Lease} {
			if got, ok := ExpandLeanEvidence(bad, rec, rec.RenewedAt); ok {
				t.Errorf("%s: %q rebuilt as %s", name, bad, got)
			}
		}
	}
}

// Detaching version 4 evidence from its lease's history entry splices
// version 2 evidence from the entry's lines (version 3 or 2) that is byte
// for byte what rebuilding and encoding it stores, and expands to the
// original; an entry that is not its lease's, or whose facts are not the
// ones the check was made over, is never spliced.
func TestDetachedLeanEvidenceIsTheRebuild(t *testing.T) {
	acq := acquisitionEvidence()
	acqRaw, ok := LeanEvidence(acq)
	if !ok {
		t.Fatal("acquisition not lean")
	}
	renewed := Renewed(acq.Lease, 90*time.Second, acq.Lease.AcquiredAt.Add(20*time.Second))
	rel := releaseEvidence()
	relRaw, ok := LeanEvidence(rel)
	if !ok {
		t.Fatal("release not lean")
	}
	type entry struct {
		name string
		h    *HistoryEntry
	}
	type detach struct {
		raw   []byte
		orig  *IdempotencyRecord
		entry entry
	}
	var cases []detach
	for _, st := range []State{StateReleased, StateExpired, StateRevoked} {
		ended := renewed.Clone()
		ended.State = st
		h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: ended, EndedAt: ended.RenewedAt.Add(time.Second), EndedBy: ended.OwnerPrincipalID, RequestID: "req_end"}
		cases = append(cases, struct {
			raw   []byte
			orig  *IdempotencyRecord
			entry entry
		}{acqRaw, acq, entry{"acquisition, entry " + string(st), h}})
	}
	relEntry := &HistoryEntry{HistoryVersion: HistoryVersion, Record: rel.Lease, EndedAt: rel.BackendTime, EndedBy: rel.Lease.OwnerPrincipalID, RequestID: "req_rel"}
	cases = append(cases, detach{relRaw, rel, entry{"release", relEntry}})
	for _, c := range cases {
		want, err := c.orig.Encode()
		if err != nil {
			t.Fatal(err)
		}
		lockKey := c.entry.h.Record.LockKey
		rebuilt, ok := LeanReferredEvidence(string(c.raw), c.entry.h.Record, c.entry.h.EndedAt)
		if !ok {
			t.Fatalf("%s: not rebuilt", c.entry.name)
		}
		wantV2, err := CompactEvidence(rebuilt, c.entry.h.Record.Identity())
		if err != nil || !strings.HasPrefix(string(wantV2), EvidenceV2Prefix) {
			t.Fatalf("%s: rebuild encodes %q, %v", c.entry.name, wantV2, err)
		}
		hv3, err := CompactHistoryAt(c.entry.h)
		if err != nil || !strings.HasPrefix(string(hv3), HistoryV3Prefix) {
			t.Fatalf("%s: entry %q, %v", c.entry.name, hv3, err)
		}
		hv2, err := CompactHistory(c.entry.h)
		if err != nil || !strings.HasPrefix(string(hv2), HistoryV2Prefix) {
			t.Fatalf("%s: entry %q, %v", c.entry.name, hv2, err)
		}
		for _, hist := range [][]byte{hv3, hv2} {
			got, ok := DetachedLeanEvidence(string(c.raw), string(hist), lockKey, c.entry.h.Record.Identity())
			if !ok || string(got) != string(wantV2) {
				t.Fatalf("%s from %.3s: spliced %q, %v; the rebuild stores %q", c.entry.name, hist, got, ok, wantV2)
			}
			if v1, ok := ExpandEvidence(string(got), c.entry.h.Record.Identity()); !ok || v1 != string(want) {
				t.Fatalf("%s: spliced evidence expands to\n%s\nwant\n%s", c.entry.name, v1, want)
			}
		}
		// Not its lease's entry, or an entry damaged in a fact the check
		// covers (its execution id, its lease id): never spliced.
		for name, edit := range map[string]func(h *HistoryEntry){
			"another token":        func(h *HistoryEntry) { h.Record.FencingToken++ },
			"another execution id": func(h *HistoryEntry) { h.Record.ExecutionID += "x" },
			"another lease id":     func(h *HistoryEntry) { h.Record.LeaseID = "leare_" + strings.TrimPrefix(h.Record.LeaseID, "lease_") },
			"another acquisition":  func(h *HistoryEntry) { h.Record.AcquiredAt = h.Record.AcquiredAt.Add(-time.Millisecond) },
			"another lifetime":     func(h *HistoryEntry) { h.Record.MaximumLifetimeMs-- },
		} {
			other := *c.entry.h
			other.Record = c.entry.h.Record.Clone()
			edit(&other)
			hist, err := CompactHistoryAt(&other)
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := DetachedLeanEvidence(string(c.raw), string(hist), lockKey, other.Record.Identity()); ok {
				t.Errorf("%s: spliced from an entry with %s: %q", c.entry.name, name, got)
			}
		}
		v1, _ := c.entry.h.Encode()
		if got, ok := DetachedLeanEvidence(string(c.raw), string(v1), lockKey, c.entry.h.Record.Identity()); ok {
			t.Errorf("%s: spliced from a version 1 entry: %q", c.entry.name, got)
		}
		if got, ok := DetachedLeanEvidence(string(c.raw)+"0", string(hv3), lockKey, c.entry.h.Record.Identity()); ok {
			t.Errorf("%s: spliced from malformed evidence: %q", c.entry.name, got)
		}
	}
	// A release's evidence never splices from an entry that did not end
	// released.
	revoked := *relEntry
	revoked.Record = rel.Lease.Clone()
	revoked.Record.State = StateRevoked
	hist, err := CompactHistoryAt(&revoked)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := DetachedLeanEvidence(string(relRaw), string(hist), revoked.Record.LockKey, revoked.Record.Identity()); ok {
		t.Errorf("a release spliced from a revoked entry: %q", got)
	}
}
