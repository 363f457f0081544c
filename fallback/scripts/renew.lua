-- renew.lua: compare-and-pexpire.
-- KEYS[1] lock key. ARGV[1] token, ARGV[2] TTL in milliseconds.
-- Returns 1 when the token still holds the lock, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
