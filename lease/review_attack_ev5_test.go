package lease

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// Review: attack on evidence version 5 (evidence_v5.go), the lean
// by-lease-id evidence of Valkey's stored format 7, and on the shared
// parser and rebuild it took from version 4 (leanShapedLines,
// leanShapedRebuilt).

// ev5AttackAcquisitions are acquisitions as granted: the usual one, one
// whose TTL is its whole maximum lifetime, and a one-millisecond one.
func ev5AttackAcquisitions() []*IdempotencyRecord {
	var out []*IdempotencyRecord
	for _, c := range []struct{ ttl, life int64 }{{30000, 300000}, {300000, 300000}, {1, 1}, {86400000, 7 * 86400000}} {
		e := acquisitionEvidence()
		e.Lease.TTLMs, e.Lease.MaximumLifetimeMs = c.ttl, c.life
		e.Lease.ExpiresAt = e.Lease.AcquiredAt.Add(time.Duration(c.ttl) * time.Millisecond)
		out = append(out, e)
	}
	return out
}

// Version 5 is the lines it promises and its check of the entry it
// refers to, and rebuilds exactly the version 1 bytes of the first answer
// from any later record of the lease with that entry's bytes: an
// acquisition's from the renewed (capped by the maximum lifetime) or
// ended record, a release's from its ended record and the entry's end.
func TestEV5AttackRoundTrip(t *testing.T) {
	for _, e := range ev5AttackAcquisitions() {
		want, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		renewed := Renewed(e.Lease, 24*time.Hour, e.Lease.AcquiredAt.Add(time.Duration(e.Lease.TTLMs-1)*time.Millisecond/2))
		later := []*Record{e.Lease, renewed}
		for _, st := range []State{StateReleased, StateExpired, StateRevoked} {
			ended := renewed.Clone()
			ended.State = st
			later = append(later, ended)
		}
		body := "ev5\na\n" + strings.Repeat("q6ur", 10) + "q6s\nlease_01\n42\n" + strconv.FormatInt(e.Lease.TTLMs, 10)
		for _, rec := range later {
			// The evidence as written with the entry of the lease ended
			// with rec, an hour after its renewal.
			endedAt := rec.RenewedAt.Add(time.Hour)
			entry := ev5EntryOf(t, rec, endedAt)
			raw, ok := LeanIDEvidence(e, entry)
			if wantRaw := ev5Checked(entry, body); !ok || string(raw) != wantRaw {
				t.Fatalf("LeanIDEvidence: %q %v, want %q", raw, ok, wantRaw)
			}
			if op, id, ok := LeanIDLeaseID(string(raw)); !ok || op != OpAcquire || id != "lease_01" {
				t.Fatalf("LeanIDLeaseID: %s %q %v", op, id, ok)
			}
			got, ok := ExpandLeanIDEvidence(string(raw), entry, rec, endedAt)
			if !ok || got != string(want) {
				t.Fatalf("rebuilt from %s renewed at %v:\n%s\nwant\n%s", rec.State, rec.RenewedAt, got, want)
			}
			if _, err := DecodeIdempotencyRecord([]byte(got)); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := releaseEvidence()
	want, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	entry := ev5EntryOf(t, r.Lease, r.BackendTime)
	raw, ok := LeanIDEvidence(r, entry)
	if wantRaw := ev5Checked(entry, "ev5\nr\n"+strings.Repeat("zc3N", 10)+"zc0\nlease_01\n42"); !ok || string(raw) != wantRaw {
		t.Fatalf("LeanIDEvidence of a release: %q %v", raw, ok)
	}
	if got, ok := ExpandLeanIDEvidence(string(raw), entry, r.Lease.Clone(), r.BackendTime); !ok || got != string(want) {
		t.Fatalf("release rebuilt:\n%s\nwant\n%s", got, want)
	}
	// Version 5 takes a release's backend time from the end its caller
	// passes, which the caller reads from the entry: another end passed
	// with the same entry bytes is another answer (the caller's to pass
	// the entry's own). But an entry that records another ended_at is
	// other bytes, which the check refuses, as version 4's check refuses
	// it and unlike version 3 (which held the backend time): see the valkey
	// review test TestAttackEV5AnswerFromUncheckedEntryFacts.
	if got, ok := ExpandLeanIDEvidence(string(raw), entry, r.Lease.Clone(), r.BackendTime.Add(time.Millisecond)); !ok || got == string(want) {
		t.Fatalf("another ended_at: %v %q", ok, got)
	}
	damaged := ev5EntryOf(t, r.Lease, r.BackendTime.Add(time.Millisecond))
	if got, ok := ExpandLeanIDEvidence(string(raw), damaged, r.Lease.Clone(), r.BackendTime.Add(time.Millisecond)); ok {
		t.Fatalf("rebuilt from an entry whose ended_at is 1 ms later: %q", got)
	}
	if v4, ok := LeanEvidence(r); !ok {
		t.Fatal("version 4 refuses the release")
	} else if _, ok := ExpandLeanEvidence(string(v4), r.Lease.Clone(), r.BackendTime.Add(time.Millisecond)); ok {
		t.Fatal("version 4 rebuilt a release at another ended_at")
	}
}

// LeanIDEvidence stores only evidence whose rebuild is exact and that
// its lines can hold; anything else is left to another version.
func TestEV5AttackLeanIDEvidenceRefuses(t *testing.T) {
	cases := map[string]func(e *IdempotencyRecord){
		"renewed acquisition": func(e *IdempotencyRecord) { e.Lease.RenewedAt = e.Lease.AcquiredAt.Add(time.Second) },
		"expires not derived": func(e *IdempotencyRecord) { e.Lease.ExpiresAt = e.Lease.ExpiresAt.Add(-time.Millisecond) },
		"backend not acquired_at": func(e *IdempotencyRecord) {
			e.BackendTime = e.BackendTime.Add(time.Millisecond)
		},
		"state not active":      func(e *IdempotencyRecord) { e.Lease.State = StateReleased },
		"code not acquired":     func(e *IdempotencyRecord) { e.Code = CodeRenewed },
		"op renew":              func(e *IdempotencyRecord) { e.Op, e.Code = OpRenew, CodeRenewed },
		"digest upper case":     func(e *IdempotencyRecord) { e.Digest = strings.ToUpper(e.Digest) },
		"digest short":          func(e *IdempotencyRecord) { e.Digest = e.Digest[:62] },
		"lease id empty":        func(e *IdempotencyRecord) { e.Lease.LeaseID = "" },
		"lease id with newline": func(e *IdempotencyRecord) { e.Lease.LeaseID = "lease_01\n43" },
		"lease id with quote":   func(e *IdempotencyRecord) { e.Lease.LeaseID = `lease_"01` },
		"token 16 digits":       func(e *IdempotencyRecord) { e.Lease.FencingToken = 1e16 },
		"ttl above max":         func(e *IdempotencyRecord) { e.Lease.TTLMs = MaxTTL.Milliseconds() + 1 },
	}
	entry := ev5Entry(t)
	for name, edit := range cases {
		e := acquisitionEvidence()
		edit(e)
		if raw, ok := LeanIDEvidence(e, entry); ok {
			t.Errorf("%s: stored as %q", name, raw)
		}
	}
	r := releaseEvidence()
	r.Lease.State = StateRevoked
	if raw, ok := LeanIDEvidence(r, entry); ok {
		t.Errorf("a revoked release stored as %q", raw)
	}
}

// The reader is strict: anything but the lines LeanIDEvidence writes
// (with no check line, or with the right check of those lines, so that
// the lines are what is refused), or a record of another lease (id or
// token), or a release's record not released, rebuilds nothing; and
// version 4 and 5 are never read as each other.
func TestEV5AttackStrictReader(t *testing.T) {
	e := acquisitionEvidence()
	entry := ev5Entry(t)
	raw, ok := LeanIDEvidence(e, entry)
	if !ok {
		t.Fatal("refused")
	}
	v := string(raw)
	body := v[:strings.LastIndexByte(v, '\n')] // the lines before the check
	d := strings.Repeat("q6ur", 10) + "q6s"
	bad := []string{
		"", "ev5\n", "ev5\na\n", strings.Replace(v, "ev5", "ev4", 1), strings.Replace(v, "ev5", "EV5", 1),
		v + "\n", v + "\n1", "\n" + v, strings.ReplaceAll(v, "\n", "\r\n"),
		"ev5\nx\n" + d + "\nlease_01\n42\n30000", "ev5\nA\n" + d + "\nlease_01\n42\n30000",
		"ev5\na\n" + d + "\nlease_01\n42",              // no TTL
		"ev5\nr\n" + d + "\nlease_01\n42\n30000",       // a release with a TTL
		"ev5\na\n" + d[:42] + "t\nlease_01\n42\n30000", // stray bits
		"ev5\na\n" + d + "=\nlease_01\n42\n30000",
		"ev5\na\n" + strings.Repeat("ab", 32) + "\nlease_01\n42\n30000", // hex digest
		"ev5\na\n" + d + "\n\n42\n30000",
		"ev5\na\n" + d + "\nlease_01\n042\n30000", "ev5\na\n" + d + "\nlease_01\n42\n030000",
		"ev5\na\n" + d + "\nlease_01\n+42\n30000", "ev5\na\n" + d + "\nlease_01\n42\n-1",
		"ev5\na\n" + d + "\nlease_01\n12345678901234567\n30000", "ev5\na\n" + d + "\nlease_01\n42\n12345678901234567",
		"ev5\na\n" + d + "\nlease_\"01\n42\n30000", "ev5\na\n" + d + "\nlease_01\t\n42\n30000",
	}
	for _, b := range bad {
		for _, b := range []string{b, ev5Checked(entry, b)} {
			if b == v {
				t.Fatalf("setup: %q is the value", b)
			}
			if _, _, ok := LeanIDLeaseID(b); ok {
				t.Errorf("LeanIDLeaseID accepts %q", b)
			}
			if got, ok := ExpandLeanIDEvidence(b, entry, e.Lease.Clone(), e.BackendTime); ok {
				t.Errorf("ExpandLeanIDEvidence accepts %q: %s", b, got)
			}
		}
	}
	// Numbers a reader refuses: a TTL of 0, above the maximum TTL, or so
	// large that it overflows a time.Duration in milliseconds; checked,
	// so that the rebuild reaches them.
	for _, ttl := range []string{"0", "86400001", "9223372036855", "9999999999999999"} {
		b := ev5Checked(entry, "ev5\na\n"+d+"\nlease_01\n42\n"+ttl)
		if got, ok := ExpandLeanIDEvidence(b, entry, e.Lease.Clone(), e.BackendTime); ok {
			if _, err := DecodeIdempotencyRecord([]byte(got)); err == nil {
				t.Errorf("a TTL of %s rebuilds evidence that decodes: %s", ttl, got)
			}
		}
	}
	if _, ok := ExpandLeanIDEvidence(v, entry, e.Lease.Clone(), e.BackendTime); !ok {
		t.Fatal("setup: the value does not rebuild from its own record")
	}
	other := e.Lease.Clone()
	other.LeaseID = "lease_02"
	if _, ok := ExpandLeanIDEvidence(v, entry, other, e.BackendTime); ok {
		t.Error("rebuilt from another lease id's record")
	}
	other = e.Lease.Clone()
	other.FencingToken++
	if _, ok := ExpandLeanIDEvidence(v, entry, other, e.BackendTime); ok {
		t.Error("rebuilt from another token's record")
	}
	if _, ok := ExpandLeanIDEvidence(v, entry, nil, e.BackendTime); ok {
		t.Error("rebuilt from no record")
	}
	r := releaseEvidence()
	rv, _ := LeanIDEvidence(r, entry)
	if _, ok := ExpandLeanIDEvidence(string(rv), entry, r.Lease.Clone(), r.BackendTime); !ok {
		t.Fatal("setup: the release does not rebuild from its own record")
	}
	for _, st := range []State{StateActive, StateExpired, StateRevoked} {
		rec := r.Lease.Clone()
		rec.State = st
		if _, ok := ExpandLeanIDEvidence(string(rv), entry, rec, r.BackendTime); ok {
			t.Errorf("a release rebuilt from a record %s", st)
		}
	}
	// Version 4 with a lease id on its check's line (with or without
	// version 5's check), and version 5 read as version 4: none rebuilds.
	if _, ok := ExpandLeanEvidence(v, e.Lease.Clone(), e.BackendTime); ok {
		t.Error("version 5 read as version 4")
	}
	v4, _ := LeanEvidence(e)
	if _, ok := ExpandLeanIDEvidence(string(v4), entry, e.Lease.Clone(), e.BackendTime); ok {
		t.Error("version 4 read as version 5")
	}
	for _, as4 := range []string{"ev4" + body[3:], "ev4" + v[3:]} {
		if _, ok := ExpandLeanEvidence(as4, e.Lease.Clone(), e.BackendTime); ok {
			t.Errorf("version 4 with a lease id for its check rebuilds: %q", as4)
		}
	}
}
