package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// BasePath is the route prefix of the lease API.
const BasePath = "/api/v1/target-leases"

// DefaultTimeout is the deadline of a call whose context has none.
const DefaultTimeout = 10 * time.Second

// MaxResponseBytes bounds a response body the client reads.
const MaxResponseBytes = 8 << 20

// maxTimeoutMs is the largest X-Request-Timeout-Ms the server accepts.
const maxTimeoutMs = 24 * 3600 * 1000

const redacted = "[redacted]"

// Client is a client of the lease HTTP API. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	apiKey    string
	hc        *http.Client
	timeout   time.Duration
	userAgent string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send its requests with hc (transport,
// TLS, proxies). The default is a new http.Client without a timeout of
// its own (deadlines come from the call's context) on a transport shared
// by such clients that keeps enough idle connections for concurrent calls.
//
// Whatever hc's redirect policy, the client follows no redirect: net/http
// keeps the Authorization header on a redirect to the same host name, even
// to another port or from https to http, so a redirect could hand the API
// key to another listener or send it in clear text. A 3xx answer is an
// error (see Client.do).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			own := *hc
			c.hc = &own
		}
	}
}

// defaultTransport is the transport of a client made without
// WithHTTPClient, shared by all of them: http.DefaultTransport's settings,
// but keeping up to maxIdleConnsPerHost idle connections to a server
// instead of net/http's 2, so that concurrent callers of one Client reuse
// their connections rather than open and close one per call (a new TCP
// connection each, and TIME_WAIT sockets piling up) once more than two
// calls are in flight.
var defaultTransport http.RoundTripper = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = max(t.MaxIdleConns, maxIdleConnsPerHost)
	t.MaxIdleConnsPerHost = maxIdleConnsPerHost
	return t
}()

// maxIdleConnsPerHost is how many idle connections defaultTransport keeps
// to one server.
const maxIdleConnsPerHost = 256

// noRedirect makes an http.Client return a redirect as the answer.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// WithTimeout sets the deadline of a call whose context has none; zero or
// negative means no deadline (the server then applies its default).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a client of the server at baseURL (scheme, host and an
// optional path prefix, e.g. "http://127.0.0.1:8080") authenticating with
// apiKey. Errors never contain the key.
func New(baseURL string, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	switch {
	case err != nil:
		return nil, errors.New("client: base URL does not parse")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("client: base URL must be http or https")
	case u.Host == "":
		return nil, errors.New("client: base URL needs a host")
	case u.User != nil:
		return nil, errors.New("client: base URL must not carry user information")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, errors.New("client: base URL must not carry a query or fragment")
	}
	if apiKey == "" {
		return nil, errors.New("client: an API key is required")
	}
	for i := 0; i < len(apiKey); i++ {
		if apiKey[i] <= ' ' || apiKey[i] >= 0x7f {
			return nil, errors.New("client: the API key holds characters a header cannot carry")
		}
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	c := &Client{base: u, apiKey: apiKey, hc: &http.Client{Transport: defaultTransport}, timeout: DefaultTimeout, userAgent: "starlease-client/1"}
	for _, o := range opts {
		o(c)
	}
	c.hc.CheckRedirect = noRedirect
	return c, nil
}

// String describes the client without its API key.
func (c Client) String() string {
	base := "<nil>"
	if c.base != nil {
		base = c.base.String()
	}
	return "starlease client " + base + " (api key " + redacted + ")"
}

// GoString is String: the key never appears under %#v.
func (c Client) GoString() string { return c.String() }

// Format writes String under every verb.
func (c Client) Format(f fmt.State, _ rune) { io.WriteString(f, c.String()) }

// MarshalJSON writes String, never the key.
func (c Client) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

type correlationKey struct{}

// ContextWithCorrelationID returns ctx carrying a correlation id sent as
// X-Correlation-ID with every request made with it. The server honours a
// well-formed id and replaces any other.
func ContextWithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey{}, id)
}

// NewRequestID returns a fresh request id: "req_" and a ULID.
func NewRequestID() string { return "req_" + ulid.MustNew(ulid.Now(), rand.Reader).String() }

// call describes one request.
type call struct {
	method string
	path   string // after BasePath, already escaped
	query  url.Values
	body   any
	// mutation: a failure after the request was sent is outcome-unknown.
	mutation bool
	// bodyDeadline: the body names deadline_at, so no header is sent.
	bodyDeadline bool
	requestID    string
	// accept reports whether a success code answers this call.
	accept func(lease.Code) bool
}

func codes(cs ...lease.Code) func(lease.Code) bool {
	return func(c lease.Code) bool {
		for _, x := range cs {
			if c == x {
				return true
			}
		}
		return false
	}
}

// do sends cl and decodes a success answer into out (a *wire.Success).
func (c *Client) do(ctx context.Context, cl call, out *wire.Success) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if _, ok := ctx.Deadline(); !ok && c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	var body io.Reader
	if cl.body != nil {
		b, err := json.Marshal(cl.body)
		if err != nil {
			return &Error{Code: lease.CodeInvalidRequest, Field: "body", Msg: "request cannot be encoded", RequestID: cl.requestID, Err: err}
		}
		body = bytes.NewReader(b)
	}
	target := c.base.String() + BasePath + cl.path
	if len(cl.query) > 0 {
		target += "?" + cl.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, target, body)
	if err != nil {
		return &Error{Code: lease.CodeInvalidRequest, Msg: "request cannot be built", RequestID: cl.requestID, Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json")
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if id, ok := ctx.Value(correlationKey{}).(string); ok && id != "" {
		req.Header.Set("X-Correlation-ID", id)
	}
	if dl, ok := ctx.Deadline(); ok && !cl.bodyDeadline {
		left := time.Until(dl)
		if left.Milliseconds() <= 0 {
			return &Error{Code: lease.CodeDeadlineExceeded, Msg: "deadline elapsed before the request was sent",
				Retryable: true, RequestID: cl.requestID, Err: context.DeadlineExceeded}
		}
		req.Header.Set("X-Request-Timeout-Ms", strconv.FormatInt(serverTimeoutMs(left), 10))
	}
	var sent atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { sent.Store(true) },
	}))
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError(ctx, cl, sent.Load(), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return transportError(ctx, cl, true, err)
	}
	if len(b) > MaxResponseBytes {
		return malformed(cl, resp, "response body too large", nil)
	}
	if resp.StatusCode == http.StatusOK {
		return decodeSuccess(cl, resp, b, out)
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return malformed(cl, resp, fmt.Sprintf("the server answered a redirect (%d); the client follows none, so the API key never leaves for another address", resp.StatusCode), nil)
	}
	return decodeError(cl, resp, b)
}

// serverTimeoutMs is the X-Request-Timeout-Ms for a call with left until
// its deadline: a little less (a tenth, at most 500 ms), so that the
// server's own answer at its deadline (deadline_exceeded: nothing started;
// outcome_unknown: resolve by request id) arrives before the client gives
// up and can only say outcome-unknown.
func serverTimeoutMs(left time.Duration) int64 {
	ms := (left - min(left/10, 500*time.Millisecond)).Milliseconds()
	return min(max(ms, 1), maxTimeoutMs)
}

// transportError classifies a failure without a readable answer.
func transportError(ctx context.Context, cl call, sent bool, err error) *Error {
	e := &Error{RequestID: cl.requestID, Err: err}
	switch {
	case !sent && (errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)):
		e.Code, e.Msg = lease.CodeDeadlineExceeded, "deadline elapsed before the request was sent"
	case !sent:
		e.Code, e.Msg = lease.CodeBackendUnavailable, "the request could not be sent; nothing was done"
	case cl.mutation:
		e.Code, e.Msg = lease.CodeOutcomeUnknown, "no answer after the request was sent; resolve by retrying with the same request id"
	default:
		e.Code, e.Msg = lease.CodeBackendUnavailable, "no answer from the server"
	}
	e.Retryable = e.Code.Retryable()
	return e
}

// malformed is the error of an answer the client cannot trust: for a
// mutation the server may have acted, so it is outcome-unknown.
func malformed(cl call, resp *http.Response, why string, cause error) *Error {
	e := &Error{Status: resp.StatusCode, Msg: "malformed response: " + why, RequestID: cl.requestID,
		CorrelationID: headerCorrelation(resp), Err: cause}
	e.Code = lease.CodeBackendUnavailable
	if cl.mutation {
		e.Code = lease.CodeOutcomeUnknown
	}
	e.Retryable = e.Code.Retryable()
	return e
}

func headerCorrelation(resp *http.Response) string {
	if v := resp.Header.Values("X-Correlation-ID"); len(v) == 1 {
		return v[0]
	}
	return ""
}

func decodeSuccess(cl call, resp *http.Response, b []byte, out *wire.Success) error {
	if err := decodeStrict(b, out); err != nil {
		return malformed(cl, resp, "success body does not decode strictly", err)
	}
	switch {
	case out.Status != "success":
		return malformed(cl, resp, "status is not success", nil)
	case !lease.Code(out.Code).Known() || !lease.Code(out.Code).Success() || !cl.accept(lease.Code(out.Code)):
		return malformed(cl, resp, "unexpected code "+strconv.Quote(string(out.Code)), nil)
	case out.CorrelationID == "":
		return malformed(cl, resp, "no correlation_id", nil)
	}
	return nil
}

func decodeError(cl call, resp *http.Response, b []byte) error {
	var w wire.Error
	if err := decodeStrict(b, &w); err != nil {
		return malformed(cl, resp, "error body does not decode strictly", err)
	}
	switch {
	case w.Status != "error":
		return malformed(cl, resp, "status is not error", nil)
	case !lease.Code(w.Code).Known() || lease.Code(w.Code).Success():
		return malformed(cl, resp, "unknown error code", nil)
	case w.CorrelationID == "":
		return malformed(cl, resp, "no correlation_id", nil)
	case w.RetryAfterMs != nil && *w.RetryAfterMs < 0:
		return malformed(cl, resp, "negative retry_after_ms", nil)
	}
	code := lease.Code(w.Code)
	if want, ok := StatusOf(code); ok && want != resp.StatusCode {
		return malformed(cl, resp, fmt.Sprintf("code %s with status %d", w.Code, resp.StatusCode), nil)
	}
	e := &Error{Status: resp.StatusCode, Code: code, Msg: w.Msg, Field: w.Field, CorrelationID: w.CorrelationID,
		Retryable: w.Retryable, RequestID: cl.requestID}
	if w.RetryAfterMs != nil {
		e.RetryAfter = time.Duration(*w.RetryAfterMs) * time.Millisecond
	}
	return e
}

// StatusOf is the HTTP status of a wire code in the contract's table
// (and 404 for lease_not_found); ok is false for codes the table does not
// name.
func StatusOf(c lease.Code) (status int, ok bool) {
	switch c {
	case lease.CodeAcquired, lease.CodeRenewed, lease.CodeReleased, lease.CodeInspected, lease.CodeListed, lease.CodeRevoked:
		return http.StatusOK, true
	case lease.CodeInvalidRequest:
		return http.StatusBadRequest, true
	case lease.CodeInvalidCredential:
		return http.StatusUnauthorized, true
	case lease.CodeAccessDenied:
		return http.StatusForbidden, true
	case lease.CodeNotFound:
		return http.StatusNotFound, true
	case lease.CodeDeadlineExceeded:
		return http.StatusRequestTimeout, true
	case lease.CodeConflict, lease.CodeLost, lease.CodeIdempotencyConflict:
		return http.StatusConflict, true
	case lease.CodeRateLimited:
		return http.StatusTooManyRequests, true
	case lease.CodeBackendUnavailable, lease.CodeOutcomeUnknown:
		return http.StatusServiceUnavailable, true
	}
	return 0, false
}

// leasePath is "/" and the escaped lease id, then suffix.
func leasePath(leaseID, suffix string) (string, error) {
	if leaseID == "" {
		return "", &Error{Code: lease.CodeInvalidRequest, Field: "lease_id", Msg: "a lease id is required"}
	}
	return "/" + url.PathEscape(leaseID) + suffix, nil
}

// Acquire asks for a lease (POST /acquire). An empty RequestID is replaced
// by a fresh one, reported in the result or error.
func (c *Client) Acquire(ctx context.Context, req AcquireRequest) (*LeaseResult, error) {
	if req.RequestID == "" {
		req.RequestID = NewRequestID()
	}
	body, err := req.body()
	if err != nil {
		return nil, &Error{Code: lease.CodeInvalidRequest, Field: "metadata", Msg: "metadata cannot be encoded", RequestID: req.RequestID, Err: err}
	}
	return c.leaseCall(ctx, call{method: http.MethodPost, path: "/acquire", body: body, mutation: true,
		bodyDeadline: !req.DeadlineAt.IsZero(), requestID: req.RequestID, accept: codes(lease.CodeAcquired)})
}

// Renew extends a held lease (POST /{lease_id}/renew).
func (c *Client) Renew(ctx context.Context, req RenewRequest) (*LeaseResult, error) {
	if req.RequestID == "" {
		req.RequestID = NewRequestID()
	}
	p, err := leasePath(req.LeaseID, "/renew")
	if err != nil {
		return nil, err
	}
	return c.leaseCall(ctx, call{method: http.MethodPost, path: p, body: req.body(), mutation: true,
		bodyDeadline: !req.DeadlineAt.IsZero(), requestID: req.RequestID, accept: codes(lease.CodeRenewed)})
}

// Release ends a held lease (POST /{lease_id}/release).
func (c *Client) Release(ctx context.Context, req ReleaseRequest) (*LeaseResult, error) {
	if req.RequestID == "" {
		req.RequestID = NewRequestID()
	}
	p, err := leasePath(req.LeaseID, "/release")
	if err != nil {
		return nil, err
	}
	return c.leaseCall(ctx, call{method: http.MethodPost, path: p, body: req.body(), mutation: true,
		bodyDeadline: !req.DeadlineAt.IsZero(), requestID: req.RequestID, accept: codes(lease.CodeReleased)})
}

// ForceRelease ends the observed lease as an administrator
// (POST /{lease_id}/force-release); a reason or incident id is required.
// The wire code of success is lease_released.
func (c *Client) ForceRelease(ctx context.Context, req AdminRequest) (*LeaseResult, error) {
	return c.admin(ctx, req, "/force-release", codes(lease.CodeReleased, lease.CodeForceReleased))
}

// Revoke ends the observed lease with the security terminal state
// (POST /{lease_id}/revoke); a reason or incident id is required.
func (c *Client) Revoke(ctx context.Context, req AdminRequest) (*LeaseResult, error) {
	return c.admin(ctx, req, "/revoke", codes(lease.CodeRevoked))
}

func (c *Client) admin(ctx context.Context, req AdminRequest, suffix string, accept func(lease.Code) bool) (*LeaseResult, error) {
	if req.RequestID == "" {
		req.RequestID = NewRequestID()
	}
	p, err := leasePath(req.LeaseID, suffix)
	if err != nil {
		return nil, err
	}
	return c.leaseCall(ctx, call{method: http.MethodPost, path: p, body: req.body(), mutation: true,
		bodyDeadline: !req.DeadlineAt.IsZero(), requestID: req.RequestID, accept: accept})
}

// Inspect reads the lease of a lock identity (POST /inspect).
func (c *Client) Inspect(ctx context.Context, id lease.Identity) (*LeaseResult, error) {
	return c.leaseCall(ctx, call{method: http.MethodPost, path: "/inspect", body: wire.InspectRequest{LockIdentity: &id},
		accept: codes(lease.CodeInspected)})
}

// Get reads a lease by id within the caller's scope (GET /{lease_id}).
func (c *Client) Get(ctx context.Context, leaseID string) (*LeaseResult, error) {
	p, err := leasePath(leaseID, "")
	if err != nil {
		return nil, err
	}
	return c.leaseCall(ctx, call{method: http.MethodGet, path: p, accept: codes(lease.CodeInspected)})
}

func (c *Client) leaseCall(ctx context.Context, cl call) (*LeaseResult, error) {
	var w wire.Success
	if err := c.do(ctx, cl, &w); err != nil {
		return nil, err
	}
	if w.Lease == nil || w.Leases != nil || w.History != nil || w.Commit != nil || w.NextPageToken != nil {
		return nil, &Error{Status: http.StatusOK, Code: malformedCode(cl), Msg: "malformed response: a lease answer needs exactly a lease",
			CorrelationID: w.CorrelationID, RequestID: cl.requestID, Retryable: true}
	}
	res := &LeaseResult{Code: lease.Code(w.Code), CorrelationID: w.CorrelationID, RequestID: cl.requestID, Replayed: w.Replayed}
	var err error
	if res.Lease, err = leaseOf(w.Lease); err != nil {
		return nil, &Error{Status: http.StatusOK, Code: malformedCode(cl), Msg: "malformed response: " + err.Error(),
			CorrelationID: w.CorrelationID, RequestID: cl.requestID, Retryable: true}
	}
	if w.Current != nil {
		cur, err := leaseOf(w.Current)
		if err != nil {
			return nil, &Error{Status: http.StatusOK, Code: malformedCode(cl), Msg: "malformed response: current " + err.Error(),
				CorrelationID: w.CorrelationID, RequestID: cl.requestID, Retryable: true}
		}
		res.Current = &cur
	}
	return res, nil
}

func malformedCode(cl call) lease.Code {
	if cl.mutation {
		return lease.CodeOutcomeUnknown
	}
	return lease.CodeBackendUnavailable
}

// List pages through leases (GET /?…): by owner (OwnerPrincipalID), by
// target (TenantID, ProgramID, TargetNamespace, TargetID) or by program
// (TenantID, ProgramID). Pass the result's NextPageToken as PageToken for
// the next page; an empty NextPageToken is the last page.
func (c *Client) List(ctx context.Context, req ListRequest) (*ListResult, error) {
	q := url.Values{}
	for _, kv := range [][2]string{{"owner_principal_id", req.OwnerPrincipalID}, {"tenant_id", req.TenantID},
		{"program_id", req.ProgramID}, {"target_namespace", req.TargetNamespace}, {"target_id", req.TargetID},
		{"page_token", req.PageToken}} {
		if kv[1] != "" {
			q.Set(kv[0], kv[1])
		}
	}
	if req.PageSize != 0 {
		q.Set("page_size", strconv.Itoa(req.PageSize))
	}
	cl := call{method: http.MethodGet, path: "", query: q, accept: codes(lease.CodeListed)}
	var w wire.Success
	if err := c.do(ctx, cl, &w); err != nil {
		return nil, err
	}
	bad := func(why string) error {
		return &Error{Status: http.StatusOK, Code: lease.CodeBackendUnavailable, Msg: "malformed response: " + why,
			CorrelationID: w.CorrelationID, Retryable: true}
	}
	if w.Lease != nil || w.Current != nil || w.History != nil || w.Commit != nil || w.NextPageToken == nil {
		return nil, bad("a list answer needs exactly leases and next_page_token")
	}
	res := &ListResult{Code: lease.Code(w.Code), CorrelationID: w.CorrelationID, NextPageToken: *w.NextPageToken, Leases: []Lease{}}
	for i := range w.Leases {
		l, err := leaseOf(&w.Leases[i])
		if err != nil {
			return nil, bad(err.Error())
		}
		res.Leases = append(res.Leases, l)
	}
	return res, nil
}

// History pages through the terminal history of a lease's identity
// (GET /{lease_id}/history; audit:read).
func (c *Client) History(ctx context.Context, leaseID string, pageSize int, pageToken string) (*HistoryResult, error) {
	p, err := leasePath(leaseID, "/history")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if pageSize != 0 {
		q.Set("page_size", strconv.Itoa(pageSize))
	}
	if pageToken != "" {
		q.Set("page_token", pageToken)
	}
	cl := call{method: http.MethodGet, path: p, query: q, accept: codes(lease.CodeListed, lease.CodeHistory)}
	var w wire.Success
	if err := c.do(ctx, cl, &w); err != nil {
		return nil, err
	}
	bad := func(why string) error {
		return &Error{Status: http.StatusOK, Code: lease.CodeBackendUnavailable, Msg: "malformed response: " + why,
			CorrelationID: w.CorrelationID, Retryable: true}
	}
	if w.Lease != nil || w.Current != nil || w.Leases != nil || w.Commit != nil || w.NextPageToken == nil {
		return nil, bad("a history answer needs exactly history and next_page_token")
	}
	res := &HistoryResult{Code: lease.Code(w.Code), CorrelationID: w.CorrelationID, NextPageToken: *w.NextPageToken, History: []HistoryEntry{}}
	for i := range w.History {
		h := w.History[i]
		l, err := leaseOf(&h.Lease)
		if err != nil || h.EndedAt.IsZero() {
			return nil, bad("history entry incomplete")
		}
		res.History = append(res.History, HistoryEntry{Lease: l, EndedAt: h.EndedAt.Time(), Reason: h.Reason, IncidentID: h.IncidentID})
	}
	return res, nil
}

// AuthorizeCommit asks the fenced-write boundary to accept a commit under
// a held lease (POST /commits/authorize). It records the accepted commit,
// so a failure after sending is outcome-unknown like a mutation's. The
// answer's lock_key must be the canonical lock key of req.LockIdentity
// (Commit.LockKey, what a guard carries); any other is a malformed answer.
func (c *Client) AuthorizeCommit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	body, err := req.body()
	if err != nil {
		return nil, &Error{Code: lease.CodeInvalidRequest, Field: "outbox.headers", Msg: "the publication cannot be encoded", Err: err}
	}
	cl := call{method: http.MethodPost, path: "/commits/authorize", body: body, mutation: true,
		accept: codes(lease.CodeInspected)}
	var w wire.Success
	if err := c.do(ctx, cl, &w); err != nil {
		return nil, err
	}
	cm := w.Commit
	if cm == nil || w.Lease != nil || w.Current != nil || w.Leases != nil || w.History != nil || w.NextPageToken != nil ||
		cm.AcceptedAt.IsZero() || cm.BackendTime.IsZero() || cm.FencingToken == 0 || cm.LeaseID == "" || cm.Target == "" || cm.JobID == "" || cm.CommitSeq < 1 {
		return nil, &Error{Status: http.StatusOK, Code: lease.CodeOutcomeUnknown, Msg: "malformed response: a commit answer needs exactly a commit",
			CorrelationID: w.CorrelationID, Retryable: true}
	}
	// A guard carries the lock key: one that is not the identity's own
	// would guard another lease's writes, so the answer is refused.
	if key, err := lockKeyOf(req.LockIdentity); err != nil || cm.LockKey != key {
		return nil, &Error{Status: http.StatusOK, Code: lease.CodeOutcomeUnknown, Msg: "malformed response: the commit's lock_key is not the requested identity's",
			CorrelationID: w.CorrelationID, Retryable: true}
	}
	return &CommitResult{Code: lease.Code(w.Code), CorrelationID: w.CorrelationID, Replayed: w.Replayed, Commit: Commit{
		LockKey: cm.LockKey, Sink: cm.Sink, CommitID: cm.CommitID, LeaseID: cm.LeaseID, FencingToken: cm.FencingToken,
		ExecutionID: cm.ExecutionID, JobID: cm.JobID, TraceID: cm.TraceID, Target: cm.Target, PayloadSHA256: cm.PayloadSHA256,
		CommitSeq: cm.CommitSeq, AcceptedAt: cm.AcceptedAt.Time(), BackendTime: cm.BackendTime.Time(),
	}}, nil
}

// lockKeyOf is the canonical lock key of an identity the client sent, by
// the server's own key function. The server checked the operation class
// against its configured set, which the client does not know: here the set
// holds just that class.
func lockKeyOf(id lease.Identity) (string, error) {
	classes := lease.DefaultOperationClasses()
	if oc, err := lease.NormalizeIdentifier("operation_class", id.OperationClass); err == nil {
		if c, err := lease.NewOperationClasses(oc); err == nil {
			classes = c
		}
	}
	_, key, err := lease.CanonicalLockKey(id, classes)
	return key, err
}
