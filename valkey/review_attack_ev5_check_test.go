package valkey

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// Review: attack on evidence version 5's check (the SHA-1 of the lease's
// history entry as stored and the evidence's own lines, lease/evidence_v5.go
// and library.lua's sha1_check, encode_ev5, referring_fields). What the
// earlier reviews (review_attack_ev5_test.go, format7_test.go) did not
// try: history lists holding more than one entry that names the lease id
// (copies, a reused lease id, another lease's line equal to it), a scope
// reused once its evidence expired (an old entry naming the key the new
// evidence lives under), identifiers at their limits, the archive inside
// an acquisition refused as exhausted, and a backup restored under
// another prefix then recovered. The contract: a replay answers exactly
// the first answer, damage fails closed, never a wrong result.

const ckCorrupt = "error " + string(lease.CodeCorrupt)

// hv4Incident is the incident id's line of a history entry.
const hv4Incident = 7

// ckPush puts v into the history list of id's identity: at its head
// (newest) if head, else at its tail (oldest), bypassing the library.
func ckPush(t *testing.T, s *Store, id lease.Identity, v string, head bool) {
	t.Helper()
	k := s.keys.history(tagOf(lockKey(t, id)))
	cmd := s.client.B().Rpush().Key(k).Element(v).Build()
	if head {
		cmd = s.client.B().Lpush().Key(k).Element(v).Build()
	}
	if err := s.client.Do(bg, cmd).Error(); err != nil {
		t.Fatal(err)
	}
}

// ckLine replaces line i of a history entry.
func ckLine(entry string, i int, v string) string {
	f := strings.Split(entry, "\n")
	f[i] = v
	return strings.Join(f, "\n")
}

// ckOutcomes are the acquisition's and (if any) the release's replays, each
// checked against its lookup, which must answer alike.
func ckOutcomes(t *testing.T, s *Store, l ev5Life) []string {
	t.Helper()
	type side struct {
		op    lease.Op
		req   string
		prn   string
		first lease.Result
		out   func() string
	}
	sides := []side{{lease.OpAcquire, l.acq.RequestID, l.acq.Caller.PrincipalID, l.first, func() string { return l.acquireOutcome(t, s) }}}
	if l.rel.RequestID != "" {
		sides = append(sides, side{lease.OpRelease, l.rel.RequestID, l.rel.Caller.PrincipalID, l.ended, func() string { return l.releaseOutcome(t, s) }})
	}
	var out []string
	for _, sd := range sides {
		replay := sd.out()
		lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: sd.op, Identity: l.acq.Identity, PrincipalID: sd.prn,
			RequestID: sd.req, DeadlineAt: far()})
		var lookup string
		switch {
		case err != nil:
			lookup = "error " + string(lease.CodeOf(err))
		case encoded(t, lr.Lease) == encoded(t, sd.first.Lease) && lr.BackendTime.UnixMilli() == sd.first.BackendTime.UnixMilli():
			lookup = answerOf(t, sd.first)
		default:
			lookup = "another answer: " + encoded(t, lr.Lease)
		}
		if lookup != replay {
			t.Fatalf("the %s lookup answered %s, its replay %s", sd.op, lookup, replay)
		}
		out = append(out, replay)
	}
	return out
}

// ckFirstOrCorrupt fails unless every outcome is its first answer or
// corrupt; it reports whether all were the first answers.
func ckFirstOrCorrupt(t *testing.T, l ev5Life, got []string, where string) bool {
	t.Helper()
	firsts := []string{answerOf(t, l.first)}
	if l.rel.RequestID != "" {
		firsts = append(firsts, answerOf(t, l.ended))
	}
	all := true
	for i, g := range got {
		if g != firsts[i] && g != ckCorrupt {
			t.Fatalf("%s: replay %d answered\n %s\nwant the first answer\n %s\nor corrupt", where, i, g, firsts[i])
		}
		all = all && g == firsts[i]
	}
	return all
}

// A second entry naming the lease (a copy of its entry as it is, or one
// line changed where the entry still decodes, or where it no longer does),
// put at the list's head or tail: the Go reader takes the newest entry
// that decodes and names the lease id; the library's detach checks each
// entry as it is trimmed. A copy of the entry's bytes, at either end, and
// a changed copy older than the entry, or one that no longer decodes,
// change nothing: the first answers. A changed copy newer than the entry
// is what the reader takes, and its bytes are not those the check is of:
// corrupt (damage, fail closed), while the library's detach, which sees
// the true entry first when the trims reach it, rewrites the evidence
// into the first answers. Never another answer, before or after the trims.
func TestAttackEV5CheckSecondEntryOfTheLease(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 4, Options{})
	for _, c := range []struct {
		name string
		head bool
		copy func(entry string) string
		// corruptBefore: the reader answers corrupt while the copy is listed.
		corruptBefore bool
	}{
		{"identical_newer", true, func(e string) string { return e }, false},
		{"identical_older", false, func(e string) string { return e }, false},
		{"ended_at_plus_1ms_newer", true, func(e string) string { return ckLine(e, hv4Ended, addMs(t, strings.Split(e, "\n")[hv4Ended], 1)) }, true},
		{"ended_at_plus_1ms_older", false, func(e string) string { return ckLine(e, hv4Ended, addMs(t, strings.Split(e, "\n")[hv4Ended], 1)) }, false},
		{"incident_set_newer", true, func(e string) string { return ckLine(e, hv4Incident, "inc-1") }, true},
		{"metadata_changed_newer", true, func(e string) string { return e[:strings.LastIndexByte(e, '\n')+1] + `{"n":2}` }, true},
		{"undecodable_newer", true, func(e string) string { return ckLine(e, hv4EndedBy, "not an id") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := newIdentity()
			l := ev5End(t, s, id, true)
			l.mustEV5Stored(t, s)
			entry := entryOf(t, s, l.first.Lease)
			dup := c.copy(entry)
			if c.name != "identical_newer" && c.name != "identical_older" && dup == entry {
				t.Fatal("setup: the copy is the entry")
			}
			_, derr := lease.DecodeScopedHistory([]byte(dup), l.first.Lease.LockKey)
			if (derr == nil) == strings.HasPrefix(c.name, "undecodable") {
				t.Fatalf("setup: the copy decodes: %v", derr)
			}
			ckPush(t, s, id, dup, c.head)
			before := ckOutcomes(t, s, l)
			first := ckFirstOrCorrupt(t, l, before, "listed")
			if c.corruptBefore {
				for _, b := range before {
					if b != ckCorrupt {
						t.Fatalf("a newer changed copy answered %s, want corrupt (the reader takes it)", b)
					}
				}
			} else if !first {
				t.Fatalf("a copy that is not the reader's answered %q, want the first answers", before)
			}
			trimAway(t, s, id, l.first.Lease.LeaseID)
			for _, k := range []string{evidenceKey(t, s, l.acq), releaseEvidenceKey(t, s, l.rel)} {
				if v, _ := get(t, s, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
					t.Fatalf("after the trims the evidence is %.8q, want version 2 (detached from the true entry)", v)
				}
			}
			l.mustFirst(t, s, "both entries trimmed")
		})
	}
}

// Another lease of the identity whose history entry has a line equal to
// the lease id (its execution id: any identifier a caller chooses), newer
// than the lease's entry: the library's needle returns it too, the reader
// skips it (its record names another lease), and the check is of the
// lease's own entry. The other lease answers its own first answers.
func TestAttackEV5CheckNeedleMatchesAnotherLease(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 2, Options{})
	id := newIdentity()
	l1 := ev5End(t, s, id, true)
	l2 := ev5Life{acq: acquireReq(id)}
	l2.acq.ExecutionID, l2.acq.JobID, l2.acq.TraceID = l1.first.Lease.LeaseID, l1.first.Lease.LeaseID, l1.first.Lease.LeaseID
	var err error
	if l2.first, err = s.Acquire(bg, l2.acq); err != nil {
		t.Fatal(err)
	}
	l2.rel = releaseReq(l2.first.Lease)
	l2.rel.RequestID = l1.first.Lease.LeaseID // (a request id is an identifier too)
	if l2.ended, err = s.Release(bg, l2.rel); err != nil {
		t.Fatal(err)
	}
	if e := historyEntries(t, s, lockKey(t, id))[0]; !strings.Contains(e, "\n"+l1.first.Lease.LeaseID+"\n") || ckEntryOf(t, s, l1.first.Lease) == e {
		t.Fatalf("setup: the newer entry does not hold l1's lease id on a line of its own: %q", e)
	}
	ckMustEV5Stored(t, s, l1)
	ckMustEV5Stored(t, s, l2)
	l1.mustFirst(t, s, "l1 under a needle that also matches l2's entry")
	l2.mustFirst(t, s, "l2")
	trimAway(t, s, id, l1.first.Lease.LeaseID)
	l1.mustFirst(t, s, "l1 detached")
	l2.mustFirst(t, s, "l2 after l1's trim")
}

// A lease id given twice on one identity (its lookup key gone, as after
// its TTL; the test's id source repeats it): two entries name it, with
// other tokens. The reader takes the newest entry naming the id (it does
// not match the token the evidence names), so the first lease's evidence
// fails its check there and answers corrupt, while the library's detach,
// which checks the entry being trimmed, rewrites it into the first answer
// once the first lease's entry goes. Never the other lease's answer. (Lease
// ids are 80 random bits and their lookup refuses a reuse while it lives:
// a probe of the reader's choice, not a reachable path.)
func TestAttackEV5CheckLeaseIDGivenTwice(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 3, Options{})
	id := newIdentity()
	leaseID := "lease_" + uid("twice")
	s.leaseIDs = func(lease.Timestamp) string { return leaseID }
	l1 := ev5End(t, s, id, true)
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.leaseLookup(leaseID)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l2 := ev5End(t, s, id, true)
	s.leaseIDs = nil
	if l2.first.Lease.LeaseID != leaseID || l2.first.Lease.FencingToken != l1.first.Lease.FencingToken+1 {
		t.Fatalf("setup: %+v", l2.first.Lease)
	}
	n := 0
	for _, e := range historyEntries(t, s, lockKey(t, id)) {
		if strings.Contains(e, "\n"+leaseID+"\n") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("setup: %d entries name the lease id", n)
	}
	l2.mustFirst(t, s, "the newer lease")
	got := ckOutcomes(t, s, l1)
	if ckFirstOrCorrupt(t, l1, got, "the older lease, both listed") {
		t.Log("the older lease answers its first answers while both entries are listed")
	} else {
		t.Logf("the older lease answers %q while both entries are listed (the reader takes the newer entry)", got)
	}
	// Endings trim l1's entry (the oldest): detach checks l1's evidence
	// against l1's own entry.
	for i := 0; ckEntryOf(t, s, l1.first.Lease) != ""; i++ {
		if i == 5 {
			t.Fatal("l1's entry was never trimmed")
		}
		ev5End(t, s, id, false)
	}
	if ckEntryOf(t, s, l2.first.Lease) == "" {
		t.Fatal("setup: l2's entry went too")
	}
	for _, k := range []string{evidenceKey(t, s, l1.acq), releaseEvidenceKey(t, s, l1.rel)} {
		if v, _ := get(t, s, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("l1's evidence after its entry's trim: %.8q, want version 2", v)
		}
	}
	l1.mustFirst(t, s, "the older lease detached")
	l2.mustFirst(t, s, "the newer lease, the older one detached")
}

// ckMustEV5Stored is mustEV5Stored with the lease's entry found by its
// lease id and token (entryOf takes the first entry with a line equal to
// the lease id).
func ckMustEV5Stored(t *testing.T, s *Store, l ev5Life) {
	t.Helper()
	entry := ckEntryOf(t, s, l.first.Lease)
	if v, _ := get(t, s, evidenceKey(t, s, l.acq)); v != ev5Want(t, s, lease.OpAcquire, acquireDigest(t, s, l.acq), l.first, entry) {
		t.Fatalf("acquisition evidence %q", v)
	}
	if l.rel.RequestID == "" {
		return
	}
	if v, _ := get(t, s, releaseEvidenceKey(t, s, l.rel)); v != ev5Want(t, s, lease.OpRelease, releaseDigest(t, s, l.rel), l.ended, entry) {
		t.Fatalf("release evidence %q", v)
	}
}

// ckEntryOf is the listed history entry of rec's lease, by lease id and
// token ("" if none).
func ckEntryOf(t *testing.T, s *Store, rec *lease.Record) string {
	t.Helper()
	for _, e := range historyEntries(t, s, rec.LockKey) {
		if h, err := lease.DecodeScopedHistory([]byte(e), rec.LockKey); err == nil && h.Record.LeaseID == rec.LeaseID &&
			h.Record.FencingToken == rec.FencingToken {
			return e
		}
	}
	return ""
}

// A request id used again once its evidence expired (deleted here, as its
// TTL would): the new lease's evidence lives under the same scope keys
// that the old lease's entry, still listed, names. When the old entry is
// trimmed, detach reads the new lease's version 5 there, whose check is
// of the new entry: it is left as it is, and the new lease answers its
// own first answers before and after, and detached once its entry goes.
func TestAttackEV5CheckScopeReusedAfterExpiry(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 2, Options{})
	id := newIdentity()
	l1 := ev5End(t, s, id, true)
	ak, rk := evidenceKey(t, s, l1.acq), releaseEvidenceKey(t, s, l1.rel)
	if err := s.client.Do(bg, s.client.B().Del().Key(ak, rk).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l2 := ev5Life{acq: l1.acq}
	var err error
	if l2.first, err = s.Acquire(bg, l2.acq); err != nil || l2.first.Replayed || l2.first.Lease.LeaseID == l1.first.Lease.LeaseID {
		t.Fatalf("a new acquisition under the expired request id: %+v %v", l2.first, err)
	}
	l2.rel = releaseReq(l2.first.Lease)
	l2.rel.RequestID = l1.rel.RequestID
	if l2.ended, err = s.Release(bg, l2.rel); err != nil || l2.ended.Replayed {
		t.Fatalf("a new release under the expired request id: %+v %v", l2.ended, err)
	}
	if evidenceKey(t, s, l2.acq) != ak || releaseEvidenceKey(t, s, l2.rel) != rk {
		t.Fatal("setup: the scopes differ")
	}
	l2.mustEV5Stored(t, s)
	e1 := entryOf(t, s, l1.first.Lease)
	if e1 == "" || strings.Split(e1, "\n")[1] != strings.Split(entryOf(t, s, l2.first.Lease), "\n")[1] {
		t.Fatal("setup: the old entry does not name the reused acquisition scope")
	}
	stored := []string{mustGet(t, s, ak), mustGet(t, s, rk)}
	l2.mustFirst(t, s, "new lease, old entry listed")
	ev5End(t, s, id, false) // cap 2: trims l1's entry, whose detach finds l2's evidence
	if entryOf(t, s, l1.first.Lease) != "" || entryOf(t, s, l2.first.Lease) == "" {
		t.Fatal("setup: the trim did not take exactly the old entry")
	}
	if got := []string{mustGet(t, s, ak), mustGet(t, s, rk)}; got[0] != stored[0] || got[1] != stored[1] {
		t.Fatalf("the old entry's detach rewrote the new lease's evidence:\n %q\nwas\n %q", got, stored)
	}
	l2.mustFirst(t, s, "new lease, old entry trimmed")
	trimAway(t, s, id, l2.first.Lease.LeaseID)
	l2.mustFirst(t, s, "new lease detached")
}

// Identifiers at their limits: every id of the identity tuple 256 bytes
// (some of them letters outside ASCII), the lease id, owner, client,
// credential, instance, execution, job, trace and request ids 256 bytes,
// metadata close to its 4096 bytes with escapes and non-ASCII text, and an
// administrator's reason of 512 bytes with quotes and non-ASCII letters:
// the check covers an entry of several kilobytes byte for byte as both
// sides see it, by reference and detached.
func TestAttackEV5CheckIdentifiersAtTheirLimits(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 1, Options{})
	pad := func(p string, n int) string { return p + strings.Repeat("x", n-len(p)) }
	uni := func(p string) string { // 256 bytes: ASCII prefix, then é (2 bytes each)
		v := p + strings.Repeat("é", (256-len(p))/2)
		return v + strings.Repeat("y", 256-len(v))
	}
	id := lease.Identity{TenantID: uni("tenant-" + uid("")), ProgramID: uni("program-"), TargetNamespace: pad("ns-", 256),
		TargetID: pad("target_"+uid(""), 256), ActorName: pad("actor", 256), WorkflowName: uni("wf"), OperationClass: "default"}
	caller := lease.Caller{PrincipalID: pad("prn_"+uid(""), 256), ClientID: pad("client_", 256), CredentialID: pad("key_", 256)}
	meta := lease.Metadata{}
	for i := 0; i < lease.MaxMetadataKeys; i++ {
		k := pad("k"+utoa(uint64(i))+"_", 20)
		meta[k] = strings.Repeat(`é"\<>&`+"\u00a0ß", 4)
		if b, _ := json.Marshal(meta); len(b) > 3900 {
			delete(meta, k)
			break
		}
	}
	leaseID := pad("lease_"+uid(""), 256)
	s.leaseIDs = func(lease.Timestamp) string { return leaseID }
	defer func() { s.leaseIDs = nil }()
	acq := lease.AcquireRequest{Identity: id, ServiceInstanceID: pad("instance_", 256), TTL: 30 * time.Second,
		MaximumLifetime: 5 * time.Minute, ExecutionID: pad("execution_", 256), JobID: pad("job_", 256), TraceID: pad("trace_", 256),
		Metadata: meta, Mutation: lease.Mutation{RequestID: pad("req_"+uid(""), 256), DeadlineAt: far(), Caller: caller}}
	l := ev5Life{acq: acq}
	var err error
	if l.first, err = s.Acquire(bg, acq); err != nil {
		t.Fatalf("acquire at the limits: %v", err)
	}
	if len(l.first.Lease.LeaseID) != 256 {
		t.Fatalf("lease id of %d bytes", len(l.first.Lease.LeaseID))
	}
	l.rel = releaseReq(l.first.Lease)
	l.rel.Caller, l.rel.RequestID = caller, pad("rel_"+uid(""), 256)
	if l.ended, err = s.Release(bg, l.rel); err != nil {
		t.Fatal(err)
	}
	entry := entryOf(t, s, l.first.Lease)
	if len(entry) < 4000 {
		t.Fatalf("setup: an entry of %d bytes", len(entry))
	}
	l.mustEV5Stored(t, s)
	l.mustFirst(t, s, "at the limits, by reference")

	// A revoked lease with the longest reason: its acquisition's evidence
	// refers to the entry that holds the reason.
	leaseID = pad("lease_"+uid(""), 256)
	acq.RequestID = pad("req_"+uid(""), 256)
	v := ev5Life{acq: acq}
	if v.first, err = s.Acquire(bg, acq); err != nil {
		t.Fatal(err)
	}
	adm := adminReq(v.first.Lease)
	adm.Reason = strings.Repeat(`"ü" \ <b> & `, 512/16)
	adm.Reason += strings.Repeat("z", 512-len(adm.Reason))
	if _, err := s.Revoke(bg, adm); err != nil {
		t.Fatalf("revoke with a reason of %d bytes: %v", len(adm.Reason), err)
	}
	v.mustEV5Stored(t, s)
	v.mustFirst(t, s, "revoked with the longest reason, by reference")
	l.mustFirst(t, s, "at the limits, detached")
	s.leaseIDs = nil
	trimAway(t, s, id, v.first.Lease.LeaseID)
	v.mustFirst(t, s, "revoked with the longest reason, detached")
}

// An acquisition refused as exhausted (its identity's counter at the last
// token) archives the expired lease before it answers: that archive
// writes the acquisition's version 5 evidence, its check of the entry the
// same call pushes, and the replay answers the first answer.
func TestAttackEV5CheckExhaustedAcquisitionArchives(t *testing.T) {
	r := sharedServer(t)
	s := ev5Store(t, r, 4, Options{})
	id := newIdentity()
	if err := (faults{s}).SetCounter(bg, lockKey(t, id), lease.MaxFencingToken-1); err != nil {
		t.Fatal(err)
	}
	l := ev5Life{acq: shortReq(id)}
	var err error
	if l.first, err = s.Acquire(bg, l.acq); err != nil || l.first.Lease.FencingToken != lease.MaxFencingToken {
		t.Fatalf("the last token: %+v %v", l.first, err)
	}
	waitExpired(t, s, l.first.Lease)
	_, err = s.Acquire(bg, acquireReq(id))
	mustCode(t, err, lease.CodeCounterExhausted)
	if entryOf(t, s, l.first.Lease) == "" {
		t.Fatal("the exhausted acquisition did not archive the expired lease")
	}
	l.mustEV5Stored(t, s)
	l.mustFirst(t, s, "archived by an exhausted acquisition")
}

// A namespace in format 7 backed up and restored under another prefix,
// then recovered (its active lease revoked by recover_end, whose archive
// writes that lease's acquisition in version 5): the evidence and entries
// keep their bytes (no prefix in either), every replay answers the first
// answer, and the trims in the restored namespace detach it.
func TestAttackEV5CheckRestoredElsewhereAndRecovered(t *testing.T) {
	r := sharedServer(t)
	src := ev5Store(t, r, 3, Options{})
	id := newIdentity()
	released := ev5End(t, src, id, true)
	revoked := ev5End(t, src, id, false)
	live := ev5Life{acq: acquireReq(id)}
	var err error
	if live.first, err = src.Acquire(bg, live.acq); err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: src.opts}
	dst := open(t, r, o)
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	c, _ := closedState(t, o)
	res, err := c.Finish(bg, lease.RecoveryPlan{Reason: "restored <elsewhere> \"ü\""})
	if err != nil || len(res.Revoked) != 1 || res.Revoked[0] != live.first.Lease.LeaseID {
		t.Fatalf("finish: %+v %v", res, err)
	}
	after := open(t, r, o) // reads the restored switch
	if !after.writes(leanEvidence) {
		t.Fatalf("the restored namespace writes %q", after.writeFormat())
	}
	for _, l := range []ev5Life{released, revoked, live} {
		l.mustEV5Stored(t, after)
	}
	released.mustFirst(t, after, "released, restored")
	revoked.mustFirst(t, after, "revoked, restored")
	live.mustFirst(t, after, "revoked by recovery")
	trimAway(t, after, id, live.first.Lease.LeaseID)
	for _, l := range []ev5Life{released, revoked, live} {
		if v, _ := get(t, after, evidenceKey(t, after, l.acq)); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
			t.Fatalf("evidence after the trims in the restored namespace: %.8q", v)
		}
		l.mustFirst(t, after, "restored and detached")
	}
}

// The check's cost where it runs most: an instance whose history retention
// is shorter (still above the idempotency retention, so it refers) ends a
// lease on an identity whose full list (cap 64) another instance filled
// with released leases, 128 evidence values by reference: the one ending
// runs detach over the whole list (the PTTL path), one SHA-1 per evidence
// value, and rewrites all of them; its next ending finds the list's TTL
// within its retention and detaches nothing. Timed against the same in
// format 6 (version 3, no check) for the report; the assertions are the
// rewrites and the first answers.
func TestAttackEV5CheckPTTLPathCost(t *testing.T) {
	r := sharedServer(t)
	const hist = 64
	timed := map[string]time.Duration{}
	for _, format := range []string{leanRecords, leanEvidence} {
		prefix := randomPrefix()
		long := ev5Store(t, r, hist, Options{KeyPrefix: prefix})
		short := ev5Store(t, r, hist, Options{KeyPrefix: prefix,
			StoreOptions: lease.StoreOptions{HistoryRetention: long.opts.IdempotencyRetention + time.Hour}})
		long.setFormat(format)
		short.setFormat(format)
		id := newIdentity()
		var lives []ev5Life
		for i := 0; i < hist; i++ {
			lives = append(lives, ev5End(t, long, id, true))
		}
		want := map[string]string{leanRecords: lease.EvidenceRefPrefix, leanEvidence: lease.EvidenceLeanIDPrefix}[format]
		if v := mustGet(t, long, evidenceKey(t, long, lives[0].acq)); !strings.HasPrefix(v, want) {
			t.Fatalf("format %s: evidence %.4q", format, v)
		}
		next := ev5Life{acq: acquireReq(id)}
		var err error
		if next.first, err = short.Acquire(bg, next.acq); err != nil {
			t.Fatal(err)
		}
		rel := releaseReq(next.first.Lease)
		start := time.Now()
		if _, err := short.Release(bg, rel); err != nil {
			t.Fatal(err)
		}
		timed[format+" PTTL path"] = time.Since(start)
		for _, l := range lives {
			for _, k := range []string{evidenceKey(t, long, l.acq), releaseEvidenceKey(t, long, l.rel)} {
				if v, _ := get(t, long, k); !strings.HasPrefix(v, lease.EvidenceV2Prefix) {
					t.Fatalf("format %s: evidence %.4q after the shorter instance's ending", format, v)
				}
			}
		}
		lives[0].mustFirst(t, long, "rewritten on the PTTL path")
		lives[hist-1].mustFirst(t, short, "rewritten on the PTTL path, read by the shorter instance")
		again, err := short.Acquire(bg, acquireReq(id))
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if _, err := short.Release(bg, releaseReq(again.Lease)); err != nil {
			t.Fatal(err)
		}
		timed[format+" next ending"] = time.Since(start)
	}
	t.Logf("one ending's call: %v", timed)
}
