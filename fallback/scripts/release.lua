-- release.lua: compare-and-delete, then wake waiters.
-- KEYS[1] lock key. ARGV[1] token, ARGV[2] release channel.
-- Returns 1 when the token held the lock and it is now deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
