package lease

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Review s40d: adversarial pairs (ev3, hv2) for DetachedEvidence. For every
// pair it accepts whose history entry strictly decodes (dropHistory's
// guard), the spliced version 2 read for the request's identity must either
// fail closed (not expand, or not strictly decode) or give exactly the
// document ExpandReferringEvidence gives from the decoded entry's record.

// s40dBases are history entries (compact, version 2) with the version 3
// evidence that may refer to them.
func s40dBases(t *testing.T) (hists [][]byte, evs [][]byte) {
	t.Helper()
	metas := []Metadata{
		{},
		{"k": "hv2\nev2\n\"x\"", "n": float64(7)},  // tag-like text, quotes
		{"k": "<&> \u2028 é", "z": nil, "b": true}, // html escapes, separators
	}
	for mi, meta := range metas {
		e := acquisitionEvidence()
		e.Lease.Metadata = meta
		e.Lease.TraceID = "trace_" + strconv.Itoa(mi)
		acq, ok := ReferringEvidence(e)
		if !ok {
			t.Fatalf("meta %d: acquisition not by reference", mi)
		}
		evs = append(evs, acq)
		for _, renew := range []time.Duration{0, 7 * time.Second} {
			final := e.Lease
			if renew > 0 {
				final = Renewed(e.Lease, 45*time.Second, e.Lease.AcquiredAt.Add(renew))
			}
			for _, st := range []State{StateReleased, StateExpired, StateRevoked} {
				f := final.Clone()
				f.State = st
				ended := f.AcquiredAt.Add(renew + time.Second)
				for _, end := range []HistoryEntry{
					{EndedBy: f.OwnerPrincipalID, RequestID: "rel_01"},
					{EndedBy: "prn_admin_01", RequestID: "force_01", Reason: `operator "said"\u00e9 hv2`, IncidentID: "inc_01"},
				} {
					end.HistoryVersion, end.Record, end.EndedAt = HistoryVersion, f, ended
					hb, err := CompactHistory(&end)
					if err != nil {
						t.Fatal(err)
					}
					if !strings.HasPrefix(string(hb), HistoryV2Prefix) {
						continue
					}
					hists = append(hists, hb)
				}
				if st == StateReleased {
					rel := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("0f", 32),
						Code: CodeReleased, Lease: f, BackendTime: ended}
					rb, ok := ReferringEvidence(rel)
					if !ok {
						t.Fatal("release not by reference")
					}
					evs = append(evs, rb)
				}
			}
		}
	}
	return hists, evs
}

// s40dLineMutants returns v with each line (from 1) changed in ways a
// damaged or foreign value might be, plus lines removed and added.
func s40dLineMutants(v string) []string {
	lines := strings.Split(v, "\n")
	edits := []func(string) string{
		func(s string) string { return "0" + s },
		func(s string) string { return s + "0" },
		func(s string) string { return s + "\n" },
		func(s string) string { return s + "\nx" },
		func(s string) string { return "\n" + s },
		func(s string) string { return "" },
		func(s string) string { return `"` },
		func(s string) string { return s + `\` },
		func(s string) string { return "9999999999999999" },
		func(s string) string { return "0" },
		func(s string) string { return "1" },
		func(s string) string { return "active" },
		func(s string) string { return "released" },
		func(s string) string { return "{}" },
		func(s string) string { return "{ }" },
		func(s string) string { return `{"a":1.0}` },
		func(s string) string { return "{}\nactive" },
		func(s string) string { return s + " " },
		func(s string) string { return strings.ToUpper(s) },
		func(s string) string {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return strconv.FormatInt(n+1, 10)
			}
			return s + "1"
		},
		func(s string) string {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return strconv.FormatInt(n-1, 10)
			}
			return s
		},
	}
	var out []string
	for i := 1; i < len(lines); i++ {
		for _, ed := range edits {
			c := append([]string(nil), lines...)
			c[i] = ed(c[i])
			out = append(out, strings.Join(c, "\n"))
		}
		// Remove line i; duplicate line i.
		out = append(out, strings.Join(append(append([]string(nil), lines[:i]...), lines[i+1:]...), "\n"))
		out = append(out, strings.Join(append(append(append([]string(nil), lines[:i+1]...), lines[i]), lines[i+1:]...), "\n"))
		// Swap with the next line.
		if i+1 < len(lines) {
			c := append([]string(nil), lines...)
			c[i], c[i+1] = c[i+1], c[i]
			out = append(out, strings.Join(c, "\n"))
		}
	}
	return out
}

func TestReviewS40dDetachedEvidenceNeverAnotherDocument(t *testing.T) {
	hists, evs := s40dBases(t)
	// One side mutated at a time (the cross product is too large to run
	// beside the CI): every ev3 mutant against every entry, every hv2
	// mutant against every original ev3.
	type pair struct{ ev, hv string }
	var all []pair
	var evMut []string
	for _, e := range evs {
		evMut = append(evMut, string(e))
		evMut = append(evMut, s40dLineMutants(string(e))...)
	}
	for _, h := range hists {
		for _, e := range evMut {
			all = append(all, pair{e, string(h)})
		}
		for _, hm := range s40dLineMutants(string(h)) {
			for _, e := range evs {
				all = append(all, pair{string(e), hm})
			}
		}
	}
	other := contractIdentity()
	other.TargetID = "other-target"
	var pairs, detached, guarded, guardedReadable, same, closed, lost int
	decoded := map[string]*HistoryEntry{}
	decErr := map[string]error{}
	for _, p := range all {
		ev, hv := p.ev, p.hv
		{
			pairs++
			h, seen := decoded[hv]
			herr := decErr[hv]
			if !seen {
				h, herr = DecodeStoredHistory([]byte(hv))
				decoded[hv], decErr[hv] = h, herr
			}
			got, ok := DetachedEvidence(ev, hv)
			if !ok {
				continue
			}
			detached++
			if herr != nil {
				// dropHistory never detaches with this entry; note only
				// whether the function alone would have made readable evidence.
				guarded++
				if v1, ok := ExpandEvidence(string(got), contractIdentity()); ok {
					if _, err := DecodeIdempotencyRecord([]byte(v1)); err == nil {
						guardedReadable++
					}
				}
				continue
			}
			want, wok := ExpandReferringEvidence(ev, h.Record)
			wantDecodes := false
			if wok {
				_, err := DecodeIdempotencyRecord([]byte(want))
				wantDecodes = err == nil
			}
			for _, id := range []Identity{h.Record.Identity(), contractIdentity(), other} {
				v1, why := readDetached(got, id)
				if why != "" {
					if id == h.Record.Identity() {
						closed++
						if wantDecodes {
							lost++
							t.Errorf("detached evidence %s though the referred does:\nev3 %q\nhv2 %q\nev2 %q", why, ev, hv, got)
						}
					}
					continue
				}
				if !wok || v1 != want {
					t.Fatalf("COUNTEREXAMPLE: detached reads as another document\nev3 %q\nhv2 %q\nid %+v\nev2 %q\ngot  %s\nwant %s (ok %v)",
						ev, hv, id, got, v1, want, wok)
				}
				if id == h.Record.Identity() {
					same++
				}
			}
		}
	}
	t.Logf("pairs %d, detached %d (entry does not decode: %d, of which the splice alone reads: %d), same document %d, fail closed %d, lost %d",
		pairs, detached, guarded, guardedReadable, same, closed, lost)
	if same == 0 {
		t.Fatal("no pair detached at all")
	}
}

// readDetached is detached evidence as a caller reads it for id: its
// version 1 document, or why it fails closed.
func readDetached(ev2 []byte, id Identity) (v1, why string) {
	v1, ok := ExpandEvidence(string(ev2), id)
	if !ok {
		return "", "does not expand"
	}
	if _, err := DecodeIdempotencyRecord([]byte(v1)); err != nil {
		return "", fmt.Sprintf("does not decode (%v)", err)
	}
	return v1, ""
}
