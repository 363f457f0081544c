-- write_acquire.lua: exclusive lock of a read-write pair.
-- KEYS[1] writer key (string), KEYS[2] reader zset, KEYS[3] fence counter.
-- ARGV[1] token, ARGV[2] TTL ms.
-- Returns {1, fence} when acquired, {0, ms until a holder's lease ends}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first > 0 then
  return {0, tonumber(first[2]) - now}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[3])}
end
return {0, redis.call('PTTL', KEYS[1])}
