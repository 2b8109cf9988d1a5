#!lua name=__LIBRARY__
local FN = '__FN__'

-- add appends one event to the capped stream and, in the same atomic
-- step, sets the event's marker key (KEYS 2, kept ARGV 4 ms), so addonce
-- knows the event is there whatever the entry's id time. The entry id's
-- time is the event's time (ARGV 1) when that keeps the stream ordered,
-- else the time of the newest entry: max(event time, newest entry's time),
-- so an entry's id time is never before its event's, and is after it only
-- by the writers' disorder (latency, clock skew), never by the server's
-- clock.
-- KEYS 1 stream, 2 marker. ARGV 1 event time ms, 2 MAXLEN (approximate),
-- 3 event, 4 marker TTL ms.
local function add(keys, args)
  local t = redis.call('TYPE', keys[1]).ok
  if t ~= 'none' and t ~= 'stream' then return redis.error_reply('WRONGTYPE audit stream') end
  local function try(id)
    return redis.pcall('XADD', keys[1], 'MAXLEN', '~', args[2], id, 'e', args[3])
  end
  local id = try(args[1] .. '-*')
  if type(id) == 'table' and id.err then
    local top = redis.call('XREVRANGE', keys[1], '+', '-', 'COUNT', 1)[1]
    if top then id = try(string.match(top[1], '^(%d+)-') .. '-*') end
  end
  if type(id) == 'table' and id.err then
    id = redis.call('XADD', keys[1], 'MAXLEN', '~', args[2], '*', 'e', args[3])
  end
  redis.call('SET', keys[2], '1', 'PX', args[4])
  return id
end

-- addonce appends one event unless its marker key (KEYS 2) shows an
-- earlier add of it (one whose reply was lost included): the marker is set
-- with the entry, atomically, so the check depends on no clock.
-- KEYS and ARGV as add.
local function addonce(keys, args)
  if redis.call('EXISTS', keys[2]) == 1 then return 'dup' end
  return add(keys, args)
end

redis.register_function(FN .. 'add', add)
redis.register_function(FN .. 'addonce', addonce)
