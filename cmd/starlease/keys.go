package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/etcd"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/valkey"
)

const keysUsage = `usage:
  starlease keys create --data-dir DIR --pepper-file F --principal ID --class CLASS
                        --capabilities targets:lease,targets:read --scope 'tenant:*,program:program-a'
                        [--client ID] [--ttl DURATION] [--label TEXT]
  starlease keys list   --data-dir DIR
  starlease keys revoke --data-dir DIR --id CREDENTIAL_ID
  starlease keys rotate --data-dir DIR --pepper-file F --id CREDENTIAL_ID

  any of them with --backend valkey [--valkey-addr HOST:PORT --valkey-username U
  --valkey-password-file F --valkey-key-prefix P --valkey-tls-ca-file F] instead of --data-dir,
  or --backend etcd [--etcd-endpoints URL,URL,URL --etcd-username U --etcd-password-file F
  --etcd-key-prefix P --etcd-tls-ca-file F] instead of --data-dir

create and rotate print the new API key exactly once on stdout; it is never
stored and cannot be read back. With the default --backend bolt, keys live
in DIR/credentials, shared with a running "starlease serve" on the same
directory. With --backend valkey and the same --valkey-* flags as the
servers (--data-dir is then not needed), keys live on the Valkey server,
shared by every server in front of it; likewise with --backend etcd and the
servers' --etcd-* flags, on the etcd cluster. Either way changes apply to
the servers' next request. Flags can also be set as STARLEASE_<FLAG>.
`

func runKeys(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, keysUsage)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	fs := usageFlagSet("starlease keys "+sub, keysUsage, stderr)
	dataDir := fs.String("data-dir", "", "data directory of the server (required with --backend bolt)")
	var bf backendFlags
	bf.register(fs)
	pepperFile := fs.String("pepper-file", "", "the server's pepper file (create, rotate)")
	principal := fs.String("principal", "", "create: principal id the key authenticates")
	class := fs.String("class", "", "create: api_client, service_instance, actor_component or administrator")
	caps := fs.String("capabilities", "", "create: comma-separated capabilities")
	scope := fs.String("scope", "", "create: comma-separated scope grants (dimension:value or dimension:*)")
	client := fs.String("client", "", "create: client id (default: the principal id)")
	ttl := fs.Duration("ttl", 0, "create: key lifetime (0: no expiry)")
	label := fs.String("label", "", "create: short note")
	id := fs.String("id", "", "revoke, rotate: credential id")
	if code, ok := parseBackendCommand(fs, rest, &bf, dataDir, keysUsage, stderr); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := openCredentials(ctx, bf, *dataDir, stderr)
	if err != nil {
		return keysFail(stderr, err)
	}
	defer store.Close()
	loadPepper := func() (auth.Pepper, error) {
		if *pepperFile == "" {
			return auth.Pepper{}, errors.New("--pepper-file is required")
		}
		return auth.LoadPepper(*pepperFile)
	}
	switch sub {
	case "create":
		pepper, err := loadPepper()
		if err != nil {
			return keysFail(stderr, err)
		}
		cl, err := auth.ParseClass(*class)
		if err != nil {
			return keysFail(stderr, err)
		}
		cs, err := auth.ParseCapabilities(*caps)
		if err != nil {
			return keysFail(stderr, err)
		}
		sc, err := auth.ParseScope(*scope)
		if err != nil {
			return keysFail(stderr, err)
		}
		if missing := sc.Missing(); len(missing) > 0 {
			return keysFail(stderr, fmt.Errorf("--scope must grant tenant and program (a value or *); missing: %v", missing))
		}
		key, c, err := auth.Issue(ctx, store, pepper, auth.IssueRequest{PrincipalID: *principal, Class: cl,
			Capabilities: cs, Scope: sc, ClientID: *client, TTL: *ttl, Label: *label})
		if err != nil {
			return keysFail(stderr, err)
		}
		return keysPrint(stdout, map[string]any{"api_key": key, "credential": c.Public()})
	case "list":
		var all []auth.PublicCredential
		for after := ""; ; {
			page, err := store.List(ctx, after, auth.MaxListLimit)
			if err != nil {
				return keysFail(stderr, err)
			}
			for _, c := range page {
				all = append(all, c.Public())
			}
			if len(page) < auth.MaxListLimit {
				break
			}
			after = page[len(page)-1].ID
		}
		return keysPrint(stdout, map[string]any{"credentials": all})
	case "revoke":
		c, err := auth.Revoke(ctx, store, *id)
		if err != nil {
			return keysFail(stderr, err)
		}
		return keysPrint(stdout, map[string]any{"credential": c.Public()})
	case "rotate":
		pepper, err := loadPepper()
		if err != nil {
			return keysFail(stderr, err)
		}
		key, c, err := auth.Rotate(ctx, store, pepper, *id)
		if err != nil {
			return keysFail(stderr, err)
		}
		return keysPrint(stdout, map[string]any{"api_key": key, "credential": c.Public(), "revoked": *id})
	}
	fmt.Fprint(stderr, keysUsage)
	return exitUsage
}

// openCredentials opens the credential store the servers of backend bf
// use: files in dataDir/credentials for bolt, the Valkey server's for
// valkey, the etcd cluster's for etcd (a connection of its own, without
// a reaper).
func openCredentials(ctx context.Context, bf backendFlags, dataDir string, stderr io.Writer) (auth.Store, error) {
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch bf.backend {
	case "valkey":
		s, err := valkey.OpenCredentialStore(ctx, bf.valkeyOptions(lease.StoreOptions{Logger: log}))
		if err != nil {
			return nil, err
		}
		return s, nil
	case "etcd":
		s, err := etcd.OpenCredentialStore(ctx, bf.etcdOptions(lease.StoreOptions{Logger: log}))
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	s, err := auth.OpenFileStore(filepath.Join(dataDir, credentialsDir))
	if err != nil {
		return nil, err
	}
	return s, nil
}

func keysPrint(stdout io.Writer, v any) int {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintln(stdout, string(escapeControls(b)))
	return exitOK
}

// keysFail reports an auth error; its text never carries key material.
func keysFail(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "starlease keys: %v\n", err)
	return exitOther
}

// parseBackendCommand parses the arguments and environment of a command
// that works on a backend's store (keys, outbox): ok is false with the
// exit status to return, after usage on stderr unless -h asked for it.
// bolt needs dataDir.
func parseBackendCommand(fs *flag.FlagSet, args []string, bf *backendFlags, dataDir *string, usage string, stderr io.Writer) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if err := envFlags(fs); err != nil || fs.NArg() > 0 || bf.check() != nil || (*dataDir == "" && bf.backend == "bolt") {
		fmt.Fprint(stderr, usage)
		return exitUsage, false
	}
	return 0, true
}
