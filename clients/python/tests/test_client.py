"""Every route of the API through the Python client, with every typed
error, against a real starlease serve."""

from __future__ import annotations

import json
import os
import time

import pytest

import starlease
from conftest import DroppingProxy, Server, identity, unique

INST = "inst-py"


def acquire(c: starlease.Client, ident=None, **kw) -> starlease.LeaseResult:
    kw.setdefault("ttl", 30)
    kw.setdefault("service_instance_id", INST)
    kw.setdefault("execution_id", unique("exec"))
    kw.setdefault("job_id", unique("job"))
    return c.acquire(ident or identity(), **kw)


def test_lease_lifecycle(client: starlease.Client) -> None:
    ident = identity()
    res = acquire(client, ident, ttl=5)
    l = res.lease
    assert res.code == "lease_acquired" and not res.replayed and res.correlation_id
    assert res.request_id.startswith("req_")
    assert l.fencing_token >= 1 and l.state == "active" and l.ttl_ms == 5000
    assert l.lock_identity.target_id == ident.target_id and l.expires_at > l.acquired_at

    got = client.get(l.lease_id)
    assert (got.code, got.lease.lease_id, got.lease.fencing_token) == ("lease_inspected", l.lease_id, l.fencing_token)
    seen = client.inspect(ident)
    assert seen.lease.lease_id == l.lease_id

    time.sleep(0.02)
    renewed = client.renew(l, service_instance_id=INST, ttl=8)
    assert renewed.code == "lease_renewed"
    assert renewed.lease.fencing_token == l.fencing_token and renewed.lease.ttl_ms == 8000
    assert renewed.lease.expires_at > l.expires_at

    rel = client.release(renewed.lease, service_instance_id=INST)
    assert rel.code == "lease_released" and rel.lease.state == "released"
    assert client.get(l.lease_id).lease.state == "released"
    with pytest.raises(starlease.LeaseNotFound) as e:
        client.inspect(ident)
    assert e.value.status == 404 and e.value.code == "lease_not_found"

    # The counter never goes back: the next lease on the identity gets a
    # higher token.
    again = acquire(client, ident)
    assert again.lease.fencing_token > l.fencing_token
    client.release_by_delete(again.lease, service_instance_id=INST)
    assert client.get(again.lease.lease_id).lease.state == "released"


def test_conflict_and_lost_are_typed(client: starlease.Client, server: Server, keys) -> None:
    ident = identity()
    l = acquire(client, ident, ttl=5).lease
    other = server.client(keys["other"])
    with pytest.raises(starlease.LeaseConflict) as e:
        acquire(other, ident)
    assert e.value.status == 409 and e.value.correlation_id
    client.release(l, service_instance_id=INST)
    with pytest.raises(starlease.LeaseLost) as e:
        client.renew(l, service_instance_id=INST)
    assert e.value.status == 409 and e.value.code == "lease_lost"
    # A wrong service instance does not hold the lease either.
    l2 = acquire(client, ident).lease
    with pytest.raises(starlease.LeaseLost):
        client.renew(l2, service_instance_id="inst-other")
    client.release(l2, service_instance_id=INST)


def test_request_id_replays_and_conflicts(client: starlease.Client) -> None:
    ident = identity()
    rid = starlease.new_request_id()
    first = acquire(client, ident, request_id=rid, job_id="job-r", execution_id="exec-r")
    second = acquire(client, ident, request_id=rid, job_id="job-r", execution_id="exec-r")
    assert second.replayed and second.request_id == rid
    assert (second.lease.lease_id, second.lease.fencing_token) == (first.lease.lease_id, first.lease.fencing_token)
    with pytest.raises(starlease.IdempotencyConflict) as e:
        acquire(client, ident, request_id=rid, job_id="job-other", execution_id="exec-r")
    assert e.value.status == 409
    client.release(first.lease, service_instance_id=INST)


def test_outcome_unknown_is_resolved_by_the_same_request_id(server: Server, keys) -> None:
    # The proxy lets the first acquire reach the server and drops its
    # answer: the client must send the same request id again and get the
    # one lease, replayed, never a second acquisition.
    proxy = DroppingProxy(server.port, drop=1)
    try:
        c = starlease.Client("http://127.0.0.1:%d" % proxy.port, keys["actor"].api_key)
        ident = identity()
        res = acquire(c, ident)
        assert proxy.dropped == 1
        assert res.replayed, "the retry was not answered from the first request's record"
        direct = server.client(keys["actor"])
        assert direct.inspect(ident).lease.lease_id == res.lease.lease_id
        # When every answer is lost, the client says so with the request id
        # to resolve it by, and a later call with that id resolves it.
        proxy.drop = 10 ** 6
        rid = starlease.new_request_id()
        ident2 = identity()
        with pytest.raises(starlease.OutcomeUnknown) as e:
            acquire(c, ident2, request_id=rid, job_id="job-u", execution_id="exec-u", timeout=1.0)
        assert e.value.request_id == rid and rid in str(e.value)
        later = acquire(direct, ident2, request_id=rid, job_id="job-u", execution_id="exec-u")
        assert later.replayed and direct.inspect(ident2).lease.lease_id == later.lease.lease_id
        direct.release(later.lease, service_instance_id=INST)
        direct.release(res.lease, service_instance_id=INST)
    finally:
        proxy.close()


def test_invalid_requests_are_typed(client: starlease.Client) -> None:
    with pytest.raises(starlease.InvalidRequest) as e:
        acquire(client, starlease.LockIdentity("tenant-a", "program-a", "web", "bad\x00id", "pyenricher"))
    assert e.value.status == 400 and e.value.field
    with pytest.raises(starlease.InvalidRequest) as e:
        acquire(client, ttl=0.5)  # below the server's minimum TTL
    assert e.value.status == 400 and "ttl" in e.value.field
    with pytest.raises(starlease.InvalidRequest) as e:
        acquire(client, ttl=-1)  # refused before anything is sent
    assert e.value.status == 0 and e.value.field == "ttl_ms"
    with pytest.raises(starlease.InvalidRequest):
        client.get("")


def test_credentials_scope_and_capabilities(server: Server, keys, client: starlease.Client) -> None:
    bad = starlease.Client(server.base, "star_sk_v1_" + "0" * 26 + "_" + "0" * 64)
    with pytest.raises(starlease.InvalidCredential) as e:
        acquire(bad)
    assert e.value.status == 401
    assert "0" * 64 not in str(e.value) and "0" * 64 not in repr(bad)
    elsewhere = server.client(keys["elsewhere"])
    with pytest.raises(starlease.AccessDenied) as e:
        acquire(elsewhere)  # tenant-a is out of its scope
    assert e.value.status == 403
    l = acquire(client).lease
    with pytest.raises(starlease.AccessDenied):
        client.revoke(l, reason="an api client may not revoke")
    with pytest.raises(starlease.LeaseNotFound):
        client.get("lease_" + "1" * 26)
    client.release(l, service_instance_id=INST)


def test_deadline_and_unavailable(server: Server, keys) -> None:
    c = server.client(keys["actor"])
    with pytest.raises(starlease.DeadlineExceeded) as e:
        acquire(c, timeout=0.0001)
    assert e.value.status == 0
    closed = starlease.Client("http://127.0.0.1:%d" % _closed_port(), keys["actor"].api_key, timeout=0.5)
    with pytest.raises(starlease.BackendUnavailable) as e:
        closed.get("lease_x")
    assert keys["actor"].api_key not in str(e.value)
    with pytest.raises(starlease.BackendUnavailable):
        acquire(closed)  # nothing was sent: not outcome-unknown


def _closed_port() -> int:
    from conftest import free_port
    return free_port()


def test_rate_limited(env, tmp_path) -> None:
    s = Server(env.bin, str(tmp_path), env.amqp_url, "--principal-rate", "1")
    s.start()
    try:
        k = s.create_key("prn-py-rate")
        c = s.client(k, timeout=0.3)
        got = None
        for _ in range(20):
            try:
                acquire(c)
            except starlease.RateLimited as err:
                got = err
                break
        assert got is not None, "20 acquires a second were never rate limited at 1/s"
        assert got.status == 429 and got.retry_after and got.retry_after > 0
    finally:
        s.stop()


def test_admin_force_release_revoke_list_history(client: starlease.Client, admin: starlease.Client,
                                                  keys) -> None:
    ident = identity()
    l = acquire(client, ident).lease
    listed = client.list(owner_principal_id=keys["actor"].principal)
    assert l.lease_id in [x.lease_id for x in listed.leases] and listed.code == "lease_listed"
    by_target = admin.list(tenant_id=ident.tenant_id, program_id=ident.program_id,
                           target_namespace=ident.target_namespace, target_id=ident.target_id)
    assert [x.lease_id for x in by_target.leases] == [l.lease_id]
    with pytest.raises(starlease.InvalidRequest):
        admin.force_release(l)  # a reason or incident id is required
    fr = admin.force_release(l, reason="stuck crawler")
    assert fr.code == "lease_released" and fr.lease.state == "released"
    with pytest.raises(starlease.LeaseLost):
        client.renew(l, service_instance_id=INST)

    l2 = acquire(client, ident).lease
    rv = admin.revoke(l2, incident_id="INC-1234")
    assert rv.code == "lease_revoked" and rv.lease.state == "revoked"
    assert client.get(l2.lease_id).lease.state == "revoked"

    hist = admin.history(l2.lease_id, page_size=10)
    ended = {(h.lease.lease_id, h.lease.state) for h in hist.history}
    assert {(l.lease_id, "released"), (l2.lease_id, "revoked")} <= ended
    reasons = {h.lease.lease_id: (h.reason, h.incident_id) for h in hist.history}
    assert reasons[l.lease_id][0] == "stuck crawler" and reasons[l2.lease_id][1] == "INC-1234"
    with pytest.raises(starlease.AccessDenied):
        client.history(l2.lease_id)  # audit:read is the administrator's


def test_list_pages(client: starlease.Client, keys) -> None:
    held = [acquire(client).lease for _ in range(3)]
    seen, token = [], ""
    for _ in range(10):
        page = client.list(owner_principal_id=keys["actor"].principal, page_size=1, page_token=token)
        assert len(page.leases) <= 1
        seen += [x.lease_id for x in page.leases]
        token = page.next_page_token
        if not token:
            break
    assert {x.lease_id for x in held} <= set(seen)
    for l in held:
        client.release(l, service_instance_id=INST)


def test_service_routes(client: starlease.Client) -> None:
    assert client.healthz()["status"] == "ok"
    ready, body = client.readyz()
    assert ready and body["status"] in ("ready", "ok")
    assert "starlease_" in client.metrics()
    doc = client.openapi()
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "httpapi", "openapi.json")) as f:
        assert doc == json.load(f)


def test_correlation_id(client: starlease.Client) -> None:
    with starlease.correlation("corr-py-0001"):
        res = acquire(client)
        assert res.correlation_id == "corr-py-0001"
        with pytest.raises(starlease.LeaseConflict) as e:
            acquire(client, res.lease.lock_identity)
        assert e.value.correlation_id == "corr-py-0001"
    client.release(res.lease, service_instance_id=INST)
