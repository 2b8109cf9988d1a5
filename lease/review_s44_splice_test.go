package lease

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// s44Case is one lease life: the acquisition as granted, its final
// record (renewed or not, ended in some state) and its history entry.
type s44Case struct {
	name string
	acq  *IdempotencyRecord
	rel  *IdempotencyRecord // nil unless released
	h    *HistoryEntry
}

func s44Cases() []s44Case {
	metas := map[string]Metadata{
		"nil":     nil,
		"empty":   {},
		"escapes": {"q": `a"b\c`, "html": "<>&", "ls": "\u2028\u2029", "uni": "é日本🙂", "ctl": "\x01\t\n"},
		"numbers": {"n1": json.Number("1.0"), "n2": json.Number("1e2"), "f": 1e21, "i": int64(1) << 60, "u": uint64(1<<63 + 1), "neg": -1.5},
		"scalars": {"b": true, "z": nil, "s": ""},
	}
	type life struct {
		name                 string
		token                uint64
		ttl0, lifetime       int64
		renewAfter, renewTTL int64 // 0: no renewal
		endAfter             int64 // ms after the last renewal (or acquisition)
		state                State
		by, req, reason, inc string
	}
	lives := []life{
		{"released by owner", 42, 30000, 300000, 0, 0, 5000, StateReleased, "=", "rel_1", "", ""},
		{"released same ms", 1, 30000, 300000, 0, 0, 0, StateReleased, "=", "rel_1", "", ""},
		{"renewed then released", 9007199254740991, 30000, 300000, 20000, 90000, 1, StateReleased, "=", "rel_2", "", ""},
		{"renew capped by lifetime", 7, 30000, 40000, 20000, 90000, 1, StateReleased, "=", "rel_3", "", ""},
		{"acq capped by lifetime", 7, 30000, 30000, 0, 0, 10, StateReleased, "=", "rel_3", "", ""},
		{"ttl 1 lifetime 1", 8, 1, 1, 0, 0, 0, StateReleased, "=", "rel_3", "", ""},
		{"expired", 3, 30000, 300000, 0, 0, 30000, StateExpired, "", "", "", ""},
		{"revoked with reason", 4, 30000, 300000, 1000, 30000, 5, StateRevoked, "prn_admin", "rev_1", `he said "no" \ é <>&`, "inc_1"},
		{"force released", 5, 30000, 300000, 0, 0, 5, StateReleased, "prn_admin", "frc_1", "why", ""},
		{"released by another, no request", 6, 30000, 300000, 0, 0, 5, StateReleased, "prn_admin", "", "", ""},
		{"long ttl", 10, 24 * 3600 * 1000, 7 * 24 * 3600 * 1000, 0, 0, 5, StateReleased, "=", "rel_x", "", ""},
	}
	var out []s44Case
	for mname, meta := range metas {
		for _, l := range lives {
			r := validRecord()
			r.Metadata = meta
			r.FencingToken = l.token
			r.TTLMs, r.MaximumLifetimeMs = l.ttl0, l.lifetime
			r.RenewedAt = r.AcquiredAt
			r.ExpiresAt = LeaseExpiry(r.AcquiredAt, time.Duration(l.ttl0)*time.Millisecond, r.AcquiredAt, time.Duration(l.lifetime)*time.Millisecond)
			r.State = StateActive
			acq := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpAcquire, Digest: strings.Repeat("0f", 32), Code: CodeAcquired,
				Lease: r.Clone(), BackendTime: r.AcquiredAt}
			final := r.Clone()
			if l.renewAfter > 0 {
				final = Renewed(final, time.Duration(l.renewTTL)*time.Millisecond, final.AcquiredAt.Add(time.Duration(l.renewAfter)*time.Millisecond))
			}
			final.State = l.state
			by := l.by
			if by == "=" {
				by = final.OwnerPrincipalID
			}
			endedAt := final.RenewedAt.Add(time.Duration(l.endAfter) * time.Millisecond)
			if l.state == StateExpired {
				endedAt = final.ExpiresAt
			}
			h := &HistoryEntry{HistoryVersion: HistoryVersion, Record: final, EndedAt: endedAt, EndedBy: by, RequestID: l.req,
				Reason: l.reason, IncidentID: l.inc}
			c := s44Case{name: mname + "/" + l.name, acq: acq, h: h}
			if l.state == StateReleased {
				c.rel = &IdempotencyRecord{Version: IdempotencyVersion, Op: OpRelease, Digest: strings.Repeat("f0", 32),
					Code: CodeReleased, Lease: final.Clone(), BackendTime: endedAt}
			}
			out = append(out, c)
		}
	}
	return out
}

// The splice must equal the fallback (rebuild, then CompactEvidence) and
// expand to the original's version 1 bytes, for every entry form.
func TestS44SpliceEqualsFallback(t *testing.T) {
	n := 0
	for _, c := range s44Cases() {
		hv3, err := CompactHistoryAt(c.h)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		hv2, err := CompactHistory(c.h)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lockKey := c.h.Record.LockKey
		for _, ev := range []*IdempotencyRecord{c.acq, c.rel} {
			if ev == nil {
				continue
			}
			want, err := ev.Encode()
			if err != nil {
				t.Fatalf("%s: encode: %v", c.name, err)
			}
			raw, ok := LeanEvidence(ev)
			if !ok {
				t.Logf("%s %s: not lean", c.name, ev.Op)
				continue
			}
			for _, hist := range [][]byte{hv3, hv2} {
				dec, err := DecodeStoredHistoryAt(hist, lockKey)
				if err != nil {
					t.Logf("%s: %.3s does not decode: %v", c.name, hist, err)
					continue
				}
				// read path
				v1, ok := ExpandLeanEvidence(string(raw), dec.Record, dec.EndedAt)
				if !ok || v1 != string(want) {
					t.Errorf("%s %s %.3s: read path %v\n%s\nwant\n%s", c.name, ev.Op, hist, ok, v1, want)
				}
				re, ok := LeanReferredEvidence(string(raw), dec.Record, dec.EndedAt)
				var fb []byte
				if ok {
					fb, _ = CompactEvidence(re, dec.Record.Identity())
				}
				sp, sok := DetachedLeanEvidence(string(raw), string(hist), lockKey, dec.Record.Identity())
				n++
				if sok != ok || (sok && string(sp) != string(fb)) {
					t.Errorf("%s %s %.3s: splice %v %q\nfallback %v %q", c.name, ev.Op, hist, sok, sp, ok, fb)
				}
				if sok {
					x, ok := ExpandEvidence(string(sp), c.h.Record.Identity())
					if !ok || x != string(want) {
						t.Errorf("%s %s: splice expands %v\n%s\nwant\n%s", c.name, ev.Op, ok, x, want)
					}
					if _, err := DecodeIdempotencyRecord([]byte(x)); err != nil {
						t.Errorf("%s: %v", c.name, err)
					}
				}
			}
		}
	}
	t.Logf("%d splices compared", n)
}

// Damaged entries: every single-line edit of a version 3 entry that the
// strict decoder still accepts must make the splice agree with the read
// path (never splice what the read path refuses).
func TestS44SpliceNeverAcceptsWhatReadRefuses(t *testing.T) {
	edits := []func(string) string{
		func(s string) string { return s + "0" },
		func(s string) string { return "1" + s },
		func(s string) string { return "" },
		func(s string) string { return "=" },
		func(s string) string { return "r" },
		func(s string) string { return "a" },
		func(s string) string { return "e" },
		func(s string) string { return "v" },
		func(s string) string { return "{}" },
		func(s string) string { return `{"a":1}` },
		func(s string) string {
			if len(s) > 0 {
				return s[:len(s)-1]
			}
			return s
		},
	}
	tried, agreed := 0, 0
	for _, c := range s44Cases() {
		hv3, _ := CompactHistoryAt(c.h)
		hv2, _ := CompactHistory(c.h)
		lockKey := c.h.Record.LockKey
		for _, ev := range []*IdempotencyRecord{c.acq, c.rel} {
			if ev == nil {
				continue
			}
			raw, ok := LeanEvidence(ev)
			if !ok {
				continue
			}
			for _, hist := range [][]byte{hv3, hv2} {
				lines := strings.Split(string(hist), "\n")
				for i := 1; i < len(lines); i++ {
					for _, ed := range edits {
						f := append([]string(nil), lines...)
						f[i] = ed(f[i])
						bad := strings.Join(f, "\n")
						if bad == string(hist) {
							continue
						}
						dec, err := DecodeStoredHistoryAt([]byte(bad), lockKey)
						if err != nil || dec.Record.LockKey != lockKey {
							continue
						}
						tried++
						_, readOK := ExpandLeanEvidence(string(raw), dec.Record, dec.EndedAt)
						sp, sok := DetachedLeanEvidence(string(raw), bad, lockKey, dec.Record.Identity())
						if sok && !readOK {
							t.Errorf("%s %s line %d edited to %q: spliced %q where the read path refuses", c.name, ev.Op, i, f[i], sp)
						}
						if sok == readOK {
							agreed++
						}
					}
				}
			}
		}
	}
	t.Logf("%d damaged entries that decode; %d agreed", tried, agreed)
}

// Pool: concurrent LeanEvidence and DetachedLeanEvidence with different
// inputs never mix their results.
func TestS44PoolConcurrent(t *testing.T) {
	cases := s44Cases()
	type exp struct {
		raw   string
		sp    string
		ev    *IdempotencyRecord
		hist  string
		lockK string
		ident Identity
	}
	var exps []exp
	for _, c := range cases {
		hv3, _ := CompactHistoryAt(c.h)
		for _, ev := range []*IdempotencyRecord{c.acq, c.rel} {
			if ev == nil {
				continue
			}
			raw, ok := LeanEvidence(ev)
			if !ok {
				continue
			}
			sp, ok := DetachedLeanEvidence(string(raw), string(hv3), c.h.Record.LockKey, c.h.Record.Identity())
			if !ok {
				continue
			}
			exps = append(exps, exp{string(raw), string(sp), ev, string(hv3), c.h.Record.LockKey, c.h.Record.Identity()})
		}
	}
	// a big metadata grows the pooled buffer
	big := validRecord()
	big.Metadata = Metadata{}
	for i := 0; i < 32; i++ {
		big.Metadata[fmt.Sprintf("k%02d", i)] = strings.Repeat("x", 100)
	}
	big.RenewedAt = big.AcquiredAt
	big.ExpiresAt = big.AcquiredAt.Add(30 * time.Second)
	bigEv := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpAcquire, Digest: strings.Repeat("ab", 32), Code: CodeAcquired, Lease: big, BackendTime: big.AcquiredAt}
	bigRaw, ok := LeanEvidence(bigEv)
	if !ok {
		t.Fatal("big not lean")
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				e := exps[(i+g)%len(exps)]
				raw, ok := LeanEvidence(e.ev)
				if !ok || string(raw) != e.raw {
					t.Errorf("lean %q want %q", raw, e.raw)
					return
				}
				sp, ok := DetachedLeanEvidence(e.raw, e.hist, e.lockK, e.ident)
				if !ok || string(sp) != e.sp {
					t.Errorf("splice %q want %q", sp, e.sp)
					return
				}
				if r, ok := LeanEvidence(bigEv); !ok || string(r) != string(bigRaw) {
					t.Errorf("big")
					return
				}
			}
		}(g)
	}
	wg.Wait()
}
