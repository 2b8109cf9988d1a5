package lease

// Review of the history version 2 change (CompactHistory,
// DecodeStoredHistory). Each test tries to break one promise; see the
// review report.

import (
	"bytes"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// rhAlphabet are the pieces hostile reasons are built of: quotes,
// backslashes, JSON and hv2 fragments, HTML characters, non-ASCII, and
// characters CheckReason must refuse (control, format, separators,
// invalid UTF-8).
var rhAlphabet = []string{"a", "Z", " ", `"`, `\`, `\n`, `\u0000`, "<", ">", "&", "{", "}", ",", ":", "[", "]",
	"hv2", "\n", "\r", "\t", "\x00", "\x7f", "\u0085", "\u00a0", "\u200b", "\ufeff", "\u2028", "\u2029",
	"é", "ü", "😀", "\ufffd", "\xff", "\xc3", `"},"ended_by":"prn_forged","state":"active`, "\nprn_forged\n",
	`","fencing_token":999,"x":"`, "ℌ", "ﬀ", "Ⅸ"}

func rhString(r *rand.Rand, maxPieces int) string {
	var b strings.Builder
	for n := r.Intn(maxPieces + 1); n > 0; n-- {
		b.WriteString(rhAlphabet[r.Intn(len(rhAlphabet))])
	}
	return b.String()
}

// rhOpaque returns an opaque id, sometimes empty, sometimes invalid.
func rhOpaque(r *rand.Rand) string {
	switch r.Intn(6) {
	case 0:
		return ""
	case 1:
		return rhString(r, 3)
	case 2:
		return "prn:a.b_c-" + fmt.Sprint(r.Intn(1000))
	default:
		return fmt.Sprintf("id_%d", r.Intn(1_000_000))
	}
}

func rhMetadata(r *rand.Rand) Metadata {
	switch r.Intn(4) {
	case 0:
		return nil
	case 1:
		return Metadata{}
	}
	m := Metadata{}
	for n := 1 + r.Intn(4); n > 0; n-- {
		k := fmt.Sprintf("k%d", r.Intn(50))
		switch r.Intn(5) {
		case 0:
			m[k] = rhString(r, 6)
		case 1:
			m[k] = r.Float64() * 1e300
		case 2:
			m[k] = r.Intn(2) == 0
		case 3:
			m[k] = nil
		default:
			m[k] = float64(r.Intn(1 << 20))
		}
	}
	return m
}

// rhEntry returns a random history entry, valid or not.
func rhEntry(r *rand.Rand) *HistoryEntry {
	h := validHistory()
	h.Record.State = []State{StateReleased, StateRevoked, StateExpired, StateActive}[r.Intn(4)]
	h.EndedBy, h.RequestID, h.IncidentID = rhOpaque(r), rhOpaque(r), rhOpaque(r)
	if r.Intn(4) == 0 {
		h.Reason = ""
	} else {
		h.Reason = rhString(r, 12)
	}
	if r.Intn(20) == 0 { // the longest reasons
		h.Reason = strings.Repeat("é", MaxReasonBytes/2)
	}
	h.Record.Metadata = rhMetadata(r)
	if r.Intn(3) == 0 {
		h.Record.TraceID = ""
	}
	if r.Intn(3) == 0 { // a non-ASCII identity
		id := contractIdentity()
		id.TargetID = "ziel-é-" + fmt.Sprint(r.Intn(9))
		h.Record.SetIdentity(id)
	}
	h.EndedAt = UnixMilli(msRenewed + int64(r.Intn(1_000_000)))
	h.Record.FencingToken = uint64(1 + r.Int63n(int64(MaxFencingToken)))
	return h
}

// ATTACK 1: random hostile entries through CompactHistory and
// DecodeStoredHistory. Whatever Encode accepts must read back as exactly
// its version 1 encoding; whatever it refuses CompactHistory must refuse;
// an hv2 entry has exactly Hv2Lines lines and its ended_by, state and
// token lines are the entry's (no reason or metadata shifted a line).
func TestReviewHistHostileRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(20261204))
	var v2, v1only, refused int
	for i := 0; i < 20000; i++ {
		h := rhEntry(r)
		v1, encErr := h.Encode()
		b, err := CompactHistory(h)
		if encErr != nil {
			refused++
			if err == nil {
				t.Fatalf("entry Encode refuses (%v) was compacted: %q", encErr, b)
			}
			continue
		}
		if err != nil {
			t.Fatalf("CompactHistory refused an entry Encode takes: %v", err)
		}
		got, err := DecodeStoredHistory(b)
		if err != nil {
			t.Fatalf("stored %q does not read back: %v (reason %q)", b, err, h.Reason)
		}
		if again, _ := got.Encode(); !bytes.Equal(again, v1) {
			t.Fatalf("read back\n%s\nwant\n%s", again, v1)
		}
		if again, _ := CompactHistory(got); !bytes.Equal(again, b) {
			t.Fatalf("re-compacted\n%q\nstored\n%q", again, b)
		}
		if !bytes.HasPrefix(b, []byte(HistoryV2Prefix)) {
			v1only++
			if !bytes.Equal(b, v1) {
				t.Fatalf("fallback is not version 1: %q", b)
			}
			continue
		}
		v2++
		lines := strings.Split(string(b), "\n")
		if len(lines) != Hv2Lines || lines[Hv2By] != h.EndedBy || lines[Hv2Record+15] != string(h.Record.State) ||
			lines[Hv2Record+5] != fmt.Sprint(h.Record.FencingToken) || lines[Hv2Request] != h.RequestID || lines[Hv2Incident] != h.IncidentID {
			t.Fatalf("lines shifted (%d lines): %q", len(lines), b)
		}
		if got.EndedBy != h.EndedBy || got.Reason != h.Reason || got.IncidentID != h.IncidentID || got.RequestID != h.RequestID ||
			got.Record.State != h.Record.State || got.Record.FencingToken != h.Record.FencingToken || got.EndedAt.UnixMilli() != h.EndedAt.UnixMilli() {
			t.Fatalf("read back %+v, want %+v", got, h)
		}
	}
	t.Logf("%d version 2, %d version 1 fallbacks, %d refused", v2, v1only, refused)
	if v2 == 0 || refused == 0 {
		t.Fatalf("the grid does not cover both outcomes: %d v2, %d refused", v2, refused)
	}
}

// rhMutations returns edits of a valid hv2 entry b: every line replaced by
// a set of hostile spellings, lines swapped, removed, duplicated, and
// random byte edits.
func rhMutations(b []byte, r *rand.Rand) [][]byte {
	lines := strings.Split(string(b), "\n")
	join := func(f []string) []byte { return []byte(strings.Join(f, "\n")) }
	var out [][]byte
	spellings := []string{"", " ", "0", "00", "01", "-1", "+1", "1e3", "1.0", "9999999999999999", "99999999999999999",
		`"`, `\`, `""`, `"x" `, ` "x"`, `"\u0061"`, `"a","b"`, `"a"}`, `null`, `{}`, `{ }`, `{"a":1} `, `[]`, `{"a":1,"a":2}`,
		"released", "revoked", "expired", "active", "Released", "prn_forged", "é", "\u2028", "\xff", "\r", "hv2",
		`{"a":"\u003c"}`, `{"a":"<"}`, `{"b":1,"a":2}`}
	for i := 1; i < len(lines); i++ {
		for _, s := range spellings {
			f := append([]string(nil), lines...)
			f[i] = s
			out = append(out, join(f))
			f[i] = lines[i] + s
			out = append(out, join(f))
		}
		for j := i + 1; j < len(lines); j++ {
			f := append([]string(nil), lines...)
			f[i], f[j] = f[j], f[i]
			out = append(out, join(f))
		}
		f := append(append([]string(nil), lines[:i]...), lines[i+1:]...)
		out = append(out, join(f))
		f = append(append(append([]string(nil), lines[:i+1]...), lines[i]), lines[i+1:]...)
		out = append(out, join(f))
	}
	for i := 0; i < 20000; i++ {
		m := bytes.Clone(b)
		for n := 1 + r.Intn(3); n > 0; n-- {
			m[r.Intn(len(m))] = "\n\"\\0123456789{}ab \x00\xff,:"[r.Intn(22)]
		}
		out = append(out, m)
	}
	return append(out, []byte("hv2"), []byte("hv2\n"), []byte("hv2\r\n"+string(b[4:])), []byte("HV2\n"+string(b[4:])),
		append(bytes.Clone(b), '\n'), append(bytes.Clone(b), ' '), []byte(" "+string(b)), nil, []byte{})
}

func rhSeeds(t *testing.T) [][]byte {
	t.Helper()
	var seeds [][]byte
	for _, edit := range []func(*HistoryEntry){
		func(h *HistoryEntry) {},
		func(h *HistoryEntry) {
			h.Reason = `a "quoted" \ reason é <&>`
			h.Record.Metadata = Metadata{"n": 1.5, "s": "x\ny"}
		},
		func(h *HistoryEntry) {
			h.Reason, h.EndedBy, h.RequestID, h.IncidentID = "", "", "", ""
			h.Record.State = StateExpired
		},
	} {
		h := validHistory()
		edit(h)
		b, err := CompactHistory(h)
		if err != nil || !bytes.HasPrefix(b, []byte(HistoryV2Prefix)) {
			t.Fatalf("seed: %q, %v", b, err)
		}
		seeds = append(seeds, b)
	}
	return seeds
}

// ATTACK 2: corrupt hv2 entries. One that decodes must be the one
// canonical hv2 spelling of what it decodes to (CompactHistory of the
// result gives back the same bytes): no second spelling of an entry is
// accepted, so an entry that decodes says what its bytes say and nothing
// was guessed. Everything else is a corrupt error.
func TestReviewHistCorruptEntriesFailClosed(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	c := spellings[*HistoryEntry]{decode: DecodeStoredHistory, compact: CompactHistory}
	for _, seed := range rhSeeds(t) {
		for _, m := range rhMutations(seed, r) {
			c.check(t, m)
		}
	}
	t.Logf("%d mutations accepted (each canonical), %d refused", c.accepted, c.refused)
}

// oldValkeyHistory is the Valkey adapter's History reading of one entry
// before the change (valkey/reads.go at HEAD~1).
func oldValkeyHistory(raw string) (*HistoryEntry, error) {
	raw, ok := ExpandHistory(raw)
	h, err := DecodeHistoryEntry([]byte(raw))
	if !ok {
		h, err = nil, Errorf(CodeCorrupt, "history entry is malformed")
	}
	return h, err
}

// oldValkeyFind is the Valkey adapter's findHistory before the change.
func oldValkeyFind(entries []string, leaseID string) *HistoryEntry {
	for _, e := range entries {
		e, ok := ExpandHistory(e)
		if !ok {
			continue
		}
		if h := MatchHistory([]byte(e), leaseID); h != nil {
			return h
		}
	}
	return nil
}

// ATTACK 3: the Valkey adapter's readers must behave exactly as before:
// DecodeStoredHistory accepts and refuses what ExpandHistory then
// DecodeHistoryEntry did, with the same entry and the same error code, on
// valid version 1 and 2 entries and every corruption of ATTACK 2, and
// findHistory finds the same entry.
func TestReviewHistValkeyReadersUnchanged(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	var corpus [][]byte
	for _, seed := range rhSeeds(t) {
		v1, ok := ExpandHistory(string(seed))
		if !ok {
			t.Fatal("seed does not expand")
		}
		corpus = append(corpus, seed, []byte(v1), []byte(v1+" "), []byte(strings.Replace(v1, `"revoked"`, `"active"`, 1)))
		corpus = append(corpus, rhMutations(seed, r)...)
	}
	for _, raw := range corpus {
		want, werr := oldValkeyHistory(string(raw))
		got, gerr := DecodeStoredHistory(raw)
		if (werr == nil) != (gerr == nil) || (werr != nil && CodeOf(werr) != CodeOf(gerr)) || !reflect.DeepEqual(want, got) {
			t.Fatalf("%q: before %+v, %v; now %+v, %v", raw, want, werr, got, gerr)
		}
	}
	for i := 0; i+3 <= len(corpus); i += 3 {
		entries := []string{string(corpus[i]), string(corpus[i+1]), string(corpus[i+2])}
		for _, id := range []string{"lease_01", "lease_02", ""} {
			if want, got := oldValkeyFind(entries, id), valkeyFindNow(entries, id); !reflect.DeepEqual(want, got) {
				t.Fatalf("findHistory %q in %q: before %+v, now %+v", id, entries, want, got)
			}
		}
	}
}

// valkeyFindNow is the Valkey adapter's findHistory after the change.
func valkeyFindNow(entries []string, leaseID string) *HistoryEntry {
	for _, e := range entries {
		if h, err := DecodeStoredHistory([]byte(e)); err == nil && h.Record.LeaseID == leaseID {
			return h
		}
	}
	return nil
}
