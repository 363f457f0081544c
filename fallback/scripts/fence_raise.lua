-- fence_raise.lua: RedLock second phase. Raise this node's fence counter to
-- the fence chosen over the quorum, if the token still holds the lock here.
-- KEYS[1] lock key, KEYS[2] fence counter. ARGV[1] token, ARGV[2] fence.
-- Returns 1 when the token holds the lock (counter now >= fence), else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
