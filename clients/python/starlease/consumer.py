"""The consumer side of fenced publications: drop duplicates and lower
tokens.

The relay publishes every accepted publication at least once, with a
stable message id and the fence in headers (``x-starintel-*``). A
:class:`Deduper` lets a consumer process each publication once within its
window and drop deliveries whose fencing token is below the highest seen
for their lock key.

This is defence in depth, NOT fencing: the headers are delivery metadata
that anyone able to publish to the exchange can forge, and the memory is
bounded and lost on restart. The authority is the fenced outbox: a
publication enters it only in the same atomic step as an accepted lease
check, so a stale holder's publication never reaches the relay.
"""

from __future__ import annotations

import collections
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional

HEADER_LOCK_KEY = "x-starintel-lock-key"
HEADER_LEASE_ID = "x-starintel-lease-id"
HEADER_FENCING_TOKEN = "x-starintel-fencing-token"
HEADER_EXECUTION_ID = "x-starintel-execution-id"
HEADER_TRACE_ID = "x-starintel-trace-id"
HEADER_ACCEPTED_AT = "x-starintel-accepted-at"
HEADER_SINK = "x-starintel-sink"
HEADER_COMMIT_ID = "x-starintel-commit-id"

PROCESS = "process"
DROP_DUPLICATE = "duplicate"
DROP_STALE_TOKEN = "stale_token"
DROP_UNFENCED = "unfenced"

_LOCK_KEY = re.compile(r"^starintel:target-lease:v1:[A-Za-z0-9_-]{43}$")
_MAX_TOKEN = (1 << 53) - 1


class NoFence(ValueError):
    """A delivery without a complete, well-formed fence."""


@dataclass(frozen=True)
class Fence:
    """The fence a delivery carries. Metadata: it proves nothing by itself."""

    message_id: str
    lock_key: str
    lease_id: str
    fencing_token: int
    execution_id: str = ""
    trace_id: str = ""
    accepted_at: str = ""
    sink: str = ""
    commit_id: str = ""


@dataclass(frozen=True)
class Decision:
    verdict: str
    fence: Optional[Fence]
    #: The highest token seen for the lock key before this delivery.
    highest: int
    reason: str

    @property
    def dropped(self) -> bool:
        """Acknowledge the delivery without processing it."""
        return self.verdict != PROCESS


def fence_of(message_id: Optional[str], headers: Optional[Mapping[str, Any]]) -> Fence:
    """Reads the fence of a delivery (pika: ``properties.message_id`` and
    ``properties.headers``). Raises :class:`NoFence`."""
    if not message_id:
        raise NoFence("no message id")
    h = headers or {}

    def text(name: str, required: bool) -> str:
        v = h.get(name)
        if isinstance(v, (bytes, bytearray)):
            v = bytes(v).decode("utf-8", "replace")
        if v is None:
            if required:
                raise NoFence("header %s is missing" % name)
            return ""
        if not isinstance(v, str) or (required and not v):
            raise NoFence("header %s is not a non-empty string" % name)
        return v

    lock_key = text(HEADER_LOCK_KEY, True)
    if not _LOCK_KEY.match(lock_key):
        raise NoFence("header %s is not a canonical lock key" % HEADER_LOCK_KEY)
    tok = h.get(HEADER_FENCING_TOKEN)
    if isinstance(tok, bool) or not isinstance(tok, int) or not 1 <= tok <= _MAX_TOKEN:
        raise NoFence("header %s is missing or not an integer in 1..2^53-1" % HEADER_FENCING_TOKEN)
    return Fence(message_id, lock_key, text(HEADER_LEASE_ID, True), tok, text(HEADER_EXECUTION_ID, False),
                 text(HEADER_TRACE_ID, False), text(HEADER_ACCEPTED_AT, False), text(HEADER_SINK, False),
                 text(HEADER_COMMIT_ID, False))


class _KeyState:
    __slots__ = ("high", "high_lease", "ids")

    def __init__(self, per_key: int) -> None:
        self.high = 0
        self.high_lease = ""
        self.ids: "collections.OrderedDict[str, None]" = collections.OrderedDict()


class Deduper:
    """Drops duplicates by message id and tokens below the highest seen per
    lock key (defence in depth; see the module doc). Thread-safe. Memory is
    bounded by ``max_lock_keys`` × ``ids_per_lock_key`` message ids;
    forgetting a lock key forgets its highest token too."""

    def __init__(self, max_lock_keys: int = 1024, ids_per_lock_key: int = 128) -> None:
        self._max_keys, self._per_key = max_lock_keys, ids_per_lock_key
        self._keys: "collections.OrderedDict[str, _KeyState]" = collections.OrderedDict()
        self._mu = threading.Lock()

    def check(self, message_id: Optional[str], headers: Optional[Mapping[str, Any]]) -> Decision:
        """Decides about a delivery. A passed delivery is recorded at once;
        call :meth:`forget` if its processing fails and it is requeued."""
        try:
            f = fence_of(message_id, headers)
        except NoFence as err:
            return Decision(DROP_UNFENCED, None, 0, str(err))
        with self._mu:
            ks = self._keys.get(f.lock_key)
            if ks is None:
                ks = self._keys[f.lock_key] = _KeyState(self._per_key)
                while len(self._keys) > self._max_keys:
                    self._keys.popitem(last=False)
            self._keys.move_to_end(f.lock_key)
            high = ks.high
            if f.message_id in ks.ids:
                return Decision(DROP_DUPLICATE, f, high, "message id %s was already accepted" % f.message_id)
            if f.fencing_token < ks.high:
                return Decision(DROP_STALE_TOKEN, f, high, "fencing token %d is below %d, the highest seen for "
                                "the lock key" % (f.fencing_token, ks.high))
            if f.fencing_token == ks.high and f.lease_id != ks.high_lease:
                return Decision(DROP_STALE_TOKEN, f, high, "fencing token %d belongs to another lease"
                                % f.fencing_token)
            ks.high, ks.high_lease = f.fencing_token, f.lease_id
            ks.ids[f.message_id] = None
            while len(ks.ids) > self._per_key:
                ks.ids.popitem(last=False)
            return Decision(PROCESS, f, high, "new publication, token not below the highest seen")

    def forget(self, fence: Fence) -> None:
        """Forgets a passed message id so that a redelivery is processed."""
        with self._mu:
            ks = self._keys.get(fence.lock_key)
            if ks is not None:
                ks.ids.pop(fence.message_id, None)

    def highest(self, lock_key: str) -> int:
        with self._mu:
            ks = self._keys.get(lock_key)
            return ks.high if ks else 0
