-- reentrant_renew.lua: pexpire the hash if the owner still holds it.
-- KEYS[1] lock hash. ARGV[1] owner, ARGV[2] TTL in milliseconds.
-- Returns 1 when renewed, else 0.
if redis.call('HEXISTS', KEYS[1], 'o:' .. ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
