package valkey

import (
	_ "embed"
	"reflect"
	"strings"
	"testing"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// libraryEv1 is the function library as it was before evidence version 2:
// it writes version 1 evidence (a full copy of the record).
//
//go:embed testdata/library_ev1.lua
var libraryEv1 string

// evidenceFixture runs one store with either library: old writes and
// replays as the code before evidence version 2 did, current as now.
type evidenceFixture struct {
	t        *testing.T
	s        *Store
	old, cur *library
}

func newEvidenceFixture(t *testing.T, o lease.StoreOptions) *evidenceFixture {
	s := open(t, testenv.StartRedis(t), Options{StoreOptions: o})
	if err := s.EnableCompactFormat(bg); err != nil {
		t.Fatal(err)
	}
	f := &evidenceFixture{t: t, s: s, old: newLibrary("", libraryEv1), cur: s.lib}
	if err := f.old.load(bg, s.client); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *evidenceFixture) use(l *library) { f.s.lib = l }

// op is one mutation as a test repeats it: the same request each call.
type op struct {
	name   string
	lookup lease.LookupRequest
	run    func() (lease.Result, error)
}

// replays checks that op's retry and its lookup give the same results
// from the evidence as stored (read by the current library) and, if it is
// version 2, from its version 1 expansion stored in its place (read by the
// old library and the current one), and returns the first retry's result.
func (f *evidenceFixture) replays(o op) lease.Result {
	f.t.Helper()
	s := f.s
	p, err := lease.PrepareLookup(o.lookup, s.opts)
	if err != nil {
		f.t.Fatal(err)
	}
	key := s.keys.idem(tagOf(p.LockKey), p.Scope)
	stored, ok := get(f.t, s, key)
	if !ok {
		f.t.Fatalf("%s: no evidence", o.name)
	}
	set := func(v string) {
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Keepttl().Build()).Error(); err != nil {
			f.t.Fatal(err)
		}
	}
	run := func(l *library) [2]lease.Result {
		f.use(l)
		defer f.use(f.cur)
		r, err := o.run()
		if err != nil {
			f.t.Fatalf("%s: replay: %v", o.name, err)
		}
		if !r.Replayed {
			f.t.Fatalf("%s: not a replay", o.name)
		}
		lk, err := s.LookupRequest(bg, o.lookup)
		if err != nil {
			f.t.Fatalf("%s: lookup: %v", o.name, err)
		}
		return [2]lease.Result{r, lk}
	}
	want := run(f.cur)
	v1 := stored
	if strings.HasPrefix(stored, lease.EvidenceV2Prefix) {
		if v1, ok = lease.ExpandEvidence(stored, p.Identity); !ok {
			f.t.Fatalf("%s: evidence does not expand", o.name)
		}
		set(v1)
		defer set(stored)
	}
	// The history as version 1 entries too (the old library reads no
	// other), restored afterwards.
	hkey := s.keys.history(tagOf(p.LockKey))
	hist, err := s.client.Do(bg, s.client.B().Lrange().Key(hkey).Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		f.t.Fatal(err)
	}
	setHistory := func(entries []string) {
		cmds := vk.Commands{s.client.B().Del().Key(hkey).Build()}
		if len(entries) > 0 {
			cmds = append(cmds, s.client.B().Rpush().Key(hkey).Element(entries...).Build())
		}
		for _, r := range s.client.DoMulti(bg, cmds...) {
			if err := r.Error(); err != nil {
				f.t.Fatal(err)
			}
		}
	}
	if len(hist) > 0 {
		v1h := make([]string, len(hist))
		for i, e := range hist {
			if v1h[i], ok = lease.ExpandHistory(e); !ok {
				f.t.Fatalf("%s: history entry does not expand", o.name)
			}
		}
		setHistory(v1h)
		defer setHistory(hist)
	}
	for _, l := range []*library{f.old, f.cur} {
		if got := run(l); !reflect.DeepEqual(got, want) {
			f.t.Fatalf("%s: replays differ:\n version 1 %+v\n as stored %+v", o.name, got, want)
		}
	}
	return want[0]
}

func evLookup(opName lease.Op, id lease.Identity, m lease.Mutation) lease.LookupRequest {
	return lease.LookupRequest{Op: opName, Identity: id, PrincipalID: m.Caller.PrincipalID, RequestID: m.RequestID, DeadlineAt: far()}
}

// TestEvidenceVersionsReplayAlike writes evidence with the old library
// (version 1) and the current one (version 2), then retries every request
// through each library after the lease renewed, ended, was revoked or
// force-released, and after its history was trimmed: each retry and lookup
// gives the original's result, the same from either version, and the
// same from either library.
func TestEvidenceVersionsReplayAlike(t *testing.T) {
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 2
	f := newEvidenceFixture(t, o)
	s := f.s
	for _, writer := range []*library{f.old, f.cur} {
		f.use(writer)
		wantPrefix := "{"
		if writer == f.cur {
			wantPrefix = lease.EvidenceV2Prefix
		}
		id := newIdentity()
		acq := acquireReq(id)
		a, err := s.Acquire(bg, acq)
		if err != nil {
			t.Fatal(err)
		}
		_, pa, _ := lease.PrepareAcquire(acq, s.opts)
		if raw, _ := get(t, s, s.keys.idem(tagOf(pa.LockKey), pa.Scope)); !strings.HasPrefix(raw, wantPrefix) {
			t.Fatalf("evidence %q, want prefix %q", raw, wantPrefix)
		}
		acquireOp := op{"acquire", evLookup(lease.OpAcquire, id, acq.Mutation), func() (lease.Result, error) { return s.Acquire(bg, acq) }}
		check := func(o op, want lease.Result) {
			t.Helper()
			got := f.replays(o)
			want.Replayed, want.Op, want.Current = true, got.Op, got.Current
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: replay differs from the original:\n got  %+v\n want %+v", o.name, got, want)
			}
		}
		check(acquireOp, a)

		f.use(writer)
		rq := renewReq(a.Lease)
		rq.TTL = 40 * 1e9
		rn, err := s.Renew(bg, rq)
		if err != nil {
			t.Fatal(err)
		}
		renewOp := op{"renew", evLookup(lease.OpRenew, id, rq.Mutation), func() (lease.Result, error) { return s.Renew(bg, rq) }}
		check(renewOp, rn)
		check(acquireOp, a) // renewed: still active, no current state

		f.use(writer)
		rl := releaseReq(rn.Lease)
		end, err := s.Release(bg, rl)
		if err != nil {
			t.Fatal(err)
		}
		releaseOp := op{"release", evLookup(lease.OpRelease, id, rl.Mutation), func() (lease.Result, error) { return s.Release(bg, rl) }}
		check(releaseOp, end)
		check(renewOp, rn)
		if got := f.replays(acquireOp); got.Current == nil || got.Current.State != lease.StateReleased {
			t.Fatalf("acquire replay after release: current %+v", got.Current)
		}

		// Revoke and force-release on their own identities.
		for _, opName := range []lease.Op{lease.OpRevoke, lease.OpForceRelease} {
			f.use(writer)
			b, err := s.Acquire(bg, acquireReq(newIdentity()))
			if err != nil {
				t.Fatal(err)
			}
			ar := adminReq(b.Lease)
			run := func() (lease.Result, error) {
				if opName == lease.OpRevoke {
					return s.Revoke(bg, ar)
				}
				return s.ForceRelease(bg, ar)
			}
			r, err := run()
			if err != nil {
				t.Fatal(err)
			}
			check(op{string(opName), evLookup(opName, ar.Identity, ar.Mutation), run}, r)
		}

		// More leases on the identity trim the released one from history:
		// the acquire's replay then reports it expired (no evidence left).
		for i := 0; i < 3; i++ {
			f.use(writer)
			n, err := s.Acquire(bg, acquireReq(id))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Release(bg, releaseReq(n.Lease)); err != nil {
				t.Fatal(err)
			}
		}
		if got := f.replays(acquireOp); got.Current == nil || got.Current.State != lease.StateExpired {
			t.Fatalf("acquire replay after trimming: current %+v", got.Current)
		}
		check(releaseOp, end)

		// A reused request id with other inputs conflicts with either.
		for _, l := range []*library{f.old, f.cur} {
			f.use(l)
			other := acq
			other.JobID = uid("job_")
			if _, err := s.Acquire(bg, other); lease.AsError(err).Code != lease.CodeIdempotencyConflict {
				t.Fatalf("reused request id: %v", err)
			}
		}
	}
}

// TestEvidenceV2Malformed: version 2 evidence that cannot be rebuilt, or
// whose rebuilt document fails strict decoding, is corrupt.
func TestEvidenceV2Malformed(t *testing.T) {
	s := openCompact(t)
	id := newIdentity()
	acq := acquireReq(id)
	if _, err := s.Acquire(bg, acq); err != nil {
		t.Fatal(err)
	}
	_, p, _ := lease.PrepareAcquire(acq, s.opts)
	key := s.keys.idem(tagOf(p.LockKey), p.Scope)
	good, _ := get(t, s, key)
	lines := strings.Split(good, "\n")
	line := func(i int, v string) string {
		l := append([]string(nil), lines...)
		l[i] = v
		return strings.Join(l, "\n")
	}
	bad := []string{
		"", "ev2\n", "ev3" + good[3:], strings.Join(lines[:len(lines)-1], "\n"),
		line(lease.Ev2LeaseID, lines[lease.Ev2LeaseID]+`","x":"y`),
		line(lease.Ev2Client, `a\"b`),
		line(lease.Ev2Token, "-1"),
		line(lease.Ev2Token, "01"),
		line(lease.Ev2TTL, "1e3"),
		line(lease.Ev2State, "exploded"),
		line(lease.Ev2Renewed, "9"),
		line(lease.Ev2Backend, "99999999999999999"),
		line(lease.Ev2Metadata, `{"a":1},"state":"active"`),
		line(lease.Ev2Metadata, `[]`),
		line(lease.Ev2Metadata, `{"a":1}`+"\n"),
	}
	for _, b := range bad {
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(b).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(bg, acq); err == nil || lease.AsError(err).Code != lease.CodeCorrupt {
			t.Fatalf("evidence %q: acquire retry gave %v, want corrupt", b, err)
		}
		if r, err := s.LookupRequest(bg, evLookup(lease.OpAcquire, id, acq.Mutation)); err == nil || lease.AsError(err).Code != lease.CodeCorrupt {
			t.Logf("%+v", r)
			t.Fatalf("evidence %q: lookup gave %v, want corrupt", b, err)
		}
	}
}

// TestHistoryV2Malformed: a version 2 history entry that cannot be rebuilt
// is skipped as corrupt by the history read, as one failing decoding is.
func TestHistoryV2Malformed(t *testing.T) {
	s := openCompact(t)
	a, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(bg, adminReq(a.Lease)); err != nil {
		t.Fatal(err)
	}
	hkey := s.keys.history(tagOf(a.Lease.LockKey))
	good, err := s.client.Do(bg, s.client.B().Lindex().Key(hkey).Index(0).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := lease.ExpandHistory(good); !ok {
		t.Fatal("a written entry does not expand")
	}
	lines := strings.Split(good, "\n")
	line := func(i int, v string) string {
		l := append([]string(nil), lines...)
		l[i] = v
		return strings.Join(l, "\n")
	}
	for _, b := range []string{
		"hv2\n", strings.Join(lines[:len(lines)-1], "\n"),
		line(lease.Hv2Reason, `"a`), line(lease.Hv2Reason, `{"a":1}`), line(lease.Hv2Reason, `"a",`+`"x":1`),
		line(lease.Hv2By, `a"b`), line(lease.Hv2Ended, "x"), line(lease.Hv2Tuple, "a\\b"),
		line(lease.Hv2Record, lines[lease.Hv2Record]+`","x":"y`), line(lease.Hv2Record+5, "1.5"),
		line(lease.Hv2Lines-1, `{}`+"\n"), line(lease.Hv2Lines-1, `[1]`),
	} {
		raw, ok := lease.ExpandHistory(b)
		if !ok {
			continue
		}
		if _, err := lease.DecodeHistoryEntry([]byte(raw)); err == nil {
			t.Fatalf("entry %q expands to %q, which decodes", b, raw)
		}
	}
	// The read skips a malformed entry and still returns the good one.
	bad := line(lease.Hv2Reason, `{"a":1}`)
	if err := s.client.Do(bg, s.client.B().Lpush().Key(hkey).Element(bad).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	res, err := s.History(bg, lease.HistoryRequest{Identity: a.Lease.Identity(), DeadlineAt: far()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Entries) != 1 || res.Entries[0].Record.LeaseID != a.Lease.LeaseID || res.Entries[0].Record.State != lease.StateRevoked {
		t.Fatalf("history: %+v", res.Entries)
	}
	got, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far()})
	if err != nil || got.Lease.State != lease.StateRevoked {
		t.Fatalf("inspect by id: %+v %v", got, err)
	}
}

// openCompact opens a store on a server of its own whose namespace is
// switched to the compact (version 2) formats.
func openCompact(t *testing.T) *Store {
	t.Helper()
	s := open(t, testenv.StartRedis(t), Options{StoreOptions: leasetest.StoreOptions()})
	if err := s.EnableCompactFormat(bg); err != nil {
		t.Fatal(err)
	}
	return s
}

// The library's version 2 evidence and lease.CompactEvidence (which the
// bolt store writes) are one format: for the same result they are the same
// bytes, with plain and with adversarial metadata, for an acquire and a
// release.
func TestEvidenceV2IsTheGoEncoding(t *testing.T) {
	s := openCompact(t)
	for _, meta := range []lease.Metadata{nil, review4Metadata()} {
		id := newIdentity()
		acq := acquireReq(id)
		acq.Metadata = meta
		a, err := s.Acquire(bg, acq)
		if err != nil {
			t.Fatal(err)
		}
		rel := releaseReq(a.Lease)
		if _, err := s.Release(bg, rel); err != nil {
			t.Fatal(err)
		}
		for _, lk := range []lease.LookupRequest{evLookup(lease.OpAcquire, id, acq.Mutation), evLookup(lease.OpRelease, id, rel.Mutation)} {
			key, p := review4EvidenceKey(t, s, lk)
			stored, _ := get(t, s, key)
			v1, ok := lease.ExpandEvidence(stored, p.Identity)
			if !strings.HasPrefix(stored, lease.EvidenceV2Prefix) || !ok {
				t.Fatalf("%s evidence: %q", lk.Op, stored)
			}
			e, err := lease.DecodeIdempotencyRecord([]byte(v1))
			if err != nil {
				t.Fatal(err)
			}
			mine, err := lease.CompactEvidence(e, p.Identity)
			if err != nil || string(mine) != stored {
				t.Fatalf("%s evidence: the Go encoding\n%q\nthe library's\n%q (%v)", lk.Op, mine, stored, err)
			}
		}
	}
}

// The library's version 2 history entries and lease.CompactHistory (which
// the bolt store writes) are one format: for the same entry they are the
// same bytes, released and revoked with a reason that breaks naive
// formats, with adversarial metadata.
func TestHistoryV2IsTheGoEncoding(t *testing.T) {
	s := openCompact(t)
	for i, meta := range []lease.Metadata{nil, review4Metadata()} {
		id := newIdentity()
		acq := acquireReq(id)
		acq.Metadata = meta
		a, err := s.Acquire(bg, acq)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			_, err = s.Release(bg, releaseReq(a.Lease))
		} else {
			req := adminReq(a.Lease)
			req.Reason = `quote " backslash \ "},"ended_by":"prn_forged" hv2 ünï`
			_, err = s.Revoke(bg, req)
		}
		if err != nil {
			t.Fatal(err)
		}
		hist := review4History(t, s, tagOf(a.Lease.LockKey))
		if len(hist) != 1 || !strings.HasPrefix(hist[0], lease.HistoryV2Prefix) {
			t.Fatalf("history: %q", hist)
		}
		h, err := lease.DecodeStoredHistory([]byte(hist[0]))
		if err != nil {
			t.Fatal(err)
		}
		mine, err := lease.CompactHistory(h)
		if err != nil || string(mine) != hist[0] {
			t.Fatalf("the Go encoding\n%q\nthe library's\n%q (%v)", mine, hist[0], err)
		}
	}
}
