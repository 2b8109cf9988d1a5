package main

import (
	"context"
	"flag"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// modeSynopsis is the usage-line form of the mode flags: local, or remote
// (with --api-key-file F).
const modeSynopsis = "(--data-dir DIR | --server URL)"

// identitySynopsis is the usage-line form of the mode and identity flags.
const identitySynopsis = modeSynopsis + " --tenant T --program P --namespace N --target ID --actor A"

// commands are the lease commands, in usage order.
var commands = []command{
	{"acquire", identitySynopsis + " [--ttl D] [flags]",
		"acquire a lease on a lock identity (non-blocking: conflict if held)", setupAcquire},
	{"renew", identitySynopsis + " --lease-id L --token N [flags]",
		"extend a held lease", setupRenew},
	{"release", identitySynopsis + " --lease-id L --token N [flags]",
		"end a held lease", setupRelease},
	{"force-release", identitySynopsis + " --lease-id L --token N --reason R|--incident I [flags]",
		"end the observed lease as an administrator (state released)", setupAdmin(lease.OpForceRelease)},
	{"revoke", identitySynopsis + " --lease-id L --token N --reason R|--incident I [flags]",
		"revoke the observed lease (security terminal state revoked)", setupAdmin(lease.OpRevoke)},
	{"inspect", modeSynopsis + " (identity flags | --lease-id L) [--output table] [flags]",
		"show the lease of an identity, or a lease by id", setupInspect},
	{"list", modeSynopsis + " (--owner P | --tenant T --program P [--namespace N --target ID]) [--output table] [flags]",
		"list unexpired active leases by owner, by target or by program", setupList},
	{"history", modeSynopsis + " (identity flags | --lease-id L) [--page-size N] [--page-token T] [--output table] [flags]",
		"list an identity's terminal leases, newest first", setupHistory},
	{"lookup", "--data-dir DIR --tenant T --program P --namespace N --target ID --actor A --op OP --request-id ID [flags]",
		"resolve a mutation's outcome by its request id (local mode)", setupLookup},
	{"authorize-commit", identitySynopsis + " --lease-id L --token N --sink S --execution E --job J --write-target T [flags]",
		"validate a fenced write against the lease and the sink's high-water mark", setupCommit},
}

func setupAcquire(fs *flag.FlagSet) build {
	var id identityFlags
	var m mutationFlags
	id.register(fs)
	m.register(fs)
	ttl := fs.Duration("ttl", 30*time.Second, "time to live of the lease")
	life := fs.Duration("max-lifetime", 5*time.Minute, "maximum lifetime of the lease across renewals")
	instance := instanceFlag(fs)
	execution := fs.String("execution", "", "execution id (default: a fresh exec_<ULID>)")
	job := fs.String("job", "", "job id (default: a fresh job_<ULID>)")
	trace := fs.String("trace", "", "trace id (optional)")
	meta := fs.String("metadata", "", `bounded non-secret metadata, a JSON object such as '{"k":"v"}'`)
	return func(e *env) (call, error) {
		req := lease.AcquireRequest{
			Identity: id.Identity, ServiceInstanceID: *instance,
			TTL: *ttl, MaximumLifetime: *life,
			ExecutionID: orNew(*execution, "exec_"), JobID: orNew(*job, "job_"), TraceID: *trace,
			Mutation: m.mutation(e),
		}
		if *meta != "" {
			md, err := lease.DecodeMetadata([]byte(*meta))
			if err != nil {
				return nil, err
			}
			req.Metadata = md
		}
		e.rerun = append(e.rerun, "--execution", req.ExecutionID, "--job", req.JobID)
		if _, _, err := lease.PrepareAcquire(req, e.optsFor(req.Identity)); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.Acquire(ctx, req)
			return heldOutput(r, req.RequestID, err)
		}, nil
	}
}

// heldFlags name a lease its holder acts on.
type heldFlags struct {
	leaseID  string
	token    uint64
	instance *string
}

func (f *heldFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.leaseID, "lease-id", "", "lease id")
	fs.Uint64Var(&f.token, "token", 0, "fencing token of the lease")
	f.instance = instanceFlag(fs)
}

func setupRenew(fs *flag.FlagSet) build {
	var id identityFlags
	var m mutationFlags
	var h heldFlags
	id.register(fs)
	m.register(fs)
	h.register(fs)
	ttl := fs.Duration("ttl", 0, "new time to live (default: the lease's current ttl)")
	return func(e *env) (call, error) {
		req := lease.RenewRequest{Identity: id.Identity, LeaseID: h.leaseID, FencingToken: h.token,
			ServiceInstanceID: *h.instance, TTL: *ttl, Mutation: m.mutation(e)}
		if isSet(fs, "ttl") && *ttl == 0 {
			return nil, lease.Invalid("ttl_ms", "must be positive")
		}
		if _, _, err := lease.PrepareRenew(req, e.optsFor(req.Identity)); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.Renew(ctx, req)
			return heldOutput(r, req.RequestID, err)
		}, nil
	}
}

func setupRelease(fs *flag.FlagSet) build {
	var id identityFlags
	var m mutationFlags
	var h heldFlags
	id.register(fs)
	m.register(fs)
	h.register(fs)
	return func(e *env) (call, error) {
		req := lease.ReleaseRequest{Identity: id.Identity, LeaseID: h.leaseID, FencingToken: h.token,
			ServiceInstanceID: *h.instance, Mutation: m.mutation(e)}
		if _, _, err := lease.PrepareRelease(req, e.optsFor(req.Identity)); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.Release(ctx, req)
			return leaseOutput(r, req.RequestID), err
		}, nil
	}
}

func setupAdmin(op lease.Op) func(fs *flag.FlagSet) build {
	return func(fs *flag.FlagSet) build {
		var id identityFlags
		var m mutationFlags
		id.register(fs)
		m.register(fs)
		leaseID := fs.String("lease-id", "", "lease id of the observed active lease")
		token := fs.Uint64("token", 0, "fencing token of the observed active lease")
		reason := fs.String("reason", "", "administrator reason (this or --incident is required)")
		incident := fs.String("incident", "", "incident id (this or --reason is required)")
		return func(e *env) (call, error) {
			req := lease.AdminRequest{Identity: id.Identity, LeaseID: *leaseID, FencingToken: *token,
				Reason: *reason, IncidentID: *incident, Mutation: m.mutation(e)}
			// Over HTTP the server stores a reason or incident id that
			// may hold credential material in its keyed redacted form and
			// never refuses it for that: the CLI checks everything else.
			check := req
			if e.remote != nil {
				if lease.SecretShaped(check.Reason) {
					check.Reason = "redacted"
				}
				if lease.SecretShaped(check.IncidentID) {
					check.IncidentID = "redacted"
				}
			}
			if _, _, err := lease.PrepareAdmin(op, check, e.optsFor(req.Identity)); err != nil {
				return nil, err
			}
			return func(ctx context.Context, s lease.Store) (any, error) {
				var r lease.Result
				var err error
				if op == lease.OpRevoke {
					r, err = s.Revoke(ctx, req)
				} else {
					r, err = s.ForceRelease(ctx, req)
				}
				return leaseOutput(r, req.RequestID), err
			}, nil
		}
	}
}

func setupInspect(fs *flag.FlagSet) build {
	var id identityFlags
	id.register(fs)
	leaseID := fs.String("lease-id", "", "lease id (instead of the identity flags)")
	output := outputFlag(fs)
	return func(e *env) (call, error) {
		if err := e.setOutput(*output); err != nil {
			return nil, err
		}
		req := lease.InspectRequest{Identity: id.Identity, LeaseID: *leaseID, DeadlineAt: e.deadline, Caller: e.caller}
		if _, _, err := lease.PrepareInspect(req, e.optsFor(req.Identity)); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.Inspect(ctx, req)
			return leaseOutput(r, ""), err
		}, nil
	}
}

func setupList(fs *flag.FlagSet) build {
	var p pageFlags
	owner := fs.String("owner", "", "list the leases of this owner principal id")
	tenant := fs.String("tenant", "", "tenant_id")
	program := fs.String("program", "", "program_id")
	namespace := fs.String("namespace", "", "target_namespace (with --target: list by target)")
	target := fs.String("target", "", "target_id (with --namespace: list by target)")
	p.register(fs)
	output := outputFlag(fs)
	return func(e *env) (call, error) {
		if err := e.setOutput(*output); err != nil {
			return nil, err
		}
		req := lease.ListRequest{OwnerPrincipalID: *owner, TenantID: *tenant, ProgramID: *program,
			TargetNamespace: *namespace, TargetID: *target, PageSize: p.size, PageToken: p.token,
			DeadlineAt: e.deadline, Caller: e.caller}
		switch {
		case *owner != "":
			req.By = lease.ListByOwner
		case *namespace != "" || *target != "":
			req.By = lease.ListByTarget
		default:
			req.By = lease.ListByProgram
		}
		check := req
		if e.remote != nil {
			check.PageToken = "" // the server's token, which the server checks
		}
		if _, err := lease.PrepareList(check, e.opts); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.List(ctx, req)
			return listOutput(r), err
		}, nil
	}
}

func setupHistory(fs *flag.FlagSet) build {
	var id identityFlags
	var p pageFlags
	id.register(fs)
	p.register(fs)
	leaseID := fs.String("lease-id", "", "any lease id of the identity, active or ended (instead of the identity flags)")
	output := outputFlag(fs)
	return func(e *env) (call, error) {
		if err := e.setOutput(*output); err != nil {
			return nil, err
		}
		req := lease.HistoryRequest{Identity: id.Identity, PageSize: p.size, PageToken: p.token,
			DeadlineAt: e.deadline, Caller: e.caller}
		check := req
		if e.remote != nil {
			check.PageToken = "" // the server's token, which the server checks
		}
		if *leaseID != "" {
			if id.Identity != (lease.Identity{}) {
				return nil, lease.Invalid("lease_id", "give either the identity flags or --lease-id, not both")
			}
			if err := lease.CheckOpaqueID("lease_id", *leaseID); err != nil {
				return nil, err
			}
			// The page token is bound to the identity, checked once known.
			check.PageToken = ""
			check.Identity = lease.Identity{TenantID: "x", ProgramID: "x", TargetNamespace: "x", TargetID: "x", ActorName: "x"}
		}
		if _, err := lease.PrepareHistory(check, e.optsFor(check.Identity)); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			var r lease.HistoryResult
			var err error
			if *leaseID != "" {
				r, err = historyByLeaseID(ctx, s, *leaseID, req)
			} else {
				r, err = s.History(ctx, req)
			}
			return historyOutput(r), err
		}, nil
	}
}

// historyByLeaseID reads the history of the identity of a lease: over the
// HTTP API directly (it reads history by lease id), locally by finding the
// lease's identity first.
func historyByLeaseID(ctx context.Context, s lease.Store, leaseID string, req lease.HistoryRequest) (lease.HistoryResult, error) {
	if r, ok := s.(*remoteStore); ok {
		return r.HistoryByLeaseID(ctx, leaseID, req)
	}
	found, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: leaseID, DeadlineAt: req.DeadlineAt, Caller: req.Caller})
	if err != nil {
		return lease.HistoryResult{}, err
	}
	req.Identity = found.Lease.Identity()
	return s.History(ctx, req)
}

func setupLookup(fs *flag.FlagSet) build {
	var id identityFlags
	id.register(fs)
	op := fs.String("op", "", "the mutation: acquire, renew, release, force-release or revoke")
	requestID := fs.String("request-id", "", "request id of the mutation (required)")
	return func(e *env) (call, error) {
		if e.remote != nil {
			return nil, errRemoteLookup
		}
		req := lease.LookupRequest{Op: lease.Op(strings.ReplaceAll(*op, "-", "_")), Identity: id.Identity,
			PrincipalID: e.caller.PrincipalID, RequestID: *requestID, DeadlineAt: e.deadline}
		if _, err := lease.PrepareLookup(req, e.opts); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.LookupRequest(ctx, req)
			return leaseOutput(r, req.RequestID), err
		}, nil
	}
}

func setupCommit(fs *flag.FlagSet) build {
	var id identityFlags
	var h heldFlags
	id.register(fs)
	h.register(fs)
	sink := fs.String("sink", "", "the authoritative store written (an identifier)")
	commitID := fs.String("commit-id", "", "idempotency key of the commit (default: a fresh commit_<ULID>)")
	execution := fs.String("execution", "", "execution id of the leased work (required)")
	job := fs.String("job", "", "job id of the lease (required)")
	target := fs.String("write-target", "", "the object the one authorized write changes in the sink, e.g. a document id (required)")
	payload := fs.String("payload-sha256", "", "hex SHA-256 of what the write stores (optional)")
	trace := fs.String("trace", "", "trace id (optional)")
	return func(e *env) (call, error) {
		req := lease.CommitRequest{Identity: id.Identity, LeaseID: h.leaseID, FencingToken: h.token,
			ServiceInstanceID: *h.instance, Sink: *sink, CommitID: orNew(*commitID, "commit_"),
			ExecutionID: *execution, JobID: *job, TraceID: *trace, Target: *target, PayloadSHA256: *payload,
			DeadlineAt: e.deadline, Caller: e.caller}
		// The commit id is the commit's idempotency key.
		e.rerun = []string{"--commit-id", req.CommitID}
		if _, _, err := lease.PrepareCommit(req, e.optsFor(req.Identity)); err != nil {
			return nil, err
		}
		return func(ctx context.Context, s lease.Store) (any, error) {
			r, err := s.AuthorizeCommit(ctx, req)
			return commitOutput(r), err
		}, nil
	}
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
