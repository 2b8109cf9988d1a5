package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/console"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/httpapi"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
	"github.com/starintel/starlease/valkey"
)

// Files and directories inside --data-dir.
const (
	credentialsDir = "credentials"
	auditFile      = "audit.jsonl"
	// auditSpoolFile holds, with --backend valkey or etcd, the events the
	// backend's audit stream could not take, until they are forwarded.
	auditSpoolFile = "audit-spool.jsonl"
)

// envFlags fills every flag of fs not given on the command line from its
// STARLEASE_* environment variable (--pepper-file ← STARLEASE_PEPPER_FILE).
func envFlags(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := "STARLEASE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && !given[f.Name] && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %v", name, e)
			}
		}
	})
	return err
}

// backendFlags select the backend and how to reach Valkey: shared by serve
// and keys, so both find the same credentials.
type backendFlags struct {
	backend                                    string
	valkeyAddr, valkeyUser, valkeyPasswordFile string
	valkeyPrefix                               string
	valkeyTLSCAFile, valkeyTLSServerName       string
	valkeyUnverified, valkeyCompact            bool
	valkeyCompactRecords                       bool
	valkeyEmbeddedEvidence                     bool
	valkeyReferringEvidence                    bool
	valkeyLeanRecords                          bool
	valkeyLeanEvidence                         bool
	valkeyCheckedEvidence                      bool
	valkeyEagerDetach                          bool
	etcdEndpoints, etcdUser, etcdPasswordFile  string
	etcdTLSCAFile, etcdPrefix                  string
	etcdMaxClockSkew                           time.Duration
}

func (f *backendFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.backend, "backend", "bolt", "backend: bolt (embedded, default), valkey (leases, credentials and audit on a shared Valkey) or etcd (the same on an etcd cluster: fails over without an operator)")
	fs.StringVar(&f.valkeyAddr, "valkey-addr", "127.0.0.1:6379", "valkey backend: server address")
	fs.StringVar(&f.valkeyUser, "valkey-username", "", "valkey backend: ACL user name")
	fs.StringVar(&f.valkeyPasswordFile, "valkey-password-file", "", "valkey backend: file holding the password")
	fs.StringVar(&f.valkeyPrefix, "valkey-key-prefix", valkey.DefaultKeyPrefix, "valkey backend: key namespace")
	fs.StringVar(&f.valkeyTLSCAFile, "valkey-tls-ca-file", "", "valkey backend: TLS, verifying the server against the CA certificates of this PEM file")
	fs.StringVar(&f.valkeyTLSServerName, "valkey-tls-server-name", "", "valkey backend: the name the server's certificate must hold (default: the address's host)")
	fs.BoolVar(&f.valkeyUnverified, "valkey-allow-unverified-durability", false, "valkey backend: accept a server that hides CONFIG (durability verified out of band)")
	fs.BoolVar(&f.valkeyCompact, "valkey-compact-format", false, "valkey backend: switch the namespace, for good, to the compact stored formats of evidence and history (a third of the bytes); only once every instance sharing it runs this build or a later one")
	fs.BoolVar(&f.valkeyCompactRecords, "valkey-compact-records", false, "valkey backend: switch the namespace, for good, to format 3: the compact formats, and active records in their compact version too (about half their bytes); only once every instance sharing it runs this build or a later one")
	fs.BoolVar(&f.valkeyReferringEvidence, "valkey-referring-evidence", false, "valkey backend: switch the namespace, for good, to format 5: format 4, and an ending's evidence of the lease's acquisition and a release's own kept by reference to its history entry (about 400 bytes less per ended lease); only once every instance sharing it runs this build or a later one")
	fs.BoolVar(&f.valkeyEagerDetach, "valkey-eager-detach", false, "valkey backend, in format 5 or later: an ending on an identity that ends its history cap of leases within the idempotency retention writes its evidence and history entry whole at once, instead of by reference and rewritten when the entry is trimmed (the same answers; less work for such an identity); this instance only, every build since format 3 reads it")
	fs.BoolVar(&f.valkeyLeanRecords, "valkey-lean-records", false, "valkey backend: switch the namespace, for good, to format 6: format 5, and an active record without what its own lines say (about 60 bytes less per active lease); only once every instance sharing it runs this build or a later one")
	fs.BoolVar(&f.valkeyLeanEvidence, "valkey-lean-evidence", false, "valkey backend: switch the namespace, for good, to format 7: format 6, and evidence kept by reference without what its history entry says (about 110 bytes less per ended lease); only once every instance sharing it runs this build or a later one")
	fs.BoolVar(&f.valkeyCheckedEvidence, "valkey-checked-evidence", false, "valkey backend: switch the namespace, for good, to format 8: format 7, and evidence written whole, and history entries no evidence refers to, without their hash tag line, the evidence with a check (about 45-50 bytes less per value); only once every instance sharing it runs this build or a later one")
	fs.BoolVar(&f.valkeyEmbeddedEvidence, "valkey-embedded-evidence", false, "valkey backend: switch the namespace, for good, to format 4: format 3, and a new lease's acquisition evidence kept in its active record, written to its own key only when the lease ends (about 600 bytes less per active lease); only once every instance sharing it runs this build or a later one")
	fs.StringVar(&f.etcdEndpoints, "etcd-endpoints", "http://127.0.0.1:2379", "etcd backend: comma-separated client URLs of the cluster's members")
	fs.StringVar(&f.etcdUser, "etcd-username", "", "etcd backend: user name (with --etcd-password-file)")
	fs.StringVar(&f.etcdPasswordFile, "etcd-password-file", "", "etcd backend: file holding the password")
	fs.StringVar(&f.etcdTLSCAFile, "etcd-tls-ca-file", "", "etcd backend: TLS, verifying the members against the CA certificates of this PEM file (use https:// endpoints)")
	fs.StringVar(&f.etcdPrefix, "etcd-key-prefix", etcd.DefaultKeyPrefix, "etcd backend: key namespace")
	fs.DurationVar(&f.etcdMaxClockSkew, "etcd-max-clock-skew", etcd.DefaultMaxClockSkew, "etcd backend: a server whose clock runs ahead of the other servers' by more than this refuses lease operations (unsuitable) until its clock is fixed")
}

// check refuses an unknown backend.
func (f *backendFlags) check() error {
	if f.backend != "bolt" && f.backend != "valkey" && f.backend != "etcd" {
		return errors.New("--backend must be bolt, valkey or etcd")
	}
	return nil
}

// etcdOptions are the connection options of the etcd backend.
func (f *backendFlags) etcdOptions(opts lease.StoreOptions) etcd.Options {
	var eps []string
	for _, e := range strings.Split(f.etcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return etcd.Options{Endpoints: eps, Username: f.etcdUser, PasswordFile: f.etcdPasswordFile,
		TLSCAFile: f.etcdTLSCAFile, KeyPrefix: f.etcdPrefix, StoreOptions: opts, MaxClockSkew: f.etcdMaxClockSkew}
}

// valkeyOptions are the connection options of the valkey backend.
func (f *backendFlags) valkeyOptions(opts lease.StoreOptions) valkey.Options {
	return valkey.Options{Addr: f.valkeyAddr, Username: f.valkeyUser, PasswordFile: f.valkeyPasswordFile,
		KeyPrefix: f.valkeyPrefix, StoreOptions: opts, AllowUnverifiedDurability: f.valkeyUnverified, CompactFormat: f.valkeyCompact,
		CompactRecords: f.valkeyCompactRecords, EmbeddedEvidence: f.valkeyEmbeddedEvidence, ReferringEvidence: f.valkeyReferringEvidence, LeanRecords: f.valkeyLeanRecords, LeanEvidence: f.valkeyLeanEvidence, CheckedEvidence: f.valkeyCheckedEvidence, EagerDetach: f.valkeyEagerDetach, TLSCAFile: f.valkeyTLSCAFile, TLSServerName: f.valkeyTLSServerName}
}

// keysFlags are the backend flags to repeat in a keys command line so it
// reaches the same credentials (empty for bolt).
func (f *backendFlags) keysFlags() string {
	if f.backend == "etcd" {
		s := " --backend etcd --etcd-endpoints " + f.etcdEndpoints
		if f.etcdUser != "" {
			s += " --etcd-username " + f.etcdUser + " --etcd-password-file " + f.etcdPasswordFile
		}
		if f.etcdTLSCAFile != "" {
			s += " --etcd-tls-ca-file " + f.etcdTLSCAFile
		}
		if f.etcdPrefix != etcd.DefaultKeyPrefix {
			s += " --etcd-key-prefix " + f.etcdPrefix
		}
		return s
	}
	if f.backend != "valkey" {
		return ""
	}
	s := " --backend valkey --valkey-addr " + f.valkeyAddr
	if f.valkeyUser != "" {
		s += " --valkey-username " + f.valkeyUser
	}
	if f.valkeyPasswordFile != "" {
		s += " --valkey-password-file " + f.valkeyPasswordFile
	}
	if f.valkeyPrefix != valkey.DefaultKeyPrefix {
		s += " --valkey-key-prefix " + f.valkeyPrefix
	}
	if f.valkeyTLSCAFile != "" {
		s += " --valkey-tls-ca-file " + f.valkeyTLSCAFile
	}
	if f.valkeyTLSServerName != "" {
		s += " --valkey-tls-server-name " + f.valkeyTLSServerName
	}
	if f.valkeyUnverified {
		s += " --valkey-allow-unverified-durability"
	}
	return s
}

type serveFlags struct {
	backendFlags
	relay                                    relayFlags
	dataDir, pepperFile, listen, classes     string
	minTTL, maxTTL, maxLifetime, maxDeadline time.Duration
	maxWait                                  time.Duration
	principalRate, targetRate                float64
	maxConcurrent, maxActive                 int
	outboxMaxPending, outboxMaxBytes         int64
	publishExchanges                         string
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dataDir, "data-dir", "", "data directory: lease store (bolt backend), credentials (bolt backend), audit log (required)")
	fs.StringVar(&f.pepperFile, "pepper-file", "", "file holding the server pepper for API-key verifiers (required; never stored with the data)")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "HOST:PORT to serve HTTP on")
	fs.StringVar(&f.classes, "operation-classes", lease.DefaultComponent, "configured closed set of operation classes, comma-separated")
	f.backendFlags.register(fs)
	f.relay.register(fs)
	d := service.DefaultConfig()
	fs.DurationVar(&f.minTTL, "min-ttl", d.MinTTL, "policy: ttl must be greater than this")
	fs.DurationVar(&f.maxTTL, "max-ttl", d.MaxTTL, "policy: ttl must be at most this")
	fs.DurationVar(&f.maxLifetime, "max-lifetime", d.MaxLifetime, "policy: configured maximum lifetime of a lease")
	fs.DurationVar(&f.maxDeadline, "max-deadline", d.MaxDeadline, "policy: cap on every request deadline")
	fs.DurationVar(&f.maxWait, "max-wait", d.MaxWait, "policy: cap on an acquire's bounded retry")
	fs.Float64Var(&f.principalRate, "principal-rate", d.PrincipalRate, "policy: acquire+renew per second per principal")
	fs.Float64Var(&f.targetRate, "target-rate", d.TargetRate, "policy: acquires per second per target (shared by all principals), and renewals per second per target and principal")
	fs.IntVar(&f.maxConcurrent, "max-concurrent", d.MaxConcurrent, "policy: concurrent backend operations")
	fs.IntVar(&f.maxActive, "max-active-per-principal", 100, "policy: active lease quota per principal")
	fs.Int64Var(&f.outboxMaxPending, "outbox-max-pending", lease.DefaultOutboxMaxPending, "outbox: bound on pending publications; past it a publication is refused (503 lease_backend_unavailable, retryable)")
	fs.Int64Var(&f.outboxMaxBytes, "outbox-max-bytes", lease.DefaultOutboxMaxBytes, "outbox: bound on the bytes (bodies and headers) of pending publications; at least 81920, the largest publication")
	fs.StringVar(&f.publishExchanges, "publish-exchanges", "", "outbox: comma-separated exchanges a publication may name, (default) for the default exchange; another is refused (403 access_denied). Empty: any exchange")
}

// defaultExchange is how --publish-exchanges names RabbitMQ's default
// exchange (the empty name): no exchange can be called this, since an
// exchange name is an identifier without parentheses.
const defaultExchange = "(default)"

// parsePublishExchanges reads --publish-exchanges: nil (every exchange)
// when empty.
func parsePublishExchanges(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := []string{}
	for _, x := range strings.Split(s, ",") {
		x = strings.TrimSpace(x)
		switch x {
		case "":
			return nil, errors.New("--publish-exchanges: an empty name; write the default exchange as " + defaultExchange)
		case defaultExchange:
			x = ""
		default:
			if err := lease.CheckExchange(x); err != nil {
				return nil, fmt.Errorf("--publish-exchanges: %q: %s", x, lease.AsError(err).Reason)
			}
		}
		out = append(out, x)
	}
	return out, nil
}

func parseClasses(s string) (lease.OperationClasses, error) {
	var values []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			values = append(values, v)
		}
	}
	return lease.NewOperationClasses(values...)
}

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("starlease serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: starlease serve --data-dir DIR --pepper-file FILE [--listen HOST:PORT] [--backend bolt|valkey|etcd ...]\n\n"+
			"Serves the lease HTTP API. Every flag can also be set as STARLEASE_<FLAG> (e.g. STARLEASE_PEPPER_FILE).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if err := envFlags(fs); err != nil {
		fmt.Fprintf(stderr, "starlease serve: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, f, stdout, log); err != nil {
		fmt.Fprintf(stderr, "starlease serve: %v\n", err)
		return exitOther
	}
	return exitOK
}

// serveGCPercent is serve's garbage-collection target unless GOGC is set.
// Its live heap is a few MB while every request allocates tens of KB (bbolt
// copies each page a commit dirties), so Go's default of 100 collects dozens
// of times a second, and the collector's assists fall on whichever goroutine
// allocates, the one committing a batch for everyone too. At 400 the heap
// peaks at about five times the live heap instead of two: a few tens of MB.
const serveGCPercent = 400

// tuneGC sets serve's GC target unless the environment sets GOGC (which the
// runtime has already applied, or ignored if malformed), and returns the
// target in effect (-1: off) and where it comes from.
func tuneGC(lookupEnv func(string) (string, bool)) (percent int, from string) {
	if _, ok := lookupEnv("GOGC"); ok {
		percent = debug.SetGCPercent(100) // read back what is in effect
		debug.SetGCPercent(percent)
		return percent, "GOGC"
	}
	debug.SetGCPercent(serveGCPercent)
	return serveGCPercent, "default"
}

// serveSpareProcs bounds the Ps serve runs beyond the CPUs the runtime
// found, unless GOMAXPROCS is set: as many again, at most this many. A
// request waits for the store's group commit, run by one goroutine that
// blocks in fsync; when the syscall returns and every P is running HTTP
// goroutines, it waits in the global run queue behind them, and every
// caller in its batch with it. With a spare P it resumes at once, and the
// kernel shares the cores. Measured at 64 clients on 2 CPUs: 4 Ps did
// 13-19% more pairs than 2, 8 no more than 4. A few spare Ps suffice on a
// large machine, where the collector's workers (a quarter of the Ps) would
// otherwise grow with them.
const serveSpareProcs = 4

// tuneProcs sets serve's GOMAXPROCS unless the environment sets it, and
// returns the number in effect and where it comes from. Set once at start:
// the runtime then no longer follows a changed CPU limit of its cgroup.
func tuneProcs(lookupEnv func(string) (string, bool)) (procs int, from string) {
	if _, ok := lookupEnv("GOMAXPROCS"); ok {
		return runtime.GOMAXPROCS(0), "GOMAXPROCS"
	}
	cpus := runtime.GOMAXPROCS(0)
	procs = cpus + min(cpus, serveSpareProcs)
	runtime.GOMAXPROCS(procs)
	return procs, "default"
}

// backend is what serve runs on: the lease store, the credential store and
// the backend's own audit sink (Valkey, etcd), or its local audit store
// (bolt), which indexes the audit file.
type backend struct {
	store lease.Store
	creds auth.Store
	sink  audit.Sink
	index audit.Index
}

func (b backend) close() {
	b.closeAudit()
	if b.creds != nil {
		b.creds.Close()
	}
	if b.store != nil {
		b.store.Close()
	}
}

func (b backend) closeAudit() {
	if b.sink != nil {
		b.sink.Close()
	}
	if b.index != nil {
		b.index.Close()
	}
}

// openBackend opens the backend f names. bolt: leases and audit in bbolt
// files in dataDir, credentials as files in dataDir/credentials (shared
// with the keys command). valkey: leases, credentials and audit on one
// Valkey server, so several servers in front of it share API keys and
// audit (valkey.Store.CredentialStore and AuditSink, on its connections),
// with a local spool in dataDir for the audit events Valkey cannot take.
// etcd: the same on an etcd cluster (etcd.Store.CredentialStore and
// AuditSink, on its client), spool included.
func openBackend(ctx context.Context, f backendFlags, dataDir string, opts lease.StoreOptions) (backend, error) {
	var b backend
	switch f.backend {
	case "bolt":
		bs, err := bolt.Open(filepath.Join(dataDir, storeFile), bolt.Options{StoreOptions: opts})
		if err != nil {
			return backend{}, err
		}
		b.store = bs
		fs, err := auth.OpenFileStore(filepath.Join(dataDir, credentialsDir))
		if err != nil {
			b.close()
			return backend{}, err
		}
		b.creds = fs
		as, err := bolt.OpenAudit(filepath.Join(dataDir, bolt.AuditFileName), bolt.AuditOptions{})
		if err != nil {
			b.close()
			return backend{}, err
		}
		b.index = as
	case "valkey":
		vs, err := valkey.Open(ctx, f.valkeyOptions(opts))
		if err != nil {
			return backend{}, err
		}
		b.store, b.creds = vs, vs.CredentialStore()
		// Events the stream cannot take (Valkey down: every
		// lease_backend_unavailable answer) wait in a local spool and are
		// forwarded, once each and in order, when it answers again.
		sp, err := audit.OpenSpool(filepath.Join(dataDir, auditSpoolFile), vs.AuditSink(valkey.AuditOptions{}), audit.SpoolOptions{})
		if err != nil {
			b.close()
			return backend{}, err
		}
		b.sink = sp
	case "etcd":
		es, err := etcd.Open(ctx, f.etcdOptions(opts))
		if err != nil {
			return backend{}, err
		}
		b.store, b.creds = es, es.CredentialStore()
		// The stream is unavailable without quorum: events wait in the
		// spool as with Valkey, and are forwarded once each when the
		// cluster has a leader again.
		sp, err := audit.OpenSpool(filepath.Join(dataDir, auditSpoolFile), es.AuditSink(etcd.AuditOptions{}), audit.SpoolOptions{})
		if err != nil {
			b.close()
			return backend{}, err
		}
		b.sink = sp
	default:
		return backend{}, errors.New("--backend must be bolt, valkey or etcd")
	}
	return b, nil
}

func serve(ctx context.Context, f serveFlags, stdout io.Writer, log *slog.Logger) error {
	if f.dataDir == "" || f.pepperFile == "" {
		return errors.New("--data-dir and --pepper-file are required (the server refuses to start without a pepper)")
	}
	pepper, err := auth.LoadPepper(f.pepperFile)
	if err != nil {
		return err
	}
	// Values that may be secrets are audited as a keyed hash under a key
	// derived from the pepper: servers sharing a pepper agree on it. The
	// log writes them in the same form, from here on.
	redactionKey, err := pepper.DeriveKey(audit.RedactionKeyPurpose)
	if err != nil {
		return err
	}
	redactor, err := audit.NewRedactor(redactionKey)
	if err != nil {
		return err
	}
	log = slog.New(audit.NewLogHandler(log.Handler(), redactor))
	if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
		return errors.New("cannot create the data directory")
	}
	classes, err := parseClasses(f.classes)
	if err != nil {
		return err
	}
	if f.outboxMaxPending < 1 || f.outboxMaxBytes < lease.MaxOutboxMessageBytes {
		return fmt.Errorf("--outbox-max-pending must be at least 1 and --outbox-max-bytes at least %d (the largest publication)", lease.MaxOutboxMessageBytes)
	}
	exchanges, err := parsePublishExchanges(f.publishExchanges)
	if err != nil {
		return err
	}
	opts := lease.StoreOptions{OperationClasses: classes, Logger: log,
		OutboxMaxPending: f.outboxMaxPending, OutboxMaxBytes: f.outboxMaxBytes}
	b, err := openBackend(ctx, f.backendFlags, f.dataDir, opts)
	if err != nil {
		return err
	}
	defer b.store.Close() // deferred first: the sinks and credentials close before it
	defer b.creds.Close()
	// After the open: a store migration's peak is the old file's size over
	// again, not worth five times its live heap.
	gcPercent, gcFrom := tuneGC(os.LookupEnv)
	procs, procsFrom := tuneProcs(os.LookupEnv)
	log.Info("runtime", "gc_percent", gcPercent, "gc_from", gcFrom, "gomaxprocs", procs, "gomaxprocs_from", procsFrom)
	fileSink, err := audit.OpenFile(filepath.Join(f.dataDir, auditFile))
	if err != nil {
		b.closeAudit()
		return err
	}
	if n := fileSink.TornBytes(); n > 0 {
		log.Warn("audit: the audit file ended in a torn line (a crash during a write); it was moved aside",
			"bytes", n, "quarantine", auditFile+".torn")
	}
	// Every audit event goes to the local JSON-lines file and, with Valkey
	// or etcd, to the backend's shared sink at the same time, behind one
	// limiter. With bolt the file is where an event is durable, and the
	// bolt audit store indexes it just after (audit.Indexed): a request
	// waits for one fsync, not also for a commit of the store after it.
	var both audit.Sink
	if b.index != nil {
		indexed, bad, err := audit.OpenIndexed(ctx, fileSink, b.index, audit.IndexedOptions{OnBehind: func(lines int) {
			log.Warn("audit: audit.db will lack events that audit.jsonl (or a rotated copy of it) holds: they were not read back", "lines", lines)
		}})
		if err != nil {
			fileSink.Close()
			b.closeAudit()
			return err
		}
		b.index = nil // closed by indexed
		if bad > 0 {
			log.Warn("audit: lines at the end of the audit file do not decode; the audit store does not hold them", "lines", bad)
		}
		both = indexed
	} else {
		both = audit.Multi(fileSink, b.sink)
	}
	sink := audit.NewLimiter(both, audit.LimiterOptions{})
	defer sink.Close()
	creds := b.creds
	authn, err := auth.NewAuthenticator(creds, pepper, nil)
	if err != nil {
		return err
	}
	// Page tokens are sealed under a key every server sharing the pepper
	// derives alike, so any of them continues another's pages.
	tokenKey, err := pepper.DeriveKey("page-token/v1")
	if err != nil {
		return err
	}
	svc, err := service.New(b.store, sink, service.Options{OperationClasses: classes, Logger: log, PageTokenKey: tokenKey,
		Redactor: redactor, Config: service.Config{
			MinTTL: f.minTTL, MaxTTL: f.maxTTL, MaxLifetime: f.maxLifetime, MaxDeadline: f.maxDeadline,
			MaxWait: f.maxWait, PrincipalRate: f.principalRate, TargetRate: f.targetRate,
			PrincipalBurst: max(int(2*f.principalRate), 1), TargetBurst: max(int(2*f.targetRate), 1),
			MaxConcurrent: f.maxConcurrent, MaxActivePerPrincipal: f.maxActive, PublishExchanges: exchanges,
		}})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	// The outbox relay (--rabbitmq-url-file): stopped, with its batch
	// settled and its lease released, before the store closes.
	comps, stopRelay, err := startRelay(ctx, f.relay, f.backendFlags, b.store, reg, log)
	if err != nil {
		return err
	}
	defer stopRelay()
	if f.relay.urlFile != "" && exchanges == nil {
		log.Warn("--publish-exchanges is not set: a caller's publication may name any exchange the relay's broker user can reach")
	}
	handler := httpapi.New(svc, authn, sink, httpapi.Options{Registry: reg, Logger: log, Components: comps})
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", f.listen, err)
	}
	// The operator console (/console/) is static files in front of the
	// API; its page calls the API like any client.
	srv := &http.Server{Handler: console.Mount(handler), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: httpapi.HTTPServerMaxHeaderBytes,
		// "OPTIONS *" would get net/http's bare 200; the API answers it
		// (an unknown route) with the envelope.
		DisableGeneralOptionsHandler: true,
		// net/http's own errors (a handler's panic with its value) go
		// through the same screen as every other log line.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}
	fmt.Fprintf(stdout, "starlease serving on http://%s (backend %s, data %s)\n", ln.Addr(), f.backend, f.dataDir)
	fmt.Fprintf(stdout, "operator console: http://%s%s\n", ln.Addr(), console.Path)
	if list, err := creds.List(ctx, "", 1); err == nil && len(list) == 0 {
		fmt.Fprintf(stdout, "no API keys yet; create the first administrator key with:\n"+
			"  %s keys create --data-dir %s --pepper-file %s%s --principal admin --class administrator \\\n"+
			"    --capabilities targets:lease,targets:read,targets:force-release,audit:read,credentials:manage \\\n"+
			"    --scope 'tenant:*,program:*'\n", os.Args[0], f.dataDir, f.pepperFile, f.keysFlags())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Graceful shutdown: stop accepting, let in-flight requests finish.
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log.Info("shutting down")
	return srv.Shutdown(shutdown)
}
