package service

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/starintel/starlease/lease"
)

// Config is server policy. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// MinTTL < ttl_ms <= MaxTTL.
	MinTTL, MaxTTL time.Duration
	// MaxLifetime is the configured positive maximum lifetime; a request may
	// ask for less, never more.
	MaxLifetime time.Duration
	// DefaultDeadline applies when a request names none; MaxDeadline caps
	// every deadline a client asks for.
	DefaultDeadline, MaxDeadline time.Duration
	// MaxWait bounds an acquire's optional retry on conflict; RetryBase and
	// RetryMax bound its jittered exponential backoff.
	MaxWait, RetryBase, RetryMax time.Duration
	// PrincipalRate/Burst and TargetRate/Burst are token buckets for
	// acquire and renew. Every acquire and renewal is charged to its
	// principal's bucket. An acquire is also charged to its target's
	// bucket, which every principal shares; a renewal instead to a bucket
	// of its own target and principal (TargetRate/Burst again), so that
	// nothing another principal sends — acquires that only conflict,
	// renewals of leases it does not hold — can refuse a holder's renewal
	// and let its lease expire under it. A principal's renewals are bounded
	// per target by that bucket and in all by its principal bucket; a
	// principal spamming renewals spends only its own buckets. The renewal
	// buckets, keyed by a target the caller names, are bounded like the
	// others, but when all of them are busy a renewal is admitted (its
	// principal bucket still charged) rather than refused, so filling the
	// set cannot refuse another principal's renewal either.
	PrincipalRate  float64
	PrincipalBurst int
	TargetRate     float64
	TargetBurst    int
	// MaxConcurrent caps concurrent backend operations; excess is refused,
	// never queued.
	MaxConcurrent int
	// MaxActivePerPrincipal is the quota of active leases per principal.
	MaxActivePerPrincipal int
	// MaxListReads caps the store pages one list request reads while it
	// fills its page with leases the caller may see.
	MaxListReads int
	// PublishExchanges, when not nil, are the only exchanges a
	// publication (CommitInput.Outbox) may name; "" is the default
	// exchange. Another is refused access_denied before anything is
	// stored: the relay publishes with the server's broker credentials,
	// wherever the caller names. Nil allows every exchange.
	PublishExchanges []string
}

// DefaultConfig is the policy used for unset fields.
func DefaultConfig() Config {
	return Config{
		MinTTL: time.Second, MaxTTL: 10 * time.Minute, MaxLifetime: time.Hour,
		DefaultDeadline: 5 * time.Second, MaxDeadline: 30 * time.Second,
		MaxWait: 10 * time.Second, RetryBase: 50 * time.Millisecond, RetryMax: time.Second,
		PrincipalRate: 200, PrincipalBurst: 400, TargetRate: 20, TargetBurst: 40,
		MaxConcurrent: 256, MaxActivePerPrincipal: 10000, MaxListReads: 10,
	}
}

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.MinTTL, d.MinTTL)
	set(&c.MaxTTL, d.MaxTTL)
	set(&c.MaxLifetime, d.MaxLifetime)
	set(&c.DefaultDeadline, d.DefaultDeadline)
	set(&c.MaxDeadline, d.MaxDeadline)
	set(&c.MaxWait, d.MaxWait)
	set(&c.RetryBase, d.RetryBase)
	set(&c.RetryMax, d.RetryMax)
	if c.PrincipalRate == 0 {
		c.PrincipalRate, c.PrincipalBurst = d.PrincipalRate, d.PrincipalBurst
	}
	if c.TargetRate == 0 {
		c.TargetRate, c.TargetBurst = d.TargetRate, d.TargetBurst
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = d.MaxConcurrent
	}
	if c.MaxActivePerPrincipal == 0 {
		c.MaxActivePerPrincipal = d.MaxActivePerPrincipal
	}
	if c.MaxListReads == 0 {
		c.MaxListReads = d.MaxListReads
	}
	switch {
	case c.MinTTL < 0 || c.MinTTL >= c.MaxTTL || c.MaxTTL > lease.MaxTTL:
		return c, fmt.Errorf("service: need 0 <= min TTL < max TTL <= %s", lease.MaxTTL)
	case c.MaxLifetime <= 0 || c.MaxLifetime > lease.MaxLifetime:
		return c, fmt.Errorf("service: maximum lifetime must be positive and at most %s", lease.MaxLifetime)
	case c.DefaultDeadline <= 0 || c.DefaultDeadline > c.MaxDeadline:
		return c, fmt.Errorf("service: need 0 < default deadline <= max deadline")
	case c.MaxWait < 0 || c.RetryBase <= 0 || c.RetryMax < c.RetryBase:
		return c, fmt.Errorf("service: bad acquire retry bounds")
	case c.PrincipalRate < 0 || c.TargetRate < 0 || c.PrincipalBurst < 1 || c.TargetBurst < 1:
		return c, fmt.Errorf("service: rate limits need positive bursts")
	case c.MaxConcurrent < 1 || c.MaxActivePerPrincipal < 1 || c.MaxListReads < 1:
		return c, fmt.Errorf("service: concurrency, quota and list reads must be positive")
	}
	for _, x := range c.PublishExchanges {
		// The outbox's own rule for an exchange name, so every name
		// listed can be published to.
		if err := lease.CheckExchange(x); err != nil {
			return c, fmt.Errorf("service: publish exchange %q: %s", x, lease.AsError(err).Reason)
		}
	}
	return c, nil
}

// publishAllowed reports whether a publication may name exchange.
func (c Config) publishAllowed(exchange string) bool {
	return c.PublishExchanges == nil || slices.Contains(c.PublishExchanges, exchange)
}

// checkTTL enforces minimum_ttl_ms < ttl_ms <= maximum_ttl_ms.
func (c Config) checkTTL(field string, ttl time.Duration) error {
	if ttl <= c.MinTTL || ttl > c.MaxTTL {
		return lease.Invalid(field, fmt.Sprintf("must be greater than %d and at most %d", c.MinTTL.Milliseconds(), c.MaxTTL.Milliseconds()))
	}
	return nil
}

// DeadlineClass says where an effective deadline came from (audit).
type DeadlineClass string

const (
	DeadlineDefault DeadlineClass = "default"
	DeadlineClient  DeadlineClass = "client"
	DeadlineCapped  DeadlineClass = "capped"
)

// deadline is the effective deadline of call: the client's, or the
// default, never later than the server cap.
func (c Config) deadline(now time.Time, call Call) (time.Time, DeadlineClass) {
	asked, limit := call.DeadlineAt, now.Add(c.MaxDeadline)
	switch {
	case !call.HasDeadline && asked.IsZero():
		return now.Add(c.DefaultDeadline), DeadlineDefault
	case asked.After(limit):
		return limit, DeadlineCapped
	case asked.IsZero():
		// A given zero time is long past; the stores read the zero time as
		// no deadline (and refuse it), so it travels as the next instant
		// they can tell from none, past all the same: deadline_exceeded.
		return asked.Add(time.Millisecond), DeadlineClient
	}
	return asked, DeadlineClient
}

// backoff is full-jitter exponential backoff for retry attempt n (0-based).
func (c Config) backoff(n int) time.Duration {
	d := c.RetryBase << min(n, 20)
	if d <= 0 || d > c.RetryMax {
		d = c.RetryMax
	}
	return time.Duration(rand.Int64N(int64(d))) + time.Millisecond
}

// limiters is a bounded set of token buckets by key. Idle buckets are
// forgotten so the set cannot grow without bound. When every bucket is
// busy a new key is refused, or admitted without a bucket if admitWhenFull
// (for keys a caller chooses whose refusal must not depend on other
// callers, see Config.TargetRate).
type limiters struct {
	mu            sync.Mutex
	limit         rate.Limit
	burst         int
	buckets       map[string]*rate.Limiter
	swept         time.Time
	admitWhenFull bool
}

const maxBuckets = 100_000

func newLimiters(r float64, burst int, admitWhenFull bool) *limiters {
	return &limiters{limit: rate.Limit(r), burst: burst, buckets: map[string]*rate.Limiter{}, admitWhenFull: admitWhenFull}
}

// allow takes one token for key; if none is left it returns how long until
// one is.
func (l *limiters) allow(key string, now time.Time) (bool, time.Duration) {
	if l.limit == 0 {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buckets) >= maxBuckets || now.Sub(l.swept) > time.Minute {
		for k, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, k) // full again: forgetting it changes nothing
			}
		}
		l.swept = now
	}
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			if l.admitWhenFull {
				return true, 0 // every bucket busy: admit rather than grow
			}
			return false, time.Second // every bucket busy: refuse rather than grow
		}
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[key] = b
	}
	r := b.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// activeCounts estimates active leases per principal (see checkQuota),
// bounded like the rate limiters.
type activeCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *activeCounts) get(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[id]
}

func (a *activeCounts) set(id string, v int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil || len(a.n) >= maxBuckets {
		a.n = map[string]int{} // forgetting errs low; the store count corrects it
	}
	if v <= 0 {
		delete(a.n, id)
		return
	}
	a.n[id] = v
}

func (a *activeCounts) add(id string, d int) {
	a.mu.Lock()
	v := a.n[id] + d
	a.mu.Unlock()
	a.set(id, v)
}
