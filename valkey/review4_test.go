package valkey

// Review 4: adversarial tests of idempotency evidence version 2 ("ev2")
// and history entries version 2 ("hv2"). Two broke the code under review
// and were fixed (their comments say how); the others are attacks that
// held, kept as regression tests.

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// review4Metadata is metadata whose string values hold everything a
// line-oriented format could trip on: newlines, CR, NUL, line and
// paragraph separators, quotes, backslashes, text that looks like an ev2
// line or a JSON tail, and a long run of escapes.
func review4Metadata() lease.Metadata {
	return lease.Metadata{
		"nl":     "a\nb\r\nc\rd",
		"nul":    "x\x00y\x01\x1f\x7f",
		"seps":   "\u2028\u2029\u0085",
		"quote":  `"},"state":"released","x":"` + "\n",
		"lines":  "\nlease_01ABC\nev2\nacquire\n",
		"bs":     `\\n \" \u0000`,
		"emoji":  "😀 ünïcödé café",
		"html":   "<script>&amp;</script>",
		"cr-lf":  "\r\n",
		"nil":    nil,
		"bool":   false,
		"long":   strings.Repeat("\n", 600),
		"number": 12345678901234.0,
	}
}

// review4EvidenceKey is the evidence key of a request.
func review4EvidenceKey(t *testing.T, s *Store, lk lease.LookupRequest) (string, lease.Prepared) {
	t.Helper()
	p, err := lease.PrepareLookup(lk, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	return s.keys.idem(tagOf(p.LockKey), p.Scope), p
}

func review4Set(t *testing.T, s *Store, key, v string) {
	t.Helper()
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

func review4History(t *testing.T, s *Store, tag string) []string {
	t.Helper()
	raw, err := s.client.Do(bg, s.client.B().Lrange().Key(s.keys.history(tag)).Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestReview4AdversarialValuesReplayByteForByte (held): caller-chosen
// values that break line formats (metadata strings with newlines, CR,
// NUL, separators, fake ev2 lines and JSON tails; admin reasons with
// quotes, backslashes and text that looks like escapes) cannot shift a
// line: the expanded evidence holds byte for byte the record the acquire
// stored, replays and lookups return the original record, and history
// entries (released and revoked) decode with the reason as given.
func TestReview4AdversarialValuesReplayByteForByte(t *testing.T) {
	s := openCompact(t)
	id := newIdentity()
	acq := acquireReq(id)
	acq.Metadata = review4Metadata()
	a, err := s.Acquire(bg, acq)
	if err != nil {
		t.Fatal(err)
	}
	tag := tagOf(a.Lease.LockKey)
	active, ok := get(t, s, s.keys.active(tag))
	if !ok {
		t.Fatal("no active record")
	}
	lk := evLookup(lease.OpAcquire, id, acq.Mutation)
	key, p := review4EvidenceKey(t, s, lk)
	stored, _ := get(t, s, key)
	if !strings.HasPrefix(stored, lease.EvidenceV2Prefix) {
		t.Fatalf("evidence not v2: %q", stored)
	}
	f := strings.SplitN(stored, "\n", lease.Ev2Lines)
	if len(f) != lease.Ev2Lines || f[lease.Ev2LeaseID] != a.Lease.LeaseID || f[lease.Ev2Request] != acq.RequestID ||
		f[lease.Ev2Job] != acq.JobID || f[lease.Ev2Trace] != acq.TraceID || f[lease.Ev2State] != "active" {
		t.Fatalf("v2 lines shifted: %q", f)
	}
	exp, ok := lease.ExpandEvidence(stored, p.Identity)
	if !ok {
		t.Fatal("evidence does not expand")
	}
	if !strings.Contains(exp, `,"lease":`+active+`,"backend_time":"`) {
		t.Fatalf("expanded evidence does not hold the stored record byte for byte:\n%s\n%s", exp, active)
	}
	if _, err := lease.DecodeIdempotencyRecord([]byte(exp)); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Acquire(bg, acq)
	if err != nil || !rep.Replayed || !reflect.DeepEqual(rep.Lease, a.Lease) || rep.Current != nil {
		t.Fatalf("replay: %+v %v\nwant %+v", rep, err, a.Lease)
	}
	look, err := s.LookupRequest(bg, lk)
	if err != nil || !reflect.DeepEqual(look.Lease, a.Lease) {
		t.Fatalf("lookup: %+v %v", look, err)
	}

	// Released: the hv2 entry decodes to the released record and the
	// acquire's replay sees it.
	rl := releaseReq(a.Lease)
	end, err := s.Release(bg, rl)
	if err != nil {
		t.Fatal(err)
	}
	rep, err = s.Acquire(bg, acq)
	if err != nil || !reflect.DeepEqual(rep.Lease, a.Lease) || rep.Current == nil || rep.Current.State != lease.StateReleased ||
		!reflect.DeepEqual(rep.Current, end.Lease) {
		t.Fatalf("replay after release: %+v %v", rep, err)
	}

	// Revoked with a hostile reason and incident id.
	b, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	ar := adminReq(b.Lease)
	ar.Reason = `line1\nline2 "q" \ \" \u000a <b>&amp; ünï 😀 "},"state":"active`
	ar.IncidentID = "inc-1:a.b_c-d"
	rv, err := s.Revoke(bg, ar)
	if err != nil {
		t.Fatal(err)
	}
	hist := review4History(t, s, tag)
	if len(hist) != 2 {
		t.Fatalf("history: %d entries", len(hist))
	}
	for i, e := range hist {
		if !strings.HasPrefix(e, lease.HistoryV2Prefix) {
			t.Fatalf("entry %d not hv2: %q", i, e)
		}
		v1, ok := lease.ExpandHistory(e)
		if !ok {
			t.Fatalf("entry %d does not expand: %q", i, e)
		}
		h, err := lease.DecodeHistoryEntry([]byte(v1))
		if err != nil {
			t.Fatalf("entry %d: %v\n%s", i, err, v1)
		}
		if again, _ := h.Encode(); string(again) != v1 {
			t.Fatalf("entry %d: not canonical:\n%s\n%s", i, v1, again)
		}
	}
	res, err := s.History(bg, lease.HistoryRequest{Identity: id, DeadlineAt: far()})
	if err != nil || len(res.Entries) != 2 {
		t.Fatalf("history: %+v %v", res, err)
	}
	if h := res.Entries[0]; h.Reason != ar.Reason || h.IncidentID != ar.IncidentID || h.Record.State != lease.StateRevoked ||
		!reflect.DeepEqual(h.Record, rv.Lease) || h.EndedBy != "prn_admin_1" || h.RequestID != ar.RequestID {
		t.Fatalf("revoked entry: %+v", h)
	}
	if h := res.Entries[1]; !reflect.DeepEqual(h.Record, end.Lease) || h.RequestID != rl.RequestID || h.Reason != "" {
		t.Fatalf("released entry: %+v", h)
	}
	for _, want := range []*lease.Record{end.Lease, rv.Lease} {
		got, err := s.Inspect(bg, lease.InspectRequest{LeaseID: want.LeaseID, DeadlineAt: far()})
		if err != nil || !reflect.DeepEqual(got.Lease, want) {
			t.Fatalf("inspect %s: %+v %v", want.LeaseID, got, err)
		}
	}
	revokeOp := func() (lease.Result, error) { return s.Revoke(bg, ar) }
	r2, err := revokeOp()
	if err != nil || !r2.Replayed || !reflect.DeepEqual(r2.Lease, rv.Lease) {
		t.Fatalf("revoke replay: %+v %v", r2, err)
	}
}

// TestReview4IdentitySpellingOnRetry (held): a retry whose identity is
// spelled differently but normalizes to the same canonical tuple (case,
// ASCII space, NFD vs NFC) replays the original record, canonical
// identity included, never the retry's spelling; a retry whose spelling
// normalizes to another tuple is another scope (a fresh acquire or a
// conflict), never the first lease.
func TestReview4IdentitySpellingOnRetry(t *testing.T) {
	s := openCompact(t)
	id := newIdentity()
	id.TargetID = "café-" + uid("t") // NFC
	id.ActorName = "ünïcödé-actor"   // NFC
	acq := acquireReq(id)
	a, err := s.Acquire(bg, acq)
	if err != nil {
		t.Fatal(err)
	}
	variants := []lease.Identity{id, id, id}
	variants[0].TenantID = "  " + strings.ToUpper(id.TenantID) + "\t"
	variants[1].TargetID = strings.Replace(id.TargetID, "é", "e\u0301", 1) // NFD
	variants[1].ActorName = "U\u0308NÏCÖDÉ-ACTOR"                          // NFD + upper
	variants[2].WorkflowName, variants[2].OperationClass = "", " "         // defaults
	for i, v := range variants {
		retry := acq
		retry.Identity = v
		rep, err := s.Acquire(bg, retry)
		if err != nil || !rep.Replayed || !reflect.DeepEqual(rep.Lease, a.Lease) {
			t.Fatalf("variant %d: %+v %v\nwant %+v", i, rep, err, a.Lease)
		}
		look, err := s.LookupRequest(bg, evLookup(lease.OpAcquire, v, acq.Mutation))
		if err != nil || !reflect.DeepEqual(look.Lease, a.Lease) {
			t.Fatalf("variant %d lookup: %+v %v", i, look, err)
		}
	}
	// Another tuple (a different accent) under the same request id:
	// its own scope, so a fresh lease, never the first one's record.
	other := acq
	other.Identity = id
	other.Identity.TargetID = strings.Replace(id.TargetID, "é", "è", 1)
	rep, err := s.Acquire(bg, other)
	if err != nil || rep.Replayed || rep.Lease.LeaseID == a.Lease.LeaseID || rep.Lease.TargetID != other.Identity.TargetID {
		t.Fatalf("other tuple: %+v %v", rep, err)
	}
	if _, err := s.LookupRequest(bg, evLookup(lease.OpAcquire, lease.Identity{TenantID: id.TenantID, ProgramID: id.ProgramID,
		TargetNamespace: id.TargetNamespace, TargetID: "never-acquired", ActorName: id.ActorName}, acq.Mutation)); lease.CodeOf(err) != lease.CodeNotFound {
		t.Fatalf("lookup under a tuple never used: %v", err)
	}
}

// TestReview4EvidenceV2Tampered (held): evidence tampered in ways a line
// format invites (CRLF, an inserted or a dropped line, lines reordered,
// a foreign hash tag, a line holding two values, a NUL) is corrupt on
// retry and lookup, never answered.
func TestReview4EvidenceV2Tampered(t *testing.T) {
	s := openCompact(t)
	id := newIdentity()
	acq := acquireReq(id)
	if _, err := s.Acquire(bg, acq); err != nil {
		t.Fatal(err)
	}
	foreign := lockKey(t, newIdentity())
	lk := evLookup(lease.OpAcquire, id, acq.Mutation)
	key, _ := review4EvidenceKey(t, s, lk)
	good, _ := get(t, s, key)
	lines := strings.Split(good, "\n")
	with := func(edit func(l []string) []string) string {
		return strings.Join(edit(append([]string(nil), lines...)), "\n")
	}
	bad := map[string]string{
		"crlf":         strings.ReplaceAll(good, "\n", "\r\n"),
		"cr before lf": with(func(l []string) []string { l[lease.Ev2Owner] += "\r"; return l }),
		"inserted line": with(func(l []string) []string {
			return append(l[:lease.Ev2Job], append([]string{"extra"}, l[lease.Ev2Job:]...)...)
		}),
		"dropped line": with(func(l []string) []string { return append(l[:lease.Ev2Trace], l[lease.Ev2Trace+1:]...) }),
		"state, metadata swapped": with(func(l []string) []string {
			l[lease.Ev2State], l[lease.Ev2Metadata] = l[lease.Ev2Metadata], l[lease.Ev2State]
			return l
		}),
		"foreign tag":      with(func(l []string) []string { l[lease.Ev2Tag] = tagOf(foreign); return l }),
		"nul":              with(func(l []string) []string { l[lease.Ev2Job] += "\x00"; return l }),
		"tag with quote":   with(func(l []string) []string { l[lease.Ev2Tag] += `","x":"`; return l }),
		"metadata tail":    with(func(l []string) []string { l[lease.Ev2Metadata] = `{},"state":"revoked"`; return l }),
		"metadata spaced":  with(func(l []string) []string { l[lease.Ev2Metadata] = ` {}`; return l }),
		"empty request id": with(func(l []string) []string { l[lease.Ev2Request] = ""; return l }),
		"v1 prefix":        "ev1" + good[3:],
		"trailing line":    good + "\n",
		"leading space":    " " + good,
	}
	for name, b := range bad {
		review4Set(t, s, key, b)
		if r, err := s.Acquire(bg, acq); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: acquire retry gave %+v %v, want corrupt", name, r, err)
		}
		if r, err := s.LookupRequest(bg, lk); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: lookup gave %+v %v, want corrupt", name, r, err)
		}
	}
}

// TestReview4V2RefusesNonCanonicalTimestamps (broken, then fixed: the
// reader now refuses numbers with leading zeros): version 1
// evidence and history are read only in their exact canonical bytes;
// version 2 should be no laxer ("anything malformed fails closed as
// corrupt"). But a timestamp line (acquired, renewed, expires, backend
// time; a history entry's ended_at) with leading zeros, which the library
// never writes, passes digits() and is normalized by msText, so the
// tampered evidence replays as if it were intact and the tampered history
// entry decodes. (A leading zero on fencing_token, ttl_ms or
// maximum_lifetime_ms is refused, because those are copied verbatim.)
func TestReview4V2RefusesNonCanonicalTimestamps(t *testing.T) {
	s := openCompact(t)
	id := newIdentity()
	acq := acquireReq(id)
	a, err := s.Acquire(bg, acq)
	if err != nil {
		t.Fatal(err)
	}
	lk := evLookup(lease.OpAcquire, id, acq.Mutation)
	key, _ := review4EvidenceKey(t, s, lk)
	good, _ := get(t, s, key)
	lines := strings.Split(good, "\n")
	var accepted []string
	for _, i := range []int{lease.Ev2Acquired, lease.Ev2Renewed, lease.Ev2Expires, lease.Ev2Backend} {
		l := append([]string(nil), lines...)
		l[i] = "00" + l[i]
		review4Set(t, s, key, strings.Join(l, "\n"))
		r, err := s.Acquire(bg, acq)
		if lease.CodeOf(err) != lease.CodeCorrupt {
			accepted = append(accepted, "evidence line "+itoa(int64(i))+" "+l[i]+": acquire retry gave lease "+
				r.Lease.LeaseID+" (err "+errText(err)+")")
		}
	}
	review4Set(t, s, key, good)

	if _, err := s.Release(bg, releaseReq(a.Lease)); err != nil {
		t.Fatal(err)
	}
	hist := review4History(t, s, tagOf(a.Lease.LockKey))
	hl := strings.Split(hist[0], "\n")
	for _, i := range []int{lease.Hv2Ended, lease.Hv2Record + 6, lease.Hv2Record + 7, lease.Hv2Record + 8} {
		l := append([]string(nil), hl...)
		l[i] = "0" + l[i]
		raw, ok := lease.ExpandHistory(strings.Join(l, "\n"))
		if !ok {
			continue
		}
		if _, err := lease.DecodeHistoryEntry([]byte(raw)); err == nil {
			accepted = append(accepted, "history line "+itoa(int64(i))+" "+l[i]+": entry decodes")
		}
	}
	if len(accepted) > 0 {
		t.Fatalf("non-canonical version 2 bytes accepted instead of corrupt:\n%s", strings.Join(accepted, "\n"))
	}
}

func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestReview4RollingDeployOldBuildReadsDefaultFormat (broken, then fixed): doc.go states
// that instances of different builds share one Valkey during a rolling
// deploy (each calls its own library). An instance of the previous build
// (testdata/library_ev1.lua, identical to HEAD~2's library.lua, and
// HEAD~2's Go read paths, reproduced here line for line: they decoded the
// stored bytes with lease.DecodeIdempotencyRecord / DecodeHistoryEntry
// directly) then meets evidence and history written by this build:
//   - a retried acquire or its LookupRequest is answered corrupt (and
//     alerted) instead of the original result;
//   - Inspect by lease id of a lease this build released is not_found
//     (the old library's needle only matches JSON entries);
//   - every history entry this build wrote is skipped as corrupt.
//
// Reproduced with the real HEAD~2 build against one redis-server (a
// HEAD~2 worktree's test reading what this build wrote): acquire retry
// and LookupRequest lease_corrupt (alerted), Inspect by id
// lease_not_found, History 0 entries (the entry alerted as corrupt).
//
// Nothing in the change lets an old instance read version 2 (or stops
// new instances from writing it until every instance reads it), so the
// contract's idempotent retry and terminal history fail for the whole
// deploy window (and on a rollback, for the retention periods).
//
// Fixed: a namespace is written in version 1 until an operator switches it
// (EnableCompactFormat), so this test now runs an unswitched namespace and
// the old build reads everything the new one wrote.
func TestReview4RollingDeployOldBuildReadsDefaultFormat(t *testing.T) {
	o := leasetest.StoreOptions()
	f := newEvidenceFixture(t, o)
	s := f.s
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.format()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s.loadFormat(bg)
	if s.writes(compactFormat) {
		t.Fatal("the namespace is still switched")
	}
	id := newIdentity()
	acq := acquireReq(id)
	a, err := s.Acquire(bg, acq) // the new build writes
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(bg, releaseReq(a.Lease)); err != nil {
		t.Fatal(err)
	}
	var broken []string

	// The old build: its library, and its Go read paths as of HEAD~2.
	f.use(f.old)
	defer f.use(f.cur)
	lk := evLookup(lease.OpAcquire, id, acq.Mutation)
	key, p := review4EvidenceKey(t, s, lk)
	tag := tagOf(p.LockKey)
	rep, err := s.read(bg, lease.Deadline(bg, far()), "lookup", []string{key, s.keys.active(tag), s.keys.history(tag)})
	if err != nil || rep.status != "evidence" {
		t.Fatalf("old lookup: %+v %v", rep, err)
	}
	// HEAD~2 ops.go replay / reads.go LookupRequest:
	if _, err := lease.DecodeIdempotencyRecord([]byte(rep.at(0))); err != nil {
		broken = append(broken, "old build's acquire retry / LookupRequest: idempotency evidence is corrupt ("+err.Error()+"), want the original result")
	}
	if _, ok := p.Lookup([]byte(rep.at(0)), func(o *lease.Record) (*lease.Record, error) { return o, nil }); !ok {
		broken = append(broken, "old build's LookupRequest: p.Lookup refuses the stored evidence")
	}
	// Inspect by lease id (the Go side only decodes what the old library
	// returns, and it returns nothing).
	if r, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far()}); err != nil {
		broken = append(broken, "old build's Inspect by lease id of the released lease: "+err.Error()+", want the released record")
	} else if r.Lease.State != lease.StateReleased {
		broken = append(broken, "old build's Inspect by lease id: state "+string(r.Lease.State))
	}
	// HEAD~2 reads.go History:
	hr, err := s.read(bg, lease.Deadline(bg, far()), "history", []string{s.keys.history(tag)})
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range hr.f {
		if _, err := lease.DecodeHistoryEntry([]byte(raw)); err != nil {
			broken = append(broken, "old build's History: entry skipped as corrupt: "+err.Error())
		}
	}
	if len(broken) > 0 {
		t.Fatalf("an instance of the previous build cannot read what this build writes:\n%s", strings.Join(broken, "\n"))
	}
}

// TestReview4BackupRestoreV2 (held): a backup of a namespace holding
// version 2 evidence and history restores them byte for byte; after
// recovery (which revokes the restored live lease through archive, so
// writes an hv2 entry with ended_by and reason but no request id) the
// pre-backup requests replay with their original results and history
// reads every entry.
func TestReview4BackupRestoreV2(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{StoreOptions: leasetest.StoreOptions()})
	if err := src.EnableCompactFormat(bg); err != nil {
		t.Fatal(err)
	}
	id, id2 := newIdentity(), newIdentity()
	req := acquireReq(id)
	req.Metadata = review4Metadata()
	first, err := src.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	ar := adminReq(first.Lease)
	ar.Reason = `"quoted" \ reason`
	rv, err := src.Revoke(bg, ar)
	if err != nil {
		t.Fatal(err)
	}
	req2 := acquireReq(id2)
	live, err := src.Acquire(bg, req2)
	if err != nil {
		t.Fatal(err)
	}
	var backup strings.Builder
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: src.opts}
	dst := open(t, r, o)
	if _, err := dst.Restore(bg, strings.NewReader(backup.String())); err != nil {
		t.Fatal(err)
	}
	srcKey, _ := review4EvidenceKey(t, src, evLookup(lease.OpAcquire, id, req.Mutation))
	dstKey, _ := review4EvidenceKey(t, dst, evLookup(lease.OpAcquire, id, req.Mutation))
	sv, _ := get(t, src, srcKey)
	dv, _ := get(t, dst, dstKey)
	if sv != dv || !strings.HasPrefix(dv, lease.EvidenceV2Prefix) {
		t.Fatalf("restored evidence differs:\n%q\n%q", sv, dv)
	}
	// The format switch travels with the namespace.
	if v, _ := get(t, dst, dst.keys.format()); v != compactFormat {
		t.Fatalf("restored namespace's format switch: %q", v)
	}
	c, _ := closedState(t, o)
	if _, err := c.Finish(bg, lease.RecoveryPlan{Reason: "restored \"by\" review"}); err != nil {
		t.Fatal(err)
	}
	rep, err := dst.Acquire(bg, req)
	if err != nil || !reflect.DeepEqual(rep.Lease, first.Lease) || rep.Current == nil || !reflect.DeepEqual(rep.Current, rv.Lease) {
		t.Fatalf("replay after restore: %+v %v", rep, err)
	}
	rr, err := dst.Revoke(bg, ar)
	if err != nil || !reflect.DeepEqual(rr.Lease, rv.Lease) {
		t.Fatalf("revoke replay after restore: %+v %v", rr, err)
	}
	h2, err := dst.History(bg, lease.HistoryRequest{Identity: id2, DeadlineAt: far()})
	if err != nil || len(h2.Entries) != 1 || h2.Entries[0].Record.LeaseID != live.Lease.LeaseID ||
		h2.Entries[0].Record.State != lease.StateRevoked || h2.Entries[0].Reason != "restored \"by\" review" || h2.Entries[0].RequestID != "" {
		t.Fatalf("recovery's revoked entry: %+v %v", h2, err)
	}
	rep2, err := dst.Acquire(bg, req2)
	if err != nil || rep2.Lease.LeaseID != live.Lease.LeaseID || rep2.Current == nil || rep2.Current.State != lease.StateRevoked {
		t.Fatalf("replay of the revoked-by-recovery acquire: %+v %v", rep2, err)
	}
}

// TestReview4ExpiryPathV2 (held): the reaper's archive (no ended_by,
// request id, reason or incident: four empty hv2 lines) and a renewed
// lease's evidence: after expiry the renew and acquire replays return
// their original records, the acquire's with the expired record as its
// state now (ended at its expires_at), found through the hv2 entry, and
// Inspect by lease id reads it too.
func TestReview4ExpiryPathV2(t *testing.T) {
	s := openCompact(t)
	id := newIdentity()
	acq := acquireReq(id)
	acq.TTL = 300 * time.Millisecond
	a, err := s.Acquire(bg, acq)
	if err != nil {
		t.Fatal(err)
	}
	rq := renewReq(a.Lease)
	rq.TTL = 200 * time.Millisecond
	rn, err := s.Renew(bg, rq)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(rn.Lease.ExpiresAt.Time()) + 100*time.Millisecond)
	if err := s.reap(bg); err != nil {
		t.Fatal(err)
	}
	hist := review4History(t, s, tagOf(a.Lease.LockKey))
	if len(hist) != 1 {
		t.Fatalf("history: %q", hist)
	}
	l := strings.Split(hist[0], "\n")
	if l[lease.Hv2By] != "" || l[lease.Hv2Request] != "" || l[lease.Hv2Reason] != "" || l[lease.Hv2Incident] != "" || l[lease.Hv2Record+15] != "expired" {
		t.Fatalf("expiry entry: %q", l)
	}
	rep, err := s.Renew(bg, rq)
	if err != nil || !rep.Replayed || !reflect.DeepEqual(rep.Lease, rn.Lease) {
		t.Fatalf("renew replay after expiry: %+v %v", rep, err)
	}
	ra, err := s.Acquire(bg, acq)
	if err != nil || !reflect.DeepEqual(ra.Lease, a.Lease) || ra.Current == nil || ra.Current.State != lease.StateExpired ||
		ra.Current.ExpiresAt != rn.Lease.ExpiresAt || ra.Current.FencingToken != a.Lease.FencingToken {
		t.Fatalf("acquire replay after expiry: %+v %v", ra, err)
	}
	h, err := s.History(bg, lease.HistoryRequest{Identity: id, DeadlineAt: far()})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].EndedAt != rn.Lease.ExpiresAt || h.Entries[0].EndedBy != "" ||
		h.Entries[0].RequestID != "" || h.Entries[0].Reason != "" || h.Entries[0].IncidentID != "" {
		t.Fatalf("history: %+v %v", h, err)
	}
	in, err := s.Inspect(bg, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: far()})
	if err != nil || in.Lease.State != lease.StateExpired || in.Lease.LeaseID != a.Lease.LeaseID {
		t.Fatalf("inspect by id: %+v %v", in, err)
	}
}
