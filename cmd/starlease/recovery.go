package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/recovery"
	"github.com/starintel/starlease/valkey"
)

const recoveryUsage = `usage:
  starlease backup         --data-dir DIR --out FILE
  starlease backup         --backend valkey [--valkey-...] --out FILE [--pause D]
  starlease backup         --backend etcd [--etcd-...] --out FILE
  starlease restore        --in FILE --data-dir NEWDIR
  starlease restore        --backend valkey|etcd [--valkey-...|--etcd-...] --in FILE
  starlease seal           --backend valkey|etcd [--valkey-...|--etcd-...]
  starlease verify-restore (--data-dir DIR | --backend valkey|etcd [--valkey-...|--etcd-...])
                           [--couchdb-url URL --couchdb-db NAME[,NAME...]
                            [--couchdb-username U --couchdb-password-file F]]
                           [--rabbitmq-url-file F --rabbitmq-queue Q[,Q...]]
                           [--consumer-marks FILE[,FILE...]]
                           [--proof-complete] [--epoch-gap N]

backup writes one consistent snapshot to FILE (created, never overwritten)
and prints its manifest. bolt: one read transaction of the store in DIR,
with the credentials of DIR/credentials (verifiers only); bbolt admits one
process per store file, so run it with "starlease serve" on DIR stopped.
valkey: the whole namespace, credentials included, while lease mutations
are paused (refused, retryably) for at most --pause. etcd: the whole key
prefix, credentials included, at one revision of the cluster; lease
operations go on meanwhile (the revision must not be compacted before the
backup ends).

restore verifies FILE and restores it into an empty target: NEWDIR, which
must not hold a store, or the Valkey namespace or etcd key prefix, which
must hold no key. The namespace stays closed (every mutation refused with
lease_backend_unavailable) until verify-restore succeeds.

seal closes a Valkey namespace after a replica's promotion (failover), or
an etcd key prefix that came back behind what was issued (a cluster
restored from an etcd snapshot): mutations are refused until
verify-restore has raised its counters.

verify-restore reads the downstream high-water marks: every fenced CouchDB
database named (each document's starintel_fence), every RabbitMQ queue
named (messages are read and put back; the URL, with its password, is read
from a file), and consumer marks files (rabbitmq.WriteMarksFile). Only with
--proof-complete (the operator asserts the sources named are every
authoritative downstream store) and no shortfall are the counters kept;
otherwise the epoch path raises every counter, and the namespace's counter
floor, to the maximum known token + --epoch-gap. Either way active leases
are ended and holders must acquire again. The report is printed as JSON.
Every step is a durable audit event (the bolt audit file in the data
directory, or the Valkey namespace's or etcd key prefix's audit stream)
and a log record on stderr. Flags can also be set as STARLEASE_<FLAG>.
`

// recoveryFlagSet is the flag set of one recovery command.
func recoveryFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	return usageFlagSet("starlease "+name, recoveryUsage, stderr)
}

// usageFlagSet is a command's flag set, whose errors and -h print usage to
// stderr.
func usageFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	return fs
}

// parseRecovery parses args and the environment; ok is false with the exit
// status to return.
func parseRecovery(fs *flag.FlagSet, args []string, stderr io.Writer, required ...*string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if err := envFlags(fs); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return exitUsage, false
	}
	for _, r := range required {
		if strings.TrimSpace(*r) == "" {
			fs.Usage()
			return exitUsage, false
		}
	}
	return 0, true
}

func auditLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// recoveryBackend is what a recovery command needs of the backend: for
// bolt the data directory, for valkey and etcd the connection flags.
type recoveryBackend struct {
	backendFlags
	dataDir string
	pause   time.Duration
}

func (b *recoveryBackend) register(fs *flag.FlagSet, dataDirUsage string) {
	b.backendFlags.register(fs)
	fs.StringVar(&b.dataDir, "data-dir", "", dataDirUsage)
}

// check refuses an unknown backend, and bolt without a data directory.
func (b *recoveryBackend) check() error {
	if err := b.backendFlags.check(); err != nil {
		return lease.Invalid("backend", err.Error())
	}
	if b.backend == "bolt" && strings.TrimSpace(b.dataDir) == "" {
		return lease.Invalid("data_dir", "--data-dir is required with --backend bolt")
	}
	return nil
}

// site maps --backend, once, to the namespace the recovery commands act
// on, and to the flags that name it on a later command line. bolt keeps
// its credentials and audit file in the data directory, beside the store;
// a Valkey namespace or an etcd key prefix holds both itself.
func (b *recoveryBackend) site(log *slog.Logger) (*recovery.Site, string) {
	switch b.backend {
	case "valkey":
		o := b.valkeyOptions(lease.StoreOptions{Logger: log})
		o.BackupPause = b.pause
		return &recovery.Site{Backend: valkey.NewNamespace(o), Field: "valkey_key_prefix", Logger: log}, b.keysFlags()
	case "etcd":
		return &recovery.Site{Backend: etcd.NewNamespace(b.etcdOptions(lease.StoreOptions{Logger: log})),
			Field: "etcd_key_prefix", Logger: log}, b.keysFlags()
	}
	return &recovery.Site{
		Backend:     bolt.NewNamespace(filepath.Join(b.dataDir, storeFile), bolt.Options{StoreOptions: lease.StoreOptions{Logger: log}}),
		Field:       "data_dir",
		Dir:         b.dataDir,
		Credentials: filepath.Join(b.dataDir, credentialsDir),
		AuditFile:   filepath.Join(b.dataDir, bolt.AuditFileName),
		Logger:      log,
	}, " --data-dir " + b.dataDir
}

func runBackup(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("backup", stderr)
	var rb recoveryBackend
	rb.register(fs, "bolt: data directory holding the store file (required)")
	out := fs.String("out", "", "backup file to create (required; never overwritten)")
	fs.DurationVar(&rb.pause, "pause", valkey.DefaultBackupPause, "valkey: longest pause of mutations the backup may take")
	timeout := fs.Duration("timeout", 5*time.Minute, "deadline of the backup")
	if code, ok := parseRecovery(fs, args, stderr, out); !ok {
		return code
	}
	if err := rb.check(); err != nil {
		return fail(stderr, err, "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	site, _ := rb.site(auditLogger(stderr))
	m, err := site.Backup(ctx, *out)
	if err != nil {
		return fail(stderr, err, "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "backed_up", "file": *out, "manifest": m})
}

func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("restore", stderr)
	var rb recoveryBackend
	rb.register(fs, "bolt: new data directory to restore into (required; must hold no store)")
	in := fs.String("in", "", "backup file to restore (required)")
	timeout := fs.Duration("timeout", 10*time.Minute, "deadline of the restore")
	if code, ok := parseRecovery(fs, args, stderr, in); !ok {
		return code
	}
	if err := rb.check(); err != nil {
		return fail(stderr, err, "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	site, target := rb.site(auditLogger(stderr))
	m, err := site.Restore(ctx, *in)
	if err != nil {
		return fail(stderr, err, "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "restored_unverified", "data_dir": rb.dataDir,
		"manifest": m, "next": "starlease verify-restore" + target + " ..."})
}

func runSeal(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("seal", stderr)
	var rb recoveryBackend
	rb.register(fs, "unused: seal is for a Valkey namespace or an etcd key prefix")
	timeout := fs.Duration("timeout", time.Minute, "deadline of the seal")
	if code, ok := parseRecovery(fs, args, stderr); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	site, target := rb.site(auditLogger(stderr))
	sealed, err := site.Seal(ctx)
	if err != nil {
		return fail(stderr, err, "")
	}
	code := "sealed"
	if !sealed {
		code = "already_closed"
	}
	return succeed(stdout, stderr, map[string]any{"code": code, "next": "starlease verify-restore" + target + " ..."})
}

// listFlag is a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// readSecretFile reads a file holding one secret line (a password, a URL
// with credentials).
func readSecretFile(field, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", lease.Invalid(field, "cannot read the file")
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func runVerifyRestore(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("verify-restore", stderr)
	var rb recoveryBackend
	rb.register(fs, "bolt: data directory of the restored namespace (required)")
	couchURL := fs.String("couchdb-url", "", "CouchDB base URL of the fenced databases (no credentials)")
	var dbs, queues, marksFiles listFlag
	fs.Var(&dbs, "couchdb-db", "fenced CouchDB database to read marks from (repeatable, comma-separated)")
	couchUser := fs.String("couchdb-username", "", "CouchDB user name")
	couchPasswordFile := fs.String("couchdb-password-file", "", "file holding the CouchDB password")
	rabbitURLFile := fs.String("rabbitmq-url-file", "", "file holding the AMQP URL of the broker (it carries credentials)")
	fs.Var(&queues, "rabbitmq-queue", "queue of fenced publications to read marks from (repeatable, comma-separated)")
	fs.Var(&marksFiles, "consumer-marks", "consumer marks file to read marks from (repeatable, comma-separated)")
	complete := fs.Bool("proof-complete", false, "assert the sources named are every authoritative downstream store")
	gap := fs.Uint64("epoch-gap", recovery.DefaultEpochGap, "epoch path: raise every counter this far above the maximum known token")
	timeout := fs.Duration("timeout", 10*time.Minute, "deadline of the verification")
	if code, ok := parseRecovery(fs, args, stderr); !ok {
		return code
	}
	if err := rb.check(); err != nil {
		return fail(stderr, err, "")
	}
	switch {
	case len(dbs) > 0 && *couchURL == "":
		return fail(stderr, lease.Invalid("couchdb_url", "--couchdb-db needs --couchdb-url"), "")
	case len(queues) > 0 && *rabbitURLFile == "":
		return fail(stderr, lease.Invalid("rabbitmq_url_file", "--rabbitmq-queue needs --rabbitmq-url-file"), "")
	case *complete && len(dbs)+len(queues)+len(marksFiles) == 0:
		return fail(stderr, lease.Invalid("proof_complete", "a complete proof needs at least one downstream source"), "")
	case *gap == 0 || *gap > lease.MaxFencingToken:
		return fail(stderr, lease.Invalid("epoch_gap", "must be positive and at most 2^53-1"), "")
	}
	var password, rabbitURL string
	var err error
	if *couchPasswordFile != "" {
		if password, err = readSecretFile("couchdb_password_file", *couchPasswordFile); err != nil {
			return fail(stderr, err, "")
		}
	}
	if *rabbitURLFile != "" {
		if rabbitURL, err = readSecretFile("rabbitmq_url_file", *rabbitURLFile); err != nil {
			return fail(stderr, err, "")
		}
	}
	src := recovery.Sources{RabbitMQURL: rabbitURL, Queues: queues, MarksFiles: marksFiles, Complete: *complete}
	for _, db := range dbs {
		src.CouchDB = append(src.CouchDB, recovery.CouchDBSource{URL: *couchURL, Database: db, Username: *couchUser, Password: password})
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	site, _ := rb.site(auditLogger(stderr))
	rep, proof, err := site.Verify(ctx, src, recovery.Options{EpochGap: *gap})
	if err != nil && !errors.Is(err, recovery.ErrReopenedAuditIncomplete) {
		return fail(stderr, err, "")
	}
	out := map[string]any{"code": "recovered", "proof_sources": proof.Sources,
		"proof_marks": len(proof.Marks), "proof_complete": proof.Complete, "report": rep}
	if err != nil {
		// Reopened, but an audit event after the reopening was not written.
		out["audit_error"] = err.Error()
	}
	return succeed(stdout, stderr, out)
}
