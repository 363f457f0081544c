-- reentrant_release.lua: decrement the owner's count; delete and wake
-- waiters at zero.
-- KEYS[1] lock hash. ARGV[1] owner, ARGV[2] release channel.
-- Returns the remaining count, or -1 when the owner does not hold the lock.
local field = 'o:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], field) == 0 then
  return -1
end
local n = redis.call('HINCRBY', KEYS[1], field, -1)
if n > 0 then
  return n
end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[2], 'released')
return 0
