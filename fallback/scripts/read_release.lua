-- read_release.lua: drop one reader; wake waiters when the last one leaves.
-- KEYS[1] reader zset. ARGV[1] token, ARGV[2] release channel.
-- Returns 1 when the reader held the lock, else 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.pcall('PUBLISH', ARGV[2], 'released')
end
return 1
