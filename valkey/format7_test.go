package valkey

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Tests of stored format 7 (format.go): format 6, and evidence by
// reference (an ending's evidence of the lease's acquisition, a release's
// own) in evidence version 5 (lease.LeanIDEvidence), which readers
// rebuild from the lease's history entry and the library's detach
// rewrites in version 2 before that entry is trimmed.

func open7(t *testing.T, o Options) *Store {
	t.Helper()
	o.LeanEvidence = true
	return openSwitched(t, o, leanEvidence, "lean_evidence")
}

// openSwitched opens a store with o, which asks for format, on a server
// of its own (the test's store options if o has none), and checks the
// namespace's switch is format and the store writes it as written (with
// "+eager" if o.EagerDetach).
func openSwitched(t *testing.T, o Options, format, written string) *Store {
	t.Helper()
	if o.StoreOptions.HistoryPerIdentity == 0 {
		o.StoreOptions = leasetest.StoreOptions()
	}
	s := open(t, sharedServer(t), o)
	if o.EagerDetach {
		written += "+eager"
	}
	if !s.writes(format) || s.writeFormat() != written || mustGet(t, s, s.keys.format()) != format {
		t.Fatalf("the namespace is not in format %s: %q", format, s.writeFormat())
	}
	return s
}

// acquire7 acquires req in a format 6 or 7 namespace and checks what is
// stored: the record in version 4 exactly as Go writes it, no evidence
// key.
func acquire7(t *testing.T, s *Store, req lease.AcquireRequest) lease.Result {
	t.Helper()
	res, err := s.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	mustLean(t, s, req, res.Lease, res.Lease.TTLMs)
	if _, ok := get(t, s, evidenceKey(t, s, req)); ok {
		t.Fatal("an evidence key was written at acquire")
	}
	return res
}

// acqEvidence is the evidence the Go side expects of req's acquisition,
// first its answer.
func acqEvidence(t *testing.T, s *Store, req lease.AcquireRequest, first lease.Result) *lease.IdempotencyRecord {
	t.Helper()
	_, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: lease.OpAcquire, Digest: p.Digest, Code: first.Code,
		Lease: first.Lease, BackendTime: first.BackendTime}
}

// relEvidence is the evidence the Go side expects of release rel, ended
// its answer.
func relEvidence(t *testing.T, s *Store, rel lease.ReleaseRequest, ended lease.Result) *lease.IdempotencyRecord {
	t.Helper()
	_, p, err := lease.PrepareRelease(rel, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: lease.OpRelease, Digest: p.Digest, Code: ended.Code,
		Lease: ended.Lease, BackendTime: ended.BackendTime}
}

// v5Of is e in evidence version 5 referring to entry, the bytes of its
// lease's history entry as stored, as Go writes it.
func v5Of(t *testing.T, e *lease.IdempotencyRecord, entry string) string {
	t.Helper()
	if entry == "" {
		t.Fatalf("no history entry for the expected %s evidence of %s", e.Op, e.Lease.LeaseID)
	}
	b, ok := lease.LeanIDEvidence(e, entry)
	if !ok {
		t.Fatalf("the expected %s evidence has no version 5: %+v", e.Op, e)
	}
	return string(b)
}

// ev5Check is version 5's check of body (the evidence's lines before the
// check) referring to entry, computed here as the format says, apart from
// the code under test: the first 16 lower-case hex digits of the SHA-1 of
// entry, a newline and body.
func ev5Check(entry, body string) string {
	sum := sha1.Sum([]byte(entry + "\n" + body))
	return hex.EncodeToString(sum[:])[:16]
}

// ev5Rechecked is v with its last line replaced by the check of the lines
// before it referring to entry: damage that a check no longer shows (a
// forged value, or damage that the check misses), so that what refuses
// it, if anything, is the rest of the reader.
func ev5Rechecked(v, entry string) string {
	i := strings.LastIndexByte(v, '\n')
	if i < 0 {
		return v + "\n" + ev5Check(entry, v)
	}
	return v[:i+1] + ev5Check(entry, v[:i])
}

// v3Of is e in evidence version 3, as Go writes it.
func v3Of(t *testing.T, e *lease.IdempotencyRecord) string {
	t.Helper()
	b, ok := lease.ReferringEvidence(e)
	if !ok {
		t.Fatalf("the expected %s evidence has no version 3: %+v", e.Op, e)
	}
	return string(b)
}

// v2Of is e in evidence version 2, as Go writes it (what detach and an
// eager ending store).
func v2Of(t *testing.T, e *lease.IdempotencyRecord) string {
	t.Helper()
	b, err := lease.CompactEvidence(e, e.Lease.Identity())
	if err != nil || !strings.HasPrefix(string(b), lease.EvidenceV2Prefix) {
		t.Fatalf("the expected %s evidence in version 2: %.10q %v", e.Op, b, err)
	}
	return string(b)
}

// entryOf is the stored history entry of rec's lease ("" if none).
func entryOf(t *testing.T, s *Store, rec *lease.Record) string {
	t.Helper()
	for _, h := range historyEntries(t, s, rec.LockKey) {
		if strings.Contains(h, "\n"+rec.LeaseID+"\n") {
			return h
		}
	}
	return ""
}

// mustStored checks key holds exactly want.
func mustStored(t *testing.T, s *Store, key, want, what string) {
	t.Helper()
	if got, ok := get(t, s, key); !ok || got != want {
		t.Fatalf("%s: stored\n %q\nwant\n %q", what, got, want)
	}
}

// mustRebuildsInGo checks version 5 evidence raw rebuilds, on the Go
// side alone, from the stored history entry of e's lease into exactly
// e's version 1 bytes, which decode strictly.
func mustRebuildsInGo(t *testing.T, s *Store, raw string, e *lease.IdempotencyRecord) {
	t.Helper()
	entry := entryOf(t, s, e.Lease)
	h, err := lease.DecodeScopedHistory([]byte(entry), e.Lease.LockKey)
	if err != nil {
		t.Fatalf("history entry %.40q: %v", entry, err)
	}
	got, ok := lease.ExpandLeanIDEvidence(raw, entry, h.Record, h.EndedAt)
	want, err := e.Encode()
	if !ok || err != nil || got != string(want) {
		t.Fatalf("%s evidence rebuilt from its entry:\n%s\nwant\n%s", e.Op, got, want)
	}
	if _, err := lease.DecodeIdempotencyRecord([]byte(got)); err != nil {
		t.Fatal(err)
	}
	// Its check is of that entry's bytes: one byte more, and nothing
	// rebuilds.
	if got, ok := lease.ExpandLeanIDEvidence(raw, entry+" ", h.Record, h.EndedAt); ok {
		t.Fatalf("%s evidence rebuilt with other entry bytes: %s", e.Op, got)
	}
}

// Every ending writes the acquisition's evidence in version 5, a release
// its own too, byte for byte as lease.LeanIDEvidence writes the evidence
// of the first answers (the acquisition's expiring at acquired_at + the
// idempotency retention), with a history entry of version 4 naming them;
// replays and lookups answer the first answers byte for byte with the
// state now, and another digest conflicts.
func TestFormat7EveryEndingWritesEV5(t *testing.T) {
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
			acquire7(t, s, acquireReq(res.Lease.Identity()))
			return lease.Result{}
		}},
		// A call that finds its lease expired ends it too (held).
		{"renew_over_expired", true, lease.StateExpired, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			waitExpired(t, s, res.Lease)
			_, err := s.Renew(bg, renewReq(res.Lease))
			mustCode(t, err, lease.CodeLost)
			return lease.Result{}
		}},
		{"release_over_expired", true, lease.StateExpired, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			waitExpired(t, s, res.Lease)
			_, err := s.Release(bg, releaseReq(res.Lease))
			mustCode(t, err, lease.CodeLost)
			return lease.Result{}
		}},
		{"commit_over_expired", true, lease.StateExpired, false, func(t *testing.T, s *Store, res lease.Result) lease.Result {
			waitExpired(t, s, res.Lease)
			_, err := s.AuthorizeCommit(bg, commitReq(res.Lease))
			mustCode(t, err, lease.CodeLost)
			return lease.Result{}
		}},
	}
	for _, e := range endings {
		for _, eager := range []bool{false, true} {
			name := e.name
			if eager {
				name += "/eager" // below the cap: refers all the same
			}
			t.Run(name, func(t *testing.T) {
				s := open7(t, Options{EagerDetach: eager})
				req := acquireReq(newIdentity())
				if e.short {
					req = shortReq(req.Identity)
				}
				first := acquire7(t, s, req)
				acq := acqEvidence(t, s, req, first)
				if !e.short {
					rr := renewReq(first.Lease)
					rr.TTL = 45 * time.Second
					renewed, err := s.Renew(bg, rr)
					if err != nil || renewed.Lease.TTLMs != 45000 {
						t.Fatalf("renew: %+v %v", renewed.Lease, err)
					}
					mustLean(t, s, req, renewed.Lease, first.Lease.TTLMs)
				}
				ended := e.end(t, s, first)
				key := evidenceKey(t, s, req)
				// The check refers to the entry as the library stored it.
				entry := entryOf(t, s, first.Lease)
				want := v5Of(t, acq, entry)
				if !strings.HasPrefix(want, "ev5\na\n") {
					t.Fatalf("LeanIDEvidence: %q", want)
				}
				mustStored(t, s, key, want, "acquisition evidence after the end")
				if at, want := pexpireTime(t, s, key), first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
					t.Fatalf("evidence PXAT %d, want acquired_at + retention %d", at, want)
				}
				_, p, _ := lease.PrepareAcquire(req, s.opts)
				if !strings.HasPrefix(entry, lease.HistoryScopedPrefix+p.Scope+"\n") {
					t.Fatalf("history entry: %.60q, want version 4 naming the acquisition's scope", entry)
				}
				mustRebuildsInGo(t, s, want, acq)
				mustReplay(t, s, req, first, e.want)
				mustStored(t, s, key, want, "acquisition evidence after the replays")
				if e.release {
					if ended.Lease.State != lease.StateReleased {
						t.Fatalf("release answered %+v", ended.Lease)
					}
					re := relEvidence(t, s, rel, ended)
					rwant := v5Of(t, re, entry)
					if !strings.HasPrefix(rwant, "ev5\nr\n") {
						t.Fatalf("LeanIDEvidence of the release: %q", rwant)
					}
					rk := releaseEvidenceKey(t, s, rel)
					mustStored(t, s, rk, rwant, "release evidence")
					if at, min := pexpireTime(t, s, rk), ended.BackendTime.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at < min || at > min+1000 {
						t.Fatalf("release evidence expires at %d, want the retention after its end %d", at, min)
					}
					_, rp, _ := lease.PrepareRelease(rel, s.opts)
					if !strings.HasPrefix(entry, lease.HistoryScopedPrefix+p.Scope+"\n"+rp.Scope+"\n") {
						t.Fatalf("history entry: %.150q, want it to name the release's scope", entry)
					}
					mustRebuildsInGo(t, s, rwant, re)
					mustReleaseReplays(t, s, rel, ended)
					mustStored(t, s, rk, rwant, "release evidence after the replays")
				}
			})
		}
	}
}

// A lease whose id does not start with lease.LeaseIDPrefix (acquired in
// format 5, its record in version 3, which format 6 and 7 keep for it)
// still ends with version 5 evidence naming its id, as Go writes it.
func TestFormat7ForeignLeaseID(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), ReferringEvidence: true}
	a := open(t, r, o)
	req := acquireReq(newIdentity())
	res, err := a.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	key := a.keys.active(tagOf(res.Lease.LockKey))
	foreign := "lzase_" + strings.TrimPrefix(res.Lease.LeaseID, lease.LeaseIDPrefix)
	raw := strings.Replace(mustGet(t, a, key), "\n"+res.Lease.LeaseID+"\n", "\n"+foreign+"\n", 1)
	if !strings.HasPrefix(raw, lease.RecordV3Prefix) || !strings.Contains(raw, "\n"+foreign+"\n") {
		t.Fatalf("setup: %.60q", raw)
	}
	if err := a.client.Do(bg, a.client.B().Set().Key(key).Value(raw).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	o.ReferringEvidence, o.LeanEvidence = false, true
	s := open(t, r, o)
	if s.writeFormat() != "lean_evidence" {
		t.Fatalf("write format %q", s.writeFormat())
	}
	// The first answer as the foreign record gives it.
	first := res
	first.Lease = res.Lease.Clone()
	first.Lease.LeaseID = foreign
	mustReplay(t, s, req, first, "")
	rn := renewReq(first.Lease)
	rn.TTL = 45 * time.Second
	if _, err := s.Renew(bg, rn); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, s, key); !strings.HasPrefix(v, lease.RecordV3Prefix) {
		t.Fatalf("renewed in format 7: %.10q", v)
	}
	rel := releaseReq(first.Lease)
	ended, err := s.Release(bg, rel)
	if err != nil || ended.Lease.LeaseID != foreign {
		t.Fatalf("release: %+v %v", ended.Lease, err)
	}
	entry := entryOf(t, s, first.Lease)
	want := v5Of(t, acqEvidence(t, s, req, first), entry)
	if !strings.Contains(want, "\n"+foreign+"\n") {
		t.Fatalf("setup: %q", want)
	}
	mustStored(t, s, evidenceKey(t, s, req), want, "acquisition evidence")
	mustStored(t, s, releaseEvidenceKey(t, s, rel), v5Of(t, relEvidence(t, s, rel, ended), entry), "release evidence")
	mustReplay(t, s, req, first, lease.StateReleased)
	mustReleaseReplays(t, s, rel, ended)
}

// v7Life is one lease of an identity in these tests, with the evidence
// the Go side expects of it.
type v7Life struct {
	eagerLife
	acqEv, relEv *lease.IdempotencyRecord
	relPX        int64  // the release evidence's PEXPIRETIME as written
	entry        string // its history entry as stored at its end
}

// endLife7 is endLife (a release if release, else a revocation) with
// the expected evidence.
func endLife7(t *testing.T, s *Store, id lease.Identity, release bool) v7Life {
	t.Helper()
	return endRenewed7(t, s, id, release, 0)
}

// endRenewed7 is endLife7 with a renewal to ttl before the end (none if
// 0): the lease's record and history entry then hold that ttl, not the
// acquisition's.
func endRenewed7(t *testing.T, s *Store, id lease.Identity, release bool, ttl time.Duration) v7Life {
	t.Helper()
	l := v7Life{eagerLife: eagerLife{acq: acquireReq(id), state: lease.StateReleased}}
	var err error
	if l.first, err = s.Acquire(bg, l.acq); err != nil {
		t.Fatal(err)
	}
	cur := l.first.Lease
	if ttl > 0 {
		rn := renewReq(cur)
		rn.TTL = ttl
		renewed, err := s.Renew(bg, rn)
		if err != nil || renewed.Lease.TTLMs != ttl.Milliseconds() {
			t.Fatalf("renew: %+v %v", renewed.Lease, err)
		}
		cur = renewed.Lease
	}
	if release {
		l.rel = releaseReq(cur)
		if l.ended, err = s.Release(bg, l.rel); err != nil {
			t.Fatal(err)
		}
	} else if _, err := s.Revoke(bg, adminReq(cur)); err != nil {
		t.Fatal(err)
	} else {
		l.state = lease.StateRevoked
	}
	l.acqEv = acqEvidence(t, s, l.acq, l.first)
	if l.entry = entryOf(t, s, l.first.Lease); l.entry == "" {
		t.Fatal("the ending wrote no history entry of the lease")
	}
	if release {
		l.relEv = relEvidence(t, s, l.rel, l.ended)
		l.relPX = pexpireTime(t, s, releaseEvidenceKey(t, s, l.rel))
	}
	return l
}

// mustForms checks the life's evidence is stored exactly as form
// ("ev5", "ev3", "ev2" or "ev6") writes the expected evidence (version 5's
// referring to the entry stored at its end; version 6's checked for the
// key it is stored under), the acquisition's expiring at acquired_at + the
// retention and the release's as written.
func (l v7Life) mustForms(t *testing.T, s *Store, form, where string) {
	t.Helper()
	of := func(t *testing.T, e *lease.IdempotencyRecord, key string) string {
		t.Helper()
		switch form {
		case "ev5":
			return v5Of(t, e, l.entry)
		case "ev3":
			return v3Of(t, e)
		case "ev2":
			return v2Of(t, e)
		case "ev6":
			return v6Of(t, e, key)
		}
		t.Fatalf("no evidence form %q", form)
		return ""
	}
	key := evidenceKey(t, s, l.acq)
	mustStored(t, s, key, of(t, l.acqEv, key), where+": acquisition evidence in "+form)
	if at, want := pexpireTime(t, s, key), l.first.Lease.AcquiredAt.UnixMilli()+s.opts.IdempotencyRetention.Milliseconds(); at != want {
		t.Fatalf("%s: acquisition evidence PXAT %d, want %d (kept)", where, at, want)
	}
	if l.relEv != nil {
		rk := releaseEvidenceKey(t, s, l.rel)
		mustStored(t, s, rk, of(t, l.relEv, rk), where+": release evidence in "+form)
		if at := pexpireTime(t, s, rk); at != l.relPX {
			t.Fatalf("%s: release evidence PXAT %d, want %d as written (kept)", where, at, l.relPX)
		}
	}
}

// An identity whose history is at its cap (2) drops its oldest entry with
// each ending, lives mixing releases and revocations, some renewed to
// another ttl before they end: the version 5
// evidence that refers to it is rewritten first in version 2, byte for
// byte what Go writes of the same evidence, its TTL kept, and still
// answers byte for byte; the untrimmed lives' stays version 5. With
// EagerDetach, an ending that trims a live entry writes version 2 at
// once, the same bytes detach writes.
func TestFormat7DetachedOnTrim(t *testing.T) {
	for _, eager := range []bool{false, true} {
		t.Run(map[bool]string{false: "refer", true: "eager"}[eager], func(t *testing.T) {
			so := leasetest.StoreOptions()
			so.HistoryPerIdentity = 2
			s := open7(t, Options{StoreOptions: so, EagerDetach: eager})
			id := newIdentity()
			var lives []v7Life
			for i := 0; i < 6; i++ {
				// Releases and revocations, some renewed to another ttl.
				l := endRenewed7(t, s, id, i%2 == 0 || i == 5, time.Duration(i%3)*25*time.Second)
				entry := historyEntries(t, s, l.first.Lease.LockKey)[0]
				if i < 2 || !eager {
					l.mustForms(t, s, "ev5", "life "+strconv.Itoa(i)+" just ended")
					if !strings.HasPrefix(entry, lease.HistoryScopedPrefix) {
						t.Fatalf("life %d: entry %.10q, want version 4", i, entry)
					}
				} else {
					l.mustForms(t, s, "ev2", "life "+strconv.Itoa(i)+" just ended eagerly")
					if !strings.HasPrefix(entry, lease.HistoryV2Prefix) {
						t.Fatalf("life %d: entry %.10q, want version 2", i, entry)
					}
				}
				lives = append(lives, l)
			}
			if n := len(historyEntries(t, s, lives[0].first.Lease.LockKey)); n != 2 {
				t.Fatalf("%d history entries, want the cap 2", n)
			}
			for i, l := range lives {
				trimmed := i < 4
				form := "ev5"
				if trimmed || eager {
					form = "ev2"
				}
				l.mustForms(t, s, form, "life "+strconv.Itoa(i))
				if trimmed {
					if entryOf(t, s, l.first.Lease) != "" {
						t.Fatalf("life %d: its entry is still listed", i)
					}
				} else if !eager {
					mustRebuildsInGo(t, s, v5Of(t, l.acqEv, l.entry), l.acqEv)
				}
				state := l.state
				if trimmed {
					state = lease.StateExpired // its entry was trimmed (lease.CurrentOf)
				}
				l.mustAnswer(t, s, state)
				l.mustForms(t, s, form, "life "+strconv.Itoa(i)+" after its replays")
			}
		})
	}
}

// keysSnapshot is every key of a damage test's identity that a replay must
// leave as it is.
func keysSnapshot(t *testing.T, s *Store, keys []string, lockKey string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range keys {
		v, ok := get(t, s, k)
		b.WriteString(k + "=" + strconv.FormatBool(ok) + ":" + v + "\x00")
	}
	b.WriteString(strings.Join(historyEntries(t, s, lockKey), "\x01"))
	v, ok := get(t, s, s.keys.active(tagOf(lockKey)))
	b.WriteString("\x00active=" + strconv.FormatBool(ok) + ":" + v)
	return b.String()
}

// Damaged version 5 evidence fails closed: corrupt, never a result, for
// the replay and the lookup, and nothing changes. Its entry then trimmed,
// the library's detach leaves it as it is (it reads it as the Go reader
// does: not evidence of that entry), so it still answers no result; the
// lives' undamaged evidence is detached as usual. Each damage is tried as
// it is (its check, if any, no longer that of its lines) and, where that
// is other bytes, "rechecked": its check recomputed for its lines and a's
// entry, so that the lines, not the check, are what is refused. A TTL one
// millisecond off, which no version before 5 could tell from the TTL
// granted, is now refused by the check (rechecked, it is a forgery the
// check cannot tell: see TestAttackEV5DamagedEvidenceReaderAndDetachAgree).
func TestFormat7DamageFailsClosed(t *testing.T) {
	type damage struct {
		release bool // the release's evidence, else the acquisition's
		// bad is the damaged value from a's and b's evidence as stored.
		bad func(a, b v7Life, av, rv, bav, brv string) string
		// other, if set, puts the damaged value under another request's
		// key instead of a's own.
		other bool
	}
	lines := func(v string) []string { return strings.Split(v, "\n") }
	with := func(v string, i int, s string) string {
		l := lines(v)
		l[i] = s
		return strings.Join(l, "\n")
	}
	without := func(v string, i int) string { // line i removed
		l := lines(v)
		return strings.Join(append(l[:i:i], l[i+1:]...), "\n")
	}
	insert := func(v string, i int, s string) string { // s as line i
		l := lines(v)
		return strings.Join(append(l[:i:i], append([]string{s}, l[i:]...)...), "\n")
	}
	last := func(v string) string { return lines(v)[len(lines(v))-1] } // the check
	stray := func(v string) string {                                   // the digest's last character's low bits set
		l := lines(v)
		c := strings.IndexByte(b64URL, l[2][42])
		l[2] = l[2][:42] + string(b64URL[c&^3|((c+1)&3)])
		return strings.Join(l, "\n")
	}
	ttlPlus := func(v string, d int) string {
		n, err := strconv.Atoi(lines(v)[5])
		if err != nil {
			t.Fatal(err)
		}
		return with(v, 5, strconv.Itoa(n+d))
	}
	hexPlus := func(c string, i int) string { // hex digit i + 1
		const h = "0123456789abcdef"
		return c[:i] + string(h[(strings.IndexByte(h, c[i])+1)%16]) + c[i+1:]
	}
	damages := map[string]damage{
		"acquisition, token changed": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 4, utoa(a.first.Lease.FencingToken+1))
		}, false},
		"acquisition, token of b": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 4, utoa(b.first.Lease.FencingToken))
		}, false},
		"acquisition, token with a leading zero": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 4, "0"+utoa(a.first.Lease.FencingToken))
		}, false},
		"acquisition, lease id of b": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 3, b.first.Lease.LeaseID)
		}, false},
		"acquisition, b's evidence": {false, func(a, b v7Life, av, rv, bav, brv string) string { return bav }, false},
		"acquisition, digest re-spelled": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return stray(av)
		}, false},
		"acquisition, ttl with a leading zero": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 5, "0"+lines(av)[5])
		}, false},
		"acquisition, a line added": {false, func(a, b v7Life, av, rv, bav, brv string) string { return av + "\n1" }, false},
		"acquisition, a line added before the check": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return insert(av, 6, "1")
		}, false},
		"acquisition, ttl removed": {false, func(a, b v7Life, av, rv, bav, brv string) string { return without(av, 5) }, false},
		// The TTL one millisecond off: a value every reader takes, which
		// only the evidence holds (the entry holds the renewal's).
		"acquisition, ttl 1 ms less": {false, func(a, b v7Life, av, rv, bav, brv string) string { return ttlPlus(av, -1) }, false},
		"acquisition, ttl 1 ms more": {false, func(a, b v7Life, av, rv, bav, brv string) string { return ttlPlus(av, 1) }, false},
		// The check line itself.
		"acquisition, check digit changed": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 6, hexPlus(last(av), 15))
		}, false},
		"acquisition, check of b's entry": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return ev5Rechecked(av, b.entry)
		}, false},
		"acquisition, check upper-case": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 6, upperCheck(last(av)))
		}, false},
		"acquisition, check of 15 digits": {false, func(a, b v7Life, av, rv, bav, brv string) string { return with(av, 6, last(av)[:15]) }, false},
		"acquisition, check of 17 digits": {false, func(a, b v7Life, av, rv, bav, brv string) string { return av + "0" }, false},
		"acquisition, check not hex": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(av, 6, last(av)[:15]+"g")
		}, false},
		"acquisition, check removed": {false, func(a, b v7Life, av, rv, bav, brv string) string { return without(av, 6) }, false},
		"acquisition, lease id removed": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			l := lines(av)
			return strings.Join(append(l[:3:3], l[4:]...), "\n")
		}, false},
		"acquisition, as a release": {false, func(a, b v7Life, av, rv, bav, brv string) string {
			return without(with(av, 1, "r"), 5)
		}, false},
		"acquisition, in CRLF":                     {false, func(a, b v7Life, av, rv, bav, brv string) string { return strings.ReplaceAll(av, "\n", "\r\n") }, false},
		"acquisition, a trailing space":            {false, func(a, b v7Life, av, rv, bav, brv string) string { return av + " " }, false},
		"acquisition, the release's":               {false, func(a, b v7Life, av, rv, bav, brv string) string { return rv }, false},
		"acquisition, under another request's key": {false, func(a, b v7Life, av, rv, bav, brv string) string { return av }, true},
		"release, token changed": {true, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(rv, 4, utoa(a.first.Lease.FencingToken+1))
		}, false},
		"release, lease id of b": {true, func(a, b v7Life, av, rv, bav, brv string) string { return with(rv, 3, b.first.Lease.LeaseID) }, false},
		"release, b's evidence":  {true, func(a, b v7Life, av, rv, bav, brv string) string { return brv }, false},
		"release, digest re-spelled": {true, func(a, b v7Life, av, rv, bav, brv string) string {
			return stray(rv)
		}, false},
		"release, carrying a ttl": {true, func(a, b v7Life, av, rv, bav, brv string) string { return insert(rv, 5, "30000") }, false},
		"release, token removed":  {true, func(a, b v7Life, av, rv, bav, brv string) string { return without(rv, 4) }, false},
		"release, as an acquisition": {true, func(a, b v7Life, av, rv, bav, brv string) string {
			return insert(with(rv, 1, "a"), 5, "30000")
		}, false},
		"release, check digit changed": {true, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(rv, 5, hexPlus(last(rv), 0))
		}, false},
		"release, check of b's entry": {true, func(a, b v7Life, av, rv, bav, brv string) string {
			return ev5Rechecked(rv, b.entry)
		}, false},
		"release, check removed": {true, func(a, b v7Life, av, rv, bav, brv string) string { return without(rv, 5) }, false},
		"release, check upper-case": {true, func(a, b v7Life, av, rv, bav, brv string) string {
			return with(rv, 5, upperCheck(last(rv)))
		}, false},
		"release, a trailing CR":               {true, func(a, b v7Life, av, rv, bav, brv string) string { return rv + "\r" }, false},
		"release, the acquisition's":           {true, func(a, b v7Life, av, rv, bav, brv string) string { return av }, false},
		"release, under another request's key": {true, func(a, b v7Life, av, rv, bav, brv string) string { return rv }, true},
	}
	// Damage that, rechecked, is a's evidence as stored (the check line's
	// own, a trailing space or CR on it) or what the damage already is (a
	// value with a's check moved as it is); and the TTL one millisecond
	// off, which rechecked is a forgery the check cannot tell from the TTL
	// granted.
	notRechecked := map[string]bool{
		"acquisition, a trailing space": true, "acquisition, the release's": true, "acquisition, under another request's key": true,
		"release, a trailing CR": true, "release, the acquisition's": true, "release, under another request's key": true,
		"acquisition, check digit changed": true, "acquisition, check of b's entry": true, "acquisition, check upper-case": true,
		"acquisition, check of 15 digits": true, "acquisition, check of 17 digits": true, "acquisition, check not hex": true,
		"release, check digit changed": true, "release, check of b's entry": true, "release, check upper-case": true,
		"acquisition, ttl 1 ms less": true, "acquisition, ttl 1 ms more": true,
	}
	for name, d := range damages {
		for _, recheck := range []bool{false, true} {
			if recheck && notRechecked[name] {
				continue
			}
			sub := name
			if recheck {
				sub += "/rechecked"
			}
			t.Run(sub, func(t *testing.T) { damageFailsClosed(t, d.release, d.other, recheck, d.bad) })
		}
	}
}

// damageFailsClosed is one case of TestFormat7DamageFailsClosed: the
// value damage gives (rechecked for a's entry if recheck) replaces a's
// evidence (of its release if release), or goes under another request's
// key if other.
func damageFailsClosed(t *testing.T, release, other, recheck bool, damage func(a, b v7Life, av, rv, bav, brv string) string) {
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	s := open7(t, Options{StoreOptions: so})
	id := newIdentity()
	a := endRenewed7(t, s, id, true, 45*time.Second)
	b := endLife7(t, s, id, true)
	a.mustForms(t, s, "ev5", "a")
	b.mustForms(t, s, "ev5", "b")
	av, rv := v5Of(t, a.acqEv, a.entry), v5Of(t, a.relEv, a.entry)
	bav, brv := v5Of(t, b.acqEv, b.entry), v5Of(t, b.relEv, b.entry)
	bad := damage(a, b, av, rv, bav, brv)
	orig := map[bool]string{false: av, true: rv}[release]
	if recheck {
		damaged := bad
		if bad = ev5Rechecked(damaged, a.entry); bad == damaged || bad == orig {
			t.Fatalf("setup: rechecked, the damage is %q", bad)
		}
	}
	if bad == orig && !other {
		t.Fatalf("setup: not damaged: %q", bad)
	}
	// a's evidence left as it was: both with other, else the
	// one not damaged.
	acqIntact, relIntact := release || other, !release || other
	// The key it goes under, and the request that reads it.
	acqReq, relReq := a.acq, a.rel
	if other {
		acqReq.RequestID, relReq.RequestID = uid("req_"), uid("req_")
	}
	key := evidenceKey(t, s, acqReq)
	if release {
		key = releaseEvidenceKey(t, s, relReq)
	}
	if other {
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(bad).Px(time.Hour).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	} else if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(bad).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	keys := []string{evidenceKey(t, s, a.acq), releaseEvidenceKey(t, s, a.rel), evidenceKey(t, s, b.acq),
		releaseEvidenceKey(t, s, b.rel), key}
	before := keysSnapshot(t, s, keys, a.first.Lease.LockKey)
	probe := func(when string) {
		t.Helper()
		var res lease.Result
		var err error
		op := lease.OpAcquire
		if release {
			op = lease.OpRelease
			res, err = s.Release(bg, relReq)
		} else {
			res, err = s.Acquire(bg, acqReq)
		}
		if lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: the replay answered %+v %v, want corrupt", when, res, err)
		}
		reqID := acqReq.RequestID
		if release {
			reqID = relReq.RequestID
		}
		lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: op, Identity: id, PrincipalID: owner.PrincipalID,
			RequestID: reqID, DeadlineAt: far()})
		if lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: the lookup answered %+v %v, want corrupt", when, lr, err)
		}
	}
	probe("damaged")
	if after := keysSnapshot(t, s, keys, a.first.Lease.LockKey); after != before {
		t.Fatalf("a refused replay changed the store:\n%q\nwas\n%q", after, before)
	}
	// a's evidence not damaged still answers.
	if relIntact {
		mustReleaseReplays(t, s, a.rel, a.ended)
	}
	if acqIntact {
		mustReplay(t, s, a.acq, a.first, lease.StateReleased)
	}

	// Two more endings trim a's entry, then b's.
	c := endLife7(t, s, id, true)
	if entryOf(t, s, a.first.Lease) != "" {
		t.Fatal("a's entry is still listed")
	}
	mustStored(t, s, key, bad, "the damaged evidence, a's entry trimmed")
	endLife7(t, s, id, false)
	if entryOf(t, s, b.first.Lease) != "" {
		t.Fatal("b's entry is still listed")
	}
	mustStored(t, s, key, bad, "the damaged evidence, b's entry trimmed")
	probe("trimmed")
	// What was not damaged was detached as usual and answers.
	b.mustForms(t, s, "ev2", "b")
	b.mustAnswer(t, s, lease.StateExpired)
	if relIntact {
		mustStored(t, s, releaseEvidenceKey(t, s, a.rel), v2Of(t, a.relEv), "a's release evidence")
		mustReleaseReplays(t, s, a.rel, a.ended)
	}
	if acqIntact {
		mustStored(t, s, evidenceKey(t, s, a.acq), v2Of(t, a.acqEv), "a's acquisition evidence")
		mustReplay(t, s, a.acq, a.first, lease.StateExpired)
	}
	c.mustForms(t, s, "ev5", "c")
}

// b64URL is base64url's alphabet: a character's index is its value.
const b64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// Version 5 evidence whose history entry is gone (the list deleted)
// answers corrupt, for the acquisition and the release, their replays
// and lookups, and nothing changes.
func TestFormat7EntryGone(t *testing.T) {
	s := open7(t, Options{})
	id := newIdentity()
	l := endLife7(t, s, id, true)
	l.mustForms(t, s, "ev5", "ended")
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.history(tagOf(l.first.Lease.LockKey))).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	keys := []string{evidenceKey(t, s, l.acq), releaseEvidenceKey(t, s, l.rel)}
	before := keysSnapshot(t, s, keys, l.first.Lease.LockKey)
	res, err := s.Acquire(bg, l.acq)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("acquisition replay: %+v %v", res, err)
	}
	_, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: id, PrincipalID: owner.PrincipalID,
		RequestID: l.acq.RequestID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	res, err = s.Release(bg, l.rel)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("release replay: %+v %v", res, err)
	}
	_, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRelease, Identity: id, PrincipalID: owner.PrincipalID,
		RequestID: l.rel.RequestID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	if after := keysSnapshot(t, s, keys, l.first.Lease.LockKey); after != before {
		t.Fatalf("a refused replay changed the store:\n%q\nwas\n%q", after, before)
	}
	l.mustForms(t, s, "ev5", "after the refusals")
}

// Instances of one namespace in format 7 where one has not yet read the
// switch (it still writes format 6: version 3 evidence by reference): each
// reads what the other wrote, byte for byte; the endings of either trim
// entries whose evidence is of either version, and each is detached in
// version 2 as Go writes it.
func TestFormat7MixedWriters(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	prefix := randomPrefix()
	a := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, LeanEvidence: true})
	b := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, LeanRecords: true})
	if v := mustGet(t, a, a.keys.format()); v != leanEvidence || !b.writes(leanEvidence) {
		t.Fatalf("switch %q", v)
	}
	b.setFormat(leanRecords) // has not yet read the switch
	if a.writeFormat() != "lean_evidence" || b.writeFormat() != "lean_records" {
		t.Fatalf("write formats %q and %q", a.writeFormat(), b.writeFormat())
	}
	id := newIdentity()
	writers := []*Store{a, b, b, a, a, b, b}
	var lives []v7Life
	for i, w := range writers {
		l := endRenewed7(t, w, id, i != 2 && i != 4, time.Duration(i%2)*40*time.Second)
		form := "ev5"
		if w == b {
			form = "ev3"
		}
		l.mustForms(t, w, form, "life "+strconv.Itoa(i)+" just ended")
		// Either instance answers it.
		for _, rd := range []*Store{a, b} {
			l.mustAnswer(t, rd, l.state)
		}
		lives = append(lives, l)
		// This ending trimmed the entry two back, whichever wrote it.
		if i >= 2 {
			old := lives[i-2]
			if entryOf(t, a, old.first.Lease) != "" {
				t.Fatalf("life %d's entry is still listed", i-2)
			}
			old.mustForms(t, a, "ev2", "life "+strconv.Itoa(i-2)+", trimmed by "+map[*Store]string{a: "a", b: "b"}[w])
		}
	}
	for i, l := range lives {
		state := l.state
		if i < len(lives)-2 {
			state = lease.StateExpired
		}
		for _, rd := range []*Store{a, b} {
			l.mustAnswer(t, rd, state)
		}
	}
}

// A build from before format 7 (its library without level 7 and without
// reading version 5: simulated) refuses to lower the switch and answers a
// replay of version 5 evidence as corrupt, never a result; its trims
// leave version 5 evidence as it is, which then answers corrupt here too.
// This build refuses to raise a switch it does not know ("9") and leaves
// it.
func TestFormat7OlderBuildAndGate(t *testing.T) {
	r := sharedServer(t)
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 1
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: so, LeanRecords: true}
	s := open(t, r, o)
	if err := s.EnableLeanEvidence(bg); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, s, s.keys.format()); v != leanEvidence || s.writeFormat() != "lean_evidence" {
		t.Fatalf("after EnableLeanEvidence: switch %q, writing %q", v, s.writeFormat())
	}
	// An earlier format's switch never takes it back.
	if err := s.EnableLeanRecords(bg); err != nil {
		t.Fatal(err)
	}
	if err := s.EnableReferringEvidence(bg); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, s, s.keys.format()); v != leanEvidence || !s.writes(leanEvidence) {
		t.Fatalf("an earlier format's switch lowered it to %q", v)
	}
	id := newIdentity()
	l := endLife7(t, s, id, true)
	l.mustForms(t, s, "ev5", "ended")
	av, rv := v5Of(t, l.acqEv, l.entry), v5Of(t, l.relEv, l.entry)

	old := olderBuild(t, r, o.KeyPrefix, ", ['7'] = 7",
		"  if string.sub(ev, 1, 4) == 'ev5\\n' then\n    local id = string.match(ev, '^ev5\\n[ar]\\n[^\\n]*\\n([^\\n]*)\\n')\n    if is_id(id) then return id end\n    return nil\n  end\n",
		" or v == 'ev5\\n'")
	old.setFormat("") // a switch it does not know: it writes version 1
	old.opts.HistoryPerIdentity = 1
	mustCode(t, old.raiseFormat(bg, leanRecords), lease.CodeCorrupt)
	if v := mustGet(t, old, old.keys.format()); v != leanEvidence {
		t.Fatalf("an older build changed the switch to %q", v)
	}
	res, err := old.Acquire(bg, l.acq)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("an older build's acquisition replay: %+v %v, want corrupt", res, err)
	}
	_, err = old.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: id, PrincipalID: owner.PrincipalID,
		RequestID: l.acq.RequestID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	res, err = old.Release(bg, l.rel)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("an older build's release replay: %+v %v, want corrupt", res, err)
	}
	// Its Go side too: version 5 is no version it reads.
	for _, v := range []string{av, rv} {
		if _, ok := lease.ReferredLeaseID(v); ok {
			t.Fatalf("%q read as version 3", v)
		}
		if v1, ok := lease.ExpandEvidence(v, id); ok {
			if _, err := lease.DecodeIdempotencyRecord([]byte(v1)); err == nil {
				t.Fatalf("%q read as version 1", v)
			}
		}
	}
	l.mustForms(t, s, "ev5", "after the older build's refusals")
	// This build still answers it.
	l.mustAnswer(t, s, lease.StateReleased)

	// The older build's ending on the identity trims the entry; its detach
	// does not know version 5 and leaves it: this build then answers
	// corrupt, never a result.
	next, err := old.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Release(bg, releaseReq(next.Lease)); err != nil {
		t.Fatal(err)
	}
	if entryOf(t, s, l.first.Lease) != "" {
		t.Fatal("the entry is still listed")
	}
	mustStored(t, s, evidenceKey(t, s, l.acq), av, "acquisition evidence after an older build's trim")
	mustStored(t, s, releaseEvidenceKey(t, s, l.rel), rv, "release evidence after an older build's trim")
	res, err = s.Acquire(bg, l.acq)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("a replay of version 5 whose entry an older build trimmed: %+v %v, want corrupt", res, err)
	}
	res, err = s.Release(bg, l.rel)
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("a release replay of version 5 whose entry an older build trimmed: %+v %v, want corrupt", res, err)
	}

	// A later format's switch: refused, and left as it is.
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.format()).Value("9").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, s.EnableLeanEvidence(bg), lease.CodeCorrupt)
	if v := mustGet(t, s, s.keys.format()); v != "9" {
		t.Fatalf("the unknown switch became %q", v)
	}
	if !s.writes(leanEvidence) {
		t.Fatal("a refused raise changed the store's own format")
	}
	s.loadFormat(bg)
	if s.writes(compactFormat) || s.writeFormat() != "v1" {
		t.Fatalf("an unknown switch is written as %q, want version 1", s.writeFormat())
	}
}

// Evidence refers to a history entry only while the history list outlives
// it: with a history retention below the idempotency retention, format 7
// writes version 2 evidence (as Go writes it) and version 2 entries.
func TestFormat7ShortHistoryRetention(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryRetention = time.Hour
	s := open7(t, Options{StoreOptions: so})
	l := endLife7(t, s, newIdentity(), true)
	l.mustForms(t, s, "ev2", "ended")
	if e := historyEntries(t, s, l.first.Lease.LockKey)[0]; !strings.HasPrefix(e, lease.HistoryV2Prefix) {
		t.Fatalf("entry %.10q, want version 2", e)
	}
	l.mustAnswer(t, s, lease.StateReleased)
}

// A release's version 5 evidence whose history entry no longer says the
// lease was released (its state line damaged) answers corrupt, and the
// entry then trimmed, detach leaves it as it is: the library reads that
// entry as the Go reader does, not a release's. The acquisition's
// evidence, which takes nothing from the entry's state, checks the
// entry's bytes all the same (version 5's check): it answers corrupt too
// and is left as it is, where before the check it was detached from the
// damaged entry into the first answer.
func TestFormat7DamagedEntryState(t *testing.T) {
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity = 2
	s := open7(t, Options{StoreOptions: so})
	id := newIdentity()
	a := endLife7(t, s, id, true)
	endLife7(t, s, id, true)
	hk := s.keys.history(tagOf(a.first.Lease.LockKey))
	entry := entryOf(t, s, a.first.Lease)
	damaged := strings.Replace(entry, "\nreleased\n", "\nrevoked\n", 1)
	if damaged == entry || historyEntries(t, s, a.first.Lease.LockKey)[1] != entry {
		t.Fatalf("setup: entry %q", entry)
	}
	if err := s.client.Do(bg, s.client.B().Lset().Key(hk).Index(1).Element(damaged).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.DecodeScopedHistory([]byte(damaged), a.first.Lease.LockKey); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("the damaged entry decodes: %v", err)
	}
	// The evidence as written, its check of the entry before the damage.
	av, rv := v5Of(t, a.acqEv, entry), v5Of(t, a.relEv, entry)
	ak, rk := evidenceKey(t, s, a.acq), releaseEvidenceKey(t, s, a.rel)
	for _, when := range []string{"damaged", "trimmed"} {
		if when == "trimmed" {
			endLife7(t, s, id, true) // trims a's entry
			if entryOf(t, s, a.first.Lease) != "" {
				t.Fatal("a's entry is still listed")
			}
		}
		res, err := s.Release(bg, a.rel)
		if lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: release replay %+v %v, want corrupt", when, res, err)
		}
		mustStored(t, s, rk, rv, when+": release evidence")
		res, err = s.Acquire(bg, a.acq)
		if lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: acquisition replay %+v %v, want corrupt", when, res, err)
		}
		mustStored(t, s, ak, av, when+": acquisition evidence")
	}
}

// oneOff is line with one character changed to another of its kind, so
// that an entry stays decodable where it can: its last digit or letter,
// a digit to the next (9 to 8), a letter to the next (z to y, Z to Y). A
// line with neither has its last character changed to 'x'; an empty line
// becomes "x".
func oneOff(line string) string {
	for j := len(line) - 1; j >= 0; j-- {
		var d byte
		switch c := line[j]; {
		case c >= '0' && c <= '8', c >= 'a' && c <= 'y', c >= 'A' && c <= 'Y':
			d = c + 1
		case c == '9', c == 'z', c == 'Z':
			d = c - 1
		default:
			continue
		}
		return line[:j] + string(d) + line[j+1:]
	}
	if line == "" {
		return "x"
	}
	return line[:len(line)-1] + "x"
}

// Version 5's check covers its lease's history entry byte for byte: a
// released lease in format 7 whose version 4 entry is damaged in any one
// of its lines (one character changed by oneOff, so that the entry still
// decodes where it can: ended_at, a token, a TTL, a lifetime one more)
// answers its acquisition's and its release's replays and lookups corrupt
// or exactly the first answers, never another result; and once that
// entry is trimmed (a cap of 2, two more leases ended), the library's
// detach leaves the bytes of each evidence whose reader answered corrupt
// as they were, and the replays still answer corrupt or the first
// answers.
func TestFormat7CheckCoversEntryAndEvidence(t *testing.T) {
	s := ev5Store(t, sharedServer(t), 2, Options{})
	shape := ev5End(t, s, newIdentity(), true) // an entry like each case's
	n := len(strings.Split(entryOf(t, s, shape.first.Lease), "\n"))
	if n < 30 {
		t.Fatalf("setup: an entry of %d lines", n)
	}
	corrupt := "error " + string(lease.CodeCorrupt)
	decodable, answered := 0, 0
	for i := 0; i < n; i++ {
		t.Run("line_"+strconv.Itoa(i), func(t *testing.T) {
			id := newIdentity()
			l := ev5End(t, s, id, true)
			l.mustEV5Stored(t, s)
			l.mustFirst(t, s, "undamaged")
			entry := entryOf(t, s, l.first.Lease)
			keys := []string{evidenceKey(t, s, l.acq), releaseEvidenceKey(t, s, l.rel)}
			stored := []string{mustGet(t, s, keys[0]), mustGet(t, s, keys[1])}
			editEntry(t, s, id, l.first.Lease.LeaseID, func(f []string) { f[i] = oneOff(f[i]) })
			list := historyEntries(t, s, lockKey(t, id))
			if len(list) != 1 || list[0] == entry || len(list[0]) != len(entry)+map[bool]int{true: 1}[strings.Split(entry, "\n")[i] == ""] {
				t.Fatalf("setup: the damaged entry %q, was %q", list, entry)
			}
			damaged := list[0]
			h, err := lease.DecodeScopedHistory([]byte(damaged), l.first.Lease.LockKey)
			if err == nil {
				decodable++
				t.Logf("line %d %q -> %q: the entry still decodes (lease %s)", i, strings.Split(entry, "\n")[i], strings.Split(damaged, "\n")[i], h.Record.LeaseID)
			}
			firsts := []lease.Result{l.first, l.ended}
			// outcomes are the acquisition's and the release's replay and
			// lookup, each corrupt or exactly the first answer.
			outcomes := func(when string) []string {
				t.Helper()
				var out []string
				for k, op := range []lease.Op{lease.OpAcquire, lease.OpRelease} {
					replay := l.acquireOutcome(t, s)
					reqID, principal := l.acq.RequestID, l.acq.Caller.PrincipalID
					if op == lease.OpRelease {
						replay = l.releaseOutcome(t, s)
						reqID, principal = l.rel.RequestID, l.rel.Caller.PrincipalID
					}
					if replay != corrupt && replay != answerOf(t, firsts[k]) {
						t.Fatalf("%s, line %d damaged: the %s replay answered\n %s\nwant corrupt or the first answer\n %s",
							when, i, op, replay, answerOf(t, firsts[k]))
					}
					lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: op, Identity: id, PrincipalID: principal,
						RequestID: reqID, DeadlineAt: far()})
					var lookup string
					if err != nil {
						lookup = "error " + string(lease.CodeOf(err))
					} else if encoded(t, lr.Lease) == encoded(t, firsts[k].Lease) && lr.BackendTime.UnixMilli() == firsts[k].BackendTime.UnixMilli() {
						lookup = answerOf(t, firsts[k])
					} else {
						lookup = "another answer: " + encoded(t, lr.Lease)
					}
					if lookup != replay {
						t.Fatalf("%s, line %d damaged: the %s lookup answered %s, the replay %s", when, i, op, lookup, replay)
					}
					out = append(out, replay)
				}
				return out
			}
			before := outcomes("damaged")
			for k := range before {
				if before[k] != corrupt {
					answered++
				}
			}
			// Two more endings: the damaged entry is trimmed (its detach
			// runs on it).
			ev5End(t, s, id, false)
			ev5End(t, s, id, false)
			for _, e := range historyEntries(t, s, lockKey(t, id)) {
				if e == damaged {
					t.Fatal("the damaged entry is still listed")
				}
			}
			for k, key := range keys {
				if got := mustGet(t, s, key); before[k] == corrupt && got != stored[k] {
					t.Fatalf("line %d damaged: detach rewrote the %s evidence the reader refused,\n %q\ninto\n %q",
						i, []string{"acquisition", "release"}[k], stored[k], got)
				}
			}
			outcomes("trimmed")
		})
	}
	t.Logf("%d of %d damaged entries still decoded; %d replays answered the first answer, the rest corrupt", decodable, n, answered)
}

// upperCheck is check, 16 lower-case hex digits, in upper case; one with
// no letter (all digits) gets an upper-case A in place of its first digit,
// so that it is never left as it was.
func upperCheck(check string) string {
	if up := strings.ToUpper(check); up != check {
		return up
	}
	return "A" + check[1:]
}
