package lease

import (
	"strings"
	"testing"
	"time"
)

// historyEntries are ended entries of validRecord, one of each shape
// version 3 shortens: released by its owner (ended_by "="), revoked by an
// administrator with a reason and incident, expired with no ended_by,
// renewed (renewed_at spelled as ms after acquired), with metadata.
func historyEntries() map[string]*HistoryEntry {
	base := func(st State) *Record {
		r := validRecord()
		r.RenewedAt, r.ExpiresAt = r.AcquiredAt, r.AcquiredAt.Add(30*time.Second)
		r.State = st
		return r
	}
	renewed := Renewed(base(StateActive), 90*time.Second, validRecord().AcquiredAt.Add(20*time.Second))
	renewed.State = StateReleased
	meta := base(StateReleased)
	meta.Metadata = Metadata{"source": "scheduler", "attempt": float64(2)}
	at := func(r *Record, d time.Duration) Timestamp { return r.AcquiredAt.Add(d) }
	out := map[string]*HistoryEntry{}
	for name, h := range map[string]*HistoryEntry{
		"released by owner": {Record: base(StateReleased), EndedBy: validRecord().OwnerPrincipalID, RequestID: "rel-1"},
		"revoked":           {Record: base(StateRevoked), EndedBy: "prn-admin", RequestID: "rev-1", Reason: `quote " and \ "`, IncidentID: "inc-1"},
		"expired":           {Record: base(StateExpired)},
		"renewed":           {Record: renewed, EndedBy: renewed.OwnerPrincipalID, RequestID: "rel-2"},
		"metadata":          {Record: meta, EndedBy: meta.OwnerPrincipalID, RequestID: "rel-3"},
	} {
		h.HistoryVersion = HistoryVersion
		h.EndedAt = at(h.Record, 25*time.Second)
		out[name] = h
	}
	return out
}

// Version 3 rebuilds exactly the version 1 bytes of every shape, with the
// lock key of the key it is stored under, and is shorter than version 2 of
// the same entry by the hash tag and its shortenings.
func TestHistoryV3RoundTrip(t *testing.T) {
	for name, h := range historyEntries() {
		want, err := h.Encode()
		if err != nil {
			t.Fatal(err)
		}
		v3, err := CompactHistoryAt(h)
		if err != nil || !strings.HasPrefix(string(v3), HistoryV3Prefix) {
			t.Fatalf("%s: %q, %v; want version 3", name, v3, err)
		}
		v2, _ := CompactHistory(h)
		if len(v3) > len(v2)-60 {
			t.Errorf("%s: version 3 is %d bytes, version 2 %d", name, len(v3), len(v2))
		}
		if got, ok := ExpandHistoryAt(string(v3), h.Record.LockKey); !ok || got != string(want) {
			t.Fatalf("%s: rebuilt\n%s\nwant\n%s", name, got, want)
		}
		got, err := DecodeStoredHistoryAt(v3, h.Record.LockKey)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b, _ := got.Encode(); string(b) != string(want) {
			t.Fatalf("%s: decoded to\n%s", name, b)
		}
		// Without its lock key (Valkey's readers), or under another
		// identity's, version 3 is corrupt.
		if _, err := DecodeStoredHistory(v3); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: decoded without a lock key: %v", name, err)
		}
		other := KeyPrefix + strings.Repeat("A", 43)
		if _, err := DecodeStoredHistoryAt(v3, other); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: decoded under another lock key: %v", name, err)
		}
		// Versions 1 and 2 read as before through the same entry point.
		for _, old := range [][]byte{want, v2} {
			if got, err := DecodeStoredHistoryAt(old, h.Record.LockKey); err != nil {
				t.Errorf("%s: %.3s does not decode: %v", name, old, err)
			} else if b, _ := got.Encode(); string(b) != string(want) {
				t.Errorf("%s: %.3s decoded to\n%s", name, old, b)
			}
		}
	}
	// A shape version 3 cannot spell exactly falls back to version 2: an
	// ending before the acquisition (a negative offset). ("=" for the
	// owner is unambiguous: no principal id may hold it.)
	h := historyEntries()["revoked"]
	h.EndedAt = h.Record.AcquiredAt.Add(-time.Second)
	if v, err := CompactHistoryAt(h); err != nil || !strings.HasPrefix(string(v), HistoryV2Prefix) {
		t.Errorf("ended before acquired: %q, %v; want version 2", v, err)
	}
	if _, err := (&HistoryEntry{HistoryVersion: HistoryVersion, Record: h.Record, EndedAt: h.Record.AcquiredAt, EndedBy: "="}).Encode(); err == nil {
		t.Error(`a principal id "=" encodes`)
	}
}

// Version 3 is read strictly: a missing or extra line, a number that is
// not canonical decimal, a shortening spelled another way (the owner
// spelled out, a renewal 0 ms after the acquisition), an unknown state
// letter, or a lock key that is not one all fail as corrupt.
func TestHistoryV3StrictDecode(t *testing.T) {
	h := historyEntries()["released by owner"]
	v3, err := CompactHistoryAt(h)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(v3), "\n")
	if len(lines) != hv3Lines || lines[hv3By] != "=" || lines[hv3Record+factRenewed] != "" || lines[hv3Record+factState] != "r" {
		t.Fatalf("version 3 lines: %q", lines)
	}
	edit := func(f func(l []string) []string) string {
		return strings.Join(f(append([]string(nil), lines...)), "\n")
	}
	for name, bad := range map[string]string{
		"truncated":              edit(func(l []string) []string { return l[:len(l)-1] }),
		"extra line":             edit(func(l []string) []string { return append(l, "{}") }),
		"line missing mid-way":   edit(func(l []string) []string { return append(l[:hv3Incident:hv3Incident], l[hv3Incident+1:]...) }),
		"ended with leading 0":   edit(func(l []string) []string { l[hv3Ended] = "0" + l[hv3Ended]; return l }),
		"ended negative":         edit(func(l []string) []string { l[hv3Ended] = "-" + l[hv3Ended]; return l }),
		"expires not a number":   edit(func(l []string) []string { l[hv3Record+factExpires] = "3e4"; return l }),
		"acquired with a sign":   edit(func(l []string) []string { l[hv3Record+factAcquired] = "+" + l[hv3Record+factAcquired]; return l }),
		"renewed 0 after":        edit(func(l []string) []string { l[hv3Record+factRenewed] = "0"; return l }),
		"renewed with leading 0": edit(func(l []string) []string { l[hv3Record+factRenewed] = "01"; return l }),
		"owner spelled out":      edit(func(l []string) []string { l[hv3By] = l[hv3Record+factOwner]; return l }),
		"state spelled out":      edit(func(l []string) []string { l[hv3Record+factState] = "released"; return l }),
		"unknown state letter":   edit(func(l []string) []string { l[hv3Record+factState] = "x"; return l }),
		"another version":        edit(func(l []string) []string { l[0] = "hv4"; return l }),
	} {
		if _, err := DecodeStoredHistoryAt([]byte(bad), h.Record.LockKey); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: %q decoded: %v", name, bad, err)
		}
	}
	for _, key := range []string{"", strings.TrimPrefix(h.Record.LockKey, KeyPrefix), KeyPrefix} {
		if _, err := DecodeStoredHistoryAt(v3, key); CodeOf(err) != CodeCorrupt {
			t.Errorf("lock key %q: decoded: %v", key, err)
		}
	}
}
