"""Typed errors: one exception class per result code of the contract.

Every failure the client raises is a :class:`StarleaseError` whose class
names the wire code, so callers select with ``except LeaseLost`` rather
than comparing strings. The API key never appears in an error.
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class StarleaseError(Exception):
    """A failed call. ``code`` is the contract's wire code.

    Attributes:
        code: the wire code (``lease_lost``, ...).
        status: the HTTP status, 0 when no answer was read.
        msg: the server's message or the client's description.
        field: the offending input of an ``invalid_lease_request``.
        correlation_id: the server's correlation id of the request.
        retryable: the server's retryability (for outcome-unknown: only
            with the same request id).
        retry_after: the server's retry hint in seconds, or None.
        request_id: the request id a mutation was sent with.
    """

    code = "starlease_error"

    def __init__(
        self,
        msg: str = "",
        *,
        status: int = 0,
        field: str = "",
        correlation_id: str = "",
        retryable: bool = False,
        retry_after: Optional[float] = None,
        request_id: str = "",
    ) -> None:
        self.msg = msg
        self.status = status
        self.field = field
        self.correlation_id = correlation_id
        self.retryable = retryable
        self.retry_after = retry_after
        self.request_id = request_id
        super().__init__(self._describe())

    def _describe(self) -> str:
        parts = ["starlease:"]
        if self.status:
            parts.append(str(self.status))
        parts.append(self.code + (": " + self.msg if self.msg else ""))
        if self.field and self.field not in self.msg:
            parts.append("(field %s)" % self.field)
        if self.correlation_id:
            parts.append("[correlation_id %s]" % self.correlation_id)
        if self.request_id and self.code == OutcomeUnknown.code:
            parts.append("[request_id %s]" % self.request_id)
        return " ".join(parts)


class InvalidRequest(StarleaseError):
    """The request is malformed; nothing changed (400)."""

    code = "invalid_lease_request"


class InvalidCredential(StarleaseError):
    """The API key is missing, malformed, unknown, expired or revoked (401)."""

    code = "invalid_credential"


class AccessDenied(StarleaseError):
    """The key may not do this, or not in this scope (403)."""

    code = "access_denied"


class LeaseNotFound(StarleaseError):
    """No such lease within the caller's scope (404)."""

    code = "lease_not_found"


class DeadlineExceeded(StarleaseError):
    """The deadline elapsed before the operation started; nothing changed."""

    code = "deadline_exceeded"


class LeaseConflict(StarleaseError):
    """Another lease holds the identity, or a write raced another (409)."""

    code = "lease_conflict"


class LeaseLost(StarleaseError):
    """The lease is no longer held: expired, released, revoked or replaced.

    ``cause`` is set by the keeper when it knows which (see
    :mod:`starlease.keeper`).
    """

    code = "lease_lost"

    def __init__(self, msg: str = "", *, cause: str = "", **kw) -> None:
        self.cause = cause
        super().__init__(msg, **kw)


class IdempotencyConflict(StarleaseError):
    """A request or commit id was reused with other inputs (409)."""

    code = "idempotency_conflict"


class RateLimited(StarleaseError):
    """Too many requests; retry after ``retry_after`` seconds (429)."""

    code = "lease_rate_limited"


class BackendUnavailable(StarleaseError):
    """The service or its backend could not act; nothing was done (503)."""

    code = "lease_backend_unavailable"


class OutcomeUnknown(StarleaseError):
    """The mutation may or may not have happened.

    Resolve it by repeating the call with the same ``request_id`` (the
    client already did, until its deadline); never with a new one.
    """

    code = "lease_outcome_unknown"


class CommitRejected(StarleaseError):
    """A sink's fence refused a write.

    ``superseded`` is True when the refusal says a successor holds the
    document (a higher token, or another lease at the same token): the
    lease is lost. Otherwise the write itself was refused (its type, id or
    guard) and the lease may still be held."""

    code = "commit_rejected"
    superseded = False


class Corrupt(StarleaseError):
    """A stored document or answer cannot be trusted."""

    code = "lease_corrupt"


class FenceMissing(BackendUnavailable):
    """The CouchDB database has no (or another) fence design document.

    The writer refuses to write without the downstream guard; an operator
    installs it (the Go package couchdb's InstallFence).
    """


ERRORS: Dict[str, Type[StarleaseError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        InvalidCredential,
        AccessDenied,
        LeaseNotFound,
        DeadlineExceeded,
        LeaseConflict,
        LeaseLost,
        IdempotencyConflict,
        RateLimited,
        BackendUnavailable,
        OutcomeUnknown,
        CommitRejected,
        Corrupt,
    )
}

# The HTTP status of each code in the contract's table.
STATUS: Dict[str, int] = {
    "invalid_lease_request": 400,
    "invalid_credential": 401,
    "access_denied": 403,
    "lease_not_found": 404,
    "deadline_exceeded": 408,
    "lease_conflict": 409,
    "lease_lost": 409,
    "idempotency_conflict": 409,
    "lease_rate_limited": 429,
    "lease_backend_unavailable": 503,
    "lease_outcome_unknown": 503,
}
