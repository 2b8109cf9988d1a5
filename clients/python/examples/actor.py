#!/usr/bin/env python3
"""A leased StarIntel actor: consume targets from RabbitMQ, hold a lease on
each, write the result to a fenced CouchDB database, publish it through
the fenced outbox, release.

    STARLEASE_URL=http://127.0.0.1:8080 STARLEASE_API_KEY_FILE=key \\
    AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ COUCHDB_URL=http://127.0.0.1:5984/results \\
    python3 actor.py --queue actors.pyenricher.new.target

A target message is JSON: {"tenant_id", "program_id", "target_namespace",
"target_id", "job_id"}. The result goes to the document "enrichment:<target>"
and, as a publication, to the "documents" exchange with routing key
"documents.ingest.enrichment".

The actor writes one JSON line per event to stdout (leased, written,
published, refused, done). A write refused because the lease was lost is
the expected end of a stale holder's work: the actor logs it, acknowledges
the message (the successor owns the target) and goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys

import pika

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import starlease  # noqa: E402


def event(kind: str, **fields) -> None:
    print(json.dumps(dict(event=kind, pid=os.getpid(), **fields)), flush=True)


def pause_here(point: str) -> None:
    # For the stale-actor test: stop this whole process (keeper included),
    # as a long GC pause or a frozen VM would.
    if os.environ.get("ACTOR_PAUSE_AT") == point:
        event("paused", at=point)
        os.kill(os.getpid(), signal.SIGSTOP)


def enrich(target_id: str) -> dict:
    return {"type": "enrichment", "target": target_id, "resolved": socket.getfqdn("localhost") != "",
            "actor_pid": os.getpid()}


def handle(client: starlease.Client, couch: starlease.CouchDB, args, msg: dict) -> None:
    ident = starlease.LockIdentity(msg["tenant_id"], msg["program_id"], msg["target_namespace"], msg["target_id"],
                                   args.actor)
    with starlease.lease(client, ident, ttl=args.ttl, service_instance_id=args.instance, job_id=msg["job_id"],
                         wait=args.wait) as held:
        event("leased", target=msg["target_id"], token=held.lease.fencing_token, lease_id=held.lease.lease_id)
        pause_here("after-lease")
        result = enrich(msg["target_id"])
        doc_id = "enrichment:" + msg["target_id"]
        raw, _ = starlease.couch.encode_body(result)
        commit = held.authorize(sink="couchdb", target=doc_id, payload_sha256=starlease.payload_sha256(raw))
        pause_here("after-authorize")
        # write_couch is authorize + put_fenced; they are split here only
        # so the test can pause between them.
        w = couch.put_fenced(commit.guard(), "couchdb", doc_id, raw)
        event("written", doc_id=doc_id, rev=w.rev, token=held.lease.fencing_token)
        pub = held.publish("documents.ingest.enrichment", json.dumps(result).encode(), exchange="documents",
                           content_type="application/json", commit_id="publish-" + commit.commit_id)
        event("published", message_id=pub.message_id, token=held.lease.fencing_token)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", required=True)
    p.add_argument("--actor", default="pyenricher")
    p.add_argument("--instance", default="inst-" + socket.gethostname() + "-" + str(os.getpid()))
    p.add_argument("--ttl", type=float, default=30.0)
    p.add_argument("--wait", type=float, default=10.0, help="seconds to wait for a held target")
    p.add_argument("--max-messages", type=int, default=0, help="stop after this many (0: never)")
    args = p.parse_args()

    with open(os.environ["STARLEASE_API_KEY_FILE"]) as f:
        client = starlease.Client(os.environ["STARLEASE_URL"], f.read().strip())
    couch = starlease.CouchDB(os.environ["COUCHDB_URL"])
    conn = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    handled = 0
    for method, _props, body in ch.consume(args.queue):
        try:
            handle(client, couch, args, json.loads(body))
        except (starlease.LeaseLost, starlease.CommitRejected) as err:
            # A stale holder: the successor owns the target now.
            event("refused", code=err.code, cause=getattr(err, "cause", ""), msg=err.msg)
        except starlease.LeaseConflict:
            # Another actor holds the target past our wait: try again later.
            event("busy")
            ch.basic_nack(method.delivery_tag, requeue=True)
            continue
        ch.basic_ack(method.delivery_tag)
        handled += 1
        if args.max_messages and handled >= args.max_messages:
            break
    ch.cancel()
    conn.close()
    event("done", handled=handled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
