## The Nim client's suite, run by clients/nim_test.go (TestNimClient)
## against a real starlease server with its outbox relay and a real broker:
##
##   nim c -r --hints:off --nimcache:DIR tests/test_starlease.nim
##
## Environment (set by the Go test):
##   STARLEASE_NIM_URL        the server's base URL
##   STARLEASE_NIM_ACTOR_KEY  an api_client key (targets:lease)
##   STARLEASE_NIM_ADMIN_KEY  an administrator key (targets:force-release)
##   STARLEASE_NIM_QUEUE      the queue publications are routed to
##   STARLEASE_NIM_BODIES     JSON [{"b64", "sha256", "content_type"}]: the
##                            bodies to publish and their SHA-256, computed
##                            by Go (the Nim standard library has none)
##   STARLEASE_NIM_DIGESTS    a file of JSON [{"b64", "sha256"}]: random
##                            bodies and their SHA-256 computed by Go
##   STARLEASE_NIM_COUCHDB    a fenced CouchDB database (Go installed the fence)
##   STARLEASE_NIM_COUCHDB_PLAIN        a database without the fence
##   STARLEASE_NIM_COUCHDB_OTHER_FENCE  a database with another fence
##   STARLEASE_NIM_RESULTS    where to write what was published and refused,
##                            and the CouchDB documents written, for the Go
##                            test to check on the broker and in CouchDB
##
## Every check that fails prints FAIL with its line and exits non-zero.

import std/[asyncdispatch, asyncnet, base64, json, monotimes, options, os,
            random, sequtils, sets, strutils, times, uri]
import ../starlease

var checks = 0

template check(cond: bool, what = "") =
  ## Fails the suite at once when cond is false.
  inc checks
  if not cond:
    let info = instantiationInfo()
    echo "FAIL ", info.filename, ":", info.line, ": ", astToStr(cond),
      (if what.len > 0: " -- " & what else: "")
    quit(1)

proc ok(step: string) =
  echo "ok - ", step

proc env(name: string): string =
  result = getEnv(name)
  if result.len == 0:
    echo "FAIL: ", name, " is not set (run this suite through go test ./clients -run TestNimClient)"
    quit(1)

# ---------------------------------------------------------------------------
# A fault-injecting HTTP proxy: it forwards each request to the server and,
# for the next `dropAnswers` requests (`dropPutAnswers` PUTs), closes the
# client's connection instead of passing the answer on (the server has
# acted; the client cannot know). With `refuse` it closes every connection
# without forwarding. `cannedPut` answers the next PUTs itself, without
# forwarding them; `rewrite` changes the answers passed on (keeping their
# length).

type Proxy = ref object
  server: AsyncSocket
  port: Port
  upstreamPort: Port
  dropAnswers: int
  dropPutAnswers: int
  refuse: bool
  cannedPut: seq[(int, string)]
  rewrite: proc (answer: string): string
  heads: seq[string]    # request header blocks received, in order
  bodies: seq[string]   # request bodies received, in order

proc readHead(s: AsyncSocket): Future[(string, int)] {.async.} =
  ## The header block of an HTTP message and its Content-Length.
  var head = ""
  var length = 0
  while true:
    let line = await s.recvLine()
    if line.len == 0: raise newException(IOError, "connection closed in the header block")
    if line == "\r\n":   # recvLine answers the blank line so, others without CRLF
      head.add line
      break
    head.add line & "\r\n"
    let i = line.find(':')
    if i > 0 and line[0 ..< i].strip.toLowerAscii == "content-length":
      length = parseInt(line[i + 1 .. ^1].strip)
  result = (head, length)

proc readBody(s: AsyncSocket, n: int): Future[string] {.async.} =
  result = ""
  while result.len < n:
    let part = await s.recv(n - result.len)
    if part.len == 0: raise newException(IOError, "connection closed in the body")
    result.add part

proc serve(p: Proxy, client: AsyncSocket) {.async.} =
  try:
    if p.refuse:
      client.close()
      return
    let (head, length) = await client.readHead()
    let body = await client.readBody(length)
    p.heads.add head
    p.bodies.add body
    let isPut = head.startsWith("PUT ")
    if isPut and p.cannedPut.len > 0:
      let (status, answer) = p.cannedPut[0]
      p.cannedPut.delete(0)
      await client.send("HTTP/1.1 " & $status & " Canned\r\nContent-Type: application/json\r\n" &
                        "Content-Length: " & $answer.len & "\r\nConnection: close\r\n\r\n" & answer)
      client.close()
      return
    let up = newAsyncSocket()
    await up.connect("127.0.0.1", p.upstreamPort)
    await up.send(head & body)
    let (rhead, rlength) = await up.readHead()
    var rbody = await up.readBody(rlength)
    up.close()
    if p.dropAnswers > 0 or (isPut and p.dropPutAnswers > 0):
      if p.dropAnswers > 0: dec p.dropAnswers
      else: dec p.dropPutAnswers
      client.close()   # the server acted; its answer is lost
      return
    if not p.rewrite.isNil: rbody = p.rewrite(rbody)
    await client.send(rhead & rbody)
    client.close()
  except CatchableError as e:
    echo "proxy: ", e.msg.splitLines()[0]
    client.close()

proc accept(p: Proxy) {.async.} =
  ## Serves connections until the listening socket is closed.
  while true:
    var c: AsyncSocket
    try:
      c = await p.server.accept()
    except CatchableError:
      return
    asyncCheck p.serve(c)

proc startProxy(upstream: string): Proxy =
  ## A proxy to the server at upstream ("http://127.0.0.1:PORT[/path]").
  let port = Port(parseInt(parseUri(upstream).port))
  result = Proxy(server: newAsyncSocket(), upstreamPort: port)
  result.server.setSockOpt(OptReuseAddr, true)
  result.server.bindAddr(Port(0), "127.0.0.1")
  result.server.listen()
  result.port = result.server.getLocalAddr()[1]
  asyncCheck result.accept()

proc url(p: Proxy): string = "http://127.0.0.1:" & $p.port.int

# ---------------------------------------------------------------------------

type Body = object
  bytes: seq[byte]
  b64, sha256, contentType: string

proc loadBodies(): seq[Body] =
  for n in parseJson(env("STARLEASE_NIM_BODIES")):
    let b64 = n["b64"].getStr
    result.add Body(bytes: decode(b64).toBytes, b64: b64, sha256: n["sha256"].getStr,
                    contentType: n["content_type"].getStr)

proc record(h: Held, commitId: string, body: Body, messageId = "",
            payloadSha256 = "", headers: seq[(string, string)] = @[]): JsonNode =
  ## What the Go test needs to find (or not find) a publication on the
  ## broker and check its fence headers and application headers.
  var hs = newJObject()
  for (k, v) in headers: hs[k] = %v
  %*{"message_id": messageId, "commit_id": commitId, "sink": DefaultSink, "headers": hs,
     "body_b64": body.b64, "content_type": body.contentType,
     "payload_sha256": payloadSha256,
     "lease_id": h.lease.leaseId, "fencing_token": h.lease.fencingToken,
     "execution_id": h.executionId, "job_id": h.jobId, "trace_id": h.traceId,
     "service_instance_id": h.serviceInstanceId,
     "lock_identity": h.lease.identity.toJson}

var
  published = newJArray()
  refused = newJArray()
  couchDocs = newJArray()   # documents written, as they must read back
  couchStale = newJArray()  # documents a stale holder was refused on

proc identity(target: string): LockIdentity =
  LockIdentity(tenantId: "tenant-a", programId: "program-a",
               targetNamespace: "starintel-target", targetId: target,
               actorName: "fediwatch")

var run = ""   # makes this run's targets unique

proc acquireReq(target: string, ttlMs = 30_000, instance = "fediwatch-1"): AcquireRequest =
  AcquireRequest(identity: identity(target & "-" & run), ttlMs: ttlMs,
                 serviceInstanceId: instance, executionId: "exec-" & target,
                 jobId: "job-" & target, traceId: "trace-" & target)

proc isRequestId(s: string): bool =
  s.len == 30 and s.startsWith("req-") and
    s[4 .. ^1].allCharsInSet({'a'..'z', '2'..'7'})

proc waitLost(k: Keeper, withinMs: int): Future[bool] {.async.} =
  ## Whether the keeper reports the loss within withinMs.
  result = await withTimeout(k.whenLost, withinMs)

proc waitRenewals(k: Keeper, n, withinMs: int) {.async.} =
  let limit = getMonoTime() + initDuration(milliseconds = withinMs)
  while k.renewals < n and not k.lost and getMonoTime() < limit:
    await sleepAsync(50)
  check k.renewals >= n, "keeper renewed " & $k.renewals & " times, lost=" & $k.lost

# ---------------------------------------------------------------------------

proc sha256Vectors() =
  ## FIPS 180-4 test vectors (NIST CSRC examples), one-shot and in parts.
  const vectors = [
    ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")]
  for (msg, want) in vectors:
    check sha256Hex(msg) == want, msg
    check sha256Hex(msg.toBytes) == want, msg
    for cut in 0 .. msg.len:
      var st = initSha256()
      st.update(msg[0 ..< cut])
      st.update(msg[cut .. ^1])
      check hexDigest(st.finish()) == want, msg & " cut at " & $cut
  const million = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
  check sha256Hex(repeat('a', 1_000_000)) == million
  var st = initSha256()
  var fed = 0
  var step = 1
  while fed < 1_000_000:   # uneven parts: 1, 2, ... 127 bytes, again
    let n = min(step, 1_000_000 - fed)
    st.update(repeat('a', n))
    fed += n
    step = step mod 127 + 1
  check hexDigest(st.finish()) == million
  ok "sha256: the NIST vectors (empty, abc, 448 bits, a million a), whole and in parts"

proc offline() =
  ## What needs no server.
  sha256Vectors()
  var seen: seq[string]
  for i in 0 ..< 2000:
    let id = newRequestId()
    check id.isRequestId, id
    check not id.secretShaped and "star_sk_" notin id.toLowerAscii
    seen.add id
  check seen.toHashSet.len == 2000, "request ids repeat"
  check secretShaped("star_sk_v1_x") and secretShaped(repeat('a', 64)) and
    not secretShaped("req-abc")
  let key = "star_sk_v1_01HZZZZZZZZZZZZZZZZZZZZZZZ_" & repeat("ab", 32)
  let c = newClient("http://127.0.0.1:9/", key)
  check key notin $c and "redacted" in $c
  check c.baseUrl == "http://127.0.0.1:9"
  for bad in ["ftp://x", "http://user:pw@h:1", "http://h:1/?q=1", "http://"]:
    var raised = false
    try:
      discard newClient(bad, key)
    except ValueError as e:
      raised = true
      check key notin e.msg
    check raised, bad
  # Known base64 vectors: standard alphabet, padded, no line breaks.
  check Publication(routingKey: "q", body: "hello".toBytes).toJson["body"].getStr == "aGVsbG8="
  var all: seq[byte]
  for i in 0 .. 255: all.add byte(i)
  let enc = Publication(routingKey: "q", body: all).toJson["body"].getStr
  check enc.endsWith("+/w==") and '\n' notin enc and enc.len == 344
  check "headers" notin Publication(routingKey: "q").toJson
  check Publication(routingKey: "q", headers: @[("x-a", "1")]).toJson["headers"]["x-a"].getStr == "1"
  let t = parseTimestamp("2026-08-05T12:00:00.123Z")
  check t.toUnix == 1785931200 and t.nanosecond == 123_000_000
  check formatTimestamp(t) == "2026-08-05T12:00:00.123Z"
  for bad in ["2026-08-05T12:00:00Z", "2026-08-05T12:00:00.123+00:00"]:
    var raised = false
    try: discard parseTimestamp(bad)
    except ValueError: raised = true
    check raised, bad
  check statusOf(ecConflict) == 409 and statusOf(ecOutcomeUnknown) == 503
  let e = newStarleaseError(ecLost, 409, "Target lease is no longer held", "", "corr-1")
  check e of LeaseLostError and e.code == ecLost and "409 lease_lost" in e.msg and "corr-1" in e.msg
  ok "offline: request ids, redaction, base64, timestamps, error types"

# ---------------------------------------------------------------------------
# Fenced CouchDB writes

proc recordDoc(db: CouchDB, w: CouchWrite, body: JsonNode, h: Held) =
  ## What the Go test reads back with its couchdb package: the document,
  ## its revision, the exact body bytes sent and the guard it must carry.
  couchDocs.add %*{"db": db.name, "doc_id": w.docId, "rev": w.rev, "body_text": $body,
                   "guard": w.guard.toJson, "lease_id": h.lease.leaseId,
                   "fencing_token": h.lease.fencingToken}

proc expectError(fut: Future[CouchWrite], code: ErrorCode,
                 what: string): Future[ref StarleaseError] {.async.} =
  ## Awaits a write that must fail with code; answers its error.
  try:
    discard await fut
    check false, what & ": the write succeeded"
  except StarleaseError as e:
    check e.code == code, what & ": " & e.msg
    result = e

proc stored(db: CouchDB, docId: string): Future[JsonNode] {.async.} =
  let d = await db.getDoc(docId)
  check d.isSome, docId & " is not stored"
  result = d.get

proc withoutMeta(doc: JsonNode): JsonNode =
  ## A stored document's body: no "_" members, no fence.
  result = newJObject()
  for k, v in doc.pairs:
    if not k.startsWith("_") and k != FenceField: result[k] = v

proc headerValue(head, name: string): string =
  ## The value of header name (any case) in a request's header block.
  for line in head.splitLines:
    let i = line.find(':')
    if i > 0 and cmpIgnoreCase(line[0 ..< i], name) == 0:
      return line[i + 1 .. ^1].strip

proc couchSuite(c, admin: Client) {.async.} =
  let dbUrl = env("STARLEASE_NIM_COUCHDB")
  let db = newCouchDB(dbUrl)
  let couchPort = parseUri(dbUrl).port

  # Credentials are redacted, and a URL without a database is refused.
  block:
    let withCreds = newCouchDB("http://nim-user:s3cr3t-pw@127.0.0.1:" & couchPort & "/" & db.name)
    check "s3cr3t-pw" notin $withCreds and "redacted" in $withCreds
    for bad in ["ftp://h/db", "http://u:s3cr3t-pw@h:1/", "http://h:1/a/b", "http://h:1/db?x=1",
                "http://h:1/Upper"]:
      try:
        discard newCouchDB(bad)
        check false, bad
      except ValueError as e:
        check "s3cr3t-pw" notin e.msg
  ok "couchdb: a database URL's credentials are never shown"

  # What is refused before anything is sent: typed ids, malformed ids and
  # bodies (the client and the database point at a closed port).
  block:
    let nowhere = newClient("http://127.0.0.1:9", "star_sk_v1_x", timeoutMs = 2000)
    let nodb = newCouchDB("http://127.0.0.1:9/nim_fenced", timeoutMs = 2000)
    let h = Held(lease: Lease(leaseId: "lease-x", fencingToken: 1), serviceInstanceId: "i",
                 executionId: "e", jobId: "j")
    let body = %*{"n": 1}
    for id in ["target:t~p", "result:x", "schedule:x", "job:j-1", "", "_design/x", "_x",
               "a\x01b", "a\x7fb", repeat('d', 2049), "bad\xffutf8"]:
      let e = await expectError(nowhere.writeCouch(h, nodb, id, body), ecInvalidRequest, "doc id " & id.escape)
      check e.field == "doc_id" and e.status == 0, e.msg
      if id.startsWith("target:") or id.startsWith("job:"):
        check "typed sink" in e.msg, e.msg
    var nan = newJObject()   # (`%` turns NaN into a string; newJFloat keeps it a number)
    nan["f"] = newJFloat(NaN)
    var inf = newJObject()
    inf["deep"] = %*{"list": [1]}
    inf["deep"]["list"].add newJFloat(Inf)
    for b in [%*[1, 2], %*{"_id": "x"}, %*{"_rev": "1-a"}, %*{"starintel_fence": {}},
              nan, inf, %*{"s": "bad\xff"}]:
      let e = await expectError(nowhere.writeCouch(h, nodb, "nim:body", b), ecInvalidRequest, $b)
      check e.field == "body" and e.status == 0, e.msg
    let e = await expectError(nowhere.writeCouch(h, nodb, "nim:x", body, sink = "CouchDB"),
                              ecInvalidRequest, "sink")
    check e.field == "sink"
    # The put path refuses a typed id too, and a guard that is incomplete,
    # for another sink, document or payload (commit_rejected), unsent.
    var g = Guard(lockKey: "starintel:target-lease:v1:" & repeat('A', 43), leaseId: "lease-x",
                  fencingToken: 1, executionId: "e", jobId: "j", sink: "couchdb", commitId: "c-1",
                  target: "nim:x", payloadSha256: sha256Hex($body), commitSeq: 1,
                  acceptedAt: parseTimestamp("2026-08-05T12:00:00.000Z"))
    discard await expectError(nodb.putFenced(g, "couchdb", "result:x", body), ecInvalidRequest, "typed put")
    discard await expectError(nodb.putFenced(g, "couchdb", "nim:y", body), ecCommitRejected, "other doc")
    discard await expectError(nodb.putFenced(g, "couchdb", "nim:x", %*{"n": 2}), ecCommitRejected, "other body")
    discard await expectError(nodb.putFenced(g, "rabbitmq", "nim:x", body), ecCommitRejected, "other sink")
    var bad = g
    bad.lockKey = "starintel:target-lease:v1:" & repeat('A', 42) & "B"   # padding bits set
    discard await expectError(nodb.putFenced(bad, "couchdb", "nim:x", body), ecCommitRejected, "lock key")
    bad = g
    bad.commitSeq = 0
    discard await expectError(nodb.putFenced(bad, "couchdb", "nim:x", body), ecCommitRejected, "no seq")
    bad = g
    bad.acceptedAt = Time()
    discard await expectError(nodb.putFenced(bad, "couchdb", "nim:x", body), ecCommitRejected, "no accepted_at")
    # The guard's JSON form is Go's: an empty trace_id is left out.
    let gj = g.toJson
    check "trace_id" notin gj and gj["fencing_token"].getInt == 1 and
      gj["accepted_at"].getStr == "2026-08-05T12:00:00.000Z"
    check toSeq(gj.keys) == @["lock_key", "lease_id", "fencing_token", "execution_id", "job_id",
                              "sink", "commit_id", "target", "payload_sha256", "commit_seq",
                              "accepted_at"]
  ok "couchdb: typed and malformed ids, bodies and guards are refused before sending"

  # A write lands: the document carries the commit's guard and the body.
  let reqW = acquireReq("couch")
  let w = hold(await c.acquire(reqW), reqW)
  let docId = "nim:finding-" & run
  let body = %*{"kind": "fediwatch.finding", "target": docId, "count": 3, "score": 0.25,
                "ratio": 1.0, "text": "naïve ✓ – \"quoted\"", "nested": {"list": [1, 2.5, "x", nil, true]}}
  let cid = "cw-1-" & run
  let w1 = await c.writeCouch(w, db, docId, body, cid)
  check not w1.alreadyWritten and w1.rev.startsWith("1-"), w1.rev
  let g1 = w1.guard
  check g1.fencingToken == w.lease.fencingToken and g1.leaseId == w.lease.leaseId
  check g1.target == docId and g1.payloadSha256 == sha256Hex($body) and g1.commitSeq >= 1
  check g1.sink == CouchSink and g1.commitId == cid and g1.jobId == w.jobId
  check g1.executionId == w.executionId and g1.traceId == w.traceId
  check g1.lockKey.startsWith("starintel:target-lease:v1:") and g1.lockKey.len == 69
  block:
    let doc = await db.stored(docId)
    check doc["_rev"].getStr == w1.rev
    check doc[FenceField] == g1.toJson, $doc[FenceField]
    let back = doc.withoutMeta
    check back.len == body.len and back["text"] == body["text"] and back["nested"] == body["nested"]
    check back["count"].getInt == 3 and back["ratio"].getFloat == 1.0
  recordDoc(db, w1, body, w)
  ok "couchdb: a write lands with its guard (token " & $g1.fencingToken & ", seq " &
    $g1.commitSeq & ") and its body reads back"

  # The repeat (after an unknown outcome) is already written: no new
  # revision. 1.0 came back as 1 and still compares equal.
  block:
    let w2 = await c.writeCouch(w, db, docId, body, cid)
    check w2.alreadyWritten and w2.rev == w1.rev and w2.guard == g1
    check (await db.stored(docId))["_rev"].getStr == w1.rev
  ok "couchdb: the repeat of a write is already written, with no new revision"

  # The same commit id with another body is an idempotency conflict: the
  # server refuses the authorization. A document that carries the guard
  # with another body (a proxy changes the stored body on the way) is one
  # too, found by the client before it writes.
  block:
    let other = %*{"kind": "fediwatch.finding", "count": 4}
    discard await expectError(c.writeCouch(w, db, docId, other, cid), ecIdempotencyConflict,
                              "another body under a used commit id")
    let proxy = startProxy(dbUrl)
    proxy.rewrite = proc (answer: string): string = answer.replace("\"count\":3", "\"count\":7")
    let pdb = newCouchDB(proxy.url & "/" & db.name)
    let e = await expectError(pdb.putFenced(g1, CouchSink, docId, body), ecIdempotencyConflict,
                              "stored guard with another body")
    check e.requestId == cid
    for head in proxy.heads: check not head.startsWith("PUT "), "a PUT was sent"
    proxy.server.close()
    check (await db.stored(docId))["_rev"].getStr == w1.rev
  ok "couchdb: one commit id, another body is idempotency_conflict (server and document)"

  # No answer after the PUT was sent: outcome unknown, with the commit id;
  # the repeat with that commit id finds the write done.
  block:
    let proxy = startProxy(dbUrl)
    proxy.dropPutAnswers = 1
    let pdb = newCouchDB(proxy.url & "/" & db.name)
    let uid = "nim:unknown-" & run
    let ubody = %*{"kind": "fediwatch.finding", "step": "unknown"}
    let ucid = "cw-unknown-" & run
    let e = await expectError(c.writeCouch(w, pdb, uid, ubody, ucid), ecOutcomeUnknown, "dropped answer")
    check e.requestId == ucid and e.retryable and ucid in e.msg, e.msg
    proxy.server.close()
    let doc = await db.stored(uid)
    check doc[FenceField]["commit_id"].getStr == ucid
    let again = await c.writeCouch(w, db, uid, ubody, ucid)
    check again.alreadyWritten and again.rev == doc["_rev"].getStr
    recordDoc(db, again, ubody, w)
  ok "couchdb: a write without an answer is outcome unknown; its repeat is already written"

  # CouchDB's answers map as the Go writer's: canned PUT answers.
  block:
    let proxy = startProxy(dbUrl)
    let pdb = newCouchDB(proxy.url & "/" & db.name)
    let sid = "nim:status-" & run
    let sbody = %*{"kind": "status"}
    let scid = "cw-status-" & run
    let cr = await c.authorizeCommit(w, scid, CouchSink, sid, sha256Hex($sbody))
    let g = cr.commit.guard
    check g.lockKey == g1.lockKey
    proc forbidden(reason: string): string = $(%*{"error": "forbidden", "reason": reason})
    let cases = [
      (403, forbidden("starintel_fence: fencing token is lower than the stored token"), ecCommitRejected,
       "fencing token is lower than the stored token"),
      (403, forbidden("starintel_fence: the document already holds this or a later commit of the lease"),
       ecConflict, "later commit"),
      (403, forbidden("starintel_fence: something new"), ecCommitRejected, "the fence refused the write"),
      (403, forbidden("You are not allowed to access this db."), ecAccessDenied, "refused the credentials"),
      (401, """{"error":"unauthorized","reason":"Name or password is incorrect."}""", ecAccessDenied, ""),
      (409, """{"error":"conflict","reason":"Document update conflict."}""", ecConflict, "revision conflict"),
      (404, """{"error":"not_found","reason":"Database does not exist."}""", ecBackendUnavailable,
       "database does not exist"),
      (400, """{"error":"bad_request","reason":"x"}""", ecInvalidRequest, "malformed"),
      (413, """{"error":"too_large","reason":"x"}""", ecInvalidRequest, "malformed"),
      (415, """{"error":"bad_content_type","reason":"x"}""", ecInvalidRequest, "malformed"),
      (500, """{"error":"unknown_error","reason":"x"}""", ecOutcomeUnknown, "server error"),
      (503, "", ecOutcomeUnknown, "server error"),
      (418, "{}", ecBackendUnavailable, "unexpected HTTP status 418")]
    for (status, answer, code, words) in cases:
      proxy.cannedPut.add (status, answer)
      let e = await expectError(pdb.putFenced(g, CouchSink, sid, sbody), code, $status & " " & answer)
      check e.status == status and words in e.msg, e.msg
      check (e of CommitRejectedError) == (code == ecCommitRejected)
      if code == ecOutcomeUnknown: check e.requestId == scid and e.retryable
      if code == ecBackendUnavailable: check not (e of FenceMissingError)
    # A 403 that is not the fence's makes the client check the fence again.
    let designReads = proc (): int =
      for head in proxy.heads:
        if head.startsWith("GET /" & db.name & "/_design/starintel_fence "): inc result
    proxy.cannedPut.add (cases[3][0], cases[3][1])
    discard await expectError(pdb.putFenced(g, CouchSink, sid, sbody), ecAccessDenied, "access")
    let before = designReads()
    proxy.cannedPut.add (202, $(%*{"ok": true, "id": sid, "rev": "7-canned"}))
    let accepted = await pdb.putFenced(g, CouchSink, sid, sbody)
    check accepted.rev == "7-canned" and not accepted.alreadyWritten
    check designReads() == before + 1, $designReads() & " design reads, before " & $before
    # The fence's own refusal leaves the fence check standing.
    proxy.cannedPut.add (cases[0][0], cases[0][1])
    discard await expectError(pdb.putFenced(g, CouchSink, sid, sbody), ecCommitRejected, "fence")
    proxy.cannedPut.add (201, $(%*{"ok": true, "id": sid, "rev": "8-canned"}))
    check (await pdb.putFenced(g, CouchSink, sid, sbody)).rev == "8-canned"
    check designReads() == before + 1, $designReads() & " design reads, before " & $before
    check (await db.getDoc(sid)).isNone   # nothing of it reached CouchDB
    proxy.server.close()
  ok "couchdb: answers map as the Go writer's statusError (fence 403, 401/403, 409, 404, 4xx, 5xx)"

  # Credentials in the URL travel as Basic authentication only; CouchDB
  # refuses unknown ones (401) and the error does not show them.
  block:
    let proxy = startProxy(dbUrl)
    let pdb = newCouchDB("http://nim-user:s3cr3t%20pw@127.0.0.1:" & $proxy.port.int & "/" & db.name)
    let e = await expectError(c.writeCouch(w, pdb, "nim:creds-" & run, %*{"n": 1}), ecAccessDenied,
                              "unknown credentials")
    check e.status == 401 and "s3cr3t" notin e.msg and "nim-user" notin e.msg, e.msg
    check proxy.heads.len >= 1
    for head in proxy.heads:
      check head.headerValue("authorization") == "Basic " & encode("nim-user:s3cr3t pw"), head
      check "s3cr3t" notin head
    proxy.server.close()
  ok "couchdb: URL credentials are sent as Basic authentication and never shown"

  # Databases without the current fence are refused, and nothing lands.
  block:
    for (u, words) in [(env("STARLEASE_NIM_COUCHDB_PLAIN"), "not installed"),
                       (env("STARLEASE_NIM_COUCHDB_OTHER_FENCE"), "another fence"),
                       (dbUrl.rsplit('/', 1)[0] & "/nim_missing_" & run.toLowerAscii, "does not exist")]:
      let other = newCouchDB(u)
      let id = "nim:unfenced-" & run
      let e = await expectError(c.writeCouch(w, other, id, %*{"n": 1}), ecBackendUnavailable, u)
      check e of FenceMissingError and words in e.msg, e.msg
      if words != "does not exist":
        check (await other.getDoc(id)).isNone
  ok "couchdb: a database without the fence, or with another, is refused (FenceMissingError)"
  discard await c.release(w)

  # A stale holder: A writes, an administrator revokes A, B (a higher
  # token) writes the same document; A's next authorization is lease_lost,
  # and A's earlier guard replayed through the put path is refused by
  # CouchDB's fence.
  block:
    let reqA = acquireReq("couch-stale")
    let ha = hold(await c.acquire(reqA), reqA)
    let sid = "nim:stale-" & run
    let bodyA = %*{"owner": "a", "step": 1}
    let wa = await c.writeCouch(ha, db, sid, bodyA, "cs-a-" & run)
    discard await admin.revoke(ha.lease, reason = "nim client suite: stale holder")
    var reqB = acquireReq("couch-stale", instance = "fediwatch-2")
    reqB.executionId = "exec-couch-stale-b"
    let hb = hold(await c.acquire(reqB), reqB)
    check hb.lease.fencingToken > ha.lease.fencingToken
    let bodyB = %*{"owner": "b", "step": 1}
    let wb = await c.writeCouch(hb, db, sid, bodyB, "cs-b-" & run)
    check wb.guard.fencingToken == hb.lease.fencingToken and wb.rev.startsWith("2-")
    discard await expectError(c.writeCouch(ha, db, sid, %*{"owner": "a", "step": 2}, "cs-a2-" & run),
                              ecLost, "the revoked holder's authorization")
    let e = await expectError(db.putFenced(wa.guard, CouchSink, sid, bodyA), ecCommitRejected,
                              "the revoked holder's earlier guard")
    check e.status == 403 and "fencing token is lower than the stored token" in e.msg, e.msg
    let doc = await db.stored(sid)
    check doc["_rev"].getStr == wb.rev and doc[FenceField] == wb.guard.toJson
    check doc["owner"].getStr == "b"
    recordDoc(db, wb, bodyB, hb)
    couchStale.add %*{"doc_id": sid, "lease_id": ha.lease.leaseId,
                      "fencing_token": ha.lease.fencingToken, "guard": wa.guard.toJson}
    discard await c.release(hb)
  ok "couchdb: a revoked holder is lease_lost, and its replayed guard is refused by the fence"

  # Through a keeper: a write lands; then a write of a document another
  # lock identity holds is refused by the fence (commit_rejected), but that
  # refusal is of the write, not a successor's: the lease stays held and
  # later writes of its own documents land.
  block:
    let reqX = acquireReq("couch-owner")
    let hx = hold(await c.acquire(reqX), reqX)
    let shared = "nim:shared-" & run
    let wx = await c.writeCouch(hx, db, shared, %*{"owner": "x"})
    recordDoc(db, wx, %*{"owner": "x"}, hx)
    let reqY = acquireReq("couch-keeper", ttlMs = 10_000)
    let hy = hold(await c.acquire(reqY), reqY)
    var seen = lcNone
    let k = newKeeper(c, hy, onLost = proc (k: Keeper) = seen = k.cause)
    let own = "nim:keeper-" & run
    let wk = await k.writeCouch(db, own, %*{"owner": "y"})
    check not wk.alreadyWritten and wk.guard.leaseId == hy.lease.leaseId and not k.lost
    let e = await expectError(k.writeCouch(db, shared, %*{"owner": "y"}), ecCommitRejected,
                              "another identity's document")
    check "different lock key" in e.msg, e.msg
    check not (ref CommitRejectedError)(e).superseded
    check not k.lost and seen == lcNone
    let after = await k.writeCouch(db, own, %*{"owner": "y", "n": 2})
    check not after.alreadyWritten and after.guard.commitSeq > wk.guard.commitSeq
    recordDoc(db, after, %*{"owner": "y", "n": 2}, hy)   # the document's last write
    check (await db.stored(shared))["owner"].getStr == "x"
    await k.close()       # releases the lease, still held
    discard await c.release(hx)
  ok "couchdb: through a keeper, a refusal of the write itself leaves the lease held"

proc goDigests() =
  ## Go's SHA-256 of random bodies of every length around the block
  ## boundaries and a few large ones: one-shot, and fed in random parts.
  var r = initRand(getMonoTime().ticks)
  var n = 0
  for item in parseJson(readFile(env("STARLEASE_NIM_DIGESTS"))):
    let body = decode(item["b64"].getStr)
    let want = item["sha256"].getStr
    check sha256Hex(body) == want, "length " & $body.len
    var st = initSha256()
    var i = 0
    while i < body.len:
      let part = r.rand(1 .. 200)
      st.update(body[i ..< min(i + part, body.len)])
      i += part
    check hexDigest(st.finish()) == want, "length " & $body.len & " in parts"
    inc n
  check n >= 100
  ok "sha256: " & $n & " random bodies hash as Go hashes them"

proc main() {.async.} =
  let url = env("STARLEASE_NIM_URL")
  let actorKey = env("STARLEASE_NIM_ACTOR_KEY")
  let adminKey = env("STARLEASE_NIM_ADMIN_KEY")
  let queue = env("STARLEASE_NIM_QUEUE")
  let resultsPath = env("STARLEASE_NIM_RESULTS")
  let bodies = loadBodies()
  check bodies.len >= 2
  run = newRequestId()[4 .. 13]
  let c = newClient(url, actorKey)
  let admin = newClient(url, adminKey)

  # A secret-shaped request id is refused before anything is sent (the
  # client points at a closed port: sending would fail differently).
  block:
    let nowhere = newClient("http://127.0.0.1:9", actorKey, timeoutMs = 2000)
    for bad in [repeat("ab", 32), "star_sk_v1_abc", "req id"]:
      var req = acquireReq("secret-id")
      req.requestId = bad
      try:
        discard await nowhere.acquire(req)
        check false, "a malformed request id was accepted"
      except InvalidRequestError as e:
        check e.field == "request_id" and e.status == 0, e.msg
  ok "a malformed or secret-shaped request id is refused locally"

  # invalid_credential, without the key in the error.
  block:
    let bogus = "star_sk_v1_01HZZZZZZZZZZZZZZZZZZZZZZZ_" & repeat("cd", 32)
    try:
      discard await newClient(url, bogus).acquire(acquireReq("cred"))
      check false, "a bogus key acquired"
    except InvalidCredentialError as e:
      check e.code == ecInvalidCredential and e.status == 401 and not e.retryable
      check e.correlationId.len > 0
      check bogus notin e.msg and repeat("cd", 32) notin e.msg
  ok "invalid_credential is typed and never shows the key"

  # acquire
  let reqA = acquireReq("a")
  let resA = await c.acquire(reqA)
  check resA.code == scAcquired and not resA.replayed
  check resA.lease.fencingToken >= 1 and resA.lease.state == lsActive
  check resA.requestId.isRequestId, resA.requestId
  check resA.correlationId.len > 0
  check resA.lease.identity.workflowName == "default" and resA.lease.identity.targetId == reqA.identity.targetId
  check resA.lease.ttlMs == 30_000 and resA.lease.expiresAt > resA.lease.acquiredAt
  var a = hold(resA, reqA)
  check a.localExpiry > getMonoTime()
  ok "acquire: token " & $a.lease.fencingToken & ", " & a.lease.leaseId

  # A second acquire of a held target is a typed conflict.
  block:
    var req2 = acquireReq("a", instance = "fediwatch-2")
    try:
      discard await c.acquire(req2)
      check false, "a held target was acquired twice"
    except LeaseConflictError as e:
      check e.code == ecConflict and e.status == 409 and e.retryable
      check e.retryAfterMs > 0 and e.correlationId.len > 0 and e.requestId.isRequestId
  ok "a second acquire on a held target is lease_conflict"

  # Replay: the same request id returns the same lease, replayed.
  block:
    var req = acquireReq("replay")
    req.requestId = newRequestId()
    let first = await c.acquire(req)
    let again = await c.acquire(req)
    check not first.replayed and again.replayed
    check again.requestId == req.requestId
    check again.lease.leaseId == first.lease.leaseId and
      again.lease.fencingToken == first.lease.fencingToken
    # The same request id with another body is an idempotency conflict.
    var changed = req
    changed.ttlMs = 20_000
    try:
      discard await c.acquire(changed)
      check false, "a changed body was replayed"
    except IdempotencyConflictError as e:
      check e.code == ecIdempotencyConflict and e.status == 409
    discard await c.release(hold(first, req))
  ok "a replayed request id returns the same lease (replayed=true); a changed body is idempotency_conflict"

  # renew, get, inspect
  block:
    let r = await c.renew(a)
    check r.code == scRenewed and r.lease.leaseId == a.lease.leaseId
    check r.lease.fencingToken == a.lease.fencingToken
    check r.lease.expiresAt >= a.lease.expiresAt and r.lease.renewedAt >= a.lease.renewedAt
    check r.requestId.isRequestId and r.requestId != resA.requestId
    a = a.renewed(r)
    let g = await c.get(a.lease.leaseId)
    check g.code == scInspected and g.lease.leaseId == a.lease.leaseId and g.lease.state == lsActive
    check g.requestId == ""
    let i = await c.inspect(reqA.identity)
    check i.lease.leaseId == a.lease.leaseId and i.lease.fencingToken == a.lease.fencingToken
    try:
      discard await c.inspect(identity("never-acquired-" & run))
      check false, "inspect of a free target"
    except LeaseNotFoundError as e:
      check e.status == 404
  ok "renew keeps the token and extends; get and inspect read it"

  # Fenced publications: the server answers the message id and the body's
  # digest (checked against Go's); Go then finds them on the broker.
  var firstMessage = ""
  for i, b in bodies:
    let commitId = "c-" & $i & "-" & run
    # The second carries application headers, which the relay publishes
    # beside the fence headers.
    let hdrs = if i == 1: @[("x-dtype", "fediwatch.note"), ("x-run", run)] else: @[]
    let pub = Publication(routingKey: queue, contentType: b.contentType, body: b.bytes, headers: hdrs)
    let cr = await c.authorizeCommit(a, commitId, pub)
    check cr.code == scInspected and not cr.replayed
    check cr.commit.target.startsWith("msg_"), cr.commit.target
    check cr.commit.payloadSha256 == b.sha256, cr.commit.payloadSha256 & " != " & b.sha256
    check cr.commit.fencingToken == a.lease.fencingToken and cr.commit.leaseId == a.lease.leaseId
    check cr.commit.commitId == commitId and cr.commit.sink == DefaultSink
    check cr.commit.executionId == a.executionId and cr.commit.jobId == a.jobId
    check cr.commit.traceId == a.traceId and cr.commit.commitSeq >= 1
    published.add record(a, commitId, b, cr.commit.target, cr.commit.payloadSha256, hdrs)
    if i == 0:
      firstMessage = cr.commit.target
      # The same commit again is idempotent: same message id, replayed.
      let again = await c.authorizeCommit(a, commitId, pub)
      check again.replayed and again.commit.target == cr.commit.target
      check again.commit.commitSeq == cr.commit.commitSeq
    ok "published " & cr.commit.target & " (" & $b.bytes.len & " bytes, seq " &
      $cr.commit.commitSeq & ")"
  # The same commit id with another message is an idempotency conflict.
  block:
    try:
      discard await c.authorizeCommit(a, "c-0-" & run,
        Publication(routingKey: queue, body: "another message".toBytes))
      check false, "another message under a used commit id"
    except IdempotencyConflictError:
      discard
  ok "a commit id names one message: replay is idempotent, another message conflicts"

  # The client checks the answered payload_sha256 against the SHA-256 of
  # the body it sent: a proxy that changes the digest in the answer makes
  # the outcome unknown (the server did append the message).
  block:
    let proxy = startProxy(url)
    proxy.rewrite = proc (answer: string): string =
      result = answer
      let at = answer.find("\"payload_sha256\":\"")
      if at >= 0:
        let start = at + "\"payload_sha256\":\"".len
        result[start ..< start + 64] = repeat('0', 64)
    let pc = newClient(proxy.url, actorKey)
    let b = bodies[0]
    let commitId = "c-digest-" & run
    let pub = Publication(routingKey: queue, contentType: b.contentType, body: b.bytes)
    try:
      discard await pc.authorizeCommit(a, commitId, pub)
      check false, "a commit answer with another digest was accepted"
    except OutcomeUnknownError as e:
      check e.requestId == commitId and e.retryable and "payload_sha256" in e.msg, e.msg
    proxy.server.close()
    # The same commit id settles it: the server's record, with the digest.
    let again = await c.authorizeCommit(a, commitId, pub)
    check again.replayed and again.commit.payloadSha256 == b.sha256
    published.add record(a, commitId, b, again.commit.target, again.commit.payloadSha256)
  ok "a commit answer whose payload_sha256 is not the body's SHA-256 is outcome unknown"

  # An invalid request is typed, with its field.
  block:
    var bad = acquireReq("invalid", ttlMs = 10)
    try:
      discard await c.acquire(bad)
      check false, "ttl_ms 10 accepted"
    except InvalidRequestError as e:
      check e.code == ecInvalidRequest and e.status == 400 and e.field == "ttl_ms"
      check not e.retryable and "ttl_ms" in e.msg
  ok "an invalid request is invalid_lease_request with field ttl_ms"

  # Lost answers: the proxy forwards each request but drops the first
  # answer; the client sends the same request id and body again and the
  # server answers from its idempotency record.
  block:
    let proxy = startProxy(url)
    let pc = newClient(proxy.url, actorKey, timeoutMs = 15_000)
    let req = acquireReq("lost-answer")
    proxy.dropAnswers = 1
    let r = await pc.acquire(req)
    check r.replayed, "the retried acquire was not answered from the idempotency record"
    check proxy.bodies.len == 2 and proxy.bodies[0] == proxy.bodies[1]
    check ($parseJson(proxy.bodies[0])["request_id"].getStr) == r.requestId
    let direct = await c.get(r.lease.leaseId)
    check direct.lease.fencingToken == r.lease.fencingToken and direct.lease.state == lsActive
    let h = hold(r, req)
    # The same for a publication: one message id, published once.
    let b = bodies[0]
    let commitId = "c-lost-" & run
    proxy.dropAnswers = 1
    let cr = await pc.authorizeCommit(h, commitId,
      Publication(routingKey: queue, contentType: b.contentType, body: b.bytes))
    check cr.replayed and cr.commit.payloadSha256 == b.sha256
    check proxy.bodies.len == 4 and proxy.bodies[2] == proxy.bodies[3]
    published.add record(h, commitId, b, cr.commit.target, cr.commit.payloadSha256)
    # And for release.
    proxy.dropAnswers = 1
    let rel = await pc.release(h)
    check rel.replayed and rel.code == scReleased and rel.lease.state == lsReleased
    check proxy.bodies.len == 6 and proxy.bodies[4] == proxy.bodies[5]
    proxy.server.close()
  ok "lost answers are resolved by resending the same request id (acquire, publish, release)"

  # release; a publication after it is lease_lost and never published.
  block:
    let r = await c.release(a)
    check r.code == scReleased and r.lease.state == lsReleased
    check r.lease.leaseId == a.lease.leaseId
    let b = bodies[0]
    let commitId = "c-after-release-" & run
    try:
      discard await c.authorizeCommit(a, commitId,
        Publication(routingKey: queue, contentType: b.contentType, body: "stale after release".toBytes))
      check false, "published after release"
    except LeaseLostError as e:
      check e.code == ecLost and e.status == 409 and not e.retryable
    refused.add record(a, commitId, Body(b64: encode("stale after release"), contentType: b.contentType))
    try:
      discard await c.renew(a)
      check false, "renewed after release"
    except LeaseLostError:
      discard
  ok "release; renew and publication after it are lease_lost"

  # Keeper, revoked: the admin revokes while the keeper runs; the keeper
  # reports it, and a publication after that is refused.
  block:
    let req = acquireReq("keeper-revoked", ttlMs = 3000)
    let h = hold(await c.acquire(req), req)
    var callbackCause = lcNone
    let k = newKeeper(c, h, onLost = proc (k: Keeper) = callbackCause = k.cause)
    await k.waitRenewals(1, 5000)
    check not k.lost and k.cause == lcNone
    let rv = await admin.revoke(k.held.lease, reason = "nim client suite")
    check rv.code == scRevoked and rv.lease.state == lsRevoked
    check await k.waitLost(4000), "the keeper did not report the revocation"
    check k.lost and k.cause == lcRevoked, $k.cause
    check k.whenLost.read == lcRevoked and callbackCause == lcRevoked
    check not k.lossError.isNil and k.lossError.code == ecLost
    let commitId = "c-after-revoke-" & run
    let stale = "stale after revoke " & run
    try:
      discard await c.authorizeCommit(k.held, commitId,
        Publication(routingKey: queue, contentType: "text/plain", body: stale.toBytes))
      check false, "published after revoke"
    except LeaseLostError as e:
      check e.code == ecLost
    refused.add record(k.held, commitId, Body(b64: encode(stale), contentType: "text/plain"))
    await k.close()
    check k.cause == lcRevoked
  ok "keeper: revoke is reported as revoked; a publication after it is lease_lost"

  # Keeper, force-released.
  block:
    let req = acquireReq("keeper-forced", ttlMs = 3000)
    let h = hold(await c.acquire(req), req)
    let k = newKeeper(c, h)
    await k.waitRenewals(1, 5000)
    let fr = await admin.forceRelease(k.held.lease, incidentId = "inc-" & run)
    check fr.code == scReleased and fr.lease.state == lsReleased
    check await k.waitLost(4000)
    check k.cause == lcForceReleased, $k.cause
    await k.close()
  ok "keeper: force-release is reported as force_released"

  # Keeper, expired: it starts on a lease whose TTL has run out.
  block:
    let req = acquireReq("keeper-expired", ttlMs = 1500)
    let h = hold(await c.acquire(req), req)
    await sleepAsync(1800)
    let k = newKeeper(c, h)
    check await k.waitLost(4000)
    check k.cause == lcExpired, $k.cause
    await k.close()
  ok "keeper: an expired lease is reported as expired"

  # Keeper, rejected: a renewal from the wrong instance is refused while
  # the lease stays active.
  block:
    let req = acquireReq("keeper-rejected", ttlMs = 3000)
    let h = hold(await c.acquire(req), req)
    var wrong = h
    wrong.serviceInstanceId = "someone-else"
    let k = newKeeper(c, wrong)
    check await k.waitLost(4000)
    check k.cause == lcRejected, $k.cause
    await k.close()
    discard await c.release(h)
  ok "keeper: a refused renewal of a lease still active is reported as rejected"

  # Keeper, backend unavailable: no renewal gets through, and the loss is
  # reported before the lease expires.
  block:
    let proxy = startProxy(url)
    proxy.refuse = true
    let pc = newClient(proxy.url, actorKey)
    let req = acquireReq("keeper-unreachable", ttlMs = 3000)
    let h = hold(await c.acquire(req), req)
    let k = newKeeper(pc, h)
    check await k.waitLost(5000)
    check k.cause == lcBackendUnavailable, $k.cause
    check getMonoTime() < h.localExpiry, "the loss was reported after the lease's expiry"
    check not k.lossError.isNil, "no error recorded"
    check k.lossError.code in {ecOutcomeUnknown, ecBackendUnavailable, ecDeadlineExceeded},
      $k.lossError.code
    proxy.server.close()
    discard await c.release(h)
  ok "keeper: an unreachable server is reported as backend_unavailable before expiry"

  # Keeper, closed: close releases the lease.
  block:
    let req = acquireReq("keeper-close", ttlMs = 3000)
    let h = hold(await c.acquire(req), req)
    let k = newKeeper(c, h)
    await k.waitRenewals(2, 5000)
    check k.held.lease.fencingToken == h.lease.fencingToken
    check k.held.lease.expiresAt > h.lease.expiresAt
    await k.close()
    check k.lost and k.cause == lcReleased
    let g = await c.get(h.lease.leaseId)
    check g.lease.state == lsReleased
  ok "keeper: renews at about a third of the TTL and releases on close"

  await couchSuite(c, admin)

  writeFile(resultsPath, $(%*{"published": published, "refused": refused,
                              "couch": couchDocs, "couch_stale": couchStale}))
  for p in published:
    echo "PUBLISHED ", p["message_id"].getStr, " ", p["commit_id"].getStr
  for r in refused:
    echo "REFUSED ", r["commit_id"].getStr

offline()
goDigests()
waitFor main()
echo "all ", checks, " checks passed"
