package main

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/lease"
)

// Remote mode: with --server URL (or STARLEASE_SERVER) a lease command goes
// over the HTTP API of a running "starlease serve" instead of opening the
// bolt file (which the server holds: bbolt admits one process). The caller
// is the principal of the API key read from --api-key-file (or
// STARLEASE_API_KEY_FILE); the key is never a flag value, so it never shows
// in ps, and never appears in output or errors.

// Environment variables of remote mode; a flag given on the command line
// wins, and an empty value is unset.
const (
	envServer     = "STARLEASE_SERVER"
	envAPIKeyFile = "STARLEASE_API_KEY_FILE"
)

// maxAPIKeyFileBytes bounds the API key file (a key is 101 bytes).
const maxAPIKeyFileBytes = 1024

// errRemoteLookup refuses "lookup" in remote mode: the HTTP API has no
// request-id lookup route, and a lookup names no body to replay.
var errRemoteLookup = &lease.Error{Code: lease.CodeInvalidRequest, Field: "server",
	Reason: "the HTTP API has no request-id lookup: resolve an unknown outcome by rerunning the same mutation " +
		"with the same flags and --request-id ID (the server replays its stored result); lookup is for local mode (--data-dir)"}

// loadAPIKey reads the API key file with the pepper file's checks
// (auth.ReadSecretFile). Errors never show the key.
func loadAPIKey(path string) (string, error) {
	b, err := auth.ReadSecretFile(path, "API key file", maxAPIKeyFileBytes)
	if err != nil {
		return "", lease.Invalid("api_key_file", err.Error())
	}
	key := string(b)
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return "", lease.Invalid("api_key_file", "the API key file must hold one API key on one line")
	}
	return key, nil
}

// newRemoteClient is the HTTP client of one command: its own transport,
// closed when the command ends.
func newRemoteClient(server, key string) (*client.Client, *http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	c, err := client.New(server, key, client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithUserAgent("starlease-cli/"+version()))
	if err != nil {
		// client.New's errors name the problem, never the key or the URL.
		msg := strings.TrimPrefix(err.Error(), "client: ")
		field := "server"
		if strings.Contains(msg, "API key") {
			field, msg = "api_key_file", "the API key file does not hold a usable API key"
		}
		return nil, nil, lease.Invalid(field, msg)
	}
	return c, tr, nil
}

// remoteStore is lease.Store over the HTTP API: client.LeaseStore, plus
// the CLI's resolution of unknown outcomes. A mutation whose outcome is
// unknown (the request was sent, no answer came) is sent again, the same
// request id with the same body, until it is answered or the deadline
// passes; see resolve.
type remoteStore struct {
	ls *client.LeaseStore
	tr *http.Transport
	// attempts counts the requests of the last mutation.
	attempts int
	// refusedRetry is the code a retry of the last mutation was refused
	// with, if that ended its retries (see resolve).
	refusedRetry lease.Code
}

func newRemoteStore(c *client.Client, tr *http.Transport) *remoteStore {
	// The owner is the API key's principal, which no answer names: the
	// adapter leaves the owner fields of records empty rather than guess.
	return &remoteStore{ls: client.NewLeaseStore(c, ""), tr: tr}
}

// Retry pacing while an outcome is unknown.
const (
	firstRetryDelay = 100 * time.Millisecond
	maxRetryDelay   = time.Second
)

// stillUnknown reports whether an answer to a retry leaves the outcome of
// the first attempt unknown: nothing was decided about this request id.
func stillUnknown(c lease.Code) bool {
	switch c {
	case lease.CodeOutcomeUnknown, lease.CodeBackendUnavailable, lease.CodeDeadlineExceeded, lease.CodeRateLimited:
		return true
	}
	return false
}

// resolve runs a mutation and, while its outcome is unknown, sends it again
// (do sends the same request id and body each time) until an answer
// decides it or ctx's deadline leaves no room for another attempt. Any
// decided answer is returned: the replayed result if the first attempt was
// committed, else the outcome of this one. If none came, the error is
// lease_outcome_unknown, whatever the last attempt's failure was (a server
// that is down, and so answers nothing, leaves the first attempt unknown).
//
// A retry refused for the caller (invalid_credential, access_denied: the
// key was revoked, expired or lost its grant meanwhile) decides nothing
// of the first attempt, which may have committed: the outcome stays
// unknown, and retrying with the same key is no use.
func resolve[T any](ctx context.Context, r *remoteStore, do func(context.Context) (T, error)) (T, error) {
	r.attempts, r.refusedRetry = 1, ""
	res, err := do(ctx)
	if lease.CodeOf(err) != lease.CodeOutcomeUnknown {
		return res, err
	}
	unknown := lease.AsError(err)
	delay := firstRetryDelay
	for {
		wait := delay
		if le := lease.AsError(err); le.RetryAfter > wait {
			wait = le.RetryAfter
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+50*time.Millisecond {
			break
		}
		select {
		case <-ctx.Done():
			return res, unknown
		case <-time.After(wait):
		}
		r.attempts++
		res, err = do(ctx)
		if c := lease.CodeOf(err); c == lease.CodeInvalidCredential || c == lease.CodeAccessDenied {
			r.refusedRetry = c
			break
		}
		if err == nil || !stillUnknown(lease.CodeOf(err)) {
			return res, err
		}
		delay = min(2*delay, maxRetryDelay)
	}
	var zero T
	return zero, &lease.Error{Code: lease.CodeOutcomeUnknown, Reason: unknown.Reason}
}

// bare is the caller as the adapter sends it: the API key is the caller,
// only the correlation id travels.
func bare(c lease.Caller) lease.Caller { return lease.Caller{CorrelationID: c.CorrelationID} }

func (r *remoteStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	req.Caller = bare(req.Caller)
	return resolve(ctx, r, func(ctx context.Context) (lease.Result, error) { return r.ls.Acquire(ctx, req) })
}

func (r *remoteStore) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	req.Caller = bare(req.Caller)
	return resolve(ctx, r, func(ctx context.Context) (lease.Result, error) { return r.ls.Renew(ctx, req) })
}

func (r *remoteStore) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	req.Caller = bare(req.Caller)
	return resolve(ctx, r, func(ctx context.Context) (lease.Result, error) { return r.ls.Release(ctx, req) })
}

func (r *remoteStore) ForceRelease(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	req.Caller = bare(req.Caller)
	return resolve(ctx, r, func(ctx context.Context) (lease.Result, error) { return r.ls.ForceRelease(ctx, req) })
}

func (r *remoteStore) Revoke(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	req.Caller = bare(req.Caller)
	return resolve(ctx, r, func(ctx context.Context) (lease.Result, error) { return r.ls.Revoke(ctx, req) })
}

func (r *remoteStore) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	req.Caller = bare(req.Caller)
	return resolve(ctx, r, func(ctx context.Context) (lease.CommitResult, error) { return r.ls.AuthorizeCommit(ctx, req) })
}

func (r *remoteStore) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	req.Caller = bare(req.Caller)
	return r.ls.Inspect(ctx, req)
}

func (r *remoteStore) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	req.Caller = bare(req.Caller)
	return r.ls.List(ctx, req)
}

func (r *remoteStore) History(ctx context.Context, req lease.HistoryRequest) (lease.HistoryResult, error) {
	req.Caller = bare(req.Caller)
	res, err := r.ls.History(ctx, req)
	if lease.CodeOf(err) == lease.CodeNotFound && strings.Contains(lease.AsError(err).Reason, "no active lease") {
		return res, &lease.Error{Code: lease.CodeNotFound, Reason: "the identity has no active lease, and the HTTP API " +
			"reads history by lease id: give --lease-id of any of its leases (active or ended) instead of the identity flags"}
	}
	return res, err
}

// HistoryByLeaseID reads the history of the identity of a lease.
func (r *remoteStore) HistoryByLeaseID(ctx context.Context, leaseID string, req lease.HistoryRequest) (lease.HistoryResult, error) {
	req.Caller = bare(req.Caller)
	return r.ls.HistoryByLeaseID(ctx, leaseID, req)
}

// LookupRequest is refused: the HTTP API has no request-id lookup.
func (r *remoteStore) LookupRequest(context.Context, lease.LookupRequest) (lease.Result, error) {
	return lease.Result{}, errRemoteLookup
}

// Health is never asked by a lease command, and remote mode does not probe
// the server: it fails closed.
func (r *remoteStore) Health(context.Context) lease.Health {
	return lease.Health{Status: lease.HealthUnavailable, Reason: "remote mode does not probe the server; GET /readyz does"}
}

// Close drops the command's idle connections.
func (r *remoteStore) Close() error {
	r.tr.CloseIdleConnections()
	return nil
}

var _ lease.Store = (*remoteStore)(nil)
