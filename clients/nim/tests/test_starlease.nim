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
##   STARLEASE_NIM_RESULTS    where to write what was published and refused,
##                            for the Go test to check on the broker
##
## Every check that fails prints FAIL with its line and exits non-zero.

import std/[asyncdispatch, asyncnet, base64, json, monotimes, os, sets,
            strutils, times]
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
# for the next `dropAnswers` requests, closes the client's connection
# instead of passing the answer on (the server has acted; the client cannot
# know). With `refuse` it closes every connection without forwarding.

type Proxy = ref object
  server: AsyncSocket
  port: Port
  upstreamPort: Port
  dropAnswers: int
  refuse: bool
  bodies: seq[string]   # request bodies forwarded, in order

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
    p.bodies.add body
    let up = newAsyncSocket()
    await up.connect("127.0.0.1", p.upstreamPort)
    await up.send(head & body)
    let (rhead, rlength) = await up.readHead()
    let rbody = await up.readBody(rlength)
    up.close()
    if p.dropAnswers > 0:
      dec p.dropAnswers
      client.close()   # the server acted; its answer is lost
      return
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
  ## A proxy to the server at upstream ("http://127.0.0.1:PORT").
  let port = Port(parseInt(upstream.rsplit(':', 1)[1].strip(chars = {'/'})))
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

proc offline() =
  ## What needs no server.
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

  writeFile(resultsPath, $(%*{"published": published, "refused": refused}))
  for p in published:
    echo "PUBLISHED ", p["message_id"].getStr, " ", p["commit_id"].getStr
  for r in refused:
    echo "REFUSED ", r["commit_id"].getStr

offline()
waitFor main()
echo "all ", checks, " checks passed"
