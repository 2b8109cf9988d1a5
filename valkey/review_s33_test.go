package valkey

// Review s33: attacks on "a compact namespace answers an ending with the
// record's version 2 bytes" (archive no longer builds the ended record's
// version 1 JSON in a namespace of format 2 or 3; finish replies with
// ended_record: record version 2 there). Every test here held; they are
// kept as regression tests.

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// s33Formats are the three write formats an instance may send, by the
// value its writeFormat gives.
var s33Formats = []string{"v1", "compact", "compact_records"}

// s33SetFormat makes s write format f, as an instance that loaded that
// switch (and has not reloaded it since) does.
func s33SetFormat(s *Store, f string) {
	s.setFormat(map[string]string{"compact": compactFormat, "compact_records": compactRecords}[f])
	if s.writeFormat() != f {
		panic("format " + f + " not set")
	}
}

// s33Ending is one of the three endings.
type s33Ending struct {
	name  string
	op    lease.Op
	code  lease.Code
	state lease.State
	req   func(r *lease.Record) (lease.Mutation, func(*Store) (lease.Result, error))
}

func s33Endings() []s33Ending {
	return []s33Ending{
		{"release", lease.OpRelease, lease.CodeReleased, lease.StateReleased,
			func(r *lease.Record) (lease.Mutation, func(*Store) (lease.Result, error)) {
				q := releaseReq(r)
				return q.Mutation, func(s *Store) (lease.Result, error) { return s.Release(bg, q) }
			}},
		{"force_release", lease.OpForceRelease, lease.CodeForceReleased, lease.StateReleased,
			func(r *lease.Record) (lease.Mutation, func(*Store) (lease.Result, error)) {
				q := adminReq(r)
				return q.Mutation, func(s *Store) (lease.Result, error) { return s.ForceRelease(bg, q) }
			}},
		{"revoke", lease.OpRevoke, lease.CodeRevoked, lease.StateRevoked,
			func(r *lease.Record) (lease.Mutation, func(*Store) (lease.Result, error)) {
				q := adminReq(r)
				q.Reason = `line1\nline2 "q" \ \" <b>&amp; ünï 😀 "},"state":"active`
				return q.Mutation, func(s *Store) (lease.Result, error) { return s.Revoke(bg, q) }
			}},
	}
}

// s33WantReply is the reply record a finish in format f must carry for
// ended: its version 1 JSON in format 1, else lease.CompactRecord's bytes.
func s33WantReply(t *testing.T, f string, ended *lease.Record) string {
	t.Helper()
	want, err := ended.Encode()
	if f != "v1" {
		want, err = lease.CompactRecord(ended)
		if err == nil && !strings.HasPrefix(string(want), lease.RecordV2Prefix) {
			t.Fatalf("CompactRecord fell back to version 1 for %+v", ended)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(want)
}

// s33CheckEnded checks everything a reader sees of an ended lease after
// its ending res (the first result): its replay from every instance
// (equal to res but for Replayed and Op), the lookup of the ending, the
// acquire's replay (current state res.Lease), history and inspect by id.
func s33CheckEnded(t *testing.T, e s33Ending, res lease.Result, acq lease.AcquireRequest, m lease.Mutation,
	end func(*Store) (lease.Result, error), readers ...*Store) {
	t.Helper()
	for i, r := range readers {
		rp, err := end(r)
		if err != nil || !rp.Replayed || rp.Code != res.Code || !reflect.DeepEqual(rp.Lease, res.Lease) ||
			rp.BackendTime != res.BackendTime || rp.Current != nil {
			t.Fatalf("reader %d (%s): replay %+v %v\nwant %+v", i, r.writeFormat(), rp, err, res)
		}
		look, err := r.LookupRequest(bg, evLookup(e.op, acq.Identity, m))
		if err != nil || look.Code != res.Code || !reflect.DeepEqual(look.Lease, res.Lease) || look.BackendTime != res.BackendTime {
			t.Fatalf("reader %d (%s): lookup %+v %v\nwant %+v", i, r.writeFormat(), look, err, res)
		}
		ra, err := r.Acquire(bg, acq)
		if err != nil || !ra.Replayed || !reflect.DeepEqual(ra.Current, res.Lease) || ra.Lease.LeaseID != res.Lease.LeaseID ||
			ra.Lease.State != lease.StateActive {
			t.Fatalf("reader %d (%s): acquire replay %+v %v", i, r.writeFormat(), ra, err)
		}
		h, err := r.History(bg, lease.HistoryRequest{Identity: acq.Identity, Caller: owner, DeadlineAt: far()})
		if err != nil || len(h.Entries) != 1 || !reflect.DeepEqual(h.Entries[0].Record, res.Lease) ||
			h.Entries[0].EndedAt != res.BackendTime || h.Entries[0].RequestID != m.RequestID {
			t.Fatalf("reader %d (%s): history %+v %v\nwant %+v", i, r.writeFormat(), h, err, res.Lease)
		}
		in, err := r.Inspect(bg, lease.InspectRequest{LeaseID: res.Lease.LeaseID, DeadlineAt: far()})
		if err != nil || !reflect.DeepEqual(in.Lease, res.Lease) {
			t.Fatalf("reader %d (%s): inspect %+v %v", i, r.writeFormat(), in, err)
		}
	}
}

// TestReviewS33EndingAcrossFormatsReplaysAlike (held): instances of one
// namespace writing different formats (an instance that has not yet
// reloaded the switch, or one switched while leases are live): a lease
// acquired in any format, renewed and ended in any format, answers with
// the ended record in the ending instance's format (exact bytes), and
// its replay, lookup, the acquire's replay, history and inspect through
// an instance of every format give exactly the first result.
func TestReviewS33EndingAcrossFormatsReplaysAlike(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
	stores := map[string]*Store{}
	spies := map[string]*replySpy{}
	var readers []*Store
	for _, f := range s33Formats {
		s := open(t, r, o)
		s33SetFormat(s, f)
		spy := &replySpy{Client: s.client, fn: "finish"}
		s.client = spy
		stores[f], spies[f] = s, spy
		readers = append(readers, s)
	}
	for _, e := range s33Endings() {
		for _, fa := range s33Formats {
			for _, fr := range s33Formats {
				for _, fe := range s33Formats {
					acq := acquireReq(newIdentity())
					a, err := stores[fa].Acquire(bg, acq)
					if err != nil {
						t.Fatal(err)
					}
					rn, err := stores[fr].Renew(bg, renewReq(a.Lease))
					if err != nil {
						t.Fatal(err)
					}
					m, end := e.req(rn.Lease)
					res, err := end(stores[fe])
					if err != nil {
						t.Fatalf("%s acquired %s renewed %s ended %s: %v", e.name, fa, fr, fe, err)
					}
					ended := *rn.Lease
					ended.State = e.state
					if res.Code != e.code || res.Replayed || !reflect.DeepEqual(res.Lease, &ended) {
						t.Fatalf("%s acquired %s renewed %s ended %s: %+v\nwant %+v", e.name, fa, fr, fe, res, &ended)
					}
					rep := spies[fe].take(t)
					if want := s33WantReply(t, fe, &ended); len(rep) != 3 || rep[0] != "ok" || rep[2] != want {
						t.Fatalf("%s acquired %s renewed %s ended %s: reply %q\nwant %q", e.name, fa, fr, fe, rep, want)
					}
					s33CheckEnded(t, e, res, acq, m, end, readers...)
					for _, f := range s33Formats {
						spies[f].replies = nil // the replays' evidence replies
					}
				}
			}
		}
	}
}

// TestReviewS33SwitchOnALiveNamespace (held): the namespace switch itself
// (EnableCompactFormat, then EnableCompactRecords) while leases acquired
// before it are live: each ends after the switch with a reply the store
// decodes to the ended record, and endings from before the switch replay
// after it with their original result.
func TestReviewS33SwitchOnALiveNamespace(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
	s, other := open(t, r, o), open(t, r, o)
	type ended struct {
		e   s33Ending
		res lease.Result
		acq lease.AcquireRequest
		m   lease.Mutation
		end func(*Store) (lease.Result, error)
	}
	var done []ended
	var live []lease.AcquireRequest
	var liveRes []*lease.Record
	round := func() {
		for _, e := range s33Endings() {
			// End a lease acquired in an earlier format, and one acquired now.
			acq := acquireReq(newIdentity())
			a, err := s.Acquire(bg, acq)
			if err != nil {
				t.Fatal(err)
			}
			live, liveRes = append(live, acq), append(liveRes, a.Lease)
			old, oldRec := live[0], liveRes[0]
			live, liveRes = live[1:], liveRes[1:]
			m, end := e.req(oldRec)
			res, err := end(s)
			want := *oldRec
			want.State = e.state
			if err != nil || !reflect.DeepEqual(res.Lease, &want) {
				t.Fatalf("%s in format %s: %+v %v", e.name, s.writeFormat(), res, err)
			}
			done = append(done, ended{e, res, old, m, end})
		}
		for _, d := range done {
			s33CheckEnded(t, d.e, d.res, d.acq, d.m, d.end, s, other)
		}
	}
	// Leases live across every switch.
	for range 3 {
		acq := acquireReq(newIdentity())
		a, err := s.Acquire(bg, acq)
		if err != nil {
			t.Fatal(err)
		}
		live, liveRes = append(live, acq), append(liveRes, a.Lease)
	}
	round()
	if err := s.EnableCompactFormat(bg); err != nil {
		t.Fatal(err)
	}
	round()
	if err := other.reap(bg); err != nil { // other reloads the switch
		t.Fatal(err)
	}
	if err := s.EnableCompactRecords(bg); err != nil {
		t.Fatal(err)
	}
	round()
	if s.writeFormat() != "compact_records" || other.writeFormat() != "compact" {
		t.Fatalf("formats %s, %s", s.writeFormat(), other.writeFormat())
	}
}

// s33ID is an opaque identifier of exactly n bytes with every character
// the identifier rule allows after the first.
func s33ID(prefix string, n int) string {
	b := []byte(prefix + uid(""))
	for i := 0; len(b) < n; i++ {
		b = append(b, "a.b_c:d-9"[i%9])
	}
	return string(b[:n-1]) + "z"
}

// s33Runes repeats r up to exactly n bytes after prefix.
func s33Runes(prefix, r string, n int) string {
	s := prefix
	for len(s)+len(r) <= n {
		s += r
	}
	return s
}

// TestReviewS33StressedRecordsEndInEveryFormat (held): records whose
// fields stress version 2 (every identifier at 256 bytes, the lease id
// included; identity components with non-ASCII letters at 256 bytes;
// metadata with newlines, quotes, separators and fake version 2 lines,
// empty or absent) end in every format with exactly the expected reply
// bytes, which decode strictly to the record the store returns and
// history keeps; a renewal's fields are the ones carried.
func TestReviewS33StressedRecordsEndInEveryFormat(t *testing.T) {
	r := sharedServer(t)
	metas := map[string]lease.Metadata{
		"adversarial": review4Metadata(),
		"absent":      nil,
		"empty":       {},
		"fake rv2": {"a": "rv2\ntag\ntenant\n", "state": "active\n{}", "z": "{\"a\":1}\nreleased\n{}",
			"e": "", "s": "\u2028\x00\n", "n": nil, "f": math.Copysign(0, -1), "big": 9007199254740993.0},
	}
	for _, f := range s33Formats {
		o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
		s := open(t, r, o)
		s33SetFormat(s, f)
		spy := &replySpy{Client: s.client, fn: "finish"}
		s.client = spy
		other := open(t, r, o)
		for name, meta := range metas {
			for _, e := range s33Endings() {
				id := lease.Identity{
					TenantID:        s33Runes("t-", "é", 256),
					ProgramID:       s33Runes("p:", "目標", 256),
					TargetNamespace: s33Runes("n.", "ß", 256),
					TargetID:        s33Runes(uid("x"), "ü_", 256),
					ActorName:       s33ID("a", 256),
					WorkflowName:    s33Runes(uid("w"), "ø-", 256),
					OperationClass:  "default",
				}
				acq := acquireReq(id)
				acq.Metadata = meta
				acq.ExecutionID, acq.JobID, acq.TraceID = s33ID("e", 256), s33ID("j", 256), s33ID("tr", 256)
				acq.ServiceInstanceID, acq.RequestID = s33ID("i", 256), s33ID("rq", 256)
				acq.Caller = lease.Caller{PrincipalID: s33ID("prn", 256), ClientID: s33ID("c", 256), CredentialID: s33ID("k", 256)}
				leaseID := s33ID("lease", 256)
				s.leaseIDs = func(lease.Timestamp) string { return leaseID }
				a, err := s.Acquire(bg, acq)
				s.leaseIDs = nil
				if err != nil {
					t.Fatalf("%s %s %s: acquire: %v", f, name, e.name, err)
				}
				if a.Lease.LeaseID != leaseID || len(a.Lease.TenantID) != 256 || len(a.Lease.ProgramID) > 256 {
					t.Fatalf("acquired %+v", a.Lease)
				}
				rq := renewReq(a.Lease)
				rq.Caller = acq.Caller
				rq.TTL = 20 * time.Second
				time.Sleep(2 * time.Millisecond) // renewed_at differs from acquired_at
				rn, err := s.Renew(bg, rq)
				if err != nil {
					t.Fatal(err)
				}
				rec := rn.Lease
				var m lease.Mutation
				var end func(*Store) (lease.Result, error)
				if e.op == lease.OpRelease {
					q := releaseReq(rec)
					q.Caller = acq.Caller
					m, end = q.Mutation, func(s *Store) (lease.Result, error) { return s.Release(bg, q) }
				} else {
					m, end = e.req(rec)
				}
				res, err := end(s)
				if err != nil {
					t.Fatalf("%s %s %s: %v", f, name, e.name, err)
				}
				ended := *rec
				ended.State = e.state
				if !reflect.DeepEqual(res.Lease, &ended) || res.Lease.TTLMs != 20000 || res.Lease.RenewedAt == res.Lease.AcquiredAt {
					t.Fatalf("%s %s %s: returned %+v\nwant %+v", f, name, e.name, res.Lease, &ended)
				}
				rep := spy.take(t)
				if want := s33WantReply(t, f, &ended); len(rep) != 3 || rep[2] != want {
					t.Fatalf("%s %s %s: reply %q\nwant %q", f, name, e.name, rep, want)
				}
				got, err := lease.DecodeStoredRecord([]byte(rep[2]))
				if err != nil || !reflect.DeepEqual(got, &ended) {
					t.Fatalf("%s %s %s: reply decodes to %+v %v", f, name, e.name, got, err)
				}
				// Readers of both instances (the acquire replays with the
				// caller that owns it).
				for _, rd := range []*Store{s, other} {
					rp, err := end(rd)
					if err != nil || !rp.Replayed || !reflect.DeepEqual(rp.Lease, res.Lease) || rp.BackendTime != res.BackendTime {
						t.Fatalf("%s %s %s: replay %+v %v", f, name, e.name, rp, err)
					}
					look, err := rd.LookupRequest(bg, evLookup(e.op, id, m))
					if err != nil || !reflect.DeepEqual(look.Lease, res.Lease) {
						t.Fatalf("%s %s %s: lookup %+v %v", f, name, e.name, look, err)
					}
					h, err := rd.History(bg, lease.HistoryRequest{Identity: id, DeadlineAt: far()})
					if err != nil || len(h.Entries) != 1 || !reflect.DeepEqual(h.Entries[0].Record, res.Lease) {
						t.Fatalf("%s %s %s: history %+v %v", f, name, e.name, h, err)
					}
					in, err := rd.Inspect(bg, lease.InspectRequest{LeaseID: leaseID, DeadlineAt: far()})
					if err != nil || !reflect.DeepEqual(in.Lease, res.Lease) {
						t.Fatalf("%s %s %s: inspect %+v %v", f, name, e.name, in, err)
					}
				}
				spy.replies = nil
				// The next lease of the identity gets the next token.
				next := acquireReq(id)
				next.Caller = acq.Caller
				b, err := s.Acquire(bg, next)
				if err != nil || b.Lease.FencingToken != a.Lease.FencingToken+1 {
					t.Fatalf("%s %s %s: next acquire %+v %v", f, name, e.name, b, err)
				}
				rl := releaseReq(b.Lease)
				rl.Caller = acq.Caller
				if _, err := s.Release(bg, rl); err != nil {
					t.Fatal(err)
				}
				spy.replies = nil
			}
		}
	}
}

// TestReviewS33ExpiryArchivingInEveryFormat (held): every path that
// archives an expired lease without replying with it (acquire over an
// expired predecessor, its exhausted variant, held() under release,
// force-release, revoke, renew and commit, the reaper's expire) runs in
// every format, where archive no longer builds the record's JSON: each
// answers its typed result and leaves one history entry, the expired
// record, which readers of every format decode.
func TestReviewS33ExpiryArchivingInEveryFormat(t *testing.T) {
	r := sharedServer(t)
	for _, f := range s33Formats {
		t.Run(f, func(t *testing.T) {
			o := Options{KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: leasetest.StoreOptions()}
			s := open(t, r, o)
			s33SetFormat(s, f)
			readers := []*Store{s}
			for _, g := range s33Formats {
				rd := open(t, r, o)
				s33SetFormat(rd, g)
				readers = append(readers, rd)
			}
			paths := []struct {
				name string
				do   func(a *lease.Record) (lease.Result, error)
				code lease.Code // the error code, or "" for a new lease
			}{
				{"acquire", func(a *lease.Record) (lease.Result, error) {
					return s.Acquire(bg, acquireReq(a.Identity()))
				}, ""},
				{"exhausted", func(a *lease.Record) (lease.Result, error) {
					if err := (faults{s}).SetCounter(bg, a.LockKey, 9007199254740991); err != nil {
						t.Fatal(err)
					}
					return s.Acquire(bg, acquireReq(a.Identity()))
				}, lease.CodeCounterExhausted},
				{"release", func(a *lease.Record) (lease.Result, error) { return s.Release(bg, releaseReq(a)) }, lease.CodeLost},
				{"force_release", func(a *lease.Record) (lease.Result, error) { return s.ForceRelease(bg, adminReq(a)) }, lease.CodeLost},
				{"revoke", func(a *lease.Record) (lease.Result, error) { return s.Revoke(bg, adminReq(a)) }, lease.CodeLost},
				{"renew", func(a *lease.Record) (lease.Result, error) { return s.Renew(bg, renewReq(a)) }, lease.CodeLost},
				{"commit", func(a *lease.Record) (lease.Result, error) {
					_, err := s.AuthorizeCommit(bg, commitReq(a))
					return lease.Result{}, err
				}, lease.CodeLost},
				{"reaper", func(a *lease.Record) (lease.Result, error) { return lease.Result{}, s.reap(bg) }, ""},
			}
			held := make([]*lease.Record, len(paths))
			for i := range paths {
				acq := acquireReq(newIdentity())
				acq.TTL = 300 * time.Millisecond
				a, err := s.Acquire(bg, acq)
				if err != nil {
					t.Fatal(err)
				}
				held[i] = a.Lease
			}
			time.Sleep(time.Until(held[len(held)-1].ExpiresAt.Time()) + 150*time.Millisecond)
			for i, p := range paths {
				a := held[i]
				res, err := p.do(a)
				switch {
				case p.code != "":
					mustCode(t, err, p.code)
				case err != nil:
					t.Fatalf("%s: %v", p.name, err)
				case p.name == "acquire" && (res.Lease.FencingToken != a.FencingToken+1 || res.Lease.State != lease.StateActive):
					t.Fatalf("%s: %+v", p.name, res)
				}
				want := *a
				want.State = lease.StateExpired
				for _, rd := range readers {
					h, err := rd.History(bg, lease.HistoryRequest{Identity: a.Identity(), DeadlineAt: far()})
					if err != nil || len(h.Entries) != 1 || !reflect.DeepEqual(h.Entries[0].Record, &want) ||
						h.Entries[0].EndedAt != a.ExpiresAt || h.Entries[0].EndedBy != "" {
						t.Fatalf("%s (reader %s): history %+v %v\nwant %+v", p.name, rd.writeFormat(), h, err, &want)
					}
					in, err := rd.Inspect(bg, lease.InspectRequest{LeaseID: a.LeaseID, DeadlineAt: far()})
					if err != nil || !reflect.DeepEqual(in.Lease, &want) {
						t.Fatalf("%s (reader %s): inspect %+v %v", p.name, rd.writeFormat(), in, err)
					}
				}
				if _, ok := get(t, s, s.keys.quarantine(tagOf(a.LockKey))); ok {
					t.Fatalf("%s: quarantined", p.name)
				}
			}
		})
	}
}

// TestReviewS33RecoveryArchivesInCompactFormats (held): recovery's
// recover_end, the one archive caller outside the lease operations, in a
// sealed namespace of format 2 and of format 3: live leases are revoked
// and expired ones expired, each as one history entry of exactly its
// record, and a former holder's release is lost.
func TestReviewS33RecoveryArchivesInCompactFormats(t *testing.T) {
	r := sharedServer(t)
	for _, o := range []Options{{CompactFormat: true}, {CompactRecords: true}} {
		o.Addr, o.KeyPrefix, o.ReapInterval, o.StoreOptions = r.Addr(), randomPrefix(), -1, leasetest.StoreOptions()
		s := open(t, r, o)
		live, err := s.Acquire(bg, acquireReq(newIdentity()))
		if err != nil {
			t.Fatal(err)
		}
		short := acquireReq(newIdentity())
		short.TTL = 300 * time.Millisecond
		gone, err := s.Acquire(bg, short)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(gone.Lease.ExpiresAt.Time()) + 150*time.Millisecond)
		if _, err := s.Seal(bg); err != nil {
			t.Fatal(err)
		}
		c, _ := closedState(t, o)
		if _, err := c.Finish(bg, lease.RecoveryPlan{Reason: "failover drill"}); err != nil {
			t.Fatal(err)
		}
		for _, x := range []struct {
			rec   *lease.Record
			state lease.State
			by    string
		}{{live.Lease, lease.StateRevoked, lease.RecoveryPrincipal}, {gone.Lease, lease.StateExpired, ""}} {
			want := *x.rec
			want.State = x.state
			h, err := s.History(bg, lease.HistoryRequest{Identity: x.rec.Identity(), Caller: owner, DeadlineAt: far()})
			if err != nil || len(h.Entries) != 1 || !reflect.DeepEqual(h.Entries[0].Record, &want) || h.Entries[0].EndedBy != x.by {
				t.Fatalf("%s: history %+v %v\nwant %+v", s.writeFormat(), h, err, &want)
			}
		}
		_, err = s.Release(bg, releaseReq(live.Lease))
		mustCode(t, err, lease.CodeLost)
	}
}

// TestReviewS33RecordMemoKeepsVersionsApart (held): the Go record memo is
// keyed by exact bytes, so a lease's version 1 and version 2 bytes, and
// its active and ended version 2 bytes (which differ in the state line
// only), are separate entries that each decode to their own record; what
// a hit returns is a copy.
func TestReviewS33RecordMemoKeepsVersionsApart(t *testing.T) {
	s := open(t, sharedServer(t), Options{CompactRecords: true, StoreOptions: leasetest.StoreOptions()})
	a, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Release(bg, releaseReq(a.Lease))
	if err != nil {
		t.Fatal(err)
	}
	activeV2, _ := lease.CompactRecord(a.Lease)
	endedV2, _ := lease.CompactRecord(res.Lease)
	endedV1, _ := res.Lease.Encode()
	for _, c := range []struct {
		raw  []byte
		want *lease.Record
	}{{activeV2, a.Lease}, {endedV2, res.Lease}, {endedV1, res.Lease}, {endedV2, res.Lease}} {
		if k, ok := s.records.Known(c.raw); ok && !reflect.DeepEqual(k, c.want) {
			t.Fatalf("memo holds %+v for %q", k, c.raw)
		}
		got, err := s.decodeRecord(c.raw, a.Lease.LockKey)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Fatalf("%q: %+v %v", c.raw, got, err)
		}
		got.State, got.Metadata["purpose"] = lease.StateActive, "changed"
		again, ok := s.records.Known(c.raw)
		if !ok || !reflect.DeepEqual(again, c.want) {
			t.Fatalf("memo entry changed by its reader: %+v", again)
		}
	}
	if _, err := s.decodeRecord(endedV2, "starintel:target-lease:v1:other"); err == nil {
		t.Fatal("a record decoded under a foreign lock key")
	}
}
