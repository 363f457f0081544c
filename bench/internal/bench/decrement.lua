-- Sells one unit of the stock at KEYS[1] if any is left, atomically.
-- Returns 1 when sold, 0 when sold out.
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock > 0 then
	redis.call('DECR', KEYS[1])
	return 1
end
return 0
