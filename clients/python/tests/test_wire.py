"""The client against a scripted server: what it does with answers a real
server should never give, and with lost answers."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Callable, List

import pytest

import starlease

KEY = "star_sk_v1_01M8XVRKB0BZEZ8NSZCXQPD7EY_" + "ab" * 32
IDENT = starlease.LockIdentity("tenant-a", "program-a", "web", "example.com", "pyenricher")
LEASE = {"lock_identity": {"tenant_id": "tenant-a", "program_id": "program-a", "target_namespace": "web",
                           "target_id": "example.com", "actor_name": "pyenricher"},
         "lease_id": "lease_1", "fencing_token": 7, "acquired_at": "2026-12-03T10:00:00.000Z",
         "renewed_at": "2026-12-03T10:00:00.000Z", "expires_at": "2026-12-03T10:00:30.000Z", "ttl_ms": 30000,
         "state": "active"}


class Scripted:
    """Answers request i with script[i](handler, body); records bodies."""

    def __init__(self, script: List[Callable]) -> None:
        self.script, self.bodies = script, []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                outer.bodies.append(json.loads(self.rfile.read(n)))
                outer.script[min(len(outer.bodies), len(outer.script)) - 1](self)

            do_GET = do_POST

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.client = starlease.Client("http://127.0.0.1:%d" % self.srv.server_port, KEY, timeout=3)

    def close(self) -> None:
        self.srv.shutdown()


def answer(status: int, body) -> Callable:
    def f(h):
        b = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(b)))
        h.end_headers()
        h.wfile.write(b)
    return f


def hang_up(h) -> None:
    h.close_connection = True
    h.connection.shutdown(2)


def err(code: str, status: int) -> Callable:
    return answer(status, {"status": "error", "code": code, "msg": "m", "correlation_id": "corr_1",
                           "retryable": True})


def acquire(c: starlease.Client, **kw):
    return c.acquire(IDENT, ttl=30, service_instance_id="i", execution_id="e", job_id="j", **kw)


@pytest.fixture
def scripted():
    made = []

    def make(*script):
        s = Scripted(list(script))
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def test_lost_answer_then_nothing_done_stays_unknown(scripted) -> None:
    s = scripted(hang_up, err("deadline_exceeded", 408))
    with pytest.raises(starlease.OutcomeUnknown) as e:
        acquire(s.client)
    assert len(s.bodies) == 2 and s.bodies[0] == s.bodies[1], "the retry was not the same request"
    assert e.value.request_id == s.bodies[0]["request_id"]


def test_lost_answers_are_resent_with_the_same_request_id(scripted) -> None:
    ok = answer(200, {"status": "success", "code": "lease_acquired", "correlation_id": "corr_1", "lease": LEASE,
                      "replayed": True})
    s = scripted(hang_up, err("lease_outcome_unknown", 503), err("lease_backend_unavailable", 503), ok)
    res = acquire(s.client)
    assert res.replayed and res.lease.fencing_token == 7
    assert len({b["request_id"] for b in s.bodies}) == 1 and len(s.bodies) == 4


@pytest.mark.parametrize("bad", [
    answer(200, {"status": "success", "code": "lease_renewed", "correlation_id": "c", "lease": LEASE}),
    answer(200, {"status": "success", "code": "lease_acquired", "lease": LEASE}),
    answer(200, {"status": "success", "code": "lease_acquired", "correlation_id": "c",
                 "lease": dict(LEASE, fencing_token=0)}),
    answer(200, {"status": "success", "code": "lease_acquired", "correlation_id": "c",
                 "lease": dict(LEASE, state="maybe")}),
    # A code with another status than the contract's table gives it.
    answer(409, {"status": "error", "code": "lease_rate_limited", "msg": "", "correlation_id": "c",
                 "retryable": True}),
    answer(503, {"status": "error", "code": "no_such_code", "msg": "", "correlation_id": "c", "retryable": True}),
])
def test_untrustworthy_answers_to_a_mutation_are_outcome_unknown(scripted, bad) -> None:
    s = scripted(bad)
    with pytest.raises(starlease.OutcomeUnknown) as e:
        acquire(s.client, timeout=0.5)
    assert KEY not in str(e.value) and KEY[-64:] not in str(e.value)


def test_untrustworthy_answer_to_a_read_is_unavailable(scripted) -> None:
    s = scripted(answer(200, {"status": "success", "code": "lease_listed", "correlation_id": "c", "lease": LEASE}))
    with pytest.raises(starlease.BackendUnavailable):
        s.client.get("lease_1")


def test_a_commit_answer_for_another_write_is_refused(scripted) -> None:
    commit = {"lock_key": "starintel:target-lease:v1:" + "A" * 43, "sink": "couchdb", "commit_id": "c-1",
              "lease_id": "lease_1", "fencing_token": 7, "execution_id": "e", "job_id": "j", "target": "doc-OTHER",
              "payload_sha256": "0" * 64, "commit_seq": 1, "accepted_at": "2026-12-03T10:00:01.000Z",
              "backend_time": "2026-12-03T10:00:01.000Z"}
    s = scripted(answer(200, {"status": "success", "code": "lease_inspected", "correlation_id": "c",
                              "commit": commit}))
    lease = starlease.Lease.from_wire(LEASE)
    with pytest.raises(starlease.OutcomeUnknown):
        s.client.authorize_commit(lease, service_instance_id="i", execution_id="e", job_id="j", sink="couchdb",
                                  commit_id="c-1", target="doc-1", payload_sha256="0" * 64, timeout=0.5)


def test_request_ids_do_not_look_like_secrets() -> None:
    ids = {starlease.new_request_id() for _ in range(1000)}
    assert len(ids) == 1000
    for i in ids:
        assert i.startswith("req_") and len(i) == 30 and not i.startswith("star_sk_")
