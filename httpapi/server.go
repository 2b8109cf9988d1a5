// Package httpapi is the HTTP adapter over package service: routes under
// /api/v1/target-leases, strict JSON decoding, the contract's envelopes and
// status table, correlation ids, health, metrics and the OpenAPI document.
// Every request is authenticated before its body is read or any backend
// work is done.
package httpapi

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
	"github.com/starintel/starlease/wire"
)

// Base is the route prefix of the lease API.
const Base = "/api/v1/target-leases"

//go:embed openapi.json
var openAPIDocument []byte

// Server is the HTTP handler.
type Server struct {
	svc     *service.Service
	authn   *auth.Authenticator
	mux     *http.ServeMux
	now     func() time.Time
	metrics *metrics
	comps   map[string]func(context.Context) ComponentHealth
	// audited are the patterns of the routes wrap serves, each of which
	// audits every request it gets.
	audited map[string]bool
}

// Options configure a Server.
type Options struct {
	// Registry receives the metrics; nil uses a private registry.
	Registry *prometheus.Registry
	// Logger is not used: the server logs nothing of its own (the
	// service logs, through the logger it was given). It stays for the
	// callers that set it.
	Logger *slog.Logger
	// Components report the health of parts of the server besides the
	// lease backend (the outbox relay) on /readyz, by name. A backend
	// with a bounded outbox (lease.OutboxMeter) adds "outbox" itself.
	Components map[string]func(context.Context) ComponentHealth
}

// ComponentHealth is a component's /readyz report. Status is "ok" or
// "degraded"; a degraded component makes /readyz's status "degraded" but
// keeps it 200 while the backend is ok: the lease API still serves, and
// taking the server out of rotation would not help the component.
type ComponentHealth struct {
	Status string         `json:"status"`
	Reason string         `json:"reason,omitempty"`
	Detail map[string]any `json:"detail,omitempty"`
}

// New builds the handler. The audit sink argument is no longer used: the
// service builds, redacts and writes every event, authentication failures
// included (service.Service.AuditAuthFailure); it stays for the callers of
// this signature.
func New(svc *service.Service, authn *auth.Authenticator, _ audit.Sink, o Options) *Server {
	s := &Server{svc: svc, authn: authn, mux: http.NewServeMux(), now: time.Now,
		comps: maps.Clone(o.Components)}
	if meter, ok := svc.Store().(lease.OutboxMeter); ok && s.comps["outbox"] == nil {
		if s.comps == nil {
			s.comps = map[string]func(context.Context) ComponentHealth{}
		}
		s.comps["outbox"] = outboxHealth(meter)
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s.metrics = newMetrics(reg, svc)
	s.audited = map[string]bool{}
	for _, rt := range s.routes() {
		s.mux.Handle(rt.pattern, s.wrap(rt))
		s.audited[rt.pattern] = true
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		corr := correlationID(r)
		w.Header().Set("X-Correlation-ID", corr)
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "correlation_id": corr})
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /api/v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPIDocument)
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		corr := correlationID(r)
		w.Header().Set("X-Correlation-ID", corr)
		writeError(w, &lease.Error{Code: lease.CodeNotFound, Reason: "no such route"}, corr)
	})
	return s
}

// MaxHeaderBytes bounds a request's header block (request line and
// fields); a larger one is 400 invalid_lease_request with field "headers".
const MaxHeaderBytes = 16 << 10

// HTTPServerMaxHeaderBytes is the http.Server.MaxHeaderBytes to serve a
// Server with. It is four times MaxHeaderBytes so that header blocks
// between the two reach the handler and get the envelope; past it (plus
// the 4 KiB net/http reads beyond) net/http answers 431 text/plain itself,
// before any handler runs, and no server can make that the envelope.
const HTTPServerMaxHeaderBytes = 4 * MaxHeaderBytes

// ServeHTTP implements http.Handler. What net/http would answer without
// the envelope once a handler runs is refused here first: a header block
// over MaxHeaderBytes, a Content-Length net/http did not parse, and a path
// that is not clean, which ServeMux would redirect (307) to its cleaned
// form. A refused request to one of the API's routes goes on to it, which
// authenticates it and audits the refusal as that route's, as it does a
// malformed body (refusedBefore); anything else is answered here.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// First, whatever else is wrong: ServeMux would redirect it.
	if p := r.URL.EscapedPath(); p != cleanPath(p) {
		s.refuse(w, r, &lease.Error{Code: lease.CodeNotFound, Reason: "no such route"})
		return
	}
	if err := checkRequest(r); err != nil {
		if _, pattern := s.mux.Handler(r); s.audited[pattern] {
			s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), refusedKey{}, err)))
			return
		}
		s.refuse(w, r, err)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// refuse answers r with err's envelope, before any route.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	corr := correlationID(r)
	w.Header().Set("X-Correlation-ID", corr)
	writeError(w, err, corr)
}

// refusedKey holds, in a request's context, why ServeHTTP refused it.
type refusedKey struct{}

// refusedBefore is why ServeHTTP refused r, or nil.
func refusedBefore(r *http.Request) error {
	err, _ := r.Context().Value(refusedKey{}).(error)
	return err
}

// checkRequest refuses what the routes must not see (see ServeHTTP).
func checkRequest(r *http.Request) error {
	if headerBytes(r) > MaxHeaderBytes {
		return lease.Invalid("headers", fmt.Sprintf("must total at most %d bytes", MaxHeaderBytes))
	}
	// net/http refuses an invalid Content-Length over HTTP/1 itself; a
	// handler called otherwise (HTTP/2 keeps the header and reads 0, a
	// request built in-process) may still see one.
	if cl := r.Header.Values("Content-Length"); r.ContentLength < -1 || len(cl) > 1 ||
		len(cl) == 1 && !validContentLength(cl[0], r.ContentLength) {
		return lease.Invalid("Content-Length", "must be one non-negative integer")
	}
	return nil
}

// headerBytes is the size of r's header block as sent, near enough: the
// request line, Host and every field with its separators.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4 + len("Host: \r\n") + len(r.Host)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

func validContentLength(v string, parsed int64) bool {
	n, err := strconv.ParseUint(v, 10, 63)
	return err == nil && int64(n) == parsed
}

// cleanPath is the path ServeMux would redirect p to (net/http's own
// cleanPath): rooted, without empty, "." or ".." segments, a trailing
// slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// route is one operation of the API: its pattern, its name (metrics) and
// audit event type, and its handler.
type route struct {
	pattern, op string
	event       audit.EventType
	handle      handlerFunc
}

// handlerFunc reads and checks one authenticated request and returns the
// service call that serves it. An error it returns is the request rejected
// before the service, which the adapter audits (with the route's event
// type); from the service call on, the service audits.
type handlerFunc func(r *http.Request, c service.Call) (serviceCall, error)

// serviceCall runs the service and fills the success envelope.
type serviceCall func(ctx context.Context, ok *wire.Success) error

// capabilityOf is the capability check of the administrative operations,
// run right after authentication and before the body is read, in the
// order the authentication boundary gives (credential, principal,
// capability, then scope and the canonical request): a caller without
// targets:force-release learns nothing of how an administrative body is
// validated. Scope needs the body's identity and stays the service's,
// which checks the capability again.
var capabilityOf = map[string]func(auth.Principal) bool{
	"force_release": auth.CanForceRelease, "revoke": auth.CanForceRelease,
}

func (s *Server) routes() []route {
	return []route{
		{"POST " + Base + "/acquire", "acquire", audit.EventAcquire, s.acquire},
		{"POST " + Base + "/{lease_id}/renew", "renew", audit.EventRenew, s.renew},
		{"POST " + Base + "/{lease_id}/release", "release", audit.EventRelease, s.release},
		{"DELETE " + Base + "/{lease_id}", "release", audit.EventRelease, s.release},
		{"POST " + Base + "/{lease_id}/force-release", "force_release", audit.EventForceRelease, s.admin(false)},
		{"POST " + Base + "/{lease_id}/revoke", "revoke", audit.EventRevoke, s.admin(true)},
		{"GET " + Base + "/{lease_id}", "inspect", audit.EventInspect, s.inspectByID},
		{"POST " + Base + "/inspect", "inspect", audit.EventInspect, s.inspect},
		{"GET " + Base, "list", audit.EventList, s.list},
		{"GET " + Base + "/{$}", "list", audit.EventList, s.list},
		{"POST " + Base + "/commits/authorize", "authorize_commit", audit.EventCommitAuthorized, s.authorizeCommit},
		{"GET " + Base + "/{lease_id}/history", "history", audit.EventHistory, s.history},
	}
}

// wrap runs the common request path: correlation id, authentication
// (uniform 401 before anything else), the handler, the envelope, metrics.
func (s *Server) wrap(rt route) http.Handler {
	op := rt.op
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		corr := correlationID(r)
		w.Header().Set("X-Correlation-ID", corr)
		p, failure, err := s.authn.AuthenticateDetail(r.Context(), r.Header.Values("Authorization"))
		if errors.Is(err, auth.ErrUnavailable) {
			// The credential store cannot answer: no safe answer, not a 401.
			e := &lease.Error{Code: lease.CodeBackendUnavailable, Reason: "credential store unavailable"}
			s.svc.AuditRejected(r.Context(), rt.event, service.Call{CorrelationID: corr}, e)
			writeError(w, e, corr)
			s.metrics.observe(op, lease.CodeBackendUnavailable, start)
			return
		}
		if err != nil {
			s.auditAuthFailure(r.Context(), corr, failure, start)
			writeUnauthorized(w, corr)
			s.metrics.observe(op, lease.CodeInvalidCredential, start)
			return
		}
		ok := &wire.Success{Status: "success", CorrelationID: corr}
		c := service.Call{Principal: p, CorrelationID: corr}
		if may := capabilityOf[op]; may != nil && !may(p) {
			e := &lease.Error{Code: lease.CodeAccessDenied, Reason: "capability does not allow this request"}
			s.svc.AuditRejected(r.Context(), rt.event, c, e)
			writeError(w, e, corr)
			s.metrics.observe(op, lease.CodeAccessDenied, start)
			return
		}
		// Credential, capability, then the request (the auth boundary's
		// order), as for a malformed body.
		if err := refusedBefore(r); err != nil {
			s.svc.AuditRejected(r.Context(), rt.event, c, err)
			writeError(w, err, corr)
			s.metrics.observe(op, lease.CodeOf(err), start)
			return
		}
		r = r.WithContext(auth.NewContext(r.Context(), p))
		call, err := rt.handle(r, c)
		if err == nil {
			err = call(r.Context(), ok)
		} else {
			s.svc.AuditRejected(r.Context(), rt.event, c, err)
		}
		if err != nil {
			writeError(w, err, corr)
			s.metrics.observe(op, lease.CodeOf(err), start)
			return
		}
		s.metrics.observe(op, lease.Code(ok.Code), start)
		ok.Code = string(wireCode(lease.Code(ok.Code)))
		writeJSON(w, http.StatusOK, ok)
	})
}

// writeUnauthorized writes the one 401 body every authentication failure
// gets; only the correlation id differs.
func writeUnauthorized(w http.ResponseWriter, corr string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="starlease"`)
	writeJSON(w, http.StatusUnauthorized, wire.Error{Status: "error", Code: string(lease.CodeInvalidCredential),
		Msg: lease.CodeInvalidCredential.Message(), CorrelationID: corr})
}

func (s *Server) auditAuthFailure(ctx context.Context, corr string, f auth.Failure, start time.Time) {
	// The service builds and redacts every event, this one included.
	s.svc.AuditAuthFailure(ctx, corr, f.CredentialID, start)
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	corr := correlationID(r)
	w.Header().Set("X-Correlation-ID", corr)
	h := s.svc.Health(r.Context())
	status := http.StatusOK
	if h.Status != lease.HealthOK {
		status = http.StatusServiceUnavailable
	}
	body := map[string]any{"status": string(h.Status), "reason": h.Reason, "correlation_id": corr}
	if len(s.comps) > 0 {
		comps := map[string]ComponentHealth{}
		for name, f := range s.comps {
			c := f(r.Context())
			comps[name] = c
			if c.Status != string(lease.HealthOK) && h.Status == lease.HealthOK {
				body["status"], body["reason"] = string(lease.HealthDegraded), c.Reason
			}
		}
		body["components"] = comps
	}
	writeJSON(w, status, body)
}

// mutationCall completes c with the request id (body or Idempotency-Key,
// which must agree when both are given) and the deadline (deadline_at or
// X-Request-Timeout-Ms).
func (s *Server) mutationCall(r *http.Request, c service.Call, bodyRequestID, bodyDeadline string) (service.Call, error) {
	keys := r.Header.Values("Idempotency-Key")
	switch {
	case len(keys) > 1:
		return c, lease.Invalid("Idempotency-Key", "give at most one")
	case len(keys) == 1 && bodyRequestID != "" && keys[0] != bodyRequestID:
		return c, lease.Invalid("request_id", "differs from the Idempotency-Key header")
	case len(keys) == 1:
		c.RequestID = keys[0]
	default:
		c.RequestID = bodyRequestID
	}
	if c.RequestID == "" {
		return c, lease.Invalid("request_id", "a request_id or Idempotency-Key is required")
	}
	d, given, err := s.clientDeadline(r, bodyDeadline)
	c.DeadlineAt, c.HasDeadline = d, given
	return c, err
}

// deadline is a deadline without its presence, for requests that take
// only X-Request-Timeout-Ms, which never gives the zero time.
func (s *Server) deadline(r *http.Request, body string) (time.Time, error) {
	d, _, err := s.clientDeadline(r, body)
	return d, err
}

// clientDeadline is the deadline the client gave, and whether it gave one.
func (s *Server) clientDeadline(r *http.Request, body string) (time.Time, bool, error) {
	h := r.Header.Values("X-Request-Timeout-Ms")
	if len(h) > 1 {
		return time.Time{}, false, lease.Invalid("X-Request-Timeout-Ms", "give at most one")
	}
	return parseDeadline(body, strings.Join(h, ""), s.now())
}

func identityOf(id *lease.Identity) (lease.Identity, error) {
	if id == nil {
		return lease.Identity{}, lease.Invalid("lock_identity", "is required")
	}
	return *id, nil
}

func ms(v int64, field string) (time.Duration, error) {
	if v < 0 {
		return 0, lease.Invalid(field, "must not be negative")
	}
	if v > int64(lease.MaxLifetime/time.Millisecond) {
		return 0, lease.Invalid(field, "is too large")
	}
	return time.Duration(v) * time.Millisecond, nil
}

// setLease fills a lease answer.
func setLease(ok *wire.Success, res lease.Result) {
	ok.Code = string(res.Code)
	ok.Lease, ok.Current, ok.Replayed = viewOf(res.Lease), viewOf(res.Current), res.Replayed
}
