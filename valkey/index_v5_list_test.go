package valkey

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// seqLeaseIDs makes s hand out lease ids in acquisition order, so a test
// controls where each lease sorts in the List index.
func seqLeaseIDs(s *Store) {
	var n atomic.Int64
	s.leaseIDs = func(lease.Timestamp) string { return fmt.Sprintf("lease_%06d", n.Add(1)) }
}

// endUnarchived puts rec into the state of a lease that ended without an
// archive (no reaper ran before its active key's own expiry, a restore
// dropped the key, an operator deleted a quarantined key): its active key
// and expiry entry gone, its index members left and, if dropLookup, its
// lease-id lookup gone by its own TTL.
func endUnarchived(t *testing.T, s *Store, rec *lease.Record, dropLookup bool) {
	t.Helper()
	tag := tagOf(rec.LockKey)
	keys := []string{s.keys.active(tag)}
	if dropLookup {
		keys = append(keys, s.keys.leaseLookup(rec.LeaseID))
	}
	if err := s.client.Do(bg, s.client.B().Del().Key(keys...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	m := tag + "\x00" + rec.LeaseID + "\x00" + utoa(rec.FencingToken)
	if err := s.client.Do(bg, s.client.B().Zrem().Key(s.keys.expiry()).Member(m).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// pageOwnerIDs pages through owner's leases as a client does, page size
// size, at most maxPages pages; it returns the lease ids listed, and an
// error if a page failed, a token came back twice, or the pages never
// ended.
func pageOwnerIDs(t *testing.T, s *Store, size, maxPages int) ([]string, error) {
	t.Helper()
	var ids []string
	token := ""
	seen := map[string]bool{}
	for range maxPages {
		l, err := s.List(bg, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, PageSize: size,
			PageToken: token, DeadlineAt: far()})
		if err != nil {
			return ids, fmt.Errorf("page after token %q: %w", token, err)
		}
		for _, r := range l.Leases {
			ids = append(ids, r.LeaseID)
		}
		if l.NextPageToken == "" {
			return ids, nil
		}
		if seen[l.NextPageToken] {
			return ids, fmt.Errorf("List answered the same page token again (%q)", l.NextPageToken)
		}
		seen[l.NextPageToken] = true
		token = l.NextPageToken
	}
	return ids, fmt.Errorf("no end after %d pages", maxPages)
}

// F1: a run of more than a page's budget (4 × size + 64) of format 4
// members whose lease ended without an archive and whose lookup is gone
// is stepped over: each such member advances the page cursor, so no page
// answers the token it was given, nor a token for an empty cursor (which
// List refuses as malformed). Format 3's members in the same state, and
// format 4's whose lookup is still there, are the controls.
func TestListStepsOverEndedTagFreeMembers(t *testing.T) {
	const run = 70 // > 4×1+64, the budget of a page of size 1
	for _, tc := range []struct {
		name       string
		format4    bool
		liveFirst  bool
		dropLookup bool
	}{
		{"format3_control", false, true, true},
		{"format4_lookup_still_there", true, true, false},
		{"format4_run_after_a_live_lease", true, true, true},
		{"format4_run_opens_the_range", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: !tc.format4, EmbeddedEvidence: tc.format4}
			s := open(t, sharedServer(t), o)
			seqLeaseIDs(s)
			var want []string
			if tc.liveFirst {
				first, err := s.Acquire(bg, acquireReq(newIdentity()))
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, first.Lease.LeaseID)
			}
			for range run {
				res, err := s.Acquire(bg, acquireReq(newIdentity()))
				if err != nil {
					t.Fatal(err)
				}
				endUnarchived(t, s, res.Lease, tc.dropLookup)
			}
			last, err := s.Acquire(bg, acquireReq(newIdentity()))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, last.Lease.LeaseID)
			got, err := pageOwnerIDs(t, s, 1, 500)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("paging an owner with %d ended, unarchived leases: listed %v, %v; want %v", run, got, err, want)
			}
		})
	}
}

// F1, as the service pages (page size 0: the store's largest page, budget
// 4 × 50 + 64 = 264 in these options): the first page, with no token, is
// answered.
func TestListStepsOverEndedTagFreeMembersLargestPage(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), EmbeddedEvidence: true})
	seqLeaseIDs(s)
	for range 270 {
		res, err := s.Acquire(bg, acquireReq(newIdentity()))
		if err != nil {
			t.Fatal(err)
		}
		endUnarchived(t, s, res.Lease, true)
	}
	live, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	got, err := pageOwnerIDs(t, s, 0, 50)
	if err != nil || !slices.Equal(got, []string{live.Lease.LeaseID}) {
		t.Fatalf("listed %v, %v; want [%s]", got, err, live.Lease.LeaseID)
	}
}

// F2: a lease whose members are in both forms (tagged and tag-free: a
// restore or a repair may mix them) is listed once: the two members sort
// together and resolve to the same record.
func TestListBothFormsListedOnce(t *testing.T) {
	s := open4(t, Options{})
	res := acquire4(t, s, acquireReq(newIdentity()))
	other := acquire4(t, s, acquireReq(newIdentity()))
	for _, rec := range []*lease.Record{res.Lease, other.Lease} {
		tagged := "owner\x00" + string(rune(0)) + string(rune(len(owner.PrincipalID))) + owner.PrincipalID + rec.LeaseID + "\x00" + tagOf(rec.LockKey)
		if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, tagged).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{res.Lease.LeaseID, other.Lease.LeaseID}
	slices.Sort(want)
	l, err := s.List(bg, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, DeadlineAt: far()})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range l.Leases {
		ids = append(ids, r.LeaseID)
	}
	if !slices.Equal(ids, want) || l.NextPageToken != "" {
		t.Fatalf("two leases, listed as %v (token %q); want %v", ids, l.NextPageToken, want)
	}
	// Page by page too: each once, in order.
	if got, err := pageOwnerIDs(t, s, 1, 10); err != nil || !slices.Equal(got, want) {
		t.Fatalf("paged %v, %v; want %v", got, err, want)
	}
}

// readCalls is the server's count of FCALL_RO calls (every read of the
// store's library) so far.
func readCalls(t *testing.T, s *Store) int {
	t.Helper()
	info, err := s.client.Do(bg, s.client.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall_ro:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// F3: a page reads its index in chunks of the page's size (or what is left
// of its budget) whatever the slots left, so a nearly full page followed
// by expired, unreaped leases costs a few rounds, not one per member; its
// results and cursor stay exact (at most size leases, the cursor the last
// one listed).
func TestListChunksStayLarge(t *testing.T) {
	const size, live, expired = 50, 49, 300
	budget := 4*size + 64
	rounds := (budget+size-1)/size + 1
	for _, tc := range []struct {
		name    string
		format4 bool
		calls   int // read calls per round: the index, the lookups (format 4), the records
	}{{"format3", false, 2}, {"format4", true, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: !tc.format4, EmbeddedEvidence: tc.format4})
			seqLeaseIDs(s)
			var want []string
			for range live {
				res, err := s.Acquire(bg, acquireReq(newIdentity()))
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, res.Lease.LeaseID)
			}
			var last *lease.Record
			for range expired {
				res, err := s.Acquire(bg, shortReq(newIdentity()))
				if err != nil {
					t.Fatal(err)
				}
				last = res.Lease
			}
			waitExpired(t, s, last)
			before := readCalls(t, s)
			l, err := s.List(bg, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, PageSize: size, DeadlineAt: far()})
			if err != nil {
				t.Fatal(err)
			}
			if n := readCalls(t, s) - before; n > tc.calls*rounds {
				t.Fatalf("%d read calls for one page of size %d, want at most %d (%d rounds)", n, size, tc.calls*rounds, rounds)
			}
			var ids []string
			for _, r := range l.Leases {
				ids = append(ids, r.LeaseID)
			}
			if !slices.Equal(ids, want) || l.NextPageToken == "" {
				t.Fatalf("listed %v (token %q), want %v and a token (budget spent)", ids, l.NextPageToken, want)
			}
			// Pages smaller than a chunk: each at most its size, the cursor
			// the last lease listed, every lease once, in order.
			for _, pageSize := range []int{1, 7, size} {
				got, err := pageOwnerIDs(t, s, pageSize, 500)
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("page size %d: listed %v, %v; want %v", pageSize, got, err, want)
				}
			}
			for token := ""; ; {
				req := lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, PageSize: 7, PageToken: token, DeadlineAt: far()}
				l, err := s.List(bg, req)
				if err != nil {
					t.Fatal(err)
				}
				if len(l.Leases) > 7 {
					t.Fatalf("a page of size 7 with %d leases", len(l.Leases))
				}
				if l.NextPageToken == "" {
					break
				}
				pg, err := lease.PrepareList(req, s.opts)
				if err != nil {
					t.Fatal(err)
				}
				if n := len(l.Leases); n == 7 && l.NextPageToken != pg.NextPageToken(l.Leases[n-1].LeaseID) {
					t.Fatalf("a full page's token is not its last lease's id (%s)", l.Leases[n-1].LeaseID)
				}
				token = l.NextPageToken
			}
		})
	}
}

// The README's script for rolling back past format 4 removes exactly the
// tag-free List index members (those of format 4 leases), and the ones of
// format 3 leases, with their tag, stay.
func TestReadmeClearsTagFreeIndexMembers(t *testing.T) {
	script, limit := readmeClearScript(t)
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), CompactRecords: true}
	s3 := open(t, r, o)
	var tagged []string
	for range 3 {
		res, err := s3.Acquire(bg, acquireReq(newIdentity()))
		if err != nil {
			t.Fatal(err)
		}
		tagged = append(tagged, res.Lease.LeaseID)
	}
	o.CompactRecords, o.EmbeddedEvidence = false, true
	s := open(t, r, o)
	for range 3 {
		res := acquire4(t, s, acquireReq(newIdentity()))
		endUnarchived(t, s, res.Lease, false)
	}
	if n := len(indexMembers(t, s)); n != 18 {
		t.Fatalf("%d index members, want 18", n)
	}
	run := func() int64 { return clearAll(t, s, script, limit) }
	if n := run(); n != 9 {
		t.Fatalf("the script removed %d members, want 9", n)
	}
	left := indexMembers(t, s)
	if len(left) != 9 {
		t.Fatalf("%d index members left, want 9", len(left))
	}
	for _, m := range left {
		id, tag, ok := strings.Cut(m[strings.Index(m, "lease_"):], "\x00")
		if !ok || !slices.Contains(tagged, id) || !validTag(tag) {
			t.Fatalf("a member left that is not a format 3 lease's: %q", m)
		}
	}
	if n := run(); n != 0 {
		t.Fatalf("a second run removed %d members", n)
	}
	slices.Sort(tagged) // List's order: lease ids made in one millisecond need not rise
	if got := listAll(t, s); !slices.Equal(got, tagged) {
		t.Fatalf("listed %v, want %v", got, tagged)
	}
}

// readmeClearScript is the README's script clearing the List index of
// tag-free members, a batch of at most limit members a run, and the limit
// its loop passes.
func readmeClearScript(t *testing.T) (script, limit string) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const head, end = "valkey-cli EVAL \"", "\" 1 <prefix>:index \"$c\" "
	_, rest, ok := strings.Cut(string(readme), head)
	script, rest, ok2 := strings.Cut(rest, end)
	limit, _, ok3 := strings.Cut(rest, ")")
	if !ok || !ok2 || !ok3 {
		t.Fatal("the README has no script clearing tag-free index members")
	}
	return script, limit
}

// clearBatch is one run of the README's script: from cursor, at most
// limit members.
func clearBatch(t *testing.T, s *Store, script, cursor, limit string) (next string, removed int64) {
	t.Helper()
	rep, err := s.client.Do(bg, s.client.B().Eval().Script(script).Numkeys(1).Key(s.keys.index()).Arg(cursor, limit).Build()).ToArray()
	if err != nil || len(rep) != 2 {
		t.Fatalf("the script answered %v, %v", rep, err)
	}
	if next, err = rep[0].ToString(); err != nil {
		t.Fatal(err)
	}
	if removed, err = rep[1].AsInt64(); err != nil {
		t.Fatal(err)
	}
	return next, removed
}

// clearAll runs the README's loop: the script from cursor 0 until it
// answers 0, summing what it removed. Each run reads at most limit members
// (those after its cursor, up to the one it answers, of the index as it
// was before the run); removes no more than it read.
func clearAll(t *testing.T, s *Store, script, limit string) int64 {
	t.Helper()
	most, err := strconv.Atoi(limit)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	from := ""
	for c, runs := "0", 0; ; runs++ {
		if runs > 100000 {
			t.Fatal("the script's cursor never came to 0")
		}
		before := indexMembers(t, s) // sorted, as ZRANGE answers
		next, n := clearBatch(t, s, script, c, limit)
		to := "\xff\xff\xff\xff"
		if next != "0" {
			b, err := hex.DecodeString(next)
			if err != nil || string(b) <= from && from != "" {
				t.Fatalf("the cursor %q does not move on from %q", next, from)
			}
			to = string(b)
		}
		read := 0
		for _, m := range before {
			if (from == "" || m > from) && m <= to {
				read++
			}
		}
		if read > most || n > int64(read) {
			t.Fatalf("one run read %d members and removed %d, limit %d", read, n, most)
		}
		total += n
		if c, from = next, to; c == "0" {
			return total
		}
	}
}

// malformedIndexMembers are List index members the README's script cannot
// parse: an unknown filter, a value's length prefix cut short, a value
// running past the member's end, fewer values than the filter has, no
// lease id. It leaves them.
var malformedIndexMembers = []string{
	"bogus\x00lease_1",
	"owner\x00\x00",
	"owner\x00\x00\x09ab",
	"owner\x00\x00\x01a",
	"program\x00\x00\x01a",
	"target\x00\x00\x01a\x00\x01b\x00\x01c",
}

// F-B: a member the README's script cannot parse is left, and the script
// goes on: every tag-free member is removed, every tagged one kept. (It
// used to fail on the first, with nil arithmetic, having removed some.)
func TestReadmeScriptLeavesMalformedMembers(t *testing.T) {
	script, readmeLimit := readmeClearScript(t)
	for _, limit := range []string{readmeLimit, "1", "2", "5"} {
		t.Run("limit="+limit, func(t *testing.T) { testReadmeScriptLeavesMalformedMembers(t, script, limit) })
	}
}

func testReadmeScriptLeavesMalformedMembers(t *testing.T, script, limit string) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), CompactRecords: true}
	s3 := open(t, r, o)
	for range 2 {
		if _, err := s3.Acquire(bg, acquireReq(newIdentity())); err != nil {
			t.Fatal(err)
		}
	}
	o.CompactRecords, o.EmbeddedEvidence = false, true
	s := open(t, r, o)
	for range 2 {
		res := acquire4(t, s, acquireReq(newIdentity()))
		endUnarchived(t, s, res.Lease, false)
	}
	for _, m := range malformedIndexMembers {
		if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, m).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if n := clearAll(t, s, script, limit); n != 6 {
		t.Fatalf("the script removed %d; want 6", n)
	}
	var left []string
	for _, m := range indexMembers(t, s) {
		if slices.Contains(malformedIndexMembers, m) {
			continue
		}
		if i := strings.Index(m, "lease_"); i < 0 || !strings.Contains(m[i:], "\x00") {
			t.Fatalf("a tag-free member left: %q", m)
		}
		left = append(left, m)
	}
	if len(left) != 6 || len(indexMembers(t, s)) != 6+len(malformedIndexMembers) {
		t.Fatalf("left %d tagged members (want 6) and %d in all", len(left), len(indexMembers(t, s)))
	}
	if n := clearAll(t, s, script, limit); n != 0 {
		t.Fatalf("a second loop removed %d", n)
	}
}

// F-C: the README's script walks the index in batches, each run reading at
// most its limit of members from its cursor (it blocks the server only for
// that): over an index of several batches, with values whose length
// prefixes are 00 ff and 01 00 and bytes above 0x7f, the loop removes
// exactly the tag-free members, leaves the rest, and a second loop removes
// 0.
func TestReadmeScriptBatches(t *testing.T) {
	script, limit := readmeClearScript(t)
	if limit != "1000" {
		t.Fatalf("the README's loop passes a limit of %s, want 1000", limit)
	}
	s := open4(t, Options{})
	gen := `for i = 1, tonumber(ARGV[1]) do
  local id = string.format('lease_%09d', i)
  local tail = ''
  if i % 2 == 0 then tail = '\0' .. string.rep('A', 43) end
  redis.call('ZADD', KEYS[1], 0, 'owner\0' .. string.char(0, 255) .. string.rep('\255', 255) .. id .. tail)
  redis.call('ZADD', KEYS[1], 0, 'program\0' .. string.char(1, 0) .. string.rep('p', 256) .. string.char(0, 3) .. 'a\0b' .. id .. tail)
  redis.call('ZADD', KEYS[1], 0, 'target\0' .. string.char(0, 1, 116, 0, 1, 112, 0, 1, 0, 0, 1, 0) .. id .. tail)
end
return 1`
	const leases = 1500 // 4,500 members, 2,250 of them tag-free
	if err := s.client.Do(bg, s.client.B().Eval().Script(gen).Numkeys(1).Key(s.keys.index()).Arg(strconv.Itoa(leases)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if n := len(indexMembers(t, s)); n != 3*leases {
		t.Fatalf("%d members", n)
	}
	if n := clearAll(t, s, script, limit); n != 3*leases/2 {
		t.Fatalf("the loop removed %d, want %d (the tag-free members)", n, 3*leases/2)
	}
	for _, m := range indexMembers(t, s) {
		if !strings.HasSuffix(m, "\x00"+strings.Repeat("A", 43)) {
			t.Fatalf("left a tag-free member %q", m)
		}
	}
	if n := len(indexMembers(t, s)); n != 3*leases/2 {
		t.Fatalf("%d members left, want %d", n, 3*leases/2)
	}
	if n := clearAll(t, s, script, limit); n != 0 {
		t.Fatalf("a second loop removed %d", n)
	}
}

// F1's guard: a page's whole budget of members with no lease id to move
// the cursor to (damage) fails the page, alerted, rather than answering
// the token it was given (a client would page forever) or one for an
// empty cursor (which List refuses).
func TestListBudgetOfMalformedMembersFails(t *testing.T) {
	for _, liveFirst := range []bool{true, false} {
		s := open4(t, Options{})
		if liveFirst {
			acquire4(t, s, acquireReq(newIdentity()))
		}
		for i := range 70 {
			m := "owner\x00" + string(rune(0)) + string(rune(len(owner.PrincipalID))) + owner.PrincipalID + "lease_~" + strconv.Itoa(i)
			if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, m).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		ids, err := pageOwnerIDs(t, s, 1, 10)
		if le := (*lease.Error)(nil); !errors.As(err, &le) || le.Code != lease.CodeBackendUnavailable {
			t.Fatalf("live first %v: listed %v, %v; want %s", liveFirst, ids, err, lease.CodeBackendUnavailable)
		}
	}
}

// F-A: a page whose budget runs out between the two members of one lease
// (its tag-free member, whose lookup is gone, spends the last of it; its
// tagged member, which resolves to the live record, follows) still
// consumes the tagged one: the cursor moves past a lease id only once
// every member of it has been consumed, so the lease is listed, once, on
// that page, whose token is its id. The budget ending just before and just
// after the pair, and page sizes 1 and 2, are the controls.
func TestListBudgetEndingBetweenALeasesTwoForms(t *testing.T) {
	for _, size := range []int{1, 2} {
		budget := 4*size + 64
		for _, ended := range []int{budget - 2, budget - 1, budget} {
			t.Run(fmt.Sprintf("size=%d/ended=%d", size, ended), func(t *testing.T) {
				s := open4(t, Options{})
				seqLeaseIDs(s)
				for range ended {
					res := acquire4(t, s, acquireReq(newIdentity()))
					endUnarchived(t, s, res.Lease, true)
				}
				x := acquire4(t, s, acquireReq(newIdentity())).Lease
				tagged := "owner\x00" + string(rune(0)) + string(rune(len(owner.PrincipalID))) + owner.PrincipalID + x.LeaseID + "\x00" + tagOf(x.LockKey)
				if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, tagged).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.leaseLookup(x.LeaseID)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				y := acquire4(t, s, acquireReq(newIdentity())).Lease
				want := []string{x.LeaseID, y.LeaseID}
				var got []string
				token := ""
				for p := 0; ; p++ {
					if p > 10 {
						t.Fatalf("no end: listed %v", got)
					}
					req := lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, PageSize: size, PageToken: token, DeadlineAt: far()}
					l, err := s.List(bg, req)
					if err != nil {
						t.Fatalf("page %d: %v", p, err)
					}
					if len(l.Leases) > size {
						t.Fatalf("a page of size %d with %d leases", size, len(l.Leases))
					}
					pg, err := lease.PrepareList(req, s.opts)
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range l.Leases {
						got = append(got, r.LeaseID)
					}
					if n := len(l.Leases); n > 0 && l.NextPageToken != "" && l.NextPageToken != pg.NextPageToken(l.Leases[n-1].LeaseID) {
						t.Fatalf("page %d: its token is not its last lease's id (%s)", p, l.Leases[n-1].LeaseID)
					}
					if token = l.NextPageToken; token == "" {
						break
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("listed %v, want %v (the live lease whose two members straddle the budget lost)", got, want)
				}
			})
		}
	}
}
