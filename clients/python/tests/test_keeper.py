"""The keeper: renewal, and every way a held lease is lost."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time

import pytest

import starlease
from conftest import Server, identity, unique

INST = "inst-py"


def test_keeper_renews_and_releases(client: starlease.Client) -> None:
    ident = identity()
    with starlease.lease(client, ident, ttl=1.5, service_instance_id=INST, job_id="job-k") as h:
        first = h.lease
        time.sleep(3.5)  # more than two TTLs
        assert not h.lost.is_set(), h.cause
        now = client.get(first.lease_id).lease
        assert now.state == "active" and now.fencing_token == first.fencing_token
        assert now.renewed_at > first.renewed_at and now.expires_at > dt.datetime.now(dt.timezone.utc)
    assert client.get(first.lease_id).lease.state == "released"
    with pytest.raises(starlease.LeaseNotFound):
        client.inspect(ident)


def test_keeper_releases_on_exception(client: starlease.Client) -> None:
    ident = identity()
    with pytest.raises(RuntimeError):
        with starlease.lease(client, ident, ttl=5, service_instance_id=INST, job_id="job-k") as h:
            lease_id = h.lease.lease_id
            raise RuntimeError("work failed")
    assert client.get(lease_id).lease.state == "released"


@pytest.mark.parametrize("action,cause", [("revoke", starlease.REVOKED), ("force_release", starlease.FORCE_RELEASED)])
def test_loss_by_an_administrator(client: starlease.Client, admin: starlease.Client, action: str,
                                  cause: str) -> None:
    seen = []
    with starlease.lease(client, identity(), ttl=1.5, service_instance_id=INST, job_id="job-k",
                         on_lost=lambda h: seen.append(h.cause)) as h:
        getattr(admin, action)(h.lease, reason="test: " + action)
        assert h.lost.wait(5), "the keeper did not notice within a few renewals"
        assert h.cause == cause and seen == [cause]
        with pytest.raises(starlease.LeaseLost) as e:
            h.check()
        assert e.value.cause == cause


def test_expiry_under_a_paused_keeper(client: starlease.Client) -> None:
    # The keeper's renewals hang (a stalled thread, a black-holed network):
    # it must give the lease up before the server's expiry, on its own
    # clock, and the server must refuse the holder after the expiry.
    h_ctx = starlease.lease(client, identity(), ttl=2, service_instance_id=INST, job_id="job-k", margin=0.4)
    h = h_ctx.__enter__()
    try:
        hang = threading.Event()
        real = h.client
        h.client = _Hanging(real, hang)
        expires = h.lease.expires_at
        assert h.lost.wait(5)
        lost_at = dt.datetime.now(dt.timezone.utc)
        assert h.cause == starlease.EXPIRED
        assert lost_at < expires, "the keeper gave up after the lease's end"
        h.client = real
        time.sleep(max(0.0, (expires - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.2)
        with pytest.raises(starlease.LeaseLost):
            real.authorize_commit(h.lease, service_instance_id=INST, execution_id=h.execution_id, job_id=h.job_id,
                                  sink="couchdb", commit_id=unique("c"), target="doc-x")
        hang.set()
    finally:
        h_ctx.__exit__(None, None, None)


class _Hanging:
    """A client whose renew never answers."""

    def __init__(self, real: starlease.Client, release: threading.Event) -> None:
        self._real, self._release = real, release

    def renew(self, *a, **kw):
        self._release.wait(30)
        raise starlease.BackendUnavailable("hung")

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_server_killed_and_restarted(own_server: Server) -> None:
    key = own_server.create_key("prn-py-restart")
    c = own_server.client(key, timeout=1.0)
    with starlease.lease(c, identity(), ttl=6, service_instance_id=INST, job_id="job-k", margin=1.2) as h:
        before = h.lease
        own_server.kill()
        time.sleep(1.5)
        own_server.start()  # same data, same port
        limit = time.monotonic() + 6
        while h.lease.renewed_at == before.renewed_at and time.monotonic() < limit:
            time.sleep(0.1)
        assert not h.lost.is_set(), h.cause
        assert h.lease.renewed_at > before.renewed_at and h.lease.fencing_token == before.fencing_token
    assert c.get(before.lease_id).lease.state == "released"


def test_server_down_past_the_margin(own_server: Server) -> None:
    key = own_server.create_key("prn-py-down")
    c = own_server.client(key, timeout=0.5)
    # ttl 4: a loaded machine must still fit a failed renewal (the cause)
    # before the give-up time.
    with starlease.lease(c, identity(), ttl=4, service_instance_id=INST, job_id="job-k", margin=0.5) as h:
        expires = h.lease.expires_at
        own_server.kill()
        assert h.lost.wait(8)
        assert h.cause == starlease.BACKEND_UNAVAILABLE
        assert dt.datetime.now(dt.timezone.utc) < expires
        with pytest.raises(starlease.LeaseLost):
            h.publish("q", b"never")


# Found by review: a renewal (or acquire) whose answer was lost is retried by
# the client with the same request id; if the lease ended in between, the
# replay says so in ``current``. The keeper must take that as the loss it
# is, not as a renewal extending the lease's assumed end by a grant.
class _ReplaysEnded:
    """A client whose renew and acquire answer a replay of a lease that an
    administrator has revoked since."""

    def __init__(self, lease: starlease.Lease) -> None:
        self.held, self.now = lease, dataclasses.replace(lease, state="revoked")

    def renew(self, *a, **kw) -> starlease.LeaseResult:
        return starlease.LeaseResult("lease_renewed", "corr", self.held, "req", self.now, True)

    def acquire(self, *a, **kw) -> starlease.LeaseResult:
        return starlease.LeaseResult("lease_acquired", "corr", self.held, "req", self.now, True)

    def get(self, *a, **kw) -> starlease.LeaseResult:
        return starlease.LeaseResult("lease_inspected", "corr", self.now)


def _active_lease(ttl: float) -> starlease.Lease:
    now = dt.datetime.now(dt.timezone.utc)

    def ts(d: dt.datetime) -> str:
        return d.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    return starlease.Lease.from_wire({
        "lock_identity": {"tenant_id": "tenant-a", "program_id": "program-a", "target_namespace": "ns", "target_id": "t1",
                          "actor_name": "a", "workflow_name": "", "operation_class": "exclusive_mutation"},
        "lease_id": "lease_x", "fencing_token": 1, "acquired_at": ts(now), "renewed_at": ts(now),
        "expires_at": ts(now + dt.timedelta(seconds=ttl)), "ttl_ms": int(ttl * 1000), "state": "active"})


def test_replayed_renewal_of_an_ended_lease_is_lost() -> None:
    fake = _ReplaysEnded(_active_lease(10))
    h = starlease.HeldLease(fake, fake.held, service_instance_id=INST, execution_id="e", job_id="j", sent_at=time.monotonic() - 5)
    before = h._valid_until
    h._renew_once(fake.held, time.monotonic() + 5)
    assert h.lost.is_set() and h.cause == starlease.REVOKED
    assert h._valid_until == before, "the replay extended the lease's assumed end"
    with pytest.raises(starlease.LeaseLost) as e:
        h.check()
    assert e.value.cause == starlease.REVOKED


def test_replayed_acquire_of_an_ended_lease_is_lost() -> None:
    fake = _ReplaysEnded(_active_lease(10))
    with pytest.raises(starlease.LeaseLost) as e:
        with starlease.lease(fake, identity(), ttl=10, service_instance_id=INST, job_id="j"):
            pytest.fail("the work ran on a lease that had already ended")
    assert e.value.cause == starlease.REVOKED
