// Package etcd is the lease backend on an etcd cluster: leases, credentials
// and audit in one key prefix of a consensus store, so several starlease
// servers share them and a cluster of three members loses any one of them,
// the leader included, without losing a token, a commit or an event.
//
// # Transitions
//
// Every transition is one etcd transaction. It reads what it decides on in
// one round trip at one revision (a read set), decides in Go, then commits
// its writes in a transaction whose compare holds every key it read at the
// mod revision it saw (absent keys at 0): the record, the counter, the
// idempotency evidence, the namespace's gate. A lost compare means another
// transition got there first; the operation reads afresh and decides again,
// until its deadline. It never writes over what it did not see.
//
// # Backend time
//
// A transaction has no clock, so backend time is defined per identity:
// every operation on an identity takes max(this server's clock, the last
// time recorded for that identity), and every answer on an identity
// records the time it used in the same compare-and-swap (key t/):
// transitions, and also refusals, replays and reads (Inspect,
// LookupRequest), which thereby cost a write. An attempt takes its time
// between its read and its commit, so an answer that recorded nothing
// could carry a later time than a transition that commits after it (an
// inspect saying not_found at 12:00:00.045 while a lease committed just
// after says acquired_at 12:00:00.001); recording every answer makes such
// a transition lose its compare and decide again, later. Time is thereby
// monotonic per identity, in the order the cluster linearizes the
// operations, whatever the servers' skew: two holders never overlap and a
// lease reported ended never comes back, because every decision that an
// expiry was reached is itself a recorded transition (an expired lease is
// archived by the operation that finds it). Skew can only shorten or
// lengthen a lease as its holder measures it; a server whose clock is far
// behind the recorded times logs a warning. List, a read across
// identities, filters by this server's clock alone.
//
// # Keyspace
//
// Under the prefix (KeyPrefix + "/"): meta/ (schema, gate, counter floor,
// epoch, restore marker, outbox sequence and usage), a/ active records,
// c/ counters, t/ identity times, i/ idempotency evidence, k/ accepted
// commits, w/ high-water marks, s/ commit sequences, h/ history, l/ lease
// ids, x/ list indexes, q/ quarantine, o/ the outbox, cred/ credentials
// and audit/ the audit stream. Evidence and history expire through time
// indexes (ie/, ke/, he/) that the reaper consumes from the oldest end in
// bounded transactions. Counters, high-water marks and commit sequences are
// never deleted. The cluster must compact its revision history
// (--auto-compaction-mode=periodic --auto-compaction-retention=1h) and be
// defragmented now and then; see the README.
package etcd

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/internal/tlsca"
	"github.com/starintel/starlease/lease"
)

// BackendName is the backend recorded in backups.
const BackendName = "etcd"

// schemaVersion is the layout version stored at meta/schema.
const schemaVersion = "1"

// DefaultKeyPrefix is the default key namespace.
const DefaultKeyPrefix = "starlease"

var keyPrefixRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_:.-]{0,63}$`)

// Options configures a Store.
type Options struct {
	// Endpoints are the cluster's client URLs (http://host:port, or
	// https:// with TLS).
	Endpoints []string
	// Username and PasswordFile authenticate to a cluster with auth
	// enabled; the password file's trailing newline is ignored.
	Username     string
	PasswordFile string
	// TLSCAFile, if set, enables TLS with the members' certificates
	// verified against the CA certificates of this PEM file only.
	TLSCAFile string
	// KeyPrefix is the key namespace; empty means "starlease". Letters,
	// digits and "_:.-", at most 64 bytes.
	KeyPrefix string
	// StoreOptions is the behaviour every backend shares.
	StoreOptions lease.StoreOptions
	// DialTimeout bounds connecting; zero means 5 s.
	DialTimeout time.Duration
	// OpTimeout bounds one etcd call when the request's context has no
	// earlier deadline; zero means 5 s.
	OpTimeout time.Duration
	// ReapInterval is how often expired leases are archived and evidence
	// past retention dropped. Zero means 30 s; negative disables.
	ReapInterval time.Duration
	// MaxClockSkew is how far this server's clock may run ahead of the
	// other starlease servers' on the prefix before it refuses lease
	// operations (see clock.go); zero means DefaultMaxClockSkew, negative
	// disables the guard (tests that step fixed clocks; a deployment
	// whose clocks are guarded otherwise).
	MaxClockSkew time.Duration
	// Now is this server's clock; nil means time.Now. Tests skew it.
	Now func() time.Time
	// Client, if set, is used instead of dialing Endpoints and is not
	// closed by Close. Tests only.
	Client *clientv3.Client
}

// Store is the etcd lease store. It is safe for concurrent use.
type Store struct {
	cli       *clientv3.Client
	ownClient bool
	keys      layout
	opts      lease.StoreOptions
	log       *slog.Logger
	now       func() time.Time
	opTimeout time.Duration

	closed atomic.Bool
	stop   chan struct{}
	wg     sync.WaitGroup
	// skewWarned limits the clock-behind warning to one per minute.
	skewWarned atomic.Int64
	clockGuard *clockGuard
}

var _ lease.Store = (*Store)(nil)

// Open connects to the cluster and checks (or writes) the layout version.
// An unreachable cluster or one without quorum is an error.
func Open(ctx context.Context, o Options) (*Store, error) {
	ns := o.KeyPrefix
	if ns == "" {
		ns = DefaultKeyPrefix
	}
	if !keyPrefixRule.MatchString(ns) {
		return nil, lease.Invalid("key_prefix", "letters, digits and _:.- only, at most 64 bytes")
	}
	cli, own := o.Client, false
	if cli == nil {
		var err error
		if cli, err = Dial(o); err != nil {
			return nil, err
		}
		own = true
	}
	s := &Store{cli: cli, ownClient: own, keys: layout{p: ns + "/"}, opts: o.StoreOptions.WithDefaults(),
		now: o.Now, opTimeout: orDefault(o.OpTimeout, 5*time.Second), stop: make(chan struct{}),
		clockGuard: newClockGuard(cmp.Or(o.MaxClockSkew, DefaultMaxClockSkew))}
	// A caller's own logger writes no secret-shaped value (an ALERT names
	// an identity, whose target id may be 64 hex digits).
	s.opts.Logger = audit.ScreenLogger(s.opts.Logger, nil)
	s.log = s.opts.Logger
	if s.now == nil {
		s.now = time.Now
	}
	if err := s.initSchema(ctx); err != nil {
		if own {
			cli.Close()
		}
		return nil, err
	}
	if gate, err := s.gate(ctx); err == nil && gate != "" {
		s.log.Warn("lease namespace is closed; mutations are refused", "reason", gate)
	}
	if err := s.startClockGuard(ctx); err != nil {
		if own {
			cli.Close()
		}
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot publish this server's clock: %s", classify(err))
	}
	lease.Reaper{Interval: o.ReapInterval, Bounded: true, Pass: s.reap, Log: s.log}.Start(&s.wg, s.stop)
	return s, nil
}

// Dial connects a client to the cluster o names; the caller closes it.
// Credentials and CA are read once, here.
func Dial(o Options) (*clientv3.Client, error) {
	if len(o.Endpoints) == 0 {
		return nil, lease.Invalid("endpoints", "at least one etcd endpoint is required")
	}
	for _, e := range o.Endpoints {
		if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
			return nil, lease.Invalid("endpoints", "an endpoint is an http:// or https:// URL")
		}
	}
	cfg := clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: orDefault(o.DialTimeout, 5*time.Second),
		// The client's own logs name endpoints and errors only; they stay
		// out of the service's log (its errors are classified here).
		Logger:               zap.NewNop(),
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		// No RejectOldCluster: its version check needs every endpoint to
		// answer, so one member down would stop a server from starting.
		// A member cut off from the others does not refuse by itself (it
		// holds a linearizable request until the call times out, and the
		// client does not try another): every call requires a leader
		// instead (see bound).
		DialOptions: []grpc.DialOption{},
	}
	var tlsCfg *tls.Config
	if o.TLSCAFile != "" {
		var err error
		if tlsCfg, err = tlsca.FromFile(o.TLSCAFile, ""); err != nil {
			return nil, err
		}
		cfg.TLS = tlsCfg
	}
	if o.Username != "" || o.PasswordFile != "" {
		if o.Username == "" || o.PasswordFile == "" {
			return nil, lease.Invalid("username", "a username and a password file go together")
		}
		pw, err := auth.ReadSecretFile(o.PasswordFile, "the etcd password file", 4096)
		if err != nil {
			return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot read the etcd password file")
		}
		cfg.Username, cfg.Password = o.Username, strings.TrimRight(string(pw), "\r\n")
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot connect to the etcd cluster: %s", classify(err))
	}
	return cli, nil
}

// initSchema writes the layout version into an empty prefix, or checks it.
func (s *Store) initSchema(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	k := s.keys.schema()
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, schemaVersion)).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "cannot reach the etcd cluster: %s", classify(err))
	}
	if r.Succeeded {
		return nil
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 || string(kvs[0].Value) != schemaVersion {
		return lease.Errorf(lease.CodeCorrupt, "the etcd prefix has an unsupported schema version")
	}
	return nil
}

// Close stops the reaper and the client. Later calls fail with
// backend_unavailable.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	if s.ownClient {
		s.cli.Close()
	}
	return nil
}

// Health reports whether the cluster gives linearizable answers now (a
// quorum is reachable) and whether the namespace is open.
func (s *Store) Health(ctx context.Context) lease.Health {
	if s.closed.Load() {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "store is closed"}
	}
	gate, err := s.gate(ctx)
	if err != nil {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "etcd cluster unavailable: " + classify(err)}
	}
	if gate != "" {
		return lease.Health{Status: lease.HealthDegraded, Reason: "namespace is closed: " + gate}
	}
	if err := s.refuseIfAhead(); err != nil {
		return lease.Health{Status: lease.HealthUnsuitable, Reason: lease.AsError(err).Reason}
	}
	return lease.Health{Status: lease.HealthOK}
}

// gate reads the namespace's gate with a linearizable read: "" when open.
func (s *Store) gate(ctx context.Context) (string, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.cli.Get(ctx, s.keys.gate())
	if err != nil {
		return "", err
	}
	if len(r.Kvs) == 0 {
		return "", nil
	}
	return string(r.Kvs[0].Value), nil
}

// bound gives ctx the store's per-call timeout unless it ends sooner, and
// requires a leader: a member that has none (cut off from the others, or
// without quorum) refuses the call at once instead of holding it until the
// timeout (transitions send it again, to another member; see sendAgain).
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = clientv3.WithRequireLeader(ctx)
	if d, ok := ctx.Deadline(); ok && time.Until(d) < s.opTimeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.opTimeout)
}

// begin refuses work that cannot start.
func (s *Store) begin(ctx context.Context) error { return lease.CheckStart(ctx, s.closed.Load()) }

// classify names an etcd client error's class without its text (which can
// hold endpoints).
func classify(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no leader"), strings.Contains(msg, "leader changed"):
		return "no leader"
	case strings.Contains(msg, "authentication"), strings.Contains(msg, "permission denied"), strings.Contains(msg, "invalid auth"):
		return "authentication failed"
	case strings.Contains(msg, "request timed out"):
		return "request timed out"
	case strings.Contains(msg, "Unavailable"), strings.Contains(msg, "connection"):
		return "unreachable"
	case strings.Contains(msg, "too many operations"), strings.Contains(msg, "request is too large"):
		return "request too large"
	case strings.Contains(msg, "database space exceeded"):
		return "quota exceeded (NOSPACE alarm)"
	}
	return "error"
}

// clock is this server's clock in unix ms.
func (s *Store) clock() int64 { return s.now().UnixMilli() }

// identityTime is backend time for an identity whose last recorded time is
// recorded (0 if none): max(server clock, recorded). A clock far behind is
// logged, at most once a minute.
func (s *Store) identityTime(recorded int64) lease.Timestamp {
	now := s.clock()
	if recorded > now {
		if recorded-now > int64(maxSkewWarn/time.Millisecond) {
			if last := s.skewWarned.Load(); now-last > 60_000 && s.skewWarned.CompareAndSwap(last, now) {
				s.log.Warn("this server's clock is behind the time recorded by the cluster; leases last longer as measured here",
					"behind_ms", recorded-now)
			}
		}
		now = recorded
	}
	return lease.UnixMilli(now)
}

// maxSkewWarn is the clock lag past which identityTime warns.
const maxSkewWarn = 2 * time.Second

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// layout names the keys of one prefix.
type layout struct{ p string }

func (l layout) schema() string                   { return l.p + "meta/schema" }
func (l layout) gate() string                     { return l.p + "meta/gate" }
func (l layout) floor() string                    { return l.p + "meta/floor" }
func (l layout) epoch() string                    { return l.p + "meta/epoch" }
func (l layout) restored() string                 { return l.p + "meta/restored" }
func (l layout) outboxSeq() string                { return l.p + "meta/outbox_seq" }
func (l layout) outboxUsage() string              { return l.p + "meta/outbox_usage" }
func (l layout) deadSeq() string                  { return l.p + "meta/dead_seq" }
func (l layout) deadCount() string                { return l.p + "meta/dead_count" }
func (l layout) clockPrefix() string              { return l.p + "meta/clock/" }
func (l layout) active(lk string) string          { return l.p + "a/" + lk }
func (l layout) counter(lk string) string         { return l.p + "c/" + lk }
func (l layout) time(lk string) string            { return l.p + "t/" + lk }
func (l layout) idem(scope string) string         { return l.p + "i/" + scope }
func (l layout) commit(scope string) string       { return l.p + "k/" + scope }
func (l layout) highWater(lk, sink string) string { return l.p + "w/" + lk + "\x00" + sink }
func (l layout) commitSeq(lk string) string       { return l.p + "s/" + lk }
func (l layout) historySeq(lk string) string      { return l.p + "hs/" + lk }
func (l layout) history(lk string, seq uint64) string {
	return l.historyPrefix(lk) + hex16(seq)
}
func (l layout) historyPrefix(lk string) string { return l.p + "h/" + lk + "/" }
func (l layout) leaseID(id string) string       { return l.p + "l/" + id }
func (l layout) index(f lease.ListFilter, leaseID string) string {
	return l.indexPrefix(f) + leaseID
}
func (l layout) indexPrefix(f lease.ListFilter) string {
	return l.p + "x/" + string(f.By) + "\x00" + f.Value + "\x00"
}
func (l layout) quarantine(lk string) string  { return l.p + "q/" + lk }
func (l layout) outbox(seq uint64) string     { return l.p + "o/" + hex16(seq) }
func (l layout) outboxPrefix() string         { return l.p + "o/" }
func (l layout) outboxID(msgID string) string { return l.p + "oi/" + msgID }
func (l layout) dead(seq uint64) string       { return l.p + "od/" + hex16(seq) }
func (l layout) deadPrefix() string           { return l.p + "od/" }

// Expiry indexes: <kind>/<16 hex ms>/<rest>, in time order.
func (l layout) expiry(kind string, ms int64, rest string) string {
	return l.expiryPrefix(kind) + hex16(uint64(max(ms, 0))) + "/" + rest
}
func (l layout) expiryPrefix(kind string) string { return l.p + kind + "/" }

const (
	idemExpiry    = "ie"
	commitExpiry  = "ke"
	historyExpiry = "he"
)

func hex16(v uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	return string(b[:])
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// readU64 reads an 8-byte big-endian value: 0 when absent; ok is false for
// a malformed one.
func readU64(v []byte) (uint64, bool) {
	switch {
	case v == nil:
		return 0, true
	case len(v) != 8:
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}
