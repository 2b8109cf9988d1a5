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
  1  any other error (lease_rate_limited, lease_counter_exhausted, ...)
  2  usage error, bad flags or invalid_lease_request
  3  lease_conflict, lease_lost, idempotency_conflict, commit_rejected, lease_not_found
  4  lease_backend_unavailable, lease_outcome_unknown, deadline_exceeded, lease_corrupt
`

const usageText = `starlease: time-bounded target leases with fencing tokens (StarIntel OSINT platform)

usage:
  starlease <command> [flags]

commands:
%s
Local mode: every lease command works on the embedded bolt store in
--data-dir (file DIR/` + storeFile + `; the directory is created 0700 if missing).
The local operator owns that file, so the caller is --principal (default
local-operator) with client and credential id "local-cli" and principal
class administrator.

Results are JSON on stdout. Errors are one line of JSON on stderr:
  {"status":"error","code":...,"field":...,"msg":...,"reason":...,"retryable":...,"retry_after_ms":...}
Mutations also report the request_id they used; resolve an outcome-unknown
result with "starlease lookup --op OP --request-id ID" and the same identity.

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
	e, err := g.resolve(time.Now())
	if err != nil {
		return fail(stderr, err, "")
	}
	do, err := b(e)
	if err != nil {
		return fail(stderr, err, e.requestID)
	}
	ctx, cancel := context.WithDeadline(context.Background(), e.deadline)
	defer cancel()
	s, err := openStore(e, stderr)
	if err != nil {
		return fail(stderr, err, e.requestID)
	}
	out, err := do(ctx, s)
	_ = s.Close() // every mutation is committed (fsynced) before its call returns
	if err != nil {
		return fail(stderr, err, e.requestID)
	}
	return succeed(stdout, stderr, out)
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
	return bolt.Open(filepath.Join(e.dataDir, storeFile), bolt.Options{StoreOptions: opts, ReapInterval: -1})
}
