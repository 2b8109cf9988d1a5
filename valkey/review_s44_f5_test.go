package valkey

import (
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Review of format 5 (referring evidence).

// A lease acquired under format 1, 2, 3 or 4 and ended after the switch to
// 5: the release and acquire replays answer the first answers byte for
// byte, before and after the entry is trimmed.
func TestReviewF5FromEveryFormat(t *testing.T) {
	for _, start := range []string{"1", "2", "3", "4"} {
		t.Run("format"+start, func(t *testing.T) {
			r := sharedServer(t)
			so := leasetest.StoreOptions()
			so.HistoryPerIdentity = 1
			o := Options{KeyPrefix: randomPrefix(), StoreOptions: so}
			switch start {
			case "2":
				o.CompactFormat = true
			case "3":
				o.CompactRecords = true
			case "4":
				o.EmbeddedEvidence = true
			}
			a := open(t, r, o)
			req := acquireReq(newIdentity())
			first, err := a.Acquire(bg, req)
			if err != nil {
				t.Fatal(err)
			}
			rr := renewReq(first.Lease)
			rr.TTL = 45 * time.Second
			if _, err := a.Renew(bg, rr); err != nil {
				t.Fatal(err)
			}
			o5 := o
			o5.ReferringEvidence = true
			b := open(t, r, o5)
			rel := releaseReq(first.Lease)
			ended, err := b.Release(bg, rel)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("entry %.4q", historyEntries(t, b, first.Lease.LockKey)[0])
			mustReplay(t, b, req, first, lease.StateReleased)
			mustReleaseReplays(t, b, rel, ended)
			next, err := b.Acquire(bg, acquireReq(req.Identity))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Release(bg, releaseReq(next.Lease)); err != nil {
				t.Fatal(err)
			}
			mustReplay(t, b, req, first, lease.StateExpired)
			mustReleaseReplays(t, b, rel, ended)
			mustReplay(t, a, req, first, lease.StateExpired)
		})
	}
}

// A commit (or renew) finding its lease expired ends it: what does format
// 5 write, and does the acquisition still replay?
func TestReviewF5CommitFindsExpired(t *testing.T) {
	s := open5(t, Options{})
	req := shortReq(newIdentity())
	first := acquire4(t, s, req)
	waitExpired(t, s, first.Lease)
	_, err := s.AuthorizeCommit(bg, commitReq(first.Lease))
	mustCode(t, err, lease.CodeLost)
	e := historyEntries(t, s, first.Lease.LockKey)[0]
	v, _ := get(t, s, evidenceKey(t, s, req))
	t.Logf("history entry %.6q, evidence %.6q", e, v)
	mustReplay(t, s, req, first, lease.StateExpired)
	if !strings.HasPrefix(e, lease.HistoryScopedPrefix) || !strings.HasPrefix(v, lease.EvidenceRefPrefix) {
		t.Errorf("commit's ending in format 5 wrote entry %.4q and evidence %.4q, want hv4/ev3 like every other ending", e, v)
	}
}

// Evidence version 3 that Go refuses as not canonical (a number with a
// leading zero) must not become readable evidence when its entry is
// trimmed: the library's detach parses it with tonumber and re-encodes it.
func TestReviewF5DetachCanonicalizesDamagedEvidence(t *testing.T) {
	for _, field := range []int{ev3TokenLine, ev3BackendLine, ev3ExpiresLine, ev3TTLLine} {
		so := leasetest.StoreOptions()
		so.HistoryPerIdentity = 1
		s := open5(t, Options{StoreOptions: so})
		req := acquireReq(newIdentity())
		first := acquire4(t, s, req)
		if _, err := s.Release(bg, releaseReq(first.Lease)); err != nil {
			t.Fatal(err)
		}
		key := evidenceKey(t, s, req)
		v, _ := get(t, s, key)
		lines := strings.Split(v, "\n")
		lines[field] = "0" + lines[field]
		damaged := strings.Join(lines, "\n")
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(damaged).Keepttl().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Acquire(bg, req)
		mustCode(t, err, lease.CodeCorrupt) // Go: not canonical
		next := acquire4(t, s, acquireReq(req.Identity))
		if _, err := s.Release(bg, releaseReq(next.Lease)); err != nil { // trims first's entry
			t.Fatal(err)
		}
		got, _ := get(t, s, key)
		res, err := s.Acquire(bg, req)
		if err == nil {
			t.Errorf("line %d: damaged evidence %q was rewritten as %.8q… and now answers %s (replayed=%v) instead of corrupt",
				field, lines[field], got, res.Code, res.Replayed)
		}
	}
}

const (
	ev3BackendLine = 4
	ev3TokenLine   = 6
	ev3ExpiresLine = 7
	ev3TTLLine     = 8
)

// Evidence with a code that is not its operation's answers corrupt: of
// version 3 (format 5) and of version 2 (format 4) alike.
func TestReviewF5WrongCode(t *testing.T) {
	for format, open := range map[string]func(*testing.T, Options) *Store{"4": open4, "5": open5} {
		for _, code := range []string{"lease_renewed", "lease_released", "lease_conflict", "lease_revoked"} {
			s := open(t, Options{})
			req := acquireReq(newIdentity())
			first := acquire4(t, s, req)
			rel := releaseReq(first.Lease)
			if _, err := s.Release(bg, rel); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{evidenceKey(t, s, req), releaseEvidenceKey(t, s, rel)} {
				v, _ := get(t, s, key)
				lines := strings.Split(v, "\n")
				lines[3] = code
				if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(strings.Join(lines, "\n")).Keepttl().Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Acquire(bg, req); lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("format %s: acquire evidence with code %s answered %v, want corrupt", format, code, err)
			}
			if _, err := s.Release(bg, rel); code != string(lease.CodeReleased) && lease.CodeOf(err) != lease.CodeCorrupt {
				t.Errorf("format %s: release evidence with code %s answered %v, want corrupt", format, code, err)
			}
		}
	}
}

// Two instances of one namespace with different HistoryRetention: the one
// below the idempotency retention writes format 4's forms, but its next
// ending on the identity shortens the list's TTL under the other's
// version 3 evidence.
func TestReviewF5MixedHistoryRetention(t *testing.T) {
	r := sharedServer(t)
	prefix := randomPrefix()
	a := open(t, r, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions(), ReferringEvidence: true})
	so := leasetest.StoreOptions()
	so.HistoryRetention = 300 * time.Millisecond
	b := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, ReferringEvidence: true})
	req := acquireReq(newIdentity())
	first := acquire4(t, a, req)
	rel := releaseReq(first.Lease)
	if _, err := a.Release(bg, rel); err != nil {
		t.Fatal(err)
	}
	next, err := b.Acquire(bg, acquireReq(req.Identity))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(bg, releaseReq(next.Lease)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	key := evidenceKey(t, a, req)
	v, _ := get(t, a, key)
	t.Logf("evidence %.4q, PEXPIRETIME in %d ms; history list exists: %v", v, pexpireTime(t, a, key)-time.Now().UnixMilli(),
		len(historyEntries(t, a, first.Lease.LockKey)) > 0)
	if _, err := a.Acquire(bg, req); err != nil {
		t.Errorf("replay of an acquisition within its idempotency retention: %v", err)
	}
	if _, err := a.Release(bg, rel); err != nil {
		t.Errorf("replay of a release within its idempotency retention: %v", err)
	}
}
