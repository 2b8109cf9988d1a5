package lease

import (
	"strings"
	"testing"
)

// A version 4 entry decodes as its version 2 lines when each scope line
// is empty or the scope its own facts give; any other scope, a missing
// line, or no scope at all is corrupt.
func TestDecodeScopedHistory(t *testing.T) {
	r := validRecord()
	r.State = StateReleased
	h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: r, EndedAt: r.RenewedAt.Add(1000), EndedBy: r.OwnerPrincipalID, RequestID: "req_rel"}
	v2, err := CompactHistory(h)
	if err != nil || !strings.HasPrefix(string(v2), HistoryV2Prefix) {
		t.Fatalf("setup: %q %v", v2, err)
	}
	// Version 4 holds version 2's lines without the tag line (the sixth).
	lines := strings.SplitN(strings.TrimPrefix(string(v2), HistoryV2Prefix), "\n", 7)
	tag, _ := strings.CutPrefix(r.LockKey, KeyPrefix)
	if lines[5] != tag {
		t.Fatalf("setup: line 6 %q is not the tag", lines[5])
	}
	body := strings.Join(append(lines[:5:5], lines[6]), "\n")
	acq := IdempotencyScope(OpAcquire, r.LockKey, r.OwnerPrincipalID, r.RequestID)
	rel := IdempotencyScope(OpRelease, r.LockKey, h.EndedBy, h.RequestID)
	want, _ := h.Encode()
	for _, ok := range []string{acq + "\n" + rel, acq + "\n", "\n" + rel} {
		got, err := DecodeScopedHistory([]byte(HistoryScopedPrefix+ok+"\n"+body), r.LockKey)
		if err != nil {
			t.Fatalf("%q: %v", ok, err)
		}
		if b, _ := got.Encode(); string(b) != string(want) {
			t.Fatalf("%q decodes to\n%s\nwant\n%s", ok, b, want)
		}
	}
	if got, err := DecodeScopedHistory(v2, r.LockKey); err != nil || got.Record.LeaseID != r.LeaseID {
		t.Fatalf("version 2: %v", err)
	}
	other := IdempotencyScope(OpAcquire, r.LockKey, r.OwnerPrincipalID, "req_other")
	for name, bad := range map[string]string{
		"no scope":                      "\n\n" + body,
		"another acquisition's scope":   other + "\n" + rel + "\n" + body,
		"the scopes swapped":            rel + "\n" + acq + "\n" + body,
		"a release scope, not released": acq + "\n" + rel + "\n" + strings.Replace(body, "\nreleased\n", "\nrevoked\n", 1),
		"one scope line":                acq + "\n" + body,
		"a scope of another op":         IdempotencyScope(OpRenew, r.LockKey, r.OwnerPrincipalID, r.RequestID) + "\n\n" + body,
		"a damaged body":                acq + "\n\n" + strings.Replace(body, r.LeaseID, r.LeaseID+"\n", 1),
	} {
		if got, err := DecodeScopedHistory([]byte(HistoryScopedPrefix+bad), r.LockKey); err == nil || AsError(err).Code != CodeCorrupt {
			t.Errorf("%s: decoded %+v, %v", name, got, err)
		}
	}
	// Read under another identity's key, the tag put back is not its own.
	other2 := validRecord()
	other2.TargetID += "-other"
	otherKey := other2.Identity().lockKeyOfCanonical()
	if _, err := DecodeScopedHistory([]byte(HistoryScopedPrefix+acq+"\n\n"+body), otherKey); CodeOf(err) != CodeCorrupt {
		t.Errorf("a version 4 entry read under another lock key: %v", err)
	}
	// Other stores' readers take no version 4 entry.
	if _, err := DecodeStoredHistory([]byte(HistoryScopedPrefix + acq + "\n\n" + body)); err == nil {
		t.Error("DecodeStoredHistory took a version 4 entry")
	}
}

// A version 5 entry decodes as its version 2 lines with the tag of the
// lock key it is read under put back; under another identity's key, with
// a line missing or more, or damaged, it is corrupt, and other stores'
// readers take none.
func TestDecodeUntaggedHistory(t *testing.T) {
	r := validRecord()
	r.State = StateRevoked
	h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: r, EndedAt: r.RenewedAt.Add(1000), EndedBy: "prn_admin", RequestID: "req_revoke",
		Reason: "rotated", IncidentID: "inc_1"}
	v2, err := CompactHistory(h)
	if err != nil || !strings.HasPrefix(string(v2), HistoryV2Prefix) {
		t.Fatalf("setup: %q %v", v2, err)
	}
	lines := strings.SplitN(strings.TrimPrefix(string(v2), HistoryV2Prefix), "\n", 7)
	tag, _ := strings.CutPrefix(r.LockKey, KeyPrefix)
	if lines[5] != tag {
		t.Fatalf("setup: line 6 %q is not the tag", lines[5])
	}
	v5 := HistoryUntaggedPrefix + strings.Join(append(lines[:5:5], lines[6]), "\n")
	if !strings.Contains(v5, "\n\"rotated\"\n") {
		t.Fatalf("setup: no reason line in %q", v5)
	}
	want, _ := h.Encode()
	got, err := DecodeScopedHistory([]byte(v5), r.LockKey)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := got.Encode(); string(b) != string(want) {
		t.Fatalf("version 5 decodes to\n%s\nwant\n%s", b, want)
	}
	other := validRecord()
	other.TargetID += "-other"
	for name, c := range map[string]struct{ raw, lockKey string }{
		"another identity's key":        {v5, other.Identity().lockKeyOfCanonical()},
		"a lock key without the prefix": {v5, tag},
		"the tag kept":                  {HistoryUntaggedPrefix + strings.TrimPrefix(string(v2), HistoryV2Prefix), r.LockKey},
		"an ending line missing":        {strings.Replace(v5, "\n\"rotated\"\n", "\n", 1), r.LockKey},
		"metadata cut short":            {v5[:len(v5)-1], r.LockKey},
		"no lines":                      {HistoryUntaggedPrefix, r.LockKey},
	} {
		if got, err := DecodeScopedHistory([]byte(c.raw), c.lockKey); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: decoded %+v, %v", name, got, err)
		}
	}
	if _, err := DecodeStoredHistory([]byte(v5)); err == nil {
		t.Error("DecodeStoredHistory took a version 5 entry")
	}
}
