package valkey

import (
	"strconv"
	"strings"
	"testing"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// The index and schedule members the library writes are exactly the
// documented bytes (lease's index values, the lease id, the hash tag, the
// token), with the documented scores, also for parts of 256 bytes whose
// length prefix has a high byte; a renewal moves only the schedule score,
// and a release removes them all and leaves exactly HistoryEntry's bytes.
func TestIndexAndScheduleMembersAreExact(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions()})
	long := strings.Repeat("a", 256)
	score := func(key, member string) (float64, bool) {
		t.Helper()
		v, err := s.client.Do(bg, s.client.B().Zscore().Key(key).Member(member).Build()).AsFloat64()
		if vk.IsValkeyNil(err) {
			return 0, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	for _, big := range []bool{false, true} {
		id, principal := newIdentity(), owner.PrincipalID
		if big {
			id.TenantID = (uid("tenant-") + long)[:256]
			id.TargetID = (uid("target_") + long)[:256]
			principal = (uid("prn_") + long)[:256]
		}
		req := acquireReq(id)
		req.Caller.PrincipalID = principal
		a, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		rec := a.Lease
		tag := tagOf(rec.LockKey)
		tail := rec.LeaseID + "\x00" + tag
		index := []string{"owner\x00" + lease.OwnerIndexValue(principal) + tail,
			"target\x00" + lease.TargetIndexValue(rec.Identity()) + tail,
			"program\x00" + lease.ProgramIndexValue(rec.Identity()) + tail}
		all, err := s.client.Do(bg, s.client.B().Zrange().Key(s.keys.index()).Min("0").Max("-1").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range all {
			if strings.HasSuffix(m, tail) {
				n++
			}
		}
		if n != len(index) {
			t.Fatalf("%d index members for the lease, want %d", n, len(index))
		}
		for _, m := range index {
			if v, ok := score(s.keys.index(), m); !ok || v != 0 {
				t.Fatalf("index member %q: score %v present %v", m, v, ok)
			}
		}
		sched := tag + "\x00" + rec.LeaseID + "\x00" + strconv.FormatUint(rec.FencingToken, 10)
		if v, ok := score(s.keys.expiry(), sched); !ok || int64(v) != rec.ExpiresAt.UnixMilli() {
			t.Fatalf("schedule member: score %v present %v, want %d", v, ok, rec.ExpiresAt.UnixMilli())
		}

		rr := renewReq(rec)
		rr.Caller.PrincipalID = principal
		rr.TTL = 2 * time.Second
		rn, err := s.Renew(bg, rr)
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := score(s.keys.expiry(), sched); !ok || int64(v) != rn.Lease.ExpiresAt.UnixMilli() {
			t.Fatalf("renewed schedule member: score %v present %v, want %d", v, ok, rn.Lease.ExpiresAt.UnixMilli())
		}

		rel := releaseReq(rn.Lease)
		rel.Caller.PrincipalID = principal
		if _, err := s.Release(bg, rel); err != nil {
			t.Fatal(err)
		}
		for _, m := range index {
			if _, ok := score(s.keys.index(), m); ok {
				t.Fatalf("index member %q survived release", m)
			}
		}
		if _, ok := score(s.keys.expiry(), sched); ok {
			t.Fatal("schedule member survived release")
		}
		h := onlyHistoryEntry(t, s, tag)
		if h.EndedBy != principal || h.RequestID != rel.RequestID || h.Record.State != lease.StateReleased {
			t.Fatalf("history entry: %+v", h)
		}
	}
}
