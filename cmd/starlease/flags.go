package main

import (
	"flag"
	"math"
	"os"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
)

// localClientID is the client and credential id of the local operator.
const localClientID = "local-cli"

// globalFlags are the flags every lease command takes.
type globalFlags struct {
	dataDir    string
	classes    string
	principal  string
	timeout    time.Duration
	server     string
	apiKeyFile string
}

func (g *globalFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.dataDir, "data-dir", "", "data directory holding the store file (local mode; created 0700 if missing)")
	fs.StringVar(&g.server, "server", "", "URL of a running starlease serve, e.g. http://127.0.0.1:8080 (remote mode; default $"+envServer+")")
	fs.StringVar(&g.apiKeyFile, "api-key-file", "", "file holding the API key, mode 0600 or 0400 (remote mode; default $"+envAPIKeyFile+")")
	fs.StringVar(&g.classes, "operation-classes", lease.DefaultComponent, "configured closed set of operation classes, comma-separated (remote mode: the server's set applies unless given)")
	fs.StringVar(&g.principal, "principal", "local-operator", "owner principal id of the caller (local mode; remotely the caller is the API key's principal)")
	fs.DurationVar(&g.timeout, "timeout", 5*time.Second, "deadline of the operation, from now (remote mode: unknown outcomes are retried within it)")
}

// env is the resolved context of one command: store options, the caller and
// the deadline. requestID is set once a mutation's request id is chosen, so
// errors can report it.
type env struct {
	dataDir   string
	opts      lease.StoreOptions
	caller    lease.Caller
	deadline  time.Time
	requestID string

	// remote is the client of remote mode, nil in local mode.
	remote *remote
	// classesSet: --operation-classes was given.
	classesSet bool
	// rerun are the flags that, added to the same command line, resolve an
	// unknown outcome (the request id, and generated ids of the body).
	rerun []string
	// output is the output format: "json" or "table".
	output string
}

// remote is the server a remote-mode command talks to.
type remote struct {
	server string
	store  *remoteStore
	// key is the API key, kept only to redact it from output (redact).
	key string
}

// resolve checks the global flags and builds the env. set reports whether
// a flag was given on the command line; getenv reads the environment.
func (g *globalFlags) resolve(now time.Time, set func(string) bool, getenv func(string) string) (*env, error) {
	server, keyFile := g.server, g.apiKeyFile
	// A flag on the command line wins over a variable: --data-dir too,
	// so local mode works in a shell that exports STARLEASE_SERVER.
	if !set("server") && !set("data-dir") {
		server = getenv(envServer)
	}
	if !set("api-key-file") {
		keyFile = getenv(envAPIKeyFile)
	}
	server = strings.TrimSpace(server)
	switch {
	case server != "" && strings.TrimSpace(g.dataDir) != "":
		return nil, lease.Invalid("server", "give --data-dir (local mode) or --server (remote mode), not both")
	case server == "" && strings.TrimSpace(g.dataDir) == "":
		return nil, lease.Invalid("data_dir", "--data-dir is required (or --server URL for remote mode)")
	case server == "" && keyFile != "" && set("api-key-file"):
		return nil, lease.Invalid("api_key_file", "--api-key-file is for remote mode (--server)")
	case server != "" && set("principal"):
		return nil, lease.Invalid("principal", "in remote mode the caller is the API key's principal; --principal is for local mode")
	}
	if g.timeout <= 0 {
		return nil, lease.Invalid("timeout", "must be positive")
	}
	var values []string
	for _, v := range strings.Split(g.classes, ",") {
		if v = strings.TrimSpace(v); v != "" {
			values = append(values, v)
		}
	}
	classes, err := lease.NewOperationClasses(values...)
	if err != nil {
		return nil, lease.Invalid("operation_classes", lease.AsError(err).Reason)
	}
	e := &env{
		dataDir: g.dataDir,
		opts:    lease.StoreOptions{OperationClasses: classes},
		caller: lease.Caller{
			PrincipalID:    g.principal,
			PrincipalClass: "administrator",
			ClientID:       localClientID,
			CredentialID:   localClientID,
			CorrelationID:  newID("corr_"),
		},
		deadline:   now.Add(g.timeout),
		classesSet: set("operation-classes"),
		output:     outputJSON,
	}
	if server == "" {
		return e, nil
	}
	if keyFile == "" {
		return nil, lease.Invalid("api_key_file", "remote mode needs --api-key-file (or $"+envAPIKeyFile+")")
	}
	key, err := loadAPIKey(keyFile)
	if err != nil {
		return nil, err
	}
	c, tr, err := newRemoteClient(server, key)
	if err != nil {
		return nil, err
	}
	// The server applies its own page size maximum.
	e.opts.MaxPageSize = math.MaxInt32
	e.remote = &remote{server: server, store: newRemoteStore(c, tr), key: key}
	return e, nil
}

// optsFor is the store options to validate a request on identity id with.
// In remote mode the server's configured operation classes apply, which the
// CLI does not know: unless --operation-classes was given, the identity's
// own class counts as configured, and the server decides.
func (e *env) optsFor(id lease.Identity) lease.StoreOptions {
	if e.remote == nil || e.classesSet {
		return e.opts
	}
	o := e.opts
	if oc, err := lease.NormalizeIdentifier("operation_class", id.OperationClass); err == nil {
		if c, err := lease.NewOperationClasses(oc); err == nil {
			o.OperationClasses = c
		}
	}
	return o
}

// identityFlags are the seven fields of a lock identity.
type identityFlags struct{ lease.Identity }

func (f *identityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.TenantID, "tenant", "", "tenant_id")
	fs.StringVar(&f.ProgramID, "program", "", "program_id")
	fs.StringVar(&f.TargetNamespace, "namespace", "", "target_namespace")
	fs.StringVar(&f.TargetID, "target", "", "target_id")
	fs.StringVar(&f.ActorName, "actor", "", "actor_name")
	fs.StringVar(&f.WorkflowName, "workflow", "", `workflow_name (default "default")`)
	fs.StringVar(&f.OperationClass, "operation-class", "", `operation_class, one of --operation-classes (default "default")`)
}

// mutationFlags are the flags of every mutating command.
type mutationFlags struct{ requestID string }

func (f *mutationFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.requestID, "request-id", "", "idempotency key of this mutation (default: a fresh req_<ULID>)")
}

// mutation builds the common part of a mutating request and records the
// request id in e.
func (f *mutationFlags) mutation(e *env) lease.Mutation {
	e.requestID = orNew(f.requestID, "req_")
	e.rerun = []string{"--request-id", e.requestID}
	return lease.Mutation{RequestID: e.requestID, DeadlineAt: e.deadline, Caller: e.caller}
}

// instanceFlag registers --instance with the local default.
func instanceFlag(fs *flag.FlagSet) *string {
	return fs.String("instance", defaultInstance(), "service instance id")
}

// pageFlags are the paging flags of list and history.
type pageFlags struct {
	size  int
	token string
}

func (f *pageFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.size, "page-size", 0, "page size (default: the server maximum)")
	fs.StringVar(&f.token, "page-token", "", "opaque next_page_token of the previous page")
}

// newID returns prefix followed by a fresh ULID.
func newID(prefix string) string { return prefix + ulid.Make().String() }

// orNew returns v, or a fresh id with prefix when v is empty.
func orNew(v, prefix string) string {
	if v == "" {
		return newID(prefix)
	}
	return v
}

// defaultInstance is "local-" and the host name made to follow the
// identifier rule, or "local".
func defaultInstance() string {
	h, err := os.Hostname()
	if err != nil {
		return "local"
	}
	id := "local-" + sanitizeID(h)
	if sanitizeID(h) == "" || lease.CheckOpaqueID("service_instance_id", id) != nil {
		return "local"
	}
	return id
}

// sanitizeID lower-cases s and maps every character outside the identifier
// rule to '-', with no "..", at most 200 bytes.
func sanitizeID(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == ':', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := b.String()
	for strings.Contains(out, "..") {
		out = strings.ReplaceAll(out, "..", ".")
	}
	if len(out) > 200 {
		out = out[:200]
	}
	return out
}
