package valkey

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// indexMembers reads the List index.
func indexMembers(t *testing.T, s *Store) []string {
	t.Helper()
	m, err := s.client.Do(bg, s.client.B().Zrange().Key(s.keys.index()).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// listAll pages through an owner's leases, page size 1, and returns their
// lease ids in the order listed.
func listAll(t *testing.T, s *Store) []string {
	t.Helper()
	var ids []string
	token := ""
	for {
		l, err := s.List(bg, lease.ListRequest{By: lease.ListByOwner, OwnerPrincipalID: owner.PrincipalID, PageSize: 1,
			PageToken: token, DeadlineAt: far()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.Leases {
			ids = append(ids, r.LeaseID)
		}
		if token = l.NextPageToken; token == "" {
			return ids
		}
	}
}

// V5: a format 4 lease's index members end with its lease id (no tag);
// List finds the tag through the lease-id lookup, pages through members of
// both forms in lease-id order, skips a member whose lookup is gone or
// malformed, and an ending removes the members in both forms.
func TestIndexMembersWithoutTag(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), CompactRecords: true}
	s3 := open(t, r, o)
	old, err := s3.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	o.CompactRecords, o.EmbeddedEvidence = false, true
	var alerts bytes.Buffer // (the test's goroutine alone logs: no reaper)
	o.StoreOptions.Logger = slog.New(slog.NewTextHandler(&alerts, nil))
	s := open(t, r, o)
	var all []string
	var fresh []lease.Result
	for range 4 {
		res := acquire4(t, s, acquireReq(newIdentity()))
		fresh = append(fresh, res)
		all = append(all, res.Lease.LeaseID)
	}
	all = append(all, old.Lease.LeaseID)
	slices.Sort(all)
	members := indexMembers(t, s)
	if len(members) != 15 {
		t.Fatalf("%d index members, want 15", len(members))
	}
	for _, res := range fresh {
		tag := tagOf(res.Lease.LockKey)
		n := 0
		for _, m := range members {
			if strings.Contains(m, tag) {
				t.Fatalf("a format 4 member holds its tag: %q", m)
			}
			if strings.HasSuffix(m, res.Lease.LeaseID) {
				n++
			}
		}
		if n != 3 {
			t.Fatalf("%d members end with %s, want 3", n, res.Lease.LeaseID)
		}
	}
	if got := listAll(t, s); !slices.Equal(got, all) {
		t.Fatalf("listed %v, want %v", got, all)
	}
	// Both forms of a format 4 lease's members go when it ends.
	ended := fresh[0].Lease
	tagged := "owner\x00" + string(rune(0)) + string(rune(len(owner.PrincipalID))) + owner.PrincipalID + ended.LeaseID + "\x00" + tagOf(ended.LockKey)
	if err := s.client.Do(bg, s.client.B().Zadd().Key(s.keys.index()).ScoreMember().ScoreMember(0, tagged).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(bg, releaseReq(ended)); err != nil {
		t.Fatal(err)
	}
	for _, m := range indexMembers(t, s) {
		if strings.Contains(m, ended.LeaseID) {
			t.Fatalf("a member of the ended lease is left: %q", m)
		}
	}
	if got := len(indexMembers(t, s)); got != 12 {
		t.Fatalf("%d index members after the end, want 12", got)
	}
	// A member whose lookup is gone, or malformed, is skipped.
	gone, bad := fresh[1].Lease, fresh[2].Lease
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.leaseLookup(gone.LeaseID)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.leaseLookup(bad.LeaseID)).Value("not-a-tag").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(slices.Clone(all), func(id string) bool {
		return id == ended.LeaseID || id == gone.LeaseID || id == bad.LeaseID
	})
	if got := listAll(t, s); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	// The malformed lookup never named a key: it was refused.
	if n := strings.Count(alerts.String(), "ALERT malformed lease-id lookup"); n == 0 {
		t.Fatal("a malformed lease-id lookup was not alerted")
	}
}
