-- reentrant_acquire.lua: hash of owner -> hold count, as Redisson.
-- KEYS[1] lock hash, KEYS[2] fence counter.
-- ARGV[1] owner, ARGV[2] TTL in milliseconds.
-- Returns {1, fence} when acquired (a re-entry returns the fence of the hold
-- it joins), {0, pttl} when another owner holds it.
local field = 'o:' .. ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], field, 1, 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence}
end
if redis.call('HEXISTS', KEYS[1], field) == 1 then
  redis.call('HINCRBY', KEYS[1], field, 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
end
return {0, redis.call('PTTL', KEYS[1])}
