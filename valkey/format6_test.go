package valkey

import (
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Tests of stored format 6 (format.go): format 5, and a record carrying
// its acquisition's evidence in version 4 (lease.LeanRecord).

func open6(t *testing.T, o Options) *Store {
	t.Helper()
	if o.StoreOptions.HistoryPerIdentity == 0 {
		o.StoreOptions = leasetest.StoreOptions()
	}
	o.LeanRecords = true
	s := open(t, sharedServer(t), o)
	if !s.writes(leanRecords) || s.writeFormat() != "lean_records" {
		t.Fatal("the namespace is not in format 6")
	}
	return s
}

// mustLean checks that the active record of rec's identity is rec in
// version 4 with the acquisition evidence of req (ttl its acquisition's
// ttl_ms), byte for byte as Go's lease.LeanRecord writes it.
func mustLean(t *testing.T, s *Store, req lease.AcquireRequest, rec *lease.Record, ttl int64) string {
	t.Helper()
	_, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	raw := mustGet(t, s, s.keys.active(tagOf(rec.LockKey)))
	want, err := lease.LeanRecord(rec, lease.EmbeddedEvidence{Digest: p.Digest, Scope: p.Scope, TTLMs: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if raw != string(want) {
		t.Fatalf("stored record:\n got  %q\n want %q", raw, want)
	}
	return raw
}

// Every record a format 6 namespace writes for an active lease is version
// 4, exactly as Go writes it: at acquire, at renewals (with the same and
// another ttl, up to the maximum lifetime, which caps the expiry), and
// the replays, lookups, inspects and endings read it back.
func TestLeanRecordsStored(t *testing.T) {
	s := open6(t, Options{})
	for _, meta := range []lease.Metadata{nil, {"purpose": `quote " backslash \ <tag> & ünïcödé`, "nl": "x\ny"}} {
		req := acquireReq(newIdentity())
		req.Metadata = meta
		req.TTL, req.MaximumLifetime = time.Second, 2500*time.Millisecond
		first, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		raw := mustLean(t, s, req, first.Lease, first.Lease.TTLMs)
		if !strings.HasPrefix(raw, lease.RecordV4Prefix+tagOf(first.Lease.LockKey)+"\n") || strings.Contains(raw, "\nactive\n") {
			t.Fatalf("version 4 without its tag line or with the state: %q", raw)
		}
		mustReplay(t, s, req, first, "")

		// A renewal 600 ms later with a 1 s ttl, then one with a 2 s
		// ttl, which the 2.5 s lifetime caps: each expiry is derived and
		// left out.
		time.Sleep(600 * time.Millisecond)
		var renewed lease.Result
		for _, ttl := range []time.Duration{time.Second, 2 * time.Second} {
			rn := renewReq(first.Lease)
			rn.TTL = ttl
			if renewed, err = s.Renew(bg, rn); err != nil {
				t.Fatal(err)
			}
			mustLean(t, s, req, renewed.Lease, first.Lease.TTLMs)
		}
		if got := renewed.Lease.ExpiresAt.UnixMilli() - renewed.Lease.AcquiredAt.UnixMilli(); got != 2500 {
			t.Fatalf("expiry %d ms after acquisition, want the 2.5 s lifetime", got)
		}
		ins, err := s.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far()})
		if err != nil || encoded(t, ins.Lease) != encoded(t, renewed.Lease) {
			t.Fatalf("inspect after the renewal: %+v %v", ins.Lease, err)
		}
		mustReplay(t, s, req, first, "")
		rel, err := s.Release(bg, releaseReq(renewed.Lease))
		if err != nil || rel.Code != lease.CodeReleased {
			t.Fatalf("release: %+v %v", rel, err)
		}
		if _, ok := get(t, s, s.keys.active(tagOf(first.Lease.LockKey))); ok {
			t.Fatal("the released lease's record is still there")
		}
		mustReplay(t, s, req, first, lease.StateReleased)
	}
}

// A version 4 record copied under another identity's key fails closed
// there, for every operation that reads it (its tag and tuple are its
// own).
func TestLeanRecordMisplaced(t *testing.T) {
	s := open6(t, Options{})
	victim := acquireReq(newIdentity())
	v, err := s.Acquire(bg, victim)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	key := s.keys.active(tagOf(v.Lease.LockKey))
	copied := mustGet(t, s, s.keys.active(tagOf(other.Lease.LockKey)))
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(copied).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Inspect(bg, lease.InspectRequest{Identity: victim.Identity, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	_, err = s.Acquire(bg, victim)
	mustCode(t, err, lease.CodeCorrupt)
	_, err = s.Acquire(bg, acquireReq(victim.Identity))
	mustCode(t, err, lease.CodeCorrupt)
	rn := renewReq(other.Lease)
	rn.Identity = victim.Identity
	_, err = s.Renew(bg, rn)
	mustCode(t, err, lease.CodeCorrupt)
	_, err = s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpAcquire, Identity: victim.Identity, PrincipalID: victim.Caller.PrincipalID,
		RequestID: victim.RequestID, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	if got := mustGet(t, s, key); got != copied {
		t.Fatal("a refused operation changed the record")
	}
}

// A namespace switched from format 5 to 6: a version 3 record renewed
// there becomes version 4; a version 4 record renewed by an instance that
// has not yet seen the switch becomes version 3, its evidence kept; every
// replay answers the first answer.
func TestLeanRecordsAcrossTheSwitch(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), ReferringEvidence: true}
	a, b := open(t, r, o), open(t, r, o)
	req5 := acquireReq(newIdentity())
	old, err := a.Acquire(bg, req5)
	if err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, a, a.keys.active(tagOf(old.Lease.LockKey))); !strings.HasPrefix(v, lease.RecordV3Prefix) {
		t.Fatalf("format 5 record: %.10q", v)
	}
	if err := a.EnableLeanRecords(bg); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, a, a.keys.format()); v != leanRecords {
		t.Fatalf("switch %q", v)
	}
	mustReplay(t, a, req5, old, "")
	renewed, err := a.Renew(bg, renewReq(old.Lease))
	if err != nil {
		t.Fatal(err)
	}
	mustLean(t, a, req5, renewed.Lease, old.Lease.TTLMs)
	mustReplay(t, b, req5, old, "")

	req6 := acquireReq(newIdentity())
	first, err := a.Acquire(bg, req6)
	if err != nil {
		t.Fatal(err)
	}
	mustLean(t, a, req6, first.Lease, first.Lease.TTLMs)
	if b.writes(leanRecords) {
		t.Fatal("b saw the switch already")
	}
	if _, err := b.Renew(bg, renewReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, b, b.keys.active(tagOf(first.Lease.LockKey))); !strings.HasPrefix(v, lease.RecordV3Prefix) {
		t.Fatalf("renewed by a format 5 writer: %.10q", v)
	}
	mustReplay(t, b, req6, first, "")
	mustReplay(t, a, req6, first, "")
	for _, rec := range []*lease.Record{renewed.Lease, first.Lease} {
		cur, err := a.Inspect(bg, lease.InspectRequest{Identity: rec.Identity(), DeadlineAt: far()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Release(bg, releaseReq(cur.Lease)); err != nil {
			t.Fatal(err)
		}
	}
	mustReplay(t, a, req5, old, lease.StateReleased)
	mustReplay(t, b, req6, first, lease.StateReleased)
}

// A record whose lease id does not start with lease.LeaseIDPrefix (one
// this service did not issue, restored or seeded) has no version 4 form:
// a format 6 renewal keeps it in version 3, and it reads back as it is.
func TestLeanRecordForeignLeaseID(t *testing.T) {
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
	if err := a.client.Do(bg, a.client.B().Set().Key(key).Value(raw).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	o.ReferringEvidence, o.LeanRecords = false, true
	b := open(t, r, o)
	rec := res.Lease.Clone()
	rec.LeaseID = foreign
	renewed, err := b.Renew(bg, renewReq(rec))
	if err != nil || renewed.Lease.LeaseID != foreign {
		t.Fatalf("renewal: %+v %v", renewed.Lease, err)
	}
	if v := mustGet(t, b, key); !strings.HasPrefix(v, lease.RecordV3Prefix) || !strings.Contains(v, "\n"+foreign+"\n") {
		t.Fatalf("stored after a format 6 renewal: %.80q", v)
	}
	ins, err := b.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far()})
	if err != nil || encoded(t, ins.Lease) != encoded(t, renewed.Lease) {
		t.Fatalf("inspect: %+v %v", ins.Lease, err)
	}
}

// lean4Corruptions are damaged copies of a version 4 record beyond the
// line damage rv2Corruptions makes: each shortening's other spellings.
func lean4Corruptions(raw string) map[string]string {
	lines := strings.Split(raw, "\n")
	with := func(i int, v string) string {
		c := append([]string(nil), lines...)
		c[i] = v
		return strings.Join(c, "\n")
	}
	const tagLine, digest, tuple, facts = 1, 2, 5, 12
	out := map[string]string{
		"renewed_zero":    with(facts+7, "0"),
		"expires_spelled": with(facts+8, "30000"), // acquireReq's ttl: the derived expiry
		"state_line":      strings.Join(append(append(append([]string(nil), lines[:len(lines)-1]...), "active"), lines[len(lines)-1]), "\n"),
		"tag_line":        strings.Join(append(append(append([]string(nil), lines[:tuple]...), strings.Repeat("A", 43)), lines[tuple:]...), "\n"),
		"digest_padded":   with(digest, lines[digest]+"="),
		"ttl_spelled":     with(4, "30000"),
		"tag_other":       with(tagLine, strings.Repeat("A", 43)),
		"tag_short":       with(tagLine, lines[tagLine][:42]),
		"tag_first_8":     with(tagLine, lines[tagLine][:8]),
		"acquired_plus":   with(facts+6, "+"+lines[facts+6]),
		"acquired_zero":   with(facts+6, "0"+lines[facts+6]),
		"acquired_17":     with(facts+6, "10000000000000000"),
	}
	if lines[len(lines)-1] == "" {
		out["meta_braces"] = with(len(lines)-1, "{}") // empty metadata is left out
	}
	// The last digest character's 2 low bits are padding.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	v := strings.IndexByte(alphabet, lines[digest][42]) &^ 3
	for p := 1; p < 4; p++ {
		out["digest_padding_"+alphabet[v+p:v+p+1]] = with(digest, lines[digest][:42]+alphabet[v+p:v+p+1])
	}
	return out
}

// The library's version 4 decoding agrees with Go's
// (lease.DecodeEmbeddingRecordAt, under the key's lock key) on every
// damaged copy of a stored record: it never reads what Go refuses but for
// metadata (Go decodes every record the library returns), and never
// refuses what Go reads.
func TestLeanRecordDecodingAgreesWithGo(t *testing.T) {
	s := open6(t, Options{})
	withTestFunctions(t, s, decodeCheck, "starlease_decode_check6", "sldc6_")
	for _, meta := range []lease.Metadata{nil, {"purpose": `quote " backslash \ <tag> & ünïcödé`, "nl": "x\ny"}} {
		req := acquireReq(newIdentity())
		req.Metadata = meta
		a, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		raw := mustGet(t, s, s.keys.active(tagOf(a.Lease.LockKey)))
		if !strings.HasPrefix(raw, lease.RecordV4Prefix) {
			t.Fatalf("not stored in version 4: %.40q", raw)
		}
		verdict := func(b string) string { return libraryVerdict(t, s, a.Lease, b) }
		if v := verdict(raw); v != "ok" {
			t.Fatalf("the stored record itself: %q", v)
		}
		cases := rv2Corruptions(raw)
		for name, bad := range lean4Corruptions(raw) {
			cases[name] = bad
		}
		accepted, refused := 0, 0
		for name, bad := range cases {
			v := verdict(bad)
			rec, _, gerr := lease.DecodeEmbeddingRecordAt([]byte(bad), a.Lease.LockKey)
			goOK := gerr == nil && rec.LockKey == a.Lease.LockKey
			switch {
			case goOK && v != "ok":
				t.Errorf("%s: the library refuses what Go reads: %q\n%q", name, v, bad)
			case v == "ok" && !goOK && !strings.HasPrefix(bad, raw[:strings.LastIndexByte(raw, '\n')+1]):
				t.Errorf("%s: the library reads what Go refuses (%v), not for its metadata\n%q", name, gerr, bad)
			}
			if _, shortening := lean4Corruptions(raw)[name]; shortening && (v == "ok" || goOK) {
				t.Errorf("%s: another spelling is read (library %q, Go %v)", name, v, gerr)
			}
			if v == "ok" {
				accepted++
			} else {
				refused++
			}
		}
		if accepted == 0 || refused < 3*accepted {
			t.Fatalf("%d corruptions accepted, %d refused", accepted, refused)
		}
	}
}

// A build that knows only format 5 (its library without level 6 and
// version 4 records, simulated) refuses a format 6 namespace's switch and
// answers its version 4 records as corrupt; so does a Go reader without
// the key's lock key.
func TestLeanRecordsGate(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), LeanRecords: true}
	s6 := open(t, r, o)
	req := acquireReq(newIdentity())
	res, err := s6.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	raw := mustLean(t, s6, req, res.Lease, res.Lease.TTLMs)
	if _, err := lease.DecodeStoredRecord([]byte(raw)); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("a format 3 Go reader on version 4: %v", err)
	}
	if _, _, err := lease.DecodeEmbeddingRecord([]byte(raw)); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("a format 5 Go reader on version 4: %v", err)
	}
	old := olderBuild(t, r, o.KeyPrefix, ", ['6'] = 6", "  if head == 'rv4\\n' then return decode_rv4(raw, lock_key, a, o) end\n")
	mustCode(t, old.raiseFormat(bg, referringEvidence), lease.CodeCorrupt)
	if v := mustGet(t, old, old.keys.format()); v != leanRecords {
		t.Fatalf("an older build changed the switch to %q", v)
	}
	_, err = old.Inspect(bg, lease.InspectRequest{Identity: req.Identity, DeadlineAt: far()})
	mustCode(t, err, lease.CodeCorrupt)
	_, err = old.Renew(bg, renewReq(res.Lease))
	mustCode(t, err, lease.CodeCorrupt)
	_, err = old.Acquire(bg, req)
	mustCode(t, err, lease.CodeCorrupt)
	if got := mustGet(t, s6, s6.keys.active(tagOf(res.Lease.LockKey))); got != raw {
		t.Fatal("the older build changed the record")
	}
	if _, err := s6.Release(bg, releaseReq(res.Lease)); err != nil {
		t.Fatal(err)
	}
}
