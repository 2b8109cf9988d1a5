## A client of the starlease target-lease HTTP API for Nim actors.
##
## The module speaks the API that `httpapi/openapi.json` describes, with the
## standard library only (`std/asyncdispatch` and `std/httpclient`). Every
## call is `async`, so an actor that runs an event loop (fediWatch,
## star-db-bot) awaits it like any other I/O; a program without one calls
## `waitFor`, and drives a `Keeper` by calling `poll()` now and then.
##
## * `Client` calls the API: `acquire`, `renew`, `release`, `get`,
##   `inspect`, `authorizeCommit` (a fenced write, or a fenced publication
##   through the server's outbox) and, for administrators, `revoke` and
##   `forceRelease`. Results are typed (`LeaseResult`, `CommitResult`);
##   every failure is a `StarleaseError` (one subtype per wire code).
## * Every mutation carries a request id (`newRequestId`, or the caller's
##   own). When the outcome of a mutation is unknown (no answer after the
##   request may have been sent, or `lease_outcome_unknown`) the client
##   sends the same request id with the same body again, a bounded number of
##   times with backoff, until the server's idempotency record settles it.
##   A commit authorization is settled the same way by its `commit_id`.
## * `Keeper` renews a held lease before it expires and reports its loss
##   with a typed `LossCause`; `close` releases it.
## * `writeCouch` makes the fenced CouchDB write the Go writer makes: a
##   commit authorized for exactly this document and body (its SHA-256, by
##   the module `sha256`), then a PUT carrying the commit's guard, which the
##   database's fence design document refuses once a newer lease has
##   written the document (`CommitRejectedError`).
##
## The API key is sent only in the `Authorization` header: it is never part
## of an error message or of `$client`. (`repr` shows every field of any
## object, this one's included; do not log `repr(client)`.)
##
## For `https://` base URLs compile with `-d:ssl`.

import std/[asyncdispatch, base64, httpclient, json, monotimes, options,
            os, random, strutils, sysrand, times, uri]
from std/math import classify, FloatClass
from std/unicode import validateUtf8
import sha256
export sha256
when defined(posix):
  from std/posix import ECONNREFUSED

const
  BasePath* = "/api/v1/target-leases"
    ## Route prefix of the lease API.
  DefaultSink* = "rabbitmq"
    ## The sink a publication is authorized under, as the Go publisher has it.
  DefaultTimeoutMs* = 10_000
    ## Budget of a call, all its attempts included, unless the call or the
    ## client names another.
  DefaultMaxAttempts* = 5
    ## Attempts of one call when its outcome stays unknown.
  MaxFencingToken* = 9_007_199_254_740_991'i64
    ## Largest fencing token (2^53 - 1).
  MaxOutboxBody* = 65_536
    ## Largest publication body, in bytes before encoding.
  maxResponseBytes = 8 shl 20
  maxTimeoutMs = 24 * 3600 * 1000
  timestampFormat = "yyyy-MM-dd'T'HH:mm:ss'.'fff'Z'"
  base32Alphabet = "abcdefghijklmnopqrstuvwxyz234567"

type
  LeaseState* = enum
    ## The externally observable state of a lease.
    lsActive = "active"
    lsExpired = "expired"
    lsReleased = "released"
    lsRevoked = "revoked"

  SuccessCode* = enum
    ## Wire code of a successful answer. A commit authorization answers
    ## `lease_inspected` (the lease was validated; the body holds the commit);
    ## a force-release answers `lease_released`.
    scAcquired = "lease_acquired"
    scRenewed = "lease_renewed"
    scReleased = "lease_released"
    scInspected = "lease_inspected"
    scListed = "lease_listed"
    scRevoked = "lease_revoked"

  ErrorCode* = enum
    ## Wire code of an error answer; the client classifies failures without
    ## an answer, and a sink's (CouchDB's) answers, with the same codes.
    ecInvalidRequest = "invalid_lease_request"
    ecInvalidCredential = "invalid_credential"
    ecAccessDenied = "access_denied"
    ecNotFound = "lease_not_found"
    ecDeadlineExceeded = "deadline_exceeded"
    ecConflict = "lease_conflict"
    ecLost = "lease_lost"
    ecIdempotencyConflict = "idempotency_conflict"
    ecRateLimited = "lease_rate_limited"
    ecBackendUnavailable = "lease_backend_unavailable"
    ecOutcomeUnknown = "lease_outcome_unknown"
    ecCommitRejected = "commit_rejected"
      ## a sink's fence (CouchDB's validate_doc_update) refused a write;
      ## never on the lease API's wire (the server answers `lease_lost`)
    ecCorrupt = "lease_corrupt"
      ## a stored document cannot be trusted (a malformed stored fence);
      ## never on the lease API's wire

  StarleaseError* = object of CatchableError
    ## Every failure of a `Client` call: the server's error envelope, or a
    ## failure without a usable answer classified by the same codes. `msg`
    ## describes it (never with the API key); the fields carry the envelope.
    code*: ErrorCode
    status*: int          ## HTTP status; 0 when no answer was read
    serverMsg*: string    ## the envelope's `msg`, or the client's description
    field*: string        ## the offending input of an `invalid_lease_request`
    correlationId*: string
    retryable*: bool      ## for `lease_outcome_unknown`: only with the same request id
    retryAfterMs*: int    ## the server's hint; 0 when none
    requestId*: string    ## the idempotency key sent (request id, or commit id)

  InvalidRequestError* = object of StarleaseError    ## `invalid_lease_request` (400)
  InvalidCredentialError* = object of StarleaseError ## `invalid_credential` (401)
  AccessDeniedError* = object of StarleaseError      ## `access_denied` (403)
  LeaseNotFoundError* = object of StarleaseError     ## `lease_not_found` (404)
  DeadlineExceededError* = object of StarleaseError  ## `deadline_exceeded` (408)
  LeaseConflictError* = object of StarleaseError     ## `lease_conflict` (409)
  LeaseLostError* = object of StarleaseError         ## `lease_lost` (409)
  IdempotencyConflictError* = object of StarleaseError ## `idempotency_conflict` (409)
  RateLimitedError* = object of StarleaseError       ## `lease_rate_limited` (429)
  BackendUnavailableError* = object of StarleaseError ## `lease_backend_unavailable` (503)
  OutcomeUnknownError* = object of StarleaseError
    ## `lease_outcome_unknown` (503): the mutation may have been applied.
    ## Resolve it by calling again with `requestId` (or the same commit id).
  CommitRejectedError* = object of StarleaseError
    ## `commit_rejected`: a fenced sink refused the write; never retried.
    ## `superseded` is true when the fence says a successor holds the
    ## document (a higher token, or another lease at the same token): the
    ## lease is lost. Otherwise the write itself was refused (its type, id
    ## or guard) and the lease may still be held.
    superseded*: bool
  CorruptError* = object of StarleaseError
    ## `lease_corrupt`: a stored document cannot be trusted (its fence is
    ## malformed); nothing was written.
  FenceMissingError* = object of BackendUnavailableError
    ## The CouchDB database has no fence design document, or another one
    ## than this client knows (`FenceSha256`): nothing is written without
    ## the downstream guard. An operator installs it (the Go package
    ## couchdb's `InstallFence`).

  LockIdentity* = object
    ## The canonical lock identity. Empty `workflowName` and
    ## `operationClass` mean "default" (the server answers them filled in).
    tenantId*, programId*, targetNamespace*, targetId*, actorName*: string
    workflowName*, operationClass*: string

  Lease* = object
    ## A lease as the server describes it.
    identity*: LockIdentity
    leaseId*: string
    fencingToken*: int64
    acquiredAt*, renewedAt*, expiresAt*: Time  ## backend time
    ttlMs*: int64
    state*: LeaseState

  Held* = object
    ## A lease this process holds, with what every later call on it needs
    ## (renew, release, commit). `hold` builds it from an acquisition.
    lease*: Lease
    serviceInstanceId*, executionId*, jobId*, traceId*: string
    localExpiry*: MonoTime
      ## A conservative estimate of `expiresAt` on the local monotonic
      ## clock: when the granting call was first sent, plus the grant. The
      ## server's clock decides; this only schedules renewals.

  LeaseResult* = object
    ## Answer of acquire, renew, release, revoke, force-release, get and
    ## inspect.
    code*: SuccessCode
    correlationId*: string
    requestId*: string        ## the request id of a mutation ("" for reads)
    lease*: Lease
    current*: Option[Lease]   ## on a replay whose lease has since ended: its state now
    replayed*: bool           ## answered from the idempotency record of an earlier request
    sentAt*: MonoTime         ## when the call's first attempt was sent (local clock)

  AcquireRequest* = object
    ## What `acquire` asks for. `requestId` "" gets a fresh one;
    ## `maximumLifetimeMs` 0 is the server's configured maximum; `waitMs`
    ## asks for a bounded retry on conflict; `metadata` (nil: none) is a
    ## small object of non-secret scalar labels.
    identity*: LockIdentity
    ttlMs*: int
    maximumLifetimeMs*: int
    serviceInstanceId*, executionId*, jobId*, traceId*: string
    metadata*: JsonNode
    waitMs*: int
    requestId*: string

  Publication* = object
    ## A message to publish under the fence (the `outbox` object): the
    ## server appends it to its outbox in the same atomic step as the lease
    ## check and its relay publishes it, with a stable message id and the
    ## fence in the AMQP headers. An empty `exchange` is the default one.
    exchange*: string
    routingKey*: string
    contentType*: string
    body*: seq[byte]          ## at most `MaxOutboxBody` bytes; sent as padded base64
    headers*: seq[(string, string)]
      ## Application headers (at most 32; names starting `x-starintel-` are
      ## the relay's fence headers and refused). Sent only when non-empty.

  Commit* = object
    ## An accepted commit authorization of one write.
    lockKey*: string         ## the canonical lock key of the lease's identity (opaque)
    sink*, commitId*, leaseId*: string
    fencingToken*: int64
    executionId*, jobId*, traceId*: string
    target*: string          ## the object written; for a publication its message id ("msg_…")
    payloadSha256*: string   ## hex SHA-256 of what is written (a publication's body)
    commitSeq*: int64        ## orders the lease's commits
    acceptedAt*, backendTime*: Time

  CommitResult* = object
    ## Answer of `authorizeCommit`. The wire code is `lease_inspected`.
    code*: SuccessCode
    correlationId*: string
    replayed*: bool
    commit*: Commit

  Client* = ref object
    ## A client of one starlease server. Each call uses its own connection,
    ## so calls may run concurrently on one event loop.
    baseUrl: string
    apiKey: string
    timeoutMs*: int      ## budget of a call without its own (all attempts)
    maxAttempts*: int    ## attempts of one call while its outcome is unknown
    userAgent*: string

proc `$`*(c: Client): string =
  ## Describes the client without its API key.
  if c.isNil: "starlease client <nil>"
  else: "starlease client " & c.baseUrl & " (api key [redacted])"

proc `$`*(id: LockIdentity): string =
  ## The identity as "tenant/program/namespace/target/actor/workflow/class".
  [id.tenantId, id.programId, id.targetNamespace, id.targetId, id.actorName,
   id.workflowName, id.operationClass].join("/")

# ---------------------------------------------------------------------------
# Identifiers

var
  rngState {.threadvar.}: Rand
  rngReady {.threadvar.}: bool

proc jitterRand(max: int): int =
  ## A pseudo-random integer in 0..max for jitter (and for ids, should the
  ## operating system's generator fail), seeded once per thread.
  if not rngReady:
    rngState = initRand(getMonoTime().ticks xor getTime().toUnix)
    rngReady = true
  rngState.rand(max)

proc randomBytes(n: int): seq[byte] =
  ## n bytes from the operating system's generator; should it fail, from
  ## the pseudo-random one (ids are opaque, not secrets: they must be
  ## unique, not unguessable).
  try:
    result = urandom(n)
  except OSError:
    result = newSeq[byte](n)
    for b in result.mitems:
      b = byte(jitterRand(255))

proc base32Id(prefix: string): string =
  ## prefix and 26 characters of lower-case base32 (130 random bits).
  let bytes = randomBytes(17)
  result = prefix
  var acc, bits = 0
  for b in bytes:
    acc = (acc shl 8) or int(b)
    bits += 8
    while bits >= 5 and result.len < prefix.len + 26:
      bits -= 5
      result.add base32Alphabet[(acc shr bits) and 31]
    acc = acc and ((1 shl bits) - 1)

proc newRequestId*(): string =
  ## A fresh request id: "req-" and 26 random base32 characters. It is
  ## opaque and never secret-shaped (no 64 hex digits, no "star_sk_").
  base32Id("req-")

proc newCorrelationId*(): string =
  ## A fresh correlation id: "corr-" and 26 random base32 characters.
  base32Id("corr-")

proc secretShaped*(v: string): bool =
  ## Whether v looks like credential material: "star_sk_" or "bearer "
  ## (any case) or a run of 64 hex digits. Such a value is never sent as
  ## an id.
  let l = v.toLowerAscii
  if "star_sk_" in l or "bearer " in l:
    return true
  var run = 0
  for ch in v:
    if ch in HexDigits:
      inc run
      if run >= 64: return true
    else:
      run = 0

proc opaqueIdProblem(v: string): string =
  ## Why v is not a well-formed opaque id ("" when it is): 1..256 bytes of
  ## ASCII letters, digits and ". _ : -", starting with a letter or digit,
  ## without "..", and not secret-shaped.
  if v.len == 0: return "must not be empty"
  if v.len > 256: return "must be at most 256 bytes"
  for i, ch in v:
    if not (ch in Letters or ch in Digits or (i > 0 and ch in {'.', '_', ':', '-'})):
      return "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit"
  if ".." in v: return "must not contain .."
  if secretShaped(v): return "must not look like credential material"

# ---------------------------------------------------------------------------
# Errors

proc fill(e: ref StarleaseError, code: ErrorCode, status: int, serverMsg, field,
          correlationId: string, retryable: bool, retryAfterMs: int, requestId: string) =
  ## Sets the fields of e and its message.
  e.code = code
  e.status = status
  e.serverMsg = serverMsg
  e.field = field
  e.correlationId = correlationId
  e.retryable = retryable
  e.retryAfterMs = retryAfterMs
  e.requestId = requestId
  var m = "starlease: "
  if status != 0: m.add $status & " "
  m.add $code
  if serverMsg.len > 0: m.add ": " & serverMsg
  if field.len > 0 and field notin serverMsg: m.add " (field " & field & ")"
  if correlationId.len > 0: m.add " [correlation_id " & correlationId & "]"
  if requestId.len > 0 and code == ecOutcomeUnknown:
    m.add " [request_id " & requestId & "]"
  e.msg = m

proc newStarleaseError*(code: ErrorCode, status = 0, serverMsg = "",
                        field = "", correlationId = "", retryable = false,
                        retryAfterMs = 0, requestId = ""): ref StarleaseError =
  ## The error of code, of the subtype `except` clauses match it by.
  case code
  of ecInvalidRequest: result = (ref InvalidRequestError)()
  of ecInvalidCredential: result = (ref InvalidCredentialError)()
  of ecAccessDenied: result = (ref AccessDeniedError)()
  of ecNotFound: result = (ref LeaseNotFoundError)()
  of ecDeadlineExceeded: result = (ref DeadlineExceededError)()
  of ecConflict: result = (ref LeaseConflictError)()
  of ecLost: result = (ref LeaseLostError)()
  of ecIdempotencyConflict: result = (ref IdempotencyConflictError)()
  of ecRateLimited: result = (ref RateLimitedError)()
  of ecBackendUnavailable: result = (ref BackendUnavailableError)()
  of ecOutcomeUnknown: result = (ref OutcomeUnknownError)()
  of ecCommitRejected: result = (ref CommitRejectedError)()
  of ecCorrupt: result = (ref CorruptError)()
  result.fill(code, status, serverMsg, field, correlationId, retryable,
              retryAfterMs, requestId)

proc invalid(field, why: string): ref StarleaseError =
  newStarleaseError(ecInvalidRequest, serverMsg = field & " " & why, field = field)

proc statusOf*(code: ErrorCode): int =
  ## The HTTP status the contract gives code; 0 for `commit_rejected` and
  ## `lease_corrupt`, which only a sink answers (the lease API never does).
  case code
  of ecInvalidRequest: 400
  of ecInvalidCredential: 401
  of ecAccessDenied: 403
  of ecNotFound: 404
  of ecDeadlineExceeded: 408
  of ecConflict, ecLost, ecIdempotencyConflict: 409
  of ecRateLimited: 429
  of ecBackendUnavailable, ecOutcomeUnknown: 503
  of ecCommitRejected, ecCorrupt: 0

# ---------------------------------------------------------------------------
# Client

proc newClient*(baseUrl, apiKey: string, timeoutMs = DefaultTimeoutMs,
                maxAttempts = DefaultMaxAttempts,
                userAgent = "starlease-nim/1"): Client =
  ## A client of the server at baseUrl (scheme, host, port and an optional
  ## path prefix, e.g. "http://127.0.0.1:8080") authenticating with apiKey.
  ## Raises `ValueError` (without the key) for an unusable URL or key.
  let u = parseUri(baseUrl)
  if u.scheme notin ["http", "https"]:
    raise newException(ValueError, "starlease: base URL must be http or https")
  if u.hostname.len == 0:
    raise newException(ValueError, "starlease: base URL needs a host")
  if u.username.len > 0 or u.password.len > 0:
    raise newException(ValueError, "starlease: base URL must not carry user information")
  if u.query.len > 0 or u.anchor.len > 0:
    raise newException(ValueError, "starlease: base URL must not carry a query or fragment")
  if apiKey.len == 0:
    raise newException(ValueError, "starlease: an API key is required")
  for ch in apiKey:
    if ch <= ' ' or ch >= '\x7f':
      raise newException(ValueError, "starlease: the API key holds characters a header cannot carry")
  if maxAttempts < 1:
    raise newException(ValueError, "starlease: maxAttempts must be at least 1")
  Client(baseUrl: baseUrl.strip(leading = false, chars = {'/'}), apiKey: apiKey,
         timeoutMs: timeoutMs, maxAttempts: maxAttempts, userAgent: userAgent)

proc baseUrl*(c: Client): string =
  ## The server's base URL.
  c.baseUrl

type
  Call = object
    ## One logical request: sent once, or again unchanged while its
    ## outcome is unknown.
    meth: HttpMethod
    path: string              # after BasePath, escaped
    body: string              # "" for none
    mutation: bool            # a failure after sending is outcome-unknown
    requestId: string         # the idempotency key, for errors
    accept: set[SuccessCode]
    correlationId: string
    timeoutMs: int

  AttemptKind = enum akAnswered, akTransport

  Attempt = object
    case kind: AttemptKind
    of akAnswered:
      status: int
      body: string
      headerCorrelation: string
    of akTransport:
      sent: bool              # the request may have reached the server
      why: string

  MalformedError = object of ValueError

proc malformedErr(why: string): ref MalformedError =
  newException(MalformedError, why)

proc firstLine(s: string): string =
  ## The first line of a message (debug builds append an async traceback).
  let i = s.find('\n')
  if i < 0: s else: s[0 ..< i]

proc refusedBeforeSending(e: ref Exception): bool =
  ## Whether e says the connection was refused, so nothing was sent. (The
  ## asynchronous connect reports it with the error's message only.)
  when defined(posix):
    e of OSError and osErrorMsg(OSErrorCode(ECONNREFUSED)) in e.msg.firstLine
  else:
    false

proc exchange(http: AsyncHttpClient, url: string, meth: HttpMethod,
              body: string, headers: HttpHeaders): Future[Attempt] {.async.} =
  ## One HTTP exchange; never fails: a failure is an akTransport attempt.
  try:
    let resp = await http.request(url, meth, body, headers)
    let b = await resp.body
    var corr = ""
    if resp.headers.hasKey("X-Correlation-ID"):
      corr = resp.headers["X-Correlation-ID"]
    result = Attempt(kind: akAnswered, status: resp.code.int, body: b,
                     headerCorrelation: corr)
  except CatchableError as e:
    result = Attempt(kind: akTransport, sent: not refusedBeforeSending(e),
                     why: e.msg.firstLine)

proc attempt(c: Client, cl: Call, timeoutMs: int): Future[Attempt] {.async.} =
  ## Sends cl once on a new connection and waits at most timeoutMs.
  var headers = newHttpHeaders({"Authorization": "Bearer " & c.apiKey,
                                "Accept": "application/json",
                                "X-Correlation-ID": cl.correlationId})
  if cl.body.len > 0:
    headers["Content-Type"] = "application/json"
  # A little less than the budget left, so that the server's own answer at
  # its deadline (deadline_exceeded: nothing started; outcome_unknown:
  # resolve by request id) arrives before the client gives up.
  let serverMs = clamp(timeoutMs - min(timeoutMs div 10, 500), 1, maxTimeoutMs)
  headers["X-Request-Timeout-Ms"] = $serverMs
  let http = newAsyncHttpClient(userAgent = c.userAgent, maxRedirects = 0)
  let fut = exchange(http, c.baseUrl & BasePath & cl.path, cl.meth, cl.body, headers)
  if await withTimeout(fut, timeoutMs):
    result = fut.read
  else:
    result = Attempt(kind: akTransport, sent: true,
                     why: "no answer within " & $timeoutMs & " ms")
  http.close()

# JSON reading: every read checks the type; a wrong shape is malformed.

proc strField(n: JsonNode, key: string, required = true): string =
  let v = n.getOrDefault(key)
  if v.isNil or v.kind == JNull:
    if required: raise malformedErr("no " & key)
    return ""
  if v.kind != JString: raise malformedErr(key & " is not a string")
  if required and v.str.len == 0: raise malformedErr(key & " is empty")
  v.str

proc intField(n: JsonNode, key: string, required = true): int64 =
  let v = n.getOrDefault(key)
  if v.isNil or v.kind == JNull:
    if required: raise malformedErr("no " & key)
    return 0
  if v.kind != JInt: raise malformedErr(key & " is not an integer")
  v.getBiggestInt

proc boolField(n: JsonNode, key: string): bool =
  let v = n.getOrDefault(key)
  if v.isNil or v.kind == JNull: return false
  if v.kind != JBool: raise malformedErr(key & " is not a boolean")
  v.bval

proc parseTimestamp*(s: string): Time =
  ## Parses a wire timestamp: RFC 3339 in UTC with milliseconds
  ## ("2026-08-05T12:00:00.000Z"). Raises `ValueError` for any other form.
  let dt = parse(s, timestampFormat, utc())
  if dt.format(timestampFormat) != s:
    raise newException(ValueError, "timestamp is not RFC 3339 UTC with milliseconds")
  dt.toTime

proc formatTimestamp*(t: Time): string =
  ## The wire form of t.
  t.utc.format(timestampFormat)

proc timeField(n: JsonNode, key: string): Time =
  let s = n.strField(key)
  try:
    parseTimestamp(s)
  except ValueError:
    raise malformedErr(key & " is not a timestamp")

proc toJson*(id: LockIdentity): JsonNode =
  ## The `lock_identity` object of id; empty optional components are left out.
  result = %*{"tenant_id": id.tenantId, "program_id": id.programId,
              "target_namespace": id.targetNamespace, "target_id": id.targetId,
              "actor_name": id.actorName}
  if id.workflowName.len > 0: result["workflow_name"] = %id.workflowName
  if id.operationClass.len > 0: result["operation_class"] = %id.operationClass

proc parseIdentity(n: JsonNode): LockIdentity =
  if n.isNil or n.kind != JObject: raise malformedErr("no lock_identity")
  LockIdentity(tenantId: n.strField("tenant_id"), programId: n.strField("program_id"),
               targetNamespace: n.strField("target_namespace"),
               targetId: n.strField("target_id"), actorName: n.strField("actor_name"),
               workflowName: n.strField("workflow_name"),
               operationClass: n.strField("operation_class"))

proc parseLease(n: JsonNode): Lease =
  if n.isNil or n.kind != JObject: raise malformedErr("no lease")
  result = Lease(identity: parseIdentity(n.getOrDefault("lock_identity")),
                 leaseId: n.strField("lease_id"),
                 fencingToken: n.intField("fencing_token"),
                 acquiredAt: n.timeField("acquired_at"),
                 renewedAt: n.timeField("renewed_at"),
                 expiresAt: n.timeField("expires_at"),
                 ttlMs: n.intField("ttl_ms"))
  if result.fencingToken < 1 or result.fencingToken > MaxFencingToken:
    raise malformedErr("fencing_token out of range")
  if result.ttlMs <= 0: raise malformedErr("ttl_ms not positive")
  try:
    result.state = parseEnum[LeaseState](n.strField("state"))
  except ValueError:
    raise malformedErr("unknown lease state")

proc malformed(cl: Call, status: int, corr, why: string): ref StarleaseError =
  ## An answer the client cannot trust: for a mutation the server may have
  ## acted, so it is outcome-unknown.
  let code = if cl.mutation: ecOutcomeUnknown else: ecBackendUnavailable
  newStarleaseError(code, status, "malformed response: " & why, "", corr,
                    true, 0, cl.requestId)

proc decodeSuccess(cl: Call, a: Attempt): JsonNode =
  ## The success envelope of a 200 answer; raises MalformedError.
  if a.body.len > maxResponseBytes: raise malformedErr("response body too large")
  try:
    result = parseJson(a.body)
  except CatchableError:
    raise malformedErr("success body is not JSON")
  if result.kind != JObject: raise malformedErr("success body is not an object")
  if result.strField("status") != "success": raise malformedErr("status is not success")
  discard result.strField("correlation_id")
  let code = result.strField("code")
  var sc: SuccessCode
  try:
    sc = parseEnum[SuccessCode](code)
  except ValueError:
    raise malformedErr("unknown code " & code)
  if sc notin cl.accept: raise malformedErr("unexpected code " & code)

proc decodeError(cl: Call, a: Attempt): ref StarleaseError =
  ## The typed error of a non-200 answer (malformed when it is not one).
  let corr = a.headerCorrelation
  if a.body.len > maxResponseBytes:
    return malformed(cl, a.status, corr, "response body too large")
  var n: JsonNode
  try:
    n = parseJson(a.body)
  except CatchableError:
    return malformed(cl, a.status, corr, "error body is not JSON")
  try:
    if n.kind != JObject or n.strField("status") != "error":
      raise malformedErr("status is not error")
    let codeStr = n.strField("code")
    var code: ErrorCode
    try:
      code = parseEnum[ErrorCode](codeStr)
    except ValueError:
      raise malformedErr("unknown error code " & codeStr)
    if statusOf(code) != a.status:
      raise malformedErr("code " & codeStr & " with status " & $a.status)
    let retryAfter = n.intField("retry_after_ms", required = false)
    if retryAfter < 0: raise malformedErr("negative retry_after_ms")
    let retryable = n.getOrDefault("retryable")
    if retryable.isNil or retryable.kind != JBool: raise malformedErr("no retryable")
    result = newStarleaseError(code, a.status, n.strField("msg", required = false),
                               n.strField("field", required = false),
                               n.strField("correlation_id"), retryable.bval,
                               int(min(retryAfter, int64(maxTimeoutMs))), cl.requestId)
  except MalformedError as e:
    result = malformed(cl, a.status, corr, e.msg)

proc backoffMs(attempt: int, retryAfterMs: int): int =
  ## The pause before attempt+1: the server's hint, or 100 ms doubling up to
  ## 2 s, with jitter (half to all of it).
  let base = min(100 shl min(attempt - 1, 5), 2000)
  let hint = if retryAfterMs > 0: retryAfterMs else: base
  hint div 2 + jitterRand(hint div 2)

proc perform(c: Client, cl: Call): Future[tuple[body: JsonNode, sentAt: MonoTime]] {.async.} =
  ## Sends cl until its answer is known: a mutation whose outcome is
  ## unknown is sent again with the same body (and so the same request id)
  ## within the call's budget and `maxAttempts`; a read is sent again after
  ## a failure without an answer. Raises `StarleaseError`.
  let budget = if cl.timeoutMs > 0: cl.timeoutMs else: c.timeoutMs
  let start = getMonoTime()
  let deadline = start + initDuration(milliseconds = budget)
  var attempts = 0
  var unknown = false   # an earlier attempt of this mutation may have been applied
  var err: ref StarleaseError
  result.sentAt = start
  while true:
    let left = int((deadline - getMonoTime()).inMilliseconds)
    if left <= 0:
      if cl.mutation and unknown:
        raise newStarleaseError(ecOutcomeUnknown, 0,
          "deadline elapsed before the outcome was known; retry with the same request id",
          "", (if err.isNil: "" else: err.correlationId), true, 0, cl.requestId)
      if not err.isNil: raise err
      raise newStarleaseError(ecDeadlineExceeded, 0,
        "deadline elapsed before the request was sent", "", "", true, 0, cl.requestId)
    inc attempts
    let a = await c.attempt(cl, left)
    case a.kind
    of akTransport:
      if a.sent: unknown = true
      if cl.mutation and unknown:
        err = newStarleaseError(ecOutcomeUnknown, 0,
          "no answer after the request was sent (" & a.why & "); resolve by retrying with the same request id",
          "", "", true, 0, cl.requestId)
      elif a.sent:
        err = newStarleaseError(ecBackendUnavailable, 0,
          "no answer from the server (" & a.why & ")", "", "", true, 0, cl.requestId)
      else:
        err = newStarleaseError(ecBackendUnavailable, 0,
          "the request could not be sent (" & a.why & "); nothing was done", "", "",
          true, 0, cl.requestId)
    of akAnswered:
      if a.status == 200:
        try:
          result.body = decodeSuccess(cl, a)
          return
        except MalformedError as e:
          err = malformed(cl, a.status, a.headerCorrelation, e.msg)
      else:
        err = decodeError(cl, a)
      if err.code == ecOutcomeUnknown: unknown = true
    # Retry what says nothing about the outcome: no answer, outcome unknown,
    # or (once an earlier attempt may have been applied) an answer that only
    # says this attempt did nothing. A definitive answer is the outcome.
    let retry =
      if a.kind == akTransport: true
      elif err.code == ecOutcomeUnknown: cl.mutation
      elif cl.mutation and unknown:
        err.code in {ecBackendUnavailable, ecDeadlineExceeded, ecRateLimited}
      else: false
    if not retry:
      raise err
    if attempts >= c.maxAttempts:
      if cl.mutation and unknown and err.code != ecOutcomeUnknown:
        raise newStarleaseError(ecOutcomeUnknown, err.status,
          "outcome still unknown after " & $attempts & " attempts (last: " & $err.code & "); retry with the same request id",
          "", err.correlationId, true, err.retryAfterMs, cl.requestId)
      raise err
    let pause = backoffMs(attempts, err.retryAfterMs)
    if pause >= int((deadline - getMonoTime()).inMilliseconds):
      # No time for another attempt: report what is known now.
      if cl.mutation and unknown and err.code != ecOutcomeUnknown:
        raise newStarleaseError(ecOutcomeUnknown, err.status,
          "deadline elapsed before the outcome was known; retry with the same request id",
          "", err.correlationId, true, err.retryAfterMs, cl.requestId)
      raise err
    await sleepAsync(pause)

proc checkRequestId(id: string): string =
  ## id, or a fresh one when empty; raises `InvalidRequestError` (nothing
  ## sent) when a caller's id is malformed or secret-shaped.
  if id.len == 0: return newRequestId()
  let why = opaqueIdProblem(id)
  if why.len > 0: raise invalid("request_id", why)
  id

proc leasePath(leaseId, suffix: string): string =
  if leaseId.len == 0: raise invalid("lease_id", "is required")
  "/" & encodeUrl(leaseId, usePlus = false) & suffix

proc newCall(meth: HttpMethod, path: string, body: JsonNode, mutation: bool,
             requestId: string, accept: set[SuccessCode], timeoutMs: int,
             correlationId: string): Call =
  var corr = correlationId
  if corr.len == 0: corr = newCorrelationId()
  Call(meth: meth, path: path, body: (if body.isNil: "" else: $body),
       mutation: mutation, requestId: requestId, accept: accept,
       correlationId: corr, timeoutMs: timeoutMs)

proc leaseCall(c: Client, cl: Call): Future[LeaseResult] {.async.} =
  let (n, sentAt) = await c.perform(cl)
  let corr = n["correlation_id"].str
  try:
    result = LeaseResult(code: parseEnum[SuccessCode](n["code"].str),
                         correlationId: corr, requestId: cl.requestId,
                         lease: parseLease(n.getOrDefault("lease")),
                         replayed: n.boolField("replayed"), sentAt: sentAt)
    let cur = n.getOrDefault("current")
    if not cur.isNil and cur.kind != JNull:
      let l = parseLease(cur)
      if l.leaseId != result.lease.leaseId: raise malformedErr("current names another lease")
      result.current = some(l)
  except MalformedError as e:
    raise malformed(cl, 200, corr, e.msg)

# ---------------------------------------------------------------------------
# Lease operations

proc hold*(res: LeaseResult, req: AcquireRequest): Held =
  ## The lease an acquisition granted, with the request's context. Its
  ## `localExpiry` counts the grant from when the call was first sent; for
  ## a replayed answer (the grant is older) it is that moment itself, so a
  ## `Keeper` renews at once.
  let grant = res.lease.expiresAt - res.lease.renewedAt
  Held(lease: res.lease, serviceInstanceId: req.serviceInstanceId,
       executionId: req.executionId, jobId: req.jobId, traceId: req.traceId,
       localExpiry: (if res.replayed: res.sentAt
                     else: res.sentAt + initDuration(milliseconds = grant.inMilliseconds)))

proc acquire*(c: Client, req: AcquireRequest, timeoutMs = 0,
              correlationId = ""): Future[LeaseResult] {.async.} =
  ## Asks for the lease of `req.identity` if it is free (POST /acquire).
  ## Raises `LeaseConflictError` when another lease holds it. A result or
  ## error names the request id used; `hold(result, req)` is what later
  ## calls on the lease take.
  let rid = checkRequestId(req.requestId)
  var body = %*{"lock_identity": req.identity.toJson, "ttl_ms": req.ttlMs}
  if req.maximumLifetimeMs != 0: body["maximum_lifetime_ms"] = %req.maximumLifetimeMs
  body["service_instance_id"] = %req.serviceInstanceId
  body["execution_id"] = %req.executionId
  body["job_id"] = %req.jobId
  if req.traceId.len > 0: body["trace_id"] = %req.traceId
  if not req.metadata.isNil and req.metadata.len > 0: body["metadata"] = req.metadata
  if req.waitMs != 0: body["wait_ms"] = %req.waitMs
  body["request_id"] = %rid
  result = await c.leaseCall(newCall(HttpPost, "/acquire", body, true, rid,
                                     {scAcquired}, timeoutMs, correlationId))

proc renew*(c: Client, h: Held, ttlMs = 0, requestId = "", timeoutMs = 0,
            correlationId = ""): Future[LeaseResult] {.async.} =
  ## Extends a held lease (POST /{lease_id}/renew); ttlMs 0 keeps its TTL.
  ## Raises `LeaseLostError` when the lease is no longer held.
  let rid = checkRequestId(requestId)
  var body = %*{"lock_identity": h.lease.identity.toJson,
                "fencing_token": h.lease.fencingToken,
                "service_instance_id": h.serviceInstanceId}
  if ttlMs != 0: body["ttl_ms"] = %ttlMs
  body["request_id"] = %rid
  result = await c.leaseCall(newCall(HttpPost, leasePath(h.lease.leaseId, "/renew"),
                                     body, true, rid, {scRenewed}, timeoutMs, correlationId))

proc renewed*(h: Held, res: LeaseResult): Held =
  ## h after the renewal res: its lease as answered and a new local expiry
  ## estimate (for a replayed answer: when the call was sent).
  result = h
  result.lease = res.lease
  let grant = res.lease.expiresAt - res.lease.renewedAt
  result.localExpiry =
    if res.replayed: res.sentAt
    else: res.sentAt + initDuration(milliseconds = grant.inMilliseconds)

proc release*(c: Client, h: Held, requestId = "", timeoutMs = 0,
              correlationId = ""): Future[LeaseResult] {.async.} =
  ## Ends a held lease (POST /{lease_id}/release). Raises `LeaseLostError`
  ## when it was no longer held.
  let rid = checkRequestId(requestId)
  let body = %*{"lock_identity": h.lease.identity.toJson,
                "fencing_token": h.lease.fencingToken,
                "service_instance_id": h.serviceInstanceId, "request_id": rid}
  result = await c.leaseCall(newCall(HttpPost, leasePath(h.lease.leaseId, "/release"),
                                     body, true, rid, {scReleased}, timeoutMs, correlationId))

proc adminCall(c: Client, observed: Lease, suffix: string, accept: set[SuccessCode],
               reason, incidentId, requestId: string, timeoutMs: int,
               correlationId: string): Future[LeaseResult] =
  if reason.len == 0 and incidentId.len == 0:
    raise invalid("reason", "a reason or incident id is required")
  let rid = checkRequestId(requestId)
  var body = %*{"lock_identity": observed.identity.toJson,
                "fencing_token": observed.fencingToken}
  if reason.len > 0: body["reason"] = %reason
  if incidentId.len > 0: body["incident_id"] = %incidentId
  body["request_id"] = %rid
  c.leaseCall(newCall(HttpPost, leasePath(observed.leaseId, suffix), body, true, rid,
                      accept, timeoutMs, correlationId))

proc revoke*(c: Client, observed: Lease, reason = "", incidentId = "", requestId = "",
             timeoutMs = 0, correlationId = ""): Future[LeaseResult] {.async.} =
  ## Ends the observed lease with the security terminal state `revoked`
  ## (POST /{lease_id}/revoke). Needs an administrator key with
  ## `targets:force-release` and a reason or incident id.
  result = await c.adminCall(observed, "/revoke", {scRevoked}, reason, incidentId,
                             requestId, timeoutMs, correlationId)

proc forceRelease*(c: Client, observed: Lease, reason = "", incidentId = "",
                   requestId = "", timeoutMs = 0,
                   correlationId = ""): Future[LeaseResult] {.async.} =
  ## Ends the observed lease with the operational terminal state `released`
  ## (POST /{lease_id}/force-release; the wire code is `lease_released`).
  ## Needs an administrator key and a reason or incident id.
  result = await c.adminCall(observed, "/force-release", {scReleased}, reason,
                             incidentId, requestId, timeoutMs, correlationId)

proc get*(c: Client, leaseId: string, timeoutMs = 0,
          correlationId = ""): Future[LeaseResult] {.async.} =
  ## Reads a lease by id within the caller's scope (GET /{lease_id}); a
  ## terminal lease answers with its terminal state.
  result = await c.leaseCall(newCall(HttpGet, leasePath(leaseId, ""), nil, false, "",
                                     {scInspected}, timeoutMs, correlationId))

proc inspect*(c: Client, identity: LockIdentity, timeoutMs = 0,
              correlationId = ""): Future[LeaseResult] {.async.} =
  ## Reads the lease of a lock identity (POST /inspect); raises
  ## `LeaseNotFoundError` when there is none.
  result = await c.leaseCall(newCall(HttpPost, "/inspect",
                                     %*{"lock_identity": identity.toJson}, false, "",
                                     {scInspected}, timeoutMs, correlationId))

proc toJson*(p: Publication): JsonNode =
  ## The `outbox` object of p: the body in standard padded base64, empty
  ## optional fields left out.
  result = newJObject()
  if p.exchange.len > 0: result["exchange"] = %p.exchange
  result["routing_key"] = %p.routingKey
  if p.contentType.len > 0: result["content_type"] = %p.contentType
  result["body"] = %encode(p.body)
  if p.headers.len > 0:
    var h = newJObject()
    for (k, v) in p.headers: h[k] = %v
    result["headers"] = h

proc toBytes*(s: string): seq[byte] =
  ## The bytes of s, for `Publication.body`.
  result = newSeq[byte](s.len)
  for i, ch in s: result[i] = byte(ch)

proc isHexDigest(s: string): bool =
  s.len == 64 and s.allCharsInSet({'0'..'9', 'a'..'f'})

proc commitCall(c: Client, h: Held, commitId, sink, target, payloadSha256: string,
                publication: Option[Publication], timeoutMs: int,
                correlationId: string): Future[CommitResult] {.async.} =
  let why = opaqueIdProblem(commitId)
  if why.len > 0: raise invalid("commit_id", why)
  var body = %*{"lock_identity": h.lease.identity.toJson, "lease_id": h.lease.leaseId,
                "fencing_token": h.lease.fencingToken,
                "service_instance_id": h.serviceInstanceId, "sink": sink,
                "commit_id": commitId, "execution_id": h.executionId, "job_id": h.jobId}
  if h.traceId.len > 0: body["trace_id"] = %h.traceId
  if publication.isSome:
    let p = publication.get
    if p.routingKey.len == 0: raise invalid("outbox.routing_key", "is required")
    if p.body.len > MaxOutboxBody: raise invalid("outbox.body", "must be at most 64 KiB")
    body["outbox"] = p.toJson
  else:
    body["target"] = %target
    body["payload_sha256"] = %payloadSha256
  let cl = newCall(HttpPost, "/commits/authorize", body, true, commitId,
                   {scInspected}, timeoutMs, correlationId)
  let (n, _) = await c.perform(cl)
  let corr = n["correlation_id"].str
  try:
    let cm = n.getOrDefault("commit")
    if cm.isNil or cm.kind != JObject: raise malformedErr("a commit answer needs a commit")
    let commit = Commit(lockKey: cm.strField("lock_key"),
                        sink: cm.strField("sink"), commitId: cm.strField("commit_id"),
                        leaseId: cm.strField("lease_id"),
                        fencingToken: cm.intField("fencing_token"),
                        executionId: cm.strField("execution_id"), jobId: cm.strField("job_id"),
                        traceId: cm.strField("trace_id", required = false),
                        target: cm.strField("target"),
                        payloadSha256: cm.strField("payload_sha256"),
                        commitSeq: cm.intField("commit_seq"),
                        acceptedAt: cm.timeField("accepted_at"),
                        backendTime: cm.timeField("backend_time"))
    if commit.commitSeq < 1: raise malformedErr("commit_seq not positive")
    if not commit.payloadSha256.isHexDigest: raise malformedErr("payload_sha256 is not a digest")
    result = CommitResult(code: parseEnum[SuccessCode](n["code"].str), correlationId: corr,
                          replayed: n.boolField("replayed"), commit: commit)
  except MalformedError as e:
    raise malformed(cl, 200, corr, e.msg)
  # The answer must be the commit asked for. (For a publication the server
  # names the message id and the body's SHA-256, checked below.)
  let cm = result.commit
  let sameWrite =
    if publication.isSome: cm.target.startsWith("msg_")
    else: cm.target == target and cm.payloadSha256 == payloadSha256
  if cm.leaseId != h.lease.leaseId or cm.fencingToken != h.lease.fencingToken or
      cm.commitId != commitId or cmpIgnoreCase(cm.sink, sink) != 0 or cm.executionId != h.executionId or
      cm.jobId != h.jobId or not sameWrite:
    raise newStarleaseError(ecBackendUnavailable, 200,
      "the commit answer does not match the request", "", corr, false, 0, commitId)
  if publication.isSome and cm.payloadSha256 != sha256Hex(publication.get.body):
    # The server appended a message, but not provably this body: fail
    # closed. The same commit id resolves it (replay, or
    # idempotency_conflict if the server holds another body).
    raise newStarleaseError(ecOutcomeUnknown, 200,
      "the commit answer's payload_sha256 is not the SHA-256 of the body sent",
      "", corr, true, 0, commitId)

proc authorizeCommit*(c: Client, h: Held, commitId: string, publication: Publication,
                      sink = DefaultSink, timeoutMs = 0,
                      correlationId = ""): Future[CommitResult] {.async.} =
  ## Publishes under the fence (POST /commits/authorize with `outbox`): the
  ## server checks that h is still held and appends the message to its
  ## outbox in one atomic step; its relay then publishes it with the
  ## message id `result.commit.target` and the fence headers. commitId
  ## names this write: calling again with the same commit id and message is
  ## idempotent (the client does so itself while the outcome is unknown).
  ## Raises `LeaseLostError` when the lease is no longer held: the message
  ## is then never published.
  result = await c.commitCall(h, commitId, sink, "", "", some(publication),
                              timeoutMs, correlationId)

proc authorizeCommit*(c: Client, h: Held, commitId, sink, target, payloadSha256: string,
                      timeoutMs = 0, correlationId = ""): Future[CommitResult] {.async.} =
  ## Authorizes one write of the object target in sink whose content has
  ## the hex SHA-256 payloadSha256 (POST /commits/authorize). Raises
  ## `LeaseLostError` when the lease is no longer held.
  result = await c.commitCall(h, commitId, sink, target, payloadSha256,
                              none(Publication), timeoutMs, correlationId)

# ---------------------------------------------------------------------------
# Keeper

type
  LossCause* = enum
    ## Why a `Keeper` no longer holds its lease.
    lcNone = "none"                          ## still held
    lcExpired = "expired"                    ## its TTL ran out
    lcRevoked = "revoked"                    ## an administrator revoked it
    lcForceReleased = "force_released"       ## an administrator force-released it
    lcRejected = "rejected"                  ## the server refused a renewal of it
    lcBackendUnavailable = "backend_unavailable"
      ## no renewal got through before the safety margin
    lcReleased = "released"                  ## `close` released it

  Keeper* = ref object
    ## Keeps a held lease: renews it before it expires (at about a third of
    ## the grant, with jitter, never later than the local expiry estimate
    ## minus the safety margin) and, once it is lost, says why. Cancellation
    ## is advisory: stop the work when `lost` (or `whenLost` completes);
    ## the fence is what refuses a stale commit.
    client: Client
    held: Held
    marginMs: int
    stopping: bool
    lostFlag: bool
    causeVal: LossCause
    errorVal: ref StarleaseError
    lostFut: Future[LossCause]
    wake: Future[void]
    loop: Future[void]
    renewals: int
    rng: Rand
    onLost*: proc (k: Keeper) {.closure, gcsafe.}
      ## Called once when the lease is lost or released.

proc lost*(k: Keeper): bool =
  ## Whether the lease is no longer held (lost, or released by `close`).
  k.lostFlag

proc cause*(k: Keeper): LossCause =
  ## Why the lease is no longer held; `lcNone` while it is.
  k.causeVal

proc lossError*(k: Keeper): ref StarleaseError =
  ## The error that revealed the loss, if one did.
  k.errorVal

proc whenLost*(k: Keeper): Future[LossCause] =
  ## Completes with the cause once the lease is no longer held.
  k.lostFut

proc held*(k: Keeper): Held =
  ## The lease as last renewed, for commits under it.
  k.held

proc renewals*(k: Keeper): int =
  ## How many renewals succeeded.
  k.renewals

proc markLost(k: Keeper, cause: LossCause, err: ref StarleaseError = nil) =
  if k.lostFlag: return
  k.lostFlag = true
  k.causeVal = cause
  k.errorVal = err
  # A loss found by a write (not by a renewal) ends the renewal loop too.
  if not k.wake.isNil and not k.wake.finished: k.wake.complete()
  if not k.onLost.isNil:
    try:
      k.onLost(k)
    except CatchableError:
      discard
  k.lostFut.complete(cause)

proc classifyLoss(k: Keeper): Future[LossCause] {.async.} =
  ## After a `lease_lost`: the lease's state now tells revocation,
  ## force-release and expiry apart. A lease still active was lost to this
  ## holder only (its renewal was refused).
  try:
    let r = await k.client.get(k.held.lease.leaseId, timeoutMs = 5000)
    result = case r.lease.state
      of lsRevoked: lcRevoked
      of lsReleased: lcForceReleased
      of lsExpired: lcExpired
      of lsActive: lcRejected
  except StarleaseError:
    result = if getMonoTime() >= k.held.localExpiry: lcExpired else: lcRejected

proc msUntil(t: MonoTime): int =
  int((t - getMonoTime()).inMilliseconds)

proc nextRenewal(k: Keeper): MonoTime =
  ## A third of the grant after it was asked for, minus up to 15% jitter,
  ## and never after the local expiry estimate minus the margin.
  let grant = k.held.lease.expiresAt - k.held.lease.renewedAt
  let third = grant.inMilliseconds div 3
  let jittered = third - k.rng.rand(int(third * 15 div 100))
  let askedAt = k.held.localExpiry - initDuration(milliseconds = grant.inMilliseconds)
  min(askedAt + initDuration(milliseconds = jittered),
      k.held.localExpiry - initDuration(milliseconds = k.marginMs))

proc pause(k: Keeper, ms: int) {.async.} =
  ## Sleeps ms, or until `close`.
  if ms <= 0 or k.stopping: return
  k.wake = newFuture[void]("starlease.keeper.wake")
  await sleepAsync(ms) or k.wake

proc run(k: Keeper) {.async.} =
  var failures = 0
  var lastErr: ref StarleaseError
  var next = k.nextRenewal
  while not k.stopping and not k.lostFlag:
    await k.pause(msUntil(next))
    if k.stopping or k.lostFlag: break
    let untilMargin = msUntil(k.held.localExpiry) - k.marginMs
    if untilMargin <= 0 and failures > 0:
      k.markLost(lcBackendUnavailable, lastErr)
      break
    try:
      # Wait at most until the margin. A late wake-up (a blocked event
      # loop, or a replayed grant of unknown age) still gets one try: the
      # server says whether the lease is still held.
      let timeout = if untilMargin > 0: untilMargin else: max(k.marginMs div 2, 250)
      let res = await k.client.renew(k.held, timeoutMs = timeout)
      k.held = k.held.renewed(res)
      inc k.renewals
      failures = 0
      next = k.nextRenewal
    except LeaseLostError as e:
      k.markLost(await k.classifyLoss, e)
    except StarleaseError as e:
      case e.code
      of ecBackendUnavailable, ecOutcomeUnknown, ecRateLimited, ecDeadlineExceeded:
        inc failures
        lastErr = e
        let left = msUntil(k.held.localExpiry) - k.marginMs
        if left <= 0:
          k.markLost(lcBackendUnavailable, e)
        else:
          next = getMonoTime() + initDuration(milliseconds = min(backoffMs(failures, e.retryAfterMs), left))
      else:
        k.markLost(lcRejected, e)
    except CatchableError as e:
      # Not a failure the client classifies (it should not happen): the
      # loop must not die with the lease unaccounted for.
      k.markLost(lcRejected, newStarleaseError(ecBackendUnavailable,
        serverMsg = "keeper: " & e.msg.firstLine))

proc newKeeper*(c: Client, h: Held, marginMs = 0,
                onLost: proc (k: Keeper) {.closure, gcsafe.} = nil): Keeper =
  ## Starts keeping h on the running event loop. marginMs is how long
  ## before the local expiry estimate renewal attempts stop and the lease
  ## counts as lost (backend_unavailable); 0 is a quarter of the TTL, at
  ## least 100 ms.
  let margin = if marginMs > 0: marginMs else: max(int(h.lease.ttlMs div 4), 100)
  result = Keeper(client: c, held: h, marginMs: margin, onLost: onLost,
                  lostFut: newFuture[LossCause]("starlease.keeper.lost"),
                  rng: initRand(getMonoTime().ticks))
  result.loop = result.run()

proc close*(k: Keeper, timeoutMs = 0) {.async.} =
  ## Stops renewing and releases the lease if it is still held (cause
  ## `released`). A lease already lost stays lost with its cause. Raises
  ## `StarleaseError` when the release failed for another reason than the
  ## lease being lost: the lease then ends at its expiry.
  if k.stopping:
    await k.loop
    return
  k.stopping = true
  if not k.wake.isNil and not k.wake.finished: k.wake.complete()
  await k.loop
  if k.lostFlag: return
  try:
    discard await k.client.release(k.held, timeoutMs = timeoutMs)
    k.markLost(lcReleased)
  except LeaseLostError as e:
    k.markLost(await k.classifyLoss, e)
  except StarleaseError as e:
    k.markLost(lcBackendUnavailable, e)
    raise e

# ---------------------------------------------------------------------------
# Fenced CouchDB writes
#
# The write the Go writer (package couchdb) makes, step for step: a commit
# authorized for exactly this write (the document id and the SHA-256 of the
# body bytes), then a PUT conditioned on the revision read, carrying the
# commit's guard as the document's `starintel_fence`. The database's fence
# design document (`_design/starintel_fence`, Go's couchdb.ValidateDocUpdate)
# refuses, atomically with the write, a guard older than the stored one: a
# lower fencing token, another lease at the same token, an earlier commit of
# the same lease, a guard for another document or lock key.

const
  CouchSink* = "couchdb"
    ## The sink a CouchDB write is authorized under unless the caller names
    ## another (the Go writer's name).
  FenceField* = "starintel_fence"
    ## The member of every fenced document that holds its guard.
  FenceDesignDocId* = "_design/starintel_fence"
    ## The id of the fence design document.
  FenceSha256* = "27e3454a0f39d17fb9e645ad16e8c49392439a81921394ab979acb5ff76923ff"
    ## SHA-256 of the `validate_doc_update` source this client was written
    ## against (Go's couchdb.ValidateDocUpdate; a Go test keeps them equal).
  MaxDocumentBytes* = 4 shl 20
    ## Largest document written or read.
  MaxDocIdBytes* = 2048
    ## Largest document id, in bytes.
  TypedDocPrefixes* = ["target:", "result:", "schedule:", "job:"]
    ## Ids of the typed StarIntel documents: they are written only through
    ## their typed sinks (the Go package couchdb), which bind them to the
    ## lease's identity and job. `writeCouch` refuses them.
  lockKeyPrefix = "starintel:target-lease:v1:"
  fenceReasonPrefix = "starintel_fence: "
  laterCommitReason = "the document already holds this or a later commit of the lease"
  supersededReasons = ["fencing token is lower than the stored token",
                       "fencing token belongs to another lease"]
  fenceReasons = [
    "a fenced document cannot be deleted",
    "the write carries no fence",
    "the write carries no fence (lock key missing or malformed)",
    "the fencing token is out of range",
    "the fence is incomplete",
    "the fence has no accepted_at",
    "the stored fence is malformed",
    "the document belongs to a different lock key",
    "fencing token is lower than the stored token",
    "fencing token belongs to another lease",
    "the fence names no write or job",
    "the fence was authorized for another document",
    "the fence was issued for another job",
    "a typed document needs its exact type and id",
    "the document belongs to another lock identity",
    "the document id does not match its content",
    laterCommitReason]
    ## The refusals of the fence's validate_doc_update, after its prefix.
  goZeroInstant = "0001-01-01T00:00:00.000Z"
  base64UrlChars = {'A'..'Z', 'a'..'z', '0'..'9', '-', '_'}

type
  Guard* = object
    ## The guard of an accepted commit: what a fenced sink stores with the
    ## write (in CouchDB the document's `starintel_fence`), the JSON form
    ## of Go's fence.Guard. `guard(commit)` builds it.
    lockKey*, leaseId*: string
    fencingToken*: int64
    executionId*, jobId*, traceId*: string
    sink*, commitId*: string
    target*: string          ## the document id
    payloadSha256*: string   ## hex SHA-256 of the body bytes
    commitSeq*: int64
    acceptedAt*: Time

  CouchDB* = ref object
    ## One fenced CouchDB database (Apache CouchDB or pouchdb-server).
    ## Credentials in its URL are sent as HTTP Basic authentication only:
    ## `$db` and every error leave them out. Each request uses its own
    ## connection, so writes may run concurrently on one event loop.
    origin: string        # scheme://host:port, without credentials
    name: string
    auth: string          # the Authorization header, "" for none
    fenceOk: bool         # checkFence found the current fence
    timeoutMs*: int       ## budget of each request

  CouchWrite* = object
    ## A fenced CouchDB write that holds.
    docId*: string
    rev*: string            ## the revision written ("" if its answer was cut short)
    guard*: Guard           ## the document's fence: this write's guard
    alreadyWritten*: bool
      ## the document already held exactly this write (a repeat after an
      ## unknown outcome): nothing was sent

  CouchReply = object
    ## One CouchDB exchange.
    status: int           # 0 when no status line arrived
    body: string
    failed: bool          # the exchange failed (before or after the status)
    sent: bool            # ... after the request may have reached CouchDB
    why: string
    couchError, reason: string

  Stored = object
    ## A document as CouchDB holds it.
    rev: string
    body: JsonNode        # without "_" members and the fence
    fence: Option[Guard]

proc newCommitId*(): string =
  ## A fresh commit id: "cmt-" and 26 random base32 characters. Keep it to
  ## repeat a write whose outcome is unknown.
  base32Id("cmt-")

proc guard*(c: Commit): Guard =
  ## The guard of commit c, exactly as the Go writer forms it.
  Guard(lockKey: c.lockKey, leaseId: c.leaseId, fencingToken: c.fencingToken,
        executionId: c.executionId, jobId: c.jobId, traceId: c.traceId, sink: c.sink,
        commitId: c.commitId, target: c.target, payloadSha256: c.payloadSha256,
        commitSeq: c.commitSeq, acceptedAt: c.acceptedAt)

proc toJson*(g: Guard): JsonNode =
  ## The JSON form of g, as Go encodes fence.Guard (empty `job_id`,
  ## `trace_id`, `target`, `payload_sha256` and a zero `commit_seq` are
  ## left out).
  result = %*{"lock_key": g.lockKey, "lease_id": g.leaseId,
              "fencing_token": g.fencingToken, "execution_id": g.executionId}
  if g.jobId.len > 0: result["job_id"] = %g.jobId
  if g.traceId.len > 0: result["trace_id"] = %g.traceId
  result["sink"] = %g.sink
  result["commit_id"] = %g.commitId
  if g.target.len > 0: result["target"] = %g.target
  if g.payloadSha256.len > 0: result["payload_sha256"] = %g.payloadSha256
  if g.commitSeq != 0: result["commit_seq"] = %g.commitSeq
  result["accepted_at"] = %formatTimestamp(g.acceptedAt)

proc isLockKey(k: string): bool =
  ## Go's lease.CheckLockKey: the prefix, then the unpadded base64url of 32
  ## bytes (43 characters, the last without padding bits).
  if not k.startsWith(lockKeyPrefix): return false
  let d = k[lockKeyPrefix.len .. ^1]
  d.len == 43 and d[0 ..< 42].allCharsInSet(base64UrlChars) and d[42] in "AEIMQUYcgkosw048"

proc problem(g: Guard): string =
  ## Why g is not a complete guard (Go's fence.Guard.Validate); "" if it is.
  if not isLockKey(g.lockKey):
    "the write carries no fence (lock key missing or malformed)"
  elif g.fencingToken < 1 or g.fencingToken > MaxFencingToken:
    "the write's fencing token is out of range"
  elif g.leaseId.len == 0 or g.executionId.len == 0 or g.sink.len == 0 or g.commitId.len == 0:
    "the write's fence is incomplete"
  elif g.acceptedAt == Time() or formatTimestamp(g.acceptedAt) == goZeroInstant:
    "the write's fence has no accepted_at"
  elif g.payloadSha256.len > 0 and not g.payloadSha256.isHexDigest:
    "the write's fence has a malformed payload digest"
  elif g.commitSeq < 0 or g.commitSeq > MaxFencingToken:
    "the write's fence has a commit seq out of range"
  else: ""

proc authorizes(g: Guard, target, payloadSha256: string): string =
  ## Why g was not issued for the write of target with payloadSha256 (Go's
  ## fence.Guard.Authorizes); "" if it was.
  if g.target.len == 0 or g.jobId.len == 0 or g.commitSeq < 1:
    "the write's fence names no write or job (issued before writes were bound)"
  elif g.target != target: "the guard was authorized for another write"
  elif g.payloadSha256 != payloadSha256: "the guard was authorized for another payload"
  else: ""

proc parseGuard(n: JsonNode): Guard =
  ## A stored fence, decoded as Go decodes fence.Guard: absent members are
  ## empty, members of the wrong type are malformed (MalformedError).
  if n.kind != JObject: raise malformedErr("the stored fence is malformed")
  try:
    result = Guard(lockKey: n.strField("lock_key", false), leaseId: n.strField("lease_id", false),
                   fencingToken: n.intField("fencing_token", false),
                   executionId: n.strField("execution_id", false),
                   jobId: n.strField("job_id", false), traceId: n.strField("trace_id", false),
                   sink: n.strField("sink", false), commitId: n.strField("commit_id", false),
                   target: n.strField("target", false),
                   payloadSha256: n.strField("payload_sha256", false),
                   commitSeq: n.intField("commit_seq", false))
    let at = n.strField("accepted_at", false)
    if at.len > 0: result.acceptedAt = parseTimestamp(at)
  except ValueError:   # MalformedError included
    raise malformedErr("the stored fence is malformed")
  if result.problem.len > 0: raise malformedErr("the stored fence is incomplete")

# Documents

proc typedIdProblem(id: string): string =
  ## Why id may not be written here: a typed document's id.
  for p in TypedDocPrefixes:
    if id.startsWith(p):
      return "a typed document (" & p & "…) is written through its typed sink"

proc docIdProblem(id: string): string =
  ## Why id is not a document id this client writes or reads (Go's
  ## couchdb.checkDocID): empty, too long, not UTF-8, a reserved "_" id, or
  ## with control characters.
  if id.len == 0: return "must not be empty"
  if id.len > MaxDocIdBytes: return "is too long"
  if validateUtf8(id) >= 0: return "must be valid UTF-8"
  if id.startsWith("_"): return "must not start with _"
  for ch in id:
    if ch < ' ' or ch == '\x7f': return "must not contain control characters"

proc finite(n: JsonNode): bool =
  ## Whether every number in n has a JSON form (no NaN, no infinity).
  case n.kind
  of JFloat: n.fnum.classify notin {fcNan, fcInf, fcNegInf}
  of JArray:
    for e in n.elems:
      if not e.finite: return false
    true
  of JObject:
    for _, v in n.pairs:
      if not v.finite: return false
    true
  else: true

proc encodeBody(body: JsonNode): string =
  ## The bytes body is written as and its digest is computed over: its
  ## compact JSON (`$body`; nil is `{}`). Raises `InvalidRequestError` for
  ## a body that is not a JSON object, holds "_" members or the fence
  ## member, has no JSON form, or is too large.
  if body.isNil: return "{}"
  if body.kind != JObject: raise invalid("body", "must be a JSON object")
  for k in body.keys:
    if k.startsWith("_") or k == FenceField:
      raise invalid("body", "must not hold _ members or " & FenceField)
  if not body.finite: raise invalid("body", "must not hold NaN or infinite numbers")
  result = $body
  if validateUtf8(result) >= 0: raise invalid("body", "must be valid UTF-8")
  if result.len > MaxDocumentBytes: raise invalid("body", "exceeds the document size limit")

proc sameJson(a, b: JsonNode): bool =
  ## Equality of JSON values as Go's encoding/json decodes them: numbers as
  ## float64 (CouchDB may answer 1.0 as 1), objects regardless of order.
  if a.kind in {JInt, JFloat} and b.kind in {JInt, JFloat}:
    return a.getFloat == b.getFloat
  if a.kind != b.kind: return false
  case a.kind
  of JObject:
    if a.len != b.len: return false
    for k, v in a.pairs:
      if not b.hasKey(k) or not sameJson(v, b[k]): return false
    true
  of JArray:
    if a.len != b.len: return false
    for i in 0 ..< a.len:
      if not sameJson(a[i], b[i]): return false
    true
  else: a == b

proc decodeStored(raw: string): Stored =
  ## Splits a stored document into revision, body and fence; raises
  ## MalformedError when it cannot be trusted (Go's couchdb.decodeStored).
  var n: JsonNode
  try:
    n = parseJson(raw)
  except CatchableError:
    raise malformedErr("the stored document is not a JSON object")
  if n.kind != JObject: raise malformedErr("the stored document is not a JSON object")
  let id = n.getOrDefault("_id")
  if id.isNil or id.kind != JString: raise malformedErr("the stored document has no _id")
  let rev = n.getOrDefault("_rev")
  if rev.isNil or rev.kind != JString: raise malformedErr("the stored document has no _rev")
  result = Stored(rev: rev.str, body: newJObject())
  let f = n.getOrDefault(FenceField)
  if not f.isNil and f.kind != JNull:
    result.fence = some(parseGuard(f))
  for k, v in n.pairs:
    if not k.startsWith("_") and k != FenceField: result.body[k] = v

# The CouchDB client

proc newCouchDB*(dbUrl: string, timeoutMs = DefaultTimeoutMs): CouchDB =
  ## The database at dbUrl, "http(s)://[user:password@]host[:port]/database"
  ## (the database name percent-encoded if it needs it). Credentials are
  ## sent as HTTP Basic authentication. Raises `ValueError` (without the
  ## credentials) for an unusable URL. Does not contact the server.
  let u = parseUri(dbUrl)
  const shape = "starlease: the CouchDB URL must be http(s)://[user:password@]host[:port]/database"
  if u.scheme notin ["http", "https"] or u.hostname.len == 0:
    raise newException(ValueError, shape)
  if u.query.len > 0 or u.anchor.len > 0:
    raise newException(ValueError, "starlease: the CouchDB URL must not carry a query or fragment")
  let raw = u.path.strip(chars = {'/'})
  if raw.len == 0 or '/' in raw:
    raise newException(ValueError, shape)
  let name = decodeUrl(raw, decodePlus = false)
  if name.len > 238 or name[0] notin {'a'..'z'} or
      not name.allCharsInSet({'a'..'z', '0'..'9', '_', '$', '(', ')', '+', '-', '/'}):
    raise newException(ValueError, "starlease: the database name does not follow CouchDB's rule")
  let port = if u.port.len > 0: u.port elif u.scheme == "https": "443" else: "80"
  let host = if ':' in u.hostname: "[" & u.hostname & "]" else: u.hostname   # IPv6
  result = CouchDB(origin: u.scheme & "://" & host & ":" & port, name: name,
                   timeoutMs: timeoutMs)
  if u.username.len > 0 or u.password.len > 0:
    result.auth = "Basic " & encode(decodeUrl(u.username, decodePlus = false) & ":" &
                                    decodeUrl(u.password, decodePlus = false))

proc `$`*(db: CouchDB): string =
  ## Describes the database without its credentials.
  if db.isNil: "couchdb <nil>"
  else: "couchdb " & db.origin & "/" & db.name &
        (if db.auth.len > 0: " (credentials [redacted])" else: "")

proc name*(db: CouchDB): string =
  ## The database name.
  db.name

proc docPath(db: CouchDB, id: string): string =
  ## The path of a document; a design document keeps its "_design/"
  ## segment unescaped, as CouchDB expects.
  result = "/" & encodeUrl(db.name, usePlus = false) & "/"
  if id.startsWith("_design/"):
    result.add "_design/" & encodeUrl(id["_design/".len .. ^1], usePlus = false)
  else:
    result.add encodeUrl(id, usePlus = false)

proc couchExchange(http: AsyncHttpClient, url: string, meth: HttpMethod, body: string,
                   headers: HttpHeaders, r: ref CouchReply) {.async.} =
  ## One exchange into r; never fails. r.status is set as soon as the
  ## status line arrives, so a caller that gives up waiting still sees it.
  try:
    let resp = await http.request(url, meth, body, headers)
    r.status = resp.code.int
    r.body = await resp.body
    if r.body.len > MaxDocumentBytes:
      r.failed = true
      r.sent = true
      r.why = "the answer exceeds the document size limit"
  except CatchableError as e:
    r.failed = true
    r.sent = r.status != 0 or not refusedBeforeSending(e)
    r.why = e.msg.firstLine

proc couchRequest(db: CouchDB, meth: HttpMethod, path: string, body = ""): Future[CouchReply] {.async.} =
  ## Sends one request on a new connection and waits at most the
  ## database's timeout. Credentials travel only in the header.
  var headers = newHttpHeaders({"Accept": "application/json"})
  if body.len > 0:
    # pouchdb-server stores an empty document when a PUT has no JSON
    # content type.
    headers["Content-Type"] = "application/json"
  if db.auth.len > 0: headers["Authorization"] = db.auth
  let http = newAsyncHttpClient(userAgent = "starlease-nim/1", maxRedirects = 0)
  let r = new CouchReply
  let fut = couchExchange(http, db.origin & path, meth, body, headers, r)
  if await withTimeout(fut, max(db.timeoutMs, 1)):
    result = r[]
  else:
    # Copied: the abandoned exchange keeps writing to r.
    result = CouchReply(status: r.status, failed: true, sent: true,
                        why: "no answer within " & $db.timeoutMs & " ms")
  http.close()
  if result.status >= 400 and not result.failed:
    try:
      let n = parseJson(result.body)
      if n.kind == JObject:
        result.couchError = n.strField("error", required = false)
        result.reason = n.strField("reason", required = false)
    except CatchableError:
      discard

proc couchErr(code: ErrorCode, op, docId, why: string, status = 0,
              requestId = "", field = ""): ref StarleaseError =
  ## A failure of a CouchDB operation, with CouchDB's status.
  var m = "couchdb " & op
  if docId.len > 0: m.add " " & docId.escape
  m.add ": " & why
  newStarleaseError(code, status, m, field, "",
                    code in {ecConflict, ecBackendUnavailable, ecOutcomeUnknown}, 0, requestId)

proc fenceMissing(why: string): ref StarleaseError =
  let e = (ref FenceMissingError)()
  e.fill(ecBackendUnavailable, 0, "couchdb check_fence " & FenceDesignDocId.escape & ": " & why,
         "", "", true, 0, "")
  e

proc statusError(op, docId: string, r: CouchReply, commitId = ""): ref StarleaseError =
  ## The typed error of a CouchDB answer that is not a success: Go's
  ## couchdb.statusError.
  let s = r.status
  if s == 403 and r.reason.startsWith(fenceReasonPrefix):
    let reason = r.reason[fenceReasonPrefix.len .. ^1]
    if reason == laterCommitReason:
      # Not a loss: a later commit of the same lease holds the document.
      couchErr(ecConflict, op, docId, reason, s, commitId)
    elif reason notin fenceReasons:
      couchErr(ecCommitRejected, op, docId, "the fence refused the write", s, commitId)
    else:
      let e = couchErr(ecCommitRejected, op, docId, reason, s, commitId)
      (ref CommitRejectedError)(e).superseded = reason in supersededReasons
      e
  elif s == 401 or s == 403:
    couchErr(ecAccessDenied, op, docId, "couchdb refused the credentials or the operation", s, commitId)
  elif s == 409:
    couchErr(ecConflict, op, docId,
             "document revision conflict: another write changed it since it was read", s, commitId)
  elif s == 404:
    couchErr(ecNotFound, op, docId, "not found", s, commitId)
  elif s in [400, 413, 415]:
    couchErr(ecInvalidRequest, op, docId, "couchdb refused the request as malformed", s, commitId)
  elif s >= 500:
    couchErr(ecOutcomeUnknown, op, docId, "couchdb answered with a server error", s, commitId)
  else:
    couchErr(ecBackendUnavailable, op, docId, "unexpected HTTP status " & $s, s, commitId)

proc readFailure(op, docId: string, r: CouchReply): ref StarleaseError =
  ## The typed failure of a read: nothing was written, so a server error
  ## is unavailability, not an unknown outcome.
  if r.failed:
    return couchErr(ecBackendUnavailable, op, docId,
                    "couchdb could not be reached (" & r.why & ")", r.status)
  result = statusError(op, docId, r)
  if result.code == ecOutcomeUnknown:
    result = couchErr(ecBackendUnavailable, op, docId, "couchdb answered with a server error", r.status)

proc checkFence*(db: CouchDB) {.async.} =
  ## Raises `FenceMissingError` unless the database holds exactly the fence
  ## this client knows (the SHA-256 of its `validate_doc_update` is
  ## `FenceSha256`, its language JavaScript). `writeCouch` calls it before
  ## its first write, and again after a refusal that is not the fence's.
  let r = await db.couchRequest(HttpGet, db.docPath(FenceDesignDocId))
  if r.failed or r.status notin [200, 404]:
    raise readFailure("check_fence", FenceDesignDocId, r)
  if r.status == 404:
    db.fenceOk = false
    if r.reason in ["no_db_file", "Database does not exist."]:
      raise fenceMissing("the database does not exist")
    raise fenceMissing("the fence design document is not installed; install it (Go: couchdb InstallFence)")
  var src, lang: string
  try:
    let n = parseJson(r.body)
    if n.kind != JObject: raise malformedErr("not an object")
    src = n.strField("validate_doc_update", required = false)
    lang = n.strField("language", required = false)
  except CatchableError:
    raise couchErr(ecCorrupt, "check_fence", FenceDesignDocId, "the design document is not JSON", r.status)
  if sha256Hex(src) != FenceSha256 or lang notin ["", "javascript"]:
    db.fenceOk = false
    raise fenceMissing("the database holds another fence than this client's; install the current one")
  db.fenceOk = true

proc getStored(db: CouchDB, op, id: string): Future[Option[Stored]] {.async.} =
  ## The document id as stored; none when it does not exist.
  let r = await db.couchRequest(HttpGet, db.docPath(id))
  if not r.failed and r.status == 404 and r.reason notin ["no_db_file", "Database does not exist."]:
    return none(Stored)
  if r.failed or r.status != 200:
    raise readFailure(op, id, r)
  try:
    result = some(decodeStored(r.body))
  except MalformedError as e:
    raise couchErr(ecCorrupt, op, id, e.msg, r.status)

proc getDoc*(db: CouchDB, docId: string): Future[Option[JsonNode]] {.async.} =
  ## The document docId as stored (with `_id`, `_rev` and its fence), or
  ## none when it does not exist. Raises `StarleaseError` (`LeaseNotFoundError`
  ## when the database does not exist).
  let why = docIdProblem(docId)
  if why.len > 0: raise invalid("doc_id", why)
  let r = await db.couchRequest(HttpGet, db.docPath(docId))
  if not r.failed and r.status == 404 and r.reason notin ["no_db_file", "Database does not exist."]:
    return none(JsonNode)
  if r.failed or r.status != 200:
    raise readFailure("get", docId, r)
  try:
    let n = parseJson(r.body)
    if n.kind != JObject: raise malformedErr("not an object")
    result = some(n)
  except CatchableError:
    raise couchErr(ecCorrupt, "get", docId, "the stored document is not a JSON object", r.status)

proc putFenced*(db: CouchDB, g: Guard, sink, docId: string,
                body: JsonNode): Future[CouchWrite] {.async.} =
  ## Writes body as document docId conditioned on g, the guard of a commit
  ## authorized for sink and exactly this write (Go's couchdb Writer.Commit):
  ##
  ## 1. g must be complete, for sink, and for this document id and the
  ##    SHA-256 of `$body`; else `CommitRejectedError`, nothing sent;
  ## 2. the database must hold the current fence (`checkFence`, once);
  ## 3. the document is read; if it already carries exactly g and the same
  ##    body, the write happened (a repeat after an unknown outcome):
  ##    success with `alreadyWritten`, nothing sent; g with another body is
  ##    `IdempotencyConflictError`;
  ## 4. it is PUT with the revision read, body's members and g as its
  ##    `starintel_fence`.
  ##
  ## CouchDB's answers map as Go's couchdb.statusError does: the fence's
  ## 403 is `CommitRejectedError` (a lease's own later commit holding the
  ## document is `LeaseConflictError`), another 401/403
  ## `AccessDeniedError`, 409 `LeaseConflictError`, 404
  ## `BackendUnavailableError` (the database is missing), 400/413/415
  ## `InvalidRequestError`, 5xx and no answer after sending
  ## `OutcomeUnknownError` (repeat with the same commit id). It never
  ## retries a write. `writeCouch` authorizes and calls this.
  const op = "commit"
  let typed = typedIdProblem(docId)
  if typed.len > 0: raise invalid("doc_id", typed)
  let bad = g.problem
  if bad.len > 0: raise couchErr(ecCommitRejected, op, docId, bad)
  if g.sink != sink:
    raise couchErr(ecCommitRejected, op, docId, "the guard was authorized for another sink")
  let idWhy = docIdProblem(docId)
  if idWhy.len > 0: raise invalid("doc_id", idWhy)
  let text = encodeBody(body)
  let unbound = g.authorizes(docId, sha256Hex(text))
  if unbound.len > 0: raise couchErr(ecCommitRejected, op, docId, unbound)
  if not db.fenceOk:
    await db.checkFence()

  let fields = if body.isNil: newJObject() else: body
  let cur = await db.getStored(op, docId)
  if cur.isSome and cur.get.fence.isSome and cur.get.fence.get == g:
    if sameJson(cur.get.body, fields):
      return CouchWrite(docId: docId, rev: cur.get.rev, guard: g, alreadyWritten: true)
    raise newStarleaseError(ecIdempotencyConflict, 0,
      "couchdb commit " & docId.escape & ": the commit id was already used for another body",
      "", "", false, 0, g.commitId)

  var doc = newJObject()
  for k, v in fields.pairs: doc[k] = v
  doc["_id"] = %docId
  if cur.isSome: doc["_rev"] = %cur.get.rev
  doc[FenceField] = g.toJson
  let encoded = $doc
  if encoded.len > MaxDocumentBytes:
    raise invalid("body", "the document exceeds the size limit")

  let r = await db.couchRequest(HttpPut, db.docPath(docId), encoded)
  if r.status in [201, 202]:
    # Accepted; a cut-short answer only loses the revision.
    var rev = ""
    if not r.failed:
      try:
        rev = parseJson(r.body).strField("rev", required = false)
      except CatchableError:
        discard
    db.fenceOk = true
    return CouchWrite(docId: docId, rev: rev, guard: g)
  if r.failed and r.status == 0:
    if r.sent:
      raise couchErr(ecOutcomeUnknown, op, docId, "the write was sent and no answer came (" & r.why &
                     "); repeat it with the same commit id", 0, g.commitId)
    raise couchErr(ecBackendUnavailable, op, docId,
                   "couchdb could not be reached (" & r.why & "); nothing was written")
  if r.status == 404:
    # A PUT answers 404 only when the database is missing.
    raise couchErr(ecBackendUnavailable, op, docId, "the database does not exist; nothing was written", 404)
  if r.status == 403 and not r.reason.startsWith(fenceReasonPrefix):
    db.fenceOk = false   # check the fence again before the next write
  raise statusError(op, docId, r, g.commitId)

proc writeCouch*(c: Client, h: Held, db: CouchDB, docId: string, body: JsonNode,
                 commitId = "", sink = CouchSink, timeoutMs = 0,
                 correlationId = ""): Future[CouchWrite] {.async.} =
  ## The fenced CouchDB write of body (a JSON object without "_" members or
  ## `starintel_fence`, written as `$body`) as document docId under the
  ## held lease h: a commit authorized for exactly this write (target
  ## docId, `payload_sha256` the SHA-256 of `$body`), then `putFenced`.
  ## The ids of typed documents (`TypedDocPrefixes`) and malformed ids or
  ## bodies are refused before anything is sent (`InvalidRequestError`).
  ##
  ## commitId names the write ("" is a fresh one, `newCommitId`): after
  ## `OutcomeUnknownError` call again with the same commit id (its
  ## `requestId`) and body; the repeat finds the write done and answers
  ## `alreadyWritten`. Raises `LeaseLostError` when the server refuses the
  ## authorization, `CommitRejectedError` when the database's fence refuses
  ## the write (a newer lease wrote the document), `FenceMissingError`
  ## when the database has no current fence. Through a `Keeper`
  ## (`writeCouch(keeper, …)`) both refusals mark the lease lost.
  let typed = typedIdProblem(docId)
  if typed.len > 0: raise invalid("doc_id", typed)
  let idWhy = docIdProblem(docId)
  if idWhy.len > 0: raise invalid("doc_id", idWhy)
  if opaqueIdProblem(sink).len > 0 or sink != sink.toLowerAscii:
    raise invalid("sink", "must be a canonical (lower-case) identifier")
  let text = encodeBody(body)
  let cid = if commitId.len > 0: commitId else: newCommitId()
  let cr = await c.authorizeCommit(h, cid, sink, docId, sha256Hex(text), timeoutMs, correlationId)
  result = await db.putFenced(cr.commit.guard, sink, docId, body)

proc writeCouch*(k: Keeper, db: CouchDB, docId: string, body: JsonNode,
                 commitId = "", sink = CouchSink, timeoutMs = 0,
                 correlationId = ""): Future[CouchWrite] {.async.} =
  ## `writeCouch` under the keeper's lease. Refused (`LeaseLostError`,
  ## nothing sent) once the keeper no longer holds it. A refusal by the
  ## server (`LeaseLostError`) or a fence refusal that says a successor holds
  ## the document (`CommitRejectedError.superseded`, cause `lcRejected`)
  ## marks the lease lost; a refusal of the write itself does not.
  if k.lostFlag:
    raise newStarleaseError(ecLost, 0, "the lease is no longer held (" & $k.causeVal &
                            "); nothing was written")
  try:
    result = await k.client.writeCouch(k.held, db, docId, body, commitId, sink,
                                       timeoutMs, correlationId)
  except CommitRejectedError as e:
    if e.superseded:
      k.markLost(lcRejected, e)
    raise e
  except LeaseLostError as e:
    k.markLost(await k.classifyLoss, e)
    raise e
