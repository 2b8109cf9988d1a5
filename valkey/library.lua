#!lua name=__LIBRARY__
--[[
starlease lease-store function library, record version 1.

Every lease transition is one function, so one atomic section at one
backend time. The Go side validates and normalizes every input
(lease.Prepare*) and passes all keys in KEYS; these functions decide and
write. Inside each mutation the order is fixed: backend time (TIME), the
deadline check, the idempotency lookup, then the strict reading of the
active record, then the decision, and only then writes. Every check that
can fail runs before the first write, so a refused operation changes
nothing (a quarantine marker aside).

Replies are arrays of strings: { status, backend_time_ms, ... }.

Records are built here byte-for-byte as Go's lease.Record.Encode builds
them (version 1, JSON) or, in a namespace of format 3 (and in the replies
to endings of format 2), as lease.CompactRecord does (version 2, lines;
encode_rv2), or, for a lease acquired in format 4, as
lease.EmbeddingRecord does (version 3: version 2 with its acquisition's
evidence; encode_rv3), or, in format 6, as lease.LeanRecord does (version
4: version 3 without what its key and its own lines say; encode_rv4). A
stored record
of either version is accepted only if it re-encodes to exactly its own
bytes, which makes the reader as strict as the writer: unknown or missing
fields, other field orders, non-canonical numbers or timestamps, escapes in
identifiers, trailing data all fail closed as corrupt.
]]

local MAX_TOKEN = 9007199254740991 -- 2^53-1
local MAX_TTL_MS = 86400000 -- lease.MaxTTL
local MAX_LIFETIME_MS = 604800000 -- lease.MaxLifetime

-- __FN__ is replaced by the Go side with the content-addressed function
-- name prefix, so builds with different code never share a name.
local FN = '__FN__'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Memo of ts and parse_ts (below), shared by the calls of this library
-- (both are pure functions, so a cached answer is the answer). TS_OF maps ms to its
-- text; MS_OF maps a text to its ms, or false for a text parse_ts refuses.
-- An entry enters MS_OF only as parse_ts's own result or, from ts, for an
-- integral ms in [0, year 10000): there ts's text has a 4-digit year >= 1970
-- and every field in range, and Hinnant's conversions are exact inverses,
-- so parse_ts of that text returns exactly ms. The memo is bounded: it is
-- dropped whole when it grows past MEMO_MAX entries.
local MEMO_MAX = 4096
local MS_MAX = 253402300800000 -- 10000-01-01T00:00:00.000Z
-- ID_OK, PLAIN_OK and META_OK memoize is_id, plain and meta_ok below the
-- same way, INT_OF int, B64_OF and HEX_OF hex_b64 and b64_hex (each call
-- of either fills both: a record's decoding checks its digest by encoding
-- it again).
local TS_OF, MS_OF, ID_OK, PLAIN_OK, META_OK, INT_OF, memo_n = {}, {}, {}, {}, {}, {}, 0
local B64_OF, HEX_OF = {}, {}

local function memo_room()
  memo_n = memo_n + 1
  if memo_n > MEMO_MAX then
    TS_OF, MS_OF, ID_OK, PLAIN_OK, META_OK, INT_OF, memo_n = {}, {}, {}, {}, {}, {}, 1
    B64_OF, HEX_OF = {}, {}
  end
end

local function int(n)
  local v = INT_OF[n]
  if v then return v end
  v = string.format('%.0f', n)
  -- NaN cannot be a table key; 0 and -0 are one key but two texts.
  if n ~= n or n == 0 then return v end
  memo_room()
  INT_OF[n] = v
  return v
end

-- Civil-date conversions (H. Hinnant's algorithms), exact on doubles for
-- every millisecond instant a record can hold.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- ts formats ms since the epoch as "2006-01-02T15:04:05.000Z". The date
-- part of the last day formatted is kept (new times are nearly always on
-- the current day), so a new ms costs one short format.
local DAY, DAY_TEXT = nil, nil
local function ts_slow(ms)
  local days = math.floor(ms / 86400000)
  local rem = ms - days * 86400000
  if days ~= DAY then
    local y, m, d = civil_from_days(days)
    DAY, DAY_TEXT = days, string.format('%04d-%02d-%02dT', y, m, d)
  end
  local h = math.floor(rem / 3600000)
  rem = rem - h * 3600000
  local mi = math.floor(rem / 60000)
  rem = rem - mi * 60000
  local s = math.floor(rem / 1000)
  return DAY_TEXT .. string.format('%02d:%02d:%02d.%03dZ', h, mi, s, rem - s * 1000)
end

local function ts(ms)
  local v = TS_OF[ms]
  if v then return v end
  v = ts_slow(ms)
  if ms ~= ms then return v end -- NaN cannot be a table key
  memo_room()
  TS_OF[ms] = v
  if ms >= 0 and ms < MS_MAX and ms == math.floor(ms) then MS_OF[v] = ms end
  return v
end

-- parse_ts is ts's inverse; anything that does not round-trip is nil.
local function parse_ts_slow(v)
  local y, mo, d, h, mi, s, ml = string.match(v, '^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):(%d%d)%.(%d%d%d)Z$')
  if not y then return nil end
  y, mo, d, h, mi, s, ml = tonumber(y), tonumber(mo), tonumber(d), tonumber(h), tonumber(mi), tonumber(s), tonumber(ml)
  if y < 1 or mo < 1 or mo > 12 or d < 1 or d > 31 or h > 23 or mi > 59 or s > 59 then return nil end
  local ms = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60000 + s * 1000 + ml
  if ts(ms) ~= v then return nil end
  return ms
end

local function parse_ts(v)
  if type(v) ~= 'string' then return nil end
  local ms = MS_OF[v]
  if ms ~= nil then return ms or nil end
  ms = parse_ts_slow(v)
  memo_room()
  MS_OF[v] = ms or false
  return ms
end

-- Record v1 fields in lease.Record's declaration (and so JSON) order;
-- metadata and state follow.
local STR, ID, OPT, INT, TS = 1, 2, 3, 4, 5
local FIELDS = {
  { 'record_version', INT }, { 'lock_key', STR },
  { 'tenant_id', STR }, { 'program_id', STR }, { 'target_namespace', STR }, { 'target_id', STR },
  { 'actor_name', STR }, { 'workflow_name', STR }, { 'operation_class', STR },
  { 'lease_id', ID }, { 'owner_principal_id', ID }, { 'owner_client_id', ID }, { 'owner_credential_id', ID },
  { 'service_instance_id', ID }, { 'fencing_token', INT },
  { 'acquired_at', TS }, { 'renewed_at', TS }, { 'expires_at', TS },
  { 'ttl_ms', INT }, { 'maximum_lifetime_ms', INT },
  { 'execution_id', ID }, { 'job_id', ID }, { 'trace_id', OPT }, { 'request_id', ID },
}
-- KIND_NAMES lists FIELDS' names by kind, in FIELDS order (for written).
local KIND_NAMES = { [STR] = {}, [ID] = {}, [OPT] = {}, [INT] = {}, [TS] = {} }
for i = 1, #FIELDS do
  local names = KIND_NAMES[FIELDS[i][2]]
  names[#names + 1] = FIELDS[i][1]
end
local STATES = { active = true, expired = true, released = true, revoked = true }
-- STATE_TAIL maps ',"state":"<state>"}' to { state, its length };
-- TAIL_LENS lists those lengths once each.
local STATE_TAIL, TAIL_LENS = {}, {}
local STATE_NAMES = { 'active', 'expired', 'released', 'revoked' }
for i = 1, #STATE_NAMES do -- (no globals, so no pairs, at load time)
  local st = STATE_NAMES[i]
  local sfx = ',"state":"' .. st .. '"}'
  STATE_TAIL[sfx] = { st, #sfx }
  TAIL_LENS[#sfx] = true
end

-- encode builds record JSON from r (with state instead of r's if given):
-- strings are already known to need no escaping, timestamps are ms,
-- metadata is raw JSON. It writes FIELDS in order, spelled out as one
-- concatenation (one string build instead of a part per field).
local function encode(r, state)
  return '{"record_version":' .. int(r.record_version)
    .. ',"lock_key":"' .. r.lock_key
    .. '","tenant_id":"' .. r.tenant_id
    .. '","program_id":"' .. r.program_id
    .. '","target_namespace":"' .. r.target_namespace
    .. '","target_id":"' .. r.target_id
    .. '","actor_name":"' .. r.actor_name
    .. '","workflow_name":"' .. r.workflow_name
    .. '","operation_class":"' .. r.operation_class
    .. '","lease_id":"' .. r.lease_id
    .. '","owner_principal_id":"' .. r.owner_principal_id
    .. '","owner_client_id":"' .. r.owner_client_id
    .. '","owner_credential_id":"' .. r.owner_credential_id
    .. '","service_instance_id":"' .. r.service_instance_id
    .. '","fencing_token":' .. int(r.fencing_token)
    .. ',"acquired_at":"' .. ts(r.acquired_at)
    .. '","renewed_at":"' .. ts(r.renewed_at)
    .. '","expires_at":"' .. ts(r.expires_at)
    .. '","ttl_ms":' .. int(r.ttl_ms)
    .. ',"maximum_lifetime_ms":' .. int(r.maximum_lifetime_ms)
    .. ',"execution_id":"' .. r.execution_id
    .. '","job_id":"' .. r.job_id
    .. '","trace_id":"' .. r.trace_id
    .. '","request_id":"' .. r.request_id
    .. '","metadata":' .. r.metadata
    .. ',"state":"' .. (state or r.state) .. '"}'
end

-- LOCK_PREFIX is lease.KeyPrefix: a lock key is it and the hash tag.
local LOCK_PREFIX = 'starintel:target-lease:v1:'

-- encode_rv2 builds record version 2 (lease.CompactRecord's bytes) from
-- r (with state instead of r's if given), whose lock key is LOCK_PREFIX
-- and tag: the tag, the tuple and the facts one per line, in the order a
-- version 2 history entry holds them after its ending lines, metadata
-- last. About half of encode's bytes.
local function encode_rv2(r, tag, state, head)
  return (head or 'rv2\n') .. tag .. '\n' .. r.tenant_id .. '\n' .. r.program_id .. '\n' .. r.target_namespace
    .. '\n' .. r.target_id .. '\n' .. r.actor_name .. '\n' .. r.workflow_name .. '\n' .. r.operation_class
    .. '\n' .. r.lease_id .. '\n' .. r.owner_principal_id .. '\n' .. r.owner_client_id
    .. '\n' .. r.owner_credential_id .. '\n' .. r.service_instance_id .. '\n' .. int(r.fencing_token)
    .. '\n' .. int(r.acquired_at) .. '\n' .. int(r.renewed_at) .. '\n' .. int(r.expires_at)
    .. '\n' .. int(r.ttl_ms) .. '\n' .. int(r.maximum_lifetime_ms) .. '\n' .. r.execution_id
    .. '\n' .. r.job_id .. '\n' .. r.trace_id .. '\n' .. r.request_id .. '\n' .. (state or r.state) .. '\n' .. r.metadata
end

-- encode_rv3 builds record version 3 (lease.EmbeddingRecord's bytes, stored
-- format 4) from r, an active record carrying its acquisition's evidence
-- (idem_digest, idem_scope, idem_ttl: the acquire's ttl_ms): rv3, the
-- digest, the scope, the acquisition's ttl_ms ('' while it is r's own),
-- then version 2 from the tag on (one concatenation, through head).
local function encode_rv3(r, tag)
  local ttl = ''
  if r.idem_ttl ~= r.ttl_ms then ttl = int(r.idem_ttl) end
  return encode_rv2(r, tag, nil, 'rv3\n' .. r.idem_digest .. '\n' .. r.idem_scope .. '\n' .. ttl .. '\n')
end

-- B64 is base64url's alphabet; B64_BYTE[v] the byte of value v, B64_VAL[b]
-- the value of byte b, filled at first use (a library's loading code
-- cannot call string functions).
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
local B64_BYTE, B64_VAL = {}, nil
local function b64_tables()
  B64_VAL = {}
  for i = 1, 64 do
    B64_BYTE[i - 1] = string.byte(B64, i)
    B64_VAL[string.byte(B64, i)] = i - 1
  end
end

-- hex_b64 is a digest's 64 lowercase hex digits in base64url without
-- padding (43 characters): ten groups of 24 bits, then the last 16 bits
-- and two zero bits; nil for anything else (a writer's concatenation then
-- fails the call: nothing is written).
local function hex_b64(h)
  local known = B64_OF[h]
  if known then return known end
  -- Only a digest as Go writes it (the memo maps both ways, so another
  -- spelling would come back out of b64_hex).
  if #h ~= 64 or string.find(h, '[^0-9a-f]') then return nil end
  if not B64_VAL then b64_tables() end
  local out = {}
  for i = 1, 55, 6 do
    local n = tonumber(string.sub(h, i, i + 5), 16)
    out[#out + 1] = string.char(B64_BYTE[math.floor(n / 262144)], B64_BYTE[math.floor(n / 4096) % 64],
      B64_BYTE[math.floor(n / 64) % 64], B64_BYTE[n % 64])
  end
  local n = tonumber(string.sub(h, 61, 64), 16) * 4
  out[#out + 1] = string.char(B64_BYTE[math.floor(n / 4096)], B64_BYTE[math.floor(n / 64) % 64], B64_BYTE[n % 64])
  local d = table.concat(out)
  memo_room()
  B64_OF[h], HEX_OF[d] = d, h
  return d
end

-- b64_hex is hex_b64's inverse: nil unless d is 43 base64url characters
-- whose last two bits are zero (one spelling per digest).
local function b64_hex(d)
  local known = HEX_OF[d]
  if known then return known end
  if #d ~= 43 then return nil end
  if not B64_VAL then b64_tables() end
  local out = {}
  for i = 1, 37, 4 do
    local a, b, c, e = string.byte(d, i, i + 3)
    a, b, c, e = B64_VAL[a], B64_VAL[b], B64_VAL[c], B64_VAL[e]
    if not (a and b and c and e) then return nil end
    out[#out + 1] = string.format('%06x', ((a * 64 + b) * 64 + c) * 64 + e)
  end
  local a, b, c = string.byte(d, 41, 43)
  a, b, c = B64_VAL[a], B64_VAL[b], B64_VAL[c]
  if not (a and b and c) or c % 4 ~= 0 then return nil end
  out[#out + 1] = string.format('%04x', ((a * 64 + b) * 64 + c) / 4)
  local h = table.concat(out)
  memo_room()
  B64_OF[h], HEX_OF[d] = d, h
  return h
end

local LEASE_PREFIX = 'lease_' -- lease.LeaseIDPrefix

-- rv4_ok reports whether r has a version 4 form: its lease id starts with
-- LEASE_PREFIX (else it is stored in version 3).
local function rv4_ok(r) return string.sub(r.lease_id, 1, #LEASE_PREFIX) == LEASE_PREFIX end

-- encode_rv4 builds record version 4 (lease.LeanRecord's bytes, stored
-- format 6) from r, an active record carrying its acquisition's evidence
-- that rv4_ok: version 3 without the state (active), the digest in
-- base64url, the lease id without LEASE_PREFIX, renewed_at '' when it is
-- acquired_at (else ms after it), expires_at '' when it is the expiry
-- acquire and renew give, min(renewed_at + ttl_ms, acquired_at +
-- maximum_lifetime_ms) (else ms after acquired_at), metadata '' when it is
-- {}. It keeps the whole tag: reads without a tuple to compare (the
-- reaper, inspect by id) refuse by it a record copied under another
-- identity's key, and tags are unkeyed hashes of caller-chosen tuples. One
-- concatenation.
local function encode_rv4(r, tag)
  local id = string.sub(r.lease_id, #LEASE_PREFIX + 1)
  local ttl, renewed, expires = '', '', ''
  if r.idem_ttl ~= r.ttl_ms then ttl = int(r.idem_ttl) end
  if r.renewed_at ~= r.acquired_at then renewed = int(r.renewed_at - r.acquired_at) end
  if r.expires_at ~= math.min(r.renewed_at + r.ttl_ms, r.acquired_at + r.maximum_lifetime_ms) then
    expires = int(r.expires_at - r.acquired_at)
  end
  local meta = r.metadata
  if meta == '{}' then meta = '' end
  return 'rv4\n' .. tag .. '\n' .. hex_b64(r.idem_digest) .. '\n' .. r.idem_scope .. '\n' .. ttl
    .. '\n' .. r.tenant_id
    .. '\n' .. r.program_id .. '\n' .. r.target_namespace .. '\n' .. r.target_id .. '\n' .. r.actor_name
    .. '\n' .. r.workflow_name .. '\n' .. r.operation_class .. '\n' .. id
    .. '\n' .. r.owner_principal_id .. '\n' .. r.owner_client_id .. '\n' .. r.owner_credential_id
    .. '\n' .. r.service_instance_id .. '\n' .. int(r.fencing_token) .. '\n' .. int(r.acquired_at)
    .. '\n' .. renewed
    .. '\n' .. expires .. '\n' .. int(r.ttl_ms) .. '\n' .. int(r.maximum_lifetime_ms) .. '\n' .. r.execution_id
    .. '\n' .. r.job_id .. '\n' .. r.trace_id .. '\n' .. r.request_id .. '\n' .. meta
end

-- tag_of is the hash tag of a lock key, or nil if it is not LOCK_PREFIX
-- and a tag.
local function tag_of(lock_key)
  if type(lock_key) ~= 'string' or string.sub(lock_key, 1, #LOCK_PREFIX) ~= LOCK_PREFIX then return nil end
  return string.sub(lock_key, #LOCK_PREFIX + 1)
end

-- is_id is lease.CheckOpaqueID: ASCII letters, digits and . _ : -, a
-- letter or digit first, at most 256 bytes, no '..', and no API key
-- ('star_sk_' in any case), so the library never acts on a record whose
-- ids Go refuses.
local function is_id(v)
  if type(v) ~= 'string' then return false end
  local ok = ID_OK[v]
  if ok == nil then
    ok = #v <= 256 and string.find(v, '^[%w][%w%._:%-]*$') ~= nil and not string.find(v, '..', 1, true)
      and not string.find(string.lower(v), 'star_sk_', 1, true)
    memo_room()
    ID_OK[v] = ok
  end
  return ok
end

-- plain reports a string JSON writes verbatim between quotes.
local function plain(v)
  if type(v) ~= 'string' then return false end
  local ok = PLAIN_OK[v]
  if ok == nil then
    ok = v ~= '' and #v <= 256 and not string.find(v, '["\\%c]')
    memo_room()
    PLAIN_OK[v] = ok
  end
  return ok
end

-- meta_ok reports a metadata text decode accepts inside a record: one JSON
-- object, at most 4096 bytes, that also decodes one level deeper (as in a
-- record; cjson bounds nesting depth).
local function meta_ok(m)
  if type(m) ~= 'string' then return false end
  local ok = META_OK[m]
  if ok == nil then
    local ok1, t1 = pcall(cjson.decode, m)
    local ok2 = pcall(cjson.decode, '{"m":' .. m .. '}')
    ok = ok1 and ok2 and type(t1) == 'table' and string.sub(m, 1, 1) == '{' and #m <= 4096
    memo_room()
    META_OK[m] = ok
  end
  return ok
end

-- consistent is decode's last check, of a record's values against each
-- other: durations in range, timestamps ordered. Returns why not, or nil.
local function consistent(r)
  if r.ttl_ms > MAX_TTL_MS or r.maximum_lifetime_ms > MAX_LIFETIME_MS then return 'record durations are out of range' end
  if r.renewed_at < r.acquired_at or r.renewed_at >= r.expires_at
      or r.expires_at > r.acquired_at + r.maximum_lifetime_ms or r.expires_at - r.renewed_at > r.ttl_ms then
    return 'record timestamps are inconsistent'
  end
  return nil
end

-- matches checks a valid record against the request: its lock key, and
-- its tuple if a is given: the request's arguments, with the tuple's
-- seven components (tenant_id .. operation_class) at a[o] .. a[o + 6],
-- compared in place (no table per call). Returns r, or nil and a reason.
local function matches(r, lock_key, a, o)
  if r.lock_key ~= lock_key then return nil, 'record is stored under a foreign lock key' end
  if a and (r.tenant_id ~= a[o] or r.program_id ~= a[o + 1] or r.target_namespace ~= a[o + 2]
      or r.target_id ~= a[o + 3] or r.actor_name ~= a[o + 4] or r.workflow_name ~= a[o + 5]
      or r.operation_class ~= a[o + 6]) then
    return nil, 'stored tuple does not match the requested identity'
  end
  return r
end

-- REC_OF maps the exact bytes of a stored record to the record decode
-- makes of them, valid in itself (every check but the request's lock key
-- and tuple, which matches runs on every hit). decode is a pure function
-- of its arguments, so a hit is exactly its answer for those bytes; any
-- other bytes, however close, take the full strict path. Entries come
-- from decode and from the writers (rec_put_written): a mutation's record
-- is then read by the next operation on the lease without decoding it
-- again. Entries are shared: never modify a record decode returns. Bounded
-- at REC_MAX entries (dropped whole past it); an entry goes when its
-- active record is replaced or deleted. The bound is small because every
-- entry is live heap the Lua collector walks on every call's share of its
-- work: full at 2,048 (about 5 MB, as soon as that many leases were
-- written and not yet ended) it measured 60 to 90 us more script time per
-- acquire+release pair. Hits come from a lease's next operation soon after
-- its last, which 256 entries hold at any concurrency the benchmarks run.
local REC_MAX = 256
local REC_OF, rec_n = {}, 0

local function rec_put(raw, r)
  if REC_OF[raw] == nil then
    rec_n = rec_n + 1
    if rec_n > REC_MAX then REC_OF, rec_n = {}, 1 end
  end
  REC_OF[raw] = r
end

local function rec_drop(raw)
  if raw and REC_OF[raw] ~= nil then
    REC_OF[raw] = nil
    rec_n = rec_n - 1
  end
end

local function ms_ok(v) return type(v) == 'number' and v == math.floor(v) and v >= 0 and v < MS_MAX end

-- written reports whether decode would accept raw = encode(r) and return
-- a record equal to r: version 1, every field of its kind (strings plain,
-- so they need no escape and decode to themselves; numbers integral and in
-- range; timestamps integral ms in [0, year 10000), whose text parse_ts
-- inverts exactly, see MS_OF), metadata decode accepts (then the whole
-- text is JSON with exactly these fields), a known state and consistent
-- values. Anything else is simply not memoized.
-- (The checks run kind by kind over KIND_NAMES: the same checks of the
-- same fields as one loop over FIELDS, without dispatching on each kind.)
local function written(r)
  if r.record_version ~= 1 or not STATES[r.state] or not meta_ok(r.metadata) then return false end
  local names = KIND_NAMES[INT]
  for i = 1, #names do
    local v = r[names[i]]
    if type(v) ~= 'number' or v ~= math.floor(v) or v < 1 or v > MAX_TOKEN then return false end
  end
  names = KIND_NAMES[TS]
  for i = 1, #names do
    if not ms_ok(r[names[i]]) then return false end
  end
  names = KIND_NAMES[ID]
  for i = 1, #names do
    if not is_id(r[names[i]]) then return false end
  end
  names = KIND_NAMES[OPT]
  for i = 1, #names do
    local v = r[names[i]]
    if v ~= '' and not is_id(v) then return false end
  end
  names = KIND_NAMES[STR]
  for i = 1, #names do
    if not plain(r[names[i]]) then return false end
  end
  return consistent(r) == nil
end

-- rec_put_written memoizes the record a writer just encoded to raw. A
-- renewal (renewed) is a valid record with only renewed_at, expires_at and
-- ttl_ms changed, so only those need written's checks.
local function rec_put_written(raw, r, renewed)
  if renewed then
    local ttl = r.ttl_ms
    if ms_ok(r.renewed_at) and ms_ok(r.expires_at) and type(ttl) == 'number' and ttl == math.floor(ttl)
        and ttl >= 1 and ttl <= MAX_TOKEN and consistent(r) == nil then
      rec_put(raw, r)
    end
  elseif written(r) then
    rec_put(raw, r)
  end
end

-- RV2_TEXT_FIELDS are the names of record version 2's lines after its
-- tag, in order; metadata, the rest of the text, follows the last.
local RV2_TEXT_FIELDS = {
  'tenant_id', 'program_id', 'target_namespace', 'target_id', 'actor_name', 'workflow_name', 'operation_class',
  'lease_id', 'owner_principal_id', 'owner_client_id', 'owner_credential_id', 'service_instance_id',
  'fencing_token', 'acquired_at', 'renewed_at', 'expires_at', 'ttl_ms', 'maximum_lifetime_ms',
  'execution_id', 'job_id', 'trace_id', 'request_id', 'state',
}
local RV2_NUMBERS = { fencing_token = true, acquired_at = true, renewed_at = true, expires_at = true,
  ttl_ms = true, maximum_lifetime_ms = true }

-- read_lines reads fields' lines of a record of version (for the
-- reason) from raw at at into r, numbers (RV2_NUMBERS) as canonical
-- decimals unless empty and in may_be_empty; it returns the position after
-- the last, or nil and a reason.
local function read_lines(raw, at, r, fields, version, may_be_empty)
  for i = 1, #fields do
    local nl = string.find(raw, '\n', at, true)
    if not nl then return nil, 'record version ' .. version .. ' is malformed' end
    local name, v = fields[i], string.sub(raw, at, nl - 1)
    if RV2_NUMBERS[name] and not (v == '' and may_be_empty and may_be_empty[name]) then
      if not string.find(v, '^%d+$') or #v > 16 then return nil, 'record field ' .. name .. ' is not a number' end
      v = tonumber(v)
    end
    r[name] = v
    at = nl + 1
  end
  return at
end

-- accepted is r, decoded from raw, if it is the requested one (matches),
-- remembered for the next read of the same bytes; else nil and a reason.
local function accepted(raw, r, lock_key, a, o)
  local why
  r, why = matches(r, lock_key, a, o)
  if not r then return nil, why end
  rec_put(raw, r)
  return r
end

-- decode_rv2 strictly reads a record of version 2 (see decode): its lines
-- make a record, which must be one a writer writes (written: every field
-- of its kind and range, metadata a JSON object, a known state,
-- consistent values) and must encode to exactly raw (so numbers are
-- canonical decimals and no line is extra or missing), the way version 1
-- bytes must re-encode to themselves. Go's lease.DecodeStoredRecord
-- accepts the same bytes (it rebuilds version 1 and decodes that).
local function decode_rv2(raw, lock_key, a, o, at, ev)
  at = at or 5
  local nl = string.find(raw, '\n', at, true)
  if not nl then return nil, 'record version 2 is malformed' end
  local tag = string.sub(raw, at, nl - 1)
  at = nl + 1
  local r = { record_version = 1, lock_key = LOCK_PREFIX .. tag }
  local why
  at, why = read_lines(raw, at, r, RV2_TEXT_FIELDS, '2')
  if not at then return nil, why end
  r.metadata = string.sub(raw, at)
  if ev then
    -- Version 3: its evidence lines (decode_rv3) and an active record,
    -- which must re-encode to exactly raw as well.
    r.idem_digest, r.idem_scope, r.idem_ttl = ev[1], ev[2], ev[3] or r.ttl_ms
    if r.state ~= 'active' or not (r.idem_ttl >= 1 and r.idem_ttl <= MAX_TTL_MS) or not written(r)
        or encode_rv3(r, tag) ~= raw then
      return nil, 'record version 3 is not in canonical form'
    end
  elseif not written(r) or encode_rv2(r, tag) ~= raw then
    return nil, 'record version 2 is not in canonical form'
  end
  return accepted(raw, r, lock_key, a, o)
end

-- decode_rv3 strictly reads a record of version 3: its digest (64
-- lowercase hex), idempotency scope (43 base64url) and acquisition ttl_ms
-- ('' or a canonical decimal other than the record's), then version 2's
-- lines (decode_rv2, which checks that the whole re-encodes to raw).
local function decode_rv3(raw, lock_key, a, o)
  local digest, scope, ttl, at = string.match(raw, '^rv3\n([0-9a-f]+)\n([%w_%-]+)\n(%d*)\n()')
  if not digest or #digest ~= 64 or #scope ~= 43 or #ttl > 16 then return nil, 'record version 3 is malformed' end
  local ttl_ms
  if ttl ~= '' then ttl_ms = tonumber(ttl) end
  return decode_rv2(raw, lock_key, a, o, at, { digest, scope, ttl_ms })
end

-- RV4_TEXT_FIELDS are version 4's lines after its tuple: version 2's
-- without the state; RV4_DERIVED the times it may leave empty.
local RV4_TEXT_FIELDS = {}
for i = 1, #RV2_TEXT_FIELDS - 1 do RV4_TEXT_FIELDS[i] = RV2_TEXT_FIELDS[i] end
local RV4_DERIVED = { renewed_at = true, expires_at = true }

-- decode_rv4 strictly reads a record of version 4 (encode_rv4) stored
-- under lock_key, whose tag it must hold: its lines make an active record
-- with its acquisition's evidence, which must be one a writer writes and
-- encode to exactly raw (so each shortening has its one spelling). Go's
-- lease.DecodeEmbeddingRecordAt, with the lock key of the key it was read
-- from, accepts the same bytes and checks that the tuple hashes to it.
local function decode_rv4(raw, lock_key, a, o)
  local tag = tag_of(lock_key)
  local check, d, scope, ttl, at = string.match(raw, '^rv4\n([%w_%-]+)\n([%w_%-]+)\n([%w_%-]+)\n(%d*)\n()')
  local digest = d and b64_hex(d)
  if not tag or not digest or #scope ~= 43 or #ttl > 16 then return nil, 'record version 4 is malformed' end
  if check ~= tag then return nil, 'record: stored under a foreign lock key' end
  local r = { record_version = 1, lock_key = lock_key, state = 'active' }
  local why
  at, why = read_lines(raw, at, r, RV4_TEXT_FIELDS, '4', RV4_DERIVED)
  if not at then return nil, why end
  r.metadata = string.sub(raw, at)
  if r.metadata == '' then r.metadata = '{}' end
  r.lease_id = LEASE_PREFIX .. r.lease_id
  local acquired = r.acquired_at
  if r.renewed_at == '' then r.renewed_at = acquired else r.renewed_at = acquired + r.renewed_at end
  if r.expires_at == '' then
    r.expires_at = math.min(r.renewed_at + r.ttl_ms, acquired + r.maximum_lifetime_ms)
  else
    r.expires_at = acquired + r.expires_at
  end
  r.idem_digest, r.idem_scope, r.idem_ttl = digest, scope, r.ttl_ms
  if ttl ~= '' then r.idem_ttl = tonumber(ttl) end
  if not (r.idem_ttl >= 1 and r.idem_ttl <= MAX_TTL_MS) or not written(r) or encode_rv4(r, tag) ~= raw then
    return nil, 'record version 4 is not in canonical form'
  end
  return accepted(raw, r, lock_key, a, o)
end

-- decode strictly reads a stored record. lock_key is the requested one;
-- a and o, when given, the requested canonical tuple (see matches).
-- Returns the record (timestamps in ms) or nil and a reason.
local function decode(raw, lock_key, a, o)
  local known = REC_OF[raw]
  if known then return matches(known, lock_key, a, o) end
  local head = string.sub(raw, 1, 4)
  if head == 'rv2\n' then return decode_rv2(raw, lock_key, a, o) end
  if head == 'rv3\n' then return decode_rv3(raw, lock_key, a, o) end
  if head == 'rv4\n' then return decode_rv4(raw, lock_key, a, o) end
  local ok, t = pcall(cjson.decode, raw)
  if not ok or type(t) ~= 'table' then return nil, 'record is not JSON' end
  if t.record_version ~= 1 then return nil, 'record version is not 1' end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  if n ~= #FIELDS + 2 then return nil, 'record has unknown or missing fields' end
  local m_at = string.find(raw, ',"metadata":', 1, true)
  -- The state suffix: every record the library writes ends with one of
  -- STATE_TAIL's suffixes, which is then the pattern's only match (an
  -- earlier start would have to span non-lowercase bytes with %l+);
  -- anything else takes the general, unanchored search as before.
  local s_at, state
  for len in pairs(TAIL_LENS) do
    local sfx = STATE_TAIL[string.sub(raw, -len)]
    if sfx then s_at, state = #raw - len + 1, sfx[1] end
  end
  if not s_at then
    local _
    s_at, _, state = string.find(raw, ',"state":"(%l+)"}$')
  end
  if not m_at or not s_at or s_at < m_at then return nil, 'record layout is not canonical' end
  local meta = string.sub(raw, m_at + 12, s_at - 1)
  local okm, m = pcall(cjson.decode, meta)
  if not okm or type(m) ~= 'table' or string.sub(meta, 1, 1) ~= '{' or #meta > 4096 then
    return nil, 'record metadata is not an object'
  end
  if not STATES[state] then return nil, 'record state is unknown' end
  -- The record is built in the decoded table itself (no second table):
  -- once encode(r) equals raw, raw is in the canonical layout, whose JSON
  -- has exactly the 24 FIELDS, metadata and state, so r holds nothing else.
  local r = t
  r.metadata, r.state = meta, state
  for _, f in ipairs(FIELDS) do
    local name, kind = f[1], f[2]
    local v = t[name]
    if kind == INT then
      if type(v) ~= 'number' or v ~= math.floor(v) or v < 1 or v > MAX_TOKEN then return nil, 'record field ' .. name .. ' is out of range' end
    elseif kind == TS then
      v = parse_ts(v)
      if not v then return nil, 'record field ' .. name .. ' is not a timestamp' end
    elseif kind == ID then
      if not is_id(v) then return nil, 'record field ' .. name .. ' is not an identifier' end
    elseif kind == OPT then
      if v ~= '' and not is_id(v) then return nil, 'record field ' .. name .. ' is not an identifier' end
    elseif not plain(v) then
      return nil, 'record field ' .. name .. ' is malformed'
    end
    r[name] = v
  end
  if encode(r) ~= raw then return nil, 'record is not in canonical form' end
  local why
  r, why = matches(r, lock_key, a, o)
  if not r then return nil, why end
  why = consistent(r)
  if why then return nil, why end
  rec_put(raw, r)
  return r
end

-- get reads a string key; a key of another type is corruption, not a
-- script error (an error would surface as a raw backend failure).
local function get(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return nil, 'key has the wrong type' end
  return v or nil
end

-- counter_value reads a stored counter, floor or high-water mark: decimal
-- digits, at most 16 of them; absent is 0. Anything else is nil.
local function counter_value(v)
  if v and (not string.find(v, '^%d+$') or #v > 16) then return nil end
  return tonumber(v or '0')
end

-- headers_size sums the names and values of a decoded headers object.
local function headers_size(h)
  local n = 0
  if type(h) == 'table' then
    for name, v in pairs(h) do
      if type(v) == 'string' then n = n + #name + #v end
    end
  end
  return n
end

-- base64_size is the decoded length of the padded base64 text s[i..j]
-- (read in place: a body is up to 87 KiB of it).
local function base64_size(s, i, j)
  local n = (j - i + 1) / 4 * 3
  if j >= i and string.byte(s, j) == 61 then -- '='
    n = n - 1
    if j > i and string.byte(s, j - 1) == 61 then n = n - 1 end
  end
  return n
end

-- entry_size is lease.OutboxEntrySize, the same way: the
-- lease.OutboxMessage.Size of a stored outbox entry (its body's bytes,
-- which the JSON holds as padded base64, plus its header names and
-- values), 0 for an entry that does not decode, so adding and removing it
-- agree. Decoding a whole entry costs about half a millisecond for a 64
-- KiB body, on every removal, so the body is measured in place: the
-- message is the entry's last member, its body (base64, which holds no
-- quote, or null) comes before its headers, and no string can hold an
-- unescaped quote, so the first ',"body":' is the body's key. Only the
-- headers, if any, are decoded. Anything else is decoded whole.
local function entry_size(raw)
  if not raw then return 0 end
  local _, at = string.find(raw, ',"body":', 1, true)
  if at and string.sub(raw, -2) == '}}' then
    local n, rest = 0, nil
    if string.sub(raw, at + 1, at + 4) == 'null' then
      rest = at + 5
    elseif string.sub(raw, at + 1, at + 1) == '"' then
      local close = string.find(raw, '"', at + 2, true)
      if close then n, rest = base64_size(raw, at + 2, close - 1), close + 1 end
    end
    if rest == #raw - 1 then return n end
    if rest and string.sub(raw, rest, rest + 11) == ',"headers":{' then
      local ok, h = pcall(cjson.decode, string.sub(raw, rest + 11, #raw - 2))
      if ok then return n + headers_size(h) end
    end
  end
  local ok, e = pcall(cjson.decode, raw)
  if not ok or type(e) ~= 'table' or type(e.message) ~= 'table' then return 0 end
  local n = headers_size(e.message.headers)
  local body = e.message.body
  if type(body) == 'string' then n = n + base64_size(body, 1, #body) end
  return n
end

-- load_active strictly reads the active record: nil if none; nil and a
-- reason if corrupt. A key without a TTL is corrupt: every writer of the
-- active key attaches one. A valid record comes with its stored bytes and
-- PTTL, so a read need not fetch them again.
local function load_active(key, lock_key, a, o)
  local raw, why = get(key)
  if why then return nil, 'active ' .. why end
  if not raw then return nil end
  local pttl = redis.call('PTTL', key)
  if pttl == -1 then return nil, 'active key has no TTL' end
  local r
  r, why = decode(raw, lock_key, a, o)
  if not r then return nil, why end
  return r, nil, raw, pttl
end

-- active_of is load_active of c's active record, checked against c's
-- tuple if tuple (else only its lock key), keeping its stored bytes in
-- c.raw so the write that replaces or deletes them drops their memo entry.
local function active_of(c, tuple)
  local cur, why, raw = load_active(c.k_active, c.lock_key, tuple and c.args, 4)
  c.raw = raw
  return cur, why
end

local function live(r, now) return r.state == 'active' and now < r.expires_at end

-- wrong_type reports whether a key the operation may write holds another
-- type than the one it writes (nothing is fine); checked before the first
-- write.
local function wrong_type(key, want)
  local t = redis.call('TYPE', key)
  t = t.ok or t
  return t ~= 'none' and t ~= want
end

local WRONG_TYPE = 'a lease key has the wrong type'

-- lp is the length prefix of one part of lease.lengthPrefixed (the part's
-- 2-byte big-endian length; the bytes follow), memoized by length (at most
-- 65536 entries: string.char refuses larger lengths, as before).
local LP_OF = {}
local function lp(s)
  local n = #s
  local v = LP_OF[n]
  if not v then
    v = string.char(math.floor(n / 256), n % 256)
    LP_OF[n] = v
  end
  return v
end

-- index_members are r's three List index entries (owner, target,
-- program): filter ‖ 0 ‖ filter value ‖ lease id ‖ 0 ‖ hash tag, all with
-- score 0, so ZRANGEBYLEX over a filter's prefix walks its leases in
-- lease-id order. A record of version 3 (format 4) has them without
-- ‖ 0 ‖ hash tag (48 bytes less each): List finds the tag through the
-- lease-id lookup, and both forms sort alike by lease id. Each is one
-- concatenation (no intermediate strings: every new string costs Lua a
-- hash of all its bytes). end_ is what follows the lease id.
local function members_ending(r, end_)
  local id, tenant, program = r.lease_id, r.tenant_id, r.program_id
  local owner, namespace, target = r.owner_principal_id, r.target_namespace, r.target_id
  return 'owner\0' .. lp(owner) .. owner .. id .. end_,
    'target\0' .. lp(tenant) .. tenant .. lp(program) .. program .. lp(namespace) .. namespace .. lp(target) .. target
      .. id .. end_,
    'program\0' .. lp(tenant) .. tenant .. lp(program) .. program .. id .. end_
end

local function index_members(r, tag)
  if r.idem_scope then return members_ending(r, '') end
  return members_ending(r, '\0' .. tag)
end

-- expiry_member is r's expiry schedule entry, for every record version:
-- tag ‖ 0 ‖ lease id ‖ 0 ‖ token. expire is conditional on both (the
-- contract: all cleanup is conditional on lease_id and fencing_token).
local function expiry_member(r, tag) return tag .. '\0' .. r.lease_id .. '\0' .. int(r.fencing_token) end

-- WRITE_LEVEL is the format level of each write format the Go side names
-- (format.go's writeFormat; FORMAT_LEVEL's levels): each writes what the
-- one below it does, and more. Any other name writes version 1.
local WRITE_LEVEL = { compact = 2, compact_records = 3, embedded_evidence = 4, referring_evidence = 5,
  lean_records = 6, lean_evidence = 7, checked_evidence = 8 }

-- Common ARGV of lease mutations:
--   1 deadline ms, 2 lock key, 3 hash tag, 4..10 identity (c.args[4..10]),
--   11 physical grace ms, 12 history cap, 13 history retention ms,
--   14 evidence retention ms (the idempotency retention, but for commit,
--   whose ARGV 30 is that); operation-specific arguments follow.
-- Common KEYS: 1 active, 2 history, 3 index, 4 expiry schedule,
--   5 evidence (idempotency or accepted commit), 6 quarantine, 7 the
--   namespace gate; operation-specific keys follow.
local function context(keys, args)
  local format, eager = args[#args], false
  -- '+eager' after format 5 or later: the instance detaches eagerly (see
  -- refers_at).
  if string.find(format, '+eager', 1, true) then format, eager = string.sub(format, 1, -7), true end
  local level = WRITE_LEVEL[format] or 0
  return {
    deadline = tonumber(args[1]), lock_key = args[2], tag = args[3], args = args,
    grace = tonumber(args[11]), hist_cap = tonumber(args[12]), hist_ret = tonumber(args[13]),
    ev_ret = tonumber(args[14]), idem_ret = tonumber(args[14]),
    k_active = keys[1], k_hist = keys[2], k_index = keys[3], k_expiry = keys[4], k_ev = keys[5], k_quar = keys[6],
    k_gate = keys[7],
    -- The Go side ends the ARGV of every call that keeps evidence or
    -- history with the format to write them in: 'compact' (version 2)
    -- once the namespace has been switched to it, else version 1, which
    -- instances of older builds still sharing the namespace can read.
    compact = level >= 2,
    -- 'compact_records' (namespace format 3) also stores active records
    -- in version 2 (encode_rv2); every build since reads both.
    rv2 = level >= 3,
    -- 'embedded_evidence' (format 4) stores them in version 3 with the
    -- acquisition's evidence (encode_rv3): no evidence key is written
    -- while a lease is active.
    rv3 = level >= 4,
    -- 'referring_evidence' (format 5) also writes an ending's evidence of
    -- its acquisition and a release's own in version 3, by reference to
    -- the history entry (see refers).
    refs = level >= 5,
    -- 'lean_records' (format 6) stores a record carrying its acquisition's
    -- evidence in version 4 (encode_rv4) instead of 3.
    rv4 = level >= 6,
    -- 'lean_evidence' (format 7) writes evidence by reference in version 5
    -- (encode_ev5) instead of 3.
    ev5 = level >= 7,
    -- 'checked_evidence' (format 8) writes whole evidence in version 6
    -- (encode_whole) instead of 2, and a history entry no evidence refers
    -- to in version 5 (archive) instead of 2.
    ev6 = level >= 8,
    eager = eager,
  }
end

local function layout_types(c)
  if wrong_type(c.k_hist, 'list') or wrong_type(c.k_index, 'zset') or wrong_type(c.k_expiry, 'zset') then
    return WRONG_TYPE
  end
  return nil
end

-- corrupt fails closed: it records the reason for operators and changes
-- nothing else.
local function corrupt(c, now, why)
  redis.call('SET', c.k_quar, why)
  return { 'corrupt', int(now), why }
end

-- store_active writes r as the active record, with a physical TTL past
-- expires_at: storage reclamation only, the decision is always made from
-- the stored expires_at. A record carrying its acquisition's evidence is
-- always written in version 3 (whatever the writer's format: the evidence
-- must not be dropped) and kept at least until the evidence's retention
-- ends (acquired_at + the idempotency retention), so it is never lost
-- while no reaper runs. Format 6 writes it in version 4 (encode_rv4).
local function store_active(c, r, renewed)
  local raw, at = nil, r.expires_at + c.grace
  if r.idem_scope then
    local tag = tag_of(r.lock_key)
    if c.rv4 and rv4_ok(r) then raw = encode_rv4(r, tag) else raw = encode_rv3(r, tag) end
    at = math.max(at, r.acquired_at + c.idem_ret)
  else
    local tag = c.rv2 and tag_of(r.lock_key)
    if tag then raw = encode_rv2(r, tag) else raw = encode(r) end
  end
  redis.call('SET', c.k_active, raw, 'PXAT', int(at))
  redis.call('ZADD', c.k_expiry, int(r.expires_at), expiry_member(r, c.tag))
  rec_drop(c.raw)
  rec_put_written(raw, r, renewed)
  c.raw = raw
  return raw
end

-- is_scope reports an idempotency scope as stored: 43 base64url
-- characters (lease.IdempotencyScope's).
local function is_scope(v) return type(v) == 'string' and #v == 43 and string.find(v, '^[%w_%-]+$') ~= nil end

-- ev2_facts are lease r's facts as evidence version 2 (and 6) spells
-- them after the hash tag, each after a newline, with renewed, expires,
-- ttl and state as the answer gave them (an ending's write_out gives the
-- acquisition's). One concatenation.
local function ev2_facts(r, renewed, expires, ttl, state)
  return '\n' .. r.lease_id .. '\n' .. r.owner_principal_id .. '\n' .. r.owner_client_id
    .. '\n' .. r.owner_credential_id .. '\n' .. r.service_instance_id .. '\n' .. int(r.fencing_token)
    .. '\n' .. int(r.acquired_at) .. '\n' .. int(renewed) .. '\n' .. int(expires)
    .. '\n' .. int(ttl) .. '\n' .. int(r.maximum_lifetime_ms) .. '\n' .. r.execution_id
    .. '\n' .. r.job_id .. '\n' .. r.trace_id .. '\n' .. r.request_id .. '\n' .. state
    .. '\n' .. r.metadata
end

-- encode_ev2 is evidence version 2 (lease.CompactEvidence's bytes): the
-- operation, digest, code and backend time at, the hash tag, then lease
-- r's facts (ev2_facts).
local function encode_ev2(op, digest, code, at, tag, r, renewed, expires, ttl, state)
  return 'ev2\n' .. op .. '\n' .. digest .. '\n' .. code .. '\n' .. int(at) .. '\n' .. tag
    .. ev2_facts(r, renewed, expires, ttl, state)
end

-- sha1_check is the check evidence versions 5 and 6 keep of body, their
-- lines other than the check, bound to head (version 5: the history
-- entry's bytes as written; version 6: the scope of its key): the first
-- 16 hex digits of the SHA-1 of both, a newline between them
-- (lease.leanIDCheck's).
local function sha1_check(head, body) return string.sub(redis.sha1hex(head .. '\n' .. body), 1, 16) end

-- encode_whole is the evidence c writes whole (not by reference) under
-- scope, the idempotency scope its key is named by, with encode_ev2's
-- arguments: version 6 in format 8 (lease.WholeEvidence's bytes: version 2
-- without the tag line, the digest in base64url, and a check of the scope
-- and the lines after it, the first 16 hex digits of their SHA-1, on the
-- line after the version), else version 2. Version 2 too for a digest
-- hex_b64 refuses, or a scope that is not one.
local function encode_whole(c, scope, op, digest, code, at, tag, r, renewed, expires, ttl, state)
  local d = c.ev6 and is_scope(scope) and hex_b64(digest)
  if not d then return encode_ev2(op, digest, code, at, tag, r, renewed, expires, ttl, state) end
  local rest = op .. '\n' .. d .. '\n' .. code .. '\n' .. int(at) .. ev2_facts(r, renewed, expires, ttl, state)
  return 'ev6\n' .. sha1_check(scope, rest) .. '\n' .. rest
end

-- encode_ev3 is evidence version 3 (lease.ReferringEvidence's bytes): the
-- operation, digest, code and backend time at, then the lease id and
-- fencing token that name lease r's history entry, and the result's
-- expires_at and ttl_ms (an acquisition's as granted; a release's, the
-- entry's own). The Go side rebuilds the rest from the entry.
local function encode_ev3(op, digest, code, at, r, expires, ttl)
  return 'ev3\n' .. op .. '\n' .. digest .. '\n' .. code .. '\n' .. int(at) .. '\n' .. r.lease_id
    .. '\n' .. int(r.fencing_token) .. '\n' .. int(expires) .. '\n' .. int(ttl)
end

-- encode_ev5 is evidence version 5 (lease.LeanIDEvidence's bytes) of op,
-- 'acquire' or 'release', with digest (lowercase hex), referring to
-- entry, the history entry of lease r this call writes: the operation's
-- letter, the digest in base64url, the lease id and fencing token that
-- name the entry, an acquisition's ttl_ms as granted, and the check. The
-- Go side derives the rest from the entry (its acquired_at, maximum
-- lifetime, ended_at and record), so a writer stores it only where that
-- derivation is exact: an acquisition's evidence of the lease as granted
-- (write_out), a release's at the end its entry records (remember). nil
-- for a digest hex_b64 refuses: the caller writes version 3.
local EV5_LETTERS = { acquire = 'a', release = 'r' }
local function encode_ev5(op, digest, r, ttl, entry)
  local d = hex_b64(digest)
  if not d then return nil end
  local body = 'ev5\n' .. EV5_LETTERS[op] .. '\n' .. d .. '\n' .. r.lease_id .. '\n' .. int(r.fencing_token)
  if op == 'acquire' then body = body .. '\n' .. int(ttl) end
  return body .. '\n' .. sha1_check(entry, body)
end

-- idem_key is the evidence key of scope within c's identity: named from
-- stored data (not in KEYS), but in the identity's own hash tag (that of
-- c.k_active), so in the slot of every key the call declares, and never
-- another identity's.
local function idem_key(c, scope) return string.sub(c.k_active, 1, #c.k_active - #'active') .. 'idem:' .. scope end

-- ev_scope is the scope c's evidence key (KEYS 5) is named by, or nil.
local function ev_scope(c) return string.match(c.k_ev, ':idem:([%w_%-]+)$') end

-- write_out writes the acquisition's evidence a version 3 record r carries
-- to its own key, as remember writes it (evidence version 2, or 6 in
-- format 8) and with the expiry it would have had (acquired_at + the
-- idempotency retention; not written if that has passed): the lease is
-- ending, and the evidence must outlive the record. The key is named from stored data (not in KEYS): the
-- scope, checked as 43 base64url characters first, within the identity's
-- own hash tag (c.k_active's), so it is in the same slot as every key the
-- call declares.
local function write_out(c, r, refs, entry)
  local at = r.acquired_at + c.idem_ret
  if at <= now_ms() then return end
  local scope = r.idem_scope
  if not is_scope(scope) then return end -- (decode checked it)
  -- The lease as its acquisition granted it (what the acquire answered).
  local ttl = r.idem_ttl
  local expires = r.acquired_at + math.min(ttl, r.maximum_lifetime_ms)
  local ev
  if refs then
    -- Version 5 derives expires as computed here (lease.LeaseExpiry at
    -- acquired_at) and the backend time as acquired_at.
    ev = c.ev5 and encode_ev5('acquire', r.idem_digest, r, ttl, entry)
      or encode_ev3('acquire', r.idem_digest, 'lease_acquired', r.acquired_at, r, expires, ttl)
  else
    ev = encode_whole(c, scope, 'acquire', r.idem_digest, 'lease_acquired', r.acquired_at, c.tag, r, r.acquired_at, expires, ttl, 'active')
  end
  redis.call('SET', idem_key(c, scope), ev, 'PXAT', int(at))
end

-- refers reports whether c's endings write evidence by reference
-- (format 5): only while the history list, whose TTL every push sets to
-- the history retention, outlives the evidence (its retention), so that
-- the entry it refers to is there as long as it is.
local function refers(c) return c.refs and c.hist_ret >= c.idem_ret end

-- trims_live reports whether pushing an entry of a lease ended at ended
-- trims one whose evidence may still be live: the list's entry at the
-- cap (the newest one the push drops) ended less than the idempotency
-- retention before. An identity that ends its cap of leases that fast
-- would have every entry it writes by reference trimmed while its
-- evidence lives, and that evidence rewritten whole then (detach). An
-- entry it cannot read the end of says nothing (false).
local function trims_live(c, ended)
  -- (LRANGE of one entry: the documented ACL has it, not LINDEX.)
  local oldest = redis.call('LRANGE', c.k_hist, c.hist_cap - 1, c.hist_cap - 1)[1]
  if not oldest then return false end
  local at = string.match(oldest, '^hv[25]\n(%d+)\n') or string.match(oldest, '^hv4\n[%w_%-]*\n[%w_%-]*\n(%d+)\n')
  return at ~= nil and #at <= 16 and ended - tonumber(at) < c.idem_ret
end

-- refers_at reports whether an ending at ended writes its evidence by
-- reference (refers): not, for an instance that detaches eagerly
-- (Options.EagerDetach), where the push trims live evidence (trims_live).
-- The ending then writes what detach would have written later, whole
-- evidence (version 2, or 6 in format 8) and an entry that names none
-- (version 2, or 5 in format 8): the same answers, without the rewrite
-- when the entry goes.
local function refers_at(c, ended)
  return refers(c) and not (c.eager and trims_live(c, ended))
end

-- REF_CODES is the code of the evidence version 3 holds, by operation.
local REF_CODES = { acquire = 'lease_acquired', release = 'lease_released' }

-- canonical reports a decimal as int writes it: no leading zero, at most
-- 16 digits (every number evidence holds is below 2^53).
local function canonical(v) return #v <= 16 and (v == '0' or string.find(v, '^[1-9]%d*$') ~= nil) end

-- referring_fields are the lines of evidence ev by reference as version 3
-- spells them (operation, digest in hex, code, backend ms, lease id,
-- token, expires ms, ttl ms): version 3's own, or version 5's with what
-- it derives (lease.ExpandLeanIDEvidence) from r, its history entry's
-- record, ended, the entry's end as stored, and entry, its bytes: an
-- acquisition's backend time its acquired_at and expires its granted
-- ttl's (write_out), a release's backend time ended and expires and ttl
-- r's. nil for any other value, and for version 5 whose check is not that
-- of entry and its lines, or whose digest or ttl is not spelled as
-- written.
local function referring_fields(ev, r, ended, entry)
  if string.sub(ev, 1, 4) == 'ev3\n' then
    return string.match(ev, '^ev3\n(%l+)\n(%x+)\n([%l_]+)\n(%d+)\n([^\n]+)\n(%d+)\n(%d+)\n(%d+)$')
  end
  local body, check = string.match(ev, '^(ev5\n.*)\n(%x+)$')
  if not body or #check ~= 16 or string.find(check, '%u') or sha1_check(entry, body) ~= check then return nil end
  local d, id, token, ttl = string.match(body, '^ev5\na\n([%w_%-]+)\n([^\n]+)\n(%d+)\n(%d+)$')
  if d then
    local digest = b64_hex(d)
    if not digest or not canonical(ttl) then return nil end
    return 'acquire', digest, 'lease_acquired', int(r.acquired_at), id, token,
      int(r.acquired_at + math.min(tonumber(ttl), r.maximum_lifetime_ms)), ttl
  end
  d, id, token = string.match(body, '^ev5\nr\n([%w_%-]+)\n([^\n]+)\n(%d+)$')
  local digest = d and b64_hex(d)
  if not digest or not ended then return nil end
  return 'release', digest, 'lease_released', ended, id, token, int(r.expires_at), int(r.ttl_ms)
end

-- detach rewrites whole (encode_whole: version 2, or 6 in format 8) the
-- evidence of version 3 or 5 that refers to entry, a history entry of
-- version 4 about to be dropped (version 2's lines without the hash tag,
-- which c's keys hold): under each
-- scope it names, evidence by reference of the scope's operation that
-- names the entry's lease id and token becomes what remember or write_out
-- would have written in format 4 (lease.DetachedEvidence's splice), with
-- its TTL kept. The entry's record is read strictly (decode_rv2, under
-- the call's lock key) before anything is rewritten: an entry that does
-- not read, or evidence that is not its lease's, is left as it is (its
-- reader answers corrupt).
local function detach(c, entry)
  local acq_scope, rel_scope, at = string.match(entry, '^hv4\n([%w_%-]*)\n([%w_%-]*)\n()')
  if not acq_scope then return end
  -- The evidence it names is read before the entry is decoded: an entry
  -- trimmed after its evidence expired (an identity that ends its cap of
  -- leases more slowly than the idempotency retention), or whose evidence
  -- is version 2 already, costs two reads.
  local found, any = {}, false
  for op, scope in pairs({ acquire = acq_scope, release = rel_scope }) do
    local k = is_scope(scope) and idem_key(c, scope)
    local ev = k and get(k)
    local v = ev and string.sub(ev, 1, 4)
    if v == 'ev3\n' or v == 'ev5\n' then found[op], any = { k, ev, scope }, true end
  end
  if not any then return end
  local ended, rec_at = string.match(entry, '^(%d+)\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n()', at)
  if not rec_at then return end
  local r = decode_rv2('rv2\n' .. c.tag .. '\n' .. string.sub(entry, rec_at), c.lock_key)
  if not r then return end
  for op, kev in pairs(found) do
    local k, ev, scope = kev[1], kev[2], kev[3]
    local e_op, digest, code, backend, id, token, expires, ttl = referring_fields(ev, r, ended, entry)
    -- Only evidence exactly as encode_ev3 or encode_ev5 writes it
    -- (canonical numbers, a lowercase digest, the operation's code): damage
    -- is left for its reader to refuse, never rewritten into evidence that
    -- reads.
    if e_op == op and code == REF_CODES[op] and #digest == 64 and not string.find(digest, '%u')
        and id == r.lease_id and canonical(token) and tonumber(token) == r.fencing_token
        and canonical(backend) and canonical(expires) and canonical(ttl) then
      local out
      if op == 'acquire' then
        out = encode_whole(c, scope, op, digest, code, tonumber(backend), c.tag, r, r.acquired_at, tonumber(expires), tonumber(ttl), 'active')
      elseif r.state == 'released' and tonumber(expires) == r.expires_at and tonumber(ttl) == r.ttl_ms then
        out = encode_whole(c, scope, op, digest, code, tonumber(backend), c.tag, r, r.renewed_at, r.expires_at, r.ttl_ms, r.state)
      end
      if out then redis.call('SET', k, out, 'KEEPTTL') end
    end
  end
end

-- detach_dropped detaches the evidence of each entry of dropped (history
-- entries about to be trimmed) that names it (version 4).
local function detach_dropped(c, dropped)
  for _, entry in ipairs(dropped) do
    if string.sub(entry, 1, 4) == 'hv4\n' then detach(c, entry) end
  end
end

-- archive ends r: terminal evidence to the capped history list, then the
-- active record and its index and schedule entries go. With by given
-- (else none of them), the entry records ended_by, request_id, reason
-- (JSON-encoded) and incident_id, each only if not ''. The entry is
-- history version 2 (the Go side rebuilds version 1, lease.HistoryEntry's
-- JSON, from it; see expandHistory in evidence.go): its facts one per
-- line, in place of a second copy of the record JSON (versions 4 and 5
-- without its tag line, below). Returns the ended record's JSON if it
-- built it (version 1 history; see ended_record), and the entry as pushed
-- (what evidence by reference refers to).
local function archive(c, r, state, ended, by, request_id, reason, incident, release_scope, refs)
  if refs == nil then refs = refers_at(c, ended) end
  local raw, entry
  if not c.compact then
    raw = encode(r, state)
    local extra = ''
    if by then
      if by ~= '' then extra = ',"ended_by":"' .. by .. '"' end
      if request_id ~= '' then extra = extra .. ',"request_id":"' .. request_id .. '"' end
      if reason ~= '' then extra = extra .. ',"reason":' .. reason end
      if incident ~= '' then extra = extra .. ',"incident_id":"' .. incident .. '"' end
    end
    entry = '{"history_version":1,"record":' .. raw .. ',"ended_at":"' .. ts(ended) .. '"' .. extra .. '}'
  else
    -- Format 5 names the evidence that refers to the entry by its scopes
    -- (history version 4), so that it can be rewritten before the entry
    -- goes (detach_dropped).
    local head, tag_line = 'hv2\n', c.tag .. '\n'
    local acq_scope = refs and is_scope(r.idem_scope) and r.idem_scope
    if acq_scope or release_scope then
      -- Without the hash tag line: the list's key holds it.
      head, tag_line = 'hv4\n' .. (acq_scope or '') .. '\n' .. (release_scope or '') .. '\n', ''
    elseif c.ev6 then
      -- Format 8: version 5, version 2 without the tag line, for an
      -- entry no evidence refers to.
      head, tag_line = 'hv5\n', ''
    end
    entry = head .. int(ended) .. '\n' .. (by or '') .. '\n' .. (request_id or '') .. '\n' .. (reason or '')
    .. '\n' .. (incident or '') .. '\n' .. tag_line .. r.tenant_id .. '\n' .. r.program_id
    .. '\n' .. r.target_namespace .. '\n' .. r.target_id .. '\n' .. r.actor_name .. '\n' .. r.workflow_name
    .. '\n' .. r.operation_class .. '\n' .. r.lease_id .. '\n' .. r.owner_principal_id .. '\n' .. r.owner_client_id
    .. '\n' .. r.owner_credential_id .. '\n' .. r.service_instance_id .. '\n' .. int(r.fencing_token)
    .. '\n' .. int(r.acquired_at) .. '\n' .. int(r.renewed_at) .. '\n' .. int(r.expires_at)
    .. '\n' .. int(r.ttl_ms) .. '\n' .. int(r.maximum_lifetime_ms) .. '\n' .. r.execution_id
    .. '\n' .. r.job_id .. '\n' .. r.trace_id .. '\n' .. r.request_id .. '\n' .. state .. '\n' .. r.metadata
  end
  -- The acquisition's evidence by reference refers to the entry (version
  -- 5 checks its bytes), as a release's does (remember).
  if r.idem_scope then write_out(c, r, refs, entry) end
  -- LTRIM only when the push went past the cap: below it, it is a no-op.
  -- Evidence that refers to an entry it drops is rewritten first, in
  -- every format (an instance that has not yet read a raised format
  -- switch still trims entries of format 5).
  if redis.call('LPUSH', c.k_hist, entry) > c.hist_cap then
    detach_dropped(c, redis.call('LRANGE', c.k_hist, c.hist_cap, -1))
    redis.call('LTRIM', c.k_hist, 0, c.hist_cap - 1)
  end
  -- Evidence that refers to an entry expires no later than its list (a
  -- writer refers only while its history retention covers its evidence
  -- retention, refers), unless a PEXPIRE shortens the list: that of an
  -- instance whose retentions are shorter than the writer's were (other
  -- settings, or lowered since). Before one does, the evidence that
  -- refers to the list's entries is rewritten (review 44). With equal
  -- settings everywhere the list's PTTL is never above the retention.
  if redis.call('PTTL', c.k_hist) > c.hist_ret then detach_dropped(c, redis.call('LRANGE', c.k_hist, 0, -1)) end
  redis.call('PEXPIRE', c.k_hist, c.hist_ret)
  redis.call('DEL', c.k_active)
  -- The index entries in both forms, r's own and the other (a record's
  -- form is fixed, but a restore or a repair may mix them), each in its
  -- own call: one that removes nothing is not propagated, so costs no AOF
  -- bytes. The schedule entry has one form.
  redis.call('ZREM', c.k_index, index_members(r, c.tag))
  redis.call('ZREM', c.k_index, members_ending(r, r.idem_scope and '\0' .. c.tag or ''))
  redis.call('ZREM', c.k_expiry, expiry_member(r, c.tag))
  rec_drop(c.raw)
  c.raw = nil
  return raw, entry
end

-- ended_record is the reply's copy of r ended in state: raw, the version 1
-- JSON archive built for version 1 history and evidence, or else record
-- version 2, which the Go side decodes alike (lease.DecodeStoredRecord)
-- and which costs about half of building the JSON.
local function ended_record(raw, r, state)
  if raw then return raw end
  local tag = tag_of(r.lock_key)
  if tag then return encode_rv2(r, tag, state) end
  return encode(r, state)
end

-- remember stores the typed result as idempotency evidence, in the same
-- atomic section as the mutation. Evidence version 2 (EV2) is compact:
-- the facts of the result, one per line, instead of a copy of the record
-- JSON (lease.IdempotencyRecord's, version 1, which older code wrote and
-- the Go side still reads): the Go side rebuilds exactly the version 1
-- bytes from them, the identity tuple from the request it answers (the
-- evidence key's scope holds the lock key, whose hash tag is checked
-- too), and decodes those strictly. Lines: ev2, op, digest, code, backend
-- ms, hash tag, then r's lease_id .. service_instance_id, fencing_token,
-- acquired/renewed/expires ms, ttl_ms, maximum_lifetime_ms, execution_id,
-- job_id, trace_id, request_id, state (state if given), and metadata last
-- (JSON; the only free text); in format 8 version 6 instead
-- (encode_whole). With ref_entry, the history entry this call
-- pushed, a release's evidence refers to it instead (finish).
local function remember(c, now, op, digest, code, r, state, raw, ref_entry)
  if not c.compact then
    -- raw is the record as stored, but a record carrying its acquisition's
    -- evidence is stored in version 3 whatever the writer's format (a
    -- renewal by an instance still writing version 1 after the switch to
    -- 4), or 4 in format 6, and version 1 evidence holds a record's JSON:
    -- encode it.
    if r.idem_scope and string.sub(raw, 1, 1) ~= '{' then raw = encode(r, state) end
    local ev = '{"idempotency_version":1,"op":"' .. op .. '","digest":"' .. digest .. '","code":"' .. code ..
        '","lease":' .. raw .. ',"backend_time":"' .. ts(now) .. '"}'
    redis.call('SET', c.k_ev, ev, 'PX', int(c.ev_ret))
    return
  end
  local ev
  if ref_entry then
    -- A release's (finish): its entry ended at now with r's expires_at
    -- and ttl_ms, what version 5 derives.
    ev = c.ev5 and encode_ev5(op, digest, r, nil, ref_entry) or encode_ev3(op, digest, code, now, r, r.expires_at, r.ttl_ms)
  else
    ev = encode_whole(c, c.ev6 and ev_scope(c), op, digest, code, now, c.tag, r, r.renewed_at, r.expires_at, r.ttl_ms, state or r.state)
  end
  redis.call('SET', c.k_ev, ev, 'PX', int(c.ev_ret))
end

-- evidence_lease_id is the lease id stored evidence names (any
-- version), or nil.
local function evidence_lease_id(ev)
  if string.sub(ev, 1, 4) == 'ev5\n' then
    local id = string.match(ev, '^ev5\n[ar]\n[^\n]*\n([^\n]*)\n')
    if is_id(id) then return id end
    return nil
  end
  if string.sub(ev, 1, 4) == 'ev3\n' then
    local id = string.match(ev, '^ev3\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n([^\n]*)\n')
    if is_id(id) then return id end
    return nil
  end
  -- Versions 2 and 6 name it on the same line (version 6's check takes
  -- the place of version 2's tag among the lines before it).
  if string.sub(ev, 1, 4) == 'ev2\n' or string.sub(ev, 1, 4) == 'ev6\n' then
    local id = string.match(ev, '^ev[26]\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n([^\n]*)\n')
    if is_id(id) then return id end
    return nil
  end
  local ok, t = pcall(cjson.decode, ev)
  if ok and type(t) == 'table' and type(t.lease) == 'table' and is_id(t.lease.lease_id) then
    return t.lease.lease_id
  end
  return nil
end

-- history_of returns the history entries that name lease_id (normally
-- one); the Go side decodes them strictly.
local function history_of(k_hist, lease_id)
  local out = {}
  if not lease_id or redis.call('TYPE', k_hist).ok ~= 'list' then return out end
  -- Version 1 entries name it in JSON, version 2 on a line of its own;
  -- either needle only preselects (the Go side matches the lease id).
  local needle, line = '"lease_id":"' .. lease_id .. '"', '\n' .. lease_id .. '\n'
  for _, e in ipairs(redis.call('LRANGE', k_hist, 0, -1)) do
    if string.find(e, needle, 1, true) or string.find(e, line, 1, true) then out[#out + 1] = e end
  end
  return out
end

-- evidence_reply answers from stored idempotency evidence: the evidence and
-- what the Go side needs to report the lease's state now (its active
-- record, with its PTTL, and its history entries). The Go side decides
-- replay, conflict or corruption from these bytes alone.
local function evidence_reply(now, ev, k_active, k_hist)
  local lease_id = evidence_lease_id(ev)
  local active, why = get(k_active)
  local pttl = '-2'
  if why then active = '\0wrongtype' end
  if active then pttl = int(redis.call('PTTL', k_active)) end
  local out = { 'evidence', int(now), ev, active or '', pttl }
  for _, e in ipairs(history_of(k_hist, lease_id)) do out[#out + 1] = e end
  return out
end

-- none_exist reports whether neither key exists: then a GET of each would
-- answer nil, so one EXISTS stands for both reads in the usual case (a key
-- of any type exists, so a wrong-typed one takes the reads, which report
-- it).
local function none_exist(k1, k2) return redis.call('EXISTS', k1, k2) == 0 end

-- closed answers a mutation of a closed namespace: the gate key, while it
-- exists, holds why (a restore or failover awaiting recovery verification,
-- or a backup's pause of mutations), and nothing may change. A gate of the
-- wrong type keeps the namespace closed too.
local function closed(k_gate, now)
  local g, why = get(k_gate)
  if why then return { 'closed', int(now), 'gate ' .. why } end
  if g then return { 'closed', int(now), g } end
  return nil
end

-- begin runs the common start of a mutation: backend time, the deadline
-- check, the gate, then the idempotency lookup before any other read. It
-- returns now and, if the operation is already answered, the reply.
local function begin(c)
  local now = now_ms()
  if now >= c.deadline then return now, { 'deadline', int(now) } end
  if not none_exist(c.k_gate, c.k_ev) then
    local shut = closed(c.k_gate, now)
    if shut then return now, shut end
    local ev, why = get(c.k_ev)
    if why then return now, corrupt(c, now, 'evidence ' .. why) end
    if ev then return now, evidence_reply(now, ev, c.k_active, c.k_hist) end
  end
  local why = layout_types(c)
  if why then return now, corrupt(c, now, why) end
  return now
end

-- acquire: ARGV 15 lease id, 16 owner principal, 17 owner client,
-- 18 owner credential, 19 service instance, 20 ttl ms, 21 maximum
-- lifetime ms, 22 execution id, 23 job id, 24 trace id, 25 request id,
-- 26 metadata JSON, 27 digest, 28 lease-id lookup TTL ms, 29 the
-- idempotency scope (the evidence key's, which format 4 keeps in the
-- record instead).
-- KEYS 8 counter, 9 lease-id lookup, 10 the namespace's counter floor
-- (set by a recovery epoch: every new token is above it).
local function acquire(keys, args)
  local c = context(keys, args)
  local now, done = begin(c)
  if done then return done end
  local k_counter, k_lookup, k_floor = keys[8], keys[9], keys[10]
  local cur, why = active_of(c, true)
  if why then return corrupt(c, now, why) end
  -- A replay of the acquisition of the active record (expired or not),
  -- whose evidence it carries: answered from the record, before anything
  -- else is decided (the Go side compares the digest).
  if cur and cur.idem_scope and cur.idem_scope == args[29] then
    return { 'embedded', int(now), c.raw, int(redis.call('PTTL', c.k_active)) }
  end
  if cur and live(cur, now) then return { 'conflict', int(now), int(cur.expires_at) } end
  local raw_counter, raw_floor
  raw_counter, why = get(k_counter)
  local counter = not why and counter_value(raw_counter)
  if not counter then return corrupt(c, now, 'fencing counter is malformed') end
  raw_floor, why = get(k_floor)
  local floor = not why and counter_value(raw_floor)
  if not floor then return corrupt(c, now, 'counter floor is malformed') end
  counter = math.max(counter, floor)
  -- As in the reference backend, a lease-id collision is refused before
  -- anything changes, and an expired predecessor is archived before the
  -- counter's exhaustion refuses the acquisition.
  if counter >= MAX_TOKEN then
    if redis.call('EXISTS', k_lookup) == 1 then return { 'collision', int(now) } end
    if cur then archive(c, cur, 'expired', cur.expires_at) end
    return { 'exhausted', int(now) }
  end
  -- The lease-id lookup is the first write: SET NX both claims the id and
  -- finds a collision, which then has changed nothing.
  if not redis.call('SET', k_lookup, c.tag, 'NX', 'PX', args[28]) then return { 'collision', int(now) } end
  if cur then archive(c, cur, 'expired', cur.expires_at) end
  local ttl, life = tonumber(args[20]), tonumber(args[21])
  local r = {
    record_version = 1, lock_key = c.lock_key, lease_id = args[15],
    owner_principal_id = args[16], owner_client_id = args[17], owner_credential_id = args[18],
    service_instance_id = args[19], fencing_token = counter + 1,
    acquired_at = now, renewed_at = now, expires_at = now + math.min(ttl, life),
    ttl_ms = ttl, maximum_lifetime_ms = life,
    execution_id = args[22], job_id = args[23], trace_id = args[24], request_id = args[25],
    metadata = args[26], state = 'active',
    tenant_id = args[4], program_id = args[5], target_namespace = args[6], target_id = args[7],
    actor_name = args[8], workflow_name = args[9], operation_class = args[10],
  }
  if c.rv3 then r.idem_digest, r.idem_scope, r.idem_ttl = args[27], args[29], ttl end
  redis.call('SET', k_counter, int(r.fencing_token))
  local raw = store_active(c, r)
  local m1, m2, m3 = index_members(r, c.tag)
  redis.call('ZADD', c.k_index, '0', m1, '0', m2, '0', m3) -- (a number would be formatted per call)
  if not c.rv3 then remember(c, now, 'acquire', args[27], 'lease_acquired', r, nil, raw) end
  return { 'ok', int(now), raw }
end

-- held returns the active record matching every ownership field given and
-- unexpired at now, or a reply: lost (archiving an expired match so it is
-- never seen as active again) or corrupt.
local function held(c, now, lease_id, token, owner, instance)
  local cur, why = active_of(c, true)
  if why then return nil, corrupt(c, now, why) end
  if not cur or cur.lease_id ~= lease_id or int(cur.fencing_token) ~= token
      or (owner and cur.owner_principal_id ~= owner) or (instance and cur.service_instance_id ~= instance) then
    return nil, { 'lost', int(now) }
  end
  if not live(cur, now) then
    archive(c, cur, 'expired', cur.expires_at)
    return nil, { 'lost', int(now) }
  end
  return cur
end

-- renew: ARGV 15 lease id, 16 token, 17 owner, 18 instance, 19 ttl ms
-- (0 keeps the lease's ttl_ms), 20 digest.
local function renew(keys, args)
  local c = context(keys, args)
  local now, done = begin(c)
  if done then return done end
  local cur, reply = held(c, now, args[15], args[16], args[17], args[18])
  if not cur then return reply end
  local ttl = tonumber(args[19])
  if ttl == 0 then ttl = cur.ttl_ms end
  -- A copy (cur may be shared, REC_OF) with the renewal's three fields,
  -- built in one presized constructor: a record holds exactly these 26
  -- fields (FIELDS, metadata and state; see decode and the writers).
  local r = {
    record_version = cur.record_version, lock_key = cur.lock_key,
    tenant_id = cur.tenant_id, program_id = cur.program_id, target_namespace = cur.target_namespace,
    target_id = cur.target_id, actor_name = cur.actor_name, workflow_name = cur.workflow_name,
    operation_class = cur.operation_class, lease_id = cur.lease_id, owner_principal_id = cur.owner_principal_id,
    owner_client_id = cur.owner_client_id, owner_credential_id = cur.owner_credential_id,
    service_instance_id = cur.service_instance_id, fencing_token = cur.fencing_token,
    acquired_at = cur.acquired_at, renewed_at = now,
    expires_at = math.min(now + ttl, cur.acquired_at + cur.maximum_lifetime_ms),
    ttl_ms = ttl, maximum_lifetime_ms = cur.maximum_lifetime_ms,
    execution_id = cur.execution_id, job_id = cur.job_id, trace_id = cur.trace_id, request_id = cur.request_id,
    metadata = cur.metadata, state = cur.state,
    idem_digest = cur.idem_digest, idem_scope = cur.idem_scope, idem_ttl = cur.idem_ttl,
  }
  local raw = store_active(c, r, true)
  remember(c, now, 'renew', args[20], 'lease_renewed', r, nil, raw)
  return { 'ok', int(now), raw }
end

-- finish: release, force-release and revoke. ARGV 15 lease id, 16 token,
-- 17 caller principal, 18 service instance (release only, else ''),
-- 19 digest, 20 request id, 21 reason as JSON ('' if none), 22 incident id,
-- 23 operation.
local ENDINGS = {
  release = { code = 'lease_released', state = 'released', owner = true },
  force_release = { code = 'lease_force_released', state = 'released' },
  revoke = { code = 'lease_revoked', state = 'revoked' },
}

local function finish(keys, args)
  local c = context(keys, args)
  local e = ENDINGS[args[23]]
  if not e then return redis.error_reply('unknown ending') end
  local now, done = begin(c)
  if done then return done end
  local owner, instance
  if e.owner then owner, instance = args[17], args[18] end
  local cur, reply = held(c, now, args[15], args[16], owner, instance)
  if not cur then return reply end
  -- Format 5: a release's evidence refers to the entry, which names it by
  -- its scope (the evidence key's).
  local refs = refers_at(c, now)
  local release_scope = args[23] == 'release' and refs and string.match(c.k_ev, ':idem:([%w_%-]+)$')
  if not is_scope(release_scope) then release_scope = nil end
  local raw, entry = archive(c, cur, e.state, now, args[17], args[20], args[21], args[22], release_scope, refs)
  remember(c, now, args[23], args[19], e.code, cur, e.state, raw, release_scope and entry)
  return { 'ok', int(now), ended_record(raw, cur, e.state) }
end

-- outbox_room is what the pending outbox needs before an entry of size
-- bytes joins it (a commit's publication, a requeued dead letter): the
-- next outbox sequence (KEY k_oseq holds the last given), the byte
-- counter, and the bound the entry would pass (lease.StoreOptions.
-- OutboxRoom's comparisons, against max_pending entries and max_bytes),
-- or nil. A malformed or exhausted counter answers nil and why.
local function outbox_room(now, k_outbox, k_oseq, k_obytes, size, max_pending, max_bytes)
  -- Absent, the first entry under sequence scoring starts at backend time
  -- in ms, above every score an older version gave (it scored by
  -- accepted_at), so the order never goes backwards.
  local oseq = now
  local v = redis.call('GET', k_oseq)
  if v then
    oseq = counter_value(v)
    if not oseq then return nil, 'outbox sequence is malformed' end
  end
  if oseq >= MAX_TOKEN then return nil, 'outbox sequence is exhausted' end
  local obytes = counter_value(redis.call('GET', k_obytes) or nil)
  if not obytes then return nil, 'outbox byte counter is malformed' end
  local full
  if redis.call('ZCARD', k_outbox) >= tonumber(max_pending) then
    full = 'pending'
  elseif obytes + size > tonumber(max_bytes) then
    full = 'bytes'
  end
  return oseq + 1, obytes, full
end

-- commit authorizes a fenced write. ARGV 15 lease id, 16 token, 17 owner,
-- 18 instance, 19 sink, 20 accepted-commit JSON before accepted_at,
-- 21 the JSON after it; with a publication, 22 and 23 the outbox entry
-- JSON around its accepted_at, 24 its message id; 25 execution id, 26 job
-- id, which must be the lease's own. KEYS 5 accepted-commit record, 8
-- high-water marks, 9 the outbox schedule, 10 the entry's key, 11 the
-- identity's commit seq (the last one given; it orders a lease's commits
-- for the sinks), 12 the namespace's outbox sequence (the last one given;
-- it scores the outbox schedule, so the relay reads entries in exact
-- acceptance order, not in message-id order within a millisecond), 13
-- the pending outbox's byte counter. With a publication, ARGV 27 is its
-- size (lease.OutboxMessage.Size), 28 and 29 the outbox's bounds in
-- entries and bytes: a publication that does not fit is refused ('full'
-- and which bound) before anything is written. The evidence is 20 .. seq
-- .. ',"accepted_at":"' .. time .. 21. ARGV 30 is the idempotency
-- retention (an expired lease's ending writes out its acquisition's
-- evidence), 31 the write format, as every call that may end a lease
-- ends its ARGV (before, commit passed none, and such an ending wrote
-- version 1 history in every format: review 44).
local function commit(keys, args)
  local c = context(keys, args)
  c.idem_ret = tonumber(args[30])
  local now = now_ms()
  if now >= c.deadline then return { 'deadline', int(now) } end
  if not none_exist(c.k_gate, c.k_ev) then
    local shut = closed(c.k_gate, now)
    if shut then return shut end
    local prior, why = get(c.k_ev)
    if why then return corrupt(c, now, 'accepted commit ' .. why) end
    if prior then return { 'evidence', int(now), prior } end
  end
  local k_marks, k_outbox, k_msg, k_seq, k_oseq, k_obytes = keys[8], keys[9], keys[10], keys[11], keys[12], keys[13]
  local why = layout_types(c)
  if not why and (wrong_type(k_marks, 'hash') or wrong_type(k_outbox, 'zset') or wrong_type(k_msg, 'string')
      or wrong_type(k_seq, 'string') or wrong_type(k_oseq, 'string') or wrong_type(k_obytes, 'string')) then
    why = WRONG_TYPE
  end
  if why then return corrupt(c, now, why) end
  local cur, reply = held(c, now, args[15], args[16], args[17], args[18])
  if not cur then return reply end
  -- A guard names the lease's own execution and job, never another one.
  if cur.execution_id ~= args[25] or cur.job_id ~= args[26] then return { 'lost', int(now) } end
  local mark = counter_value(redis.call('HGET', k_marks, args[19]) or nil)
  if not mark then return corrupt(c, now, 'high-water mark is malformed') end
  if cur.fencing_token < mark then return { 'rejected', int(now) } end
  local seq = counter_value(redis.call('GET', k_seq) or nil)
  if not seq then return corrupt(c, now, 'commit sequence is malformed') end
  if seq >= MAX_TOKEN then return corrupt(c, now, 'commit sequence is exhausted') end
  local oseq, obytes, osize, replaced
  if args[22] ~= '' then
    local full
    osize = tonumber(args[27])
    oseq, obytes, full = outbox_room(now, k_outbox, k_oseq, k_obytes, osize, args[28], args[29])
    if not oseq then return corrupt(c, now, obytes) end
    if full then return { 'full', int(now), full } end
    -- The size of an entry this one replaces, if its id is pending (see
    -- the write below).
    replaced = entry_size(redis.call('GET', k_msg) or nil)
  end
  seq = seq + 1
  redis.call('SET', k_seq, int(seq))
  redis.call('HSET', k_marks, args[19], int(cur.fencing_token))
  local raw = args[20] .. int(seq) .. ',"accepted_at":"' .. ts(now) .. args[21]
  redis.call('SET', c.k_ev, raw, 'PX', int(c.ev_ret))
  if args[22] ~= '' then
    -- The publication enters the fenced outbox in the same atomic step as
    -- the lease check; the relay removes it after the broker's confirm.
    redis.call('SET', k_msg, args[22] .. ts(now) .. args[23])
    redis.call('SET', k_oseq, int(oseq))
    -- A message id is pending already only if its commit's evidence
    -- expired while the entry waited and the same commit id was accepted
    -- again: the new entry replaces it, and its size leaves the count.
    if redis.call('ZADD', k_outbox, int(oseq), args[24]) == 0 then obytes = obytes - replaced end
    redis.call('SET', k_obytes, int(math.max(obytes + osize, 0)))
  end
  return { 'ok', int(now), raw }
end

-- outbox_less takes size bytes off the pending outbox's byte counter
-- (KEY k), never below 0; a malformed counter is left for the commit to
-- fail closed on.
local function outbox_less(k, size)
  local n = counter_value(redis.call('GET', k) or nil)
  if n then redis.call('SET', k, int(math.max(n - size, 0))) end
end

-- outbox_done removes a relayed publication and its size from the byte
-- counter. Only a pending one: an id that is not pending may be an older
-- version's dead letter's, whose entry stays (dead_entry). KEYS 1 the outbox schedule, 2 the entry's
-- key, 3 the gate, 4 the byte counter; ARGV 1 its message id.
local function outbox_done(keys, args)
  local now = now_ms()
  local shut = closed(keys[3], now)
  if shut then return shut end
  if wrong_type(keys[1], 'zset') or wrong_type(keys[2], 'string') or wrong_type(keys[4], 'string') then
    return { 'wrongtype', int(now) }
  end
  if redis.call('ZREM', keys[1], args[1]) == 0 then return { 'ok', int(now) } end
  outbox_less(keys[4], entry_size(redis.call('GET', keys[2]) or nil))
  redis.call('DEL', keys[2])
  return { 'ok', int(now) }
end

-- in_zset reports whether id is a member of sorted set k (checked to be
-- one): ZADD XX INCR 0 answers its score or nil and changes nothing.
-- ZSCORE would need a command the documented ACL does not grant.
local function in_zset(k, id) return redis.call('ZADD', k, 'XX', 'INCR', 0, id) ~= false end

-- OWN_ENTRY ends the reason key of a dead letter whose entry is in its own
-- key (ns:outbox_dead_entry:<id>). An older version's reason lacks it: its
-- entry is in the entry key it shares with a pending entry of its id.
-- The mark, not the own key's existence, decides, so a copy left behind
-- by an older version's discard is never taken for a later dead letter's.
local OWN_ENTRY = ',"own_entry":true}'
local function own_entry(why) return why ~= nil and string.sub(why, -#OWN_ENTRY) == OWN_ENTRY end

-- dead_entry is the entry of dead letter id whose reason key holds why
-- (nil if gone): its own copy (KEY k_own) or, set aside by an older
-- version, the shared entry key's (k_msg), unless an entry of its id is
-- pending (k_outbox): that key is then the pending entry's, and the dead
-- letter's is lost.
local function dead_entry(why, k_own, k_msg, k_outbox, id)
  if own_entry(why) then return redis.call('GET', k_own) or nil end
  if in_zset(k_outbox, id) then return nil end
  return redis.call('GET', k_msg) or nil
end

-- outbox_dead sets a poison publication aside (the broker refuses it for a
-- reason retrying will not cure): its message id moves from the outbox
-- schedule to the dead-letter schedule (score backend time), its entry
-- moves to the dead letter's own key (a later acceptance of its id writes
-- the entry key), and its reason is kept, so the relay goes on with later
-- entries. Nothing is dropped: with ARGV 3 dead letters held it refuses
-- ('full') and the entry stays pending. A dead letter of the same id
-- already held (the same publication accepted again and set aside again)
-- is replaced, entry and reason, by this newer one: 'replaced'. KEYS 1
-- the outbox schedule, 2 the entry's key, 3 the dead-letter schedule, 4
-- the dead letter's reason key, 5 the gate, 6 the pending outbox's byte
-- counter (the entry's size leaves it), 7 the dead letter's own entry
-- key; ARGV 1 its message id, 2 the reason as a JSON string, 3 the bound.
local function outbox_dead(keys, args)
  local now = now_ms()
  local shut = closed(keys[5], now)
  if shut then return shut end
  if wrong_type(keys[1], 'zset') or wrong_type(keys[2], 'string') or wrong_type(keys[3], 'zset')
      or wrong_type(keys[4], 'string') or wrong_type(keys[6], 'string') or wrong_type(keys[7], 'string') then
    return { 'wrongtype', int(now) }
  end
  if redis.call('ZCARD', keys[3]) >= tonumber(args[3]) then return { 'full', int(now) } end
  if redis.call('ZREM', keys[1], args[1]) == 0 then return { 'ok', int(now) } end
  local raw = redis.call('GET', keys[2]) or nil
  outbox_less(keys[6], entry_size(raw))
  local status = 'ok'
  if redis.call('ZADD', keys[3], int(now), args[1]) == 0 then status = 'replaced' end
  -- An entry key already gone (damage) leaves no copy, not an older one.
  if raw then redis.call('SET', keys[7], raw) else redis.call('DEL', keys[7]) end
  redis.call('DEL', keys[2])
  redis.call('SET', keys[4], '{"reason":' .. args[2] .. ',"dead_at":"' .. ts(now) .. '"' .. OWN_ENTRY)
  return { status, int(now) }
end

-- outbox_requeue moves dead letter ARGV 1 back into the pending outbox
-- after every pending entry (the next outbox sequence), its entry written
-- back to the entry key byte for byte, counted and bounded (ARGV 3 and 4,
-- entries and bytes) as a commit counts and bounds a publication. ARGV 2
-- is the SHA-1 of the entry the caller decoded strictly: any other entry
-- is answered 'unverified' with its bytes, changing nothing, so a corrupt
-- one never becomes pending (the relay's reads would fail closed on it).
-- Refused, changing nothing: 'none' (no such dead letter), 'pending' (an
-- entry of its id is pending: the same publication accepted again; two
-- entries of one id would be published twice), 'noentry' (its entry is
-- gone: an older version's dead letter whose shared entry key was
-- relayed or is pending), 'full'. KEYS 1 the outbox schedule, 2 the
-- entry's key, 3 the dead-letter schedule, 4 its reason key, 5 the gate,
-- 6 the byte counter, 7 the outbox sequence, 8 its own entry key. 'ok'
-- carries the entry and the reason key's value as read.
local function outbox_requeue(keys, args)
  local now = now_ms()
  local shut = closed(keys[5], now)
  if shut then return shut end
  if wrong_type(keys[1], 'zset') or wrong_type(keys[2], 'string') or wrong_type(keys[3], 'zset')
      or wrong_type(keys[4], 'string') or wrong_type(keys[6], 'string') or wrong_type(keys[7], 'string')
      or wrong_type(keys[8], 'string') then
    return { 'wrongtype', int(now) }
  end
  if not in_zset(keys[3], args[1]) then return { 'none', int(now) } end
  if in_zset(keys[1], args[1]) then return { 'pending', int(now) } end
  local why = redis.call('GET', keys[4]) or nil
  local raw = dead_entry(why, keys[8], keys[2], keys[1], args[1])
  if not raw then return { 'noentry', int(now) } end
  if redis.sha1hex(raw) ~= args[2] then return { 'unverified', int(now), raw } end
  local size = entry_size(raw)
  local oseq, obytes, full = outbox_room(now, keys[1], keys[7], keys[6], size, args[3], args[4])
  if not oseq then return { 'corrupt', int(now), obytes } end
  if full then return { 'full', int(now), full } end
  redis.call('SET', keys[7], int(oseq))
  redis.call('ZADD', keys[1], int(oseq), args[1])
  redis.call('SET', keys[6], int(obytes + size))
  redis.call('SET', keys[2], raw)
  redis.call('ZREM', keys[3], args[1])
  redis.call('DEL', keys[4], keys[8])
  return { 'ok', int(now), raw, why or '' }
end

-- outbox_discard removes dead letter ARGV 1 for good: its member of the
-- dead-letter schedule, its reason and its own entry key, and, for an
-- older version's dead letter, the entry key it shares, unless an entry
-- of its id is pending (the key is then that entry's). A pending entry is
-- never touched. KEYS 1 the outbox schedule, 2 the entry's key, 3 the
-- dead-letter schedule, 4 its reason key, 5 the gate, 6 its own entry
-- key. 'ok' carries the entry ('' if gone) and the reason key's value as
-- read; 'none' if there is no such dead letter.
local function outbox_discard(keys, args)
  local now = now_ms()
  local shut = closed(keys[5], now)
  if shut then return shut end
  if wrong_type(keys[1], 'zset') or wrong_type(keys[2], 'string') or wrong_type(keys[3], 'zset')
      or wrong_type(keys[4], 'string') or wrong_type(keys[6], 'string') then
    return { 'wrongtype', int(now) }
  end
  if not in_zset(keys[3], args[1]) then return { 'none', int(now) } end
  local why = redis.call('GET', keys[4]) or nil
  local raw = dead_entry(why, keys[6], keys[2], keys[1], args[1])
  if raw and not own_entry(why) then redis.call('DEL', keys[2]) end
  redis.call('ZREM', keys[3], args[1])
  redis.call('DEL', keys[4], keys[6])
  return { 'ok', int(now), raw or '', why or '' }
end

-- outbox_dead_read reads, for the listing, dead letters whose reason key
-- lacks OWN_ENTRY (an older version's, or damaged), which only a function
-- can read consistently: whether an entry of the id is pending decides
-- what the entry key holds (dead_entry). ARGV the message ids; KEYS 1 the
-- outbox schedule, 2 the dead-letter schedule, then for each id its own
-- entry key, the entry key and its reason key. Per id three fields: '1'
-- if it is still a dead letter ('' and the rest empty if not), the
-- reason key's value and the entry ('' if gone). It changes nothing
-- (in_zset's ZADD is why it is not registered read-only).
local function outbox_dead_read(keys, args)
  local now = now_ms()
  if wrong_type(keys[1], 'zset') or wrong_type(keys[2], 'zset') then return { 'wrongtype', int(now) } end
  local out = { 'ok', int(now) }
  for i, id in ipairs(args) do
    local k = 3 * i
    if wrong_type(keys[k], 'string') or wrong_type(keys[k + 1], 'string') or wrong_type(keys[k + 2], 'string') then
      return { 'wrongtype', int(now) }
    end
    if in_zset(keys[2], id) then
      local why = redis.call('GET', keys[k + 2]) or nil
      local raw = dead_entry(why, keys[k], keys[k + 1], keys[1], id)
      out[#out + 1], out[#out + 2], out[#out + 3] = '1', why or '', raw or ''
    else
      out[#out + 1], out[#out + 2], out[#out + 3] = '', '', ''
    end
  end
  return out
end

-- outbox_recount sets the byte counter of a namespace whose pending
-- outbox was written before the counter existed: the sum of the entries'
-- sizes, if the counter is still missing and ARGV names exactly the
-- pending message ids (KEYS 4.. their entry keys, in the same order);
-- 'retry' if the outbox changed since the caller listed it. KEYS 1 the
-- byte counter, 2 the outbox schedule, 3 the gate.
local function outbox_recount(keys, args)
  local now = now_ms()
  local shut = closed(keys[3], now)
  if shut then return shut end
  if redis.call('EXISTS', keys[1]) == 1 then return { 'ok', int(now) } end
  if wrong_type(keys[2], 'zset') then return { 'wrongtype', int(now) } end
  local ids, pending = redis.call('ZRANGEBYSCORE', keys[2], '-inf', '+inf'), {}
  if #ids ~= #args then return { 'retry', int(now) } end
  for _, id in ipairs(ids) do pending[id] = true end
  local total = 0
  for i, id in ipairs(args) do
    if not pending[id] then return { 'retry', int(now) } end
    local raw, why = get(keys[i + 3])
    if why then return { 'wrongtype', int(now) } end
    total = total + entry_size(raw)
  end
  redis.call('SET', keys[1], int(total))
  return { 'ok', int(now) }
end

-- expire is the delayed expiry cleanup of one lease: it archives the
-- active record only if it still has this lease id and token and is
-- expired at backend time, so a late cleanup never touches a successor.
-- A schedule entry naming a lease that is no longer active is dropped.
-- ARGV as context (identity unused, may be empty), 15 lease id, 16 token.
local function expire(keys, args)
  local c = context(keys, args)
  local now = now_ms()
  local member = c.tag .. '\0' .. args[15] .. '\0' .. args[16]
  local shut = closed(c.k_gate, now)
  if shut then return shut end
  local cur, why = active_of(c, nil)
  if why then return corrupt(c, now, why) end
  why = layout_types(c)
  if why then return corrupt(c, now, why) end
  if not cur or cur.lease_id ~= args[15] or int(cur.fencing_token) ~= args[16] then
    redis.call('ZREM', c.k_expiry, member)
    return { 'noop', int(now) }
  end
  if live(cur, now) then return { 'live', int(now) } end
  archive(c, cur, 'expired', cur.expires_at)
  return { 'ok', int(now) }
end

-- Recovery functions, for the recovery tool only: each runs only while
-- the gate holds exactly the closing its caller verified, so no lease
-- operation runs between recovery's reading of the namespace and its
-- decision's writes, and a stale recovery cannot act under another
-- closing (a later backup's pause, another recovery).

local function holds(k_gate, want)
  local g, why = get(k_gate)
  return not why and g ~= nil and g == want
end

-- recover_raise raises a counter to at least ARGV 1; a counter is never
-- lowered. KEYS 1 counter, 2 gate; ARGV 2 the gate's expected value.
-- Replies ok and '1' if it was raised.
local function recover_raise(keys, args)
  local now = now_ms()
  if not holds(keys[2], args[2]) then return { 'gate', int(now) } end
  local raw, why = get(keys[1])
  local cur = not why and counter_value(raw)
  if not cur then return { 'corrupt', int(now), 'fencing counter is malformed' } end
  local want = tonumber(args[1])
  if not want or want ~= math.floor(want) or want > MAX_TOKEN then return { 'exhausted', int(now) } end
  if cur >= want then return { 'ok', int(now), '0' } end
  redis.call('SET', keys[1], int(want))
  return { 'ok', int(now), '1' }
end

-- recover_end ends the identity's active record if it is still lease ARGV
-- 15, through the normal archive path: revoked by ARGV 17 with reason ARGV
-- 16 (JSON) if live at backend time, else expired at its expires_at (a TTL
-- is never resurrected). ARGV 1..14 and KEYS as context, ARGV 18 the
-- gate's expected value.
local function recover_end(keys, args)
  local c = context(keys, args)
  local now = now_ms()
  if not holds(c.k_gate, args[18]) then return { 'gate', int(now) } end
  local cur, why = active_of(c, nil)
  if why then return corrupt(c, now, why) end
  why = layout_types(c)
  if why then return corrupt(c, now, why) end
  if not cur or cur.lease_id ~= args[15] then return { 'noop', int(now) } end
  if live(cur, now) then
    archive(c, cur, 'revoked', now, args[17], '', args[16], '')
    return { 'revoked', int(now) }
  end
  archive(c, cur, 'expired', cur.expires_at)
  return { 'expired', int(now) }
end

-- regate replaces the gate's value ARGV 1 by ARGV 2 (a restore's
-- "restoring" closing by "restored" once every key is written). KEYS 1
-- gate.
local function regate(keys, args)
  local now = now_ms()
  if not holds(keys[1], args[1]) then return { 'gate', int(now) } end
  redis.call('SET', keys[1], args[2])
  return { 'ok', int(now) }
end

-- reopen deletes the gate if it still holds ARGV 1 (the closing its
-- caller verified), raising the counter floor to ARGV 2 and setting the
-- recovery epoch to ARGV 3 (0: unchanged) and the last recovery's record
-- to ARGV 4 ('': unchanged) in the same step. KEYS 1 gate, 2 counter
-- floor, 3 epoch, 4 last recovery.
local function reopen(keys, args)
  local now = now_ms()
  local g, why = get(keys[1])
  if why or g ~= args[1] then return { 'gate', int(now) } end
  local raw
  raw, why = get(keys[2])
  local floor = not why and counter_value(raw)
  if not floor then return { 'corrupt', int(now), 'counter floor is malformed' } end
  local want, epoch = tonumber(args[2]), tonumber(args[3])
  if want > floor then redis.call('SET', keys[2], int(want)) end
  if epoch > 0 then redis.call('SET', keys[3], int(epoch)) end
  if args[4] ~= '' then redis.call('SET', keys[4], args[4]) end
  redis.call('DEL', keys[1])
  return { 'ok', int(now) }
end

-- Read-only functions (FCALL_RO). ARGV 1 of each is the deadline (ms):
-- a read that has not started by then is refused, as a mutation is.

local function read_begin(args)
  local now = now_ms()
  if now >= tonumber(args[1]) then return now, { 'deadline', int(now) } end
  return now
end

-- inspect reads an identity's active record at backend time.
-- KEYS 1 active. ARGV 2 lock key, 3..9 identity.
local function inspect(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  local cur, why, raw, pttl = load_active(keys[1], args[2], args, 3)
  if why then return { 'corrupt', int(now), why } end
  if not cur then return { 'ok', int(now), '', int(redis.call('PTTL', keys[1])) } end
  return { 'ok', int(now), raw, int(pttl) }
end

-- inspect_id reads a lease by id: its active record if current, else its
-- history entries. KEYS 1 active, 2 history. ARGV 2 lock key, 3 lease id.
local function inspect_id(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  local cur, why, raw, pttl = load_active(keys[1], args[2], nil)
  if why then return { 'corrupt', int(now), why } end
  if cur and cur.lease_id == args[3] then
    return { 'active', int(now), raw, int(pttl) }
  end
  local out = { 'history', int(now) }
  for _, e in ipairs(history_of(keys[2], args[3])) do out[#out + 1] = e end
  return out
end

-- resolve reads a lease-id lookup key: the lease's hash tag, or ''.
-- KEYS 1 lookup.
local function resolve(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  return { 'ok', int(now), get(keys[1]) or '' }
end

-- lookup returns stored idempotency evidence and the lease's state now.
-- KEYS 1 evidence, 2 active, 3 history; ARGV 2 the scope of an acquire's
-- evidence ('' for another), 3 the lock key (with a scope): without an
-- evidence key, the active record is decoded strictly (decode, as every
-- other read does): damage of any kind is 'corrupt', never 'none' (which
-- would tell the caller the acquisition never committed); a record of
-- version 3 carrying that scope answers ('embedded', its bytes and PTTL;
-- the Go side decodes them again); any other record, 'none'. It also
-- reads an accepted commit's evidence (a ReplayOnly commit): that names no
-- lease, so no history entries follow and the Go side uses the evidence
-- alone.
local function lookup(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  local ev, why = get(keys[1])
  if why then return { 'corrupt', int(now), 'evidence ' .. why } end
  if not ev and args[2] and args[2] ~= '' then
    local raw
    raw, why = get(keys[2])
    if why then return { 'corrupt', int(now), 'active ' .. why } end
    if raw then
      local r
      r, why = decode(raw, args[3])
      if not r then return { 'corrupt', int(now), 'active ' .. why } end
      if r.idem_scope == args[2] then
        return { 'embedded', int(now), raw, int(redis.call('PTTL', keys[2])) }
      end
    end
  end
  if not ev then return { 'none', int(now) } end
  return evidence_reply(now, ev, keys[2], keys[3])
end

-- index_page reads up to ARGV 4 index members in [ARGV 2, ARGV 3).
-- KEYS 1 index.
local function index_page(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  local out = { 'ok', int(now) }
  if redis.call('TYPE', keys[1]).ok ~= 'zset' then return out end
  for _, m in ipairs(redis.call('ZRANGEBYLEX', keys[1], args[2], args[3], 'LIMIT', 0, tonumber(args[4]))) do
    out[#out + 1] = m
  end
  return out
end

-- actives reads several identities' active records at one backend time:
-- for each key, its value ('' if none) and PTTL.
local function actives(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  local out = { 'ok', int(now) }
  for _, k in ipairs(keys) do
    local v, why = get(k)
    if why then v = '\0wrongtype' end
    out[#out + 1] = v or ''
    out[#out + 1] = int(redis.call('PTTL', k))
  end
  return out
end

-- history reads an identity's terminal evidence, newest first (bounded by
-- the list's cap). KEYS 1 history.
local function history(keys, args)
  local now, done = read_begin(args)
  if done then return done end
  local out = { 'ok', int(now) }
  if redis.call('TYPE', keys[1]).ok ~= 'list' then return out end
  for _, e in ipairs(redis.call('LRANGE', keys[1], 0, -1)) do out[#out + 1] = e end
  return out
end

-- due lists expiry-schedule entries whose expires_at has passed at
-- backend time. KEYS 1 schedule. ARGV 1 limit.
local function due(keys, args)
  local now = now_ms()
  local out = { 'ok', int(now) }
  if redis.call('TYPE', keys[1]).ok ~= 'zset' then return out end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', keys[1], '-inf', int(now), 'LIMIT', 0, tonumber(args[1]))) do
    out[#out + 1] = m
  end
  return out
end

-- clock returns backend time only: the floor of a read.
local function clock() return { 'ok', int(now_ms()) } end

-- raise_format sets the namespace's stored-format switch (KEYS 1) to
-- ARGV 1, a format this library writes, unless it holds that one or a
-- later one already: the switch is one way, so an instance opened with
-- an earlier format's option never takes a namespace back. A value it
-- does not know (a later build's, or damage) is left as it is: 'unknown'.
-- A closed namespace (KEYS 2, the gate) changes nothing: 'closed'.
local FORMAT_LEVEL = { ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6, ['7'] = 7, ['8'] = 8 }
local function raise_format(keys, args)
  local want = FORMAT_LEVEL[args[1]]
  if not want then return redis.error_reply('unknown format') end
  local t = now_ms()
  local now = int(t)
  if closed(keys[2], t) then return { 'closed', now } end
  local cur, why = get(keys[1])
  if why then return { 'unknown', now } end
  if cur then
    local have = FORMAT_LEVEL[cur]
    if not have then return { 'unknown', now } end
    if have >= want then return { 'ok', now, cur } end
  end
  redis.call('SET', keys[1], args[1])
  return { 'ok', now, args[1] }
end

-- probe reads TIME and writes one scratch key: the floor of a mutation.
local function probe(keys) redis.call('INCR', keys[1]); return { 'ok', int(now_ms()) } end

local RO = { 'no-writes' }
redis.register_function(FN .. 'acquire', acquire)
redis.register_function(FN .. 'renew', renew)
redis.register_function(FN .. 'finish', finish)
redis.register_function(FN .. 'commit', commit)
redis.register_function(FN .. 'expire', expire)
redis.register_function(FN .. 'probe', probe)
redis.register_function(FN .. 'raise_format', raise_format)
redis.register_function(FN .. 'outbox_done', outbox_done)
redis.register_function(FN .. 'outbox_dead', outbox_dead)
redis.register_function(FN .. 'outbox_recount', outbox_recount)
redis.register_function(FN .. 'outbox_requeue', outbox_requeue)
-- allow-oom: a discard only frees memory, and a listing writes nothing; an
-- operator making room on a server at maxmemory needs both most.
redis.register_function{ function_name = FN .. 'outbox_discard', callback = outbox_discard, flags = { 'allow-oom' } }
redis.register_function{ function_name = FN .. 'outbox_dead_read', callback = outbox_dead_read, flags = { 'allow-oom' } }
redis.register_function(FN .. 'recover_raise', recover_raise)
redis.register_function(FN .. 'recover_end', recover_end)
redis.register_function(FN .. 'reopen', reopen)
redis.register_function(FN .. 'regate', regate)
redis.register_function { function_name = FN .. 'inspect', callback = inspect, flags = RO }
redis.register_function { function_name = FN .. 'inspect_id', callback = inspect_id, flags = RO }
redis.register_function { function_name = FN .. 'resolve', callback = resolve, flags = RO }
redis.register_function { function_name = FN .. 'lookup', callback = lookup, flags = RO }
redis.register_function { function_name = FN .. 'index_page', callback = index_page, flags = RO }
redis.register_function { function_name = FN .. 'actives', callback = actives, flags = RO }
redis.register_function { function_name = FN .. 'history', callback = history, flags = RO }
redis.register_function { function_name = FN .. 'due', callback = due, flags = RO }
redis.register_function { function_name = FN .. 'clock', callback = clock, flags = RO }
