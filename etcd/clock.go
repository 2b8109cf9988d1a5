package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/lease"
)

// The clock guard. Identity time is max(server clock, recorded time), so
// a server whose clock runs ahead would carry every identity it touches
// into its future: leases of those identities outlive their TTL, as the
// other servers measure it, by the lead. Each server therefore publishes
// its clock (meta/clock/<instance>, under an etcd lease so a dead server's
// entry goes) and compares with the others': a server ahead of the
// median of the others by more than MaxClockSkew fails closed: it refuses
// every transition, stamping read and reaper pass (backend_unavailable)
// and reports itself unsuitable, until its clock is back within the
// bound. A server behind is safe (it takes the recorded time) and only
// warns. A lone server has nobody to compare with.

// DefaultMaxClockSkew is the default of Options.MaxClockSkew.
const DefaultMaxClockSkew = 10 * time.Second

// clockBeat is how often a server publishes and compares its clock.
const clockBeat = time.Second

// clockGuard is one server's view of its clock against the others'.
type clockGuard struct {
	instance string
	maxSkew  time.Duration

	mu      sync.Mutex
	aheadBy time.Duration // > maxSkew: refuse
	// seen is each peer entry's mod revision at the last beat: only an
	// entry rewritten since (a live server's) is compared, so the last
	// value of a server that died, aging until its etcd lease ends, is
	// never taken for a clock behind.
	seen map[string]int64
}

func newClockGuard(maxSkew time.Duration) *clockGuard {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &clockGuard{instance: hex.EncodeToString(b[:]), maxSkew: maxSkew, seen: map[string]int64{}}
}

// ahead reports how far this server's clock is ahead of the others', if
// it is past the bound.
func (g *clockGuard) ahead() (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.aheadBy, g.maxSkew >= 0 && g.aheadBy > g.maxSkew
}

// refuseIfAhead is the refusal of work on a server whose clock is ahead.
func (s *Store) refuseIfAhead() error {
	if d, ok := s.clockGuard.ahead(); ok {
		return lease.Errorf(lease.CodeBackendUnavailable,
			"this server's clock is %s ahead of the other starlease servers (more than %s): fix its time", d.Round(time.Millisecond), s.clockGuard.maxSkew)
	}
	return nil
}

// beat publishes this server's clock and compares it with the others'.
// The published value is the clock when written; others read it at most
// one beat (plus a round trip) later, so a reading d = mine - theirs is
// the true lead plus at most one beat: the lead is taken as d - one beat.
func (s *Store) beat(ctx context.Context, leaseID clientv3.LeaseID) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	key := s.keys.clockPrefix() + s.clockGuard.instance
	if _, err := s.cli.Put(ctx, key, string(u64(uint64(s.clock()))), clientv3.WithLease(leaseID)); err != nil {
		return err
	}
	r, err := s.cli.Get(ctx, s.keys.clockPrefix(), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	mine := s.clock()
	g := s.clockGuard
	g.mu.Lock()
	var leads []int64
	seen := map[string]int64{}
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		if k == key {
			continue
		}
		seen[k] = kv.ModRevision
		if prev, ok := g.seen[k]; !ok || prev == kv.ModRevision {
			continue // first sighting, or not rewritten since: not known live
		}
		if theirs, ok := readU64(kv.Value); ok && theirs > 0 {
			leads = append(leads, mine-int64(theirs))
		}
	}
	var lead time.Duration
	if len(leads) > 0 {
		// The lower median: with one other server, its reading; a server
		// is ahead only of a majority of the others.
		slices.Sort(leads)
		lead = max(time.Duration(leads[(len(leads)-1)/2])*time.Millisecond-clockBeat, 0)
	}
	was := g.aheadBy > g.maxSkew
	g.aheadBy, g.seen = lead, seen
	g.mu.Unlock()
	switch now := lead > g.maxSkew; {
	case now && !was:
		s.log.Error("ALERT this server's clock is ahead of the other starlease servers; refusing lease operations until it is fixed",
			"ahead_ms", lead.Milliseconds(), "max_skew_ms", g.maxSkew.Milliseconds())
	case !now && was:
		s.log.Warn("this server's clock is back within the bound of the other starlease servers; lease operations resume")
	}
	return nil
}

// startClockGuard publishes the clock once (so Open's caller is seen by
// the servers already running) and then every beat, under an etcd lease
// renewed with each beat.
func (s *Store) startClockGuard(ctx context.Context) error {
	if s.clockGuard.maxSkew < 0 {
		return nil // disabled: nothing published, nothing refused
	}
	ttl := int64(10 * clockBeat / time.Second)
	bctx, cancel := s.bound(ctx)
	g, err := s.cli.Grant(bctx, ttl)
	cancel()
	if err != nil {
		return err
	}
	leaseID := g.ID
	if err := s.beat(ctx, leaseID); err != nil {
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(clockBeat)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				rctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = s.cli.Revoke(rctx, leaseID)
				cancel()
				return
			case <-t.C:
				kctx, cancel := s.bound(context.Background())
				if _, err := s.cli.KeepAliveOnce(kctx, leaseID); err != nil {
					// The lease expired (a long partition): take a new one.
					if g, gerr := s.cli.Grant(kctx, ttl); gerr == nil {
						leaseID = g.ID
					}
				}
				cancel()
				_ = s.beat(context.Background(), leaseID)
			}
		}
	}()
	return nil
}

// pastDeadline is the deadline rule at this server's clock: a request's
// deadline is set by the server that took it, so it is judged by that
// server's clock, not by identity time (which may be another server's,
// ahead).
func (s *Store) pastDeadline(due lease.Timestamp) error {
	return lease.PastDeadline(lease.UnixMilli(s.clock()), due)
}
