"""starlease: the Python client of the StarIntel target-lease service.

Standard library only. The pieces:

* :class:`Client`: every route of the HTTP API, typed results and typed
  errors (:mod:`starlease.errors`), request ids reused until an unknown
  outcome is resolved;
* :func:`lease`: ``with lease(client, identity, ...) as held:`` acquires,
  keeps the lease renewed, signals loss (``held.lost``, ``held.cause``) and
  releases; ``held.write_couch`` and ``held.publish`` are the fenced writes;
* :class:`CouchDB`: the fenced CouchDB write of the Go writer;
* :class:`Deduper`: a consumer's duplicate and stale-token filter (defence
  in depth, not fencing).
"""

from .client import Client, OutboxMessage, correlation, new_request_id, payload_sha256, ROUTES
from .consumer import Deduper, Decision, Fence, NoFence, fence_of
from .couch import CouchDB, FENCE_FIELD
from .errors import (
    AccessDenied,
    BackendUnavailable,
    CommitRejected,
    Corrupt,
    DeadlineExceeded,
    FenceMissing,
    IdempotencyConflict,
    InvalidCredential,
    InvalidRequest,
    LeaseConflict,
    LeaseLost,
    LeaseNotFound,
    OutcomeUnknown,
    RateLimited,
    StarleaseError,
)
from .keeper import (
    BACKEND_UNAVAILABLE,
    CAUSES,
    EXPIRED,
    FORCE_RELEASED,
    REJECTED,
    REVOKED,
    HeldLease,
    lease,
)
from .model import (
    Commit,
    CommitResult,
    CouchWrite,
    HistoryEntry,
    HistoryResult,
    Lease,
    LeaseResult,
    ListResult,
    LockIdentity,
    Publication,
)

__all__ = [name for name in dir() if not name.startswith("_")]
