-- fair_acquire.lua: FIFO lock, Redisson style: a queue list of waiters and
-- a zset of their timeouts. The lock itself is a reentrant hash.
-- KEYS[1] lock hash, KEYS[2] queue list, KEYS[3] timeout zset,
-- KEYS[4] fence counter.
-- ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] waiter timeout ms,
-- ARGV[4] '1' to join (or stay in) the queue when not acquired, '0' not to.
-- Returns {1, fence} when acquired, {0, pttl} otherwise.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A waiter that stopped polling is dropped once its timeout passes, so a dead
-- process cannot block the queue longer than the waiter timeout.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, w in ipairs(dead) do
  redis.call('LREM', KEYS[2], 0, w)
  redis.call('ZREM', KEYS[3], w)
end
local field = 'o:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], field) == 1 then
  redis.call('HINCRBY', KEYS[1], field, 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head == false or head == ARGV[1] then
    if head then
      redis.call('LPOP', KEYS[2])
      redis.call('ZREM', KEYS[3], ARGV[1])
    end
    local fence = redis.call('INCR', KEYS[4])
    redis.call('HSET', KEYS[1], field, 1, 'fence', fence)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, fence}
  end
end
if ARGV[4] == '1' then
  -- ZADD returns 1 only for a new member: a waiter already queued just
  -- refreshes its timeout and keeps its place.
  if redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[3]))
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  pttl = 0
end
return {0, pttl}
