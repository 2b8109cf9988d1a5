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

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/recovery"
	"github.com/starintel/starlease/valkey"
)

const recoveryUsage = `usage:
  starlease backup         --data-dir DIR --out FILE
  starlease backup         --backend valkey [--valkey-...] --out FILE [--pause D]
  starlease restore        --in FILE --data-dir NEWDIR
  starlease restore        --backend valkey [--valkey-...] --in FILE
  starlease seal           --backend valkey [--valkey-...]
  starlease verify-restore (--data-dir DIR | --backend valkey [--valkey-...])
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
are paused (refused, retryably) for at most --pause.

restore verifies FILE and restores it into an empty target: NEWDIR, which
must not hold a store, or the Valkey namespace, which must hold no key. The
namespace stays closed (every mutation refused with
lease_backend_unavailable) until verify-restore succeeds.

seal closes a Valkey namespace after a replica's promotion (failover):
mutations are refused until verify-restore has raised its counters.

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
directory, or the Valkey namespace's audit stream) and a log record on
stderr. Flags can also be set as STARLEASE_<FLAG>.
`

// recoveryFlagSet is the flag set of one recovery command.
func recoveryFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("starlease "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), recoveryUsage) }
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
// bolt the data directory, for valkey the connection flags.
type recoveryBackend struct {
	backendFlags
	dataDir string
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

// auditSink opens where the backend's servers write audit: the bolt audit
// file of the data directory, or the Valkey namespace's stream.
func (b *recoveryBackend) auditSink(vs *valkey.Store) (audit.Sink, error) {
	if vs != nil {
		return vs.AuditSink(valkey.AuditOptions{}), nil
	}
	if err := os.MkdirAll(b.dataDir, 0o700); err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot create the data directory")
	}
	return audit.OpenBolt(filepath.Join(b.dataDir, audit.BoltFileName), audit.BoltOptions{})
}

func (b *recoveryBackend) openValkey(ctx context.Context, log *slog.Logger) (*valkey.Store, error) {
	o := b.valkeyOptions(lease.StoreOptions{Logger: log})
	o.ReapInterval = -1
	return valkey.Open(ctx, o)
}

func runBackup(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("backup", stderr)
	var rb recoveryBackend
	rb.register(fs, "bolt: data directory holding the store file (required)")
	out := fs.String("out", "", "backup file to create (required; never overwritten)")
	pause := fs.Duration("pause", valkey.DefaultBackupPause, "valkey: longest pause of mutations the backup may take")
	timeout := fs.Duration("timeout", 5*time.Minute, "deadline of the backup")
	if code, ok := parseRecovery(fs, args, stderr, out); !ok {
		return code
	}
	if err := rb.check(); err != nil {
		return fail(stderr, err, "")
	}
	log := auditLogger(stderr)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var take func(io.Writer) (backupfile.Header, error)
	var sink audit.Sink
	switch rb.backend {
	case "bolt":
		path := filepath.Join(rb.dataDir, storeFile)
		if _, err := os.Stat(path); err != nil {
			return fail(stderr, lease.Invalid("data_dir", "holds no store file"), "")
		}
		s, err := bolt.Open(path, bolt.Options{StoreOptions: lease.StoreOptions{Logger: log}, ReapInterval: -1})
		if err != nil {
			return fail(stderr, err, "")
		}
		defer s.Close()
		// The credentials live beside the store: they travel as a section
		// (verifiers only; the pepper never enters a backup).
		creds, err := auth.OpenFileStore(filepath.Join(rb.dataDir, credentialsDir))
		if err != nil {
			return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot open the credentials"), "")
		}
		defer creds.Close()
		data, n, err := recovery.BackupCredentials(ctx, creds)
		if err != nil {
			return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot read the credentials: %v", err), "")
		}
		log.Info("credentials carried by the backup", "credentials", n)
		take = func(w io.Writer) (backupfile.Header, error) {
			return s.Backup(ctx, w, backupfile.SectionData{Name: recovery.CredentialsSection, Data: data})
		}
		if sink, err = rb.auditSink(nil); err != nil {
			return fail(stderr, err, "")
		}
	case "valkey":
		o := rb.valkeyOptions(lease.StoreOptions{Logger: log})
		o.ReapInterval, o.BackupPause = -1, *pause
		s, err := valkey.Open(ctx, o)
		if err != nil {
			return fail(stderr, err, "")
		}
		defer s.Close()
		take = func(w io.Writer) (backupfile.Header, error) { return s.Backup(ctx, w) }
		sink, _ = rb.auditSink(s)
	}
	defer sink.Close()
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(stderr, lease.Invalid("out", "cannot create the backup file (it must not exist)"), "")
	}
	m, err := take(f)
	if err == nil {
		if err = f.Sync(); err != nil {
			err = lease.Errorf(lease.CodeBackendUnavailable, "cannot sync the backup file")
		}
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = lease.Errorf(lease.CodeBackendUnavailable, "cannot close the backup file")
	}
	if err != nil {
		os.Remove(*out)
		recovery.Step(ctx, sink, log, audit.EventRecoveryBackup, false, "backup failed ("+string(lease.CodeOf(err))+")")
		return fail(stderr, err, "")
	}
	if err := recovery.Step(ctx, sink, log, audit.EventRecoveryBackup, true, fmt.Sprintf("%s backup %s taken: %d payload bytes, counts %v",
		m.Backend, recovery.ShortSHA(m.PayloadSHA256), m.PayloadBytes, m.Counts)); err != nil {
		os.Remove(*out)
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
	f, err := os.Open(*in)
	if err != nil {
		return fail(stderr, lease.Invalid("in", "cannot open the backup file"), "")
	}
	defer f.Close()
	m, sections, err := backupfile.ReadAll(f, io.Discard)
	if err != nil {
		return fail(stderr, lease.Errorf(lease.CodeCorrupt, "backup file rejected: %v", err), "")
	}
	if m.Backend != rb.backend {
		return fail(stderr, lease.Invalid("in", fmt.Sprintf("the backup is of backend %s, not %s", m.Backend, rb.backend)), "")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot reread the backup file"), "")
	}
	log := auditLogger(stderr)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var sink audit.Sink
	next := "starlease verify-restore"
	switch rb.backend {
	case "bolt":
		if err := os.MkdirAll(rb.dataDir, 0o700); err != nil {
			return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot create the data directory"), "")
		}
		// Checked before the store is written, so a refusal leaves nothing.
		if held, err := os.ReadDir(filepath.Join(rb.dataDir, credentialsDir)); err == nil && len(held) > 0 {
			return fail(stderr, lease.Invalid("data_dir", "its credentials directory is not empty"), "")
		}
		if _, err := bolt.NewNamespace(filepath.Join(rb.dataDir, storeFile), bolt.Options{}).Restore(ctx, f); err != nil {
			if errors.Is(err, bolt.ErrRestoreTarget) {
				return fail(stderr, lease.Invalid("data_dir", err.Error()), "")
			}
			return fail(stderr, lease.Errorf(lease.CodeCorrupt, "restore failed: %v", err), "")
		}
		next += " --data-dir " + rb.dataDir + " ..."
		if data, ok := sections[recovery.CredentialsSection]; ok {
			creds, err := auth.OpenFileStore(filepath.Join(rb.dataDir, credentialsDir))
			if err != nil {
				return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot create the credentials directory"), "")
			}
			n, err := recovery.RestoreCredentials(ctx, creds, data)
			creds.Close()
			if err != nil {
				return fail(stderr, lease.Errorf(lease.CodeCorrupt, "credentials not restored: %v", err), "")
			}
			log.Info("credentials restored", "credentials", n)
		}
		if sink, err = rb.auditSink(nil); err != nil {
			return fail(stderr, err, "")
		}
	case "valkey":
		s, err := rb.openValkey(ctx, log)
		if err != nil {
			return fail(stderr, err, "")
		}
		defer s.Close()
		if _, err := s.Restore(ctx, f); err != nil {
			var le *lease.Error
			switch {
			case errors.Is(err, valkey.ErrRestoreTarget):
				return fail(stderr, lease.Invalid("valkey_key_prefix", err.Error()), "")
			case errors.As(err, &le):
				return fail(stderr, err, "")
			}
			return fail(stderr, lease.Errorf(lease.CodeCorrupt, "restore failed: %v", err), "")
		}
		next += rb.keysFlags() + " ..."
		sink, _ = rb.auditSink(s)
	}
	defer sink.Close()
	if err := recovery.Step(ctx, sink, log, audit.EventRecoveryRestore, true, fmt.Sprintf(
		"%s backup %s of %s restored; namespace closed until verify-restore", m.Backend, recovery.ShortSHA(m.PayloadSHA256),
		m.CreatedAt.Format(time.RFC3339))); err != nil {
		return fail(stderr, err, "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "restored_unverified", "data_dir": rb.dataDir,
		"manifest": m, "next": next})
}

func runSeal(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("seal", stderr)
	var rb recoveryBackend
	rb.register(fs, "unused: seal is for a Valkey namespace")
	timeout := fs.Duration("timeout", time.Minute, "deadline of the seal")
	if code, ok := parseRecovery(fs, args, stderr); !ok {
		return code
	}
	if rb.backend != "valkey" {
		return fail(stderr, lease.Invalid("backend", "seal closes a Valkey namespace after a failover; a bolt store is restored instead"), "")
	}
	log := auditLogger(stderr)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	s, err := rb.openValkey(ctx, log)
	if err != nil {
		return fail(stderr, err, "")
	}
	defer s.Close()
	sealed, err := s.Seal(ctx)
	if err != nil {
		return fail(stderr, err, "")
	}
	code, reason := "sealed", "namespace sealed after a failover; closed until verify-restore"
	if !sealed {
		code, reason = "already_closed", "seal found the namespace already closed for recovery; unchanged"
	}
	sink, _ := rb.auditSink(s)
	if err := recovery.Step(ctx, sink, log, audit.EventRecoveryRestore, true, reason); err != nil {
		return fail(stderr, err, "")
	}
	return succeed(stdout, stderr, map[string]any{"code": code, "next": "starlease verify-restore" + rb.keysFlags() + " ..."})
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
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	log := auditLogger(stderr)

	var ns lease.ClosedNamespace
	var sink audit.Sink
	switch rb.backend {
	case "bolt":
		r, err := bolt.NewNamespace(filepath.Join(rb.dataDir, storeFile), bolt.Options{StoreOptions: lease.StoreOptions{Logger: log}}).OpenClosed(ctx)
		if err != nil {
			return fail(stderr, err, "")
		}
		ns = r
		if sink, err = rb.auditSink(nil); err != nil {
			r.Close()
			return fail(stderr, err, "")
		}
	case "valkey":
		o := rb.valkeyOptions(lease.StoreOptions{Logger: log})
		o.ReapInterval = -1
		c, err := valkey.NewNamespace(o).OpenClosed(ctx)
		if err != nil {
			if errors.Is(err, valkey.ErrNamespaceOpen) {
				return fail(stderr, lease.Invalid("backend", err.Error()), "")
			}
			return fail(stderr, err, "")
		}
		ns = c
		s, err := rb.openValkey(ctx, log)
		if err != nil {
			c.Close()
			return fail(stderr, err, "")
		}
		defer s.Close()
		sink, _ = rb.auditSink(s)
	}
	defer sink.Close()

	proof := recovery.Proof{Complete: *complete}
	var perr error
	for _, db := range dbs {
		src := recovery.CouchDBSource{URL: *couchURL, Database: db, Username: *couchUser, Password: password}
		if perr = recovery.CouchDBProof(ctx, src, &proof); perr != nil {
			break
		}
	}
	if perr == nil && len(queues) > 0 {
		perr = recovery.RabbitMQProof(ctx, rabbitURL, queues, &proof)
	}
	for _, mf := range marksFiles {
		if perr != nil {
			break
		}
		perr = recovery.MarksFileProof(mf, &proof)
	}
	if perr != nil {
		ns.Close()
		recovery.Step(ctx, sink, log, audit.EventRecoveryReopen, false,
			"downstream proof failed ("+string(lease.CodeOf(perr))+"); namespace stays closed")
		return fail(stderr, perr, "")
	}
	rep, err := recovery.Verify(ctx, ns, proof, recovery.Options{EpochGap: *gap, Audit: sink, Logger: log})
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
