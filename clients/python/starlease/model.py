"""The wire shapes of the lease API as typed, immutable values."""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

LOCK_KEY_PREFIX = "starintel:target-lease:v1:"

IDENTITY_FIELDS = (
    "tenant_id",
    "program_id",
    "target_namespace",
    "target_id",
    "actor_name",
    "workflow_name",
    "operation_class",
)


class WireError(ValueError):
    """An answer that does not have the documented shape."""


@dataclass(frozen=True)
class LockIdentity:
    """What a lease excludes: one actor's work on one target.

    ``workflow_name`` and ``operation_class`` may be empty ("default").
    The server canonicalises every field; the lease it answers carries
    the canonical form.
    """

    tenant_id: str
    program_id: str
    target_namespace: str
    target_id: str
    actor_name: str
    workflow_name: str = ""
    operation_class: str = ""

    def to_wire(self) -> Dict[str, str]:
        out = {k: getattr(self, k) for k in IDENTITY_FIELDS[:5]}
        for k in IDENTITY_FIELDS[5:]:
            if getattr(self, k):
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_wire(cls, w: Any) -> "LockIdentity":
        m = _obj(w, "lock_identity")
        return cls(**{k: _str(m, k, required=k in IDENTITY_FIELDS[:5]) for k in IDENTITY_FIELDS})

    def lock_key(self) -> str:
        """The canonical lock key of this identity, which must already be
        canonical (as the server answers it): the contract's function,
        SHA-256 over the JSON array ["v1", the seven fields], unpadded
        base64url, prefixed. The client uses it only to check the server's
        answer; it never sends a key."""
        parts = ["v1"] + [getattr(self, k) or "default" for k in IDENTITY_FIELDS]
        raw = json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode("ascii")
        return LOCK_KEY_PREFIX + digest


@dataclass(frozen=True)
class Lease:
    """The contract's success shape of a lease."""

    lock_identity: LockIdentity
    lease_id: str
    fencing_token: int
    acquired_at: _dt.datetime
    renewed_at: _dt.datetime
    expires_at: _dt.datetime
    ttl_ms: int
    state: str

    @property
    def ttl(self) -> float:
        """The TTL in seconds."""
        return self.ttl_ms / 1000.0

    @classmethod
    def from_wire(cls, w: Any) -> "Lease":
        m = _obj(w, "lease")
        lease = cls(
            lock_identity=LockIdentity.from_wire(m.get("lock_identity")),
            lease_id=_str(m, "lease_id"),
            fencing_token=_token(m, "fencing_token"),
            acquired_at=_time(m, "acquired_at"),
            renewed_at=_time(m, "renewed_at"),
            expires_at=_time(m, "expires_at"),
            ttl_ms=_int(m, "ttl_ms"),
            state=_str(m, "state"),
        )
        if lease.state not in ("active", "expired", "released", "revoked"):
            raise WireError("lease.state %r is not a known state" % lease.state)
        return lease


@dataclass(frozen=True)
class LeaseResult:
    """The answer of acquire, renew, release, get, inspect and the
    administrative operations."""

    code: str
    correlation_id: str
    lease: Lease
    request_id: str = ""
    #: On a replay whose lease has since ended, its state now.
    current: Optional[Lease] = None
    #: The answer came from the record of an earlier request with the
    #: same request id.
    replayed: bool = False


@dataclass(frozen=True)
class ListResult:
    code: str
    correlation_id: str
    leases: Tuple[Lease, ...]
    #: Empty on the last page.
    next_page_token: str = ""


@dataclass(frozen=True)
class HistoryEntry:
    lease: Lease
    ended_at: Optional[_dt.datetime]
    reason: str = ""
    incident_id: str = ""


@dataclass(frozen=True)
class HistoryResult:
    code: str
    correlation_id: str
    history: Tuple[HistoryEntry, ...]
    next_page_token: str = ""


@dataclass(frozen=True)
class Commit:
    """An accepted authorization of exactly one write.

    ``target`` and ``payload_sha256`` name the write: a document id and the
    SHA-256 of its body bytes, or for a publication its message id and the
    SHA-256 of the message body.
    """

    lock_key: str
    sink: str
    commit_id: str
    lease_id: str
    fencing_token: int
    execution_id: str
    job_id: str
    target: str
    payload_sha256: str
    commit_seq: int
    accepted_at: str
    backend_time: str
    trace_id: str = ""

    def guard(self) -> Dict[str, Any]:
        """The guard of this commit: the JSON object a fenced sink stores
        (CouchDB's ``starintel_fence``), exactly as the Go writer forms it."""
        g: Dict[str, Any] = {
            "lock_key": self.lock_key,
            "lease_id": self.lease_id,
            "fencing_token": self.fencing_token,
            "execution_id": self.execution_id,
            "job_id": self.job_id,
        }
        if self.trace_id:
            g["trace_id"] = self.trace_id
        g.update(sink=self.sink, commit_id=self.commit_id, target=self.target)
        if self.payload_sha256:
            g["payload_sha256"] = self.payload_sha256
        g.update(commit_seq=self.commit_seq, accepted_at=self.accepted_at)
        return g

    @classmethod
    def from_wire(cls, w: Any) -> "Commit":
        m = _obj(w, "commit")
        c = cls(
            lock_key=_str(m, "lock_key"),
            sink=_str(m, "sink"),
            commit_id=_str(m, "commit_id"),
            lease_id=_str(m, "lease_id"),
            fencing_token=_token(m, "fencing_token"),
            execution_id=_str(m, "execution_id"),
            job_id=_str(m, "job_id"),
            trace_id=_str(m, "trace_id", required=False),
            target=_str(m, "target"),
            payload_sha256=_str(m, "payload_sha256", required=False),
            commit_seq=_int(m, "commit_seq"),
            accepted_at=_str(m, "accepted_at"),
            backend_time=_str(m, "backend_time"),
        )
        parse_time(c.accepted_at, "commit.accepted_at")
        parse_time(c.backend_time, "commit.backend_time")
        if c.commit_seq < 1:
            raise WireError("commit.commit_seq must be at least 1")
        return c


@dataclass(frozen=True)
class CommitResult:
    code: str
    correlation_id: str
    commit: Commit
    replayed: bool = False


@dataclass(frozen=True)
class Publication:
    """A publication the outbox accepted under the lease.

    The server's relay publishes it with ``message_id`` (stable: a retry
    publishes the same id) and the fence headers.
    """

    message_id: str
    commit: Commit
    replayed: bool = False


@dataclass(frozen=True)
class CouchWrite:
    """A fenced CouchDB write that CouchDB accepted."""

    doc_id: str
    rev: str
    guard: Mapping[str, Any] = field(default_factory=dict)
    #: The document already held exactly this write (a repeated call after
    #: an unknown outcome); nothing was sent.
    already_written: bool = False


# --- strict field readers -------------------------------------------------

MAX_TOKEN = (1 << 53) - 1


def _obj(w: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(w, dict):
        raise WireError("%s is not an object" % name)
    return w


def _str(m: Mapping[str, Any], k: str, required: bool = True) -> str:
    v = m.get(k)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and v == ""):
        raise WireError("%s is missing or not a non-empty string" % k)
    return v


def _int(m: Mapping[str, Any], k: str) -> int:
    v = m.get(k)
    if isinstance(v, bool) or not isinstance(v, int):
        raise WireError("%s is missing or not an integer" % k)
    return v


def _token(m: Mapping[str, Any], k: str) -> int:
    v = _int(m, k)
    if not 1 <= v <= MAX_TOKEN:
        raise WireError("%s is not in 1..2^53-1" % k)
    return v


def parse_time(s: str, name: str = "time") -> _dt.datetime:
    """Parses the contract's RFC 3339 UTC form (``...T..:..:..[.fff]Z``)."""
    if not isinstance(s, str) or not s.endswith("Z"):
        raise WireError("%s is not an RFC 3339 UTC time" % name)
    try:
        t = _dt.datetime.fromisoformat(s[:-1] + "+00:00")
    except ValueError:
        raise WireError("%s is not an RFC 3339 UTC time" % name) from None
    return t


def _time(m: Mapping[str, Any], k: str) -> _dt.datetime:
    return parse_time(_str(m, k), k)


def leases(w: Any, name: str) -> List[Lease]:
    if not isinstance(w, list):
        raise WireError("%s is not an array" % name)
    return [Lease.from_wire(x) for x in w]
