-- acquire.lua: take an exclusive lock and draw a fencing token.
-- KEYS[1] lock key (string), KEYS[2] fence counter.
-- ARGV[1] token, ARGV[2] TTL in milliseconds.
-- Returns {1, fence} when acquired, {0, pttl} when another token holds it.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
-- Same token already there: this is a replay of an acquisition that already
-- succeeded. Nobody else can have drawn a fence since, so the counter is ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
return {0, redis.call('PTTL', KEYS[1])}
