"""Fenced writes from Python: CouchDB documents and publications, and what
a stale holder can no longer do."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Dict, List

import pika
import pytest

import starlease
from conftest import Server, identity, unique

INST = "inst-py"


def held(client: starlease.Client, ident=None, ttl: float = 30):
    return starlease.lease(client, ident or identity(), ttl=ttl, service_instance_id=INST, job_id=unique("job"))


def test_write_couch_lands_with_the_guard(client: starlease.Client, fenced_db: starlease.CouchDB) -> None:
    doc_id = unique("doc")
    body = {"target": "example.com", "emails": ["a@example.com"], "n": 1}
    with held(client) as h:
        w = h.write_couch(fenced_db, doc_id, body, commit_id="c-1")
        assert not w.already_written and w.rev.startswith("1-")
        stored = fenced_db.get(doc_id)
        g = stored[starlease.FENCE_FIELD]
        raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        assert g["target"] == doc_id and g["payload_sha256"] == hashlib.sha256(raw).hexdigest()
        assert (g["lease_id"], g["fencing_token"], g["job_id"], g["sink"]) == (
            h.lease.lease_id, h.lease.fencing_token, h.job_id, "couchdb")
        assert g["commit_seq"] >= 1 and g["commit_id"] == "c-1"
        assert {k: v for k, v in stored.items() if not k.startswith("_") and k != starlease.FENCE_FIELD} == body

        # Repeating the write after an unknown outcome: found, nothing sent.
        again = h.write_couch(fenced_db, doc_id, body, commit_id="c-1")
        assert again.already_written and fenced_db.get(doc_id)["_rev"] == stored["_rev"]
        # The same commit id for another body is refused by the server.
        with pytest.raises(starlease.IdempotencyConflict):
            h.write_couch(fenced_db, doc_id, {"n": 2}, commit_id="c-1")
        # A second commit of the lease updates the document.
        w2 = h.write_couch(fenced_db, doc_id, {"n": 2})
        assert w2.rev.startswith("2-") and fenced_db.get(doc_id)["n"] == 2
        # Typed documents are the typed sinks' (bound to the identity).
        with pytest.raises(starlease.InvalidRequest) as e:
            h.write_couch(fenced_db, "target:" + doc_id, body)
        assert e.value.field == "doc_id"
        with pytest.raises(starlease.InvalidRequest):
            h.write_couch(fenced_db, doc_id, {"_id": "x"})


def test_stale_holder_lands_nothing_in_couch(client: starlease.Client, admin: starlease.Client, server: Server,
                                            keys, fenced_db: starlease.CouchDB) -> None:
    ident, doc_id = identity(), unique("doc")
    other = server.client(keys["other"])
    with held(client, ident) as a:
        a.write_couch(fenced_db, doc_id, {"by": "a", "n": 1})
        first_guard = fenced_db.get(doc_id)[starlease.FENCE_FIELD]
        # A guard for a later write, authorized while the lease is held:
        body = json.dumps({"by": "a", "n": 99}, sort_keys=True, separators=(",", ":")).encode()
        stale = a.authorize(sink="couchdb", target=doc_id, payload_sha256=hashlib.sha256(body).hexdigest())
        admin.revoke(a.lease, reason="test: stale holder")
        assert a.lost.wait(15) and a.cause == starlease.REVOKED
        with pytest.raises(starlease.LeaseLost):
            a.write_couch(fenced_db, doc_id, {"by": "a", "n": 2})
        # The server refuses the commit itself, not only the local check.
        with pytest.raises(starlease.LeaseLost):
            client.authorize_commit(a.lease, service_instance_id=INST, execution_id=a.execution_id,
                                    job_id=a.job_id, sink="couchdb", commit_id=unique("c"), target=doc_id,
                                    payload_sha256="0" * 64)
        with starlease.lease(other, ident, ttl=30, service_instance_id="inst-b", job_id="job-b") as b:
            assert b.lease.fencing_token > a.lease.fencing_token
            b.write_couch(fenced_db, doc_id, {"by": "b"})
            # The guard authorized before the revoke is refused by CouchDB's
            # fence: a lower token than the document's.
            with pytest.raises(starlease.CommitRejected):
                fenced_db.put_fenced(stale.guard(), "couchdb", doc_id, body)
            # Replaying A's first, accepted guard for its own body too.
            with pytest.raises(starlease.CommitRejected):
                fenced_db.put_fenced(first_guard, "couchdb", doc_id, {"by": "a", "n": 1})
    stored = fenced_db.get(doc_id)
    assert stored["by"] == "b" and stored[starlease.FENCE_FIELD]["fencing_token"] > a.lease.fencing_token


def test_couch_refuses_without_the_fence(client: starlease.Client, env) -> None:
    import urllib.request
    name = "py_unfenced_" + unique("db").replace("-", "_")
    req = urllib.request.Request(env.couch_url + "/" + name, method="PUT")
    urllib.request.urlopen(req).close()
    db = starlease.CouchDB(env.couch_url + "/" + name)
    with held(client) as h:
        with pytest.raises(starlease.FenceMissing):
            h.write_couch(db, unique("doc"), {"n": 1})


class Queue:
    """Consumes a queue on the broker in a thread; keeps every delivery."""

    def __init__(self, amqp_url: str, name: str) -> None:
        self.name = name
        self.got: List[Dict] = []
        self._cv = threading.Condition()
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        ch = conn.channel()
        ch.queue_declare(name, durable=True)
        conn.close()
        self._url = amqp_url
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self._url))
        ch = conn.channel()
        for method, props, body in ch.consume(self.name, auto_ack=True, inactivity_timeout=0.1):
            if self._stop.is_set():
                break
            if method is None:
                continue
            with self._cv:
                self.got.append({"message_id": props.message_id, "headers": dict(props.headers or {}),
                                 "body": body, "content_type": props.content_type,
                                 "delivery_mode": props.delivery_mode})
                self._cv.notify_all()
        conn.close()

    def wait_for(self, pred, timeout: float = 20) -> Dict:
        with self._cv:
            limit = time.monotonic() + timeout
            while True:
                for d in self.got:
                    if pred(d):
                        return d
                left = limit - time.monotonic()
                assert left > 0, "no such delivery within %ss; got %r" % (timeout, self.got)
                self._cv.wait(left)

    def close(self) -> None:
        self._stop.set()
        self._t.join(5)


def test_publish_through_the_outbox(client: starlease.Client, admin: starlease.Client, env) -> None:
    q = Queue(env.amqp_url, unique("py-results"))
    try:
        with held(client) as h:
            p = h.publish(q.name, b'{"result": 1}', content_type="application/json", commit_id="pub-1")
            assert p.message_id.startswith("msg_") and not p.replayed
            assert p.commit.payload_sha256 == hashlib.sha256(b'{"result": 1}').hexdigest()
            again = h.publish(q.name, b'{"result": 1}', content_type="application/json", commit_id="pub-1")
            assert again.replayed and again.message_id == p.message_id
            with pytest.raises(starlease.IdempotencyConflict):
                h.publish(q.name, b'{"result": 2}', commit_id="pub-1")
            d = q.wait_for(lambda d: d["message_id"] == p.message_id)
            assert d["body"] == b'{"result": 1}' and d["content_type"] == "application/json"
            assert d["delivery_mode"] == 2
            hd = d["headers"]
            assert hd["x-starintel-fencing-token"] == h.lease.fencing_token
            assert hd["x-starintel-lease-id"] == h.lease.lease_id and hd["x-starintel-commit-id"] == "pub-1"
            assert hd["x-starintel-lock-key"] == p.commit.lock_key

            # Application headers travel with the message; the fence's own
            # names cannot be set by a caller.
            ph = h.publish(q.name, b"with headers", headers={"x-dtype": "enrichment", "trace": "t-1"})
            dh = q.wait_for(lambda d: d["message_id"] == ph.message_id)["headers"]
            assert (dh["x-dtype"], dh["trace"]) == ("enrichment", "t-1")
            assert dh["x-starintel-fencing-token"] == h.lease.fencing_token
            with pytest.raises(starlease.InvalidRequest) as e:
                h.publish(q.name, b"forged", headers={"X-StarIntel-Fencing-Token": "999"})
            assert e.value.field == "outbox.headers" and e.value.status == 400

            admin.revoke(h.lease, reason="test: publication after revoke")
            with pytest.raises(starlease.LeaseLost):
                h.publish(q.name, b"refused")
        # A publication accepted after the refused one arrives; the refused
        # one never does (the outbox is published in acceptance order).
        with held(client) as h2:
            p2 = h2.publish(q.name, b"sentinel")
        q.wait_for(lambda d: d["message_id"] == p2.message_id)
        time.sleep(0.3)
        assert [d for d in q.got if d["body"] in (b"refused", b"forged")] == []
        # The consumer-side filter: the delivery seen twice is a duplicate.
        dd = starlease.Deduper()
        first = q.got[0]
        assert dd.check(first["message_id"], first["headers"]).verdict == "process"
        assert dd.check(first["message_id"], first["headers"]).verdict == "duplicate"
        assert dd.check("msg_forged", {}).verdict == "unfenced"
    finally:
        q.close()
