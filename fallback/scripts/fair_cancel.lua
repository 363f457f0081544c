-- fair_cancel.lua: leave the queue (the waiter gave up) and wake the others,
-- since the head may have changed.
-- KEYS[1] queue list, KEYS[2] timeout zset. ARGV[1] owner, ARGV[2] channel.
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.pcall('PUBLISH', ARGV[2], 'cancelled')
return 1
