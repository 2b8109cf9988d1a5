"""The fenced CouchDB write, exactly as the Go writer (package couchdb)
performs it.

A fenced database carries the design document ``_design/starintel_fence``
whose ``validate_doc_update`` refuses, atomically with the write, every
document whose ``starintel_fence`` (the guard of an accepted commit) is
older than the one stored: a lower fencing token, another lease at the
same token, an earlier commit of the same lease, or a guard issued for
another document. The writer here:

1. refuses a guard not authorized for this sink and exactly this write
   (document id and SHA-256 of the body bytes) before sending anything;
2. refuses to write to a database without the current fence installed;
3. reads the document; if it already carries exactly this guard and body
   the write happened (a repeat after an unknown outcome): success;
4. PUTs the body with the read ``_rev`` and the guard as its fence.

It never retries a write; repeating it with the same commit id is safe.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import ssl
import time
import urllib.parse
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from . import errors as E
from .model import CouchWrite

#: The member of every fenced document that holds its guard.
FENCE_FIELD = "starintel_fence"
#: The id of the fence design document.
FENCE_DESIGN_DOC_ID = "_design/starintel_fence"
#: SHA-256 of the validate_doc_update source this client was written
#: against (couchdb.ValidateDocUpdate in Go; a Go test keeps them equal).
FENCE_SHA256 = "27e3454a0f39d17fb9e645ad16e8c49392439a81921394ab979acb5ff76923ff"
#: The bounds of the Go writer.
MAX_DOCUMENT_BYTES = 4 << 20
MAX_DOC_ID_BYTES = 2048
#: Ids of the typed StarIntel documents: written only through their typed
#: sinks (the Go package couchdb), which bind them to the lease's identity.
TYPED_PREFIXES = ("target:", "result:", "schedule:", "job:")

_FENCE_PREFIX = "starintel_fence: "
_LATER_COMMIT = "the document already holds this or a later commit of the lease"
#: The fence's refusals that mean the lease was superseded on the document
#: (a successor's write is there): the holder has lost it. Other refusals
#: are about the write itself (its type, id or content).
SUPERSEDED = frozenset({"fencing token is lower than the stored token", "fencing token belongs to another lease"})

Body = Union[Mapping[str, Any], bytes, bytearray]


def encode_body(body: Body) -> Tuple[bytes, Dict[str, Any]]:
    """The bytes a body is written (and its digest computed) as, and its
    members. A mapping is encoded canonically (sorted keys, no spaces,
    UTF-8); bytes are taken as given and must be a JSON object. Neither may
    hold ``_`` members or the fence member."""
    if isinstance(body, (bytes, bytearray)):
        raw = bytes(body)
        # As Go's decoder reads them: UTF-8 without a BOM, finite numbers;
        # and it must re-encode (what is stored) without loss.
        try:
            text = raw.decode("utf-8")
            if text.startswith("\ufeff"):
                raise ValueError("BOM")
            fields = json.loads(text, parse_constant=_refuse_constant) if text.strip() else {}
            json.dumps(fields, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (ValueError, UnicodeError):
            raise E.InvalidRequest("must be a JSON object in UTF-8 with finite numbers", field="body") from None
    elif isinstance(body, Mapping):
        fields = dict(body)
        try:
            raw = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                             allow_nan=False).encode("utf-8")
        except (TypeError, ValueError):
            raise E.InvalidRequest("must be JSON-encodable", field="body") from None
    else:
        raise E.InvalidRequest("must be a mapping or the bytes of a JSON object", field="body")
    if not isinstance(fields, dict):
        raise E.InvalidRequest("must be a JSON object", field="body")
    for k in fields:
        if k.startswith("_") or k == FENCE_FIELD:
            raise E.InvalidRequest("must not hold _ members or " + FENCE_FIELD, field="body")
    return raw, fields


def _refuse_constant(name: str) -> None:
    raise ValueError("%s is not JSON" % name)


def check_doc_id(doc_id: str, typed_allowed: bool = False) -> None:
    """Refuses a document id the writer must not write."""
    if not isinstance(doc_id, str) or doc_id == "":
        raise E.InvalidRequest("must not be empty", field="doc_id")
    if len(doc_id.encode("utf-8", "surrogatepass")) > MAX_DOC_ID_BYTES:
        raise E.InvalidRequest("is too long", field="doc_id")
    try:
        doc_id.encode("utf-8")
    except UnicodeEncodeError:
        raise E.InvalidRequest("must be valid UTF-8", field="doc_id") from None
    if doc_id.startswith("_"):
        raise E.InvalidRequest("must not start with _", field="doc_id")
    if any(c < " " or c == "\x7f" for c in doc_id):
        raise E.InvalidRequest("must not contain control characters", field="doc_id")
    if not typed_allowed:
        for p in TYPED_PREFIXES:
            if doc_id.startswith(p):
                raise E.InvalidRequest("a typed document (%s...) is written through its typed sink" % p,
                                       field="doc_id")


class CouchDB:
    """One fenced CouchDB database, e.g. ``http://user:pw@127.0.0.1:5984/results``.

    Credentials in the URL are sent as HTTP Basic authentication and never
    appear in errors or ``repr``."""

    def __init__(self, db_url: str, *, timeout: float = 10.0,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        bad = "starlease: the CouchDB URL must be http(s)://[user:password@]host[:port]/database"
        try:
            u = urllib.parse.urlsplit(db_url)
            name = urllib.parse.unquote(u.path.strip("/"))
            scheme, host, port = u.scheme, u.hostname, u.port
        except ValueError:
            raise ValueError(bad) from None  # the parser's message may quote the password
        if scheme not in ("http", "https") or not host or not name or "/" in name:
            raise ValueError(bad)
        self._scheme, self._host, self._port = scheme, host, port
        self.name = name
        self._auth = ""
        if u.username is not None:
            cred = "%s:%s" % (urllib.parse.unquote(u.username), urllib.parse.unquote(u.password or ""))
            self._auth = "Basic " + base64.b64encode(cred.encode("utf-8")).decode("ascii")
        self.timeout = timeout
        self._ssl = ssl_context
        self._fence_ok = False

    def __repr__(self) -> str:
        return "<starlease.CouchDB %s://%s:%s/%s>" % (self._scheme, self._host, self._port, self.name)

    def _doc_path(self, doc_id: str) -> str:
        db = "/" + urllib.parse.quote(self.name, safe="")
        if doc_id.startswith("_design/"):
            return db + "/_design/" + urllib.parse.quote(doc_id[len("_design/"):], safe="")
        return db + "/" + urllib.parse.quote(doc_id, safe="")

    def _request(self, method: str, path: str, body: Optional[bytes], op: str,
                 doc_id: str) -> Tuple[int, Dict[str, Any]]:
        headers = {"Accept": "application/json"}
        if self._auth:
            headers["Authorization"] = self._auth
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(self._host, self._port,
                                                                            timeout=self.timeout, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            try:
                conn.connect()
            except OSError as err:
                raise E.BackendUnavailable("couchdb could not be reached (%s); nothing was written"
                                           % type(err).__name__) from None
            status = 0
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                status = resp.status
                raw = resp.read(MAX_DOCUMENT_BYTES + (1 << 20))
            except (OSError, http.client.HTTPException) as err:
                if method == "PUT" and status in (201, 202):
                    return status, {}  # the status arrived; only the body was cut short
                if method == "GET":
                    raise E.BackendUnavailable("no answer from couchdb (%s)" % type(err).__name__) from None
                raise E.OutcomeUnknown("the write of %r was sent and no answer came (%s); repeat it with the "
                                       "same commit id" % (doc_id, type(err).__name__)) from None
        finally:
            conn.close()
        try:
            reply = json.loads(raw) if raw else {}
        except ValueError:
            reply = {}
        return status, reply if isinstance(reply, dict) else {}

    def check_fence(self) -> None:
        """Raises :class:`FenceMissing` unless the database holds exactly the
        fence this client knows (compared by the SHA-256 of its source)."""
        status, d = self._request("GET", self._doc_path(FENCE_DESIGN_DOC_ID), None, "check_fence",
                                  FENCE_DESIGN_DOC_ID)
        if status == 404:
            self._fence_ok = False
            raise E.FenceMissing("the fence design document (or the database) is missing; install it")
        if status != 200:
            raise _status_error(status, d, FENCE_DESIGN_DOC_ID)
        src = d.get("validate_doc_update")
        lang = d.get("language", "")
        if not isinstance(src, str) or hashlib.sha256(src.encode("utf-8")).hexdigest() != FENCE_SHA256 or \
                lang not in ("", "javascript"):
            self._fence_ok = False
            raise E.FenceMissing("the database holds another fence than this client's; install the current one")
        self._fence_ok = True

    def get(self, doc_id: str) -> Optional[Dict[str, Any]]:
        """The document as stored (with ``_id``, ``_rev`` and its fence), or
        None when it does not exist."""
        check_doc_id(doc_id, typed_allowed=True)
        status, d = self._request("GET", self._doc_path(doc_id), None, "get", doc_id)
        if status == 404 and d.get("reason") not in ("no_db_file", "Database does not exist."):
            return None
        if status != 200:
            raise _status_error(status, d, doc_id)
        return d

    def put_fenced(self, guard: Mapping[str, Any], sink: str, doc_id: str, body: Body) -> CouchWrite:
        """Writes ``body`` as document ``doc_id`` conditioned on ``guard``
        (the guard of a commit authorized for ``sink`` and exactly this
        write). See the module doc for the steps and the errors."""
        check_doc_id(doc_id)
        raw, fields = encode_body(body)
        digest = hashlib.sha256(raw).hexdigest()
        _check_guard(guard, sink, doc_id, digest)
        if not self._fence_ok:
            self.check_fence()
        cur = self.get(doc_id)
        if cur is not None:
            stored = cur.get(FENCE_FIELD)
            if isinstance(stored, dict) and stored == dict(guard):
                stored_body = {k: v for k, v in cur.items() if not k.startswith("_") and k != FENCE_FIELD}
                if stored_body == json.loads(json.dumps(fields)):
                    return CouchWrite(doc_id, cur.get("_rev", ""), dict(guard), already_written=True)
                raise E.IdempotencyConflict("the commit id was already used for another body")
        doc: Dict[str, Any] = dict(fields)
        doc["_id"] = doc_id
        if cur is not None:
            doc["_rev"] = cur["_rev"]
        doc[FENCE_FIELD] = dict(guard)
        out = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(out) > MAX_DOCUMENT_BYTES:
            raise E.InvalidRequest("the document exceeds the size limit", field="body")
        status, reply = self._request("PUT", self._doc_path(doc_id), out, "commit", doc_id)
        if status in (201, 202):
            self._fence_ok = True
            rev = reply.get("rev", "")
            return CouchWrite(doc_id, rev if isinstance(rev, str) else "", dict(guard))
        if status == 404:
            raise E.BackendUnavailable("the database does not exist; nothing was written", status=404)
        self._fence_ok = False if status == 403 and not _fence_reason(reply) else self._fence_ok
        raise _status_error(status, reply, doc_id)


def _check_guard(g: Mapping[str, Any], sink: str, doc_id: str, digest: str) -> None:
    # fence.Guard.Validate plus Authorizes: the writer never writes without
    # a complete guard issued for this sink and exactly this write.
    need = ("lock_key", "lease_id", "execution_id", "sink", "commit_id", "accepted_at", "job_id", "target")
    if not isinstance(g, Mapping) or any(not isinstance(g.get(k), str) or not g.get(k) for k in need):
        raise E.CommitRejected("the guard is incomplete")
    tok, seq = g.get("fencing_token"), g.get("commit_seq")
    if isinstance(tok, bool) or not isinstance(tok, int) or not 1 <= tok <= (1 << 53) - 1 or \
            isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise E.CommitRejected("the guard is incomplete")
    if g["sink"] != sink:
        raise E.CommitRejected("the guard was authorized for another sink")
    if g["target"] != doc_id:
        raise E.CommitRejected("the guard was authorized for another write")
    if g.get("payload_sha256", "") != digest:
        raise E.CommitRejected("the guard was authorized for another payload")


def _fence_reason(reply: Mapping[str, Any]) -> str:
    r = reply.get("reason")
    return r[len(_FENCE_PREFIX):] if isinstance(r, str) and r.startswith(_FENCE_PREFIX) else ""


def _status_error(status: int, reply: Mapping[str, Any], doc_id: str) -> E.StarleaseError:
    # The Go writer's table (couchdb.statusError).
    reason = _fence_reason(reply)
    if status == 403 and reason:
        if reason == _LATER_COMMIT:
            # Not a loss: a later commit of the same lease holds the document.
            return E.LeaseConflict(reason, status=status)
        err = E.CommitRejected(reason, status=status)
        err.superseded = reason in SUPERSEDED
        return err
    if status in (401, 403):
        return E.AccessDenied("couchdb refused the credentials or the operation", status=status)
    if status == 409:
        return E.LeaseConflict("document revision conflict: another write changed it since it was read",
                               status=status)
    if status == 404:
        return E.LeaseNotFound("not found", status=status)
    if status in (400, 413, 415):
        return E.InvalidRequest("couchdb refused the request as malformed", status=status)
    if status >= 500:
        return E.OutcomeUnknown("couchdb answered with a server error", status=status)
    return E.BackendUnavailable("unexpected HTTP status %d" % status, status=status)
