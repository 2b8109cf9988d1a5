"""The worked actor (examples/actor.py) against real servers, and a stale
actor: paused (SIGSTOP) past its TTL while a successor takes over, then
resumed. Its CouchDB write is refused, its publication never reaches the
queue, and the consumer sees exactly the successor's result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List

import pika
import pytest

import starlease
from conftest import Server, TENANT, PROGRAM, unique

ACTOR = os.path.join(os.path.dirname(__file__), "..", "examples", "actor.py")


class Actor:
    def __init__(self, env, server: Server, key_file: str, queue: str, couch_url: str, pause_at: str = "") -> None:
        e = {k: v for k, v in os.environ.items() if not k.startswith("STARLEASE_")}
        e.update(STARLEASE_URL=server.base, STARLEASE_API_KEY_FILE=key_file, AMQP_URL=env.amqp_url,
                 COUCHDB_URL=couch_url, ACTOR_PAUSE_AT=pause_at,
                 PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
        self.proc = subprocess.Popen([sys.executable, ACTOR, "--queue", queue, "--ttl", "2", "--wait", "15",
                                      "--max-messages", "1"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.events: List[Dict] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.events.append(json.loads(line))
                self._cv.notify_all()

    def wait_event(self, kind: str, timeout: float = 30) -> Dict:
        limit = time.monotonic() + timeout
        with self._cv:
            while True:
                for ev in self.events:
                    if ev["event"] == kind:
                        return ev
                left = limit - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not any(e["event"] == kind for e in self.events):
                    if left > 0:
                        self._cv.wait(0.2)  # the last lines may still be read
                        if any(e["event"] == kind for e in self.events):
                            continue
                    stderr = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                    pytest.fail("actor %d: no %s event; events %r; stderr %s" % (self.proc.pid, kind,
                                                                                  self.events, stderr[-2000:]))
                self._cv.wait(min(left, 0.2))

    def stopped(self) -> bool:
        with open("/proc/%d/stat" % self.proc.pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"


def declare(amqp_url: str, target_queue: str, ingest_queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.exchange_declare("documents", exchange_type="topic", durable=True)
    ch.queue_declare(target_queue, durable=True)
    ch.queue_bind(target_queue, "documents", routing_key=target_queue)
    ch.queue_declare(ingest_queue, durable=True)
    ch.queue_bind(ingest_queue, "documents", routing_key="documents.ingest.#")
    conn.close()


def send_target(amqp_url: str, queue: str, target: str, job: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().basic_publish("documents", queue, json.dumps({
        "tenant_id": TENANT, "program_id": PROGRAM, "target_namespace": "web", "target_id": target, "job_id": job}),
        pika.BasicProperties(delivery_mode=2, content_type="application/json"))
    conn.close()


def drain(amqp_url: str, queue: str, settle: float) -> List[Dict]:
    """Every delivery on queue until it stays empty for settle seconds."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    got = []
    for method, props, body in ch.consume(queue, inactivity_timeout=settle):
        if method is None:
            break
        got.append({"message_id": props.message_id, "headers": dict(props.headers or {}), "body": body})
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.close()
    return got


@pytest.mark.parametrize("pause_at", ["after-lease", "after-authorize"])
def test_stale_actor_lands_nothing(env, server: Server, keys, tmp_path, pause_at: str) -> None:
    target_queue, ingest = "actors.pyenricher.new.target", unique("ingest-watch")
    declare(env.amqp_url, target_queue, ingest)
    key_file = tmp_path / "key"
    key_file.write_text(keys["actor"].api_key)
    key_file.chmod(0o600)
    couch_url = env.couch_url + "/" + env.fenced_dbs[1]
    couch = starlease.CouchDB(couch_url)
    target = unique("target") + ".example"

    send_target(env.amqp_url, target_queue, target, "job-1")
    a = Actor(env, server, str(key_file), target_queue, couch_url, pause_at=pause_at)
    leased_a = a.wait_event("leased")
    a.wait_event("paused")
    for _ in range(100):
        if a.stopped():
            break
        time.sleep(0.01)
    assert a.stopped(), "actor A did not stop itself"
    try:
        # The target is dispatched again; B waits for A's lease to expire
        # (2 s TTL) and takes over.
        send_target(env.amqp_url, target_queue, target, "job-2")
        b = Actor(env, server, str(key_file), target_queue, couch_url)
        leased_b = b.wait_event("leased")
        assert leased_b["token"] > leased_a["token"]
        published_b = b.wait_event("published")
        assert b.proc.wait(30) == 0
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    refused = a.wait_event("refused")
    assert a.proc.wait(30) == 0
    assert refused["code"] in ("lease_lost", "commit_rejected"), refused
    if pause_at == "after-authorize":
        # A held a guard for its write: CouchDB's fence refused it.
        assert refused["code"] == "commit_rejected", refused
    assert not [e for e in a.events if e["event"] in ("written", "published")], a.events

    doc = couch.get("enrichment:" + target)
    assert doc["actor_pid"] == b.proc.pid
    assert doc[starlease.FENCE_FIELD]["fencing_token"] == leased_b["token"]
    got = drain(env.amqp_url, ingest, settle=1.5)
    dd = starlease.Deduper()
    processed = [d for d in got if not dd.check(d["message_id"], d["headers"]).dropped]
    assert [d["message_id"] for d in processed] == [published_b["message_id"]], got
    assert json.loads(processed[0]["body"])["actor_pid"] == b.proc.pid
    assert processed[0]["headers"]["x-starintel-fencing-token"] == leased_b["token"]
