"""Holding a lease while working: ``with lease(...) as held:``.

The keeper renews the lease in a background thread before it expires
(every TTL/3, with jitter) and sets ``held.lost`` (a
:class:`threading.Event`) the moment the lease is lost, with the typed
``held.cause``:

* ``expired``: the lease ran out (a renewal came too late, or the process
  was paused);
* ``revoked`` / ``force_released``: an administrator ended it;
* ``rejected``: the server refused the renewal for another reason;
* ``backend_unavailable``: no renewal succeeded before the lease's own end
  minus the safety margin, measured on this process's monotonic clock from
  the moment the last successful renewal was sent (so a lease the server
  may still hold is given up early, never late).

Work checks ``held.lost`` (or calls ``held.check()``) between steps, but
the authority is the server and the sinks: every write goes through
:meth:`HeldLease.authorize` (directly, or by :meth:`HeldLease.write_couch`
and :meth:`HeldLease.publish`), which the server refuses once the lease is
not held, and a fenced CouchDB database refuses a stale guard. On leaving
the block the lease is released (also on an exception); a lost lease is
not released.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional

from . import errors as E
from .client import Client, OutboxMessage, new_request_id, payload_sha256
from .couch import Body, CouchDB, check_doc_id, encode_body
from .model import Commit, CouchWrite, Lease, LeaseResult, LockIdentity, Publication

EXPIRED = "expired"
REVOKED = "revoked"
FORCE_RELEASED = "force_released"
REJECTED = "rejected"
BACKEND_UNAVAILABLE = "backend_unavailable"
#: Every cause a lost lease can have.
CAUSES = (EXPIRED, REVOKED, FORCE_RELEASED, REJECTED, BACKEND_UNAVAILABLE)

_TRANSIENT = (E.BackendUnavailable, E.OutcomeUnknown, E.RateLimited, E.DeadlineExceeded)


class HeldLease:
    """A lease held by this process, renewed by its keeper.

    Attributes:
        lost: set the moment the lease is lost; wait on it to cancel work.
        cause: one of :data:`CAUSES` once lost, else None.
        error: the error that revealed the loss, if any.
    """

    def __init__(self, client: Client, lease: Lease, *, service_instance_id: str, execution_id: str,
                 job_id: str, trace_id: str = "", margin: Optional[float] = None,
                 on_lost: Optional[Callable[["HeldLease"], None]] = None, sent_at: float) -> None:
        self.client = client
        self._lease = lease
        self.service_instance_id = service_instance_id
        self.execution_id = execution_id
        self.job_id = job_id
        self.trace_id = trace_id
        self.margin = margin if margin is not None else max(min(lease.ttl / 5, 5.0), 0.1)
        self.lost = threading.Event()
        self.cause: Optional[str] = None
        self.error: Optional[E.StarleaseError] = None
        self._on_lost = on_lost
        self._mu = threading.Lock()
        self._stop = threading.Event()
        # The lease's end as this process may assume it: the backend set
        # expires_at after the request was sent, so sent_at plus the grant
        # is never later than the real end.
        self._valid_until = sent_at + _grant(lease)
        self._sent = sent_at
        self._thread = threading.Thread(target=self._keep, name="starlease-keeper", daemon=True)

    @property
    def lease(self) -> Lease:
        """The lease as last renewed."""
        with self._mu:
            return self._lease

    def check(self) -> None:
        """Raises :class:`LeaseLost` (with ``cause``) once the lease is lost,
        or once its assumed end minus the margin has passed (even if the
        keeper thread has not run since, e.g. after the process was
        paused)."""
        if not self.lost.is_set() and time.monotonic() >= self._valid_until - self.margin:
            self._lose_after(E.LeaseLost("the lease's assumed end has passed"),
                             default=BACKEND_UNAVAILABLE if self.error is not None else EXPIRED)
        if self.lost.is_set():
            raise E.LeaseLost("the lease was lost: %s" % self.cause, cause=self.cause or "")

    # --- writes -------------------------------------------------------

    def authorize(self, *, sink: str, target: str = "", payload_sha256: str = "",
                  outbox: Optional[OutboxMessage] = None, commit_id: Optional[str] = None,
                  timeout: Optional[float] = None) -> Commit:
        """Authorizes exactly one write under the lease (see
        :meth:`Client.authorize_commit`). A refusal because the lease is not
        held marks the lease lost."""
        self.check()
        try:
            res = self.client.authorize_commit(
                self.lease, service_instance_id=self.service_instance_id, execution_id=self.execution_id,
                job_id=self.job_id, trace_id=self.trace_id, sink=sink, commit_id=commit_id or _commit_id(),
                target=target, payload_sha256=payload_sha256, outbox=outbox, timeout=timeout)
        except E.LeaseLost as err:
            self._lose_after(err)
            raise E.LeaseLost(err.msg, cause=self.cause or "", status=err.status,
                              correlation_id=err.correlation_id) from None
        return res.commit

    def write_couch(self, db: "CouchDB | str", doc_id: str, body: Body, *, commit_id: Optional[str] = None,
                    sink: str = "couchdb") -> CouchWrite:
        """The fenced CouchDB write of ``body`` as document ``doc_id``: a
        commit authorized for exactly this write (the document id and the
        SHA-256 of the body bytes), then the conditioned PUT (see
        :mod:`starlease.couch`). ``db`` is a :class:`CouchDB` or a database
        URL. Pass the same ``commit_id`` to repeat a write whose outcome is
        unknown. Raises :class:`LeaseLost` when the server refuses the
        commit, :class:`CommitRejected` when the database's fence refuses
        the write (both mark the lease lost)."""
        couch = CouchDB(db) if isinstance(db, str) else db
        check_doc_id(doc_id)
        raw, _ = encode_body(body)
        commit = self.authorize(sink=sink, target=doc_id, payload_sha256=payload_sha256(raw), commit_id=commit_id)
        try:
            return couch.put_fenced(commit.guard(), sink, doc_id, raw)
        except E.CommitRejected as err:
            if err.superseded:
                self._lose_after(err)
            raise

    def publish(self, routing_key: str, body: bytes, *, exchange: str = "", content_type: str = "",
                headers: Optional[Mapping[str, str]] = None, commit_id: Optional[str] = None,
                sink: str = "rabbitmq") -> Publication:
        """A fenced publication: the server appends it to its outbox in the
        same atomic step as the lease check, and its relay publishes it (at
        least once, by its stable message id). Nothing is published once
        the lease is lost."""
        msg = OutboxMessage(routing_key=routing_key, body=bytes(body), exchange=exchange,
                            content_type=content_type, headers=headers)
        cid = commit_id or _commit_id()
        self.check()
        try:
            res = self.client.authorize_commit(
                self.lease, service_instance_id=self.service_instance_id, execution_id=self.execution_id,
                job_id=self.job_id, trace_id=self.trace_id, sink=sink, commit_id=cid, outbox=msg)
        except E.LeaseLost as err:
            self._lose_after(err)
            raise E.LeaseLost(err.msg, cause=self.cause or "", status=err.status,
                              correlation_id=err.correlation_id) from None
        return Publication(res.commit.target, res.commit, res.replayed)

    def release(self) -> None:
        """Stops the keeper and releases the lease unless it was lost."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        if self.lost.is_set():
            return
        try:
            self.client.release(self.lease, service_instance_id=self.service_instance_id)
        except E.LeaseLost as err:
            self._lose_after(err)

    # --- the keeper ---------------------------------------------------

    def _start(self) -> None:
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.is_set():
            lease = self.lease
            give_up = self._valid_until - self.margin
            now = time.monotonic()
            if now >= give_up:
                # Past the end this process may assume: whatever the server
                # says now, work done from here on may be a stale holder's.
                self._lose_after(E.LeaseLost("no renewal succeeded in time"),
                                 default=BACKEND_UNAVAILABLE if self.error is not None else EXPIRED)
                return
            # Renew a third into the TTL (jittered), so that more than one
            # attempt fits before the margin.
            grant = max(self._valid_until - self._sent, 0.0)
            due = self._valid_until - grant * (2 / 3) * random.uniform(0.85, 1.0)
            due = max(due, self._sent + 0.1)  # near the lifetime's end grants shrink
            if self.error is not None:
                due = now + 0.2  # retrying a failed renewal
            if self._stop.wait(max(0.0, min(due, give_up) - now)):
                return
            if time.monotonic() >= give_up:
                continue
            self._renew_once(lease, give_up)

    def _renew_once(self, lease: Lease, give_up: float) -> None:
        """One renewal, in its own thread: the keeper never blocks past
        give_up on the network, whatever the call does."""
        out: dict = {}
        sent = time.monotonic()

        def call() -> None:
            try:
                out["res"] = self.client.renew(lease, service_instance_id=self.service_instance_id,
                                               timeout=max(0.05, give_up - sent))
            except E.StarleaseError as err:
                out["err"] = err
            except Exception as err:  # noqa: BLE001 - reported as a failed renewal
                out["err"] = E.BackendUnavailable("renewal failed (%s)" % type(err).__name__)

        t = threading.Thread(target=call, name="starlease-renew", daemon=True)
        t.start()
        t.join(max(0.0, give_up - time.monotonic()))
        if t.is_alive() or self._stop.is_set():
            return  # the next turn gives the lease up (or the holder released it)
        err = out.get("err")
        if isinstance(err, E.LeaseLost):
            self._lose_after(err)
        elif isinstance(err, _TRANSIENT):
            self.error = err
        elif err is not None:
            self._lose(REJECTED, err)
        elif _replay_of_ended(out["res"]):
            # The replay of a renewal whose answer was lost, and whose
            # lease has ended since: nothing is held.
            state = out["res"].current.state
            cause = _CAUSE_OF_STATE.get(state, REJECTED)
            self._lose(cause, E.LeaseLost("the renewed lease is %s now" % state, cause=cause))
        else:
            res = out["res"]
            with self._mu:
                self._lease = res.lease
                self._valid_until = sent + _grant(res.lease)
                self._sent = sent
            self.error = None

    def _lose_after(self, err: E.StarleaseError, default: str = REJECTED) -> None:
        """Marks the lease lost after a refusal, reading the lease to tell
        an administrator's action from expiry."""
        if self.lost.is_set():
            return
        cause = default
        try:
            state = self.client.get(self.lease.lease_id, timeout=2.0).lease.state
            cause = _CAUSE_OF_STATE.get(state, cause)
        except E.StarleaseError:
            pass
        self._lose(cause, err)

    def _lose(self, cause: str, err: Optional[E.StarleaseError]) -> None:
        with self._mu:
            if self.lost.is_set():
                return
            self.cause, self.error = cause, err
            self.lost.set()
        if self._on_lost is not None:
            self._on_lost(self)


# The cause of a loss by the state the lease is found in.
_CAUSE_OF_STATE = {"revoked": REVOKED, "released": FORCE_RELEASED, "expired": EXPIRED}


def _replay_of_ended(res: LeaseResult) -> bool:
    """Whether res is a replay whose lease has ended since (its state now
    is another than active)."""
    return res.replayed and res.current is not None and res.current.state != "active"


def _grant(lease: Lease) -> float:
    """How long the backend granted the lease from its renewal: expires_at -
    renewed_at, both backend times. It is the TTL, except near the maximum
    lifetime, where the backend grants less."""
    return max(0.0, min((lease.expires_at - lease.renewed_at).total_seconds(), lease.ttl))


def _release_quietly(client: Client, lease: Lease, service_instance_id: str) -> None:
    try:
        client.release(lease, service_instance_id=service_instance_id)
    except E.StarleaseError:
        pass


def _commit_id() -> str:
    return "cmt_" + new_request_id()[4:]


@contextlib.contextmanager
def lease(client: Client, identity: LockIdentity, *, ttl: float, service_instance_id: str, job_id: str,
          execution_id: Optional[str] = None, trace_id: str = "", metadata: Optional[Mapping[str, Any]] = None,
          wait: Optional[float] = None, margin: Optional[float] = None,
          on_lost: Optional[Callable[[HeldLease], None]] = None) -> Iterator[HeldLease]:
    """Acquires a lease on ``identity``, keeps it renewed while the block
    runs, and releases it on exit (also on an exception).

    Raises :class:`LeaseConflict` when another lease holds the identity (after
    ``wait`` seconds, if given). ``execution_id`` defaults to a fresh id.
    ``margin`` (seconds) is how long before the lease's end the keeper
    gives it up without a renewal; it defaults to a fifth of the TTL (at
    most 5 s). ``on_lost`` is called from the keeper's thread on loss."""
    execution_id = execution_id or "exec_" + new_request_id()[4:]
    sent = time.monotonic()
    res = client.acquire(identity, ttl=ttl, service_instance_id=service_instance_id, execution_id=execution_id,
                         job_id=job_id, trace_id=trace_id, metadata=metadata, wait=wait)
    if _replay_of_ended(res):
        # The client's retry of an acquire whose answer was lost, replayed
        # after the lease ended: nothing is held.
        state = res.current.state
        raise E.LeaseLost("the acquired lease is %s already" % state, cause=_CAUSE_OF_STATE.get(state, REJECTED))
    lease_now = res.lease
    if time.monotonic() - sent > _grant(lease_now) / 4:
        # The lease began somewhere between sending and the answer (an
        # acquire that waited for the identity): anchor the assumed end at
        # a renewal sent now, rather than give most of the TTL away.
        sent = time.monotonic()
        try:
            lease_now = client.renew(lease_now, service_instance_id=service_instance_id).lease
        except E.StarleaseError:
            _release_quietly(client, lease_now, service_instance_id)
            raise
    held = HeldLease(client, lease_now, service_instance_id=service_instance_id, execution_id=execution_id,
                     job_id=job_id, trace_id=trace_id, margin=margin, on_lost=on_lost, sent_at=sent)
    held._start()
    try:
        yield held
    finally:
        held.release()
