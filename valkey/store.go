package valkey

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/tlsca"
	"github.com/starintel/starlease/lease"
)

// Options configures a Store.
type Options struct {
	// Addr is the server's host:port.
	Addr string
	// Username is the ACL user; empty means the default user.
	Username string
	// PasswordFile holds the password (a trailing newline is ignored). It
	// is read on every new connection, so it can be rotated in place.
	PasswordFile string
	// TLS, if set, enables TLS. Certificate verification is mandatory:
	// InsecureSkipVerify is refused.
	TLS *tls.Config
	// TLSCAFile, if set (and TLS is not), enables TLS with the server's
	// certificate verified against the CA certificates of this PEM file
	// only; TLSServerName overrides the name checked (default: Addr's host).
	TLSCAFile     string
	TLSServerName string
	// KeyPrefix is the key namespace; empty means "starlease". Letters,
	// digits and "_:.-", at most 64 bytes.
	KeyPrefix string
	// StoreOptions is the behaviour every backend shares.
	StoreOptions lease.StoreOptions
	// AllowUnverifiedDurability accepts a server whose appendonly,
	// appendfsync and maxmemory-policy cannot be read (managed services
	// that hide CONFIG). Set it only when the service guarantees that an
	// acknowledged write survives a crash and is never evicted; it does not
	// accept a server that reports a weaker setting.
	AllowUnverifiedDurability bool
	// CompactFormat switches the namespace, for good, to the compact stored
	// formats when the store opens (format.go).
	CompactFormat bool
	// CompactRecords switches it, for good, to format 3 when the store
	// opens: CompactFormat's, and active records in version 2 as well.
	CompactRecords bool
	// EmbeddedEvidence switches it, for good, to format 4 when the store
	// opens: CompactRecords', and a new lease's acquisition evidence kept
	// in its active record until the lease ends (format.go).
	EmbeddedEvidence bool
	// ReferringEvidence switches it, for good, to format 5 when the store
	// opens: EmbeddedEvidence's, and an ending's evidence of the lease's
	// acquisition and a release's own kept by reference to the lease's
	// history entry (format.go).
	ReferringEvidence bool
	// LeanRecords switches it, for good, to format 6 when the store opens:
	// ReferringEvidence's, and a record carrying its acquisition's evidence
	// stored in version 4, without what its own lines say (format.go).
	LeanRecords bool
	// LeanEvidence switches it, for good, to format 7 when the store opens:
	// LeanRecords', and evidence by reference stored in version 5, without
	// what the history entry it refers to derives (format.go).
	LeanEvidence bool
	// CheckedEvidence switches it, for good, to format 8 when the store
	// opens: LeanEvidence's, and evidence written whole stored in version
	// 6, without its hash tag line and with a check (format.go).
	CheckedEvidence bool
	// EagerDetach, in format 5 or later, has an ending on an identity that
	// ends its HistoryPerIdentity leases within the idempotency retention
	// (so that its push trims an entry whose evidence may still be live)
	// write its evidence and history entry in version 2, as the trim of an
	// entry written by reference would rewrite them later (format.go).
	// The answers are the same; such an identity pays less per ending, and
	// every ending in format 5 or later one more read (the entry at the cap).
	// Every build since format 3 reads what it writes, so instances may
	// differ in it.
	EagerDetach bool
	// DialTimeout bounds connecting; zero means 5 s.
	DialTimeout time.Duration
	// ReplyGrace is how long past a request's deadline the adapter waits
	// for the reply of a submitted function before reporting
	// outcome_unknown (mutations) or backend_unavailable (reads). Zero
	// means 2 s.
	ReplyGrace time.Duration
	// ReclaimGrace is how long an active record is kept physically past
	// its expires_at, so the reaper, not the key's TTL, normally ends it,
	// records its expiry in history and removes its List index entries.
	// Zero means 24 h.
	ReclaimGrace time.Duration
	// ReapInterval is how often expired leases are archived. Zero means
	// 30 s; negative disables the reaper.
	ReapInterval time.Duration
	// BackupPause bounds a backup's pause of mutations (Backup); zero
	// means DefaultBackupPause.
	BackupPause time.Duration
}

// DefaultKeyPrefix is the default key namespace.
const DefaultKeyPrefix = "starlease"

var keyPrefixRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_:.-]{0,63}$`)

// Store is the Valkey lease store. It is safe for concurrent use.
type Store struct {
	client       vk.Client
	opts         lease.StoreOptions
	log          *slog.Logger
	keys         layout
	lib          *library
	allowUnknown bool
	replyGrace   time.Duration
	reclaimGrace time.Duration
	backupPause  time.Duration

	durable   atomic.Bool
	checkedAt atomic.Int64 // unix ms of the last durability check
	closed    atomic.Bool
	stop      chan struct{}
	wg        sync.WaitGroup

	// leaseIDs, if set (tests only), replaces lease.NewLeaseID.
	leaseIDs func(lease.Timestamp) string
	// backupHook, if set (tests only), runs once a backup has closed the
	// gate, before it reads.
	backupHook func()
	records    *lease.RecordMemo
	// format is the level of the namespace's stored format as this store
	// last read its switch (formatLevels; 0: version 1): what it writes
	// (writes).
	format atomic.Int32
	// wantFormat is the format the options ask for, raised to at Open and
	// at each reaper pass (raiseWanted).
	wantFormat string
	// eagerDetach is Options.EagerDetach.
	eagerDetach bool
}

var _ lease.Store = (*Store)(nil)

// dialError marks a failure to connect: nothing was sent, so the command
// cannot have run.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// Open connects, loads the function library and checks durability and
// topology. An unsuitable server still yields a Store, whose Health says
// why and which refuses mutations; an unreachable one is an error.
func Open(ctx context.Context, o Options) (*Store, error) {
	if o.Addr == "" {
		return nil, lease.Invalid("addr", "a server address is required")
	}
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return nil, lease.Invalid("addr", "must be host:port")
	}
	ns := o.KeyPrefix
	if ns == "" {
		ns = DefaultKeyPrefix
	}
	if !keyPrefixRule.MatchString(ns) {
		return nil, lease.Invalid("key_prefix", "letters, digits and _:.- only, at most 64 bytes")
	}
	if o.TLS != nil && o.TLS.InsecureSkipVerify {
		return nil, lease.Invalid("tls", "certificate verification cannot be disabled")
	}
	if o.TLS == nil && o.TLSCAFile != "" {
		cfg, err := tlsca.FromFile(o.TLSCAFile, o.TLSServerName)
		if err != nil {
			return nil, err
		}
		o.TLS = cfg
	}
	if o.PasswordFile != "" {
		if _, err := readPassword(o.PasswordFile); err != nil {
			return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot read the password file")
		}
	}
	s := &Store{
		opts: o.StoreOptions.WithDefaults(), keys: layout{ns: ns}, lib: newLibrary("", librarySource),
		records:      lease.NewRecordMemo(lease.DecodeAnyStoredRecord),
		allowUnknown: o.AllowUnverifiedDurability,
		replyGrace:   orDefault(o.ReplyGrace, 2*time.Second),
		reclaimGrace: orDefault(o.ReclaimGrace, 24*time.Hour),
		backupPause:  orDefault(o.BackupPause, DefaultBackupPause),
		stop:         make(chan struct{}),
	}
	// A caller's own logger writes no secret-shaped value (an ALERT names
	// an identity, whose target id may be 64 hex digits).
	s.opts.Logger = audit.ScreenLogger(s.opts.Logger, nil)
	s.log = s.opts.Logger

	dialer := net.Dialer{Timeout: orDefault(o.DialTimeout, 5*time.Second), KeepAlive: time.Second}
	copt := vk.ClientOption{
		InitAddress: []string{o.Addr},
		Username:    o.Username,
		TLSConfig:   o.TLS,
		Dialer:      dialer,
		// One server, never a cluster probe; no client-side cache; no
		// automatic retries: a retried mutation would be answered from its
		// own idempotency evidence and look like a replay.
		ForceSingleClient: true,
		DisableCache:      true,
		DisableRetry:      true,
		ClientSetInfo:     vk.DisableClientSetInfo,
		DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
			var c net.Conn
			var err error
			if cfg != nil {
				c, err = (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", addr)
			} else {
				c, err = d.DialContext(ctx, "tcp", addr)
			}
			if err != nil {
				return nil, &dialError{err}
			}
			return c, nil
		},
	}
	if o.PasswordFile != "" {
		file, user := o.PasswordFile, o.Username
		copt.AuthCredentialsFn = func(vk.AuthCredentialsContext) (vk.AuthCredentials, error) {
			pw, err := readPassword(file)
			if err != nil {
				return vk.AuthCredentials{}, &dialError{errors.New("password file unreadable")}
			}
			return vk.AuthCredentials{Username: user, Password: pw}, nil
		}
	}
	client, err := vk.NewClient(copt)
	if err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot connect to the backend: %s", classify(err))
	}
	s.client = client
	if err := s.ensureLibrary(ctx); err != nil {
		client.Close()
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot load the function library: %s", classify(err))
	}
	s.loadFormat(ctx)
	s.eagerDetach = o.EagerDetach
	switch {
	case o.CheckedEvidence:
		s.wantFormat = checkedEvidence
	case o.LeanEvidence:
		s.wantFormat = leanEvidence
	case o.LeanRecords:
		s.wantFormat = leanRecords
	case o.ReferringEvidence:
		s.wantFormat = referringEvidence
	case o.EmbeddedEvidence:
		s.wantFormat = embeddedEvidence
	case o.CompactRecords:
		s.wantFormat = compactRecords
	case o.CompactFormat:
		s.wantFormat = compactFormat
	}
	if err := s.raiseWanted(ctx); errors.Is(err, errFormatClosed) {
		s.log.Warn("the namespace is closed: its stored format is switched once it reopens")
	} else if err != nil {
		client.Close()
		return nil, err
	}
	if h := s.checkDurability(ctx); h.Status != lease.HealthOK {
		s.log.Error("ALERT lease backend unsuitable; mutations are refused", "reason", h.Reason)
	} else if err := s.recountOutboxBytes(ctx); err != nil {
		// Not fatal: the counter then starts from the next publication and
		// is below the truth until the outbox drains.
		s.log.Warn("cannot count the pending outbox's bytes", "reason", lease.AsError(err).Reason)
	}
	lease.Reaper{Interval: o.ReapInterval, Bounded: true, Pass: s.reap, Log: s.log}.Start(&s.wg, s.stop)
	return s, nil
}

// ensureLibrary loads the function library unless it is already there
// (then the ACL needs no FUNCTION LOAD: an operator may preload it).
func (s *Store) ensureLibrary(ctx context.Context) error {
	err := s.client.Do(ctx, s.build(call{fn: "clock", ro: true})).Error()
	if functionMissing(err) {
		return s.lib.load(ctx, s.client)
	}
	return err
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// Close stops the reaper and the client. Later calls fail with
// backend_unavailable.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	s.client.Close()
	return nil
}

// Health reports whether the backend can give safe answers now: reachable,
// the library callable, durable (appendonly yes, appendfsync always,
// maxmemory-policy noeviction) and a single-node primary.
func (s *Store) Health(ctx context.Context) lease.Health {
	if s.closed.Load() {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "store is closed"}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.backendTime(ctx); err != nil {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "backend unreachable: " + lease.AsError(err).Reason}
	}
	h := s.checkDurability(ctx)
	if g := s.gateValue(ctx); g != "" && h.Status == lease.HealthOK {
		// Reads are answered; every mutation is refused until it reopens.
		return lease.Health{Status: lease.HealthDegraded, Reason: "namespace is closed: " + gateReason(g)}
	}
	return h
}

// checkDurability reads the server's persistence and topology settings
// and records whether mutations are allowed.
func (s *Store) checkDurability(ctx context.Context) lease.Health {
	h := s.durability(ctx)
	s.durable.Store(h.Status == lease.HealthOK)
	s.checkedAt.Store(time.Now().UnixMilli())
	return h
}

func (s *Store) durability(ctx context.Context) lease.Health {
	unsuitable := func(reason string) lease.Health {
		return lease.Health{Status: lease.HealthUnsuitable, Reason: reason}
	}
	info, err := s.client.Do(ctx, s.client.B().Info().Section("server").Section("replication").Build()).ToString()
	switch {
	case err == nil:
		if v := infoField(info, "redis_mode"); v != "" && v != "standalone" {
			return unsuitable("server runs in " + v + " mode; the adapter requires a single-node primary")
		}
		if v := infoField(info, "role"); v != "" && v != "master" {
			return unsuitable("server is a replica; the adapter requires the primary")
		}
	case !s.allowUnknown:
		return unsuitable("cannot read the server's topology (INFO: " + classify(err) + ")")
	}
	// noeviction: under memory pressure any other policy deletes keys
	// (active records, lookups, evidence; with an allkeys policy the
	// fencing counters too), and a lease or an accepted commit is lost
	// with no error.
	for _, c := range []struct{ name, want string }{{"appendonly", "yes"}, {"appendfsync", "always"}, {"maxmemory-policy", "noeviction"}} {
		m, err := s.client.Do(ctx, s.client.B().ConfigGet().Parameter(c.name).Build()).AsStrMap()
		if err != nil {
			if s.allowUnknown {
				continue
			}
			return unsuitable("cannot verify durability (CONFIG GET " + c.name + ": " + classify(err) + ")")
		}
		if got, ok := m[c.name]; !ok && s.allowUnknown {
			continue
		} else if got != c.want {
			return unsuitable(c.name + " is " + quoteSetting(got) + ", must be " + c.want)
		}
	}
	return lease.Health{Status: lease.HealthOK}
}

func quoteSetting(v string) string {
	if v == "" {
		return "unset"
	}
	return `"` + v + `"`
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// writable refuses mutations on a backend not verified durable. A failed
// verdict is re-checked at most every 5 s, so fixing the server's
// configuration takes effect without a restart.
func (s *Store) writable(ctx context.Context) error {
	if s.durable.Load() {
		return nil
	}
	if time.Now().UnixMilli()-s.checkedAt.Load() > 5000 && !s.closed.Load() {
		if s.checkDurability(ctx).Status == lease.HealthOK {
			return nil
		}
	}
	return lease.Errorf(lease.CodeBackendUnavailable, "backend durability is not verified: appendonly yes, appendfsync always and maxmemory-policy noeviction are required")
}

// classify names an error's class without its text, which may carry
// addresses or server detail.
func classify(err error) string {
	var de *dialError
	var ne net.Error
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &de):
		var te *tls.CertificateVerificationError
		if errors.As(err, &te) {
			return "tls certificate not verified"
		}
		if errors.As(err, &ne) && ne.Timeout() {
			return "connect timeout"
		}
		return "unreachable"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "deadline"
	case errors.Is(err, vk.ErrClosing):
		return "connection closed"
	}
	if ve, ok := vk.IsValkeyErr(err); ok {
		word, _, _ := strings.Cut(ve.Error(), " ")
		switch word {
		case "NOAUTH", "WRONGPASS":
			return "server refused: authentication failed"
		case "NOPERM":
			return "server refused: permission denied"
		case "READONLY", "OOM", "LOADING", "BUSY", "MASTERDOWN",
			"MISCONF", "NOREPLICAS", "CROSSSLOT", "MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT":
			return "server refused: " + word
		}
		return "server error"
	}
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return "connection error"
}
