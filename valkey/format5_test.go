package valkey

import (
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Tests of stored format 5 (format.go): format 4, and an ending's
// evidence of the lease's acquisition and a release's own in version 3,
// by reference to the lease's history entry (version 4, which names that
// evidence by its scopes and has it rewritten in version 2 before the
// entry is trimmed).

func open5(t *testing.T, o Options) *Store {
	t.Helper()
	if o.StoreOptions.HistoryPerIdentity == 0 {
		o.StoreOptions = leasetest.StoreOptions()
	}
	o.ReferringEvidence = true
	s := open(t, sharedServer(t), o)
	if !s.writes(referringEvidence) || s.writeFormat() != "referring_evidence" {
		t.Fatal("the namespace is not in format 5")
	}
	return s
}

func releaseEvidenceKey(t *testing.T, s *Store, req lease.ReleaseRequest) string {
	t.Helper()
	_, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return s.keys.idem(tagOf(p.LockKey), p.Scope)
}

// historyEntries is the identity's history list, newest first.
func historyEntries(t *testing.T, s *Store, lockKey string) []string {
	t.Helper()
	v, err := s.client.Do(bg, s.client.B().Lrange().Key(s.keys.history(tagOf(lockKey))).Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// mustRelease releases rec and checks its replay and lookup answer the
// first answer byte for byte, and another digest conflicts.
func mustReleaseReplays(t *testing.T, s *Store, req lease.ReleaseRequest, first lease.Result) {
	t.Helper()
	got, err := s.Release(bg, req)
	if err != nil || !got.Replayed || got.Code != lease.CodeReleased || encoded(t, got.Lease) != encoded(t, first.Lease) ||
		got.BackendTime.UnixMilli() != first.BackendTime.UnixMilli() {
		t.Fatalf("release replay: %+v %v\nwant %+v", got, err, first)
	}
	lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRelease, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
		RequestID: req.RequestID, DeadlineAt: far()})
	if err != nil || encoded(t, lr.Lease) != encoded(t, first.Lease) || lr.Code != lease.CodeReleased {
		t.Fatalf("release lookup: %+v %v", lr, err)
	}
	other := req
	other.FencingToken++
	_, err = s.Release(bg, other)
	mustCode(t, err, lease.CodeIdempotencyConflict)
}

// Every ending writes the acquisition's evidence in version 3, a release
// its own too, and a history entry of version 4 naming them; replays and
// lookups answer the first answers byte for byte with the state now.
func TestReferringEvidenceReplays(t *testing.T) {
	var rel lease.ReleaseRequest // the release ending's request
	endings := []struct {
		name    string
		short   bool
		want    lease.State
		release bool
		end     func(t *testing.T, s *Store, res lease.Result) lease.Result
	}{
		{"release", false, lease.StateReleased, true, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			rel = releaseReq(res.Lease)
			r, err := s.Release(bg, rel)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
		{"revoke", false, lease.StateRevoked, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			r, err := s.Revoke(bg, adminReq(res.Lease))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
		{"force_release", false, lease.StateReleased, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			r, err := s.ForceRelease(bg, adminReq(res.Lease))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
		{"reaper", true, lease.StateExpired, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			waitExpired(t, s, res.Lease)
			if err := s.reap(bg); err != nil {
				t.Fatal(err)
			}
			return lease.Result{}
		}},
		{"acquire_over_expired", true, lease.StateExpired, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			waitExpired(t, s, res.Lease)
			acquire4(t, s, acquireReq(res.Lease.Identity()))
			return lease.Result{}
		}},
	}
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			s := open5(t, Options{})
			req := acquireReq(newIdentity())
			if e.short {
				req = shortReq(req.Identity)
			}
			first := acquire4(t, s, req)
			if !e.short {
				rr := renewReq(first.Lease)
				rr.TTL = 45 * time.Second
				if _, err := s.Renew(bg, rr); err != nil {
					t.Fatal(err)
				}
			}
			ended := e.end(t, s, first)
			key := evidenceKey(t, s, req)
			v, ok := get(t, s, key)
			if !ok || !strings.HasPrefix(v, lease.EvidenceRefPrefix+"acquire\n") {
				t.Fatalf("acquisition evidence after the end: %q", v)
			}
			if at, want := pexpireTime(t, s, key), first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
				t.Fatalf("evidence PXAT %d, want acquired_at + retention %d", at, want)
			}
			var entry string
			for _, h := range historyEntries(t, s, first.Lease.LockKey) {
				if strings.Contains(h, "\n"+first.Lease.LeaseID+"\n") {
					entry = h
				}
			}
			_, p, _ := lease.PrepareAcquire(req, s.opts)
			if !strings.HasPrefix(entry, lease.HistoryScopedPrefix+p.Scope+"\n") {
				t.Fatalf("history entry: %.60q, want version 4 naming the acquisition's scope", entry)
			}
			mustReplay(t, s, req, first, e.want)
			if e.release {
				rk := releaseEvidenceKey(t, s, rel)
				if v, ok := get(t, s, rk); !ok || !strings.HasPrefix(v, lease.EvidenceRefPrefix+"release\n") {
					t.Fatalf("release evidence: %q", v)
				}
				_, p, _ := lease.PrepareRelease(rel, s.opts)
				if !strings.HasPrefix(entry, lease.HistoryScopedPrefix+p.Scope+"\n") && !strings.Contains(entry, "\n"+p.Scope+"\n") {
					t.Fatalf("history entry: %.150q, want it to name the release's scope", entry)
				}
				mustReleaseReplays(t, s, rel, ended)
			}
		})
	}
}

// An identity whose history is at its cap drops its oldest entry with each
// ending: the evidence that refers to it is rewritten in version 2 first,
// with its TTL, and still answers byte for byte.
func TestReferringEvidenceDetachedOnTrim(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	s := open5(t, Options{StoreOptions: so})
	id := newIdentity()
	type life struct {
		acq   lease.AcquireRequest
		first lease.Result
		rel   lease.ReleaseRequest
		ended lease.Result
	}
	var lives []life
	for i := 0; i < 5; i++ {
		req := acquireReq(id)
		first := acquire4(t, s, req)
		l := life{acq: req, first: first}
		if i%2 == 0 {
			l.rel = releaseReq(first.Lease)
			var err error
			if l.ended, err = s.Release(bg, l.rel); err != nil {
				t.Fatal(err)
			}
		} else if _, err := s.Revoke(bg, adminReq(first.Lease)); err != nil {
			t.Fatal(err)
		}
		lives = append(lives, l)
	}
	if n := len(historyEntries(t, s, lives[0].first.Lease.LockKey)); n != 2 {
		t.Fatalf("%d history entries, want the cap 2", n)
	}
	for i, l := range lives {
		key := evidenceKey(t, s, l.acq)
		v, _ := get(t, s, key)
		want := lease.EvidenceRefPrefix
		if i < 3 { // trimmed
			want = lease.EvidenceV2Prefix
		}
		if !strings.HasPrefix(v, want) {
			t.Fatalf("life %d: acquisition evidence %.12q, want %q", i, v, want)
		}
		if at, want := pexpireTime(t, s, key), l.first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
			t.Fatalf("life %d: evidence PXAT %d, want %d (kept by the rewrite)", i, at, want)
		}
		state := lease.StateReleased
		if i%2 == 1 {
			state = lease.StateRevoked
		}
		if i < 3 {
			state = lease.StateExpired // its end's evidence went with the entry (lease.CurrentOf)
		}
		mustReplay(t, s, l.acq, l.first, state)
		if l.rel.RequestID != "" {
			rk := releaseEvidenceKey(t, s, l.rel)
			v, _ := get(t, s, rk)
			if !strings.HasPrefix(v, want) {
				t.Fatalf("life %d: release evidence %.12q, want %q", i, v, want)
			}
			mustReleaseReplays(t, s, l.rel, l.ended)
		}
	}
}

// Damage fails closed: evidence of version 3 whose history entry is gone,
// whose entry's scope line is not its own, or that is copied under
// another request's key answers corrupt, never a result.
func TestReferringEvidenceCorrupt(t *testing.T) {
	setup := func(t *testing.T) (*Store, lease.AcquireRequest, lease.Result, lease.ReleaseRequest) {
		s := open5(t, Options{})
		req := acquireReq(newIdentity())
		first := acquire4(t, s, req)
		rel := releaseReq(first.Lease)
		if _, err := s.Release(bg, rel); err != nil {
			t.Fatal(err)
		}
		return s, req, first, rel
	}
	lookupAcquire := func(s *Store, req lease.AcquireRequest) error {
		_, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID,
			RequestID: req.RequestID, DeadlineAt: far()})
		return err
	}
	t.Run("entry gone", func(t *testing.T) {
		s, req, first, rel := setup(t)
		if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.history(tagOf(first.Lease.LockKey))).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Acquire(bg, req)
		mustCode(t, err, lease.CodeCorrupt)
		mustCode(t, lookupAcquire(s, req), lease.CodeCorrupt)
		_, err = s.Release(bg, rel)
		mustCode(t, err, lease.CodeCorrupt)
	})
	t.Run("scope line not its own", func(t *testing.T) {
		s, req, first, _ := setup(t)
		hk := s.keys.history(tagOf(first.Lease.LockKey))
		entry := historyEntries(t, s, first.Lease.LockKey)[0]
		_, p, _ := lease.PrepareAcquire(req, s.opts)
		other := strings.Replace(entry, p.Scope, strings.Repeat("A", 43), 1)
		if other == entry {
			t.Fatal("setup: no scope line")
		}
		if err := s.client.Do(bg, s.client.B().Lset().Key(hk).Index(0).Element(other).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Acquire(bg, req)
		mustCode(t, err, lease.CodeCorrupt)
	})
	t.Run("acquisition evidence under the release's key", func(t *testing.T) {
		s, req, _, rel := setup(t)
		v, _ := get(t, s, evidenceKey(t, s, req))
		if err := s.client.Do(bg, s.client.B().Set().Key(releaseEvidenceKey(t, s, rel)).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Release(bg, rel)
		mustCode(t, err, lease.CodeCorrupt)
	})
	t.Run("acquisition evidence under the release's key, trimmed", func(t *testing.T) {
		so := leasetest.StoreOptions()
		so.HistoryPerIdentity = 1
		s := open5(t, Options{StoreOptions: so})
		req := acquireReq(newIdentity())
		first := acquire4(t, s, req)
		rel := releaseReq(first.Lease)
		if _, err := s.Release(bg, rel); err != nil {
			t.Fatal(err)
		}
		v, _ := get(t, s, evidenceKey(t, s, req))
		rk := releaseEvidenceKey(t, s, rel)
		if err := s.client.Do(bg, s.client.B().Set().Key(rk).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		next := acquire4(t, s, acquireReq(req.Identity))
		if _, err := s.Release(bg, releaseReq(next.Lease)); err != nil { // trims first's entry
			t.Fatal(err)
		}
		if got, _ := get(t, s, rk); got != v {
			t.Fatalf("the misplaced evidence was rewritten when its entry was trimmed: %.20q", got)
		}
		if got, _ := get(t, s, evidenceKey(t, s, req)); !strings.HasPrefix(got, lease.EvidenceV2Prefix) {
			t.Fatalf("the acquisition's own evidence: %.20q, want version 2", got)
		}
		_, err := s.Release(bg, rel)
		mustCode(t, err, lease.CodeCorrupt)
	})
	t.Run("release evidence under another request's key", func(t *testing.T) {
		s, _, _, rel := setup(t)
		v, _ := get(t, s, releaseEvidenceKey(t, s, rel))
		other := rel
		other.RequestID = "req_other"
		if err := s.client.Do(bg, s.client.B().Set().Key(releaseEvidenceKey(t, s, other)).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Release(bg, other)
		mustCode(t, err, lease.CodeCorrupt)
	})
}

// A lease acquired in format 3 (its acquisition's evidence in its own key,
// version 2) and one acquired in format 4 both end after the switch to
// format 5 as it writes; an instance that has not yet read the switch
// still rewrites the evidence of the entries it trims.
func TestReferringEvidenceAcrossTheSwitch(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: so, CompactRecords: true}
	a, b := open(t, r, o), open(t, r, o)
	req3 := acquireReq(newIdentity())
	old, err := a.Acquire(bg, req3)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.EnableEmbeddedEvidence(bg); err != nil {
		t.Fatal(err)
	}
	req4 := acquireReq(newIdentity())
	first4 := acquire4(t, a, req4)
	if err := a.EnableReferringEvidence(bg); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, a, a.keys.format()); v != referringEvidence {
		t.Fatalf("switch %q", v)
	}
	rel3, rel4 := releaseReq(old.Lease), releaseReq(first4.Lease)
	ended3, err := a.Release(bg, rel3)
	if err != nil {
		t.Fatal(err)
	}
	ended4, err := a.Release(bg, rel4)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, a, evidenceKey(t, a, req3)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
		t.Fatalf("format 3 acquisition's evidence: %.10q", v)
	}
	if e := historyEntries(t, a, old.Lease.LockKey)[0]; !strings.HasPrefix(e, lease.HistoryScopedPrefix+"\n") {
		t.Fatalf("format 3 lease's entry: %.10q, want version 4 naming its release alone", e)
	}
	mustReplay(t, a, req3, old, lease.StateReleased)
	mustReleaseReplays(t, a, rel3, ended3)
	mustReplay(t, a, req4, first4, lease.StateReleased)
	mustReleaseReplays(t, a, rel4, ended4)

	// b still writes format 3: its ending on the same identity trims the
	// version 4 entry (cap 1), and the evidence it names is rewritten.
	if b.writes(referringEvidence) || b.writes(embeddedEvidence) {
		t.Fatal("b saw the switch already")
	}
	next, err := b.Acquire(bg, acquireReq(first4.Lease.Identity()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(bg, releaseReq(next.Lease)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{evidenceKey(t, a, req4), releaseEvidenceKey(t, a, rel4)} {
		if v, _ := get(t, a, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("evidence of a trimmed entry: %.10q, want version 2", v)
		}
	}
	mustReplay(t, b, req4, first4, lease.StateExpired)
	mustReleaseReplays(t, b, rel4, ended4)
}

// Evidence refers to a history entry only while the history list outlives
// it: with a history retention shorter than the idempotency retention,
// format 5 writes version 2 evidence and version 2 entries.
func TestReferringEvidenceShortHistoryRetention(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryRetention = time.Hour // below the idempotency retention (at least the maximum lifetime)
	s := open5(t, Options{StoreOptions: so})
	req := acquireReq(newIdentity())
	first := acquire4(t, s, req)
	rel := releaseReq(first.Lease)
	ended, err := s.Release(bg, rel)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{evidenceKey(t, s, req), releaseEvidenceKey(t, s, rel)} {
		if v, _ := get(t, s, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("evidence %.10q, want version 2", v)
		}
	}
	if e := historyEntries(t, s, first.Lease.LockKey)[0]; !strings.HasPrefix(e, lease.HistoryV2Prefix) {
		t.Fatalf("entry %.10q, want version 2", e)
	}
	mustReplay(t, s, req, first, lease.StateReleased)
	mustReleaseReplays(t, s, rel, ended)
}
