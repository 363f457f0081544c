-- read_acquire.lua: shared lock. Readers live in a zset scored by their
-- expiry (server time, ms), so each reader has its own lease.
-- KEYS[1] writer key (string), KEYS[2] reader zset, KEYS[3] fence counter.
-- ARGV[1] token, ARGV[2] TTL ms.
-- Returns {1, fence} when acquired, {0, pttl of the writer} otherwise.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], last[2])
return {1, redis.call('INCR', KEYS[3])}
