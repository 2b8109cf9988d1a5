"""Adversarial tests of the Python client, written by an outside review.

The tests noted "found by review" failed on the first version of the
client; the others pin attacks that held up.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import time

import pytest

import starlease
from conftest import Server, identity, unique
from test_wire import KEY, LEASE, answer, scripted  # noqa: F401 - the fixture

INST = "inst-py-adversarial"


# Found by review (medium): the keeper declares loss too late once renewals are
# capped by the lease's maximum lifetime. The server bounds expires_at by
# acquired_at + maximum_lifetime_ms but keeps ttl_ms at the policy TTL
# (bolt/ops.go expiry; valkey likewise), and HeldLease._renew_once sets
# _valid_until = sent + res.lease.ttl, ignoring expires_at. Near the end of
# the lifetime the keeper therefore assumes the lease runs up to a TTL past
# its real end: held.check() passes and held.lost stays clear after the
# backend has expired the lease, until a later renewal is refused (up to
# ~TTL/3 late here; with a failing backend up to TTL - margin late). The
# module doc promises "given up early, never late"; the contract requires
# cancellation before expiry with a safety margin. Fencing still refuses
# the stale commits (checked below), so the impact is late cancellation.
# Fix: anchor on the server's own duration: _valid_until = sent +
# (expires_at - renewed_at) of the answer (both backend times), in
# _renew_once and in lease() for the acquire.
def test_keeper_gives_up_after_the_maximum_lifetime(env, tmp_path) -> None:
    s = Server(env.bin, str(tmp_path), env.amqp_url, "--max-lifetime", "4s")
    s.start()
    try:
        c = s.client(s.create_key("prn-py-attack-life"))
        lost_at = []
        with starlease.lease(c, identity(), ttl=3, service_instance_id=INST, job_id="job-life", margin=0.3,
                             on_lost=lambda h: lost_at.append(dt.datetime.now(dt.timezone.utc))) as h:
            end = h.lease.acquired_at + dt.timedelta(seconds=4)  # the server's hard end
            while dt.datetime.now(dt.timezone.utc) < end + dt.timedelta(milliseconds=100):
                time.sleep(0.02)
            # The backend has expired the lease; the fence refuses it.
            assert c.get(h.lease.lease_id).lease.state != "active" or \
                c.get(h.lease.lease_id).lease.expires_at <= end
            with pytest.raises(starlease.LeaseLost):
                c.authorize_commit(h.lease, service_instance_id=INST, execution_id=h.execution_id,
                                   job_id=h.job_id, sink="couchdb", commit_id=unique("c"), target="doc-life")
            still_held = not h.lost.is_set()
            h.lost.wait(5)
        assert not still_held, ("100 ms after the server's end of the lease the keeper still reported it held "
                                "(lost at %s, server end %s)" % (lost_at, end))
        assert lost_at and lost_at[0] <= end, "the keeper signalled the loss %s after the lease's end" % (
            lost_at[0] - end if lost_at else "never")
    finally:
        s.stop()


def _canonical_lock_key(ident) -> str:
    parts = ["v1"] + [ident.get(k) or "default" for k in starlease.model.IDENTITY_FIELDS]
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return "starintel:target-lease:v1:" + base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


# Found by review (low): the Python client takes the commit answer's lock_key on
# trust. The Go client (b549749) refuses a lock_key that is not the
# canonical key of the identity sent; Commit.from_wire only checks that it
# is a non-empty string, and Commit.guard() then stores it as the
# document's fence. A faulty or intercepted (plain-HTTP) server answer can
# bind a CouchDB write to another identity's lock key. Fix: compute the
# canonical key from the lease's (server-canonical) lock_identity, or at
# least check the key's shape, and treat a mismatch like the other
# mismatched fields (OutcomeUnknown / WireError).
def test_commit_answer_with_another_lock_key_is_refused(scripted) -> None:  # noqa: F811
    right = _canonical_lock_key(LEASE["lock_identity"])
    wrong = _canonical_lock_key(dict(LEASE["lock_identity"], target_id="victim.example"))
    assert right != wrong
    commit = {"lock_key": wrong, "sink": "couchdb", "commit_id": "c-1", "lease_id": "lease_1", "fencing_token": 7,
              "execution_id": "e", "job_id": "j", "target": "doc-1", "payload_sha256": "0" * 64, "commit_seq": 1,
              "accepted_at": "2026-12-03T10:00:01.000Z", "backend_time": "2026-12-03T10:00:01.000Z"}
    s = scripted(answer(200, {"status": "success", "code": "lease_inspected", "correlation_id": "c",
                              "commit": commit}))
    lease = starlease.Lease.from_wire(LEASE)
    try:
        res = s.client.authorize_commit(lease, service_instance_id="i", execution_id="e", job_id="j",
                                        sink="couchdb", commit_id="c-1", target="doc-1", payload_sha256="0" * 64,
                                        timeout=0.5)
    except (starlease.OutcomeUnknown, starlease.BackendUnavailable):
        return
    pytest.fail("a commit answer naming another identity's lock key was accepted; its guard carries %s"
                % res.commit.guard()["lock_key"])


# Found by review (low): a CouchDB password can reach an exception message. For
# a URL whose password holds an unencoded "/" (so urlsplit ends the netloc
# inside the password), CouchDB.__init__ reads u.port, and urllib raises
# ValueError("Port could not be cast to integer value as '<password>'").
# The class promises credentials "never appear in errors"; the traceback
# lands in logs and test output (write_couch builds CouchDB from a str).
# Fix: wrap the whole parse (u.port, hostname) in try/except and raise the
# generic message from None.
def test_couchdb_url_parse_error_does_not_show_the_password() -> None:
    secret = "Zq9-very-secret-pw"
    for url in ("http://admin:%s/@127.0.0.1:5984" % secret, "http://admin:%s/x@127.0.0.1:5984" % secret):
        try:
            starlease.CouchDB(url)
        except ValueError as err:
            assert secret not in str(err) and secret not in repr(err), "the password is in the error: %s" % err
            assert err.__cause__ is None or secret not in str(err.__cause__)


# Held up: a header that forges or shadows the fence is refused by the
# server, whatever its case; a header-less publication's commit digest is
# the old one (a replay under the same commit id with headers added is
# idempotency_conflict, and the replay without them is the original).
@pytest.mark.parametrize("name", ["x-starintel-fencing-token", "X-STARINTEL-LEASE-ID", "x-StarIntel-sink",
                                  "x-starintel-"])
def test_fence_header_names_are_refused(client: starlease.Client, name: str) -> None:
    with starlease.lease(client, identity(), ttl=5, service_instance_id=INST, job_id="job-h") as h:
        with pytest.raises(starlease.InvalidRequest):
            h.publish("q.none", b"x", headers={name: "999999"})


def test_header_replay_under_one_commit_id(client: starlease.Client) -> None:
    with starlease.lease(client, identity(), ttl=5, service_instance_id=INST, job_id="job-h") as h:
        cid = unique("cmt")
        first = h.publish("q.none." + unique("r"), b"body", commit_id=cid)
        rk = first.commit.target  # message id
        with pytest.raises(starlease.IdempotencyConflict):
            h.client.authorize_commit(h.lease, service_instance_id=INST, execution_id=h.execution_id,
                                      job_id=h.job_id, sink="rabbitmq", commit_id=cid,
                                      outbox=starlease.OutboxMessage(routing_key="x", body=b"body",
                                                                     headers={"a": "b"}))
        assert rk.startswith("msg_")


# Held up: the idempotent-repeat path of the CouchDB writer reports success
# only for exactly the stored guard; a stale holder repeating its old commit
# after a successor wrote the document is refused by the fence.
def test_stale_repeat_after_successor_write(client: starlease.Client, admin: starlease.Client,
                                            fenced_db: starlease.CouchDB) -> None:
    ident = identity()
    doc = unique("doc-stale")
    cid = unique("cmt")
    h1 = starlease.lease(client, ident, ttl=5, service_instance_id=INST, job_id="job-1")
    held = h1.__enter__()
    try:
        w1 = held.write_couch(fenced_db, doc, {"v": 1}, commit_id=cid)
        again = held.write_couch(fenced_db, doc, {"v": 1}, commit_id=cid)
        assert again.already_written and again.rev == w1.rev
        admin.revoke(held.lease, reason="review13")
        assert held.lost.wait(5)
        with starlease.lease(client, ident, ttl=5, service_instance_id=INST + "-2", job_id="job-2") as h2:
            h2.write_couch(fenced_db, doc, {"v": 2})
        # The stale holder's repeat of its own commit (same commit id, same
        # body): the server replays the authorization, the document no
        # longer carries that guard, the fence refuses the PUT.
        guard = held.client.authorize_commit(held.lease, service_instance_id=INST, execution_id=held.execution_id,
                                             job_id=held.job_id, sink="couchdb", commit_id=cid, target=doc,
                                             payload_sha256=starlease.payload_sha256(b'{"v":1}')).commit.guard()
        with pytest.raises((starlease.CommitRejected, starlease.LeaseConflict)):
            fenced_db.put_fenced(guard, "couchdb", doc, b'{"v":1}')
        assert fenced_db.get(doc)["v"] == 2
    finally:
        h1.__exit__(None, None, None)


# Held up: odd document ids (a slash, percent signs, plus, space, composed
# and decomposed accents, a non-BMP character) land under exactly that id.
@pytest.mark.parametrize("suffix", ["a/b", "%41", "a+b c", "\u00e9", "e\u0301", "\U0001F600", "..", "a?b#c"])
def test_odd_doc_ids_land_under_their_id(client: starlease.Client, fenced_db: starlease.CouchDB,
                                         suffix: str) -> None:
    doc = unique("odd") + suffix
    with starlease.lease(client, identity(), ttl=5, service_instance_id=INST, job_id="job-id") as h:
        w = h.write_couch(fenced_db, doc, {"s": suffix})
        assert w.doc_id == doc and not h.lost.is_set()
        got = fenced_db.get(doc)
        assert got is not None and got["_id"] == doc and got["s"] == suffix


# Found by review (low): a document body the fence refuses for its content (here a
# "type" naming a StarIntel document type, in any case, on an untyped id:
# validate_doc_update's "a typed document needs its exact type and id")
# makes HeldLease.write_couch mark the lease lost (cause "rejected") while
# the server still holds it; being "lost", it is then not released on
# leaving the block, so the identity stays locked until the TTL runs out
# (the keeper has stopped renewing, so no one holds it usefully), and the
# process is told its lease is gone. Only a refusal that says the lease
# was superseded (lower token, another lease at the same token, another
# lock key) is a loss; a refusal of the write itself is an invalid request.
# Fix: classify the fence's reasons (the Go couchdb package already keeps
# the table) and mark the lease lost only for supersession; or refuse such
# bodies in encode_body before authorizing.
def test_refused_body_does_not_lose_a_live_lease(client: starlease.Client, fenced_db: starlease.CouchDB) -> None:
    with starlease.lease(client, identity(), ttl=5, service_instance_id=INST, job_id="job-type") as h:
        with pytest.raises(starlease.StarleaseError):
            h.write_couch(fenced_db, unique("plain"), {"type": "StarIntel.Result"})
        assert client.get(h.lease.lease_id).lease.state == "active"
        assert not h.lost.is_set(), "a refused body marked a live lease lost (cause %s)" % h.cause


# Found by review (low): encode_body (the bytes path) accepts bodies that are not
# JSON or that the Go writer refuses: json.loads takes NaN, Infinity and
# -Infinity, detects UTF-16/32 and a UTF-8 BOM, maps 1e400 to inf, and
# keeps a lone surrogate escape. write_couch then authorizes the write (a
# commit id and a commit_seq are spent, the digest binds the bytes given)
# and put_fenced sends something else: NaN/Infinity/1e400 re-encode as the
# non-JSON tokens NaN/Infinity (CouchDB answers 400 after authorization), a
# UTF-16 body is stored as UTF-8 (the stored document is not the bytes the
# guard's payload_sha256 names), and a lone surrogate raises a bare
# UnicodeEncodeError (not a StarleaseError) from json.dumps(...).encode.
# Fix: decode bytes as strict UTF-8 (no BOM), parse with
# parse_constant raising and parse_float refusing non-finite values, and
# re-encode with allow_nan=False and surrogate checks before authorizing.
@pytest.mark.parametrize("raw", [b'{"x": NaN}', b'{"x": -Infinity}', b'{"x": 1e400}', '{"x":1}'.encode("utf-16"),
                                 b'\xef\xbb\xbf{"x":1}', b'{"x":"\\ud800"}'],
                         ids=["nan", "-inf", "1e400", "utf16", "bom", "lone-surrogate"])
def test_bytes_body_that_go_refuses_is_refused(raw: bytes) -> None:
    from starlease.couch import encode_body
    with pytest.raises(starlease.InvalidRequest):
        encode_body(raw)
