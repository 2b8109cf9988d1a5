package lease

import (
	"strings"
	"testing"
	"time"
)

// acquisitionEvidence is the evidence of validRecord's acquisition: the
// record as granted at its acquired_at.
func acquisitionEvidence() *IdempotencyRecord {
	r := validRecord()
	r.RenewedAt = r.AcquiredAt
	r.ExpiresAt = r.AcquiredAt.Add(30 * time.Second)
	r.Metadata = Metadata{"source": "scheduler", "attempt": float64(2)}
	return &IdempotencyRecord{Version: IdempotencyVersion, Op: OpAcquire, Digest: strings.Repeat("ab", 32), Code: CodeAcquired,
		Lease: r, BackendTime: r.AcquiredAt}
}

// Version 3 evidence rebuilds exactly the version 1 bytes of the original
// evidence from any later record of the same lease: renewed (other
// renewed_at, expires_at and ttl_ms) or ended in any state.
func TestReferringEvidenceRebuildsFromLaterRecords(t *testing.T) {
	e := acquisitionEvidence()
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := ReferringEvidence(e)
	if !ok || !strings.HasPrefix(string(raw), EvidenceRefPrefix) || len(raw)*4 > len(want) {
		t.Fatalf("ReferringEvidence: %q, %v; want version 3 under a quarter of %d bytes", raw, ok, len(want))
	}
	if id, ok := ReferredLeaseID(string(raw)); !ok || id != e.Lease.LeaseID {
		t.Fatalf("ReferredLeaseID: %q %v", id, ok)
	}
	renewed := Renewed(e.Lease, 90*time.Second, e.Lease.AcquiredAt.Add(20*time.Second))
	later := []*Record{e.Lease, renewed}
	for _, st := range []State{StateReleased, StateExpired, StateRevoked} {
		ended := renewed.Clone()
		ended.State = st
		later = append(later, ended)
	}
	for _, rec := range later {
		got, ok := ExpandReferringEvidence(string(raw), rec)
		if !ok || got != string(want) {
			t.Fatalf("rebuilt from the record in state %s renewed at %v:\n%s\nwant\n%s", rec.State, rec.RenewedAt, got, want)
		}
		if _, err := DecodeIdempotencyRecord([]byte(got)); err != nil {
			t.Fatal(err)
		}
	}
}

// Only an acquisition's evidence of the record as granted is stored by
// reference; a record of another lease or token never rebuilds it.
func TestReferringEvidenceOnlyForAnAcquisitionAsGranted(t *testing.T) {
	for name, edit := range map[string]func(e *IdempotencyRecord){
		"a renewal":                 func(e *IdempotencyRecord) { e.Op, e.Code = OpRenew, CodeRenewed },
		"renewed since acquired":    func(e *IdempotencyRecord) { e.Lease.RenewedAt = e.Lease.AcquiredAt.Add(time.Second) },
		"backend time not acquired": func(e *IdempotencyRecord) { e.BackendTime = e.BackendTime.Add(time.Millisecond) },
		"not active":                func(e *IdempotencyRecord) { e.Lease.State = StateReleased },
		"digest not lower-case hex": func(e *IdempotencyRecord) { e.Digest = strings.Repeat("AB", 32) },
		"digest with a line break":  func(e *IdempotencyRecord) { e.Digest = strings.Repeat("ab", 31) + "a\n" },
		"no record":                 func(e *IdempotencyRecord) { e.Lease = nil },
	} {
		e := acquisitionEvidence()
		edit(e)
		if raw, ok := ReferringEvidence(e); ok {
			t.Errorf("%s: stored by reference: %q", name, raw)
		}
	}
	e := acquisitionEvidence()
	raw, _ := ReferringEvidence(e)
	other := e.Lease.Clone()
	other.FencingToken++
	if _, ok := ExpandReferringEvidence(string(raw), other); ok {
		t.Error("rebuilt with a record of another token")
	}
	other = e.Lease.Clone()
	other.LeaseID = "lease_02"
	if _, ok := ExpandReferringEvidence(string(raw), other); ok {
		t.Error("rebuilt with a record of another lease")
	}
	if _, ok := ExpandReferringEvidence(string(raw), nil); ok {
		t.Error("rebuilt without a record")
	}
}

// A release's version 3 evidence rebuilds exactly from the record its
// release left (the history entry's), and from no other state of it.
func TestReferringReleaseEvidenceRebuildsFromItsEndedRecord(t *testing.T) {
	ended := validRecord()
	ended.State = StateReleased
	e := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("cd", 32), Code: CodeReleased,
		Lease: ended, BackendTime: ended.RenewedAt.Add(5 * time.Second)}
	want, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := ReferringEvidence(e)
	if !ok || len(raw)*4 > len(want) {
		t.Fatalf("ReferringEvidence: %q, %v; want version 3 under a quarter of %d bytes", raw, ok, len(want))
	}
	if got, ok := ExpandReferringEvidence(string(raw), ended.Clone()); !ok || got != string(want) {
		t.Fatalf("rebuilt:\n%s\nwant\n%s", got, want)
	}
	active := ended.Clone()
	active.State = StateActive
	renewed := ended.Clone()
	renewed.ExpiresAt = renewed.ExpiresAt.Add(time.Second)
	revoked := ended.Clone()
	revoked.State = StateRevoked
	for name, rec := range map[string]*Record{"active": active, "renewed after": renewed, "revoked": revoked} {
		if got, ok := ExpandReferringEvidence(string(raw), rec); ok {
			t.Errorf("rebuilt from the record %s: %s", name, got)
		}
	}
	revokedEv := *e
	revokedEv.Op, revokedEv.Code = OpRevoke, CodeRevoked
	if raw, ok := ReferringEvidence(&revokedEv); ok {
		t.Errorf("a revocation's evidence stored by reference: %q", raw)
	}
}

// The version 2 evidence DetachedEvidence splices from a history entry
// expands to exactly the document of the evidence ReferredEvidence
// rebuilds from the entry's record, for acquisitions renewed or not and
// for releases, over records whose every field differs; it refuses an
// entry of another lease or token, a release entry that differs, and a
// history entry in version 1.
func TestDetachedEvidenceExpandsAsReferred(t *testing.T) {
	for i, meta := range []Metadata{{}, {"source": "scheduler", "attempt": float64(3), "urgent": true}, {"k": "a b"}} {
		e := acquisitionEvidence()
		e.Lease.Metadata = meta
		e.Lease.OwnerClientID, e.Lease.OwnerCredentialID = "client_x"+string(rune('a'+i)), "key_y"
		acqRaw, ok := ReferringEvidence(e)
		if !ok {
			t.Fatal("acquisition not by reference")
		}
		for _, renew := range []time.Duration{0, 7 * time.Second} {
			final := e.Lease
			if renew > 0 {
				final = Renewed(e.Lease, 45*time.Second, e.Lease.AcquiredAt.Add(renew))
			}
			final = final.Clone()
			final.State = StateReleased
			ended := final.AcquiredAt.Add(renew + time.Second)
			rel := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("0f", 32), Code: CodeReleased,
				Lease: final, BackendTime: ended}
			relRaw, ok := ReferringEvidence(rel)
			if !ok {
				t.Fatal("release not by reference")
			}
			hist, err := CompactHistory(&HistoryEntry{HistoryVersion: HistoryVersion, Record: final, EndedAt: ended,
				EndedBy: final.OwnerPrincipalID, RequestID: "rel_01"})
			if err != nil || !strings.HasPrefix(string(hist), HistoryV2Prefix) {
				t.Fatalf("history entry: %q %v", hist, err)
			}
			for name, raw := range map[string][]byte{"acquisition": acqRaw, "release": relRaw} {
				got, ok := DetachedEvidence(string(raw), string(hist))
				if !ok || !strings.HasPrefix(string(got), EvidenceV2Prefix) {
					t.Fatalf("%s (renewed after %v): not detached: %q", name, renew, got)
				}
				want, ok := ExpandReferringEvidence(string(raw), final)
				if !ok {
					t.Fatalf("%s: does not rebuild", name)
				}
				if v1, ok := ExpandEvidence(string(got), final.Identity()); !ok || v1 != want {
					t.Fatalf("%s (renewed after %v) detached expands to\n%s\nwant\n%s", name, renew, v1, want)
				}
			}
			// Not this lease's entry, or a release entry that differs.
			other := final.Clone()
			other.FencingToken++
			otherHist, _ := CompactHistory(&HistoryEntry{HistoryVersion: HistoryVersion, Record: other, EndedAt: ended})
			if got, ok := DetachedEvidence(string(acqRaw), string(otherHist)); ok {
				t.Fatalf("detached with another token's entry: %q", got)
			}
			revoked := final.Clone()
			revoked.State = StateRevoked
			revokedHist, _ := CompactHistory(&HistoryEntry{HistoryVersion: HistoryVersion, Record: revoked, EndedAt: ended})
			if got, ok := DetachedEvidence(string(relRaw), string(revokedHist)); ok {
				t.Fatalf("a release detached with a revoked entry: %q", got)
			}
			v1Hist, _ := (&HistoryEntry{HistoryVersion: HistoryVersion, Record: final, EndedAt: ended}).Encode()
			if got, ok := DetachedEvidence(string(acqRaw), string(v1Hist)); ok {
				t.Fatalf("detached with a version 1 entry: %q", got)
			}
		}
	}
}
