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
)

// storeFile is the name of the bolt store file inside --data-dir.
const storeFile = "starlease.db"

const exitStatusText = `exit status:
  0  success
  1  any other error (lease_rate_limited, lease_counter_exhausted, invalid_credential, access_denied, ...)
  2  usage error, bad flags or invalid_lease_request
  3  lease_conflict, lease_lost, idempotency_conflict, commit_rejected, lease_not_found
  4  lease_backend_unavailable, lease_outcome_unknown, deadline_exceeded, lease_corrupt
`

const usageText = `starlease: time-bounded target leases with fencing tokens (StarIntel OSINT platform)

usage:
  starlease <command> [flags]

commands:
%s
Remote mode: with --server URL (or $STARLEASE_SERVER) and --api-key-file F
(or $STARLEASE_API_KEY_FILE; mode 0600 or 0400, checked like the pepper) a
lease command goes over the HTTP API of a running "starlease serve"; the
caller is the key's principal. A mutation whose answer is lost is sent again,
same request id and body, until answered or --timeout passes; if its outcome
is still unknown the error names the request id and the flags to rerun the
same command with to resolve it. lookup is local only (the HTTP API has no
request-id lookup); remote history by identity needs an active lease, or
give --lease-id of any of the identity's leases.

Local mode: every lease command works on the embedded bolt store in
--data-dir (file DIR/` + storeFile + `; the directory is created 0700 if missing),
for when no server holds that file. The local operator owns it, so the
caller is --principal (default local-operator) with client and credential
id "local-cli" and principal class administrator.

Results are JSON on stdout (list, inspect, history: --output table for
aligned columns). Errors are one line of JSON on stderr:
  {"status":"error","code":...,"field":...,"msg":...,"reason":...,"retryable":...,"retry_after_ms":...}
Mutations also report the request_id they used; resolve an outcome-unknown
result by rerunning with the same flags and --request-id ID, or locally with
"starlease lookup --op OP --request-id ID" and the same identity.

` + exitStatusText + `
Run "starlease <command> -h" for a command's flags.
`

// usage writes the top-level usage text.
func usage(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "  %-17s %s\n", "version", "print the module version and the Go version")
	fmt.Fprintf(&b, "  %-17s %s\n", "serve", "serve the lease HTTP API (see starlease serve -h)")
	fmt.Fprintf(&b, "  %-17s %s\n", "keys", "create, list, revoke and rotate API keys (see starlease keys)")
	fmt.Fprintf(&b, "  %-17s %s\n", "backup", "write a checksummed snapshot of the store (bolt: server stopped; valkey: mutations paused)")
	fmt.Fprintf(&b, "  %-17s %s\n", "restore", "restore a backup into an empty target; it stays closed until verify-restore")
	fmt.Fprintf(&b, "  %-17s %s\n", "seal", "close a promoted Valkey namespace after a failover until verify-restore")
	fmt.Fprintf(&b, "  %-17s %s\n", "verify-restore", "prove the downstream high-water marks and reopen a restored namespace")
	fmt.Fprintf(&b, "  %-17s %s\n", "outbox", "list, requeue or discard the publications the relay set aside (dead letters)")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-17s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, usageText, b.String())
}

// run is the whole program: it parses args, runs one command and returns
// the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	case "version":
		return runVersion(rest, stdout, stderr)
	case "serve":
		return runServe(rest, stdout, stderr)
	case "keys":
		return runKeys(rest, stdout, stderr)
	case "backup":
		return runBackup(rest, stdout, stderr)
	case "restore":
		return runRestore(rest, stdout, stderr)
	case "seal":
		return runSeal(rest, stdout, stderr)
	case "verify-restore":
		return runVerifyRestore(rest, stdout, stderr)
	case "outbox":
		return runOutbox(rest, stdout, stderr)
	}
	for _, c := range commands {
		if c.name == name {
			return c.execute(rest, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "starlease: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}

// A command registers its flags on a FlagSet and returns a build function,
// which runs after parsing: it turns the flags into a request, validates it
// with the lease package (before any file is touched) and returns the store
// call to make.
type command struct {
	name     string
	synopsis string
	summary  string
	setup    func(fs *flag.FlagSet) build
}

type build func(e *env) (call, error)

// call runs the request against the store and returns the value to print.
type call func(ctx context.Context, s lease.Store) (any, error)

// execute runs one lease command: parse, validate, open the store, call,
// print.
func (c command) execute(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("starlease "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var g globalFlags
	g.register(fs)
	b := c.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: starlease %s %s\n\n%s.\n\nflags:\n", c.name, c.synopsis, c.summary)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\n%s", exitStatusText)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "starlease %s: unexpected argument %q\n", c.name, fs.Arg(0))
		fs.Usage()
		return exitUsage
	}
	e, err := g.resolve(time.Now(), func(name string) bool { return isSet(fs, name) }, os.Getenv)
	if err != nil {
		return fail(stderr, err, "")
	}
	if e.remote != nil {
		// Whatever a server answers is printed; a server (or what answers in
		// its place) could echo the key back.
		stdout, stderr = redact(stdout, e.remote.key), redact(stderr, e.remote.key)
	}
	do, err := b(e)
	if err != nil {
		e.close()
		return fail(stderr, err, e.requestID)
	}
	ctx, cancel := context.WithDeadline(context.Background(), e.deadline)
	defer cancel()
	s, err := e.open(stderr)
	if err != nil {
		return fail(stderr, err, e.requestID)
	}
	out, err := do(ctx, s)
	_ = s.Close() // every mutation is committed (fsynced) before its call returns
	if err != nil {
		return fail(stderr, e.explain(err), e.requestID)
	}
	if t, ok := out.(tabular); ok && e.output == outputTable {
		if err := writeTable(stdout, t, time.Now()); err != nil {
			fmt.Fprintf(stderr, "starlease: cannot write the result: %v\n", err)
			return exitOther
		}
		return exitOK
	}
	return succeed(stdout, stderr, out)
}

// open is the store of the command: the server's (remote mode) or the bolt
// file's.
func (e *env) open(stderr io.Writer) (lease.Store, error) {
	if e.remote != nil {
		return e.remote.store, nil
	}
	return openStore(e, stderr)
}

// close releases what resolve set up when no store call follows.
func (e *env) close() {
	if e.remote != nil {
		_ = e.remote.store.Close()
	}
}

// explain adds to a remote mutation's unknown outcome how to resolve it:
// the same command with the flags in e.rerun replays the stored result if
// the mutation was committed, and performs it once if it was not.
func (e *env) explain(err error) error {
	le := lease.AsError(err)
	if e.remote == nil || le.Code != lease.CodeOutcomeUnknown || len(e.rerun) == 0 {
		return err
	}
	out := *le
	why := " before the deadline"
	if c := e.remote.store.refusedRetry; c != "" {
		why = fmt.Sprintf(": a retry was refused with %s, which says nothing of the first attempt,", c)
	}
	out.Reason = fmt.Sprintf("the request was sent to %s but no answer decided it%s (%d attempts with the same request); "+
		"rerun the same command with %s to resolve it", e.remote.server, why, e.remote.store.attempts, strings.Join(e.rerun, " "))
	return &out
}

// openStore creates the data directory if needed and opens the bolt store.
// The reaper is off: a CLI process lives for one operation, and every
// operation treats an expired record as expired anyway.
func openStore(e *env, stderr io.Writer) (*bolt.Store, error) {
	if fi, err := os.Stat(e.dataDir); err == nil && !fi.IsDir() {
		return nil, lease.Invalid("data_dir", "not a directory")
	}
	if err := os.MkdirAll(e.dataDir, 0o700); err != nil {
		return nil, lease.Errorf(lease.CodeBackendUnavailable, "cannot create the data directory")
	}
	opts := e.opts
	opts.Logger = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := bolt.Open(filepath.Join(e.dataDir, storeFile), bolt.Options{StoreOptions: opts, ReapInterval: -1})
	if err != nil {
		return nil, withLockedHint(err, "; if starlease serve runs on this data directory, use remote mode: --server URL --api-key-file F")
	}
	return s, nil
}

// withLockedHint is err with hint added to its reason if bolt refused the
// store file because another process holds it: bbolt admits one process,
// most likely the server on the data directory.
func withLockedHint(err error, hint string) error {
	le := lease.AsError(err)
	if !strings.Contains(le.Reason, "locked by another process") {
		return err
	}
	out := *le
	out.Reason += hint
	return &out
}
