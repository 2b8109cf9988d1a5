package valkey

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"sync"
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

// replySpy keeps the reply of every FCALL of one library function (by the
// function's name without its prefix) that passes through the client.
type replySpy struct {
	vk.Client
	fn string

	mu      sync.Mutex
	replies [][]string
}

func (c *replySpy) Do(ctx context.Context, cmd vk.Completed) vk.ValkeyResult {
	// Read before Do, which recycles the command.
	args := cmd.Commands()
	match := len(args) > 1 && args[0] == "FCALL" && strings.HasSuffix(args[1], "_"+c.fn)
	res := c.Client.Do(ctx, cmd)
	if match {
		if v, err := res.AsStrSlice(); err == nil {
			c.mu.Lock()
			c.replies = append(c.replies, v)
			c.mu.Unlock()
		}
	}
	return res
}

func (c *replySpy) take(t *testing.T) []string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.replies) != 1 {
		t.Fatalf("%d replies of %s, want 1", len(c.replies), c.fn)
	}
	r := c.replies[0]
	c.replies = nil
	return r
}

// A release, force-release or revoke answers with the ended record: in a
// namespace of format 1 its version 1 JSON (which the library builds for
// version 1 history and evidence anyway), in one of format 2 or 3 its
// version 2 bytes, exactly those of lease.CompactRecord (the reply goes
// only to the build that called, which reads both); either way the
// record the store returns and the one in history.
func TestFinishReplyIsTheEndedRecordInTheNamespaceFormat(t *testing.T) {
	for _, f := range []struct {
		name string
		o    Options
		rv2  bool
	}{
		{"format 1", Options{}, false},
		{"format 2", Options{CompactFormat: true}, true},
		{"format 3", Options{CompactRecords: true}, true},
	} {
		t.Run(f.name, func(t *testing.T) {
			o := f.o
			o.StoreOptions = leasetest.StoreOptions()
			s := open(t, sharedServer(t), o)
			spy := &replySpy{Client: s.client, fn: "finish"}
			s.client = spy
			for _, end := range []struct {
				state lease.State
				do    func(*lease.Record) (lease.Result, error)
			}{
				{lease.StateReleased, func(r *lease.Record) (lease.Result, error) { return s.Release(bg, releaseReq(r)) }},
				{lease.StateReleased, func(r *lease.Record) (lease.Result, error) { return s.ForceRelease(bg, adminReq(r)) }},
				{lease.StateRevoked, func(r *lease.Record) (lease.Result, error) { return s.Revoke(bg, adminReq(r)) }},
			} {
				a, err := s.Acquire(bg, acquireReq(newIdentity()))
				if err != nil {
					t.Fatal(err)
				}
				res, err := end.do(a.Lease)
				if err != nil {
					t.Fatal(err)
				}
				rep := spy.take(t)
				if len(rep) != 3 || rep[0] != "ok" {
					t.Fatalf("reply %q", rep)
				}
				ended := *a.Lease
				ended.State = end.state
				if !reflect.DeepEqual(res.Lease, &ended) {
					t.Fatalf("returned %+v, want %+v", res.Lease, &ended)
				}
				want, err := ended.Encode()
				if f.rv2 {
					want, err = lease.CompactRecord(&ended)
				}
				if err != nil {
					t.Fatal(err)
				}
				if rep[2] != string(want) {
					t.Fatalf("reply record\n%q\nwant\n%q", rep[2], want)
				}
				hist, err := s.History(bg, lease.HistoryRequest{Identity: a.Lease.Identity(), DeadlineAt: far()})
				if err != nil {
					t.Fatal(err)
				}
				if len(hist.Entries) != 1 || !reflect.DeepEqual(hist.Entries[0].Record, &ended) {
					t.Fatalf("history %+v, want the ended record", hist.Entries)
				}
			}
		})
	}
}
