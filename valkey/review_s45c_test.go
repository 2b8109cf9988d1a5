package valkey

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Third review of stored format 6 (session 45), of 7a9a29b: the digest memo, remember's version 1 evidence of a renewal
// of a version 4 record, and the rollback from format 6 to 5.

const b64MemoCheck = `
local function b64_memo_check(keys, args)
  -- args: pairs of hex, base64url; passes run through the memo's resets.
  local ALPHA = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  local n = #args / 2
  for pass = 1, 4 do
    for i = 1, n do
      local h, d = args[2 * i - 1], args[2 * i]
      local first, second
      if (i + pass) % 2 == 0 then first, second = hex_b64(h), b64_hex(d) else second, first = b64_hex(d), hex_b64(h) end
      if first ~= d then return 'hex_b64 ' .. h .. ' = ' .. tostring(first) .. ' want ' .. d end
      if second ~= h then return 'b64_hex ' .. d .. ' = ' .. tostring(second) .. ' want ' .. h end
      local last = string.find(ALPHA, string.sub(d, 43, 43), 1, true) - 1
      for p = 1, 3 do
        local v = (last - last % 4) + p
        local bad = string.sub(d, 1, 42) .. string.sub(ALPHA, v + 1, v + 1)
        if b64_hex(bad) ~= nil then return 'non-canonical read: ' .. bad end
      end
      if b64_hex(d .. '=') ~= nil or b64_hex(string.sub(d, 1, 42)) ~= nil then return 'padded or short read' end
      -- Upper-case hex (no writer passes it): it must not change what
      -- the base64url form reads back as.
      if pass == 4 and i == 1 then
        hex_b64(string.upper(h))
        local back = b64_hex(d)
        if back ~= h then return 'after upper-case hex_b64: b64_hex ' .. d .. ' = ' .. tostring(back) end
      end
    end
  end
  return 'ok'
end
redis.register_function { function_name = FN .. 'b64_memo_check', callback = b64_memo_check, flags = { 'no-writes' } }
`

// The digest memo agrees with Go's base64url both ways, across memo_room's
// resets, and reads no non-canonical spelling.
func TestReview45cDigestMemo(t *testing.T) {
	s := open6(t, Options{})
	withTestFunctions(t, s, b64MemoCheck, "starlease_b64_check", "slb64_")
	args := make([]string, 0, 2*1500)
	for i := 0; i < 1500; i++ {
		var b [32]byte
		if i == 0 {
			b = sha256.Sum256([]byte("x")) // has letters in hex
		} else if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		args = append(args, hex.EncodeToString(b[:]), base64.RawURLEncoding.EncodeToString(b[:]))
	}
	got, err := s.client.Do(bg, s.build(call{fn: "b64_memo_check", ro: true, args: args})).ToString()
	if err != nil || got != "ok" {
		t.Fatalf("memo check: %q %v", got, err)
	}
}

// A renewal and a release of a version 4 record by an instance still
// writing version 1 (its switch read before the namespace went to 6),
// replayed on a format 6 instance: the first answer byte for byte.
func TestReview45cV1WriterReplayOnFormat6(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions()}
	b := open(t, r, o)
	o.LeanRecords = true
	a := open(t, r, o)
	if b.writes(compactFormat) {
		t.Fatal("b is not a version 1 writer")
	}
	req := acquireReq(newIdentity())
	first, err := a.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	mustLean(t, a, req, first.Lease, first.Lease.TTLMs)
	time.Sleep(15 * time.Millisecond)
	rn := renewReq(first.Lease)
	rn.TTL = 7 * time.Second
	r1, err := b.Renew(bg, rn)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Store{"format6": a, "v1": b} {
		r2, err := s.Renew(bg, rn)
		if err != nil || !r2.Replayed || r2.Code != r1.Code || encoded(t, r2.Lease) != encoded(t, r1.Lease) ||
			r2.BackendTime.UnixMilli() != r1.BackendTime.UnixMilli() {
			t.Fatalf("%s: renewal replay %+v %v\nwant %+v", name, r2.Lease, err, r1.Lease)
		}
		lr, err := s.LookupRequest(bg, lease.LookupRequest{Op: lease.OpRenew, Identity: req.Identity, PrincipalID: owner.PrincipalID,
			RequestID: rn.RequestID, DeadlineAt: far()})
		if err != nil || encoded(t, lr.Lease) != encoded(t, r1.Lease) {
			t.Fatalf("%s: renewal lookup %+v %v", name, lr.Lease, err)
		}
	}
	// a renews again (version 4), b releases it, a replays the release.
	r3, err := a.Renew(bg, renewReq(r1.Lease))
	if err != nil {
		t.Fatal(err)
	}
	mustLean(t, a, req, r3.Lease, first.Lease.TTLMs)
	rel := releaseReq(r3.Lease)
	e1, err := b.Release(bg, rel)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := a.Release(bg, rel)
	if err != nil || !e2.Replayed || encoded(t, e2.Lease) != encoded(t, e1.Lease) {
		t.Fatalf("release replay %+v %v\nwant %+v", e2.Lease, err, e1.Lease)
	}
	mustReplay(t, a, req, first, lease.StateReleased)
	mustReplay(t, b, req, first, lease.StateReleased)
}

// Rolling back from format 6 to 5 (README): instances of this build in
// format 5 keep reading version 4 records, renew them into version 3, end
// them, reap them, and replay every answer.
func TestReview45cRollbackTo5(t *testing.T) {
	r := sharedServer(t)
	o := Options{KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), LeanRecords: true}
	a := open(t, r, o)
	type lz struct {
		req   lease.AcquireRequest
		first lease.Result
	}
	mk := func(ttl time.Duration) lz {
		req := acquireReq(newIdentity())
		req.TTL = ttl
		res, err := a.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		mustLean(t, a, req, res.Lease, res.Lease.TTLMs)
		return lz{req, res}
	}
	renewed, released, revoked, expired, reaped := mk(30*time.Second), mk(30*time.Second), mk(30*time.Second), mk(time.Second), mk(time.Second)
	// a has renewed one in version 4 before the rollback.
	time.Sleep(10 * time.Millisecond)
	rr, err := a.Renew(bg, renewReq(renewed.first.Lease))
	if err != nil {
		t.Fatal(err)
	}
	mustLean(t, a, renewed.req, rr.Lease, renewed.first.Lease.TTLMs)

	if err := a.client.Do(bg, a.client.B().Set().Key(a.keys.format()).Value(referringEvidence).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	o.LeanRecords, o.ReferringEvidence = false, true
	c := open(t, r, o)
	if c.writes(leanRecords) || !c.writes(referringEvidence) {
		t.Fatal("c is not in format 5")
	}
	flushMemo(t, c)
	for _, l := range []lz{renewed, released, revoked} {
		mustReplay(t, c, l.req, l.first, "")
		ins, err := c.Inspect(bg, lease.InspectRequest{LeaseID: l.first.Lease.LeaseID, DeadlineAt: far()})
		if err != nil || ins.Lease.LeaseID != l.first.Lease.LeaseID {
			t.Fatalf("inspect by id: %+v %v", ins.Lease, err)
		}
	}
	// Renewed into version 3, replayed alike.
	rn := renewReq(rr.Lease)
	r1, err := c.Renew(bg, rn)
	if err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, c, c.keys.active(tagOf(r1.Lease.LockKey))); !strings.HasPrefix(v, lease.RecordV3Prefix) {
		t.Fatalf("a format 5 renewal stored %.12q", v)
	}
	if r2, err := c.Renew(bg, rn); err != nil || encoded(t, r2.Lease) != encoded(t, r1.Lease) {
		t.Fatalf("renewal replay: %+v %v", r2.Lease, err)
	}
	mustReplay(t, c, renewed.req, renewed.first, "")
	// Released and revoked from version 4.
	rel := releaseReq(released.first.Lease)
	e1, err := c.Release(bg, rel)
	if err != nil {
		t.Fatal(err)
	}
	if e2, err := c.Release(bg, rel); err != nil || !e2.Replayed || encoded(t, e2.Lease) != encoded(t, e1.Lease) {
		t.Fatalf("release replay: %+v %v", e2.Lease, err)
	}
	mustReplay(t, c, released.req, released.first, lease.StateReleased)
	if _, err := c.Revoke(bg, adminReq(revoked.first.Lease)); err != nil {
		t.Fatal(err)
	}
	mustReplay(t, c, revoked.req, revoked.first, lease.StateRevoked)
	// Expired: taken over by another acquisition; reaped by the reaper.
	time.Sleep(1200 * time.Millisecond)
	next := acquireReq(expired.req.Identity)
	if _, err := c.Acquire(bg, next); err != nil {
		t.Fatal(err)
	}
	mustReplay(t, c, expired.req, expired.first, lease.StateExpired)
	if err := c.reap(bg); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, c, c.keys.active(tagOf(reaped.first.Lease.LockKey))); ok {
		t.Fatal("the reaper left an expired version 4 record")
	}
	mustReplay(t, c, reaped.req, reaped.first, lease.StateExpired)
	h, err := c.History(bg, lease.HistoryRequest{Identity: reaped.req.Identity, PageSize: 10, DeadlineAt: far(), Caller: owner})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.State != lease.StateExpired {
		t.Fatalf("history of the reaped lease: %+v %v", h, err)
	}
	if v := mustGet(t, c, c.keys.format()); v != referringEvidence {
		t.Fatalf("switch %q", v)
	}
}
