"""The HTTP client of the lease API (standard library only).

Every mutation carries a request id (generated when the caller gives
none). When the outcome of a mutation is unknown (no answer after the
request was sent, a malformed answer, ``lease_outcome_unknown``) or the
service was unavailable, the client sends the same body with the same
request id again, with backoff, until the outcome is known or the call's
deadline passes; only then does it raise :class:`OutcomeUnknown`, carrying
the request id to retry with later. A commit authorization is keyed by its
commit id the same way.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import http.client
import json
import random
import secrets
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from . import errors as E
from .model import (
    Commit,
    CommitResult,
    HistoryEntry,
    HistoryResult,
    Lease,
    LeaseResult,
    ListResult,
    LockIdentity,
    WireError,
    leases,
    parse_time,
)

BASE_PATH = "/api/v1/target-leases"
DEFAULT_TIMEOUT = 10.0
MAX_RESPONSE_BYTES = 8 << 20
MAX_SERVER_TIMEOUT_MS = 24 * 3600 * 1000
#: The largest publication body the outbox accepts (bytes, before base64).
MAX_OUTBOX_BODY = 64 << 10

#: Every operation of the API (its OpenAPI operationId) with its method,
#: path and the Client method that performs it. A test checks this table
#: against httpapi/openapi.json, so the client covers the whole API.
ROUTES: Dict[str, Tuple[str, str, str]] = {
    "acquire": ("POST", BASE_PATH + "/acquire", "acquire"),
    "renew": ("POST", BASE_PATH + "/{lease_id}/renew", "renew"),
    "release": ("POST", BASE_PATH + "/{lease_id}/release", "release"),
    "releaseByDelete": ("DELETE", BASE_PATH + "/{lease_id}", "release_by_delete"),
    "get": ("GET", BASE_PATH + "/{lease_id}", "get"),
    "forceRelease": ("POST", BASE_PATH + "/{lease_id}/force-release", "force_release"),
    "revoke": ("POST", BASE_PATH + "/{lease_id}/revoke", "revoke"),
    "inspect": ("POST", BASE_PATH + "/inspect", "inspect"),
    "list": ("GET", BASE_PATH, "list"),
    "authorizeCommit": ("POST", BASE_PATH + "/commits/authorize", "authorize_commit"),
    "history": ("GET", BASE_PATH + "/{lease_id}/history", "history"),
    "healthz": ("GET", "/healthz", "healthz"),
    "readyz": ("GET", "/readyz", "readyz"),
    "metrics": ("GET", "/metrics", "metrics"),
    "openapi": ("GET", "/api/v1/openapi.json", "openapi"),
}

_correlation: contextvars.ContextVar[str] = contextvars.ContextVar("starlease_correlation_id", default="")


@contextlib.contextmanager
def correlation(correlation_id: str) -> Iterator[None]:
    """Sends ``correlation_id`` as X-Correlation-ID with every request made
    inside the block (by any client, in this thread or task). The server
    honours a well-formed id and replaces any other; results and errors
    carry the id it used."""
    tok = _correlation.set(correlation_id)
    try:
        yield
    finally:
        _correlation.reset(tok)


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_request_id() -> str:
    """A fresh request id: ``req_`` and a ULID (time-ordered, random).

    Never secret-shaped: the server refuses an id holding ``star_sk_``,
    and writes one holding 64 hex digits in a row to audit events and logs
    only in its redacted form."""
    n = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "req_" + "".join(_CROCKFORD[(n >> s) & 31] for s in range(125, -1, -5))


def payload_sha256(body: bytes) -> str:
    """The payload digest of a write: hex SHA-256 of its bytes, as every
    sink and the outbox compute it."""
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class OutboxMessage:
    """A fenced publication: the server appends it to its outbox in the
    same atomic step as the lease check, and its relay publishes it.

    ``headers`` are application headers (names starting ``x-starintel-``
    are the relay's fence headers and refused)."""

    routing_key: str
    body: bytes
    exchange: str = ""
    content_type: str = ""
    headers: Optional[Mapping[str, str]] = None

    def to_wire(self) -> Dict[str, Any]:
        if not isinstance(self.body, (bytes, bytearray)):
            raise E.InvalidRequest("the publication body must be bytes", field="outbox.body")
        out: Dict[str, Any] = {"routing_key": self.routing_key, "body": base64.b64encode(bytes(self.body)).decode("ascii")}
        if self.exchange:
            out["exchange"] = self.exchange
        if self.content_type:
            out["content_type"] = self.content_type
        if self.headers:
            out["headers"] = dict(self.headers)
        return out


@dataclass
class _Call:
    method: str
    path: str
    body: Optional[Dict[str, Any]] = None
    query: Optional[Dict[str, str]] = None
    mutation: bool = False
    request_id: str = ""
    headers: Optional[Dict[str, str]] = None
    accept: Tuple[str, ...] = ()
    raw: bool = False


class Client:
    """A client of the lease HTTP API. Safe to share between threads.

    Args:
        base_url: scheme, host and port (and an optional path prefix), e.g.
            ``http://127.0.0.1:8080``.
        api_key: the ``star_sk_v1_...`` key. It travels only in the
            Authorization header; ``repr``, errors and logs never show it.
        timeout: the default deadline of a call in seconds, retries of an
            unknown outcome included.
        user_agent: the User-Agent header.
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT,
                 user_agent: str = "starlease-python/1", ssl_context: Optional[ssl.SSLContext] = None) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("starlease: base URL must be http(s)://host[:port]")
        if u.username or u.password or u.query or u.fragment:
            raise ValueError("starlease: base URL must not carry user information, a query or a fragment")
        if not api_key or any(c <= " " or c >= "\x7f" for c in api_key):
            raise ValueError("starlease: an API key of printable ASCII is required")
        self._scheme, self._host, self._port = u.scheme, u.hostname, u.port
        self._prefix = u.path.rstrip("/")
        self._key = api_key
        self.timeout = timeout
        self._ua = user_agent
        self._ssl = ssl_context

    def __repr__(self) -> str:
        return "<starlease.Client %s://%s:%s (api key [redacted])>" % (self._scheme, self._host, self._port)

    __str__ = __repr__

    # --- lease operations ---------------------------------------------

    def acquire(self, identity: LockIdentity, *, ttl: float, service_instance_id: str, execution_id: str,
                job_id: str, trace_id: str = "", metadata: Optional[Mapping[str, Any]] = None,
                maximum_lifetime: Optional[float] = None, wait: Optional[float] = None,
                request_id: Optional[str] = None, timeout: Optional[float] = None) -> LeaseResult:
        """Asks for a lease on ``identity`` (POST /acquire).

        ``ttl``, ``maximum_lifetime`` and ``wait`` are seconds; ``wait`` asks
        the server to retry a conflict for that long. Raises
        :class:`LeaseConflict` while another lease holds the identity."""
        body: Dict[str, Any] = {
            "lock_identity": identity.to_wire(),
            "ttl_ms": _ms(ttl, "ttl_ms"),
            "service_instance_id": service_instance_id,
            "execution_id": execution_id,
            "job_id": job_id,
        }
        if trace_id:
            body["trace_id"] = trace_id
        if metadata:
            body["metadata"] = dict(metadata)
        if maximum_lifetime:
            body["maximum_lifetime_ms"] = _ms(maximum_lifetime, "maximum_lifetime_ms")
        if wait:
            body["wait_ms"] = _ms(wait, "wait_ms")
        return self._mutate(_Call("POST", BASE_PATH + "/acquire", body, accept=("lease_acquired",)), request_id, timeout)

    def renew(self, lease: Lease, *, service_instance_id: str, ttl: Optional[float] = None,
              request_id: Optional[str] = None, timeout: Optional[float] = None) -> LeaseResult:
        """Extends a held lease (POST /{lease_id}/renew). ``ttl`` None keeps
        the lease's TTL. Raises :class:`LeaseLost` when it is not held."""
        body = _held(lease, service_instance_id)
        if ttl:
            body["ttl_ms"] = _ms(ttl, "ttl_ms")
        return self._mutate(_Call("POST", _lease_path(lease.lease_id, "/renew"), body, accept=("lease_renewed",)),
                            request_id, timeout)

    def release(self, lease: Lease, *, service_instance_id: str, request_id: Optional[str] = None,
                timeout: Optional[float] = None) -> LeaseResult:
        """Ends a held lease (POST /{lease_id}/release)."""
        return self._mutate(_Call("POST", _lease_path(lease.lease_id, "/release"), _held(lease, service_instance_id),
                                  accept=("lease_released",)), request_id, timeout)

    def release_by_delete(self, lease: Lease, *, service_instance_id: str, request_id: Optional[str] = None,
                          timeout: Optional[float] = None) -> LeaseResult:
        """Ends a held lease (DELETE /{lease_id}), the request id in the
        Idempotency-Key header."""
        c = _Call("DELETE", _lease_path(lease.lease_id, ""), _held(lease, service_instance_id), accept=("lease_released",))
        return self._mutate(c, request_id, timeout, id_header=True)

    def force_release(self, lease: Lease, *, reason: str = "", incident_id: str = "",
                      request_id: Optional[str] = None, timeout: Optional[float] = None) -> LeaseResult:
        """Ends the observed lease as an administrator
        (POST /{lease_id}/force-release); a reason or incident id is
        required and audited."""
        return self._mutate(_Call("POST", _lease_path(lease.lease_id, "/force-release"),
                                  _admin(lease, reason, incident_id), accept=("lease_released",)),
                            request_id, timeout)

    def revoke(self, lease: Lease, *, reason: str = "", incident_id: str = "",
               request_id: Optional[str] = None, timeout: Optional[float] = None) -> LeaseResult:
        """Ends the observed lease with the security terminal state
        (POST /{lease_id}/revoke); a reason or incident id is required."""
        return self._mutate(_Call("POST", _lease_path(lease.lease_id, "/revoke"), _admin(lease, reason, incident_id),
                                  accept=("lease_revoked",)), request_id, timeout)

    def get(self, lease_id: str, *, timeout: Optional[float] = None) -> LeaseResult:
        """Reads a lease by id within the caller's scope (GET /{lease_id})."""
        return self._lease_result(self._do(_Call("GET", _lease_path(lease_id, ""), accept=("lease_inspected",)),
                                           timeout), "")

    def inspect(self, identity: LockIdentity, *, timeout: Optional[float] = None) -> LeaseResult:
        """Reads the lease of a lock identity (POST /inspect); raises
        :class:`LeaseNotFound` when none is active."""
        c = _Call("POST", BASE_PATH + "/inspect", {"lock_identity": identity.to_wire()}, accept=("lease_inspected",))
        return self._lease_result(self._do(c, timeout), "")

    def list(self, *, owner_principal_id: str = "", tenant_id: str = "", program_id: str = "",
             target_namespace: str = "", target_id: str = "", page_size: int = 0, page_token: str = "",
             timeout: Optional[float] = None) -> ListResult:
        """Lists active leases (GET /) by owner, by target (all four target
        fields) or by program (tenant and program)."""
        q = {k: v for k, v in (("owner_principal_id", owner_principal_id), ("tenant_id", tenant_id),
                               ("program_id", program_id), ("target_namespace", target_namespace),
                               ("target_id", target_id), ("page_token", page_token)) if v}
        if page_size:
            q["page_size"] = str(page_size)
        w, corr = self._do(_Call("GET", BASE_PATH, query=q, accept=("lease_listed",)), timeout)
        return _decoded(lambda: ListResult(w["code"], corr, tuple(leases(w.get("leases", []), "leases")),
                                           _opt_str(w, "next_page_token")), False, "")

    def history(self, lease_id: str, *, page_size: int = 0, page_token: str = "",
                timeout: Optional[float] = None) -> HistoryResult:
        """Reads the terminal history of the lease's identity
        (GET /{lease_id}/history)."""
        q = {"page_token": page_token} if page_token else {}
        if page_size:
            q["page_size"] = str(page_size)
        w, corr = self._do(_Call("GET", _lease_path(lease_id, "/history"), query=q, accept=("lease_listed",)), timeout)

        def build() -> HistoryResult:
            entries = []
            for h in w.get("history") or []:
                ended = h.get("ended_at")
                entries.append(HistoryEntry(Lease.from_wire({k: v for k, v in h.items()
                                                             if k not in ("ended_at", "reason", "incident_id")}),
                                            parse_time(ended, "ended_at") if ended else None,
                                            _opt_str(h, "reason"), _opt_str(h, "incident_id")))
            return HistoryResult(w["code"], corr, tuple(entries), _opt_str(w, "next_page_token"))

        return _decoded(build, False, "")

    def authorize_commit(self, lease: Lease, *, service_instance_id: str, execution_id: str, job_id: str,
                         sink: str, commit_id: str, target: str = "", payload_sha256: str = "",
                         outbox: Optional[OutboxMessage] = None, trace_id: str = "",
                         timeout: Optional[float] = None) -> CommitResult:
        """Authorizes exactly one write under ``lease``
        (POST /commits/authorize): ``target`` and ``payload_sha256`` name
        it, or ``outbox`` is the write (a fenced publication). The commit id
        is the idempotency key: a retry with the same write answers the
        first acceptance (``replayed``); another write under it is
        :class:`IdempotencyConflict`. Raises :class:`LeaseLost` when the
        lease is not held at backend time (nothing is authorized and
        nothing enters the outbox)."""
        body: Dict[str, Any] = {
            "lock_identity": lease.lock_identity.to_wire(),
            "lease_id": lease.lease_id,
            "fencing_token": lease.fencing_token,
            "service_instance_id": service_instance_id,
            "sink": sink,
            "commit_id": commit_id,
            "execution_id": execution_id,
            "job_id": job_id,
        }
        if trace_id:
            body["trace_id"] = trace_id
        if target:
            body["target"] = target
        if payload_sha256:
            body["payload_sha256"] = payload_sha256
        if outbox is not None:
            body["outbox"] = outbox.to_wire()
        c = _Call("POST", BASE_PATH + "/commits/authorize", body, mutation=True, request_id=commit_id,
                  accept=("lease_inspected",))
        w, corr = self._retrying(c, timeout)

        def build() -> CommitResult:
            cm = Commit.from_wire(w.get("commit"))
            want_target = target
            want_digest = payload_sha256
            if outbox is not None:
                want_target, want_digest = cm.target, _digest(outbox.body)
                if not cm.target.startswith("msg_"):
                    raise WireError("a publication's target is not a message id")
            if (cm.lease_id, cm.fencing_token, cm.sink, cm.commit_id, cm.target, cm.payload_sha256, cm.job_id,
                    cm.execution_id) != (lease.lease_id, lease.fencing_token, sink, commit_id, want_target,
                                         want_digest, job_id, execution_id):
                raise WireError("the commit answered is not the one asked for")
            # The guard carries the lock key into the sink: it must be the
            # identity's own, whatever the answer says.
            if cm.lock_key != lease.lock_identity.lock_key():
                raise WireError("the commit answer's lock_key is not the identity's")
            return CommitResult(w["code"], corr, cm, bool(w.get("replayed", False)))

        return _decoded(build, True, commit_id)

    # --- service routes -----------------------------------------------

    def healthz(self, *, timeout: Optional[float] = None) -> Dict[str, Any]:
        """GET /healthz: the process answers."""
        return self._service("/healthz", timeout)[1]

    def readyz(self, *, timeout: Optional[float] = None) -> Tuple[bool, Dict[str, Any]]:
        """GET /readyz: whether the service can serve (200) or not (503),
        with its components' states."""
        status, body = self._service("/readyz", timeout, ok=(200, 503))
        return status == 200, body

    def metrics(self, *, timeout: Optional[float] = None) -> str:
        """GET /metrics: the Prometheus exposition text."""
        return self._service("/metrics", timeout, text=True)[1]

    def openapi(self, *, timeout: Optional[float] = None) -> Dict[str, Any]:
        """GET /api/v1/openapi.json: the API description the server serves."""
        return self._service("/api/v1/openapi.json", timeout)[1]

    # --- plumbing -----------------------------------------------------

    def _mutate(self, c: _Call, request_id: Optional[str], timeout: Optional[float],
                id_header: bool = False) -> LeaseResult:
        c.mutation = True
        c.request_id = request_id or new_request_id()
        if id_header:
            c.headers = {"Idempotency-Key": c.request_id}
        else:
            assert c.body is not None
            c.body["request_id"] = c.request_id
        w, corr = self._retrying(c, timeout)
        return self._lease_result((w, corr), c.request_id)

    def _lease_result(self, wc: Tuple[Dict[str, Any], str], request_id: str) -> LeaseResult:
        w, corr = wc

        def build() -> LeaseResult:
            cur = w.get("current")
            return LeaseResult(w["code"], corr, Lease.from_wire(w.get("lease")), request_id,
                               Lease.from_wire(cur) if cur is not None else None, bool(w.get("replayed", False)))

        return _decoded(build, bool(request_id), request_id)

    def _retrying(self, c: _Call, timeout: Optional[float]) -> Tuple[Dict[str, Any], str]:
        """Sends a mutation until its outcome is known or the deadline
        passes, always with the same body and request (or commit) id."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = 0.05
        unknown: Optional[E.OutcomeUnknown] = None
        while True:
            try:
                return self._do(c, None, deadline)
            except (E.OutcomeUnknown, E.BackendUnavailable, E.RateLimited, E.DeadlineExceeded) as err:
                if isinstance(err, E.OutcomeUnknown):
                    unknown = err
                # Once one attempt may have acted, a later attempt that did
                # nothing does not make the outcome known.
                final = unknown if unknown is not None else err
                if isinstance(err, E.DeadlineExceeded):
                    raise final from None
                wait = delay * (0.5 + random.random())
                if isinstance(err, E.RateLimited) and err.retry_after:
                    wait = max(wait, err.retry_after)
                if time.monotonic() + wait >= deadline - 0.01:
                    raise final from None
                time.sleep(wait)
                delay = min(delay * 2, 1.0)

    def _do(self, c: _Call, timeout: Optional[float], deadline: Optional[float] = None) -> Tuple[Dict[str, Any], str]:
        if deadline is None:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        status, hdrs, raw = self._send(c, deadline)
        return self._decode(c, status, hdrs, raw)

    def _service(self, path: str, timeout: Optional[float], ok: Tuple[int, ...] = (200,),
                 text: bool = False) -> Tuple[int, Any]:
        c = _Call("GET", path, raw=True)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        status, hdrs, raw = self._send(c, deadline)
        if status not in ok:
            _, corr = self._decode(c, status, hdrs, raw)  # raises the typed error
            raise E.BackendUnavailable("unexpected status %d" % status, status=status, correlation_id=corr)
        if text:
            return status, raw.decode("utf-8", "replace")
        try:
            return status, json.loads(raw)
        except ValueError:
            raise E.BackendUnavailable("malformed response: not JSON", status=status) from None

    def _send(self, c: _Call, deadline: float) -> Tuple[int, Mapping[str, str], bytes]:
        left = deadline - time.monotonic()
        if left <= 0.001:
            raise E.DeadlineExceeded("deadline elapsed before the request was sent", retryable=True,
                                     request_id=c.request_id)
        path = self._prefix + c.path
        if c.query:
            path += "?" + urllib.parse.urlencode(c.query)
        headers = {"Authorization": "Bearer " + self._key, "Accept": "application/json", "User-Agent": self._ua,
                   "X-Request-Timeout-Ms": str(_server_timeout_ms(left))}
        corr = _correlation.get()
        if corr:
            headers["X-Correlation-ID"] = corr
        body = None
        if c.body is not None:
            body = json.dumps(c.body, separators=(",", ":")).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if c.headers:
            headers.update(c.headers)
        if self._scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(self._host, self._port, timeout=left,
                                                                            context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=left)
        try:
            try:
                conn.connect()
            except OSError as err:
                raise self._transport(c, False, err) from None
            try:
                conn.request(c.method, path, body=body, headers=headers)
                resp = conn.getresponse()
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
            except (OSError, http.client.HTTPException) as err:
                raise self._transport(c, True, err) from None
            if len(raw) > MAX_RESPONSE_BYTES:
                raise self._malformed(c, resp.status, "", "response body too large")
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw
        finally:
            conn.close()

    def _transport(self, c: _Call, sent: bool, err: BaseException) -> E.StarleaseError:
        kind = type(err).__name__  # never the message: it may hold the URL
        if not sent:
            return E.BackendUnavailable("the request could not be sent (%s); nothing was done" % kind,
                                        retryable=True, request_id=c.request_id)
        if c.mutation:
            return E.OutcomeUnknown("no answer after the request was sent (%s); resolve by retrying with the same "
                                    "request id" % kind, retryable=True, request_id=c.request_id)
        return E.BackendUnavailable("no answer from the server (%s)" % kind, retryable=True)

    def _malformed(self, c: _Call, status: int, corr: str, why: str) -> E.StarleaseError:
        cls = E.OutcomeUnknown if c.mutation else E.BackendUnavailable
        return cls("malformed response: " + why, status=status, correlation_id=corr, retryable=True,
                   request_id=c.request_id)

    def _decode(self, c: _Call, status: int, hdrs: Mapping[str, str], raw: bytes) -> Tuple[Dict[str, Any], str]:
        corr = hdrs.get("x-correlation-id", "")
        try:
            w = json.loads(raw)
        except ValueError:
            raise self._malformed(c, status, corr, "body is not JSON") from None
        if not isinstance(w, dict):
            raise self._malformed(c, status, corr, "body is not an object")
        corr = w.get("correlation_id") if isinstance(w.get("correlation_id"), str) else ""
        if not corr:
            raise self._malformed(c, status, "", "no correlation_id")
        code = w.get("code")
        if status == 200:
            if w.get("status") != "success" or code not in c.accept:
                raise self._malformed(c, status, corr, "unexpected code %r" % (code,))
            return w, corr
        cls = E.ERRORS.get(code) if isinstance(code, str) else None
        if w.get("status") != "error" or cls is None or E.STATUS.get(code, status) != status:
            raise self._malformed(c, status, corr, "unexpected error %r with status %d" % (code, status))
        ra = w.get("retry_after_ms")
        msg = w.get("msg") if isinstance(w.get("msg"), str) else ""
        fld = w.get("field") if isinstance(w.get("field"), str) else ""
        raise cls(msg, status=status, field=fld, correlation_id=corr, retryable=w.get("retryable") is True,
                  retry_after=ra / 1000.0 if isinstance(ra, int) and ra > 0 else None, request_id=c.request_id)


def _decoded(build: Callable[[], Any], mutation: bool, request_id: str) -> Any:
    try:
        return build()
    except (WireError, KeyError, TypeError) as err:
        cls = E.OutcomeUnknown if mutation else E.BackendUnavailable
        raise cls("malformed response: %s" % err, retryable=True, request_id=request_id) from None


def _digest(body: bytes) -> str:
    return payload_sha256(bytes(body))


def _opt_str(m: Mapping[str, Any], k: str) -> str:
    v = m.get(k, "")
    if not isinstance(v, str):
        raise WireError("%s is not a string" % k)
    return v


def _ms(seconds: float, name: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise E.InvalidRequest("must be a positive number of seconds", field=name)
    return max(1, int(round(seconds * 1000)))


def _server_timeout_ms(left: float) -> int:
    # A little less than what is left, so the server's own answer at its
    # deadline arrives before the client gives up (as the Go client does).
    ms = int((left - min(left / 10, 0.5)) * 1000)
    return min(max(ms, 1), MAX_SERVER_TIMEOUT_MS)


def _lease_path(lease_id: str, suffix: str) -> str:
    if not lease_id:
        raise E.InvalidRequest("a lease id is required", field="lease_id")
    return BASE_PATH + "/" + urllib.parse.quote(lease_id, safe="") + suffix


def _held(lease: Lease, service_instance_id: str) -> Dict[str, Any]:
    return {"lock_identity": lease.lock_identity.to_wire(), "fencing_token": lease.fencing_token,
            "service_instance_id": service_instance_id}


def _admin(lease: Lease, reason: str, incident_id: str) -> Dict[str, Any]:
    body: Dict[str, Any] = {"lock_identity": lease.lock_identity.to_wire(), "fencing_token": lease.fencing_token}
    if reason:
        body["reason"] = reason
    if incident_id:
        body["incident_id"] = incident_id
    return body


def operations() -> List[str]:
    """The operationIds this client implements."""
    return sorted(ROUTES)
