#!lua name=__LIBRARY__
local FN = '__FN__'

local function type_ok(k, want)
  local t = redis.call('TYPE', k).ok
  return t == 'none' or t == want
end

-- create stores a new credential: SET NX and its index entry together.
-- KEYS 1 record, 2 index. ARGV 1 credential id, 2 record.
local function create(keys, args)
  if not type_ok(keys[1], 'string') or not type_ok(keys[2], 'zset') then return 'corrupt' end
  if not redis.call('SET', keys[1], args[2], 'NX') then return 'exists' end
  redis.call('ZADD', keys[2], 0, args[1])
  return 'ok'
end

-- swap replaces a record if it still holds exactly the bytes the caller
-- read, and optionally creates another credential in the same step
-- (rotation). KEYS 1 record, 2 index, [3 next record]. ARGV 1 expected
-- bytes, 2 replacement, [3 next id, 4 next record].
local function swap(keys, args)
  if not type_ok(keys[1], 'string') or not type_ok(keys[2], 'zset') then return 'corrupt' end
  local cur = redis.call('GET', keys[1])
  if not cur then return 'notfound' end
  if cur ~= args[1] then return 'changed' end
  if keys[3] then
    if redis.call('EXISTS', keys[3]) == 1 then return 'exists' end
    redis.call('SET', keys[3], args[4])
    redis.call('ZADD', keys[2], 0, args[3])
  end
  redis.call('SET', keys[1], args[2])
  return 'ok'
end

redis.register_function(FN .. 'create', create)
redis.register_function(FN .. 'swap', swap)
