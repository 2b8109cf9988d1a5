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
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/recovery"
)

const recoveryUsage = `usage:
  starlease backup         --data-dir DIR --out FILE
  starlease restore        --in FILE --data-dir NEWDIR
  starlease verify-restore --data-dir DIR [--couchdb-url URL --couchdb-db NAME[,NAME...]
                           [--couchdb-username U --couchdb-password-file F]] [--proof-complete]
                           [--epoch-gap N]

backup writes one consistent snapshot of the bolt store in DIR to FILE
(created, never overwritten) and prints its manifest. bbolt admits one
process per store file: run it with "starlease serve" on DIR stopped.

restore verifies FILE and restores it into NEWDIR, which must not hold a
store. The namespace stays closed (every command and serve refuse it with
lease_backend_unavailable) until verify-restore succeeds.

verify-restore reads the downstream high-water marks from every fenced
CouchDB database named (each document's starintel_fence), then reopens the
namespace. Only with --proof-complete (the operator asserts the databases
named are every authoritative downstream store) and no shortfall are the
counters kept as restored; otherwise the epoch path raises every counter
to the maximum known token + --epoch-gap. Either way restored active
leases are ended and holders must acquire again. The report is printed as
JSON; audit records go to stderr. Flags can also be set as STARLEASE_<FLAG>.
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

func runBackup(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("backup", stderr)
	dataDir := fs.String("data-dir", "", "data directory holding the store file (required)")
	out := fs.String("out", "", "backup file to create (required; never overwritten)")
	timeout := fs.Duration("timeout", 5*time.Minute, "deadline of the backup")
	if code, ok := parseRecovery(fs, args, stderr, dataDir, out); !ok {
		return code
	}
	path := filepath.Join(*dataDir, storeFile)
	if _, err := os.Stat(path); err != nil {
		return fail(stderr, lease.Invalid("data_dir", "holds no store file"), "")
	}
	log := auditLogger(stderr)
	s, err := bolt.Open(path, bolt.Options{StoreOptions: lease.StoreOptions{Logger: log}, ReapInterval: -1})
	if err != nil {
		return fail(stderr, err, "")
	}
	defer s.Close()
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(stderr, lease.Invalid("out", "cannot create the backup file (it must not exist)"), "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	m, err := s.Backup(ctx, f)
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
		return fail(stderr, err, "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "backed_up", "file": *out, "manifest": m})
}

func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("restore", stderr)
	in := fs.String("in", "", "backup file to restore (required)")
	dataDir := fs.String("data-dir", "", "new data directory to restore into (required; must hold no store)")
	if code, ok := parseRecovery(fs, args, stderr, in, dataDir); !ok {
		return code
	}
	f, err := os.Open(*in)
	if err != nil {
		return fail(stderr, lease.Invalid("in", "cannot open the backup file"), "")
	}
	defer f.Close()
	m, err := recovery.ReadBackup(f)
	if err != nil {
		return fail(stderr, lease.Errorf(lease.CodeCorrupt, "backup file rejected: %v", err), "")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot reread the backup file"), "")
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fail(stderr, lease.Errorf(lease.CodeBackendUnavailable, "cannot create the data directory"), "")
	}
	path := filepath.Join(*dataDir, storeFile)
	if err := bolt.Restore(f, path); err != nil {
		if errors.Is(err, bolt.ErrRestoreTarget) {
			return fail(stderr, lease.Invalid("data_dir", err.Error()), "")
		}
		return fail(stderr, lease.Errorf(lease.CodeCorrupt, "restore failed: %v", err), "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "restored_unverified", "data_dir": *dataDir,
		"manifest": m, "next": "starlease verify-restore --data-dir " + *dataDir + " ..."})
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

func runVerifyRestore(args []string, stdout, stderr io.Writer) int {
	fs := recoveryFlagSet("verify-restore", stderr)
	dataDir := fs.String("data-dir", "", "data directory of the restored namespace (required)")
	couchURL := fs.String("couchdb-url", "", "CouchDB base URL of the fenced databases (no credentials)")
	var dbs listFlag
	fs.Var(&dbs, "couchdb-db", "fenced CouchDB database to read marks from (repeatable, comma-separated)")
	couchUser := fs.String("couchdb-username", "", "CouchDB user name")
	couchPasswordFile := fs.String("couchdb-password-file", "", "file holding the CouchDB password")
	complete := fs.Bool("proof-complete", false, "assert the databases named are every authoritative downstream store")
	gap := fs.Uint64("epoch-gap", recovery.DefaultEpochGap, "epoch path: raise every counter this far above the maximum known token")
	timeout := fs.Duration("timeout", 10*time.Minute, "deadline of the verification")
	if code, ok := parseRecovery(fs, args, stderr, dataDir); !ok {
		return code
	}
	switch {
	case len(dbs) > 0 && *couchURL == "":
		return fail(stderr, lease.Invalid("couchdb_url", "--couchdb-db needs --couchdb-url"), "")
	case *complete && len(dbs) == 0:
		return fail(stderr, lease.Invalid("proof_complete", "a complete proof needs at least one --couchdb-db"), "")
	case *gap == 0:
		return fail(stderr, lease.Invalid("epoch_gap", "must be positive"), "")
	}
	var password string
	if *couchPasswordFile != "" {
		b, err := os.ReadFile(*couchPasswordFile)
		if err != nil {
			return fail(stderr, lease.Invalid("couchdb_password_file", "cannot read the file"), "")
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	log := auditLogger(stderr)
	proof := recovery.Proof{Complete: *complete}
	for _, db := range dbs {
		src := recovery.CouchDBSource{URL: *couchURL, Database: db, Username: *couchUser, Password: password}
		if err := recovery.CouchDBProof(ctx, src, &proof); err != nil {
			log.Error("AUDIT recovery proof failed; namespace stays closed", "source", src.Name(), "error", err.Error())
			return fail(stderr, err, "")
		}
	}
	rep, err := recovery.Verify(ctx, filepath.Join(*dataDir, storeFile), proof, recovery.Options{EpochGap: *gap,
		Bolt: bolt.Options{StoreOptions: lease.StoreOptions{Logger: log}, ReapInterval: -1}, Logger: log})
	if err != nil {
		return fail(stderr, err, "")
	}
	return succeed(stdout, stderr, map[string]any{"code": "recovered", "proof_sources": proof.Sources,
		"proof_marks": len(proof.Marks), "proof_complete": proof.Complete, "report": rep})
}
