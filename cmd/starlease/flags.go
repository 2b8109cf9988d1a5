package main

import (
	"flag"
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
	dataDir   string
	classes   string
	principal string
	timeout   time.Duration
}

func (g *globalFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.dataDir, "data-dir", "", "data directory holding the store file (required; created 0700 if missing)")
	fs.StringVar(&g.classes, "operation-classes", lease.DefaultComponent, "configured closed set of operation classes, comma-separated")
	fs.StringVar(&g.principal, "principal", "local-operator", "owner principal id of the caller")
	fs.DurationVar(&g.timeout, "timeout", 5*time.Second, "deadline of the operation, from now")
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
}

// resolve checks the global flags and builds the env.
func (g *globalFlags) resolve(now time.Time) (*env, error) {
	if strings.TrimSpace(g.dataDir) == "" {
		return nil, lease.Invalid("data_dir", "--data-dir is required")
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
	return &env{
		dataDir: g.dataDir,
		opts:    lease.StoreOptions{OperationClasses: classes},
		caller: lease.Caller{
			PrincipalID:    g.principal,
			PrincipalClass: "administrator",
			ClientID:       localClientID,
			CredentialID:   localClientID,
			CorrelationID:  newID("corr_"),
		},
		deadline: now.Add(g.timeout),
	}, nil
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
